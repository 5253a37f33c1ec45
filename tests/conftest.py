"""Test set-up: real sandboxes, run as root and as an unprivileged user.

Security tests take the ``ident`` fixture, which runs each test twice: once as
root and once as ``sandhold-test``, an unprivileged user this set-up creates.
The machine's default ``python3`` may live where that user cannot read it
(pyenv under /root), so the unprivileged runs use a world-readable interpreter
(``/usr/bin/python3`` or another ≥3.11 one) and a world-readable copy of the
package, made once per session. Each test gets its own HOME and work directory
under /var/tmp/sandhold-tests, owned by the acting user.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"
TEST_USER = "sandhold-test"
BASE = Path("/var/tmp/sandhold-tests")
CANDIDATE_PYTHONS = (
    "/usr/bin/python3",
    "/usr/local/bin/python3",
    "/usr/bin/python3.12",
    "/usr/bin/python3.11",
    "/usr/bin/python3.13",
)


def _world_python() -> str:
    for cand in CANDIDATE_PYTHONS:
        if not os.path.exists(cand):
            continue
        out = subprocess.run(
            [cand, "-c", "import sys; print(sys.version_info >= (3, 11))"],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.stdout.strip() == "True":
            return cand
    raise RuntimeError(
        "no world-readable Python >= 3.11 found for the unprivileged test runs; "
        f"looked at {', '.join(CANDIDATE_PYTHONS)} (apt-get install python3)"
    )


def _ensure_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        pass
    if os.geteuid() != 0:
        raise RuntimeError(f"user {TEST_USER} is missing and only root can create it")
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", TEST_USER], check=True)
    return pwd.getpwnam(TEST_USER)


def _package_copy() -> Path:
    """A world-readable copy of src/sandhold, keyed by its content."""
    digest = hashlib.sha256()
    for f in sorted((SRC / "sandhold").rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts:
            digest.update(str(f.relative_to(SRC)).encode())
            digest.update(f.read_bytes())
    dest = Path("/var/tmp") / f"sandhold-test-pkg-{digest.hexdigest()[:16]}"
    if not dest.exists():
        tmp = dest.with_name(dest.name + f".{os.getpid()}")
        shutil.copytree(
            SRC / "sandhold", tmp / "sandhold", ignore=shutil.ignore_patterns("__pycache__")
        )
        import compileall

        # as scripts/setup does: the sandbox sees the package read-only, so bytecode
        # that is not there already is compiled again at every start
        compileall.compile_dir(str(tmp), quiet=1)
        for d, _dirs, files in os.walk(tmp):
            os.chmod(d, 0o755)
            for name in files:
                path = os.path.join(d, name)
                os.chmod(path, 0o755 if os.access(path, os.X_OK) else 0o644)  # the helper
        os.chmod(tmp, 0o755)
        os.rename(tmp, dest)
    return dest


class Identity:
    """Who runs sandhold in a test, and how."""

    def __init__(self, name: str, uid: int, gid: int, python: str, pythonpath: str) -> None:
        self.name, self.uid, self.gid = name, uid, gid
        self.python, self.pythonpath = python, pythonpath

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def __repr__(self) -> str:
        return f"Identity({self.name})"

    def chown(self, path: Path | str) -> None:
        os.chown(path, self.uid, self.gid, follow_symlinks=False)

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | str,
        env: Mapping[str, str],
        input: bytes | str | None = None,
        timeout: float = 60,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, object] = {}
        if not self.is_root:
            kwargs = {"user": self.uid, "group": self.gid, "extra_groups": []}
        text_input = input.decode() if isinstance(input, bytes) else input
        return subprocess.run(
            list(argv),
            cwd=cwd,
            env=dict(env),
            input=text_input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            **kwargs,
        )  # type: ignore[call-overload]

    def popen(
        self, argv: Sequence[str], *, cwd: Path | str, env: Mapping[str, str], **kw: object
    ) -> subprocess.Popen[bytes]:
        if not self.is_root:
            kw.update(user=self.uid, group=self.gid, extra_groups=[])
        return subprocess.Popen(list(argv), cwd=cwd, env=dict(env), **kw)  # type: ignore[call-overload]


def _runtime_dependencies() -> list[str]:
    import tomllib

    with open(REPO / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    # the server's and the extras a run may use on the host (botocore re-signs masked
    # AWS keys): the unprivileged identity runs ``sandhold serve`` as well
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *extras["server"], *extras.get("aws", [])]


def _world_venv() -> str:
    """A world-readable venv with sandhold's runtime dependencies, keyed by them.

    Built from a world-readable interpreter, so the unprivileged identity runs
    sandhold exactly as an installed user would (the package itself comes from
    the world-readable copy on PYTHONPATH).
    """
    deps = _runtime_dependencies()
    key = hashlib.sha256(("\n".join(deps) + _world_python()).encode()).hexdigest()[:16]
    venv = Path("/var/tmp") / f"sandhold-test-venv-{key}"
    python = venv / "bin" / "python"
    done = venv / ".complete"
    if not done.exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([_world_python(), "-m", "venv", str(venv)], check=True)
        if deps:
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *deps],
                check=True,
            )
        for d, _dirs, files in os.walk(venv):
            os.chmod(d, 0o755)
            for name in files:
                full = os.path.join(d, name)
                if not os.path.islink(full):
                    os.chmod(full, os.stat(full).st_mode | 0o444)
        done.touch()
    return str(python)


@pytest.fixture(scope="session")
def identities() -> dict[str, Identity]:
    user = _ensure_user()
    copy = _package_copy()
    return {
        "root": Identity("root", 0, 0, sys.executable, str(SRC)),
        "user": Identity(TEST_USER, user.pw_uid, user.pw_gid, _world_venv(), str(copy)),
    }


@pytest.fixture(params=["root", "user"])
def ident(request: pytest.FixtureRequest, identities: dict[str, Identity]) -> Identity:
    if os.geteuid() != 0:
        pytest.fail("the security tests must be started as root (they also run as a user)")
    return identities[request.param]


class World:
    """A per-test home and work directory owned by ``ident``, and a way to run sandhold."""

    def __init__(self, ident: Identity, root: Path) -> None:
        self.ident = ident
        self.root = root
        self.home = root / "home"
        self.work = root / "work"
        for d in (root, self.home, self.work):
            d.mkdir(mode=0o755, exist_ok=True)
            ident.chown(d)

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(self.home),
            "USER": self.ident.name,
            "LANG": "C.UTF-8",
            "PYTHONPATH": self.ident.pythonpath,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        env.update(extra)
        return env

    def mkfile(self, rel: str, content: str = "", mode: int = 0o644) -> Path:
        path = self.root / rel
        self.mkdir(str(path.parent.relative_to(self.root)))
        path.write_text(content)
        os.chmod(path, mode)
        self.ident.chown(path)
        return path

    def mkdir(self, rel: str) -> Path:
        path = self.root / rel
        missing = []
        p = path
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            d.mkdir(mode=0o755)
            self.ident.chown(d)
        return path

    def symlink(self, rel: str, target: str) -> Path:
        path = self.root / rel
        path.symlink_to(target)
        self.ident.chown(path)
        return path

    def settings(self, data: object, name: str = "settings.json") -> Path:
        return self.mkfile(name, json.dumps(data) if not isinstance(data, str) else data)

    def sandhold(
        self,
        *args: str,
        cwd: Path | None = None,
        input: str | bytes | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        argv = [self.ident.python, "-P", "-m", "sandhold", *args]
        return self.ident.run(
            argv, cwd=cwd or self.work, env=env or self.env(), input=input, timeout=timeout
        )

    def popen(
        self,
        *args: str,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        **kw: object,
    ) -> subprocess.Popen[bytes]:
        argv = [self.ident.python, "-P", "-m", "sandhold", *args]
        return self.ident.popen(argv, cwd=cwd or self.work, env=env or self.env(), **kw)


@pytest.fixture
def world(ident: Identity, request: pytest.FixtureRequest) -> Iterator[World]:
    BASE.mkdir(mode=0o755, exist_ok=True)
    os.chmod(BASE, 0o755)
    # keyed by the checkout too: two clones' suites may run side by side
    name = hashlib.sha1(f"{REPO}\0{request.node.nodeid}".encode()).hexdigest()[:12]
    root = BASE / name
    if root.exists():
        _force_rmtree(root)
    yield World(ident, root)
    _force_rmtree(root)


def _force_rmtree(path: Path) -> None:
    for d, dirs, _files in os.walk(path):
        for name in dirs:
            full = os.path.join(d, name)
            if not os.path.islink(full):
                with contextlib.suppress(OSError):
                    os.chmod(full, 0o755)
    shutil.rmtree(path, ignore_errors=True)
