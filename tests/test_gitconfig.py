"""git config as the plan reads it: the parser's tables, and what the plan protects.

``gitconfig.parse`` is checked case by case against the table, with CRLF line ends
too, and against git itself where git is installed (git's values must be among
ours; where git refuses a file, so must we). The plan tables use the fake host;
tests/test_git_pointers.py runs the attacks in real sandboxes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fakehost import FakeHost
from sandhold.errors import UnenforceablePolicy
from sandhold.policy import gitconfig
from sandhold.policy.fsplan import FsPlan, FsRequest, plan_filesystem

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
    ("a NUL ends a value, as in git", b"[include]\npath = a\0b\n", ("a",), ()),
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


# -- the plan ----------------------------------------------------------------------------

HOME = "/home/u"
CWD = "/home/u/proj"
PRIV = "/tmp/sandhold-1000"
TMP = "/tmp/sandhold-1000/s1/tmp"
REPO = {f"{CWD}/.git/HEAD": "file", f"{CWD}/.git/config": "file", f"{CWD}/.git/hooks": "dir"}


def plan(
    entries: dict[str, str],
    data: dict[str, bytes],
    *,
    allow_write: tuple[str, ...] = (".",),
    git_configs: tuple[str, ...] = (),
    supervised: bool = True,
) -> FsPlan:
    host = FakeHost({PRIV: "dir", TMP: "dir", CWD: "dir", **entries}, data=data)
    req = FsRequest(
        cwd=CWD,
        home=HOME,
        tmpdir=TMP,
        private_root=PRIV,
        allow_write=allow_write,
        git_configs=git_configs,
        supervised=supervised,
    )
    return plan_filesystem(req, host)


def read_only(p: FsPlan) -> set[str]:
    return {m.path for m in p.mounts if m.op == "ro-bind"}


def unmade(p: FsPlan) -> set[str]:
    return {path for path, _ in p.unmade}


# (id, extra host entries, file contents, read-only paths, paths not to be made)
PLAN_CASES: list[tuple[str, dict[str, str], dict[str, bytes], set[str], set[str]]] = [
    (
        "(a) a hook linked into the work tree, and a dangling one",
        {
            f"{CWD}/.git/hooks/pre-commit": "-> ../../tools/pre-commit",
            f"{CWD}/.git/hooks/post-commit": "-> ../../tools/post-commit",
            f"{CWD}/tools/pre-commit": "file",
        },
        {},
        {f"{CWD}/tools/pre-commit"},
        {f"{CWD}/tools/post-commit"},
    ),
    (
        "(a) a link through a linked directory: every link on the way",
        {
            f"{CWD}/.git/hooks/pre-commit": "-> ../../tools/pc",
            f"{CWD}/tools": "-> scripts",
            f"{CWD}/scripts/pc": "-> ../real/pc",
            f"{CWD}/real/pc": "file",
        },
        {},
        {f"{CWD}/real/pc"},
        {f"{CWD}/tools", f"{CWD}/scripts/pc"},
    ),
    (
        "(b) include and includeIf, missing and present, nested",
        {f"{CWD}/.gitconfig.shared": "file"},
        {
            f"{CWD}/.git/config": b'[include]\npath = ../.gitconfig.shared\n[includeIf "gitdir:/x"]'
            b"\npath = ../conf/if.cfg\n",
            f"{CWD}/.gitconfig.shared": b"[include]\npath = nested.cfg\n",
        },
        {f"{CWD}/.gitconfig.shared"},
        {f"{CWD}/conf/if.cfg", f"{CWD}/nested.cfg"},
    ),
    (
        "(c) core.hooksPath, present and missing, and husky's parent; in the git dir too",
        {f"{CWD}/.githooks/pre-commit": "file", f"{CWD}/.husky/_/h": "file"},
        {f"{CWD}/.git/config": b"[core]\nhooksPath = .githooks\nhooksPath=.husky/_\nhooksPath=x"},
        {f"{CWD}/.githooks", f"{CWD}/.husky"},
        # push hooks run in $GIT_DIR: a relative hooksPath names a directory there too
        {
            f"{CWD}/x",
            f"{CWD}/.git/x",
            f"{CWD}/.git/.githooks",
            f"{CWD}/.git/.husky/_",
            f"{CWD}/.git/.husky",
        },
    ),
    (
        "(c) husky's parent when .husky/_ is missing (git-ignored, made by npm install)",
        {f"{CWD}/.husky/pre-commit": "file"},
        {f"{CWD}/.git/config": b"[core]\nhooksPath=.husky/_\n"},
        {f"{CWD}/.husky"},
        {f"{CWD}/.husky/_", f"{CWD}/.git/.husky/_", f"{CWD}/.git/.husky"},
    ),
    (
        "an include outside the writable root is read, not protected",
        {"/etc/team.cfg": "file"},
        {
            f"{CWD}/.git/config": b"[include]\npath = /etc/team.cfg\n",
            "/etc/team.cfg": b"[core]\nhooksPath = hooks\n",
        },
        set(),
        {f"{CWD}/hooks"},
    ),
    (
        "an include of a directory (git reads it as empty), the writable root too",
        {f"{CWD}/d": "dir"},
        {f"{CWD}/.git/config": b"[include]\npath = ../d\npath = ..\npath = ../..\n"},
        {f"{CWD}/d"},
        set(),
    ),
    (
        "an include cycle ends",
        {f"{CWD}/a.cfg": "file"},
        {
            f"{CWD}/.git/config": b"[include]\npath = ../a.cfg\n",
            f"{CWD}/a.cfg": b"[include]\npath = a.cfg\npath=./a.cfg\npath=.git/config\n",
        },
        {f"{CWD}/a.cfg"},
        set(),
    ),
    (
        "a linked worktree: its git dir's commondir, hooks run in its work tree",
        {
            "/main/.git/HEAD": "file",
            "/main/.git/config": "file",
            "/main/.git/worktrees/w/HEAD": "file",
            "/main/.git/worktrees/w/commondir": "file",
            f"{CWD}/.git": "file",
        },
        {
            f"{CWD}/.git": b"gitdir: /main/.git/worktrees/w\n",
            "/main/.git/worktrees/w/commondir": b"../..\n",
            "/main/.git/config": b"[core]\nhooksPath = .githooks\n[include]\npath=../proj.cfg\n",
        },
        set(),
        {f"{CWD}/.githooks"},
    ),
]


@pytest.mark.parametrize(
    ("entries", "data", "ro", "refused"),
    [c[1:] for c in PLAN_CASES],
    ids=[c[0] for c in PLAN_CASES],
)
def test_what_git_config_points_at_is_protected(
    entries: dict[str, str], data: dict[str, bytes], ro: set[str], refused: set[str]
) -> None:
    p = plan({**REPO, **entries}, data)
    assert ro <= read_only(p), read_only(p)
    assert any(m.op == "bind" and m.path == CWD for m in p.mounts)  # the root stays writable
    assert unmade(p) == refused


def test_a_repository_above_the_writable_root_counts() -> None:
    """The writable root is a subdirectory of a repository; its config and hooks are
    read-only already, but what they point at inside the root is not."""
    p = plan(
        {
            "/home/u/.git/HEAD": "file",
            "/home/u/.git/config": "file",
            "/home/u/.git/hooks/pre-push": "-> ../../proj/push.sh",
            f"{CWD}/push.sh": "file",
        },
        {"/home/u/.git/config": b"[include]\npath=../proj/x.cfg\n[core]\nhooksPath=proj/h\n"},
    )
    assert f"{CWD}/push.sh" in read_only(p)
    assert unmade(p) == {f"{CWD}/x.cfg", f"{CWD}/h"}


def test_user_and_system_configs_count_in_every_repository() -> None:
    """A relative core.hooksPath in git's own configs is relative to each work tree."""
    p = plan(
        {**REPO, f"{CWD}/sub/.git/HEAD": "file", "/etc/gitconfig": "file"},
        {
            "/etc/gitconfig": b"[core]\nhooksPath = .githooks\n",
            f"{HOME}/.gitconfig": b"[include]\npath = proj/team.cfg\n",
        },
        git_configs=("/etc/gitconfig", f"{HOME}/.gitconfig", f"{CWD}/global.cfg"),
    )
    assert unmade(p) == {
        f"{CWD}/.githooks",
        f"{CWD}/sub/.githooks",
        f"{CWD}/.git/.githooks",  # where push hooks run
        f"{CWD}/sub/.git/.githooks",
        f"{CWD}/global.cfg",  # $GIT_CONFIG_GLOBAL, say: missing, so not to be made
    }
    p = plan(
        {**REPO, f"{HOME}/.gitconfig": "file"},
        {f"{HOME}/.gitconfig": b"[include]\npath = proj/team.cfg\n"},
        git_configs=(f"{HOME}/.gitconfig",),
    )
    assert f"{CWD}/team.cfg" in unmade(p)


def test_nothing_is_read_without_a_writable_root() -> None:
    host = FakeHost({**REPO, PRIV: "dir", TMP: "dir"}, data={f"{CWD}/.git/config": b"[x"})
    req = FsRequest(cwd=CWD, home=HOME, tmpdir=TMP, private_root=PRIV, git_configs=("/x",))
    plan_filesystem(req, host)
    assert host.read == []


def test_without_the_supervisor_a_missing_target_stops_the_launch() -> None:
    p = plan(REPO, {f"{CWD}/.git/config": b"[include]\npath=../x.cfg\n"}, supervised=False)
    assert f"{CWD}/x.cfg" in p.unpinned


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (b"[include]\npath = a\\qb\n", "line 2: unknown escape"),
        (b"[include]\npath = ~bob/x\n", "another user's home"),
        (b"[core]\nhooksPath = .\n", "holds the writable root"),
        (b"[core]\nhooksPath = ..\n", "holds the writable root"),
        (b"#" * (gitconfig.MAX_BYTES + 1), "larger than"),
        (
            b"".join(b"[include]\npath=%d.cfg\n" % i for i in range(gitconfig.MAX_FILES + 2)),
            "more than",
        ),
    ],
)
def test_what_cannot_be_read_as_git_reads_it_stops_the_launch(config: bytes, match: str) -> None:
    with pytest.raises(UnenforceablePolicy, match=match):
        plan(REPO, {f"{CWD}/.git/config": config})


def test_includes_are_followed_only_as_deep_as_git_follows_them() -> None:
    chain = {
        f"{CWD}/{i}.cfg": f"[include]\npath = {i + 1}.cfg\n".encode()
        for i in range(1, gitconfig.MAX_DEPTH + 3)
    }
    entries = {**REPO, **dict.fromkeys(chain, "file")}
    p = plan(entries, {f"{CWD}/.git/config": b"[include]\npath=../1.cfg\n", **chain})
    deepest = f"{CWD}/{gitconfig.MAX_DEPTH}.cfg"
    assert deepest in read_only(p) and f"{CWD}/{gitconfig.MAX_DEPTH + 1}.cfg" not in read_only(p)


# (id, config bytes, (setting, file word) pairs): the program settings (issue 16)
PROGRAM_CASES: list[tuple[str, bytes, tuple[tuple[str, str], ...]]] = [
    ("fsmonitor", b"[core]\n\tfsmonitor = tools/fsm.sh\n", (("core.fsmonitor", "tools/fsm.sh"),)),
    ("fsmonitor as a boolean", b"[core]\nfsmonitor = true\nfsmonitor\n", ()),
    (
        "a shell line: every path word, NAME=path, --opt=path, no URL, no $VAR",
        b'[core]\nsshCommand = "FOO=./a ssh -F ../cfg --x=/o/p -i $HOME/k x://h/p"\n',
        (("core.sshcommand", "./a"), ("core.sshcommand", "../cfg"), ("core.sshcommand", "/o/p")),
    ),
    ("after ; in quotes", b'[core]\npager = "less; sh t/x"\n', (("core.pager", "t/x"),)),
    ("a name on PATH", b"[core]\npager = less -R\neditor = vim\n", ()),
    ("pager.<command>", b"[pager]\n\tlog = ./p.sh\n", (("pager.log", "./p.sh"),)),
    (
        "editors",
        b"[core]\neditor=e/1\n[sequence]\neditor=e/2\n",
        (("core.editor", "e/1"), ("sequence.editor", "e/2")),
    ),
    (
        "filters, case of the subsection kept",
        b'[filter "LFS"]\nclean = c/1 %f\nsmudge = s/1\nprocess = p/1\nrequired\n',
        (("filter.LFS.clean", "c/1"), ("filter.LFS.smudge", "s/1"), ("filter.LFS.process", "p/1")),
    ),
    (
        "diff and merge drivers",
        b'[diff "x"]\ncommand = d/1\ntextconv = python3 t/c.py\n[merge "y"]\ndriver = m/1 %O\n'
        b"[diff]\nexternal = d/2\n",
        (
            ("diff.x.command", "d/1"),
            ("diff.x.textconv", "t/c.py"),
            ("merge.y.driver", "m/1"),
            ("diff.external", "d/2"),
        ),
    ),
    ("diff.<driver>.command needs a driver", b"[diff]\ncommand = d/1\n", ()),
    (
        "credential helpers: !command and absolute paths only",
        b'[credential]\nhelper = store --file=a/b\nhelper = /opt/h\n[credential "https://x"]\n'
        b"helper = !h/2 get\n",
        (("credential.helper", "/opt/h"), ("credential.https://x.helper", "h/2")),
    ),
    (
        "gpg programs",
        b'[gpg]\nprogram = g/1\n[gpg "ssh"]\nprogram = g/2 with space\ndefaultKeyCommand = k/1\n',
        (
            ("gpg.program", "g/1"),
            ("gpg.ssh.program", "g/2 with space"),
            ("gpg.ssh.defaultkeycommand", "k/1"),
        ),
    ),
    (
        "aliases: !command, and -c settings of git's own",
        b'[alias]\nx = !tools/a.sh "$@"\ny = -c core.pager=tools/p log --format=%h/%s\n'
        b"z = log --format=a/b\n",
        (("alias.x", "tools/a.sh"), ("alias.y", "tools/p")),
    ),
    (
        "the other program settings",
        b'[submodule "s"]\nupdate = !u/1\n[remote "o"]\nuploadpack = r/1\nreceivepack = r/2\n'
        b'[hook "h"]\ncommand = h/1\n[trailer "t"]\ncommand = t/1\n[core]\naskPass = a/1\n'
        b'[lfs "customtransfer.x"]\npath = l/1\n[interactive]\ndiffFilter = i/1\n',
        (
            ("submodule.s.update", "u/1"),
            ("remote.o.uploadpack", "r/1"),
            ("remote.o.receivepack", "r/2"),
            ("hook.h.command", "h/1"),
            ("trailer.t.command", "t/1"),
            ("core.askpass", "a/1"),
            ("lfs.customtransfer.x.path", "l/1"),
            ("interactive.difffilter", "i/1"),
        ),
    ),
    ("submodule update by name", b'[submodule "s"]\nupdate = rebase\n', ()),
    ("not a program setting", b"[user]\nname = a/b\n[core]\nexcludesFile = x/y\n", ()),
]


@pytest.mark.parametrize(
    ("data", "expected"), [c[1:] for c in PROGRAM_CASES], ids=[c[0] for c in PROGRAM_CASES]
)
def test_parse_programs(data: bytes, expected: tuple[tuple[str, str], ...]) -> None:
    assert gitconfig.parse(data).programs == expected
    assert gitconfig.parse(data.replace(b"\n", b"\r\n")).programs == expected


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize("case", PROGRAM_CASES, ids=lambda c: str(c[0]))
def test_git_itself_reads_the_same_program_settings(
    tmp_path: Path, case: tuple[str, bytes, object]
) -> None:
    """Every value git reads for a key of the table gives words the parser found."""
    f = tmp_path / "config"
    f.write_bytes(case[1])
    r = subprocess.run(
        ["git", "config", "--file", str(f), "--null", "--list"], capture_output=True, check=True
    )
    ours = set(gitconfig.parse(case[1]).programs)
    for item in r.stdout.split(b"\0"):
        key, _, value = item.partition(b"\n")
        section, _, name = key.rpartition(b".")
        how = gitconfig.program_kind(section, name) if section else None
        if how is None or not _:
            continue
        words = gitconfig.program_words(how, value.decode())
        # git lowers the section's name and the key, and keeps a subsection's case
        assert {(key.decode(), w) for w in words} <= {(s, w) for s, w in ours}, key


PROGRAM_PLAN_CASES: list[tuple[str, dict[str, str], dict[str, bytes], set[str], set[str]]] = [
    (
        "core.fsmonitor and a filter in the work tree: read-only; missing ones unmade",
        {f"{CWD}/tools/fsm.sh": "file", f"{CWD}/tools/clean": "file"},
        {
            f"{CWD}/.git/config": b'[core]\nfsmonitor = tools/fsm.sh\n[filter "x"]\n'
            b"clean = tools/clean %f\nsmudge = ./tools/smudge\n"
        },
        {f"{CWD}/tools/fsm.sh", f"{CWD}/tools/clean"},
        # git run inside .git (no work tree) runs them from there
        {f"{CWD}/tools/smudge", *(f"{CWD}/.git/tools/{n}" for n in ("smudge", "clean", "fsm.sh"))},
    ),
    (
        "an alias, a pager and a textconv in an included file, through a symlink",
        {
            f"{CWD}/team.cfg": "file",
            f"{CWD}/bin": "-> scripts",
            f"{CWD}/scripts/al": "file",
            f"{CWD}/scripts/tc": "file",
        },
        {
            f"{CWD}/.git/config": b"[include]\npath = ../team.cfg\n",
            f"{CWD}/team.cfg": b'[alias]\nal = !bin/al\n[diff "d"]\ntextconv = sh bin/tc\n'
            b"[core]\npager = /opt/less\n",
        },
        {f"{CWD}/team.cfg", f"{CWD}/scripts/al", f"{CWD}/scripts/tc"},
        {f"{CWD}/bin"},
    ),
    (
        "a submodule's git dir: its config's programs, hooks of .git/modules",
        {
            f"{CWD}/.git/modules/sub/HEAD": "file",
            f"{CWD}/.git/modules/sub/config": "file",
            f"{CWD}/.git/modules/sub/hooks/pre-commit": "file",
            f"{CWD}/sub/.git": "file",
            f"{CWD}/sub/fsm": "file",
        },
        {
            f"{CWD}/sub/.git": b"gitdir: ../.git/modules/sub\n",
            f"{CWD}/.git/modules/sub/config": b"[core]\nfsmonitor = ./fsm\n"
            b"worktree = ../../../sub\n",
        },
        {f"{CWD}/sub/fsm", f"{CWD}/.git/modules/sub/hooks", f"{CWD}/.git/modules/sub/config"},
        {f"{CWD}/.git/modules/sub/fsm"},
    ),
]


@pytest.mark.parametrize(
    ("entries", "data", "ro", "refused"),
    [c[1:] for c in PROGRAM_PLAN_CASES],
    ids=[c[0] for c in PROGRAM_PLAN_CASES],
)
def test_what_a_program_setting_names_is_protected(
    entries: dict[str, str], data: dict[str, bytes], ro: set[str], refused: set[str]
) -> None:
    p = plan({**REPO, **entries}, data)
    assert ro <= read_only(p), read_only(p)
    assert any(m.op == "bind" and m.path == CWD for m in p.mounts)
    assert refused <= unmade(p), unmade(p)


def test_programs_of_the_user_config_count_in_every_repository() -> None:
    """``~/.gitconfig``'s ``core.fsmonitor = tools/fsm`` names a file in each repository."""
    p = plan(
        {**REPO, f"{HOME}/.gitconfig": "file", f"{CWD}/tools/fsm": "file"},
        {f"{HOME}/.gitconfig": b"[core]\n\tfsmonitor = tools/fsm\n"},
        git_configs=(f"{HOME}/.gitconfig",),
    )
    assert f"{CWD}/tools/fsm" in read_only(p)
