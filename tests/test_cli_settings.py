"""A bad settings file stops sandhold before anything runs (F-SET-3), as root and as a user.

Each case checks the exit status (2), that stderr names the file, the key and the
problem, and that the command did not run (its marker file is absent).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import World


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("", "the file is empty"),
        ("{not json", "not valid JSON"),
        ('{"filesystem": {"denyRead": "~/.ssh"}}', "filesystem.denyRead: expected an array"),
        ('{"filesystem": {"denyWrite": [42]}}', "filesystem.denyWrite[0]: expected a string"),
        ('{"filesystem": {"denyRaed": ["~/.ssh"]}}', "filesystem.denyRaed: unknown key"),
        ('{"network": {"allowedDomain": []}}', "network.allowedDomain: unknown key"),
        ('{"filesystem": {"allowWrite": ["src/**x"]}}', "filesystem.allowWrite[0]"),
        ('{"filesystem": {"denyRead": ["[unclosed"]}}', "unclosed '['"),
        ('{"network": {"allowedDomains": ["*.com"]}}', "network.allowedDomains[0]"),
    ],
)
def test_bad_settings_exit_2_and_run_nothing(world: World, content: str, needle: str) -> None:
    settings = world.settings(content)
    marker = world.work / "marker"
    r = world.sandhold("-s", str(settings), "--", "touch", str(marker))
    assert r.returncode == 2, r.stderr
    assert str(settings) in r.stderr
    assert needle in r.stderr
    assert not marker.exists()
    assert r.stdout == ""


def test_missing_settings_file_is_an_error(world: World) -> None:  # F-SET-3
    marker = world.work / "marker"
    missing = world.root / "nope.json"
    r = world.sandhold("--settings", str(missing), "--", "touch", str(marker))
    assert r.returncode == 2
    assert f"{missing}: the file does not exist" in r.stderr
    assert not marker.exists()


def test_bad_default_settings_file_is_an_error_too(world: World) -> None:  # F-SET-2/3
    world.mkfile("home/.sandhold-settings.json", '{"filesystem": ')
    marker = world.work / "marker"
    r = world.sandhold("--", "touch", str(marker))
    assert r.returncode == 2 and ".sandhold-settings.json" in r.stderr
    assert not marker.exists()


def test_default_settings_file_is_used(world: World) -> None:  # F-SET-1
    world.mkfile("home/.sandhold-settings.json", '{"filesystem": {"allowWrite": ["."]}}')
    r = world.sandhold("--", "touch", "made-here")
    assert r.returncode == 0, r.stderr
    assert (world.work / "made-here").exists()


def test_srt_settings_file_works_unchanged(world: World) -> None:  # F-SET-1
    srt = world.settings(
        {
            "network": {"allowedDomains": [], "deniedDomains": []},
            "filesystem": {"denyRead": ["~/.ssh"], "allowWrite": ["."], "denyWrite": []},
        },
        name=".srt-settings.json",
    )
    world.mkfile("home/.ssh/id_rsa", "K")
    r = world.sandhold("-s", str(srt), "--", "sh", "-c", "cat ~/.ssh/id_rsa; touch ok")
    assert r.returncode == 0
    assert "Permission denied" in r.stderr
    assert (world.work / "ok").exists()


def test_unenforceable_policy_exits_2_without_running(world: World) -> None:
    s = world.settings({"filesystem": {"disabled": True}})
    marker = world.work / "marker"
    r = world.sandhold("-s", str(s), "--", "touch", str(marker))
    assert r.returncode == 2 and "filesystem.disabled" in r.stderr
    assert not marker.exists()


def test_python_m_without_safe_path_is_refused(tmp_path: Path) -> None:
    """-m searches the working directory first: a sandbox that could write there could
    put a sandhold package in the way, so the unsafe spelling is refused every time."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    r = subprocess.run(
        [sys.executable, "-m", "sandhold", "--version"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 2 and "python -P -m sandhold" in r.stderr
    r = subprocess.run(
        [sys.executable, "-P", "-m", "sandhold", "--version"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0 and r.stdout.startswith("sandhold ")
