"""A hard link to a read-denied file shows nothing (issue 16).

A pre-existing hard link in the working directory to a file inside a read-denied
directory (``~/.ssh`` is one by default) showed its content. The rule
(``fsplan.check_links``): a read-denied file, named or inside a read-denied
directory, with more hard links than the read-denied trees hold names of it stops
the launch. The walk for them leaves ``allowRead`` holes out (a name there is a
readable one) and stops at ``MAX_LINK_WALK`` entries: the trees not walked whole
are named in a warning, and so is a short-linked file found then. Tested on the
plan and through the CLI, as root and unprivileged: the content never appears.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import World
from fakehost import FakeHost
from sandhold.errors import UnenforceablePolicy
from sandhold.policy import fsplan
from sandhold.policy.fsplan import FsRequest, plan_filesystem

H = "/home/u"


def _plan(entries: dict[str, str], links: tuple[tuple[str, ...], ...], **rules: object) -> None:
    host = FakeHost({"/p": "dir", "/t": "dir", f"{H}/proj": "dir", **entries}, links)
    req = FsRequest(cwd=f"{H}/proj", home=H, tmpdir="/t", private_root="/p", **rules)  # type: ignore[arg-type]
    plan_filesystem(req, host)


SECRET = f"{H}/.ssh/id_x"


@pytest.mark.parametrize(
    ("links", "deny", "allow", "refused"),
    [
        ((SECRET, f"{H}/proj/innocent"), ("~/.ssh",), (), True),
        ((SECRET, f"{H}/.ssh/deep/a/b"), ("~/.ssh",), (), False),  # every name hidden
        ((SECRET, f"{H}/.aws/copy"), ("~/.ssh", "~/.aws"), (), False),
        ((SECRET, f"{H}/.aws/copy", f"{H}/proj/x"), ("~/.ssh", "~/.aws"), (), True),
        ((SECRET, f"{H}/proj/innocent"), ("~/.ssh",), ("~/.ssh/id_x",), False),  # readable
        ((SECRET, f"{H}/elsewhere/y"), ("~",), ("~/proj",), False),  # both in the tree
    ],
)
def test_links_of_files_in_denied_directories(
    links: tuple[str, ...], deny: tuple[str, ...], allow: tuple[str, ...], refused: bool
) -> None:
    entries = {p: "file" for p in links}
    if refused:
        with pytest.raises(UnenforceablePolicy, match="hard links"):
            _plan(entries, (links,), deny_read=deny, allow_read=allow)
    else:
        _plan(entries, (links,), deny_read=deny, allow_read=allow)


def _plan_of(
    entries: dict[str, str], links: tuple[tuple[str, ...], ...], **rules: object
) -> tuple[fsplan.FsPlan, FakeHost]:
    host = FakeHost({"/p": "dir", "/t": "dir", f"{H}/proj": "dir", **entries}, links)
    req = FsRequest(cwd=f"{H}/proj", home=H, tmpdir="/t", private_root="/p", **rules)  # type: ignore[arg-type]
    return plan_filesystem(req, host), host


SRC, PROJ = f"{H}/src", f"{H}/src/project"
HOLE = {"deny_read": ("~/src",), "allow_read": ("~/src/project",)}
NESTED = {"deny_read": ("~/src", "~/src/project/keys"), "allow_read": ("~/src/project",)}


@pytest.mark.parametrize(
    ("links", "rules", "refused"),
    [
        # a name in the hole is a readable one: the denied file shows through it
        ((f"{SRC}/other/key", f"{PROJ}/copy"), HOLE, True),
        ((f"{PROJ}/a", f"{PROJ}/b"), HOLE, False),  # both readable: nothing denied
        ((f"{PROJ}/a", f"{H}/elsewhere"), HOLE, False),
        ((f"{SRC}/a/.git/objects/x", f"{SRC}/b/.git/objects/x"), HOLE, False),  # a local clone
        # a deny inside the hole is walked on its own
        ((f"{PROJ}/keys/k", f"{SRC}/other/k"), NESTED, False),
        ((f"{PROJ}/keys/k", f"{PROJ}/k"), NESTED, True),
        ((f"{PROJ}/keys/k", f"{H}/k"), NESTED, True),
    ],
)
def test_allow_read_holes_are_left_out_of_the_walk_and_their_names_count_as_readable(
    links: tuple[str, ...], rules: dict[str, tuple[str, ...]], refused: bool
) -> None:
    entries = {p: "file" for p in links}
    if refused:
        with pytest.raises(UnenforceablePolicy, match="hard links"):
            _plan(entries, (links,), **rules)
    else:
        plan, _ = _plan_of(entries, (links,), **rules)
        assert plan.warnings == ()


def test_the_walk_does_not_look_inside_a_hole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fsplan, "MAX_LINK_WALK", 4)
    entries = {f"{PROJ}/f{i}": "file" for i in range(50)} | {f"{SRC}/a": "file"}
    plan, host = _plan_of(entries, (), **HOLE)
    assert plan.warnings == () and host.scanned == [SRC]


def test_trees_beyond_the_bound_launch_with_a_warning_naming_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fsplan, "MAX_LINK_WALK", 3)
    big = {f"{H}/big/f{i}": "file" for i in range(5)}
    plan, _ = _plan_of({**big, f"{H}/zz/a": "file"}, (), deny_read=("~/big", "~/zz"))
    (warning,) = plan.warnings
    assert f"not checked in {H}/big, {H}/zz (read-denied)" in warning
    assert "filesystem.skipHardLinkCheck" in warning and "Deny narrower paths" in warning
    # under the bound: nothing to say
    plan, _ = _plan_of({f"{H}/big/f1": "file"}, (), deny_read=("~/big",))
    assert plan.warnings == ()


def test_a_link_found_with_the_walk_unfinished_is_warned_of_not_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its other name may lie in what was not walked (a clone's objects), so a refusal
    could stop a home with nothing wrong; it is named in a warning instead. Once the
    walk is whole again it is refused."""
    key = (f"{H}/.ssh/id_x", f"{H}/proj/innocent")
    big = {f"{H}/big/f{i}": "file" for i in range(5)}
    entries = {**big, **{p: "file" for p in key}}
    rules = {"deny_read": ("~/.ssh", "~/big")}
    monkeypatch.setattr(fsplan, "MAX_LINK_WALK", 3)
    plan, _ = _plan_of(entries, (key,), **rules)
    assert len(plan.warnings) == 2
    assert f"{H}/.ssh/id_x: the file has 2 hard links, 1 of them" in plan.warnings[1]
    monkeypatch.setattr(fsplan, "MAX_LINK_WALK", 100)
    with pytest.raises(UnenforceablePolicy, match="2 hard links, 1 of them"):
        _plan(entries, (key,), **rules)


def test_skip_hard_link_check_leaves_a_tree_unwalked_and_says_so_in_a_note(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fsplan, "MAX_LINK_WALK", 3)
    big = {f"{SRC}/big/f{i}": "file" for i in range(5)}
    for skip in ("~/src/big", f"{SRC}/big"):
        plan, host = _plan_of(big, (), **HOLE, skip_link_check=(skip,))
        assert plan.warnings == ()
        assert f"hard links not checked in {SRC}/big (filesystem.skipHardLinkCheck)" in plan.notes
    plan, host = _plan_of(big, (), deny_read=("~/src/big",), skip_link_check=("~/src/big",))
    assert plan.warnings == () and host.scanned == []
    # a link found elsewhere may have its other name in the skipped tree: warned
    key = (f"{H}/.ssh/id_x", f"{H}/proj/innocent")
    entries = {**big, **{p: "file" for p in key}}
    plan, _ = _plan_of(
        entries, (key,), deny_read=("~/.ssh", "~/src"), skip_link_check=(f"{SRC}/big",)
    )
    assert [w for w in plan.warnings if "id_x: the file has 2 hard links" in w]


@pytest.mark.sandbox
@pytest.mark.parametrize("folder", ["secrets", ".ssh"])
def test_a_link_in_the_work_tree_to_a_denied_file_shows_nothing(world: World, folder: str) -> None:
    settings = {"filesystem": {"denyRead": [f"~/{folder}"]}}
    secret = world.mkfile(f"home/{folder}/id_x", "PRIVATE-KEY")
    os.link(secret, world.work / "innocent")
    s = world.settings(settings)
    r = world.sandhold("-s", str(s), "--", "cat", "innocent")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "PRIVATE-KEY" not in r.stdout + r.stderr
    assert "hard links" in r.stderr and str(secret) in r.stderr
    os.unlink(world.work / "innocent")
    r = world.sandhold("-s", str(s), "--", "cat", str(secret))
    assert r.returncode != 0 and "PRIVATE-KEY" not in r.stdout


@pytest.mark.sandbox
def test_the_same_for_a_sandboxport_launch(world: World) -> None:
    """A spec-launched sandbox hides ``~/.ssh`` by default: a link to a key there
    stops the launch."""
    from portdriver import drive

    secret = world.mkfile("home/.ssh/id_x", "PRIVATE-KEY")
    os.link(secret, world.work / "innocent")
    out = drive(
        world,
        """
        async def main(port):
            try:
                h = await port.launch(spec(bind_mounts=(SandboxBindMount(WORK),)))
            except Exception as exc:
                OUT["err"] = f"{type(exc).__name__}: {exc}"
            else:
                r = await port.run(h, f"cat {WORK}/innocent")
                OUT["out"] = r.stdout.decode()
                await port.destroy(h)
        """,
    )
    assert "out" not in out and "hard links" in str(out.get("err")), out


@pytest.mark.sandbox
def test_a_link_through_an_allow_read_hole_shows_nothing(world: World) -> None:
    """``~/src`` denied, its project read again: a project file that is a hard link
    of a denied file elsewhere in ``~/src`` stops the launch (its name in the hole
    is a readable one); links inside the project alone do not."""
    settings = world.settings(
        {"filesystem": {"denyRead": ["~/src"], "allowRead": ["~/src/project"]}}
    )
    secret = world.mkfile("home/src/other-client/key", "PRIVATE-KEY")
    copy = world.home / "src/project/copy"
    world.mkdir("home/src/project")
    os.link(secret, copy)
    r = world.sandhold("-s", str(settings), "--", "cat", str(copy))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "PRIVATE-KEY" not in r.stdout + r.stderr
    assert "2 hard links, 1 of them" in r.stderr and str(secret) in r.stderr
    os.unlink(secret)
    os.link(copy, world.home / "src/project/twin")  # both names readable: nothing hidden
    r = world.sandhold("-s", str(settings), "--", "cat", str(copy))
    assert r.returncode == 0 and r.stdout == "PRIVATE-KEY", (r.stdout, r.stderr)


@pytest.mark.sandbox
def test_a_denied_tree_beyond_the_bound_launches_with_one_warning(world: World) -> None:
    big = world.mkdir("home/big")
    for i in range(fsplan.MAX_LINK_WALK + 1):
        (big / f"f{i}").touch()
    s = world.settings({"filesystem": {"denyRead": ["~/big"]}})
    r = world.sandhold("-s", str(s), "--", "true")
    assert r.returncode == 0, r.stderr
    warned = [line for line in r.stderr.splitlines() if "hard links not checked" in line]
    assert len(warned) == 1 and f"in {big} (read-denied)" in warned[0], r.stderr
    assert warned[0].startswith("sandhold: warning: ")
    s = world.settings({"filesystem": {"denyRead": ["~/big"], "skipHardLinkCheck": ["~/big"]}})
    r = world.sandhold("-s", str(s), "--", "true")
    assert r.returncode == 0 and "hard links" not in r.stderr, r.stderr


def test_the_host_scan_agrees_with_gnu_find(tmp_path: Path) -> None:
    """``OsHostView.scan_links`` against ``find -type f -links +1``: symlinks (to a
    linked file, too) not followed, a skipped subtree left out, the limit kept."""
    import subprocess

    from sandhold.backends.linux.hostfs import OsHostView

    for d in ("a/b", "a/c", "skip/d"):
        (tmp_path / d).mkdir(parents=True)
    for f in ("a/one", "a/b/two", "a/c/three", "skip/d/four"):
        (tmp_path / f).write_text("x")
    os.link(tmp_path / "a/one", tmp_path / "a/c/one-again")
    os.link(tmp_path / "a/b/two", tmp_path / "skip/d/two-again")
    (tmp_path / "a/sym").symlink_to(tmp_path / "a/one")
    root = str(tmp_path)
    out = subprocess.run(
        [
            "find",
            root,
            "-path",
            f"{root}/skip",
            "-prune",
            "-o",
            "-type",
            "f",
            "-links",
            "+1",
            "-printf",
            "%D %i %n %p\\0",
        ],
        capture_output=True,
        check=True,
    ).stdout
    expected = set()
    for rec in filter(None, out.decode().split("\0")):
        dev, ino, nlink, path = rec.split(" ", 3)
        expected.add((path, int(dev), int(ino), int(nlink)))
    scan = OsHostView().scan_links(root, {f"{root}/skip"}, 1000)
    assert scan.complete and scan.entries == 9  # skip counts, not what is below it
    assert set(scan.linked) == expected and len(expected) == 3
    cut = OsHostView().scan_links(root, set(), 4)
    assert not cut.complete and cut.entries == 4
