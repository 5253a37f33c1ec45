"""Programs an existing repository's git config names are code the host runs (issue 16).

``core.fsmonitor = tools/fsm.sh`` runs at the host's next ``git status``, a clean
filter at ``git add``, a ``!`` alias at ``git <alias>``, an editor at ``git commit``:
where such a file lies in the writable root it stays as it is, and a missing one
cannot be made (``gitconfig.PROGRAM_KEYS``). Each runs as root and as an
unprivileged user, every way of writing is tried, and real git on the host runs
afterwards and must run nothing planted. Ordinary work still works.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import World

pytestmark = pytest.mark.sandbox

EVIL = "#!/bin/sh\\ntouch {mark}\\ncat\\n"  # a printf format (cat: a filter's output)
CAT = "#!/bin/sh\ncat\n"


def _host(world: World, argv: list[str], cwd: Path, *, check: bool = True) -> None:
    r = world.ident.run(argv, cwd=cwd, env=world.env(GIT_EDITOR="", EDITOR=""))
    assert r.returncode == 0 or not check, r.stderr


def _repo(world: World, rel: str, *config: tuple[str, str]) -> Path:
    path = world.mkdir(rel)
    _host(world, ["git", "init", "-q", "."], path)
    for key, value in (("user.name", "t"), ("user.email", "t@example.com"), *config):
        _host(world, ["git", "config", key, value], path)
    return path


def _run(world: World, script: str, cwd: Path, settings: object = None) -> list[str]:
    s = world.settings(settings or {"filesystem": {"allowWrite": ["."]}})
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, cwd=cwd, env=world.env())
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_programs_the_repository_config_names(world: World) -> None:
    mark = world.root / "PWNED"
    proj = _repo(
        world,
        "home/proj",
        ("core.fsmonitor", "tools/fsm.sh"),
        ("filter.x.clean", "tools/clean %f"),
        ("alias.al", "!tools/al.sh"),
        ("core.editor", "sh tools/ed.sh"),
    )
    for name in ("fsm.sh", "clean", "al.sh"):
        world.mkfile(f"home/proj/tools/{name}", CAT, mode=0o755)
    world.mkfile("home/proj/.gitattributes", "*.txt filter=x\n")
    evil = EVIL.format(mark=mark)
    script = (
        f"printf '{evil}' > tools/fsm.sh; echo write=$?; "
        f"printf '{evil}' > t1 && chmod +x t1 && mv -f t1 tools/clean; echo onto=$?; "
        "rm -f tools/al.sh; echo rm=$?; "
        f"printf '{evil}' > tools/ed.sh; echo create=$?; "
        "ln -s ../t2 tools/ed.sh; echo link=$?; "
        "mv tools tools2; echo dir=$?; "
        "echo fine > notes.txt; echo other=$?; "
        "git add notes.txt && git commit -qm work; echo commit=$?"
    )
    assert _run(world, script, proj) == [
        "write=2",
        "onto=1",
        "rm=1",
        "create=2",
        "link=1",
        "dir=1",
        "other=0",
        "commit=0",
    ]
    assert (proj / "tools/fsm.sh").read_text() == CAT
    assert not (proj / "tools/ed.sh").exists()
    world.mkfile("home/proj/more.txt", "x\n")
    _host(world, ["git", "status", "--short"], proj)
    _host(world, ["git", "add", "more.txt"], proj)
    _host(world, ["git", "al"], proj)
    _host(world, ["git", "commit", "-q", "--allow-empty"], proj, check=False)  # the editor
    assert not mark.exists(), "the host's git ran what the sandbox planted"


def test_an_included_alias_and_a_user_config_fsmonitor(world: World) -> None:
    """A ``!`` alias in an included file, and ``~/.gitconfig``'s relative
    ``core.fsmonitor``, which names a file in every repository."""
    mark = world.root / "PWNED"
    proj = _repo(world, "home/proj", ("include.path", "../team.cfg"))
    world.mkfile("home/proj/team.cfg", "[alias]\n\tal = !sh scripts/al\n")
    world.mkfile("home/.gitconfig", "[core]\n\tfsmonitor = bin/fsm\n")
    evil = EVIL.format(mark=mark)
    script = (
        f"mkdir scripts && printf '{evil}' > scripts/al; echo alias=$?; "
        f"mkdir b2 && printf '{evil}' > b2/fsm && chmod +x b2/fsm && mv b2 bin; echo moved=$?; "
        f"mkdir -p bin && printf '{evil}' > bin/fsm; echo fsm=$?"
    )
    assert _run(world, script, proj) == ["alias=2", "moved=1", "fsm=2"]
    _host(world, ["git", "status", "--short"], proj, check=False)
    _host(world, ["git", "al"], proj, check=False)
    assert not mark.exists(), "the host's git ran what the sandbox planted"


def test_the_same_holds_for_a_sandboxport_bind(world: World) -> None:
    from portdriver import drive

    mark = world.root / "PWNED"
    proj = _repo(world, "home/proj", ("core.fsmonitor", "tools/fsm.sh"))
    world.mkfile("home/proj/tools/fsm.sh", CAT, mode=0o755)
    evil = EVIL.format(mark=mark)
    out = drive(
        world,
        f"""
        async def main(port):
            h = await port.launch(spec(bind_mounts=(SandboxBindMount("{proj}"),)))
            r = await port.run(h, "cd {proj} && printf '{evil}' > tools/fsm.sh; echo $?")
            OUT["r"] = r.stdout.decode()
            await port.destroy(h)
        """,
    )
    assert out["r"] == "2\n"
    assert (proj / "tools/fsm.sh").read_text() == CAT
    _host(world, ["git", "status", "--short"], proj)
    assert not mark.exists()
