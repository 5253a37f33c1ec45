"""Credential names inside recognised environment trees (issue 15): a table of the pure
rule (``mandatory.environment_tree`` and its table ``ENVIRONMENT_TREES``), and the real
CLI: ``python -m venv`` and ``pip install`` under ``allowWrite: ["."]``, as root and
unprivileged, while real keys in the project stay refused and name the setting."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from conftest import World
from sandhold.policy.creation import Decider, creation_policy, denied
from sandhold.policy.mandatory import environment_tree
from sandhold.policy.refusal import CREDENTIAL, MANDATORY, Refusal

# (path, existing markers, expected tree or None)
TREES: list[tuple[str, tuple[str, ...], str | None]] = [
    # a venv: pyvenv.cfg in a directory strictly below the root
    (
        "/w/.venv/lib/python3.11/site-packages/pip/_vendor/certifi/cacert.pem",
        ("/w/.venv/pyvenv.cfg",),
        "a Python virtual environment at /w/.venv",
    ),
    ("/w/.venv/lib/key.pem", ("/w/.venv/pyvenv.cfg",), "a Python virtual environment at /w/.venv"),
    # beside the marker: no package's file
    ("/w/.venv/id_rsa", ("/w/.venv/pyvenv.cfg",), None),
    # the root itself holding pyvenv.cfg is no venv
    ("/w/keys/id_rsa", ("/w/pyvenv.cfg",), None),
    # named like a venv, without its marker
    ("/w/.venv/lib/python3.11/site-packages/x/key.pem", (), None),
    ("/w/lib/python3.11/site-packages/x/key.pem", (), None),
    ("/w/env/lib/site-packages/x/a.pem", ("/w/env/conda-meta",), "a conda environment at /w/env"),
    # node_modules beside a package.json; its packages' files, not node_modules itself
    (
        "/w/node_modules/pkg/test/fixtures/server.key",
        ("/w/package.json",),
        "a node_modules beside a package.json at /w/node_modules",
    ),
    (
        "/w/app/node_modules/@s/p/k.pem",
        ("/w/app/package.json",),
        "a node_modules beside a package.json at /w/app/node_modules",
    ),
    ("/w/node_modules/.env", ("/w/package.json",), None),
    ("/w/node_modules/pkg/k.pem", (), None),  # merely named node_modules
    ("/w/secrets/node_modules/x/id_ed25519", ("/w/package.json",), None),
    # cargo's registry and Go's module cache
    (
        "/w/cargo/registry/src/idx/ring-0.17/tests/k.pem",
        ("/w/cargo/registry/index",),
        "cargo's registry at /w/cargo/registry",
    ),
    ("/w/registry/src/a/k.pem", (), None),
    (
        "/w/go/pkg/mod/golang.org/x/crypto@v0.1/testdata/k.pem",
        ("/w/go/pkg/mod/cache/download",),
        "Go's module cache at /w/go/pkg/mod",
    ),
    ("/w/mod/x/k.pem", ("/w/mod/cache",), None),
    # outside the root nothing counts
    ("/elsewhere/.venv/lib/k.pem", ("/elsewhere/.venv/pyvenv.cfg",), None),
]


@pytest.mark.parametrize(("path", "markers", "expected"), TREES)
def test_environment_tree_table(path: str, markers: tuple[str, ...], expected: str | None) -> None:
    assert environment_tree(path, "/w", set(markers).__contains__) == expected


POLICY = creation_policy(writable_roots=["/w"], cwd="/w", home="/home/u")


@pytest.mark.parametrize(("path", "markers", "expected"), TREES)
def test_the_supervisor_rule_follows_the_table(
    path: str, markers: tuple[str, ...], expected: str | None
) -> None:
    if not path.startswith("/w/"):
        return
    reason = denied(POLICY, path, exists=set(markers).__contains__)
    if expected is not None:
        assert reason is None
    else:
        assert reason is not None and reason.rule.startswith("credential: ")
        assert reason.kind == CREDENTIAL
        assert f'"allowCredentialWrite": ["{path}"]' in reason.rule
    # without the host fact no tree is recognised
    assert Decider(POLICY).denied(path) is not None


def test_an_environment_tree_lifts_the_credential_globs_only() -> None:
    has = {"/w/.venv/pyvenv.cfg"}.__contains__
    assert denied(POLICY, "/w/.venv/lib/x/.bashrc", exists=has) == Refusal(
        MANDATORY, "mandatory: .bashrc (file run or trusted by the host)"
    )
    assert denied(POLICY, "/w/.venv/lib/.claude", directory=True, exists=has) is not None


def _wheel(dest: Path) -> None:
    """A tiny wheel whose package ships a test key (as many do), written by hand."""
    files = {
        "tinypkg/__init__.py": b"VALUE = 42\n",
        "tinypkg/tests/server.pem": b"-----BEGIN CERTIFICATE-----\nx\n",
        "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = io.StringIO()
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{name},sha256={digest},{len(data)}\n")
    record.write("tinypkg-1.0.dist-info/RECORD,,\n")
    with zipfile.ZipFile(dest / "tinypkg-1.0-py3-none-any.whl", "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("tinypkg-1.0.dist-info/RECORD", record.getvalue())


def test_venv_and_pip_install_work_under_allow_write_dot(world: World) -> None:
    wheels = world.mkdir("wheels")
    _wheel(wheels)
    world.ident.chown(wheels / "tinypkg-1.0-py3-none-any.whl")
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    script = (
        "/usr/bin/python3 -m venv .venv && "
        f".venv/bin/pip install -q --disable-pip-version-check --no-index --find-links {wheels} "
        "tinypkg && .venv/bin/python -c 'import tinypkg; print(tinypkg.VALUE)'"
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("42")
    assert "refused" not in r.stderr, r.stderr
    site = next((world.work / ".venv/lib").glob("python3*/site-packages"))
    assert (site / "tinypkg/tests/server.pem").exists()
    assert (site / "pip/_vendor/certifi/cacert.pem").exists()


def test_real_keys_stay_refused_and_name_the_setting(world: World) -> None:
    """A key in the project, beside a venv's marker, or in a directory merely named
    node_modules: refused, and the line names allowCredentialWrite with the path."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    script = (
        "mkdir -p .venv/lib node_modules/x && touch .venv/pyvenv.cfg; "
        "echo k > id_rsa; echo k > .venv/server.key; echo k > node_modules/x/a.pem; "
        "echo k > .venv/lib/ok.pem; ls .venv/lib; true"
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    w = world.work
    assert not (w / "id_rsa").exists() and not (w / ".venv/server.key").exists()
    assert not (w / "node_modules/x/a.pem").exists()
    assert (w / ".venv/lib/ok.pem").exists()  # inside the venv's tree
    line = next(x for x in r.stderr.splitlines() if x.startswith("sandhold: refused"))
    assert line == (
        "sandhold: refused id_rsa (and 2 more): credential: id_* (to allow it: "
        '"filesystem": {"allowCredentialWrite": ["./id_rsa"]}) (-d lists every refusal)'
    ), line


def test_existing_package_keys_are_writable_and_real_ones_are_not(world: World) -> None:
    """At launch too (the mount plan): a venv's certifi can be upgraded in place, a key
    in a directory merely named node_modules stays read-only."""
    world.mkfile("work/.venv/pyvenv.cfg", "home = /usr/bin\n")
    world.mkfile("work/.venv/lib/certifi/cacert.pem", "old\n")
    world.mkfile("work/node_modules/x/k.pem", "mine\n")
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    script = "echo new > .venv/lib/certifi/cacert.pem; echo evil > node_modules/x/k.pem; true"
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    assert (world.work / ".venv/lib/certifi/cacert.pem").read_text() == "new\n"
    assert (world.work / "node_modules/x/k.pem").read_text() == "mine\n"


def test_an_existing_key_kept_read_only_names_the_setting(world: World) -> None:
    key = world.mkfile("work/deploy.key", "mine\n")
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    r = world.sandhold("-s", str(s), "--explain", "--", "true")
    line = next(
        x for x in r.stdout.splitlines() if x.strip().startswith("ro-bind") and "deploy" in x
    )
    assert (
        f'<- credential: *.key (to allow it: "filesystem": {{"allowCredentialWrite": ["{key}"]}})'
        in line
    )
