"""A writable home is full of start-up files: every dot entry stays read-only (issue 16).

With ``allowWrite: ["~"]`` a red-team run bound Enter to a command in ``~/.inputrc``
(the host's next interactive bash ran it, ``--norc`` too) and made ``~/.git`` with a
``core.fsmonitor`` (run by any git command in any directory of the home). A list of
names always misses one, so the model fails closed (``mandatory.HOME_GRANTED``):
under a writable home every top-level dot entry stays read-only and no new one is
made, unless the user names it or it is one of the data places tools write. Tested
on the plan, on the supervisor's rule, and through the CLI and the port, as root
and unprivileged, against a table of real start-up files of common tools.
"""

from __future__ import annotations

import pytest

from conftest import World
from fakehost import FakeHost
from sandhold.policy import mandatory
from sandhold.policy.creation import Decider, creation_policy
from sandhold.policy.fsplan import FsPlan, FsRequest, plan_filesystem
from sandhold.policy.refusal import HOME_DOT

H = "/home/u"

# start-up files and config of common tools that run commands: (path below ~, tool)
STARTUP = [
    (".inputrc", "readline (bash, even --norc)"),
    (".bashrc", "bash"),
    (".profile", "sh at login"),
    (".gitconfig", "git"),
    (".config/mise/config.toml", "mise (hooks, tasks)"),
    (".config/direnv/direnvrc", "direnv"),
    (".gdbinit", "gdb"),
    (".psqlrc", "psql (\\! runs commands)"),
    (".Rprofile", "R"),
    (".irbrc", "irb"),
    (".sqliterc", "sqlite3 (.shell)"),
    (".screenrc", "screen"),
    (".config/starship.toml", "starship (custom commands)"),
    (".config/fish/config.fish", "fish"),
    (".wgetrc", "wget"),
    (".curlrc", "curl"),
    (".pythonrc", "python ($PYTHONSTARTUP)"),
    (".npmrc", "npm"),
]


def _plan(entries: dict[str, str], allow_write: tuple[str, ...] = ("~",)) -> FsPlan:
    host = FakeHost({"/p": "dir", "/t": "dir", H: "dir", **entries})
    req = FsRequest(
        cwd=H, home=H, tmpdir="/t", private_root="/p", allow_write=allow_write, supervised=True
    )
    return plan_filesystem(req, host)


def _writable(p: FsPlan, path: str) -> bool:
    """What the deepest mount at or above ``path`` leaves it."""
    found = None
    for m in p.mounts:
        if m.op in ("bind", "ro-bind") and (path == m.path or path.startswith(m.path + "/")):
            found = m.op
    return found == "bind"


@pytest.mark.parametrize(("rel", "tool"), STARTUP, ids=[r for r, _ in STARTUP])
def test_an_existing_start_up_file_stays_read_only(rel: str, tool: str) -> None:
    p = _plan({f"{H}/{rel}": "file", f"{H}/notes.txt": "file", f"{H}/.cache/pip/x": "file"})
    assert not _writable(p, f"{H}/{rel}"), tool
    assert _writable(p, f"{H}/notes.txt") and _writable(p, f"{H}/.cache/pip/x")


def test_granted_and_named_dot_entries_stay_writable() -> None:
    entries = {f"{H}/.cache/x": "file", f"{H}/.config/app/x": "file", f"{H}/.config/y": "file"}
    p = _plan(entries, allow_write=("~", "~/.config/app", "~/.newtool"))
    assert _writable(p, f"{H}/.cache/x") and _writable(p, f"{H}/.config/app/x")
    assert not _writable(p, f"{H}/.config/y")  # beside the root named inside it
    assert p.home_dots == (H,)
    assert {".cache", ".npm", ".newtool"} <= set(p.home_grants)
    assert ".config" not in p.home_grants
    # the home not writable: no rule
    assert _plan(entries, allow_write=("~/.cache",)).home_dots == ()


def _decider(grants: tuple[str, ...] = ()) -> Decider:
    return Decider(
        creation_policy(
            writable_roots=(H,),
            cwd=H,
            home=H,
            home_dots=(H,),
            home_grants=(*(n for n, _ in mandatory.HOME_GRANTED), *grants),
        )
    )


@pytest.mark.parametrize(
    ("path", "directory", "refused"),
    [
        (f"{H}/.inputrc", False, True),
        (f"{H}/.git", True, True),
        (f"{H}/.config", True, True),
        (f"{H}/.local", True, True),
        (f"{H}/.cache", True, False),
        (f"{H}/.cache/.x", False, False),  # below a granted one: the other rules' call
        (f"{H}/.newtool", True, False),  # named by the user
        (f"{H}/notes.txt", False, False),
        (f"{H}/proj/.eslintrc", False, False),  # not at the top of the home
    ],
)
def test_the_supervisor_refuses_new_dot_names(path: str, directory: bool, refused: bool) -> None:
    reason = _decider((".newtool",)).denied(path, directory=directory)
    assert (reason is not None and reason.rule == mandatory.HOME_DOT_REASON) is refused, reason
    assert reason is None or reason.kind == HOME_DOT


@pytest.mark.sandbox
def test_start_up_files_of_a_writable_home(world: World) -> None:
    """Each start-up file of the table, where it exists (it stays as it was) and where it
    does not (it is not made); ordinary work in the home still works."""
    home = world.home
    mark = world.root / "PWNED"
    existing = STARTUP[::2]
    missing = STARTUP[1::2]
    for rel, _ in existing:
        world.mkfile(f"home/{rel}", "# mine\n")
    s = world.settings({"filesystem": {"allowWrite": ["~"]}})
    lines = []
    for i, (rel, _) in enumerate(STARTUP):
        parent = rel.rpartition("/")[0]
        mk = f"mkdir -p ~/{parent} 2>/dev/null; " if parent else ""
        lines.append(f"{mk}echo 'touch {mark}' >> ~/{rel}; echo f{i}=$?")
    lines += [
        "git init -q ~ 2>/dev/null; echo init=$?",
        f"mkdir -p x/.git && printf '[core]\\n\\tfsmonitor = touch {mark}; false #\\n' "
        "> x/.git/config && mv x/.git ~/.git; echo moved_git=$?",
        "mv ~/.inputrc ~/.inputrc-old 2>/dev/null; echo move=$?",
        "echo fine > ~/notes.txt && mkdir -p ~/.cache/pip ~/proj && echo ok > ~/proj/a; echo ok=$?",
    ]
    r = world.sandhold("-s", str(s), "--", "sh", "-c", "; ".join(lines), cwd=home)
    got = dict(line.split("=") for line in r.stdout.split())
    assert got.pop("ok") == "0", (r.stdout, r.stderr)
    assert "0" not in got.values(), got
    for rel, _ in existing:
        assert (home / rel).read_text() == "# mine\n", rel
    for rel, _ in missing:
        assert not (home / rel).exists(), rel
    assert not (home / ".git").exists() and not (home / ".inputrc-old").exists()
    # on the host: an interactive shell, and git in a directory of the home
    env = world.env(HOME=str(home))
    world.ident.run(["bash", "--norc", "-ic", "true"], cwd=home, env=env)
    world.ident.run(["git", "status"], cwd=home / "proj", env=env)
    assert not mark.exists()


@pytest.mark.sandbox
def test_a_dot_entry_named_in_allow_write_is_writable(world: World) -> None:
    home = world.home
    world.mkfile("home/.config/app/state.json", "{}\n")
    world.mkfile("home/.config/other.toml", "x\n")
    s = world.settings({"filesystem": {"allowWrite": ["~", "~/.config/app", "~/.tool"]}})
    script = (
        "echo '{\"a\":1}' > ~/.config/app/state.json; echo app=$?; "
        "echo y > ~/.config/other.toml; echo other=$?; "
        "mkdir ~/.tool && echo z > ~/.tool/data; echo tool=$?; "
        "mkdir -p ~/.cache && echo c > ~/.cache/x; echo cache=$?"
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, cwd=home)
    assert r.stdout.split() == ["app=0", "other=2", "tool=0", "cache=0"], r.stderr
    assert (home / ".config/other.toml").read_text() == "x\n"


# mise's project config spellings (mandatory.mise_config): (path, is one)
MISE = [
    ("/w/mise.toml", True),
    ("/w/.mise.toml", True),
    ("/w/mise.local.toml", True),
    ("/w/rtx.toml", True),
    ("/w/mise.production.toml", True),
    ("/w/.mise.dev.local.toml", True),
    ("/w/mise/config.toml", True),
    ("/w/mise/config.staging.toml", True),
    ("/w/mise/mise.toml", True),
    ("/w/mise/conf.d", True),
    ("/w/mise/conf.d/a.toml", True),
    ("/w/.config/mise", True),
    ("/w/.config/mise/config.toml", True),
    ("/w/.config/mise/conf.d/x.toml", True),
    ("/w/.config/mise.toml", True),
    ("/w/.config/mise.ci.toml", True),
    ("/w/.mise/config.toml", False),  # .mise: a protected directory by name already
    ("/w/mise/README.md", False),
    ("/w/src/mise.rs", False),
    ("/w/mise..toml", False),
    ("/w/.config/other.toml", False),
]


@pytest.mark.parametrize(("path", "expected"), MISE, ids=[p for p, _ in MISE])
def test_mise_config_spellings(path: str, expected: bool) -> None:
    parts = path.split("/")
    named = mandatory.mise_config(parts) or mandatory.mandatory_reason(parts[-1])
    assert (named is not None) is expected
    reason = Decider(creation_policy(writable_roots=("/w",), cwd="/w", home=H)).denied(path)
    if expected:
        assert reason is not None
    if path.startswith("/w/mise/") or path.startswith("/w/.config/"):
        entries = {path: "file"} if expected else {}
        if entries:
            host = FakeHost({"/p": "dir", "/t": "dir", "/w": "dir", **entries})
            req = FsRequest(cwd="/w", home=H, tmpdir="/t", private_root="/p", allow_write=("/w",))
            p = plan_filesystem(req, host)
            assert not _writable(p, path), (parts, p.mounts)


@pytest.mark.sandbox
def test_mise_config_in_every_spelling_stays_as_it_is(world: World) -> None:
    proj = world.mkdir("work/proj")
    world.mkfile("work/proj/mise/config.toml", "[tools]\n")
    world.mkfile("work/proj/.config/mise/conf.d/a.toml", "[tools]\n")
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    hook = "[hooks]\\nenter = 'touch x'\\n"
    script = (
        f'printf "{hook}" >> mise/config.toml; echo existing=$?; '
        f'printf "{hook}" > .config/mise/conf.d/b.toml; echo confd=$?; '
        f'mkdir -p sub/mise && printf "{hook}" > sub/mise/config.toml; echo sub=$?; '
        f'printf "{hook}" > mise.production.toml; echo env=$?; '
        f'mkdir -p sub/.config && printf "{hook}" > sub/.config/mise.toml; echo dotconfig=$?; '
        "echo fine > notes.txt; echo other=$?"
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, cwd=proj)
    assert r.stdout.split() == [
        "existing=2",
        "confd=2",
        "sub=2",
        "env=2",
        "dotconfig=2",
        "other=0",
    ], r.stderr
    assert (proj / "mise/config.toml").read_text() == "[tools]\n"
    for made in ("sub/mise/config.toml", "mise.production.toml", ".config/mise/conf.d/b.toml"):
        assert not (proj / made).exists(), made
