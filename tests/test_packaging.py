"""Packaging: the sdist and the wheel carry the compiled front, and an install uses it.

Rules:
- Built the way a user's pip builds it: ``python -m build`` makes the sdist from this
  checkout and the wheel from that sdist, through the build backend (hatchling and
  ``hatch_build.py``) in an isolated environment; nothing but the package index is used.
- Installed the way a user installs it: a fresh venv from the world-readable
  ``/usr/bin/python3`` (or the first ≥3.11 one conftest finds), created and filled by
  the unprivileged ``sandhold-test`` user, in a world-readable directory.
- "Used" is seen from inside the sandbox: the command's parent must be the installed
  ``sandhold-exec``, not the Python runner, and ``sandhold probe --json`` must name it.
- Without a compiler (``CC=/bin/false``) the sdist still installs, the build log warns,
  the wheel pip builds is ``py3-none-any`` and probe says the front is missing.
- A missing tool fails the test with the package to install; nothing is skipped.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, Identity, _world_python

HELPER_SOURCES = ("exec.c", "fastpath.c", "fastpath.h")
SCRIPT = 'echo x > ok.txt; echo x > .env; tr "\\0" "\\n" < /proc/$PPID/cmdline | head -n 1'


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.fail("test_packaging must be started as root (it installs as sandhold-test)")
    path = Path(tempfile.mkdtemp(prefix="sandhold-pkg-", dir="/var/tmp"))
    path.chmod(0o755)  # the unprivileged user reads the dists and owns its venvs below
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def dists(base: Path) -> tuple[Path, Path]:
    """(sdist, wheel) of this checkout, the wheel built from the sdist."""
    if importlib.util.find_spec("build") is None:
        pytest.fail("python -m build is missing: pip install build (it is in the test extra)")
    out = base / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"build failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "built sandhold-exec" in done.stdout + done.stderr, done.stdout[-2000:]
    (sdist,) = out.glob("sandhold-*.tar.gz")
    (wheel,) = out.glob("sandhold-*.whl")
    for f in (out, sdist, wheel):
        f.chmod(0o755 if f.is_dir() else 0o644)
    return sdist, wheel


def _user_venv(user: Identity, home: Path, name: str) -> tuple[Path, dict[str, str]]:
    """A fresh venv owned by ``user`` under ``home``, and the environment to use it."""
    venv = home / name
    env = {
        "HOME": str(home),
        "TMPDIR": str(home),
        "PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "LANG": "C.UTF-8",
    }
    made = user.run([_world_python(), "-m", "venv", str(venv)], cwd=home, env=env, timeout=60)
    assert made.returncode == 0, made.stderr
    return venv, env


def _home(base: Path, user: Identity, name: str) -> Path:
    home = base / name
    home.mkdir()
    user.chown(home)
    return home


def _installed_front(venv: Path) -> Path:
    (site,) = venv.glob("lib/python3*/site-packages")
    return site / "sandhold" / "_helper" / "sandhold-exec"


def _probe(user: Identity, venv: Path, home: Path, env: dict[str, str]) -> dict[str, str]:
    probe = user.run([str(venv / "bin" / "sandhold"), "probe", "--json"], cwd=home, env=env)
    assert probe.returncode == 0, probe.stderr
    details: dict[str, str] = json.loads(probe.stdout)["details"]
    return details


def test_the_sdist_carries_the_c_sources_and_the_build_hook(dists: tuple[Path, Path]) -> None:
    sdist, _wheel = dists
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for src in HELPER_SOURCES:
        assert f"src/sandhold/_helper/{src}" in names, sorted(names)
    assert "hatch_build.py" in names
    assert "src/sandhold/_version.py" in names
    assert "src/sandhold/_helper/sandhold-exec" not in names  # built, never shipped


def test_the_wheel_installs_for_a_user_and_its_front_runs_the_sandbox(
    base: Path, dists: tuple[Path, Path], identities: dict[str, Identity]
) -> None:
    _sdist, wheel = dists
    assert "-py3-none-linux_" in wheel.name, wheel.name  # platform-bound, not py3-none-any
    user = identities["user"]
    home = _home(base, user, "wheel")
    venv, env = _user_venv(user, home, "venv")
    pip = user.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
        cwd=home,
        env=env,
        timeout=120,
    )
    assert pip.returncode == 0, pip.stderr
    front = _installed_front(venv)
    mode = front.stat().st_mode
    assert mode & stat.S_IXUSR and mode & stat.S_IXOTH, oct(mode)  # the exec bit survived

    details = _probe(user, venv, home, env)
    assert details["compiled front"] == str(front), details

    work = home / "work"
    work.mkdir()
    user.chown(work)
    (work / "settings.json").write_text('{"filesystem": {"allowWrite": ["."]}}')
    run = user.run(
        [str(venv / "bin" / "sandhold"), "-s", "settings.json", "--", "sh", "-c", SCRIPT],
        cwd=work,
        env=env,
    )
    assert (work / "ok.txt").read_text() == "x\n", run.stderr
    assert not (work / ".env").exists()
    assert "refused .env" in run.stderr, run.stderr
    parent = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert parent == str(front), (
        f"the command's parent is {parent!r}, not the wheel's compiled front {front} "
        f"(Yama ptrace_scope >= 1 also turns it off); stderr: {run.stderr}"
    )


def test_the_sdist_installs_without_a_compiler_and_probe_names_the_cost(
    base: Path, dists: tuple[Path, Path], identities: dict[str, Identity]
) -> None:
    sdist, _wheel = dists
    user = identities["user"]
    home = _home(base, user, "nocc")
    venv, env = _user_venv(user, home, "venv")
    pip = user.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-v", str(sdist)],
        cwd=home,
        env={**env, "CC": "/bin/false"},
        timeout=120,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    log = pip.stdout + pip.stderr
    assert "WARNING: could not build sandhold-exec" in log, log[-3000:]
    assert not _installed_front(venv).exists()
    (site,) = venv.glob("lib/python3*/site-packages")
    (wheel_file,) = site.glob("sandhold-*.dist-info/WHEEL")
    assert "Tag: py3-none-any" in wheel_file.read_text()  # nothing platform-bound inside

    details = _probe(user, venv, home, env)
    missing = details["compiled front"]
    assert missing.startswith("missing: ") and "slower" in missing and "gcc" in missing, details


def test_the_editable_install_adds_only_a_plain_path_pth() -> None:
    """``pip install -e .`` (scripts/setup) must add no import hook: every start of
    sandhold would pay for it."""
    try:
        dist = importlib.metadata.distribution("sandhold")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("sandhold is not installed in this venv: run scripts/setup --test")
    pths = [f for f in dist.files or () if f.name.endswith(".pth")]
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if not direct.get("dir_info", {}).get("editable"):
        pytest.fail(f"this venv's sandhold is not an editable install ({direct}): scripts/setup")
    assert pths, list(dist.files or ())
    for pth in pths:
        for line in Path(str(dist.locate_file(pth))).read_text().splitlines():
            assert not line.startswith(("import ", "import\t")), f"{pth}: {line}"
            assert os.path.isdir(line), f"{pth}: {line} is not a directory"
