"""Jujutsu (jj) repositories in writable roots, in real launches through the CLI (F-SET-5, F-BE-5).

As root and as an unprivileged user. jj is not installed here, so these tests are
path-based: what jj reads as config, or follows to config, is laid out on the host as
jj lays it out, and each attack must leave it as it was, with no new name among it.
jj reads a repository's ``.jj/repo/config.toml`` and a workspace's
``.jj/workspace-config.toml`` (before 0.38; later ones migrate them on sight), and
follows ``.jj/repo/config-id`` and ``.jj/workspace-config-id`` to the config it keeps
in the user's config directory, a secondary workspace's ``.jj/repo`` *file* to another
repository, and ``.jj/repo/store/git_target`` to the git repository its backend runs
``git fetch``/``push`` in. Its config runs commands (``ui.pager``, ``fix.tools``,
``merge-tools``, ``signing``, aliases): the user config too, ``~/.jjconfig.toml``,
``~/.config/jj`` (or below ``$XDG_CONFIG_HOME``) and ``$JJ_CONFIG``. jj's own writes in
``.jj`` (its store, operation log and working-copy state) stay allowed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import World

pytestmark = pytest.mark.sandbox

CONFIG = '[ui]\\npager = ["sh", "-c", "touch PWNED"]\\n'  # what each attack plants
CONFIG_ID = "0123456789abcdef0123"  # 10 random bytes in hex, as jj writes one
EVIL_ID = "ffffffffffffffffffff"

# what jj reads as config or follows to it, relative to a workspace (see the module doc)
JJ_NAMES = (
    ".jj/repo/config.toml",
    ".jj/repo/config-id",
    ".jj/workspace-config.toml",
    ".jj/workspace-config-id",
    ".jj/repo",
    ".jj/repo/store/git_target",
    ".jj",
)


def _repository(world: World, rel: str, *, configured: bool) -> Path:
    """A jj repository (git backend) as jj 0.38 lays it out; ``configured``: with the
    legacy config files and the config ids besides, and with the git repository in
    ``.jj/repo/store/git`` (``jj git init``); else beside ``.jj`` (``--colocate``)."""
    git = ".jj/repo/store/git" if configured else ".git"
    for name, content in (
        ("HEAD", "ref: refs/heads/main\n"),
        ("config", "[core]\n\tbare = true\n"),
        ("hooks/pre-push.sample", ""),
        ("objects/info/packs", ""),
        ("refs/heads/.keep", ""),
    ):
        world.mkfile(f"{rel}/{git}/{name}", content)
    for name, content in (
        ("repo/store/type", "git"),
        ("repo/store/git_target", "git" if configured else "../../../.git"),
        ("repo/store/extra/ab12", ""),
        ("repo/op_store/type", "simple_op_store"),
        ("repo/op_store/operations/cd34", ""),
        ("repo/op_heads/heads/ef56", ""),
        ("repo/index/type", "default"),
        ("working_copy/type", "local"),
        ("working_copy/tree_state", ""),
        ("working_copy/checkout", ""),
    ):
        world.mkfile(f"{rel}/.jj/{name}", content)
    if configured:
        world.mkfile(f"{rel}/.jj/repo/config.toml", "[user]\nname = 'owner'\n")
        world.mkfile(f"{rel}/.jj/repo/config-id", CONFIG_ID)
        world.mkfile(f"{rel}/.jj/workspace-config.toml", "[ui]\ncolor = 'never'\n")
        world.mkfile(f"{rel}/.jj/workspace-config-id", CONFIG_ID)
    return world.root / rel


def _secondary_workspace(world: World, rel: str, repo: Path) -> Path:
    """What ``jj workspace add`` makes: a .jj whose ``repo`` is a file naming the
    repository's ``.jj/repo`` (a relative path since jj 0.39)."""
    world.mkfile(f"{rel}/.jj/repo", os.path.relpath(repo / ".jj/repo", world.root / rel / ".jj"))
    world.mkfile(f"{rel}/.jj/working_copy/type", "local")
    world.mkfile(f"{rel}/.jj/working_copy/tree_state", "")
    return world.root / rel


def _state(top: Path) -> dict[str, object]:
    """What jj reads at ``top``: each name's kind and content, or None if missing (a
    ``.jj`` directory counts as missing: only one that leads elsewhere matters)."""
    out: dict[str, object] = {}
    for name in JJ_NAMES:
        path = top / name
        if path.is_symlink():
            out[name] = ("symlink", os.readlink(path))
        elif path.is_file():
            out[name] = ("file", path.read_bytes())
        else:
            out[name] = "dir" if path.is_dir() and name != ".jj" else None
    return out


def _sandboxed(world: World, script: str, *writable: str) -> subprocess.CompletedProcess[str]:
    s = world.settings({"filesystem": {"allowWrite": list(writable or (".",))}})
    return world.sandhold("-s", str(s), "--", "sh", "-c", script)


# a write into an existing file that makes no name (no O_CREAT): only the mounts see it
WRITE = (
    'python3 -c "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC); '
    'os.write(fd, sys.argv[2].encode())" '
)
# an evil repository's directory, made outside any .jj (allowed), to point jj at
EVIL = 'mkdir -p evil/store && printf "$CONFIG" > evil/config.toml && echo git > evil/store/type'
ATTACKS = {
    # the user's configured repository: each file rewritten, appended to, replaced
    "append_to_repo_config": ("old", 'printf "$CONFIG" >> old/.jj/repo/config.toml'),
    "rewrite_repo_config": ("old", WRITE + 'old/.jj/repo/config.toml "$(printf "$CONFIG")"'),
    "rename_onto_repo_config": ("old", 'printf "$CONFIG" > x && mv -f x old/.jj/repo/config.toml'),
    "rewrite_config_id": ("old", WRITE + f"old/.jj/repo/config-id {EVIL_ID}"),
    "rename_onto_config_id": ("old", f"echo {EVIL_ID} > x && mv -f x old/.jj/repo/config-id"),
    "remove_config_id": ("old", "rm -f old/.jj/repo/config-id"),
    "rewrite_workspace_config": (
        "old",
        WRITE + 'old/.jj/workspace-config.toml "$(printf "$CONFIG")"',
    ),
    "rewrite_workspace_config_id": ("old", WRITE + f"old/.jj/workspace-config-id {EVIL_ID}"),
    "rewrite_git_target": ("old", EVIL + " && " + WRITE + 'old/.jj/repo/store/git_target "$PWD"'),
    "rename_onto_git_target": (
        "old",
        'echo "$PWD/evil" > x && mv -f x old/.jj/repo/store/git_target',
    ),
    # a repository with no config yet (jj 0.38's, or jj git init's): nothing can be added
    "create_repo_config": ("new", 'printf "$CONFIG" > new/.jj/repo/config.toml'),
    "create_config_id": ("new", f"echo {EVIL_ID} > new/.jj/repo/config-id"),
    "create_workspace_config": ("new", 'printf "$CONFIG" > new/.jj/workspace-config.toml'),
    "create_workspace_config_id": ("new", f"echo {EVIL_ID} > new/.jj/workspace-config-id"),
    "rename_onto_missing_repo_config": (
        "new",
        'printf "$CONFIG" > x && mv x new/.jj/repo/config.toml',
    ),
    "hard_link_as_repo_config": (
        "new",
        'printf "$CONFIG" > new/x && ln new/x new/.jj/repo/config.toml',
    ),
    # (symlinks that stay in the work tree: one out of it is refused anyway)
    "symlink_as_repo_config": (
        "new",
        'printf "$CONFIG" > new/x && ln -s ../../x new/.jj/repo/config.toml',
    ),
    "symlink_as_workspace_config_id": (
        "new",
        f"echo {EVIL_ID} > new/id && ln -s ../id new/.jj/workspace-config-id",
    ),
    # the .jj or its repo moved aside, configured there and moved back
    "configure_dot_jj_moved_aside": (
        "new",
        'mv new/.jj new/aside; printf "$CONFIG" > new/aside/repo/config.toml; mv new/aside new/.jj',
    ),
    "configure_repo_moved_aside": (
        "new",
        'mv new/.jj/repo new/.jj/aside; printf "$CONFIG" > new/.jj/aside/config.toml; '
        "mv new/.jj/aside new/.jj/repo",
    ),
    "replace_repo_by_a_configured_one": (
        "new",
        EVIL + " && mv new/.jj/repo new/.jj/old-repo; mv evil new/.jj/repo",
    ),
    # a secondary workspace's pointer: at an evil repository instead
    "rewrite_workspace_pointer": ("ws", EVIL + " && " + WRITE + 'ws/.jj/repo "$PWD/evil"'),
    "rename_onto_workspace_pointer": (
        "ws",
        EVIL + ' && echo "$PWD/evil" > x && mv -f x ws/.jj/repo',
    ),
    "remove_workspace_pointer": ("ws", 'rm -f ws/.jj/repo && echo "$PWD/evil" > ws/.jj/repo'),
    # a new pointer, or a .jj symlink, where jj would find them
    "pointer_in_a_new_workspace": (
        "new",
        EVIL + ' && mkdir -p new/sub/.jj && echo "$PWD/evil" > new/sub/.jj/repo',
    ),
    "symlink_as_repo": (
        "new",
        'mkdir -p new/sub/.jj new/evil && printf "$CONFIG" > new/evil/config.toml && '
        "ln -s ../../evil new/sub/.jj/repo",
    ),
    "dot_jj_symlink": (
        "new",
        "mkdir -p new/sub new/elsewhere/repo && ln -s ../elsewhere new/sub/.jj",
    ),
}


@pytest.mark.parametrize(("repo", "script"), ATTACKS.values(), ids=list(ATTACKS))
def test_no_config_reaches_an_existing_repository(world: World, repo: str, script: str) -> None:
    """``old`` has config files and ids, ``new`` none (``jj git init --colocate``
    makes none: its git repository is the .git beside), ``ws``
    is a secondary workspace of ``old`` (its ``.jj/repo`` names old's)."""
    old = _repository(world, "work/old", configured=True)
    new = _repository(world, "work/new", configured=False)
    ws = _secondary_workspace(world, "work/ws", old)
    tops = (old, new, ws, world.work / "new/sub")
    before = {top: _state(top) for top in tops}
    r = _sandboxed(world, f'CONFIG="{CONFIG}"; {script}; echo done')
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1:] == ["done"], (r.stdout, r.stderr)
    for top in tops:
        assert _state(top) == before[top], top
    refusals = ("Permission denied", "Read-only file system", "Device or resource busy")
    assert any(e in r.stderr for e in refusals), r.stderr


def test_jj_keeps_working_in_its_repository(world: World) -> None:
    """What jj writes as it works (its store, operation log, op heads, index and
    working-copy state; new files renamed into place) stays writable, in an existing
    repository and in one made during the run, and so does a file named like jj's
    config outside any .jj."""
    old = _repository(world, "work/old", configured=True)
    script = (
        "set -e; cd old/.jj; "
        "echo op > repo/op_store/operations/.tmp1 && "
        "mv repo/op_store/operations/.tmp1 repo/op_store/operations/9a9a; "
        "echo h > repo/op_heads/heads/.tmp2 && "
        "mv -f repo/op_heads/heads/.tmp2 repo/op_heads/heads/ef56; "
        "mkdir -p repo/index/operations && echo i > repo/index/operations/1; "
        "echo e > repo/store/extra/cdcd; echo objects > repo/store/git/objects/info/packs; "
        "echo t > working_copy/.tmp3 && mv -f working_copy/.tmp3 working_copy/tree_state; "
        "echo c > working_copy/checkout; "
        "cd ../..; mkdir -p fresh/.jj/repo/store fresh/.jj/working_copy; "
        "echo git > fresh/.jj/repo/store/type; echo git > fresh/.jj/repo/store/git_target; "
        "echo local > fresh/.jj/working_copy/type; "
        "mkdir -p tools && echo x > tools/config.toml && echo y > tools/repo; echo ok"
    )
    r = _sandboxed(world, script)
    assert r.returncode == 0 and r.stdout.split() == ["ok"], (r.stdout, r.stderr)
    assert (old / ".jj/repo/op_store/operations/9a9a").read_text() == "op\n"
    assert (old / ".jj/working_copy/tree_state").read_text() == "t\n"
    assert (world.work / "fresh/.jj/repo/store/git_target").read_text() == "git\n"
    assert (world.work / "tools/config.toml").read_text() == "x\n"


def test_no_repository_is_made_inside_an_existing_jj_work_tree(world: World) -> None:
    """A jj work tree that existed before the run is the user's like a git or hg one:
    no repository is made in it (jj in a subdirectory would use the new one, and ``jj
    git push`` run git, with its hooks, in the git repository it keeps), nor a ``.jj``
    in a git work tree (``jj git init --colocate`` in your git project). Elsewhere,
    and inside one made during the run, a new ``.jj`` is jj's to make."""
    _repository(world, "work/proj", configured=True)
    world.mkdir("work/proj/src")
    world.mkdir("work/gitproj")
    r = world.ident.run(["git", "init", "-q", "."], cwd=world.work / "gitproj", env=world.env())
    assert r.returncode == 0, r.stderr
    steps = {
        "jj_in_jj": "mkdir proj/src/.jj",
        "jj_deep": "mkdir -p proj/new/dir/.jj",
        "renamed": "mkdir staging && mv staging proj/src/.jj",
        "git_in_jj": "git init -q proj/src",
        "hg_in_jj": "hg init proj/src",
        "jj_in_git": "mkdir -p gitproj/sub && mkdir gitproj/sub/.jj",
        "jj_beside_git": "mkdir gitproj/.jj",
        "link_out": "ln -s ../elsewhere proj/lib",
        "elsewhere": "mkdir -p elsewhere/.jj/repo/store",
        "nested_fresh": "mkdir -p elsewhere/sub/.jj",
        "link_within": "ln -s src proj/src2",
    }
    script = "".join(f"( {cmd} ) 2>/dev/null; echo {name}=$?; " for name, cmd in steps.items())
    r = _sandboxed(world, script)
    codes = dict(line.split("=") for line in r.stdout.split())
    ok = {"elsewhere", "nested_fresh", "link_within"}
    assert {n for n, c in codes.items() if c == "0"} == ok, (r.stdout, r.stderr)
    assert set(codes) == set(steps)
    for d in ("proj/src", "proj/new/dir", "gitproj/sub", "gitproj"):
        for repo in (".jj", ".git", ".hg"):
            if (d, repo) != ("gitproj", ".git"):
                assert not os.path.lexists(world.work / d / repo), (d, repo)
    assert not os.path.lexists(world.work / "proj/lib")


def test_no_command_reaches_the_users_jj_config(world: World) -> None:
    """With the home writable: ``~/.jjconfig.toml``, ``~/.config/jj`` whole (config.toml,
    conf.d/, and the per-repository config of jj 0.38 in repos/<id>/), the same below
    ``$XDG_CONFIG_HOME``, and what ``$JJ_CONFIG`` names can be neither edited nor made."""
    home = world.home
    world.mkfile("home/.jjconfig.toml", "[user]\nname = 'owner'\n")
    world.mkfile(f"home/.config/jj/repos/{CONFIG_ID}/config.toml", "[user]\nname = 'r'\n")
    world.mkfile(f"home/.config/jj/repos/{CONFIG_ID}/metadata.binpb", "")
    xdg = world.mkdir("home/xdg")
    listed = world.mkfile("home/dotfiles/jj.toml", "[user]\nname = 'd'\n")
    world.mkdir("home/proj")
    before = _tree(home)
    attacks = {
        "user": 'printf "$CONFIG" >> ~/.jjconfig.toml',
        "user_rename": 'printf "$CONFIG" > x && mv -f x ~/.jjconfig.toml',
        "repo": f'printf "$CONFIG" >> ~/.config/jj/repos/{CONFIG_ID}/config.toml',
        "new_id": f'mkdir -p ~/.config/jj/repos/{EVIL_ID} && printf "$CONFIG" > '
        f"~/.config/jj/repos/{EVIL_ID}/config.toml",
        "platform": 'printf "$CONFIG" > ~/.config/jj/config.toml',
        "conf_d": 'mkdir -p ~/.config/jj/conf.d && printf "$CONFIG" > ~/.config/jj/conf.d/z.toml',
        "move": "mv ~/.config/jj ~/.config/jj2",
        "xdg": 'mkdir -p ~/xdg/jj && printf "$CONFIG" > ~/xdg/jj/config.toml',
        "xdg_link": "ln -s ~/proj ~/xdg/jj",
        "jj_config": 'printf "$CONFIG" >> ~/dotfiles/jj.toml',
        "jj_config_dir": 'mkdir -p ~/jjconf.d && printf "$CONFIG" > ~/jjconf.d/a.toml',
        "elsewhere": "echo fine > ~/.config/other",
    }
    script = f'CONFIG="{CONFIG}"; ' + "".join(
        f"( {cmd} ) 2>/dev/null; echo {name}=$?; " for name, cmd in attacks.items()
    )
    # ~/.config granted by name (else a writable home's dot entries stay read-only)
    s = world.settings({"filesystem": {"allowWrite": ["~", "~/.config"]}})
    env = world.env(XDG_CONFIG_HOME=str(xdg), JJ_CONFIG=f"{listed}:{home}/jjconf.d")
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, cwd=home / "proj", env=env)
    codes = dict(line.split("=") for line in r.stdout.split())
    assert codes.pop("elsewhere") == "0", (r.stdout, r.stderr)
    assert all(code != "0" for code in codes.values()), (r.stdout, r.stderr)
    assert set(codes) == set(attacks) - {"elsewhere"}
    after = _tree(home)
    assert after.pop(".config/other") == ("file", b"fine\n")
    after.pop("proj/x", None)  # the attacks' own scratch file
    assert after == before


def _tree(top: Path) -> dict[str, tuple[str, bytes | str | None]]:
    out: dict[str, tuple[str, bytes | str | None]] = {}
    for d, dirs, files in os.walk(top):
        for name in (*dirs, *files):
            path = Path(d) / name
            rel = str(path.relative_to(top))
            if path.is_symlink():
                out[rel] = ("symlink", os.readlink(path))
            elif path.is_file():
                out[rel] = ("file", path.read_bytes())
            else:
                out[rel] = ("dir", None)
    return out
