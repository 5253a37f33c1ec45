"""No git directory is made inside the work tree of a repository that existed before
the run: not a ``.git`` (test_supervisor_emulation.py), and not a plain directory that
git takes for a repository of its own (a bare one: ``HEAD`` with ``refs`` or
``commondir``), which a shell prompt's ``git status`` there would use and run the
config of (creation rule 3, docs/supervisor.md).

Through the real CLI (bubblewrap, the compiled front, the Python supervisor), as root
and as an unprivileged user: every order and every way of making the names, moves of
prepared directories into the work tree, and real git on the host afterwards. Bare
repositories elsewhere, and git's own work in the existing repository, still work.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from conftest import World
from sandhold.policy.git import git_directory
from test_supervisor_emulation import PRELUDE

pytestmark = pytest.mark.sandbox

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def _project(world: World, where: str = "work", tool: str = "git") -> Path:
    """``where``: an existing repository (git: with one commit; hg: with no ``hgrc``,
    so its work tree is no mount of its own in the sandbox), owned by the identity."""
    w = world.mkdir(where)
    world.mkfile(f"{where}/README", "hello\n")
    env = {**world.env(), **GIT_ENV, "HGRCPATH": "", "HGUSER": "t"}
    steps = [["hg", "init"]]
    if tool == "git":
        steps = [["git", *a] for a in (["init", "-q", "-b", "main"], ["add", "README"])]
        steps.append(["git", "commit", "-qm", "one"])
    for argv in steps:
        world.ident.run(argv, cwd=w, env=env, check=True)
    return w


def _host_git(world: World, where: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """git run on the host by the identity, as a shell prompt in ``where`` would."""
    env = {**world.env(), **GIT_ENV}
    return world.ident.run(["git", *argv], cwd=where, env=env, timeout=20)


def _run(world: World, body: str, cwd: Path) -> tuple[dict[str, str], list[dict[str, str]]]:
    """PRELUDE + ``body`` as a sandboxed program in ``cwd``, with work/ writable."""
    s = world.settings(
        {
            "filesystem": {"allowWrite": [str(world.work)]},
            # so that AF_UNIX sockets may be made, and their binds are trapped
            "network": {"allowUnixSockets": [str(world.root / "none.sock")]},
        }
    )
    log = world.root / "violations.jsonl"
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(R))\n"
    r = world.sandhold(
        "-s", str(s), "--violations", str(log), "--", world.ident.python, "-c", code, cwd=cwd
    )
    assert r.returncode == 0, r.stderr
    assert "internal errors" not in r.stderr, r.stderr
    found = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return json.loads(r.stdout.strip().splitlines()[-1]), found


MAKE = """
import subprocess
T = os.environ['TMPDIR']
S = '../staging'  # in the writable root, outside the work tree: nothing stops it there
os.mkdir(S)
HEAD = 'ref: refs/heads/main\\n'
def put(p, text=''):
    with open(p, 'w') as f:
        f.write(text)
def made(d, *names):
    os.makedirs(d, exist_ok=True)
    for n in names:
        if n in ('refs', 'objects', 'hooks'):
            os.mkdir(f'{d}/{n}')
        else:
            put(f'{d}/{n}', HEAD if n == 'HEAD' else '[core]\\n')
def order(d, *names):
    os.mkdir(d)
    for n in names:
        r(f'{d} {n}', lambda: made(d, n))
"""

# each directory's names in the order they are made; the last one of HEAD and refs (or
# commondir) is refused, and a config into a git directory
ORDERS = {
    "o1": ("config", "HEAD", "refs", "objects"),
    "o2": ("HEAD", "config", "objects", "refs"),
    "o3": ("refs", "objects", "config", "HEAD"),
    "o4": ("objects", "refs", "HEAD", "config"),  # no config yet: HEAD is refused all the same
    "o5": ("HEAD", "commondir"),
    "o6": ("commondir", "HEAD"),
    "o7": ("hooks", "config.worktree", "refs", "HEAD"),
}
ORDER_REFUSED = {"o1 refs", "o2 refs", "o3 HEAD", "o4 HEAD", "o5 commondir", "o6 HEAD", "o7 HEAD"}

# every way of making HEAD in a directory that holds refs and a config ({d}: it)
WAYS = {
    "open": "create('{d}/HEAD')",
    "open_excl": "create('{d}/HEAD', os.O_WRONLY | os.O_CREAT | os.O_EXCL)",
    "open_trunc": "create('{d}/HEAD', os.O_RDWR | os.O_CREAT | os.O_TRUNC)",
    "openat2": "os.close(openat2('{d}/HEAD', os.O_WRONLY | os.O_CREAT, 0o600))",
    "mkfifo": "os.mkfifo('{d}/HEAD')",
    "mknod": "os.mknod('{d}/HEAD', stat.S_IFREG | 0o600)",
    "mkdir": "os.mkdir('{d}/HEAD')",
    "symlink": "os.symlink('refs/heads/main', '{d}/HEAD')",
    "link": "os.link('plain.txt', '{d}/HEAD')",
    "rename": "put('{d}.tmp', HEAD) or os.rename('{d}.tmp', '{d}/HEAD')",
    "renameat2_noreplace": "put('{d}.tmp', HEAD) or renameat2('{d}.tmp', '{d}/HEAD', 1)",
    "rename_from_staging": "put(S + '/{d}', HEAD) or os.rename(S + '/{d}', '{d}/HEAD')",
    "tmpfile_linkat_proc": "tmpfile_link('{d}', '{d}/HEAD', True)",
    "tmpfile_linkat_empty": "tmpfile_link('{d}', '{d}/HEAD', False)",
    "bind": "unix_bind('{d}/HEAD')",
    "refs_symlink": "os.symlink('objects', '{d}/refs')",  # here HEAD is there, refs is made
    "refs_rename": "os.mkdir('{d}.r') or os.rename('{d}.r', '{d}/refs')",
}

# a directory prepared outside the work tree (in the writable root around it, where it
# may be made) and moved in, or exchanged with one there in either order (into a git
# work tree, a mount of its own in the sandbox, the kernel would say EXDEV: the check
# comes first); and one from $TMPDIR, another mount, copied name by name
MOVES = """
made(S + '/p1', 'HEAD', 'refs', 'objects', 'config')
r('move', lambda: os.rename(S + '/p1', 'moved'))
made(S + '/p2', 'HEAD', 'refs', 'objects')  # no config: still a repository git would use
r('move_no_config', lambda: os.rename(S + '/p2', 'moved_no_config'))
made(S + '/p3', 'HEAD', 'refs', 'config')
r('move_noreplace', lambda: renameat2(S + '/p3', 'moved_noreplace', 1))
made(S + '/outer/a/b', 'HEAD', 'refs', 'config')
r('move_deep', lambda: os.rename(S + '/outer', 'outer'))
made(S + '/p4', 'HEAD', 'commondir')
r('move_commondir', lambda: os.rename(S + '/p4', 'moved_commondir'))
made(S + '/p5', 'HEAD', 'refs', 'config')
os.mkdir('plain_a')
r('exchange_in', lambda: renameat2(S + '/p5', 'plain_a', 2))
made(S + '/p6', 'HEAD', 'refs', 'config')
os.mkdir('plain_b')
r('exchange_out', lambda: renameat2('plain_b', S + '/p6', 2))
made(T + '/p7', 'HEAD', 'refs', 'objects', 'config')
r('rename_from_tmp', lambda: os.rename(T + '/p7', 'moved_tmp'))
cp = subprocess.run(['cp', '-r', T + '/p7', 'copied'], capture_output=True)
R['cp_from_tmp'] = str(cp.returncode)
"""
MOVED = ("moved", "moved_no_config", "moved_noreplace", "outer/a/b", "moved_commondir")


def _every_attempt() -> str:
    lines = [MAKE, "put('plain.txt', HEAD)"]
    lines += [f"order({d!r}, *{names!r})" for d, names in ORDERS.items()]
    for way, code in WAYS.items():
        d = f"w_{way}"
        first = "'HEAD', 'config'" if way.startswith("refs_") else "'refs', 'config'"
        lines.append(f"made({d!r}, {first})")
        lines.append(f"r({way!r}, lambda: {code.format(d=d)})")
    lines.append(MOVES)
    return "\n".join(lines)


@pytest.mark.parametrize("tool", ["git", "hg"])
def test_no_git_directory_is_made_in_an_existing_work_tree(world: World, tool: str) -> None:
    w = _project(world, "work/proj", tool)
    results, violations = _run(world, _every_attempt(), cwd=w)
    want = {f"{d} {n}": "ok" for d, names in ORDERS.items() for n in names}
    want.update(dict.fromkeys(ORDER_REFUSED, "EACCES"))
    want.update(dict.fromkeys(WAYS, "EACCES"))
    moves = ("move", "move_no_config", "move_noreplace", "move_deep", "move_commondir")
    want.update(dict.fromkeys(moves, "EACCES"))
    want.update(exchange_in="EACCES", exchange_out="EACCES", rename_from_tmp="EACCES")
    want.update(cp_from_tmp="1")
    assert results == want
    dirs = [*ORDERS, *(f"w_{way}" for way in WAYS), "plain_a", "plain_b", "copied"]
    for d in dirs:
        assert not git_directory(os.listdir(w / d)), (d, os.listdir(w / d))
    for d in MOVED:
        assert not os.path.lexists(w / d), d
    # git on the host finds the user's repository in each of them, and nothing else
    for d in dirs:
        r = _host_git(world, w / d, "rev-parse", "--absolute-git-dir")
        found = r.stdout.strip() if r.returncode == 0 else None
        assert found == (str(w / ".git") if tool == "git" else None), (d, r.stdout, r.stderr)
    refused = [v for v in violations if "a git directory" in v["rule"]]
    assert all(v["action"] == "file-write-create" for v in refused)
    assert all(f"work tree of {w}" in v["rule"] for v in refused)
    assert {f"{w}/w_{way}/HEAD" for way in WAYS if not way.startswith("refs_")} <= {
        v["target"] for v in refused
    }
    assert len(refused) >= len(ORDER_REFUSED) + len(WAYS) + len(moves) + 4


# without a repositoryformatversion, git (2.39) ignores core.worktree, and with it
# core.fsmonitor, which runs only where there is a work tree
CONFIG = (
    "printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n"
    '\\tworktree = ..\\n\\tfsmonitor = "echo {d} >> {pwned}; false"\\n\' > {d}/config'
)
PAYLOAD = "mkdir -p {d}/objects {d}/refs && echo 'ref: refs/heads/main' > {d}/HEAD && " + CONFIG
PAYLOAD_HEAD_LAST = (
    "mkdir -p {d}/objects {d}/refs && " + CONFIG + "; echo 'ref: refs/heads/main' > {d}/HEAD"
)


def test_git_on_the_host_runs_nothing_the_sandbox_wrote(world: World) -> None:
    """The review's report: a config with core.fsmonitor in a directory git takes for a
    bare repository; a shell prompt's `git status` there would run it."""
    w = _project(world)
    pwned = world.root / "pwned"
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    script = "; ".join(
        (
            PAYLOAD.format(d="docs", pwned=pwned),
            PAYLOAD_HEAD_LAST.format(d="notes", pwned=pwned),
            "true",
        )
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    status = {d: _host_git(world, w / d, "status", "--porcelain") for d in ("docs", "notes")}
    assert not pwned.exists(), f"git status on the host ran: {pwned.read_text()}"
    for d, out in status.items():
        assert out.returncode == 0, (d, out.stderr)
        top = _host_git(world, w / d, "rev-parse", "--show-toplevel")
        assert top.stdout.strip() == str(w), (d, top.stdout, top.stderr)
    assert r.stderr.count("Permission denied") == 2, r.stderr


def test_bare_repositories_elsewhere_and_git_in_the_project_still_work(world: World) -> None:
    """git init --bare and git clone --bare into $TMPDIR or a writable root outside any
    work tree; git's own work in the existing repository and in a bare repository that
    existed at launch (its refs and objects, not a hooks directory or a commondir;
    its HEAD is read-only, so that no run can have the next take it for none)."""
    w = _project(world)
    other = world.mkdir("other")
    subprocess.run(["git", "init", "-q", "--bare", str(w / "fixture.git")], check=True)
    subprocess.run(["rm", "-rf", str(w / "fixture.git/hooks")], check=True)
    for d, dirs, files in os.walk(w / "fixture.git"):
        world.ident.chown(d)
        for name in (*dirs, *files):
            world.ident.chown(os.path.join(d, name))
    head = (w / "fixture.git/HEAD").read_text()
    s = world.settings({"filesystem": {"allowWrite": [".", str(other)]}})
    env = " ".join(f"{k}={v}" for k, v in GIT_ENV.items())
    script = (
        f"export HOME=$TMPDIR {env}; set -e; "
        'git init -q --bare "$TMPDIR/b.git"; git clone -q --bare . "$TMPDIR/c.git"; '
        'git clone -q "$TMPDIR/c.git" "$TMPDIR/copy"; '
        f"git init -q --bare {other}/d.git; git clone -q --bare . {other}/e.git; "
        f"git -C {other}/e.git config core.bare true; "
        "echo more > README; git add README; git commit -qm two; git branch side; "
        "git checkout -q side; git tag v1; echo x >> README; git stash -q; "
        "git checkout -q main; git stash pop -q; git checkout -q README; git gc -q; "
        "git push -q fixture.git HEAD:refs/heads/other; echo all-ok; set +e; "
        "mkdir fixture.git/hooks; echo .. > fixture.git/commondir; "
        "echo > fixture.git/config.worktree; true"
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, timeout=120)
    assert r.stdout == "all-ok\n", r.stderr
    assert r.stderr.count("Permission denied") == 3, r.stderr
    for bare in (other / "d.git", other / "e.git"):
        out = _host_git(world, bare, "rev-parse", "--is-bare-repository")
        assert out.stdout.strip() == "true", (bare, out.stderr)
    log = _host_git(world, w, "log", "--format=%s", "main")
    assert log.stdout.split() == ["two", "one"]
    assert _host_git(world, w, "tag").stdout.split() == ["v1"]
    assert (w / "fixture.git/HEAD").read_text() == head  # as it was
    pushed = _host_git(world, w / "fixture.git", "log", "--format=%s", "other")
    assert pushed.stdout.split() == ["two", "one"]
    for name in ("hooks", "commondir", "config.worktree"):
        assert not os.path.lexists(w / "fixture.git" / name), name
