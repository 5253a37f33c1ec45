"""Real tools under the creation-time supervisor, bubblewrap around it, and Landlock beside it.

As root and as an unprivileged user: ``git clone`` of a local repository into
scratch, ``pip wheel`` + ``python -m venv`` + ``pip install`` of a local wheel,
``tar x`` of a 10,000-file archive (with two denied names in it); the
supervisor inside a real bubblewrap sandbox (user namespace, PID namespace,
the static filter stacked under the notifying one); and the Landlock domain.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, World
from sandhold.backends.linux import seccomp
from sandhold.backends.linux.supervisor.landlock import landlock_abi
from sandhold.policy.syscalls import syscall_rules
from test_supervisor_emulation import PRELUDE, _policy, run_py, supervised


def _own_tree(world: World, top: Path) -> None:
    world.ident.chown(top)
    for d, dirs, files in os.walk(top):
        for name in (*dirs, *files):
            world.ident.chown(os.path.join(d, name))


def _git(*args: str, cwd: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(cwd),
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    subprocess.run(
        ["git", "-c", "safe.directory=*", *args], cwd=cwd, env=env, check=True, capture_output=True
    )


@pytest.mark.sandbox
def test_git_clone_into_scratch(world: World) -> None:
    src = world.mkdir("src")
    (src / "README").write_text("hello\n")
    (src / "pkg").mkdir()
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    _git("init", "-q", cwd=src)
    _git("add", ".", cwd=src)
    _git("commit", "-q", "-m", "first", cwd=src)
    _own_tree(world, src)
    script = (
        'git clone -q "$SRC" "$TMPDIR/clone" && '
        'git -C "$TMPDIR/clone" log --format=%s && '
        'cat "$TMPDIR/clone/pkg/mod.py" && '
        'git -C "$TMPDIR/clone" -c user.name=t -c user.email=t@e checkout -q -b topic && '
        'echo "Y = 2" >> "$TMPDIR/clone/pkg/mod.py" && '
        'git -C "$TMPDIR/clone" -c user.name=t -c user.email=t@e commit -qam second && '
        'git -C "$TMPDIR/clone" log --format=%s | head -1; '
        'git clone -q "$SRC" inwork && cat inwork/README && '
        "cp inwork/.git/hooks/pre-push.sample inwork/.git/hooks/pre-push 2>/dev/null || "
        'echo "no hook in the work tree clone"'
    )
    env = world.env(TMPDIR=str(world.root / "scratch"), SRC=str(src))
    # git refuses a repository owned by someone else (safe.directory) unless told
    env["GIT_CONFIG_COUNT"], env["GIT_CONFIG_KEY_0"], env["GIT_CONFIG_VALUE_0"] = (
        "1",
        "safe.directory",
        "*",
    )
    result, violations = supervised(world, ["sh", "-c", script], env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "first",
        "X = 1",
        "second",
        "hello",
        "no hook in the work tree clone",
    ]
    assert (world.root / "scratch/clone/.git/hooks").is_dir()  # scratch is exempt
    hooks = list((world.work / "inwork/.git/hooks").iterdir())
    assert hooks and all(h.name.endswith(".sample") for h in hooks)  # git's inert templates
    assert [v["target"] for v in violations] == [str(world.work / "inwork/.git/hooks/pre-push")]


def _has_build_tools() -> bool:
    probe = subprocess.run(
        ["/usr/bin/python3", "-c", "import setuptools, wheel, ensurepip, venv"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


@pytest.mark.sandbox
@pytest.mark.skipif(
    not os.path.exists("/usr/bin/python3") or not _has_build_tools(),
    reason="needs /usr/bin/python3 with setuptools, wheel and venv (python3-setuptools, "
    "python3-wheel, python3-venv)",
)
def test_pip_wheel_venv_and_install(world: World) -> None:
    world.mkfile(
        "work/proj/pyproject.toml",
        textwrap.dedent("""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "tinyproj"
        version = "1.0"
        """),
    )
    world.mkfile("work/proj/tinyproj/__init__.py", "ANSWER = 42\n")
    script = (
        "set -e; "
        "/usr/bin/python3 -m pip wheel -q --no-index --no-build-isolation --no-deps "
        "-w dist ./proj; "
        '/usr/bin/python3 -m venv "$TMPDIR/venv"; '
        '"$TMPDIR/venv/bin/python" -m pip install -q --no-index '
        "dist/tinyproj-1.0-py3-none-any.whl; "
        "cd /; \"$TMPDIR/venv/bin/python\" -c 'import tinyproj; print(tinyproj.ANSWER)'; "
        # in the work tree too: pip's own certifi/cacert.pem lies in a recognised
        # environment tree (the venv's pyvenv.cfg above it), not a user's credential
        'cd "$OLDPWD"; /usr/bin/python3 -m venv venv-in-work >/dev/null 2>&1 && echo made'
    )
    env = world.env(TMPDIR=str(world.root / "scratch"), PIP_DISABLE_PIP_VERSION_CHECK="1")
    result, violations = supervised(world, ["sh", "-c", script], env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-2:] == ["42", "made"]
    assert violations == []
    assert (world.work / "venv-in-work/pyvenv.cfg").exists()
    assert (world.work / "dist/tinyproj-1.0-py3-none-any.whl").exists()
    site = next((world.root / "scratch/venv/lib").glob("python3*/site-packages"))
    assert (site / "tinyproj/__init__.py").exists()
    assert len(list(site.rglob("*.py"))) > 100  # pip itself, installed by ensurepip


@pytest.mark.sandbox
def test_tar_extracts_ten_thousand_files(world: World) -> None:
    src = world.root / "tarsrc"
    for d in range(100):
        sub = src / f"d{d:02}"
        sub.mkdir(parents=True)
        for f in range(100):
            (sub / f"f{f:02}.txt").write_text(f"{d}-{f}\n")
    (src / "d00/.env").write_text("SECRET=1\n")
    (src / "d01/.bashrc").write_text("evil\n")
    archive = world.root / "files.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(src, arcname="tree")
    os.chmod(archive, 0o644)
    shutil.rmtree(src)
    result, violations = supervised(world, ["tar", "xf", str(archive)], timeout=300)
    assert result.returncode == 2  # tar says some members could not be created
    assert ".env: Cannot open: Permission denied" in result.stderr
    tree = world.work / "tree"
    files = [p for p in tree.rglob("*") if p.is_file()]
    assert len(files) == 10_000
    assert (tree / "d42/f17.txt").read_text() == "42-17\n"
    assert not os.path.lexists(tree / "d00/.env")
    assert not os.path.lexists(tree / "d01/.bashrc")
    assert sorted(Path(v["target"]).name for v in violations) == [".bashrc", ".env"]
    assert os.stat(tree / "d42/f17.txt").st_uid == world.ident.uid


BWRAP_BODY = """
create('ok.txt')
os.makedirs('.git/hooks')  # a repository made during the run: its hooks dir may be made
for n in ('.env', 'a/b/c/.bashrc', '.git/hooks/pre-commit', 'key.pem'):
    os.makedirs('a/b/c', exist_ok=True)
    r('create:' + n, lambda: create(n))
    r('rename:' + n, lambda: os.rename('ok.txt', n))
    r('mkdir:' + n, lambda: os.makedirs(n))
r('io_uring', lambda: check(libc.syscall(NR['io_uring_setup'], 1, 0)))
R['pid1'] = str(os.getpid() < 10)  # a PID namespace
R['ok'] = open('ok.txt').read() + 'x'
"""


@pytest.mark.sandbox
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_supervisor_inside_bubblewrap(world: World) -> None:
    """The harness forks, filters and supervises inside a user namespace, under the base filter."""
    base = seccomp.build_program(syscall_rules(allow_unix_sockets=False), seccomp.native_arch())
    fd = os.memfd_create("sandhold-base-filter")
    os.write(fd, base)
    os.lseek(fd, 0, os.SEEK_SET)
    code = PRELUDE + textwrap.dedent(BWRAP_BODY) + "\nprint(json.dumps(R))\n"
    import json

    policy = json.dumps(_policy(world, writable_roots=[str(world.work)]))
    violations = world.root / "violations.jsonl"
    argv = [
        "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/",
        "/",
        "--bind",
        str(world.root),
        str(world.root),
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
        # a checkout under /tmp (CI's may be) holds the interpreter's venv and the package
        *(["--ro-bind", str(REPO), str(REPO)] if str(REPO).startswith("/tmp/") else []),
        "--seccomp",
        str(fd),
        "--chdir",
        str(world.work),
        "--",
        world.ident.python,
        "-m",
        "sandhold.backends.linux.supervisor.run",
        "--policy",
        policy,
        "--violations",
        str(violations),
        "--",
        world.ident.python,
        "-c",
        code,
    ]
    proc = world.ident.popen(
        argv,
        cwd=world.work,
        env=world.env(),
        pass_fds=(fd,),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.communicate(timeout=120)
    os.close(fd)
    assert proc.returncode == 0, err.decode()
    results = json.loads(out.decode().strip().splitlines()[-1])
    assert results.pop("pid1") == "True"
    assert results.pop("ok") == "x"
    assert results.pop("io_uring") == "EPERM"  # the base filter still holds
    assert set(results.values()) == {"EACCES"}, results
    for name in (".env", "a/b/c/.bashrc", ".git/hooks/pre-commit", "key.pem"):
        assert not os.path.lexists(world.work / name)
    assert len(violations.read_text().splitlines()) == 12


LANDLOCK_BODY = """
outside = os.environ['OUTSIDE']
r('create_inside', lambda: create('in.txt'))
r('create_denied', lambda: create('.env'))
r('write_outside', lambda: os.close(os.open(outside + '/existing', os.O_WRONLY)))
r('unlink_outside', lambda: os.unlink(outside + '/existing'))
r('create_outside', lambda: create(outside + '/new'))
r('mkdir_outside', lambda: os.mkdir(outside + '/newdir'))
r('dev_null', lambda: create('/dev/null'))
r('scratch', lambda: create(os.environ['TMPDIR'] + '/s.txt'))
"""


@pytest.mark.sandbox
@pytest.mark.skipif(landlock_abi() < 1, reason="the kernel has no Landlock")
@pytest.mark.parametrize("mode", ["child", "self"])
def test_landlock_confines_writes_to_the_roots(world: World, mode: str) -> None:
    outside = world.mkdir("outside")
    world.mkfile("outside/existing", "keep\n")
    policy = _policy(world, writable_roots=[str(world.work)])
    env = world.env(TMPDIR=str(world.mkdir("scratch")), OUTSIDE=str(outside))
    results, violations = run_py(world, LANDLOCK_BODY, policy=policy, landlock=mode, env=env)
    # calls the supervisor performs run in its domain: confined only in "self" mode
    emulated_outside = "EACCES" if mode == "self" else "ok"
    assert results == {
        "create_inside": "ok",
        "create_denied": "EACCES",
        "write_outside": "EACCES",
        "unlink_outside": "EACCES",
        "create_outside": emulated_outside,
        "mkdir_outside": emulated_outside,
        "dev_null": "ok",
        "scratch": "ok",
    }
    assert (outside / "existing").read_text() == "keep\n"
    made = [(v["action"], v["target"]) for v in violations]
    refused_there = [
        ("file-write-readonly", f"{outside}/new"),
        ("file-write-readonly", f"{outside}/newdir"),
    ]
    assert made == [
        ("file-write-create", str(world.work / ".env")),
        *(refused_there if mode == "self" else ()),
    ]


def test_landlock_abi_is_reported() -> None:
    abi = landlock_abi()
    assert abi == 0 or abi >= 1
    out = subprocess.run(["uname", "-r"], capture_output=True, text=True, check=True).stdout.split(
        "."
    )
    if (int(out[0]), int(out[1])) >= (6, 10):
        assert abi >= 5
