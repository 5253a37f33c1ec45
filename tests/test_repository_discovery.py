"""The host never discovers a repository the sandbox made above one of yours (issue 16).

git, hg and jj look for a repository in each ancestor of where they start until one
is valid: garbage in an existing ``.git/HEAD`` made git walk up to a ``.git`` the
sandbox had made in the parent (its ``core.fsmonitor`` ran at the host's next ``git
status``), and moving a ``.hg`` aside let ``git init`` make a repository in its work
tree, then put the ``.hg`` back. The rules (``policy.repository``): below a writable
root, no repository (nor a bare one) is made in a directory that holds the work tree
of a repository that existed at launch, and a work tree found at launch stays one
when its metadata is moved away. Each attack runs as root and unprivileged, through
the CLI and the port, and git and hg then run on the host.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import World
from fakehost import FakeHost
from sandhold.policy import repository
from sandhold.policy.fsplan import FsRequest, plan_filesystem

FSMON = "[core]\\n\\tfsmonitor = touch {mark}; false #\\n"


@pytest.mark.parametrize(
    ("directory", "known", "expected"),
    [
        ("/w", ("/w/proj",), "/w/proj"),
        ("/w/a", ("/w/a/b/proj",), "/w/a/b/proj"),
        ("/w/proj", ("/w/proj",), None),  # its own: the nested rule's
        ("/w/pro", ("/w/proj",), None),  # a prefix of the name is no ancestor
        ("/w/other", ("/w/proj", "/"), None),  # above the root: not below it
        ("/", ("/w/proj",), "/w/proj"),
    ],
)
def test_above_a_work_tree(directory: str, known: tuple[str, ...], expected: str | None) -> None:
    assert repository.above_work_tree(directory, known) == expected


def test_the_plan_names_the_work_trees_it_found() -> None:
    host = FakeHost(
        {
            "/p": "dir",
            "/t": "dir",
            "/w/a/.git/HEAD": "file",
            "/w/b/c/.hg/store": "dir",
            "/w/d/.jj/repo": "dir",
            "/w/e/.git": "file",
            "/w/bare/HEAD": "file",
            "/w/bare/refs": "dir",
            "/w/plain/x": "file",
        },
        data={"/w/e/.git": b"gitdir: /elsewhere\n"},
    )
    req = FsRequest(
        cwd="/w", home="/h", tmpdir="/t", private_root="/p", allow_write=("/w",), supervised=True
    )
    assert plan_filesystem(req, host).work_trees == ("/w/a", "/w/b/c", "/w/bare", "/w/d", "/w/e")


def _host(world: World, argv: list[str], cwd: Path, *, check: bool = True) -> str:
    r = world.ident.run(argv, cwd=cwd, env=world.env(HGRCPATH="", HGUSER="t"))
    assert r.returncode == 0 or not check, r.stderr
    return r.stdout


def _git_repo(world: World, rel: str) -> Path:
    path = world.mkdir(rel)
    _host(world, ["git", "init", "-q", "."], path)
    return path


def _run(world: World, script: str, cwd: Path) -> list[str]:
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    env = world.env(HGRCPATH="", HGUSER="t")
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, cwd=cwd, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.mark.sandbox
def test_a_damaged_head_finds_no_repository_above(world: World) -> None:
    """``.git/HEAD`` may be damaged (git writes it), but no repository, bare or not, can
    then be made in any directory above the work tree, up to the writable root."""
    mark = world.root / "PWNED"
    ws = world.mkdir("home/ws")
    proj = _git_repo(world, "home/ws/a/proj")
    fsmon = FSMON.format(mark=mark)
    script = (
        "echo garbage > a/proj/.git/HEAD; echo head=$?; "
        "git init -q . 2>/dev/null; echo init=$?; "
        "git init -q a 2>/dev/null; echo init_a=$?; "
        "mkdir .git; echo mkdir=$?; "
        f"mkdir -p x/.git && printf '{fsmon}' > x/.git/config && mv x/.git a/.git; echo moved=$?; "
        "mkdir refs objects; echo 'ref: refs/heads/m' > HEAD; echo bare=$?; "
        "mkdir -p new && git init -q new; echo sibling=$?; "
        "mkdir .hg; echo hg=$?"
    )
    assert _run(world, script, ws) == [
        "head=0",
        "init=1",
        "init_a=1",
        "mkdir=1",
        "moved=1",
        "bare=2",
        "sibling=0",
        "hg=1",
    ]
    assert not (ws / ".git").exists() and not (ws / "a/.git").exists()
    assert not (ws / "HEAD").exists()
    _host(world, ["git", "status", "--short"], proj, check=False)  # fatal: not a repository
    _host(world, ["hg", "status"], proj, check=False)
    assert not mark.exists(), "the host's git ran what the sandbox planted"


@pytest.mark.sandbox
def test_metadata_moved_away_and_back(world: World) -> None:
    """hg's ``.hg`` (and git's ``.git``, rename guarded) cannot be moved aside: the
    directory is the work tree it was at launch, so the move counts as a repository
    made in one, and so would a repository made there after a ``.hg`` removed; nor can
    the metadata be moved up into an ancestor."""
    mark = world.root / "PWNED"
    ws = world.mkdir("home/ws")
    hg = world.mkdir("home/ws/hgproj")
    _host(world, ["hg", "init"], hg)
    gp = _git_repo(world, "home/ws/gitproj")
    script = (
        "mv hgproj/.hg hgproj/.hg-away; echo away=$?; "
        "git init -q hgproj 2>/dev/null; echo init=$?; "
        "mkdir hgproj/.jj; echo jj=$?; "
        "mv hgproj/.hg .hg; echo up=$?; "
        "cp -a hgproj/.hg keep && rm -rf hgproj/.hg && git init -q hgproj; echo removed=$?; "
        "mkdir hgproj/.hg; echo again=$?; "
        "mv gitproj/.git gitproj/.git-away; echo git_away=$?; "
        "git init -q gitproj/sub 2>/dev/null; echo nested=$?"
    )
    assert _run(world, script, ws) == [
        "away=1",
        "init=1",
        "jj=1",
        "up=1",
        "removed=1",
        "again=1",
        "git_away=1",
        "nested=1",
    ]
    assert not (hg / ".git").exists() and not (ws / ".hg").exists()
    _host(world, ["hg", "status"], hg, check=False)  # no repository there any more
    _host(world, ["git", "status", "--short"], gp)
    assert not mark.exists()


@pytest.mark.sandbox
def test_the_same_holds_for_a_sandboxport_bind(world: World) -> None:
    from portdriver import drive

    ws = world.mkdir("home/ws")
    _git_repo(world, "home/ws/proj")
    out = drive(
        world,
        f"""
        async def main(port):
            h = await port.launch(spec(bind_mounts=(SandboxBindMount("{ws}"),)))
            r = await port.run(h, "cd {ws} && echo garbage > proj/.git/HEAD; echo $?; "
                "mkdir .git; echo $?")
            OUT["r"] = r.stdout.decode()
            await port.destroy(h)
        """,
    )
    assert out["r"] == "0\n1\n"
    assert not (ws / ".git").exists()


@pytest.mark.sandbox
def test_a_worktree_cannot_be_pointed_elsewhere(world: World) -> None:
    """A linked worktree's ``.git`` file and its git dir's ``commondir`` stay as they are;
    a damaged worktree ``HEAD`` makes git stop, and no repository can wait above."""
    mark = world.root / "PWNED"
    ws = world.mkdir("home/ws")
    proj = _git_repo(world, "home/ws/proj")
    for args in (
        ["git", "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "--allow-empty",
         "-m", "x"],
        ["git", "worktree", "add", "-q", "../wt"],
    ):  # fmt: skip
        _host(world, args, proj)
    wt = ws / "wt"
    fsmon = FSMON.format(mark=mark)
    script = (
        f"mkdir -p evil && printf '{fsmon}' > evil/config; "
        "echo 'gitdir: ../evil' > wt/.git; echo dotgit=$?; "
        "echo ../../../evil > proj/.git/worktrees/wt/commondir; echo commondir=$?; "
        "echo garbage > proj/.git/worktrees/wt/HEAD; echo head=$?; "
        "git init -q . 2>/dev/null; echo init=$?"
    )
    assert _run(world, script, ws) == ["dotgit=2", "commondir=2", "head=0", "init=1"]
    _host(world, ["git", "status", "--short"], wt, check=False)  # fatal: not a repository
    _host(world, ["git", "status", "--short"], proj)
    assert not mark.exists()
