"""Settings parsing and validation as a pure function (F-SET-1, F-SET-3).

The CLI-level counterparts (exit 2, nothing run) are in test_cli_settings.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandhold.errors import SettingsError
from sandhold.settings import DEFAULT_SETTINGS, _loads, load_settings, parse_settings

# A settings file as srt writes and documents it, every block filled in.
SRT_FILE = {
    "network": {
        "allowedDomains": ["github.com", "*.npmjs.org", "api.example.com:443"],
        "deniedDomains": ["evil.example.com", "*:22"],
        "deniedDomainReasons": {"*:22": "no ssh"},
        "strictAllowlist": True,
        "allowUnixSockets": ["/var/run/docker.sock"],
        "allowAllUnixSockets": False,
        "allowLocalBinding": True,
        "allowMachLookup": ["com.example.*"],
    },
    "filesystem": {
        "denyRead": ["~/.ssh", "**/.env"],
        "allowRead": ["."],
        "allowWrite": [".", "/tmp"],
        "denyWrite": ["./secrets", "*.pem"],
        "allowGitConfig": False,
    },
    "credentials": {
        "files": [{"path": "~/.npmrc", "mode": "deny"}],
        "envVars": [{"name": "GITHUB_TOKEN", "mode": "deny"}],
    },
    "ignoreViolations": {"*": ["/usr/bin"]},
    "enableWeakerNestedSandbox": False,
    "ripgrep": {"command": "rg"},
    "mandatoryDenySearchDepth": 3,
    "allowPty": True,
    "git": {"safeDirectories": ["/repo"]},
}


def test_srt_file_is_accepted_unchanged() -> None:  # F-SET-1
    s = parse_settings(json.dumps(SRT_FILE), "srt.json")
    assert s.filesystem.deny_read == ("~/.ssh", "**/.env", "~/.npmrc")  # credentials.files deny
    assert s.filesystem.allow_write == (".", "/tmp")
    assert s.filesystem.deny_write == ("./secrets", "*.pem")
    assert s.network.allowed_domains == ("github.com", "*.npmjs.org", "api.example.com:443")
    assert s.env_deny == ("GITHUB_TOKEN",)
    assert s.git_safe_directories == ("/repo",)
    assert any("allowPty" in n for n in s.notes)
    assert any("mandatoryDenySearchDepth" in w for w in s.warnings)


def test_minimal_and_partial_files() -> None:
    assert parse_settings("{}", "f").filesystem == DEFAULT_SETTINGS.filesystem
    s = parse_settings('{"filesystem": {"denyRead": ["~/.aws"]}}', "f")
    assert s.filesystem.deny_read == ("~/.aws",)
    assert s.network.allowed_domains == ()


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ("", "", "empty"),
        ("   \n", "", "empty"),
        ("{", "", "not valid JSON"),
        ("[]", "", "expected an object"),
        ("null", "", "expected an object"),
        ('{"filesystem": []}', "filesystem", "expected an object"),
        ('{"filesystem": {"denyRead": "~/.ssh"}}', "filesystem.denyRead", "expected an array"),
        ('{"filesystem": {"denyRead": [1]}}', "filesystem.denyRead[0]", "expected a string"),
        ('{"filesystem": {"denyRead": [""]}}', "filesystem.denyRead[0]", "empty"),
        ('{"filesystem": {"denyread": []}}', "filesystem.denyread", "did you mean 'denyRead'"),
        ('{"filesytem": {}}', "filesytem", "unknown key"),
        ('{"network": {"allowedDomains": ["*"]}}', "network.allowedDomains[0]", "every host"),
        ('{"network": {"allowedDomains": ["*.com"]}}', "network.allowedDomains[0]", "too broad"),
        (
            '{"network": {"deniedDomains": ["fa\u00df.de"]}}',
            "network.deniedDomains[0]",
            "two hosts",
        ),
        (
            '{"network": {"allowedDomains": ["https://a.com"]}}',
            "network.allowedDomains[0]",
            "scheme",
        ),
        (
            '{"network": {"allowAllUnixSockets": "yes"}}',
            "network.allowAllUnixSockets",
            "true or false",
        ),
        ('{"filesystem": {"allowWrite": ["a/**b"]}}', "filesystem.allowWrite[0]", "whole path"),
        ('{"filesystem": {"denyWrite": ["[abc"]}}', "filesystem.denyWrite[0]", "unclosed"),
        ('{"filesystem": {"denyRead": ["~root/x"]}}', "filesystem.denyRead[0]", "~user"),
        ('{"filesystem": {"disabled": true}}', "filesystem.disabled", "never switches"),
        ('{"mandatoryDenySearchDepth": 0}', "mandatoryDenySearchDepth", "between 1 and 10"),
        ('{"mandatoryDenySearchDepth": true}', "mandatoryDenySearchDepth", "integer"),
        ('{"bwrapPath": "bwrap"}', "bwrapPath", "absolute"),
        ('{"credentials": {"files": [{"mode": "deny"}]}}', "credentials.files[0].path", "missing"),
        (
            '{"credentials": {"envVars": [{"name": "X", "mode": "hide"}]}}',
            "credentials.envVars[0].mode",
            "one of",
        ),
        ('{"env": {"passthrough": ["BAD-NAME"]}}', "env.passthrough[0]", "environment variable"),
        ('{"filesystem": {"denyRead": ["\\ud800"]}}', "filesystem.denyRead[0]", "surrogate"),
        ('{"ignoreViolations": {"\\ud800": []}}', "ignoreViolations.'\\ud800'", "surrogate"),
        # a route sandhold does not build: going direct would bypass the one asked for
        (
            '{"network": {"parentProxy": {"http": "http://corp:3128"}}}',
            "network.parentProxy",
            "not supported",
        ),
        ('{"network": {"httpProxyPort": 4000}}', "network.httpProxyPort", "go direct"),
        ('{"network": {"mitmProxy": {"socketPath": "/x"}}}', "network.mitmProxy", "not supported"),
        # json keeps the last of two keys silently: the first rule would be dropped
        ('{"filesystem": {"denyRead": ["~/.ssh"], "denyRead": []}}', "", "'denyRead' appears"),
        ('{"filesystem": {}, "filesystem": {}}', "", "'filesystem' appears twice"),
        ('{"network": {"httpProxyPort": ' + "1" * 5000 + "}}", "", "not valid JSON"),
        ("[" * 100_000, "", "nested too deeply"),
    ],
)
def test_bad_settings_name_the_key_and_the_problem(text: str, key: str, reason: str) -> None:
    with pytest.raises(SettingsError) as info:  # F-SET-3
        parse_settings(text, "/x/settings.json")
    err = info.value
    assert err.file == "/x/settings.json"
    assert err.key == key
    assert reason in err.reason
    assert err.render().startswith("invalid settings: /x/settings.json")


def test_masking_is_not_silently_dropped() -> None:
    s = parse_settings(
        '{"credentials": {"files": [{"path": "~/.tok", "mode": "mask"}],'
        ' "envVars": [{"name": "API_TOKEN", "mode": "mask"}], "allowPlaintextInject": true}}',
        "f",
    )
    # the real file and variable stay out of the sandbox; the plan gives placeholders
    assert "~/.tok" in s.filesystem.deny_read and s.env_deny == ("API_TOKEN",)
    assert [m.target for m in s.credentials.masked] == ["~/.tok", "API_TOKEN"]


def test_weakening_keys_are_warned_not_obeyed() -> None:
    s = parse_settings(
        '{"filesystem": {"allowGitConfig": true}, "enableWeakerNestedSandbox": true}', "f"
    )
    assert any("allowGitConfig" in w for w in s.warnings)
    assert any("enableWeakerNestedSandbox" in w for w in s.warnings)


def test_load_settings_default_path_absent_gives_defaults(tmp_path: object) -> None:  # F-SET-2
    assert load_settings(None, "/nonexistent-home") is DEFAULT_SETTINGS


def test_load_settings_explicit_path_must_exist() -> None:  # F-SET-3
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings("/nonexistent/settings.json", "/home/x")


def test_load_settings_reads_the_default_file(tmp_path: pytest.TempPathFactory) -> None:
    import pathlib

    home = pathlib.Path(str(tmp_path))
    (home / ".sandhold-settings.json").write_text('{"filesystem": {"denyRead": ["~/.ssh"]}}')
    s = load_settings(None, str(home))
    assert s.source == str(home / ".sandhold-settings.json")
    (home / ".sandhold-settings.json").write_text("")
    with pytest.raises(SettingsError, match="empty"):
        load_settings(None, str(home))  # never a fallback to the defaults


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        max_leaves=30,
    ),
    st.sampled_from(["", " ", "\n\t ", "\r\n"]),
)
def test_fast_json_is_json(value: object, pad: str) -> None:
    """The settings reader's JSON path gives exactly what json.loads gives."""
    text = pad + json.dumps(value) + pad
    assert _loads(text) == json.loads(text)


@given(st.text(alphabet='{}[]":,0123456789.eE+-tfnrulasx \\n\\\\', max_size=40))
def test_fast_json_fails_exactly_like_json(text: str) -> None:
    try:
        expected: object = json.loads(text)
    except ValueError as exc:
        with pytest.raises(type(exc)) as got:
            _loads(text)
        assert str(got.value) == str(exc)
    else:
        assert _loads(text) == expected


def test_allow_credential_write_is_sandholds_own_list_of_paths() -> None:
    s = parse_settings('{"filesystem": {"allowCredentialWrite": ["./.venv", "**/x"]}}', "f")
    assert s.filesystem.allow_credential_write == ("./.venv", "**/x")
    with pytest.raises(SettingsError, match=r"filesystem\.allowCredentialWrite"):
        parse_settings('{"filesystem": {"allowCredentialWrite": "./.venv"}}', "f")


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_settings_file_that_is_no_file_fails_at_once(tmp_path: Path, kind: str) -> None:
    """A FIFO must not hang the start, nor /dev/zero fill the memory."""
    path = tmp_path / "s.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "huge":
        path.write_text("[" + "0," * (3 << 20) + "0]")
    src = "/dev/zero" if kind == "device" else str(path)
    with pytest.raises(SettingsError, match=r"not a regular file|larger than"):
        load_settings(src, str(tmp_path))
