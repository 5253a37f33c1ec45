"""git config as the plan reads it: the parser's tables.

``gitconfig.parse`` is checked case by case against the table, with CRLF line ends
too, and against git itself where git is installed (git's values must be among
ours; where git refuses a file, so must we).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sandhold.policy import gitconfig

# (id, config bytes, include paths, core.hooksPath values)
PARSE_CASES: list[tuple[str, bytes, tuple[str, ...], tuple[str, ...]]] = [
    ("include", b"[include]\n\tpath = a.cfg\n", ("a.cfg",), ()),
    ("case-insensitive names", b"[Include]\n  PATH=  b  # c\n", ("b",), ()),
    ("includeIf gitdir", b'[includeIf "gitdir:~/w/"]\n path = ~/x\n', ("~/x",), ()),
    ("includeIf on the header's line", b'[includeIf "onbranch:M"] path = y ; z\n', ("y",), ()),
    ("every includeIf", b'[includeIf "hasconfig:remote.*.url:x"]\npath=h\n', ("h",), ()),
    (
        "hooksPath, all values, continuation",
        b"[core] hooksPath = .githooks\n[core]\nhookspath=  a\\\n b  \n",
        (),
        (".githooks", "a b"),
    ),
    ("quoted, escapes", b'[core]\n hooksPath = "q\\"u\\\\o\\tt\\be"\n', (), ('q"u\\o\tt\be',)),
    ("quoted comment marks", b'[include]\npath = "a # b ; c"\n', ("a # b ; c",), ()),
    ("inline comment", b"[include]\npath = a # b ; c\n", ("a",), ()),
    ("quoted spaces kept", b'[include]\npath = "a  "  b  \n', ("a    b",), ()),
    ("a tab inside, as old git read it too", b"[include]\npath = a\tb \n", ("a\tb", "a b"), ()),
    ("not include.path", b'[include.x]\npath=1\n[include "x"]\npath=2\n', (), ()),
    ("includeIf needs a condition", b"[includeif]\npath=3\n", (), ()),
    ("dotted subsection lowered", b"[includeIf.x]\npath=4\n", ("4",), ()),
    ("not core.hooksPath", b'[core.x]\nhooksPath=5\n[core "y"]\nhooksPath=6\n', (), ()),
    ("a BOM", b"\xef\xbb\xbf[include]\npath=bom\n", ("bom",), ()),
    ("a boolean is no path", b"[include]\npath\n[core]\nhooksPath\n", (), ()),
    ("no newline at the end", b"[include]\npath=last", ("last",), ()),
    ("backslash at the end", b"[include]\npath = x\\\n", ("x",), ()),
    ("escaped subsection", b'[includeIf "gitdir:a\\"b\\\\c"]\npath=esc\n', ("esc",), ()),
    ("comments and blank lines", b"# c\n; c\n  [include]  \n\n\tpath = z\n", ("z",), ()),
    ("empty value", b'[include]\npath=\npath=""\n', ("", ""), ()),
    ("other keys", b"[include]\nPa-th=1\npath=2\n", ("2",), ()),
    ("non-UTF-8 bytes", b"[include]\npath=\xff\n", ("\udcff",), ()),
    ("nothing of interest", b"[user]\n\tname = x\n[alias]\n\tst = status\n", (), ()),
    (
        "order kept",
        b"[include]\npath=one\npath=two\n[core]\nhooksPath=h\n[include]\npath=three\n",
        ("one", "two", "three"),
        ("h",),
    ),
]

# (id, config bytes, the line git and this parser refuse)
ERROR_CASES: list[tuple[str, bytes, int]] = [
    ("unknown escape", b"[include]\npath = a\\qb\n", 2),
    ("open quote", b'[include]\npath = "a\n', 2),
    ("open quote elsewhere", b'[user]\nname = "a\n[include]\npath=x\n', 2),
    ("open header", b"[include\npath=x\n", 1),
    ("a digit starts a key", b"[include]\n1path=x\n", 2),
    ("no '='", b"[include]\npath x\n", 2),
    ("a space in a section name", b"[inc lude]\npath=x\n[include]\n", 1),
    ("a newline in a subsection", b'[include "a\nb"]\npath=x\n', 1),
    ("no section name", b"[]\ninclude.path=x\n", 1),
    ("a byte that starts nothing", b"[include]\n\xff=1\n", 2),
]


@pytest.mark.parametrize(
    ("data", "includes", "hooks"), [c[1:] for c in PARSE_CASES], ids=[c[0] for c in PARSE_CASES]
)
def test_parse(data: bytes, includes: tuple[str, ...], hooks: tuple[str, ...]) -> None:
    expected = gitconfig.GitConfig(includes, hooks)
    assert gitconfig.parse(data) == expected
    assert gitconfig.parse(data.replace(b"\n", b"\r\n")) == expected


@pytest.mark.parametrize(
    ("data", "line"), [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES]
)
def test_parse_refuses_what_git_refuses(data: bytes, line: int) -> None:
    with pytest.raises(gitconfig.GitConfigError) as err:
        gitconfig.parse(data)
    assert err.value.line == line


def test_a_config_past_the_size_limit_is_refused() -> None:
    with pytest.raises(gitconfig.GitConfigError, match="larger than"):
        gitconfig.parse(b"#" * (gitconfig.MAX_BYTES + 1))


def _git_reads(tmp_path: Path, data: bytes) -> tuple[list[str], list[str]] | None:
    """What git itself reads as include paths and hooksPaths; None if it refuses."""
    f = tmp_path / "config"
    f.write_bytes(data)
    got = []
    for pattern in (r"^(include\.path|includeif\..*\.path)$", r"^core\.hookspath$"):
        r = subprocess.run(
            ["git", "config", "--file", str(f), "--null", "--get-regexp", pattern],
            capture_output=True,
            check=False,
        )
        if r.returncode not in (0, 1) or r.stderr:
            return None
        items = [i.partition(b"\n")[2] for i in r.stdout.split(b"\0") if b"\n" in i]
        got.append([i.decode("utf-8", "surrogateescape") for i in items])
    return got[0], got[1]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize("case", PARSE_CASES + ERROR_CASES, ids=lambda c: str(c[0]))
def test_git_itself_agrees(tmp_path: Path, case: tuple[object, ...]) -> None:
    data = case[1]
    assert isinstance(data, bytes)
    git = _git_reads(tmp_path, data)
    if len(case) == 3:
        assert git is None, "git reads what the parser refuses"
        return
    ours = gitconfig.parse(data)
    assert git is not None, "git refuses what the parser reads"
    assert set(git[0]) <= set(ours.includes) and set(git[1]) <= set(ours.hooks_paths)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("shared.cfg", "/r/.git/shared.cfg"),
        ("../x", "/r/.git/../x"),
        ("/abs/y", "/abs/y"),
        ("~", "/h"),
        ("~/z", "/h/z"),
        ("%(prefix)/etc/gitconfig", None),
    ],
)
def test_expand(value: str, expected: str | None) -> None:
    assert gitconfig.expand(value, "/r/.git", "/h") == expected


@pytest.mark.parametrize(("value", "home"), [("~bob/x", "/h"), ("~/x", "")])
def test_expand_refuses_a_home_it_does_not_know(value: str, home: str) -> None:
    with pytest.raises(gitconfig.GitConfigError):
        gitconfig.expand(value, "/r", home)


@pytest.mark.parametrize(
    ("data", "prefix", "expected"),
    [
        (b"gitdir: ../.git/worktrees/w\n", b"gitdir: ", "/wt/../.git/worktrees/w"),
        (b"gitdir: /main/.git/modules/m\r\n", b"gitdir: ", "/main/.git/modules/m"),
        (b"../..\n", b"", "/wt/../.."),
        (b"gitdirx: /a\n", b"gitdir: ", None),
        (b"gitdir: \n", b"gitdir: ", None),
        (b"gitdir: a\nb\n", b"gitdir: ", None),
    ],
)
def test_pointer(data: bytes, prefix: bytes, expected: str | None) -> None:
    assert gitconfig.pointer(data, "/wt", prefix) == expected


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, ("/etc/gitconfig", "/h/.gitconfig", "/h/.config/git/config")),
        (
            {"XDG_CONFIG_HOME": "/x", "GIT_CONFIG_SYSTEM": "/s", "GIT_CONFIG_GLOBAL": "g"},
            ("/etc/gitconfig", "/h/.gitconfig", "/h/.config/git/config", "/x/git/config", "/s"),
        ),
    ],
)
def test_host_files(environ: dict[str, str], expected: tuple[str, ...]) -> None:
    assert gitconfig.host_files("/h", environ) == expected
