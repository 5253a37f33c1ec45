"""The compiled supervisor's fast path (``_helper/fastpath.c``).

- Its rules (``creation.fastpath_rules``) never clear a name the Python supervisor
  (``creation.Decider``) would refuse: a table, and generated paths run through the
  compiled test itself (``sandhold-exec --check``).
- What it performs behaves as the kernel would (modes under the caller's umask,
  errors, dirfds, close-on-exec), and it starts no Python for ordinary calls.
- What it does not clear goes to the Python supervisor, once started, which refuses
  and reports; the fast path goes on with ordinary calls after that.
Root and an unprivileged user, through the real CLI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sandhold
from conftest import World
from sandhold.backends.linux.supervisor.landlock import landlock_abi
from sandhold.policy import mandatory
from sandhold.policy.creation import CreationPolicy, Decider, creation_policy, fastpath_rules

HELPER = Path(sandhold.__file__).parent / "_helper" / "sandhold-exec"


def _verdicts(policy: CreationPolicy, paths: list[str]) -> list[str]:
    """The compiled fast path's "allow"/"defer" for each path."""
    assert os.access(HELPER, os.X_OK), "scripts/setup builds it; the suite runs with it"
    r, w = os.pipe()
    os.write(w, fastpath_rules(policy))
    os.close(w)
    try:
        out = subprocess.run(
            [str(HELPER), "--check", str(r)],
            input="".join(f"{p}\n" for p in paths),
            pass_fds=(r,),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    finally:
        os.close(r)
    assert len(out) == len(paths)
    return out


def _run_writable(world: World, name: str, code: str, helper: str = "1") -> object:
    """``code`` as ``work/name`` through the CLI with ``.`` writable (``helper`` "0": the
    Python runner alone); its JSON output."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    script = world.mkfile(f"work/{name}", code)
    env = {**world.env(), "SANDHOLD_EXEC_HELPER": helper}
    r = world.sandhold("-s", str(s), "--", "python3", str(script), env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


DENY = ["secret", "/w/**/*.lock", "/w/gen/a?/x", "/w/odd/x?", "/w/deep/**/keys/**", "~/.cfg"]
POLICIES = {
    "plain": creation_policy(writable_roots=["/w"], cwd="/w", home="/h"),
    "everything": creation_policy(
        writable_roots=["/w", "/w/sub", "/h"],
        deny_write=DENY,
        scratch=["/tmp/s", "/w/tmp"],
        cwd="/w",
        home="/h",
        unix_sockets=["/w/run/app.sock"],
        credential_exempt=["./.venv", "**/node_modules"],
    ),
    "root": creation_policy(writable_roots=["/"], deny_write=["/etc/**"], cwd="/", home="/h"),
    # a spec's host bind below its private /tmp: the bind is the user's tree, not scratch
    "bind_in_tmp": creation_policy(writable_roots=["/tmp/s"], scratch=["/tmp"], cwd="/", home="/h"),
}


def test_rules_table() -> None:
    records = fastpath_rules(POLICIES["everything"]).split(b"\0")
    assert records[-1] == b""
    got = [r.decode() for r in records[:-1]]
    assert got[:2] == ["S/tmp/s", "S/w/tmp"]
    assert got[2:14] == [
        "D/w/secret",
        "D/w",
        "E*.lock",
        "D/w/gen",
        "Ex",
        "D/w/odd",  # a '?' in the last segment: everything below /w/odd
        "D/w/deep",
        "Ekeys",
        "D/h/.cfg",
        "D/w/run/app.sock",  # an allowed socket's name may not be made
        "R/h",
        "R/w",  # /w/sub lies inside /w: the outermost root decides
    ]
    assert "N.git" in got and "N.claude" in got and "F.bashrc" in got and "G*.pem" in got
    assert {"FHEAD", "Frefs", "Fconfig", "Fhooks", "Fcommondir", "Fconfig.worktree"} <= set(got)
    assert "Nhooks" not in got and "Nconfig" not in got
    # hg: its config names wherever they are, a new .hg itself; hg's store stays fast
    assert {"Nhgrc", "Nhgrc-not-shared", "Nsharedpath", "F.hg"} <= set(got)
    assert "N.hg" not in got
    # jj: the same, and a new .jj or .jj/repo (a workspace's pointer) goes to Python
    assert {f"N{n}" for n in mandatory.JJ_PROTECTED} | {"F.jj", "Frepo"} <= set(got)
    assert "N.jj" not in got and "Nrepo" not in got


# (policy, path, verdict): "allow" must also be the Python decision; "defer" rows show
# what the fast path leaves to Python (where it is stricter, by design)
TABLE = [
    ("plain", "/w/src/main.c", "allow"),
    ("plain", "/w", "allow"),  # the root itself is no name below it
    ("plain", "/elsewhere/x.pem", "allow"),  # outside the roots: the mounts answer
    ("plain", "/w/a/.env", "defer"),
    ("plain", "/w/a/.env.local", "defer"),
    ("plain", "/w/x.pem", "defer"),
    ("plain", "/w/id_ed25519", "defer"),
    ("plain", "/w/.bashrc", "defer"),
    ("plain", "/w/a/b/c/.mcp.json", "defer"),
    ("plain", "/w/.claude", "defer"),
    ("plain", "/w/x/.vscode/settings.json", "defer"),
    ("plain", "/w/.git", "defer"),
    ("plain", "/w/r/.git/hooks/pre-commit", "defer"),
    ("plain", "/w/r/.git/objects/ab/cdef", "defer"),  # git's own work: Python decides
    ("plain", "/w/hooks/pre-commit", "allow"),
    # names that may make a git directory: Python looks at their directory's other names
    ("plain", "/w/config", "defer"),
    ("plain", "/w/docs/HEAD", "defer"),
    ("plain", "/w/docs/refs", "defer"),
    ("plain", "/w/docs/commondir", "defer"),
    ("plain", "/w/docs/config.worktree", "defer"),
    ("plain", "/w/src/hooks", "defer"),
    ("plain", "/w/docs/objects", "allow"),  # git's test needs none
    ("plain", "/w/docs/refs/heads/main", "allow"),
    ("plain", "/w/docs/HEAD.lock", "allow"),
    ("plain", "/w/docs/configure", "allow"),
    ("plain", "/w/.gitignore", "allow"),
    ("plain", "/w/r/.hg", "defer"),  # a new repository: Python decides
    ("plain", "/w/r/.hg/hgrc", "defer"),
    ("plain", "/w/r/.hg/hgrc-not-shared", "defer"),
    ("plain", "/w/r/.hg/sharedpath", "defer"),
    ("plain", "/w/r/.hg/patches/.hg/hgrc", "defer"),
    ("plain", "/w/r/.hg/hgrc/x", "defer"),
    ("plain", "/w/hgrc", "defer"),  # stricter than Python (only inside .hg there)
    ("plain", "/w/r/.hg/store/data/a.i", "allow"),  # hg's own writes stay fast
    ("plain", "/w/r/.hg/requires", "allow"),
    ("plain", "/w/r/.hg/dirstate", "allow"),
    ("plain", "/w/.hgignore", "allow"),
    ("plain", "/w/r/.jj", "defer"),  # a new jj repository: Python decides
    ("plain", "/w/r/.jj/repo", "defer"),  # a directory, or a workspace's pointer
    ("plain", "/w/r/.jj/repo/config.toml", "defer"),
    ("plain", "/w/r/.jj/repo/config-id", "defer"),
    ("plain", "/w/r/.jj/workspace-config.toml", "defer"),
    ("plain", "/w/r/.jj/workspace-config-id", "defer"),
    ("plain", "/w/pyproject/config.toml", "defer"),  # stricter than Python (only in .jj)
    ("plain", "/w/r/.jj/repo/store/extra/ab12", "allow"),  # jj's own writes stay fast
    ("plain", "/w/r/.jj/repo/op_store/operations/cd34", "allow"),
    ("plain", "/w/r/.jj/working_copy/tree_state", "allow"),
    ("plain", "/w/r/.jj/repo/store/git_target", "allow"),  # read-only where it exists
    ("plain", "/w/env", "allow"),
    ("everything", "/w/src/a.c", "allow"),
    ("everything", "/w/tmp/.env", "allow"),  # scratch: nothing refused there
    ("everything", "/tmp/s/id_rsa", "allow"),
    ("everything", "/w/secret", "defer"),
    ("everything", "/w/secret/inner", "defer"),
    ("everything", "/w/secretive", "allow"),
    ("everything", "/w/a/b/yarn.lock", "defer"),
    ("everything", "/w/a/b.lock/x", "defer"),  # below a match
    ("everything", "/w/gen/zz", "allow"),
    ("everything", "/w/gen/ab/x", "defer"),
    ("everything", "/w/gen/b/x/y", "defer"),
    ("everything", "/w/odd/anything", "defer"),
    ("everything", "/w/deep/a/keys", "defer"),
    ("everything", "/w/deep/a/key", "allow"),
    ("everything", "/w/.venv/lib/cacert.pem", "defer"),  # exempt: Python allows it
    ("everything", "/w/run/app.sock", "defer"),
    ("everything", "/w/sub/.env", "defer"),
    ("everything", "/h/.cfg", "defer"),
    ("everything", "/h/notes.txt", "allow"),
    ("root", "/srv/app/main.py", "allow"),
    ("root", "/etc/passwd", "defer"),
    ("root", "/srv/.git/config", "defer"),
]


@pytest.mark.parametrize(("policy", "path", "verdict"), TABLE)
def test_verdict_table(policy: str, path: str, verdict: str) -> None:
    assert _verdicts(POLICIES[policy], [path]) == [verdict]
    if verdict == "allow":
        decider = Decider(POLICIES[policy])
        assert decider.denied(path) is None and decider.denied(path, directory=True) is None


NAMES = [
    ".env", ".env.prod", "env", "x.pem", "pem", "a.key", "key", "id_rsa", "id", "ID_rsa",
    ".git", "git", ".gitx", "hooks", "config", "commondir", "pre-commit", "x.sample",
    "HEAD", "refs", "objects", "config.worktree",
    ".hg", "hg", ".hgx", "hgrc", "hgrc-not-shared", "sharedpath", "requires", "store",
    "patches", "data", "a.i", ".jj", "jj", "repo", "config.toml", "config-id",
    "workspace-config.toml", "workspace-config-id", "git_target", "op_store", "working_copy",
    ".claude", ".sandhold", ".vscode", ".idea", ".cursor", ".gemini", ".codex", ".kiro",
    ".cursorx", "cursor", ".bashrc", ".profile", ".mcp.json", ".opencode", "opencode.json",
    ".gitmodules", "secret", "keys", "a.lock", "lock", "app.sock", "run", "tmp", "sub",
    "deep", "gen", "odd", "x", "x1", "ab", ".venv", "node_modules", "src", "w", "h", "s",
    "etc", "*", "**", "a*b", "é", "with space", ".", "x" * 40,
]  # fmt: skip
_component = st.one_of(
    st.sampled_from(NAMES),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz.*-_?[]", min_size=1, max_size=12),
)
_path = st.builds(
    lambda top, rest: "/" + "/".join([*top, *rest]),
    st.sampled_from([[], ["w"], ["w", "sub"], ["w", "tmp"], ["tmp", "s"], ["h"], ["etc"]]),
    st.lists(_component.filter(lambda c: c not in (".",)), min_size=1, max_size=6),
)


def test_a_writable_root_below_scratch_keeps_its_rules() -> None:
    policy = POLICIES["bind_in_tmp"]
    names = ["/tmp/s/.env", "/tmp/s/a/.bashrc", "/tmp/s/k.pem", "/tmp/other/.env", "/tmp/s/ok"]
    assert [Decider(policy).denied(p) is not None for p in names] == [1, 1, 1, 0, 0]
    assert _verdicts(policy, names) == ["defer", "defer", "defer", "allow", "allow"]
    assert b"S/tmp\0" not in fastpath_rules(policy)


@settings(max_examples=60, deadline=None)
@given(batch=st.lists(_path, min_size=20, max_size=60), which=st.sampled_from(sorted(POLICIES)))
def test_fast_path_never_clears_what_python_refuses(batch: list[str], which: str) -> None:
    policy = POLICIES[which]
    decider = Decider(policy)
    for path, verdict in zip(batch, _verdicts(policy, batch), strict=True):
        if verdict == "allow":
            for directory in (False, True):
                assert decider.denied(path, directory=directory) is None, (path, directory)


def test_bad_rules_stop_the_front() -> None:
    for bad in (b"Xfoo\0", b"Drelative\0", b"Eglob\0", b"R/w", b"\0\0"):
        r, w = os.pipe()
        os.write(w, bad)
        os.close(w)
        proc = subprocess.run(
            [str(HELPER), "--check", str(r)],
            input=b"/w/x\n",
            pass_fds=(r,),
            capture_output=True,
            check=False,
        )
        os.close(r)
        assert proc.returncode == 126 and b"the fast path's rules" in proc.stderr, bad


# -- through the CLI ----------------------------------------------------------------

SUPERVISORS = (
    "import os\n"
    "def supervisors():\n"
    "    out = []\n"
    "    for p in os.listdir('/proc'):\n"
    "        try:\n"
    "            if p.isdigit() and open(f'/proc/{p}/comm').read().startswith('python3'):\n"
    "                if int(p) != os.getpid():\n"
    "                    out.append(p)\n"
    "        except OSError:\n"
    "            pass\n"
    "    return len(out)\n"
)

ORDINARY = SUPERVISORS + textwrap.dedent("""\
    import ctypes, errno, fcntl, json
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}

    def err(fn):
        try:
            fn()
        except OSError as e:
            return errno.errorcode[e.errno]
        return "ok"

    def close(fd):
        os.close(fd)

    os.umask(0o027)
    close(os.open("f", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    os.mkdir("d", 0o777)
    os.makedirs("p/q/r")
    os.mkdir("t/")
    out["excl"] = err(lambda: os.open("f", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    out["missing"] = err(lambda: os.open("nodir/x", os.O_WRONLY | os.O_CREAT))
    out["isdir"] = err(lambda: os.open("d", os.O_WRONLY | os.O_CREAT))
    out["isdir_read"] = err(lambda: os.open("d", os.O_RDONLY | os.O_CREAT))  # any access
    out["opath"] = err(lambda: close(os.open("d", os.O_PATH | os.O_CREAT)))  # runs as is
    out["opath_env"] = err(lambda: os.open(".env", os.O_PATH | os.O_CREAT))  # makes nothing
    out["trailing"] = err(lambda: os.open("newfile/", os.O_WRONLY | os.O_CREAT))
    out["creat_dir"] = err(lambda: os.open("cd", os.O_RDONLY | os.O_CREAT | os.O_DIRECTORY))
    out["mkdir_exists"] = err(lambda: os.mkdir("d"))
    out["badfd"] = err(lambda: os.open("k", os.O_WRONLY | os.O_CREAT, dir_fd=999))
    fd = os.open("f", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # exists: opened, truncated
    os.write(fd, b"second\\n")
    os.close(fd)
    d = os.open("d", os.O_RDONLY | os.O_DIRECTORY)
    a = os.open("a", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600, dir_fd=d)
    b = libc.openat(d, b"b", os.O_RDWR | os.O_CREAT, 0o644)  # os.open adds O_CLOEXEC
    out["cloexec"] = [bool(fcntl.fcntl(x, fcntl.F_GETFD) & fcntl.FD_CLOEXEC) for x in (a, b)]
    os.write(a, b"via the fd\\n")
    for x in (a, b, d):
        os.close(x)
    out["creat"] = libc.creat(b"c", 0o666) >= 0
    os.umask(0o002)  # noted by the supervisor: the next names get it
    close(os.open("u", os.O_WRONLY | os.O_CREAT, 0o666))
    os.rename("f", "d/moved")
    close(os.open("over", os.O_WRONLY | os.O_CREAT))
    os.rename("c", "over")
    close(os.open("keep", os.O_WRONLY | os.O_CREAT))
    at = -100
    out["noreplace"] = libc.renameat2(at, b"u", at, b"keep", 1) == -1 and ctypes.get_errno()
    out["supervisors"] = supervisors()
    # where a symlink points is the Python supervisor's to judge: from here it runs
    os.symlink("d/moved", "link")
    os.symlink("nowhere", "p/q/dangling")
    out["symlink_exists"] = err(lambda: os.symlink("x", "link"))
    out["after_symlinks"] = supervisors()
    print(json.dumps(out))
    """)


@pytest.mark.sandbox
def test_ordinary_calls_are_performed_like_the_kernel_without_python(world: World) -> None:
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    r = world.sandhold("-s", str(s), "--", world.ident.python, "-c", ORDINARY)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == {
        "excl": "EEXIST",
        "missing": "ENOENT",
        "isdir": "EISDIR",
        "isdir_read": "EISDIR",
        "opath": "ok",
        "opath_env": "ENOENT",
        "trailing": "EISDIR",
        "creat_dir": "EINVAL",
        "mkdir_exists": "EEXIST",
        "badfd": "EBADF",
        "cloexec": [True, False],
        "creat": True,
        "noreplace": 17,  # EEXIST
        "symlink_exists": "EEXIST",
        "supervisors": 0,  # the front did it all
        "after_symlinks": 1,
    }
    w = world.work

    def mode(p: Path) -> int:
        return p.lstat().st_mode & 0o7777

    assert mode(w / "d") == 0o750 and mode(w / "p" / "q" / "r") == 0o750 and (w / "t").is_dir()
    assert mode(w / "d" / "moved") == 0o640 and (w / "d" / "moved").read_text() == "second\n"
    assert mode(w / "d" / "a") == 0o600 and (w / "d" / "a").read_text() == "via the fd\n"
    assert mode(w / "over") == 0o640 and not (w / "c").exists()  # creat's file, moved over
    assert mode(w / "u") == 0o664 and (w / "keep").exists()
    assert os.readlink(w / "link") == "d/moved" and os.readlink(w / "p/q/dangling") == "nowhere"
    assert (w / "d" / "moved").stat().st_uid == world.ident.uid
    assert not (w / "newfile").exists() and not (w / "cd").exists() and not (w / "k").exists()


MIXED = SUPERVISORS + textwrap.dedent("""\
    import errno, json
    out = []

    def attempt(what, fn):
        try:
            fn()
            out.append([what, "ok", supervisors()])
        except OSError as e:
            out.append([what, errno.errorcode[e.errno], supervisors()])

    def create(name):
        return lambda: os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o644))

    attempt("first", create("first.txt"))
    attempt(".env", create("a/.env"))
    attempt("after", create("a/after.txt"))
    attempt("rename", lambda: os.rename("a/after.txt", "a/id_rsa"))
    attempt("mkdir", lambda: os.mkdir("a/b/.claude"))
    attempt("symlink", lambda: os.symlink("x", "a/.bashrc"))
    attempt("link", lambda: os.link("first.txt", "a/key.pem"))
    attempt("follow", create("a/to-env"))  # a symlink to .env, made on the host
    attempt("lock", create("a/b/yarn.lock"))
    attempt("git", lambda: os.mkdir("a/r/.git"))
    attempt("mkdir ok", lambda: os.makedirs("a/b/c/d"))
    attempt("last", create("a/b/c/d/last.txt"))
    print(json.dumps(out))
    """)


@pytest.mark.sandbox
def test_calls_the_fast_path_does_not_clear_go_to_one_python_supervisor(world: World) -> None:
    world.mkdir("work/a/b")
    world.mkdir("work/a/r")
    world.symlink("work/a/to-env", ".env")
    s = world.settings({"filesystem": {"allowWrite": ["."], "denyWrite": ["**/*.lock"]}})
    log = world.root / "refused.jsonl"
    r = world.sandhold(
        "-s", str(s), "--violations", str(log), "--", world.ident.python, "-c", MIXED
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows == [
        ["first", "ok", 0],  # the fast path: no Python
        [".env", "EACCES", 1],  # Python started for this one and refused it
        ["after", "ok", 1],  # Python is kept; ordinary calls are the fast path's again
        ["rename", "EACCES", 1],
        ["mkdir", "EACCES", 1],
        ["symlink", "EACCES", 1],
        ["link", "EACCES", 1],
        ["follow", "EACCES", 1],  # the fast path follows no symlink: Python does
        ["lock", "EACCES", 1],
        ["git", "ok", 1],  # a repository made during the run: Python decides, allows
        ["mkdir ok", "ok", 1],
        ["last", "ok", 1],
    ]
    targets = [json.loads(line)["target"] for line in log.read_text().splitlines()]
    w = str(world.work)
    assert targets == [
        f"{w}/a/.env",
        f"{w}/a/id_rsa",
        f"{w}/a/b/.claude",
        f"{w}/a/.bashrc",
        f"{w}/a/key.pem",
        f"{w}/a/.env",
        f"{w}/a/b/yarn.lock",
    ]
    for name in (".env", "id_rsa", "b/.claude", ".bashrc", "key.pem", "b/yarn.lock"):
        assert not os.path.lexists(world.work / "a" / name), name
    assert (world.work / "a" / "after.txt").exists() and (world.work / "a/b/c/d/last.txt").exists()
    assert (world.work / "a" / "r" / ".git").is_dir()


@pytest.mark.sandbox
def test_a_directory_move_is_checked_name_by_name(world: World) -> None:
    """The fast path moves no directory: the supervisor checks every name it holds."""
    world.mkfile("work/.venv/lib/cacert.pem", "CA\n")  # allowed there (allowCredentialWrite)
    s = world.settings({"filesystem": {"allowWrite": ["."], "allowCredentialWrite": ["./.venv"]}})
    script = "mv .venv/lib moved; echo mv=$?; mkdir x; mv x y; echo plain=$?"
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script)
    assert "mv=1" in r.stdout and "plain=0" in r.stdout, (r.stdout, r.stderr)
    assert (world.work / ".venv/lib/cacert.pem").exists() and not (world.work / "moved").exists()
    assert (world.work / "y").is_dir()


FIFO = (
    "mkdir -p {dir} && mkfifo {dir}/p && "
    "echo hello > {dir}/p & "  # its open waits for a reader, in the supervisor's place
    "sleep 0.3; wc -c > out < {dir}/p; wait; cat out"  # 'out' is made before the read end
)


@pytest.mark.sandbox
@pytest.mark.parametrize(
    ("helper", "where"),
    [("1", "."), ("1", "r/.git/x"), ("0", ".")],
    ids=["fast-path", "python-beside-it", "python-runner"],
)
def test_an_open_waiting_at_a_fifo_holds_up_nothing_else(
    world: World, helper: str, where: str
) -> None:
    """Both supervisors open a FIFO that must wait for its other end off their serving
    path; holding it up there would deadlock this shell idiom."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    env = {**world.env(), "SANDHOLD_EXEC_HELPER": helper}
    script = FIFO.format(dir=where)
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["6"], (r.stdout, r.stderr)


@pytest.mark.sandbox
def test_more_writers_waiting_at_a_fifo_than_front_workers(world: World) -> None:
    """Each open waiting at a FIFO holds a worker of the front; past them the Python
    supervisor takes the rest (threads): none fails where the kernel would wait."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    script = (
        "mkfifo p; for i in $(seq 80); do (echo $i > p || echo failed >&2) & done; "
        "sleep 1; timeout 10 cat p | wc -l; wait"
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["80"] and "failed" not in r.stderr, (r.stdout, r.stderr)


PROC_FIFO = textwrap.dedent("""\
    import json, os, subprocess, time
    os.mkfifo("p")
    pid = os.fork()
    if pid == 0:  # a writer that waits for its reader, through the fd's magic link
        fd = os.open("p", os.O_PATH)
        w = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CREAT)
        os.write(w, b"hello")
        os._exit(0)
    time.sleep(0.3)
    t = time.monotonic()
    others = [subprocess.run(["timeout", "5", "mkdir", "-p", "sub/.git"]).returncode,
              subprocess.run(["timeout", "5", "sh", "-c", "echo > plain.txt"]).returncode]
    waited = time.monotonic() - t
    with open("p", "rb") as r:
        got = r.read().decode()
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"others": others, "fast": waited < 3, "got": got, "status": status}))
    """)


@pytest.mark.sandbox
@pytest.mark.parametrize("helper", ["1", "0"], ids=["with-front", "python-runner"])
def test_an_open_through_proc_waiting_at_a_fifo_holds_up_nothing_else(
    world: World, helper: str
) -> None:
    """/proc/self/fd/N of an O_PATH FIFO fd waits like the FIFO: off the serving path too."""
    assert _run_writable(world, "procfifo.py", PROC_FIFO, helper) == {
        "others": [0, 0],
        "fast": True,
        "got": "hello",
        "status": 0,
    }


KILL = SUPERVISORS + textwrap.dedent("""\
    import errno, json, signal, time
    out = []

    def attempt(name):
        try:
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o644))
            out.append([name, "ok"])
        except OSError as e:
            out.append([name, errno.errorcode[e.errno]])

    attempt(".env")  # starts the Python supervisor, which refuses it
    own = []  # the command may not kill it itself (Landlock scope, test_supervisor_takeover)
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and open(f"/proc/{p}/comm").read().startswith("python3"):
                if int(p) != os.getpid():
                    os.kill(int(p), signal.SIGKILL)
                    own.append("ok")
        except OSError as e:
            own.append(errno.errorcode[e.errno])
    open("ready", "w").close()
    def running():  # a killed supervisor stays a zombie until the front reaps it
        for p in os.listdir("/proc"):
            try:
                if p.isdigit() and int(p) != os.getpid():
                    if open(f"/proc/{p}/comm").read().startswith("python3"):
                        if open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                            return True
            except OSError:
                pass
        return False

    for _ in range(200):  # the host kills it
        if not running():
            break
        time.sleep(0.05)
    attempt(".env.local")  # would be Python's: fails closed
    attempt("a.pem")
    attempt("fine.txt")  # the front's own: still works
    print(json.dumps([out, supervisors(), own]))
    """)


def _kill_python_supervisor(world: World) -> None:
    """From the host: the child of this sandbox's front (whose command line names the
    work directory) that runs the supervisor's interpreter."""
    _, python = _front_and_supervisor(world)
    os.kill(int(python), signal.SIGKILL)


def _front_and_supervisor(world: World) -> tuple[str, str]:
    """The pids of this sandbox's front (whose command line names the work directory)
    and of its child that runs the supervisor's interpreter."""
    procs = {}
    for pid in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        ppid = next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:"))
        procs[pid] = (cmd, ppid)
    fronts = {
        pid
        for pid, (cmd, _) in procs.items()
        if cmd[0].endswith(b"sandhold-exec") and str(world.work).encode() in cmd
    }
    victims = [
        pid
        for pid, (cmd, ppid) in procs.items()
        if ppid in fronts
        and os.path.basename(cmd[0]).startswith(b"python3")
        and any(b"sandhold.backends.linux.supervisor.runner" in arg for arg in cmd)
    ]
    assert len(fronts) == 1 and len(victims) == 1, (fronts, victims)
    return next(iter(fronts)), victims[0]


@pytest.mark.sandbox
def test_killing_the_python_supervisor_fails_its_calls_closed(world: World) -> None:
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    log = world.root / "refused.jsonl"
    proc = world.popen(
        "-s", str(s), "--violations", str(log), "--", world.ident.python, "-c", KILL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (world.work / "ready").exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        _kill_python_supervisor(world)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert stdout, stderr.decode()
    out, alive, own = json.loads(stdout)
    assert out == [
        [".env", "EACCES"],
        [".env.local", "EPERM"],
        ["a.pem", "EPERM"],
        ["fine.txt", "ok"],
    ]
    assert alive == 0 and "the creation-time supervisor stopped" in stderr.decode()
    assert own == (["EPERM"] if landlock_abi() >= 6 else ["ok"])
    # what it refused before it died is reported all the same
    assert [json.loads(line)["target"] for line in log.read_text().splitlines()] == [
        f"{world.work}/.env"
    ]
    for name in (".env", ".env.local", "a.pem"):
        assert not (world.work / name).exists()
    assert (world.work / "fine.txt").exists()


THROUGH_PROC = textwrap.dedent("""\
    import errno, json, os, sys
    w = sys.argv[1]
    d = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    via = [f"/proc/self/root{w}", "/proc/self/cwd", "/proc/thread-self/cwd", f"/dev/fd/{d}",
           f"/proc/{os.getpid()}/cwd", f"/proc/{os.getppid()}/cwd", w + "/sub/../."]
    open(w + "/payload", "w").close()
    out = {}

    def attempt(key, fn):
        try:
            fn()
            out[key] = "ok"
        except OSError as e:
            out[key] = errno.errorcode[e.errno]

    for i, base in enumerate(via):
        attempt(f"open{i}", lambda: os.close(os.open(base + "/.env", os.O_WRONLY | os.O_CREAT)))
        attempt(f"mkdir{i}", lambda: os.mkdir(base + "/.claude"))
        attempt(f"rename{i}", lambda: os.rename(w + "/payload", base + "/id_rsa"))
        attempt(f"symlink{i}", lambda: os.symlink("x", base + "/.bashrc"))
    print(json.dumps(out))
    """)


@pytest.mark.sandbox
def test_denied_names_are_not_made_through_proc_or_fd_paths(world: World) -> None:
    """The fast path leaves every /proc parent to the Python supervisor and decides by the
    parent's real path, so /proc/self/root, the cwd's magic links, /dev/fd and '..'
    lead to no denied name."""
    world.mkdir("work/sub")
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    w = str(world.work)
    r = world.sandhold("-s", str(s), "--", world.ident.python, "-c", THROUGH_PROC, w)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out) == 28 and "ok" not in out.values(), out
    for name in (".env", ".claude", "id_rsa", ".bashrc"):
        assert not os.path.lexists(world.work / name), name
    assert (world.work / "payload").exists()


FIFO_FLAGS = textwrap.dedent("""\
    import errno, json, os, threading
    os.mkfifo("p")
    os.symlink("p", "link")
    out = {}

    def reader(key):
        with open("p", "rb") as r:
            out[key] = r.read().decode()

    for key, name, flags in (
        ("nofollow", "p", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW),
        ("plain", "p", os.O_WRONLY | os.O_CREAT),
    ):
        t = threading.Thread(target=reader, args=(key,), daemon=True)
        t.start()
        try:
            fd = os.open(name, flags)
        except OSError as e:  # the reader waits on: a daemon thread
            out[key] = errno.errorcode[e.errno]
            continue
        os.write(fd, key.encode())
        os.close(fd)
        t.join()
    try:  # the kernel refuses a symlink as the last name with O_NOFOLLOW, before waiting
        os.open("link", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW)
    except OSError as e:
        out["link"] = errno.errorcode[e.errno]
    pin = os.open("p", os.O_PATH)
    try:  # a magic link is a symlink too
        os.open(f"/proc/self/fd/{pin}", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW)
    except OSError as e:
        out["magic"] = errno.errorcode[e.errno]
    print(json.dumps(out))
    """)


@pytest.mark.sandbox
@pytest.mark.parametrize("helper", ["1", "0"], ids=["with-front", "python-runner"])
def test_an_existing_fifo_opens_with_o_nofollow_as_in_the_kernel(world: World, helper: str) -> None:
    assert _run_writable(world, "fifoflags.py", FIFO_FLAGS, helper) == {
        "nofollow": "nofollow",
        "plain": "plain",
        "link": "ELOOP",
        "magic": "ELOOP",
    }


@pytest.mark.sandbox
def test_the_front_and_the_supervisor_ignore_the_terminals_stops(world: World) -> None:
    """A command that takes the terminal's foreground (and sets TOSTOP) must not stop
    the processes that answer its calls, with the user's creation lock held: SIGTSTP,
    SIGTTIN and SIGTTOU are ignored there (and default for the command)."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    code = (
        "import os, time\n"
        "try:\n    os.close(os.open('.env', os.O_WRONLY | os.O_CREAT))\nexcept OSError: pass\n"
        "open('ready', 'w').close()\n"
        "print(open('/proc/self/status').read().split('SigIgn:')[1].split()[0], flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = world.popen("-s", str(s), "--", "python3", "-c", code, stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (world.work / "ready").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        stops = (1 << 19) | (1 << 20) | (1 << 21)  # SIGTSTP, SIGTTIN, SIGTTOU (bit n-1)
        for pid in _front_and_supervisor(world):
            status = Path(f"/proc/{pid}/status").read_text()
            ignored = int(status.split("SigIgn:")[1].split()[0], 16)
            assert ignored & stops == stops, (pid, hex(ignored))
        assert proc.stdout is not None
        command_ignores = int(proc.stdout.readline(), 16)
        assert command_ignores & stops == 0, hex(command_ignores)
    finally:
        proc.kill()
        proc.wait()


TMPFILE_VIA_PROC = textwrap.dedent("""\
    import ctypes, errno, json, os, struct
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    os.umask(0o077)
    d = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    modes = {}
    for name, via in (("direct.txt", "."), ("proc.txt", f"/proc/self/fd/{d}")):
        for excl in (0, os.O_EXCL):  # O_EXCL with O_TMPFILE: never to be linked
            how = struct.pack("<QQQ", os.O_TMPFILE | os.O_WRONLY | excl, 0o640, 0)
            fd = libc.syscall(437, -100, via.encode(), how, len(how))  # openat2: trapped
            assert fd >= 0, ctypes.get_errno()
            AT_SYMLINK_FOLLOW = 0x400
            key = name + (" excl" if excl else "")
            rc = libc.linkat(-100, f"/proc/self/fd/{fd}".encode(), -100, key.encode(),
                             AT_SYMLINK_FOLLOW)
            if rc != 0:
                modes[key] = errno.errorcode[ctypes.get_errno()]
            else:
                modes[key] = oct(os.stat(key).st_mode & 0o777)
    for name, via in (("direct", "."), ("proc", f"/proc/self/fd/{d}")):  # no such mode
        how = struct.pack("<QQQ", os.O_TMPFILE | os.O_WRONLY, 0o17777, 0)
        fd = libc.syscall(437, -100, via.encode(), how, len(how))
        modes[name + " 0o17777"] = "ok" if fd >= 0 else errno.errorcode[ctypes.get_errno()]
    print(json.dumps(modes))
    """)


@pytest.mark.sandbox
def test_o_tmpfile_through_a_proc_magic_link_keeps_the_callers_mode(world: World) -> None:
    """The mode and umask of an O_TMPFILE open are the caller's, whichever way the
    directory is named (as in the kernel: 0640 & ~077)."""
    assert _run_writable(world, "tmpfile.py", TMPFILE_VIA_PROC) == {
        "direct.txt": "0o600",
        "direct.txt excl": "ENOENT",
        "proc.txt": "0o600",
        "proc.txt excl": "ENOENT",
        "direct 0o17777": "EINVAL",
        "proc 0o17777": "EINVAL",
    }
