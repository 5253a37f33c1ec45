"""What git config points git at, outside .git: no sandbox may plant it (F-SET-5).

Three ways the host's git ran what a sandbox wrote (review): (a) a hook that is a
symlink into the work tree, or a dangling one; (b) a config file pulled in with
``include.path`` or ``includeIf.<cond>.path``; (c) ``core.hooksPath`` pointing into
the work tree (``.githooks``, husky's ``.husky/_``). The same through git's own
configs (``~/.gitconfig``, ``$GIT_CONFIG_SYSTEM``), a repository above the
writable root and a linked worktree. Each runs as root and as an unprivileged
user; every way of writing is tried (write, rename onto, create, symlink, a
directory moved into place), and real git on the host runs afterwards and must
run nothing planted. Ordinary work, a commit from inside the sandbox included,
still works.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import World

pytestmark = pytest.mark.sandbox

# printf formats: a hook, and a config whose core.fsmonitor git runs at `git status`
HOOK = "#!/bin/sh\\ntouch {mark}\\n"
FSMON = "[core]\\n\\tfsmonitor = touch {mark}; false #\\n"
BENIGN = "#!/bin/sh\nexit 0\n"


def _host(world: World, argv: list[str], cwd: Path, **env: str) -> None:
    r = world.ident.run(argv, cwd=cwd, env=world.env(**env))
    assert r.returncode == 0, r.stderr


def _repo(world: World, rel: str, *config: tuple[str, str]) -> Path:
    path = world.mkdir(rel)
    _host(world, ["git", "init", "-q", "."], path)
    for key, value in (("user.name", "t"), ("user.email", "t@example.com"), *config):
        _host(world, ["git", "config", key, value], path)
    return path


def _exe(world: World, rel: str, content: str = BENIGN) -> Path:
    return world.mkfile(rel, content, mode=0o755)


def _run(world: World, script: str, cwd: Path, **env: str) -> list[str]:
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, cwd=cwd, env=world.env(**env))
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def _git_runs_nothing(world: World, repo: Path, mark: Path, **env: str) -> None:
    _host(world, ["git", "status", "--short"], repo, **env)
    _host(world, ["git", "commit", "-q", "--allow-empty", "-m", "host"], repo, **env)
    assert not mark.exists(), "the host's git ran what the sandbox planted"


def test_a_hook_linked_into_the_work_tree(world: World) -> None:
    """(a) ``.git/hooks/pre-commit -> ../../tools/pre-commit``: the target stays as it
    was; a dangling ``post-commit`` link's target cannot be made."""
    mark = world.root / "PWNED"
    proj = _repo(world, "home/proj")
    _exe(world, "home/proj/tools/pre-commit")
    world.symlink("home/proj/.git/hooks/pre-commit", "../../tools/pre-commit")
    world.symlink("home/proj/.git/hooks/post-commit", "../../tools/post-commit")
    hook = HOOK.format(mark=mark)
    script = (
        f"printf '{hook}' >> tools/pre-commit; echo append=$?; "
        f"printf '{hook}' > t1 && mv -f t1 tools/pre-commit; echo onto=$?; "
        "rm -f tools/pre-commit; echo rm=$?; "
        f"printf '{hook}' > tools/post-commit; echo create=$?; "
        "chmod +x t1 && mv t1 tools/post-commit; echo move=$?; "
        "ln -s ../t1 tools/post-commit; echo link=$?; "
        "mv tools tools2; echo dir=$?; "
        "echo fine > notes.txt; echo other=$?; "
        "git add notes.txt && git commit -qm work; echo commit=$?"
    )
    assert _run(world, script, proj) == [
        "append=2",
        "onto=1",
        "rm=1",
        "create=2",
        "move=1",
        "link=1",
        "dir=1",
        "other=0",
        "commit=0",
    ]
    assert (proj / "tools/pre-commit").read_text() == BENIGN
    assert not (proj / "tools/post-commit").exists()
    _git_runs_nothing(world, proj, mark)
    assert "notes.txt" in os.listdir(proj)


def test_an_included_config(world: World) -> None:
    """(b) ``include.path`` (present, and including a missing file) and an
    ``includeIf`` one (missing, in a directory that does not exist yet)."""
    mark = world.root / "PWNED"
    proj = world.root / "home/proj"
    _repo(
        world,
        "home/proj",
        ("include.path", "../.gitconfig.shared"),
        (f"includeIf.gitdir:{proj}/.git.path", "../conf/if.cfg"),
    )
    shared = "[user]\n\tname = t\n[include]\n\tpath = nested.cfg\n"
    world.mkfile("home/proj/.gitconfig.shared", shared)
    cfg = FSMON.format(mark=mark)
    script = (
        f"printf '{cfg}' >> .gitconfig.shared; echo append=$?; "
        f"printf '{cfg}' > t1 && mv -f t1 .gitconfig.shared; echo onto=$?; "
        f"printf '{cfg}' > nested.cfg; echo nested=$?; "
        "ln -s t1 nested.cfg; echo link=$?; "
        f"mkdir -p conf && printf '{cfg}' > conf/if.cfg; echo if=$?; "
        f"rmdir conf && mkdir c2 && printf '{cfg}' > c2/if.cfg && mv c2 conf; echo dir=$?; "
        "ln -s c2 conf; echo dirlink=$?; "
        "git status --short >/dev/null; echo status=$?"
    )
    assert _run(world, script, proj) == [
        "append=2",
        "onto=1",
        "nested=2",
        "link=1",
        "if=2",
        "dir=1",
        "dirlink=1",
        "status=0",
    ]
    assert (proj / ".gitconfig.shared").read_text() == shared
    assert not (proj / "nested.cfg").exists() and not (proj / "conf").exists()
    _git_runs_nothing(world, proj, mark)


def test_a_hooks_path_in_the_work_tree(world: World) -> None:
    """(c) ``core.hooksPath = .githooks`` (missing: it cannot be made) and husky's
    ``.husky/_``, whose stubs run ``.husky/<hook>``: both directories stay as they are."""
    mark = world.root / "PWNED"
    proj = _repo(world, "home/proj", ("core.hooksPath", ".githooks"))
    web = _repo(world, "home/proj/web", ("core.hooksPath", ".husky/_"))
    _exe(world, "home/proj/web/.husky/_/pre-commit", '#!/bin/sh\n. "${0%/*}/../pre-commit"\n')
    _exe(world, "home/proj/web/.husky/pre-commit")
    hook = HOOK.format(mark=mark)
    script = (
        "mkdir .githooks; echo mkdir=$?; "
        f"mkdir t && printf '{hook}' > t/pre-commit && chmod +x t/pre-commit && "
        "mv t .githooks; echo dir=$?; "
        "ln -s t .githooks; echo link=$?; "
        f"printf '{hook}' >> web/.husky/pre-commit; echo husky=$?; "
        f"printf '{hook}' > web/.husky/_/pre-commit; echo stub=$?; "
        f"printf '{hook}' > web/.husky/post-commit; echo new=$?; "
        "echo fine > web/index.js; echo other=$?"
    )
    assert _run(world, script, proj) == [
        "mkdir=1",
        "dir=1",
        "link=1",
        "husky=2",
        "stub=2",
        "new=2",
        "other=0",
    ]
    assert not (proj / ".githooks").exists()
    assert (web / ".husky/pre-commit").read_text() == BENIGN
    _git_runs_nothing(world, proj, mark)
    _git_runs_nothing(world, web, mark)


def test_a_relative_hooks_path_in_the_git_dir_and_a_missing_husky_stub_dir(
    world: World,
) -> None:
    """(c) Push hooks run in $GIT_DIR (githooks(5)), so ``core.hooksPath = .githooks``
    also names ``.git/.githooks``, where ``pre-receive`` runs when the host pushes to
    this repository; and husky's ``.husky/_``, git-ignored and so missing after a
    clean checkout until ``npm install`` makes it, keeps ``.husky`` protected."""
    mark = world.root / "PWNED"
    proj = _repo(world, "home/proj", ("core.hooksPath", ".githooks"))
    _host(world, ["git", "commit", "-q", "--allow-empty", "-m", "init"], proj)
    web = _repo(world, "home/proj/web", ("core.hooksPath", ".husky/_"))
    _exe(world, "home/proj/web/.husky/pre-commit")
    hook = HOOK.format(mark=mark)
    script = (
        "mkdir -p .git/.githooks; echo gitdir=$?; "
        f"mkdir t && printf '{hook}' > t/pre-receive && chmod +x t/pre-receive && "
        "mv t .git/.githooks; echo moved=$?; "
        f"printf '{hook}' >> web/.husky/pre-commit; echo husky=$?; "
        "mkdir web/.husky/_; echo stubs=$?"
    )
    assert _run(world, script, proj) == ["gitdir=1", "moved=1", "husky=2", "stubs=1"]
    assert not (proj / ".git/.githooks").exists()
    assert (web / ".husky/pre-commit").read_text() == BENIGN
    clone = world.root / "clone"
    _host(world, ["git", "clone", "-q", str(proj), str(clone)], world.root)
    _host(world, ["git", "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q",
                  "--allow-empty", "-m", "x"], clone)  # fmt: skip
    _host(world, ["git", "push", "-q", "origin", "HEAD:feature"], clone)
    assert not mark.exists(), "the host's push ran what the sandbox planted"


def test_what_git_s_own_configs_point_at(world: World) -> None:
    """``~/.gitconfig`` (the home itself not writable) includes a file in the project;
    the system config (``$GIT_CONFIG_SYSTEM``) sets ``core.hooksPath`` there."""
    mark = world.root / "PWNED"
    proj = _repo(world, "home/proj")
    world.mkdir("home/proj/shared-hooks")
    world.mkfile("home/.gitconfig", "[include]\n\tpath = ~/proj/team.gitconfig\n")
    system = world.mkfile("sysconfig", f"[core]\n\thooksPath = {proj}/shared-hooks\n")
    env = {"GIT_CONFIG_SYSTEM": str(system)}
    script = (
        f"printf '{FSMON.format(mark=mark)}' > team.gitconfig; echo team=$?; "
        f"printf '{HOOK.format(mark=mark)}' > shared-hooks/pre-commit; echo hook=$?; "
        "echo fine > notes.txt; echo other=$?"
    )
    assert _run(world, script, proj, **env) == ["team=2", "hook=2", "other=0"]
    _git_runs_nothing(world, proj, mark, **env)


def test_a_repository_above_the_writable_root(world: World) -> None:
    """The writable root is a directory of a repository: the config that repository
    reads (read-only already) points into the root."""
    mark = world.root / "PWNED"
    mono = _repo(
        world, "home/mono", ("include.path", "../svc/x.cfg"), ("core.hooksPath", "svc/hooks")
    )
    svc = world.mkdir("home/mono/svc")
    script = (
        f"printf '{FSMON.format(mark=mark)}' > x.cfg; echo include=$?; "
        f"mkdir hooks && printf '{HOOK.format(mark=mark)}' > hooks/pre-commit; echo hooks=$?"
    )
    assert _run(world, script, svc) == ["include=2", "hooks=1"]
    _git_runs_nothing(world, mono, mark)


def test_a_linked_worktree(world: World) -> None:
    """The writable root is a worktree of a repository kept elsewhere: its config's
    relative core.hooksPath is relative to the worktree."""
    mark = world.root / "PWNED"
    main = _repo(world, "home/main", ("core.hooksPath", ".githooks"))
    _host(world, ["git", "commit", "-q", "--allow-empty", "-m", "first"], main)
    _host(world, ["git", "worktree", "add", "-q", "../wt"], main)
    wt = world.root / "home/wt"
    hook = HOOK.format(mark=mark)
    script = f"mkdir .githooks && printf '{hook}' > .githooks/pre-commit; echo worktree=$?"
    assert _run(world, script, wt) == ["worktree=1"]
    _git_runs_nothing(world, wt, mark)


def test_the_same_holds_for_a_sandboxport_bind(world: World) -> None:
    from portdriver import drive

    mark = world.root / "PWNED"
    proj = _repo(world, "home/proj", ("include.path", "../team.cfg"))
    out = drive(
        world,
        f"""
        async def main(port):
            h = await port.launch(spec(bind_mounts=(SandboxBindMount("{proj}"),)))
            r = await port.run(h, "cd {proj} && printf '{FSMON.format(mark=mark)}' > team.cfg; "
                "echo $?")
            OUT["r"] = r.stdout.decode()
            await port.destroy(h)
        """,
    )
    assert out["r"] == "2\n"
    _git_runs_nothing(world, proj, mark)
