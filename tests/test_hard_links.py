"""A hard link to a read-denied file shows nothing (issue 16).

A pre-existing hard link in the working directory to a file inside a read-denied
directory (``~/.ssh`` is one by default) showed its content. The rule
(``fsplan.check_links``): a read-denied file, named or inside a read-denied
directory, with more hard links than the read-denied trees hold names of it stops
the launch; so do read-denied trees too large to walk for them. Tested on the plan
and through the CLI, as root and unprivileged: the content never appears.
"""

from __future__ import annotations

import os

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


def test_denied_trees_too_large_to_walk_stop_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fsplan, "MAX_LINK_WALK", 3)
    entries = {f"{H}/big/f{i}": "file" for i in range(5)}
    with pytest.raises(UnenforceablePolicy, match="more than 3 entries"):
        _plan(entries, (), deny_read=("~/big",))
    _plan({f"{H}/big/f1": "file"}, (), deny_read=("~/big",))


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
