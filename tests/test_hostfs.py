"""The live host view answers as the standard library does (F-SET-6: every deny path
is enforced at its symlink-resolved place), only faster."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sandhold.backends.linux.hostfs import OsHostView

# a small tree with every kind of link: relative and absolute, up and across, to a
# file, to nothing, in a loop, and through a link to a directory
TREE = {
    "a/b/c": "file",
    "a/d": "dir",
    "a/up": "-> ..",
    "a/self": "-> .",
    "a/abs": "-> {root}/a/b",
    "a/dangling": "-> missing/x",
    "a/file": "-> b/c",
    "loop1": "-> loop2",
    "loop2": "-> loop1",
    "e": "-> a/up/a/b",
    "f": "-> e/../d",
}
_NAMES = ["a", "b", "c", "d", "up", "self", "abs", "dangling", "file", "loop1", "e", "f"]


def _make(root: Path) -> None:
    for rel, kind in TREE.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "file":
            path.write_text("x")
        elif kind == "dir":
            path.mkdir(exist_ok=True)
        else:
            os.symlink(kind[3:].format(root=root), path)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.sampled_from([*_NAMES, "missing", "..", "."]), min_size=0, max_size=6),
    st.booleans(),
)
def test_realpath_answers_as_os_path_realpath(
    tmp_path_factory, parts: list[str], twice: bool
) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.getbasetemp() / "realpath-tree"
    if not root.exists():
        root.mkdir()
        _make(root)
    view = OsHostView()
    path = "/".join([str(root), *parts])
    if twice:  # answers cached from another question must not change this one
        for k in range(len(parts)):
            view.realpath("/".join([str(root), *parts[:k]]))
    assert view.realpath(path) == os.path.realpath(path)
    assert view.realpath(path + "/") == os.path.realpath(path + "/")
