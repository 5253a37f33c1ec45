"""The CLI's default lines (issue 15), through the real CLI as root and unprivileged:
the variables kept out, an srt settings file that is not read, a "did you mean" for
an unknown option; ``-q`` silences the lines."""

from __future__ import annotations

import pytest

from conftest import World
from sandhold.cli import parse_args
from sandhold.errors import UsageError
from sandhold.policy.env import filter_environment, kept_out_line


def _lines(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if x.startswith("sandhold:")]


def test_kept_out_variables_are_named_once_by_default(world: World) -> None:
    env = world.env(GITHUB_PERSONAL_ACCESS_TOKEN="ghp_x", MY_SETTING="1")
    r = world.sandhold("--", "sh", "-c", 'echo "${MY_SETTING:-unset}"', env=env)
    assert r.returncode == 0 and r.stdout == "unset\n"
    assert _lines(r.stderr) == [
        "sandhold: environment: kept out GITHUB_PERSONAL_ACCESS_TOKEN, MY_SETTING; to pass "
        'one, name it exactly: "env": {"passthrough": ["GITHUB_PERSONAL_ACCESS_TOKEN"]} '
        "(-d says why for each)"
    ], r.stderr
    r = world.sandhold("-q", "--", "true", env=env)
    assert r.returncode == 0 and r.stderr == ""


def test_a_pattern_passes_no_credential_and_the_line_says_so(world: World) -> None:
    """``GITHUB_*`` in env.passthrough is a pattern for ordinary names, but a
    credential-looking one passes only by its exact name; the line says which."""
    env = world.env(GITHUB_PERSONAL_ACCESS_TOKEN="ghp_x", NODE_OPTIONS_X="1")
    s = world.settings({"env": {"passthrough": ["GITHUB_*", "NODE_*"]}})
    script = 'echo "${GITHUB_PERSONAL_ACCESS_TOKEN:-unset} ${NODE_OPTIONS_X:-unset}"'
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, env=env)
    assert r.returncode == 0 and r.stdout == "unset 1\n", r.stderr
    (line,) = _lines(r.stderr)
    assert "kept out GITHUB_PERSONAL_ACCESS_TOKEN;" in line
    assert "a credential needs its exact name, a pattern passes none" in line
    s = world.settings({"env": {"passthrough": ["GITHUB_PERSONAL_ACCESS_TOKEN"]}})
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, env=env)
    assert r.stdout == "ghp_x unset\n" and "GITHUB_PERSONAL" not in r.stderr


def test_pattern_reasons_table() -> None:
    d = filter_environment(
        {"GITHUB_TOKEN": "t", "NODE_ENV": "dev", "X": "1"}, passthrough=["GITHUB_*", "NODE_*"]
    )
    assert dict(d.passed) == {"NODE_ENV": "dev"}
    assert d.pattern_secrets == ("GITHUB_TOKEN",)
    assert "env.passthrough 'GITHUB_*' passes no credential" in dict(d.dropped)["GITHUB_TOKEN"]
    assert kept_out_line(filter_environment({"PATH": "/bin"})) is None


def test_an_srt_settings_file_that_is_not_read_is_named(world: World) -> None:
    srt = world.mkfile("home/.srt-settings.json", '{"filesystem": {"allowWrite": ["."]}}')
    r = world.sandhold("--", "true")
    assert r.returncode == 0
    assert _lines(r.stderr) == [
        f"sandhold: note: {srt} is not read (sandhold reads ~/.sandhold-settings.json, "
        f"absent here, so the built-in defaults apply); use it with -s {srt}"
    ], r.stderr
    assert world.sandhold("-q", "--", "true").stderr == ""
    assert f"note: {srt} is not read" in world.sandhold("-d", "--", "true").stderr
    r = world.sandhold("-s", str(srt), "--", "sh", "-c", "echo x > f && cat f")
    assert r.stdout == "x\n" and r.stderr == "", r.stderr
    world.mkfile("home/.sandhold-settings.json", "{}")
    assert world.sandhold("--", "true").stderr == ""


@pytest.mark.parametrize(
    ("arg", "hint"),
    [
        ("--setings", "--settings"),
        ("--explian", "--explain"),
        ("-debug", "--debug"),
        ("--inherit", "--inherit-env"),
        ("--verbose", "--debug"),
        ("--violation", "--violations"),
        ("-x", None),
    ],
)
def test_unknown_option_did_you_mean(arg: str, hint: str | None) -> None:
    with pytest.raises(UsageError) as err:
        parse_args([arg, "--", "true"])
    text = str(err.value)
    if hint is None:
        assert "did you mean" not in text
    else:
        assert f"did you mean {hint}?" in text


def test_unknown_option_through_the_cli(world: World) -> None:
    r = world.sandhold("--setings", "x.json", "--", "true")
    assert r.returncode == 2
    assert r.stderr == (
        "sandhold: unknown option '--setings'; did you mean --settings? (see sandhold --help)\n"
    )
