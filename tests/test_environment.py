"""The sandbox's environment: secrets stay out unless named (F-BE-3, "secret-free env").

The caller's environment is full of credentials (cloud keys, tokens, database
URLs with passwords) that an agent's tools must not see. These tests set such
variables in the environment sandhold is started with and look from inside a
real sandbox (native and ``--backend none``), as root and as the unprivileged
``sandhold-test`` user: by default only an allow-list passes and credential
shapes are dropped even from it; ``--debug`` and ``--explain`` name what was
dropped without printing a value; ``env.passthrough`` patterns let named
variables in, but a credential-looking one only when named exactly;
``credentials.envVars`` withholds a name whatever else says; ``--inherit-env``
passes everything and warns, naming the credential-looking variables; the
``none`` backend scrubs the same way while giving no isolation (there the
child can still read its callers' ``/proc/<pid>/environ``, so only the native
runs check every process's environment).
"""

from __future__ import annotations

import json
import os
import secrets
import textwrap

import pytest

from conftest import World

pytestmark = pytest.mark.sandbox

CREDENTIAL_NAMES = (
    "AWS_SECRET_ACCESS_KEY",
    "GITHUB_TOKEN",
    "OPENAI_API_KEY",
    "MY_PASSWORD",
    "DATABASE_URL",
)
BENIGN_VISIBLE = ("PATH", "HOME", "LANG", "TERM")

ENV_PROBE = """\
    import json, os, sys
    seen = {"env": dict(os.environ), "proc_environ": [], "host_pid_visible": None}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                seen["proc_environ"].append(f.read().decode(errors="replace"))
        except OSError:
            pass
    seen["host_pid_visible"] = os.path.exists(f"/proc/{sys.argv[1]}")
    print(json.dumps(seen))
"""


def _caller_env(world: World, **extra: str) -> tuple[dict[str, str], dict[str, str]]:
    """The caller's environment with credentials set, and the secret values by name."""
    token = secrets.token_hex(6)
    values = {
        "AWS_SECRET_ACCESS_KEY": f"aws-{token}",
        "GITHUB_TOKEN": f"ghp_{token}",
        "OPENAI_API_KEY": f"sk-{token}",
        "MY_PASSWORD": f"hunter2-{token}",
        "DATABASE_URL": f"postgres://u:pw{token}@h/db",
    }
    env = world.env(
        TERM="xterm-256color",
        UNKNOWN_THING=f"unknown-{token}",
        **values,
        **extra,
    )
    return env, values


def _seen(world: World, env: dict[str, str], *opts: str) -> dict[str, object]:
    r = world.sandhold(
        *opts,
        "--",
        world.ident.python,
        "-c",
        textwrap.dedent(ENV_PROBE),
        str(os.getpid()),
        env=env,
    )
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert isinstance(result, dict)
    return result


def _assert_scrubbed(
    seen: dict[str, object], env: dict[str, str], values: dict[str, str], *, isolated: bool = True
) -> None:
    inner = seen["env"]
    assert isinstance(inner, dict)
    for name in CREDENTIAL_NAMES:
        assert name not in inner, name
    assert "UNKNOWN_THING" not in inner
    for name in BENIGN_VISIBLE:
        assert inner.get(name) == env[name], name
    # no value leaks under another name, nor into any process of the sandbox
    blob = json.dumps(inner)
    for name, value in values.items():
        assert value not in blob, name
    if not isolated:
        return  # every host process is visible, sandhold's and its caller's environ too
    proc_environ = seen["proc_environ"]
    assert isinstance(proc_environ, list) and proc_environ
    for environ in proc_environ:
        for name, value in values.items():
            assert value not in environ, name


def test_default_drops_credentials_and_unknown_variables(world: World) -> None:
    env, values = _caller_env(world)
    seen = _seen(world, env)
    _assert_scrubbed(seen, env, values)
    assert seen["host_pid_visible"] is False


def test_debug_names_dropped_variables_without_values(world: World) -> None:
    env, values = _caller_env(world)
    r = world.sandhold("--debug", "--", "true", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    for name in (*CREDENTIAL_NAMES, "UNKNOWN_THING"):
        assert name in r.stderr, name
    for value in (*values.values(), env["UNKNOWN_THING"]):
        assert value not in r.stderr
    for name in BENIGN_VISIBLE:
        assert f"{name} (" not in r.stderr, f"{name} must not be reported dropped"


def test_without_debug_one_line_names_what_was_kept_out(world: World) -> None:
    """Issue 15: by default one line names the kept-out variables (never a value);
    ``-q`` silences it."""
    env, values = _caller_env(world)
    r = world.sandhold("--", "true", env=env)
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stderr.splitlines() if "environment" in x]
    for name in CREDENTIAL_NAMES:
        assert name in line
    for value in values.values():
        assert value not in r.stderr
    r = world.sandhold("-q", "--", "true", env=env)
    assert r.returncode == 0 and r.stderr == ""


def test_explain_lists_dropped_names_without_values(world: World) -> None:
    env, values = _caller_env(world)
    r = world.sandhold("--explain", "--", "true", env=env)
    assert r.returncode == 0, r.stderr
    for name in (*CREDENTIAL_NAMES, "UNKNOWN_THING"):
        assert name in r.stdout, name
    for value in values.values():
        assert value not in r.stdout
        assert value not in r.stderr


def test_passthrough_patterns_but_credentials_only_by_exact_name(world: World) -> None:
    settings = world.settings({"env": {"passthrough": ["MY_VAR", "NODE_*", "*_TOKEN"]}})
    env, values = _caller_env(
        world, MY_VAR="mine", NODE_FOO="foo", NODE_AUTH_TOKEN="npm-secret", OTHER_VAR="other"
    )
    seen = _seen(world, env, "-s", str(settings))
    inner = seen["env"]
    assert isinstance(inner, dict)
    assert inner.get("MY_VAR") == "mine"
    assert inner.get("NODE_FOO") == "foo"
    assert "OTHER_VAR" not in inner
    # matched by a pattern, but credential-looking: a pattern is not enough
    assert "NODE_AUTH_TOKEN" not in inner
    assert "GITHUB_TOKEN" not in inner
    _assert_scrubbed(seen, env, values)


def test_credential_passes_when_named_exactly(world: World) -> None:
    settings = world.settings({"env": {"passthrough": ["NODE_AUTH_TOKEN", "DATABASE_URL"]}})
    env, values = _caller_env(world, NODE_AUTH_TOKEN="npm-secret")
    seen = _seen(world, env, "-s", str(settings))
    inner = seen["env"]
    assert isinstance(inner, dict)
    assert inner.get("NODE_AUTH_TOKEN") == "npm-secret"
    assert inner.get("DATABASE_URL") == values["DATABASE_URL"]
    for name in ("AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "OPENAI_API_KEY", "MY_PASSWORD"):
        assert name not in inner, name


def test_inherit_env_passes_everything_and_warns(world: World) -> None:
    env, values = _caller_env(world, NODE_AUTH_TOKEN="npm-secret")
    r = world.sandhold(
        "--inherit-env",
        "--",
        world.ident.python,
        "-c",
        "import json, os; print(json.dumps(dict(os.environ)))",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    inner = json.loads(r.stdout)
    for name, value in env.items():
        assert inner.get(name) == value, name
    assert "warning" in r.stderr
    assert "--inherit-env" in r.stderr
    for name in (*CREDENTIAL_NAMES, "NODE_AUTH_TOKEN"):
        assert name in r.stderr, name
    for name in ("UNKNOWN_THING", "LANG", "PATH"):
        assert name not in r.stderr, f"{name} is not credential-looking"
    for value in values.values():
        assert value not in r.stderr


def test_credentials_env_vars_are_withheld_even_with_inherit(world: World) -> None:
    settings = world.settings(
        {
            "credentials": {"envVars": [{"name": "MY_VAR", "mode": "deny"}]},
            "env": {"passthrough": ["MY_VAR"]},
        }
    )
    env, _values = _caller_env(world, MY_VAR="withheld-value")
    for opts in (("-s", str(settings)), ("-s", str(settings), "--inherit-env")):
        seen = _seen(world, env, *opts)
        inner = seen["env"]
        assert isinstance(inner, dict)
        assert "MY_VAR" not in inner, opts
        assert "withheld-value" not in json.dumps(inner)


def test_backend_none_scrubs_without_isolation(world: World) -> None:
    env, values = _caller_env(world)
    seen = _seen(world, env, "--backend", "none")
    _assert_scrubbed(seen, env, values, isolated=False)
    # no PID namespace: the test process itself is visible
    assert seen["host_pid_visible"] is True


def test_backend_none_inherit_env_passes_everything(world: World) -> None:
    env, _values = _caller_env(world)
    r = world.sandhold(
        "--backend",
        "none",
        "--inherit-env",
        "--",
        world.ident.python,
        "-c",
        "import json, os; print(json.dumps(dict(os.environ)))",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    inner = json.loads(r.stdout)
    for name in (*CREDENTIAL_NAMES, "UNKNOWN_THING"):
        assert inner.get(name) == env[name], name
    for name in CREDENTIAL_NAMES:
        assert name in r.stderr, name
