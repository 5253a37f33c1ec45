"""Backend choice, the host probe and the set-up script's refusals (F-BE-1..3, F-BE-6).

Nothing here may fall back silently: a backend that is not available stops the
launch with exit 2 and a hint, and the command does not run.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from conftest import REPO, World


def test_probe_json_reports_native_available(world: World) -> None:  # F-BE-2
    r = world.sandhold("probe", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["platform"] in ("linux", "wsl2")
    assert data["available"] is True and data["default_backend"] == "native"
    details = data["details"]
    assert details["trial sandbox"] == "ok"
    assert details["seccomp user notification"] == "yes"
    assert details["creation-time supervisor"].startswith("yes (compiled front")
    assert details["landlock ABI"].isdigit()
    assert "bubblewrap" in details and "cgroups" in details


def test_probe_human_output(world: World) -> None:
    r = world.sandhold("probe")
    assert r.returncode == 0
    assert r.stdout.startswith("native sandbox: available on linux")
    assert "landlock ABI:" in r.stdout


def test_missing_bwrap_is_reported_with_the_package_name(world: World) -> None:  # F-BE-2
    s = world.settings({"bwrapPath": "/nonexistent/bwrap"})
    marker = world.work / "marker"
    r = world.sandhold("-s", str(s), "--", "touch", str(marker))
    assert r.returncode == 2
    assert "apt-get install bubblewrap" in r.stderr and "--backend none" in r.stderr
    assert not marker.exists()
    p = world.sandhold("-s", str(s), "probe", "--json")
    data = json.loads(p.stdout)
    assert data["available"] is False and data["requires_install"] is True
    assert "bubblewrap" in data["hint"]


def test_microvm_request_fails_loudly_without_fallback(world: World) -> None:  # F-BE-6
    marker = world.work / "marker"
    r = world.sandhold("--backend", "microvm", "--", "touch", str(marker))
    assert r.returncode == 2 and "microvm" in r.stderr and "no fallback" in r.stderr
    assert not marker.exists()


def test_unknown_backend_is_a_usage_error(world: World) -> None:
    r = world.sandhold("--backend", "docker2", "--", "true")
    assert r.returncode == 2 and "unknown backend" in r.stderr


def test_backend_none_runs_unisolated_but_scrubbed(world: World) -> None:  # F-BE-3
    env = world.env(AWS_SECRET_ACCESS_KEY="s3cr3t")
    r = world.sandhold(
        "--backend",
        "none",
        "--",
        "sh",
        "-c",
        'echo "${AWS_SECRET_ACCESS_KEY:-unset}"; touch written',
        env=env,
    )
    assert r.returncode == 0 and r.stdout == "unset\n"
    assert (world.work / "written").exists()  # no filesystem isolation


def test_setup_names_missing_packages_when_not_root(world: World) -> None:
    if world.ident.is_root:
        return  # root installs them instead; covered by CI's fresh machines
    scripts = world.mkdir("repo/scripts")
    shutil.copy(REPO / "scripts" / "setup", scripts / "setup")
    shutil.copy(REPO / "pyproject.toml", scripts.parent / "pyproject.toml")
    for p in (scripts / "setup", scripts.parent / "pyproject.toml"):
        world.ident.chown(p)
    os.chmod(scripts / "setup", 0o755)
    # a PATH with the basic tools but without bwrap
    tools = world.mkdir("tools")
    for name in ("bash", "dirname", "id", "cat", "sha256sum", "cut"):
        real = shutil.which(name)
        assert real is not None
        (tools / name).symlink_to(real)
    env = world.env(PATH=str(tools))
    r = world.ident.run(["bash", str(scripts / "setup")], cwd=world.work, env=env)
    assert r.returncode == 1
    assert "needs these Debian/Ubuntu packages: bubblewrap" in r.stderr
    assert "sudo apt-get install bubblewrap" in r.stderr
    assert not Path(scripts.parent / ".venv").exists()
