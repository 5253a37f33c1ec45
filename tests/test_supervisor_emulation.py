"""The creation-time supervisor performing real calls, as root and as an unprivileged user.

Each test runs a Python program under ``python -m sandhold.backends.linux.supervisor.run`` (fork,
filter with a listener, supervisor thread, exec), without bubblewrap, in a work
directory owned by the acting identity. The program tries its operations and
prints a JSON object of results (``"ok"`` or the errno name); the test then
checks the results, the files on disk and the violation records (F-BE-5, F-SET-5).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import World
from sandhold.backends.linux import seccomp
from sandhold.backends.linux.supervisor.landlock import landlock_abi
from sandhold.policy import mandatory

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/fd"), reason="needs Linux with procfs"
)

_NUMBERS = seccomp.ARCHES[seccomp.native_arch()]
_NR = {**(_NUMBERS.creation_numbers or {}), **_NUMBERS.numbers}
PRELUDE = f"NR = {_NR!r}\n" + textwrap.dedent("""\
    import ctypes, errno, json, os, socket, stat, struct, sys, threading
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    R = {}
    def attempt(f):
        try:
            f()
            return "ok"
        except OSError as e:
            return errno.errorcode.get(e.errno, str(e.errno))
    def r(key, f):
        R[key] = attempt(f)
    def create(p, flags=os.O_WRONLY | os.O_CREAT, mode=0o644):
        os.close(os.open(p, flags, mode))
    def openat2(path, flags, mode=0, resolve=0, dirfd=-100):
        how = struct.pack("<QQQ", flags, mode, resolve)
        fd = libc.syscall(437, dirfd, path.encode(), how, len(how))
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        return fd
    def tmpfile_link(dir, name, via_proc):
        fd = os.open(dir, os.O_TMPFILE | os.O_WRONLY, 0o600)
        try:
            os.write(fd, b"tmp")
            # os.link() without dir_fd is link(2), which never follows: use linkat
            if via_proc:
                AT_SYMLINK_FOLLOW = 0x400
                rc = libc.linkat(-100, f"/proc/self/fd/{fd}".encode(), -100, name.encode(),
                                 AT_SYMLINK_FOLLOW)
            else:
                AT_EMPTY_PATH = 0x1000
                rc = libc.linkat(fd, b"", -100, name.encode(), AT_EMPTY_PATH)
            if rc != 0:
                e = ctypes.get_errno()
                raise OSError(e, os.strerror(e))
        finally:
            os.close(fd)
    def check(rc):
        if rc != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    def renameat2(old, new, flags):
        check(libc.syscall(NR["renameat2"], -100, old.encode(), -100, new.encode(), flags))
    def makedirs_then(d, f):
        os.makedirs(d, exist_ok=True)
        f()
    def pid_in(status):
        return [l for l in status.splitlines() if l.startswith('Pid:')][0].split()[1]
    def unix_bind(p):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind(p)
        finally:
            s.close()
    """)


def _policy(world: World, **extra: Any) -> dict[str, Any]:
    policy: dict[str, Any] = {
        "writable_roots": [str(world.work), str(world.home)],
        "scratch": [str(world.root / "scratch")],
        "cwd": str(world.work),
        "home": str(world.home),
    }
    policy.update(extra)
    return policy


def supervised(
    world: World,
    argv: list[str],
    *,
    policy: dict[str, Any] | None = None,
    landlock: str = "none",
    cwd: Path | None = None,
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, str]]]:
    """Run ``argv`` under the supervisor as ``world.ident``; returns (result, violations)."""
    scratch = world.mkdir("scratch")
    violations = world.root / "violations.jsonl"
    if violations.exists():
        violations.unlink()
    cmd = [
        world.ident.python,
        "-m",
        "sandhold.backends.linux.supervisor.run",
        "--policy",
        json.dumps(policy or _policy(world)),
        "--violations",
        str(violations),
        "--landlock",
        landlock,
        "--",
        *argv,
    ]
    result = world.ident.run(
        cmd, cwd=cwd or world.work, env=env or world.env(TMPDIR=str(scratch)), timeout=timeout
    )
    found = (
        [json.loads(line) for line in violations.read_text().splitlines()]
        if violations.exists()
        else []
    )
    return result, found


def run_py_bare(world: World, body: str) -> dict[str, str]:
    """PRELUDE + ``body`` without the supervisor, in a directory of its own: R."""
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(R))\n"
    out = world.ident.run(
        [world.ident.python, "-c", code], cwd=world.mkdir("bare"), env=world.env()
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, str] = json.loads(out.stdout)
    return result


def run_py(world: World, body: str, **kw: Any) -> tuple[dict[str, str], list[dict[str, str]]]:
    """Run PRELUDE + ``body`` under the supervisor; returns (R, violations)."""
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(R))\n"
    result, violations = supervised(world, [world.ident.python, "-c", code], **kw)
    assert result.returncode == 0, result.stderr
    assert "internal errors" not in result.stderr, result.stderr
    lines = result.stdout.strip().splitlines()
    return json.loads(lines[-1]), violations


DENIED_FILES = (
    *mandatory.MANDATORY_FILES,
    ".env",
    ".env.production",
    "server.pem",
    "tls.key",
    "id_ed25519",
    "data.sqlite",  # a denyWrite glob of the test policy
)
DENIED_DIRS = (*mandatory.MANDATORY_DIRS,)

# every way to make a name, as program text; {n} is the new name, relative to cwd
WAYS = {
    "open": "create({n!r})",
    "open_excl": "create({n!r}, os.O_WRONLY | os.O_CREAT | os.O_EXCL)",
    "open_trunc": "create({n!r}, os.O_RDWR | os.O_CREAT | os.O_TRUNC)",
    "openat2": "os.close(openat2({n!r}, os.O_WRONLY | os.O_CREAT, 0o600))",
    "mknod_fifo": "os.mkfifo({n!r})",
    "mknod_reg": "os.mknod({n!r}, stat.S_IFREG | 0o600)",
    "rename": "os.rename('allowed.txt', {n!r})",
    "renameat2_noreplace": "renameat2('allowed.txt', {n!r}, 1)",
    "link": "os.link('allowed.txt', {n!r})",
    "symlink": "os.symlink('allowed.txt', {n!r})",
    "mkdir": "os.mkdir({n!r})",
    "tmpfile_linkat_proc": "tmpfile_link('.', {n!r}, True)",
    "tmpfile_linkat_empty": "tmpfile_link('.', {n!r}, False)",
    "dangling_symlink": (
        "os.symlink({n!r}, 'dangle-' + {n!r}.replace('/', '_')) or "
        "create('dangle-' + {n!r}.replace('/', '_'))"
    ),
    "bind": "unix_bind({n!r})",
}


def _attack_program(names: list[str]) -> str:
    lines = [
        "create('allowed.txt')",
        "os.makedirs('a/b/c', exist_ok=True)",
    ]
    for name in names:
        for way, code in WAYS.items():
            lines.append(f"r({(way + ':' + name)!r}, lambda: {code.format(n=name)})")
    return "\n".join(lines)


def _names_everywhere() -> list[str]:
    # the same names directly in a writable root, three levels down, and in the home root
    return [
        *DENIED_FILES,
        *(f"a/b/c/{n}" for n in (".bashrc", ".env", "key.pem", ".mcp.json", "id_rsa")),
    ]


@pytest.mark.sandbox
def test_every_way_to_create_a_denied_name_is_refused(world: World) -> None:
    names = _names_everywhere()
    policy = _policy(world, deny_write=["**/*.sqlite"])
    results, violations = run_py(world, _attack_program(names), policy=policy)
    expected = {f"{way}:{n}": "EACCES" for n in names for way in WAYS}
    # symlink target "dangle-<name>" is an allowed name: creating through it is what is refused
    wrong = {k: v for k, v in results.items() if v != expected[k]}
    assert not wrong, wrong
    for name in names:
        assert not os.path.lexists(world.work / name), name
    assert (world.work / "allowed.txt").exists()
    targets = {v["target"] for v in violations}
    assert all(v["action"] == "file-write-create" for v in violations)
    for name in names:
        assert str(world.work / name) in targets, name


@pytest.mark.sandbox
def test_denied_directories_and_what_would_be_inside(world: World) -> None:
    body = """
    create('allowed.txt')
    for d in DIRS:
        r('mkdir:' + d, lambda: os.mkdir(d))
        r('makedirs:' + d, lambda: os.makedirs('x/y/z/' + d + '/inner'))
        r('rename_dir:' + d, lambda: (os.makedirs('plain', exist_ok=True), os.rename('plain', d)))
        r('symlink:' + d, lambda: os.symlink('/tmp', d))
    """.replace("DIRS", repr(list(DENIED_DIRS)))
    results, _ = run_py(world, body)
    assert set(results.values()) == {"EACCES"}, results
    for d in DENIED_DIRS:
        assert not os.path.lexists(world.work / d)
        assert not os.path.lexists(world.work / "x/y/z" / d)


@pytest.mark.sandbox
def test_repositories_made_during_the_run_get_git_files_but_no_hooks(world: World) -> None:
    """F-SET-5 at any depth, for a repo `git init` makes under the supervisor: git's own
    config and *.sample templates may be made in it (git works), no hook git would run."""
    body = """
    import subprocess
    p = subprocess.run(['git', 'init', '-q', 'deep/er/repo'], capture_output=True, text=True)
    R['git_init_exit'] = str(p.returncode)
    g = 'deep/er/repo/.git/'
    r('mkdir_hooks', lambda: os.mkdir(g + 'hooks'))
    r('hook', lambda: create(g + 'hooks/pre-commit'))
    r('sample_to_hook', lambda: os.rename(g + 'hooks/pre-commit.sample', g + 'hooks/pre-commit'))
    r('link_to_hook', lambda: os.link(g + 'hooks/update.sample', g + 'hooks/update'))
    r('hook_via_makedirs', lambda: os.makedirs(g + 'hooks/x'))
    r('config', lambda: create(g + 'config'))
    create(g + 'config.lock')
    r('config_via_lock_rename', lambda: os.rename(g + 'config.lock', g + 'config'))
    r('commondir', lambda: create(g + 'commondir'))
    r('dot_git_file', lambda: makedirs_then('deep/other', lambda: create('deep/other/.git')))
    os.makedirs('staging/hooks', exist_ok=True)
    create('staging/hooks/pre-commit')
    create('staging/HEAD')
    create('staging/config')
    r('rename_dir_into_git',
      lambda: makedirs_then('deep/newrepo', lambda: os.rename('staging', 'deep/newrepo/.git')))
    # a fresh .git moved aside, a hook made in it there, and moved back: still no hook
    os.makedirs('plain/.git/hooks')
    os.rename('plain/.git', 'plain/aside')
    create('plain/aside/hooks/pre-commit')
    r('hook_made_aside', lambda: os.rename('plain/aside', 'plain/.git'))
    r('head_ok', lambda: create(g + 'HEAD.new'))
    """
    results, violations = run_py(world, body)
    assert results.pop("git_init_exit") == "0"  # git works in a repository it makes
    assert results.pop("head_ok") == "ok"
    assert results.pop("mkdir_hooks") == "EEXIST"  # git init made it
    assert results.pop("config") == "ok" and results.pop("config_via_lock_rename") == "ok"
    assert set(results.values()) == {"EACCES"}, results
    git = world.work / "deep/er/repo/.git"
    assert all(h.name.endswith(".sample") for h in (git / "hooks").iterdir())
    assert not os.path.lexists(git / "commondir") and not os.path.lexists(git / "hooks/x")
    assert not os.path.lexists(world.work / "deep/other/.git")
    assert not os.path.lexists(world.work / "deep/newrepo/.git")
    assert (world.work / "staging/hooks/pre-commit").exists()  # left where it was
    assert any(v["target"] == str(git / "hooks/pre-commit") for v in violations)


@pytest.mark.sandbox
def test_no_repository_is_made_inside_an_existing_work_tree(world: World) -> None:
    """Inside a repository that existed before the run (the user's project, or a
    directory of it the sandbox made), a new repository would take over git for that
    directory on the host: a shell prompt's `git status` there would run its config
    (core.fsmonitor). Elsewhere, and inside repositories made during the run, git
    init still works."""
    subprocess.run(["git", "init", "-q", str(world.work / "proj")], check=True)
    world.mkdir("work/proj/src")
    for d in ("work/proj", "work/proj/.git"):
        for p in (world.root / d).rglob("*"):
            world.ident.chown(p)
        world.ident.chown(world.root / d)
    body = """
    import subprocess
    def init(d):
        p = subprocess.run(['git', 'init', '-q', d], capture_output=True, text=True)
        R[d] = 'ok' if p.returncode == 0 else 'refused'
    init('proj/src')
    init('proj/new/dir')
    r('mkdir', lambda: os.makedirs('proj/src/x/.git'))
    os.makedirs('staging')
    r('rename', lambda: os.rename('staging', 'proj/src/.git'))
    init('elsewhere')
    init('elsewhere/nested')  # in a repository made during this run
    # a symlink out of the work tree to where a repository can be made: the same
    r('link_out', lambda: os.symlink('../elsewhere', 'proj/lib'))
    r('link_within', lambda: os.symlink('src', 'proj/src2'))
    r('link_read_only', lambda: os.symlink('/usr/lib', 'proj/usrlib'))
    """
    results, violations = run_py(world, body)
    assert results == {
        "proj/src": "refused",
        "proj/new/dir": "refused",
        "mkdir": "EACCES",
        "rename": "EACCES",
        "elsewhere": "ok",
        "elsewhere/nested": "ok",
        "link_out": "EACCES",
        "link_within": "ok",
        "link_read_only": "ok",
    }
    for d in ("proj/src", "proj/new/dir", "proj/src/x"):
        assert not os.path.lexists(world.work / d / ".git"), d
    assert any("work tree of" in v["rule"] for v in violations)


HG_CONFIG = ("r/.hg/hgrc", "r/.hg/hgrc-not-shared", "r/.hg/sharedpath", "r/.hg/q/.hg/hgrc")


@pytest.mark.sandbox
def test_every_way_to_make_mercurial_config_is_refused(world: World) -> None:
    """In a .hg made during the run too: hg init makes no config, and hg would run the
    hooks and extensions of one at the user's next `hg status` in it."""
    body = "os.makedirs('r/.hg/q/.hg')\n" + _attack_program(list(HG_CONFIG))
    body += textwrap.dedent("""
    os.makedirs('s')
    r('dot_hg_symlink', lambda: os.symlink('../r/.hg/q', 's/.hg'))
    r('dot_hg_file', lambda: create('s/.hg'))
    os.makedirs('staging')
    create('staging/hgrc')
    r('rename_dir_with_hgrc', lambda: os.rename('staging', 's/.hg'))
    r('hgrc_dir', lambda: os.makedirs('r/.hg/hgrc/x'))
    r('requires', lambda: create('r/.hg/requires'))
    r('hgrc_outside', lambda: create('s/hgrc'))
    """)
    results, violations = run_py(world, body)
    assert results.pop("requires") == "ok" and results.pop("hgrc_outside") == "ok"
    assert set(results.values()) == {"EACCES"}, results
    for name in (*HG_CONFIG, "s/.hg", "r/.hg/hgrc"):
        assert not os.path.lexists(world.work / name), name
    targets = {v["target"] for v in violations}
    assert {str(world.work / n) for n in HG_CONFIG} <= targets
    assert (world.work / "staging/hgrc").exists()


@pytest.mark.sandbox
def test_no_repository_is_made_inside_an_existing_mercurial_work_tree(world: World) -> None:
    """An hg work tree that existed before the run is the user's like a git one: no hg
    or git repository is made in it, nor an hg one in a git work tree. Elsewhere, and
    inside repositories made during the run, hg init works."""
    subprocess.run(["hg", "init", str(world.work / "proj")], check=True)
    subprocess.run(["git", "init", "-q", str(world.work / "gitproj")], check=True)
    world.mkdir("work/proj/src")
    for top in ("work/proj", "work/gitproj"):
        for d, dirs, files in os.walk(world.root / top):
            world.ident.chown(d)
            for name in (*dirs, *files):
                world.ident.chown(os.path.join(d, name))
    body = """
    import subprocess
    def init(tool, d):
        p = subprocess.run([tool, 'init', '-q', d], capture_output=True, text=True)
        R[tool + ' ' + d] = 'ok' if p.returncode == 0 else 'refused'
    init('hg', 'proj/src')
    init('hg', 'proj/new/dir')
    init('git', 'proj/src')  # git's config would run where hg's work tree is
    init('hg', 'gitproj/sub')
    r('mkdir', lambda: os.makedirs('proj/src/x/.hg'))
    os.makedirs('staging')
    r('rename', lambda: os.rename('staging', 'proj/src/.hg'))
    init('hg', 'elsewhere')
    init('hg', 'elsewhere/nested')  # in a repository made during this run
    init('git', 'elsewhere/gitnested')
    r('link_out', lambda: os.symlink('../elsewhere', 'proj/lib'))
    r('link_within', lambda: os.symlink('src', 'proj/src2'))
    """
    env = world.env(TMPDIR=str(world.mkdir("scratch")), HGRCPATH="", HGUSER="t")
    results, violations = run_py(world, body, env=env)
    assert results == {
        "hg proj/src": "refused",
        "hg proj/new/dir": "refused",
        "git proj/src": "refused",
        "hg gitproj/sub": "refused",
        "mkdir": "EACCES",
        "rename": "EACCES",
        "hg elsewhere": "ok",
        "hg elsewhere/nested": "ok",
        "git elsewhere/gitnested": "ok",
        "link_out": "EACCES",
        "link_within": "ok",
    }
    for d in ("proj/src", "proj/new/dir", "proj/src/x", "gitproj/sub"):
        for repo in (".hg", ".git"):
            assert not os.path.lexists(world.work / d / repo), (d, repo)
    assert (world.work / "elsewhere/nested/.hg/requires").exists()
    assert any("work tree of" in v["rule"] for v in violations)


def test_existing_repository_and_protected_files(world: World) -> None:
    """Names that exist are refused as well: O_CREAT on them, renames over and away."""
    subprocess.run(["git", "init", "-q", str(world.work / "repo")], check=True)
    for d, _dirs, files in os.walk(world.work / "repo"):
        world.ident.chown(d)
        for f in files:
            world.ident.chown(os.path.join(d, f))
    world.mkfile("work/.bashrc", "ORIGINAL\n")
    config_before = (world.work / "repo/.git/config").read_bytes()
    body = """
    create('allowed.txt')
    r('config_trunc', lambda: create('repo/.git/config', os.O_WRONLY | os.O_CREAT | os.O_TRUNC))
    h = 'repo/.git/hooks/'
    r('hook_from_sample', lambda: os.rename(h + 'pre-commit.sample', h + 'pre-commit'))
    r('hook_new', lambda: create('repo/.git/hooks/post-checkout'))
    r('bashrc_over', lambda: os.rename('allowed.txt', '.bashrc'))
    r('bashrc_away', lambda: os.rename('.bashrc', 'moved'))
    r('bashrc_trunc', lambda: create('.bashrc', os.O_WRONLY | os.O_CREAT | os.O_TRUNC))
    r('bashrc_link_alias', lambda: os.link('.bashrc', 'alias'))
    r('exchange', lambda: renameat2('allowed.txt', '.bashrc', 2))
    """
    results, _ = run_py(world, body)
    assert set(results.values()) == {"EACCES"}, results
    assert (world.work / ".bashrc").read_text() == "ORIGINAL\n"
    assert (world.work / "repo/.git/config").read_bytes() == config_before
    assert not os.path.lexists(world.work / "repo/.git/hooks/pre-commit")
    assert not os.path.lexists(world.work / "alias")


@pytest.mark.sandbox
@pytest.mark.sandbox
def test_moving_a_directory_with_more_subdirectories_than_fds(world: World) -> None:
    """The check of a moved tree keeps one directory open per level, not one per
    subdirectory: a node_modules-sized move must not fail with EMFILE."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    script = "mkdir big && cd big && mkdir $(seq -f d%g 400) d7/.git && cd .. && mv big moved"
    argv = ["prlimit", "--nofile=200:200", world.ident.python, "-P", "-m", "sandhold", "-s", str(s)]
    r = world.ident.run([*argv, "--", "sh", "-c", script], cwd=world.work, env=world.env())
    assert r.returncode == 0, r.stderr
    assert len(list((world.work / "moved").iterdir())) == 400
    r = world.ident.run(
        [*argv, "--", "sh", "-c", "mkdir -p x/hooks && mv x .git"], cwd=world.work, env=world.env()
    )
    assert r.returncode != 0 and not (world.work / ".git").exists()  # still checked


def test_moving_a_directory_checks_what_it_carries(world: World) -> None:
    body = """
    os.makedirs('scratchdir/inner', exist_ok=True)
    tmp = os.environ['TMPDIR']
    r('env_in_scratch', lambda: makedirs_then(tmp + '/bag', lambda: create(tmp + '/bag/.env')))
    r('move_bag_in', lambda: os.rename(tmp + '/bag', 'bag'))
    os.makedirs(tmp + '/plain/x', exist_ok=True)
    create(tmp + '/plain/x/ok.txt')
    r('plain_dir_in', lambda: os.rename(tmp + '/plain', 'plain'))
    """
    results, _ = run_py(world, body)
    assert results == {"env_in_scratch": "ok", "move_bag_in": "EACCES", "plain_dir_in": "ok"}
    assert not os.path.lexists(world.work / "bag")
    assert (world.work / "plain/x/ok.txt").exists()


@pytest.mark.sandbox
def test_allowed_names_behave_as_without_the_supervisor(world: World) -> None:
    body = """
    os.umask(0o022)
    create('a.txt', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    r('excl_again', lambda: create('a.txt', os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    for word in (b'one', b'two'):
        fd = os.open('a.txt', os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.write(fd, word)
        os.close(fd)
    R['append'] = open('a.txt').read()
    fd = os.open('a.txt', os.O_RDWR | os.O_CREAT | os.O_TRUNC); os.write(fd, b'3'); os.close(fd)
    R['trunc'] = open('a.txt').read()
    R['mode_022'] = oct(os.stat('a.txt').st_mode & 0o7777)
    os.umask(0o077)
    create('b.txt', mode=0o666)
    R['mode_077'] = oct(os.stat('b.txt').st_mode & 0o7777)
    os.mkdir('d1', 0o777)
    R['dir_077'] = oct(os.stat('d1').st_mode & 0o7777)
    os.umask(0o002)
    create('c.txt', mode=0o666)
    R['mode_002'] = oct(os.stat('c.txt').st_mode & 0o7777)
    r('setuid_new', lambda: create('x.sh', mode=0o4755))
    create('y.sh', mode=0o755)
    r('setuid_existing', lambda: create('y.sh', mode=0o4755))  # makes nothing: mode unused
    def threaded():
        os.umask(0o027)
        create('t.txt', mode=0o666)
    t = threading.Thread(target=threaded); t.start(); t.join()
    R['thread_umask'] = oct(os.stat('t.txt').st_mode & 0o7777)
    create('u.txt', mode=0o666)
    R['after_thread'] = oct(os.stat('u.txt').st_mode & 0o7777)
    os.umask(0o022)
    r('creat_flag_dir', lambda: create('e', os.O_RDONLY | os.O_CREAT | os.O_DIRECTORY))
    r('trailing_slash', lambda: create('f/', os.O_WRONLY | os.O_CREAT))
    r('missing_parent', lambda: create('nope/f'))
    r('dir_is_dir', lambda: create('d1', os.O_WRONLY | os.O_CREAT))
    pr, pw = os.pipe()
    r('pipe_dirfd', lambda: os.open('x', os.O_WRONLY | os.O_CREAT, dir_fd=pr))
    r('pipe_dirfd_mkdir', lambda: os.mkdir('x', dir_fd=pr))
    r('dir_read_creat', lambda: create('d1', os.O_RDONLY | os.O_CREAT))  # any access
    os.symlink('d1', 'dlink')
    r('dir_via_link', lambda: create('dlink', os.O_RDONLY | os.O_CREAT))
    r('mkdir_exists', lambda: os.mkdir('d1'))
    r('dev_null', lambda: create('/dev/null'))
    os.symlink('target.txt', 'link.txt')
    create('link.txt')  # O_CREAT through a dangling symlink creates its (allowed) target
    R['through_link'] = str(os.path.isfile('target.txt') and os.path.islink('link.txt'))
    r('nofollow_link', lambda: create('link.txt', os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW))
    r('excl_on_link', lambda: create('link.txt', os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    os.makedirs('p/q/r')
    create('p/q/r/deep.txt')
    os.rename('p/q/r/deep.txt', 'p/moved.txt')
    os.link('p/moved.txt', 'p/hard.txt')
    R['nlink'] = str(os.stat('p/moved.txt').st_nlink)
    os.symlink('moved.txt', 'p/soft')
    R['soft'] = os.readlink('p/soft')
    r('rename_noreplace_exists', lambda: renameat2('p/hard.txt', 'p/moved.txt', 1))
    r('exchange', lambda: renameat2('a.txt', 'b.txt', 2))
    R['exchanged'] = open('b.txt').read()
    os.mkfifo('fifo')
    R['fifo'] = str(stat.S_ISFIFO(os.stat('fifo').st_mode))
    tmpfile_link('.', 'from_tmpfile', True)
    tmpfile_link('.', 'from_tmpfile2', False)
    R['tmpfile'] = open('from_tmpfile').read() + open('from_tmpfile2').read()
    fd = openat2('o2.txt', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    os.close(fd)
    R['openat2_mode'] = oct(os.stat('o2.txt').st_mode & 0o7777)
    BENEATH = 0x08
    r('openat2_beneath_escape', lambda: openat2('../x', os.O_WRONLY | os.O_CREAT, 0o600, BENEATH))
    r('openat2_bad_mode', lambda: openat2('o3.txt', os.O_WRONLY, 0o600))
    # O_PATH: an fd NOTIF_ADDFD cannot pass; open/openat run as they are (no name made)
    r('opath_creat', lambda: os.close(os.open('a.txt', os.O_PATH | os.O_CREAT)))
    r('opath_missing', lambda: os.open('.env', os.O_PATH | os.O_CREAT))
    r('openat2_opath', lambda: openat2('a.txt', os.O_PATH))
    r('openat2_cached_creat', lambda: openat2('o5.txt', os.O_WRONLY | os.O_CREAT, 0o600, 0x20))
    fd = openat2('o4.txt', os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    R['openat2_cloexec'] = str(os.get_inheritable(fd)); os.close(fd)
    fd = libc.open(b'plain.txt', os.O_WRONLY | os.O_CREAT, 0o600)  # os.open adds O_CLOEXEC
    R['inheritable'] = str(os.get_inheritable(fd)); os.close(fd)
    fd = os.open('plain2.txt', os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    R['cloexec'] = str(os.get_inheritable(fd)); os.close(fd)
    unix_bind('sock')
    R['sock'] = str(stat.S_ISSOCK(os.stat('sock').st_mode)) + oct(os.stat('sock').st_mode & 0o777)
    s = socket.socket(socket.AF_UNIX)
    s.bind(b'\\0sandhold-abstract-' + str(os.getpid()).encode())
    s.close()
    s = socket.socket(socket.AF_INET)
    s.bind(('127.0.0.1', 0))
    R['inet_port'] = str(s.getsockname()[1] > 0)
    s.close()
    """
    results, violations = run_py(world, body)
    assert violations == []
    assert results == {
        "excl_again": "EEXIST",
        "append": "onetwo",
        "trunc": "3",
        "mode_022": "0o644",
        "mode_077": "0o600",
        "dir_077": "0o700",
        "mode_002": "0o664",
        "setuid_new": "EPERM",  # no set-id file is made (see docs/supervisor.md)
        "setuid_existing": "ok",
        "thread_umask": "0o640",
        "after_thread": "0o640",
        "creat_flag_dir": "EINVAL",
        "trailing_slash": "EISDIR",
        "missing_parent": "ENOENT",
        "dir_is_dir": "EISDIR",
        "pipe_dirfd": "ENOTDIR",
        "pipe_dirfd_mkdir": "ENOTDIR",
        "dir_read_creat": "EISDIR",
        "dir_via_link": "EISDIR",
        "mkdir_exists": "EEXIST",
        "dev_null": "ok",
        "through_link": "True",
        "nofollow_link": "ELOOP",
        "excl_on_link": "EEXIST",
        "nlink": "2",
        "soft": "moved.txt",
        "rename_noreplace_exists": "EEXIST",
        "exchange": "ok",
        "exchanged": "3",
        "fifo": "True",
        "tmpfile": "tmptmp",
        "openat2_mode": "0o640",
        "openat2_beneath_escape": "EXDEV",
        "openat2_bad_mode": "EINVAL",
        "opath_creat": "ok",
        "opath_missing": "ENOENT",  # O_PATH drops O_CREAT: nothing is made
        "openat2_opath": "ENOSYS",  # callers fall back to openat(O_PATH)
        "openat2_cached_creat": "EAGAIN",
        "openat2_cloexec": "False",
        "inheritable": "True",
        "cloexec": "False",
        "sock": "True0o755",
        "inet_port": "True",
    }
    assert os.stat(world.work / "a.txt").st_uid == world.ident.uid


@pytest.mark.sandbox
def test_proc_paths_mean_the_target(world: World) -> None:
    """/proc/self, /dev/stdout and /dev/fd resolve to the target, never the supervisor."""
    body = """
    fd = openat2('/proc/self/status', os.O_RDONLY)
    status = os.read(fd, 4096).decode(); os.close(fd)
    R['status_pid'] = str(pid_in(status) == str(os.getpid()))
    fd = openat2('/proc/thread-self/comm', os.O_RDONLY)
    R['thread_self'] = str(os.read(fd, 100).strip() != b''); os.close(fd)
    # re-opening a pipe through /proc needs permission on the pipe: make our own
    rd, wr = os.pipe()
    os.dup2(wr, 1); os.dup2(wr, 2); os.close(wr)
    fd = os.open('/dev/stdout', os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(fd, b'via-dev-stdout'); os.close(fd)
    R['dev_stdout'] = os.read(rd, 100).decode()
    r('dev_fd_2', lambda: create('/dev/fd/2', os.O_WRONLY | os.O_CREAT))
    r('proc_self_fd', lambda: create('/proc/self/fd/1', os.O_WRONLY | os.O_CREAT))
    os.dup2(os.open('/dev/null', os.O_WRONLY), 2)
    sys.stdout = open(os.environ['OUT'], 'w')
    fd = openat2('/proc/self/cwd', os.O_RDONLY | os.O_DIRECTORY)
    R['cwd_via_proc'] = str(os.path.samestat(os.fstat(fd), os.stat('.'))); os.close(fd)
    r('proc_other_pid', lambda: os.close(openat2('/proc/1/status', os.O_RDONLY)))
    # the supervisor's own entries (our parent here) are never handed out: we get our own
    fd = openat2('/proc/%d/status' % os.getppid(), os.O_RDONLY)
    status = os.read(fd, 4096).decode(); os.close(fd)
    R['supervisor_pid_is_own'] = str(pid_in(status) == str(os.getpid()))
    r('create_in_proc', lambda: create('/proc/self/new'))
    here = os.open('.', os.O_RDONLY | os.O_DIRECTORY)
    r('proc_fd_dir', lambda: create('/proc/self/fd/%d' % here, os.O_RDONLY | os.O_CREAT))
    r('proc_fd_excl', lambda: create('/proc/self/fd/%d' % here, os.O_WRONLY | os.O_CREAT
                                     | os.O_EXCL))
    # not trapped (no O_CREAT): the kernel decides; the supervisor is not dumpable
    r('supervisor_mem', lambda: os.close(os.open('/proc/%d/mem' % os.getppid(), os.O_RDONLY)))
    """
    out = world.root / "out.json"
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(R))\n"
    result, _ = supervised(world, [world.ident.python, "-c", code], env=world.env(OUT=str(out)))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == {
        "status_pid": "True",
        "thread_self": "True",
        "dev_stdout": "via-dev-stdout",
        "dev_fd_2": "ok",
        "proc_self_fd": "ok",
        "cwd_via_proc": "True",
        "proc_other_pid": "EACCES",
        "supervisor_pid_is_own": "True",
        "create_in_proc": "ENOENT",
        "proc_fd_dir": "EISDIR",  # O_CREAT on a directory, as in the kernel
        "proc_fd_excl": "EEXIST",  # the magic link is a name that exists
        # root keeps CAP_SYS_PTRACE outside bubblewrap, but not past the Landlock domain
        # that keeps the command from signalling the supervisor; the user gets nothing
        "supervisor_mem": "ok" if world.ident.is_root and landlock_abi() < 6 else "EACCES",
    }


@pytest.mark.sandbox
def test_shell_redirections_and_exit_status(world: World) -> None:
    script = (
        "echo one > out.txt; echo two >> out.txt; echo three > /dev/stdout; "
        "echo err >&2; echo x > /dev/null; cat out.txt; "
        "echo secret > .env || echo refused"
    )
    # piped through cat: re-opening /dev/stdout needs a pipe the acting user may open
    result, violations = supervised(world, ["sh", "-c", f"({script}) | cat; exit 7"])
    assert result.returncode == 7
    assert result.stdout.splitlines() == ["three", "one", "two", "refused"]
    assert "err" in result.stderr
    assert [v["target"] for v in violations] == [str(world.work / ".env")]
    assert not os.path.lexists(world.work / ".env")


@pytest.mark.sandbox
def test_a_child_that_cannot_be_confined_never_runs(world: World) -> None:
    """A filter that cannot be loaded stops the command instead of running it bare."""
    result, _ = supervised(world, ["/nonexistent/program"])
    assert result.returncode == 126
    policy = _policy(world)
    policy["writable_roots"] = [str(world.work)]
    result, violations = supervised(world, ["sh", "-c", "mkdir -p a/.claude"], policy=policy)
    assert result.returncode != 0 and not (world.work / "a/.claude").exists()
    assert violations and violations[0]["rule"].startswith("mandatory: .claude")


def test_file_modes_of_created_files_match_an_unsupervised_run(world: World) -> None:
    """The same program, with and without the supervisor, leaves the same modes."""
    body = """
    for mask in (0o000, 0o022, 0o027, 0o077):
        os.umask(mask)
        for mode in (0o600, 0o644, 0o666, 0o777, 0o1777):
            p = 'm-%o-%o' % (mask, mode)
            create(p, mode=mode)
            R[p] = oct(stat.S_IMODE(os.stat(p).st_mode))
            os.mkdir(p + '.d', mode)
            R[p + '.d'] = oct(stat.S_IMODE(os.stat(p + '.d').st_mode))
    """
    with_sup, _ = run_py(world, body)
    assert with_sup == run_py_bare(world, body)


def test_violation_records_are_well_formed(world: World) -> None:
    _results, violations = run_py(world, "r('x', lambda: create('.env'))\n")
    assert len(violations) == 1 and isinstance(violations[0].pop("time"), float)
    assert violations == [  # refusals.line: the one shape of a refusal record
        {
            "action": "file-write-create",
            "target": str(world.work / ".env"),
            "allowed": False,
            "rule": (
                'credential: .env (to allow it: "filesystem": '
                f'{{"allowCredentialWrite": ["{world.work}/.env"]}})'
            ),
            "kind": "credential",
            "syscall": "openat",
        }
    ]


def test_created_files_belong_to_the_caller(world: World) -> None:
    run_py(world, "create('owned.txt'); os.mkdir('owned.d')\n")
    for name in ("owned.txt", "owned.d"):
        st = os.stat(world.work / name)
        assert (st.st_uid, st.st_gid) == (world.ident.uid, world.ident.gid)
        assert stat.S_ISDIR(st.st_mode) == name.endswith(".d")


@pytest.mark.sandbox
def test_an_open_waiting_at_a_fifo_is_answered_off_the_serving_thread(world: World) -> None:
    """The threaded supervisor (SandboxPort's): the FIFO's writer waits in a thread of
    its own, so the reader's shell can still make 'out' before opening the read end."""
    script = "mkfifo p && echo hello > p & sleep 0.3; wc -c > out < p; wait; cat out"
    result, violations = supervised(world, ["sh", "-c", script], timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["6"] and violations == []


ODD_ARGUMENTS = """
def bind_raw(fd, addr, length):
    check(libc.bind(fd, addr, length))
open("src", "w").close()
for flags in (8, 3, 6, 1 << 31):  # unknown; NOREPLACE|EXCHANGE; EXCHANGE|WHITEOUT
    r(f"renameat2_{flags}", lambda: renameat2("src", ".env", flags))
r("openat2_scoped", lambda: os.close(openat2(".env", os.O_WRONLY | os.O_CREAT, 0o644, 0x18)))
r("openat2_path_creat", lambda: os.close(openat2(".env", os.O_PATH | os.O_CREAT)))
unix_env = struct.pack("<H", 1) + b".env\\0"
f = os.open("src", os.O_RDONLY)
r("bind_not_a_socket", lambda: bind_raw(f, unix_env, len(unix_env)))
inet = socket.socket(socket.AF_INET)
r("bind_inet_socket", lambda: bind_raw(inet.fileno(), unix_env, len(unix_env)))
u = socket.socket(socket.AF_UNIX)
r("bind_111", lambda: bind_raw(u.fileno(), struct.pack("<H", 1) + b"s" * 109, 111))
r("bind_bad_fd", lambda: bind_raw(1000, struct.pack("<H", 1) + b"s" * 198, 200))
r("bind_108_no_nul", lambda: bind_raw(u.fileno(), struct.pack("<H", 1) + b"n" * 108, 110))
r("symlink_empty", lambda: check(libc.symlink(b"", b".env")))
R["made"] = sorted(os.listdir("."))
"""


def test_odd_arguments_fail_as_in_the_kernel_and_are_no_violations(world: World) -> None:
    """Calls the kernel refuses for their arguments (unknown rename flags, scoped
    resolution both ways, a bind on something that is no unix socket) get the kernel's
    errno before any policy is looked at, and record no violation."""
    with_sup, violations = run_py(world, ODD_ARGUMENTS)
    assert with_sup == run_py_bare(world, ODD_ARGUMENTS)
    assert with_sup["renameat2_8"] == "EINVAL" and with_sup["bind_108_no_nul"] == "ok"
    assert violations == []
