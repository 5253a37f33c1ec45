"""Mercurial repositories in writable roots, in real launches through the CLI (F-SET-5, F-BE-5).

As root and as an unprivileged user, with ``hg`` inside the sandbox: the config hg
reads from a repository (``.hg/hgrc``, ``.hg/hgrc-not-shared``, and the
``.hg/sharedpath`` a share follows to another one's) can be neither edited nor
made, in any way, in the user's repositories or in one the sandbox makes; no
repository may be made inside an existing work tree. Each attack plants a hook,
and ``hg status`` on the host afterwards (a shell prompt runs one) must run none.
``hg init`` and ``hg commit`` still work outside the user's repositories.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import World

pytestmark = pytest.mark.sandbox  # hg is a test tool: scripts/setup --test installs it

PWNED = "PWNED"  # the file a planted hook makes, in the test's root (outside the sandbox's)
# hooks for what hg is run for on the host here (a shell prompt's status, a log)
HOOK = "[hooks]\\npre-status = touch {mark}\\npre-log = touch {mark}\\n"


def _env(world: World) -> dict[str, str]:
    # no system or user config: only the repository's own can run anything
    return world.env(HGRCPATH="", HGUSER="t", HGPLAIN="1")


def _hg(world: World, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """hg on the host, as the test's identity (hg ignores the hgrc of another user)."""
    return world.ident.run(["hg", *args], cwd=cwd, env=_env(world))


def _repository(world: World, rel: str, hgrc: str | None = None) -> Path:
    """An existing repository with one commit, owned by the test's identity."""
    top = world.mkdir(rel)
    for args in (["init"], ["add", "-q"], ["commit", "-q", "-m", "first"]):
        if args[0] == "add":
            world.mkfile(f"{rel}/a.txt", "a\n")
        r = _hg(world, *args, cwd=top)
        assert r.returncode == 0, r.stderr
    if hgrc is not None:
        world.mkfile(f"{rel}/.hg/hgrc", hgrc)
    return top


def _sandboxed(
    world: World, script: str, writable: tuple[str, ...] = (".",)
) -> subprocess.CompletedProcess[str]:
    s = world.settings({"filesystem": {"allowWrite": list(writable)}})
    return world.sandhold("-s", str(s), "--", "sh", "-c", script, env=_env(world))


def _no_hook_ran(world: World, *where: Path) -> None:
    for top in where:
        r = _hg(world, "status", cwd=top)
        assert r.returncode == 0, r.stderr
        assert not (world.root / PWNED).exists(), f"a planted hook ran at {top}"


# a write into an existing file that makes no name (no O_CREAT): only the mounts see it
WRITE = (
    'python3 -c "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC); '
    'os.write(fd, sys.argv[2].encode())" '
)
ATTACKS = {
    # the red-team demo: a hook appended to the repository's existing config
    "append_to_existing_hgrc": ("old", 'printf "$HOOK" >> old/.hg/hgrc'),
    "rewrite_existing_hgrc": ("old", WRITE + 'old/.hg/hgrc "$(printf "$HOOK")"'),
    "rename_onto_existing_hgrc": ("old", 'printf "$HOOK" > x && mv -f x old/.hg/hgrc'),
    "create_missing_hgrc": ("new", 'printf "$HOOK" > new/.hg/hgrc'),
    "rename_onto_missing_hgrc": ("new", 'printf "$HOOK" > x && mv x new/.hg/hgrc'),
    "hard_link_as_hgrc": ("new", 'printf "$HOOK" > x && ln x new/.hg/hgrc'),
    "create_hgrc_not_shared": ("new", 'printf "$HOOK" > new/.hg/hgrc-not-shared'),
    # a share's pointer to another .hg, whose hgrc hg reads (share-safe, hg's default)
    "point_sharedpath_elsewhere": (
        "new",
        "mkdir evil && cp -r new/.hg/store new/.hg/requires evil/ && "
        'printf "$HOOK" > evil/hgrc && echo "$PWD/evil" > new/.hg/sharedpath && '
        "echo shared >> new/.hg/requires",
    ),
    "rewrite_existing_sharedpath": (
        "share",
        "mkdir evil && cp -r old/.hg/store old/.hg/requires evil/ && "
        'printf "$HOOK" > evil/hgrc && ' + WRITE + 'share/.hg/sharedpath "$PWD/evil"',
    ),
    # the .hg moved aside, configured there and moved back (then put back unconfigured)
    "configure_dot_hg_moved_aside": (
        "new",
        'mv new/.hg new/aside && printf "$HOOK" > new/aside/hgrc && mv new/aside new/.hg; '
        "mv new/aside/hgrc new/hgrc-was-here && mv new/aside new/.hg",
    ),
    # a repository of the sandbox's own inside the user's: hg on the host would use it
    "hg_init_in_new_subdirectory": (
        "new",
        'mkdir new/sub && hg init new/sub && printf "$HOOK" > new/sub/.hg/hgrc',
    ),
    "dot_hg_symlink_in_new_subdirectory": (
        "new",
        'mkdir -p new/sub evil && printf "$HOOK" > evil/hgrc && ln -s ../../evil new/sub/.hg',
    ),
}


@pytest.mark.parametrize(("repo", "script"), ATTACKS.values(), ids=list(ATTACKS))
def test_no_hook_reaches_an_existing_repository(world: World, repo: str, script: str) -> None:
    """``old`` has a config of its own, ``new`` none yet (``hg init`` makes none),
    ``share`` is an ``hg share`` of ``old`` (its store and config are old's)."""
    if repo == "new":
        top = _repository(world, "work/new")
    else:
        old = _repository(world, "work/old", hgrc="[ui]\nusername = owner\n")
        top = world.work / repo
        if repo == "share":
            r = _hg(world, "--config", "extensions.share=", "share", "-q", str(old), str(top),
                    cwd=world.work)  # fmt: skip
            assert r.returncode == 0, r.stderr
    before = _config(top)
    hook = HOOK.format(mark=world.root / PWNED)
    r = _sandboxed(world, f'HOOK="{hook}"; {script}; hg status -R {repo} && echo hg-ok')
    assert r.returncode == 0, r.stderr
    assert _config(top) == before
    assert not os.path.lexists(top / "sub/.hg")
    _no_hook_ran(world, top, *([top / "sub"] if (top / "sub").is_dir() else []))
    assert r.stdout.splitlines()[-1:] == ["hg-ok"], (r.stdout, r.stderr)  # hg works in it
    refusals = ("Permission denied", "Read-only file system", "Device or resource busy")
    assert any(e in r.stderr for e in refusals), r.stderr


@pytest.mark.parametrize("existing", [True, False], ids=["existing", "missing"])
def test_no_hook_reaches_the_users_hg_config(world: World, existing: bool) -> None:
    """hg reads ~/.hgrc in every repository, as git reads ~/.gitconfig: a sandbox that
    may write the home directory can neither edit nor make it."""
    top = _repository(world, "work/new")
    if existing:
        world.mkfile("home/.hgrc", "[ui]\nusername = owner\n")
    before = (world.home / ".hgrc").read_bytes() if existing else None
    hook = HOOK.format(mark=world.root / PWNED)
    script = (
        f'HOOK="{hook}"; printf "$HOOK" >> ~/.hgrc; printf "$HOOK" > x && mv x ~/.hgrc; '
        + WRITE
        + '~/.hgrc "$(printf "$HOOK")"; hg status -R new && echo hg-ok'
    )
    r = _sandboxed(world, script, writable=(".", "~"))
    assert r.returncode == 0, r.stderr
    after = (world.home / ".hgrc").read_bytes() if (world.home / ".hgrc").exists() else None
    assert after == before
    # hg with the user's own config this time
    status = world.ident.run(["hg", "status"], cwd=top, env=world.env(HGPLAIN="1"))
    assert status.returncode == 0, status.stderr
    assert not (world.root / PWNED).exists()
    assert r.stdout.splitlines()[-1:] == ["hg-ok"], (r.stdout, r.stderr)


def _config(top: Path) -> dict[str, bytes]:
    """What hg reads from a repository's .hg as config, or follows to another's."""
    names = ("hgrc", "hgrc-not-shared", "sharedpath")
    return {n: (top / ".hg" / n).read_bytes() for n in names if (top / ".hg" / n).exists()}


def test_hg_init_and_commit_work_outside_any_repository(world: World) -> None:
    """A repository the sandbox makes works for hg in and out of the sandbox, and gets
    no config of its own: a hook cannot be planted in it either. ``hg clone`` writes an
    hgrc (``[paths] default``) last, so into a writable root it fails there (a known
    limit), leaving the copied repository for ``hg update``; into ``$TMPDIR`` it works."""
    hook = HOOK.format(mark=world.root / PWNED)
    script = (
        "hg init fresh && cd fresh && echo a > a.txt && hg add -q a.txt && "
        "hg commit -q -m first && echo b >> a.txt && hg commit -q -m second && "
        "hg log -T '{desc}\\n' && hg status && echo hg-ok; "
        f'printf "{hook}" > .hg/hgrc; cd .. && '
        'hg clone -q fresh "$TMPDIR/copy" && hg -R "$TMPDIR/copy" log -T "{rev}\\n" -l 1; '
        "hg clone -q fresh copy 2>/dev/null || echo clone-refused; "
        "hg -R copy update -q && cat copy/a.txt"
    )
    r = _sandboxed(world, script)
    assert r.returncode == 0, r.stderr
    lines = ["second", "first", "hg-ok", "1", "clone-refused", "a", "b"]
    assert r.stdout.splitlines() == lines, (r.stdout, r.stderr)
    fresh = world.work / "fresh"
    assert not (fresh / ".hg/hgrc").exists() and not (world.work / "copy/.hg/hgrc").exists()
    assert _hg(world, "log", "-T", "{desc} ", cwd=fresh).stdout == "second first "
    _no_hook_ran(world, fresh)
