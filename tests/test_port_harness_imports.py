"""The harness never imports what a sandbox could write: its script's own directory.

Python puts a script's directory first on ``sys.path``; the documented example binds
the working directory writable, so run from there the sandbox could plant ``json.py``
where the harness (outside the sandbox) imports it next. The plan names that
directory (``SpecPlan.drop_import_paths``), the port takes it off ``sys.path`` before
the sandbox runs, and imports that would still reach it are refused, naming it. The
plan is table-tested here on a fake host; the real runs are as root and as a user.
"""

from __future__ import annotations

import pytest

from conftest import World
from fakehost import FakeHost
from sandhold.errors import UnenforceablePolicy
from sandhold.policy.specplan import SpecHost, SpecPlan, plan_spec
from sandhold.spec import SandboxBindMount, SandboxSpec
from test_port_docs import blocks
from test_spec_plan import BASE_HOST, HOME, PKG, PRIV, PROJ, TMP


def plan(bind: SandboxBindMount, *, code: tuple[str, ...], script_dir: str) -> SpecPlan:
    facts = SpecHost(
        HOME, TMP, PRIV, (PKG,), code, script_dir=script_dir, supervisor=True, landlock=True
    )
    return plan_spec(SandboxSpec("s1", "w1", bind_mounts=(bind,)), facts, FakeHost(BASE_HOST))


@pytest.mark.parametrize(
    ("script_dir", "bind", "dropped"),
    [
        (PROJ, SandboxBindMount(PROJ), (PROJ,)),  # the example, run where it binds
        (HOME, SandboxBindMount(PROJ), ()),  # a directory above the bind: left alone
        ("", SandboxBindMount(PROJ), ()),  # python -P: nothing there to drop
        (PROJ, SandboxBindMount(PROJ, read_only=True), ()),  # read-only: read-only code
    ],
)
def test_the_script_dir_that_is_a_writable_root_is_dropped(
    script_dir: str, bind: SandboxBindMount, dropped: tuple[str, ...]
) -> None:
    code = tuple(p for p in (script_dir,) if p)
    p = plan(bind, code=code, script_dir=script_dir)
    assert p.drop_import_paths == dropped
    named = [w for w in p.warnings if "script's own directory" in w]
    assert len(named) == len(dropped)
    if dropped:
        assert PROJ in named[0] and "python -P" in named[0]


def test_another_sys_path_entry_that_is_a_writable_root_is_still_refused() -> None:
    """Only the script's own directory is taken off sys.path: a PYTHONPATH entry (or
    the script's directory not recognised as such) that a sandbox may write stays a
    refusal that names it and the fix."""
    with pytest.raises(UnenforceablePolicy) as err:
        plan(SandboxBindMount(PROJ), code=(PROJ,), script_dir="")
    text = str(err.value)
    assert PROJ in text and "sys.path" in text and "PYTHONPATH" in text


# Run from inside the directory it binds: the sandbox plants a module shadowing the
# standard library's, changes a submodule of a package loaded before launch, and
# writes a module of the script's own; none of them may run in the harness.
PLANT = r"""
import asyncio, os, sys
import helperpkg  # loaded from the script's directory before launch

from sandhold import SandboxBindMount, SandboxPort, SandboxSpec

async def main():
    here = os.getcwd()
    async with SandboxPort() as port:
        h = await port.launch(SandboxSpec("s", "w", bind_mounts=(SandboxBindMount(here),)))
        r = await port.run(h, "echo 'import sys; sys.exit(99)' > colorsys.py && "
                              "cp colorsys.py helperpkg/late.py && cp colorsys.py mine.py")
        assert r.exit_code == 0, r
    print("on_path", here in sys.path or "" in sys.path)
    import colorsys  # the standard library's, not the planted one
    print("colorsys", os.path.dirname(colorsys.__file__) != here)
    for name in ("helperpkg.late", "mine"):
        try:
            __import__(name)
            print(name, "imported")
        except ImportError as exc:
            print(name, "refused", here in str(exc) and "python -P" in str(exc))

asyncio.run(main())
"""


def test_a_module_planted_in_the_script_dir_never_runs_in_the_harness(world: World) -> None:
    world.mkfile("work/helperpkg/__init__.py", "")
    script = world.mkfile("work/plant.py", PLANT)
    r = world.ident.run([world.ident.python, str(script)], cwd=world.work, env=world.env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n") == [
        "on_path False",
        "colorsys True",
        "helperpkg.late refused True",
        "mine refused True",
        "",
    ], r.stdout
    assert f"{world.work} is the harness script's own directory" in r.stderr


def test_the_documented_example_runs_from_inside_the_directory_it_binds(world: World) -> None:
    code, expected = blocks()
    script = world.mkfile("work/example.py", code)
    r = world.ident.run([world.ident.python, str(script)], cwd=world.work, env=world.env())
    assert r.returncode == 0, r.stderr
    want = expected.replace("/the/current/directory", str(world.work))
    assert r.stdout == want.replace("/your/home", str(world.home))


@pytest.mark.parametrize(
    ("flags", "want"),
    [
        ([], "True True"),  # python -c: "" on sys.path is the working directory
        (["-P"], "False False"),  # -P: nothing of it on sys.path, nothing to drop
    ],
)
def test_the_working_directory_on_sys_path_is_the_harness_code(
    tmp_path: object, flags: list[str], want: str
) -> None:
    import os
    import subprocess
    import sys

    from conftest import SRC

    code = (
        "import os; from sandhold.port.facts import code_paths, script_dir; "
        "here = os.path.realpath(''); print(script_dir() == here, here in code_paths())"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    r = subprocess.run(
        [sys.executable, *flags, "-c", code],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert r.stdout.strip() == want


SHADOW = r"""
import asyncio, os, sys

from sandhold import SandboxBindMount, SandboxPort, SandboxSpec

here = os.path.dirname(os.path.realpath(__file__))
sys.modules.pop("code", None)

async def main():
    async with SandboxPort() as port:
        bind = SandboxBindMount(here + "/code")  # a writable bind named like a module
        h = await port.launch(SandboxSpec("s", "w", bind_mounts=(bind,)))
        import code  # nothing planted yet: the standard library's
        print("before", not code.__file__.startswith(here))
        del sys.modules["code"]
        r = await port.run(h, "echo 'import sys; sys.exit(99)' > __init__.py")
        assert r.exit_code == 0, r
        try:
            import code
            print("after imported", code.__file__)
        except ImportError as exc:
            print("after refused", here + "/code" in str(exc))

asyncio.run(main())
"""


def test_a_package_planted_in_a_bind_beside_the_script_never_runs(world: World) -> None:
    """The script's directory holds a writable bind ``code``: it stays writable, but
    a ``code/__init__.py`` the sandbox plants would shadow the standard library's
    ``code`` in the harness; the import is refused instead."""
    world.mkdir("code")
    script = world.mkfile("shadow.py", SHADOW)
    r = world.ident.run([world.ident.python, str(script)], cwd=world.work, env=world.env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n") == ["before True", "after refused True", ""], r.stdout


def test_a_writable_root_below_a_code_path_is_guarded() -> None:
    p = plan(SandboxBindMount(PROJ), code=(HOME,), script_dir=HOME)
    assert p.guard_import_roots == (PROJ,) and p.drop_import_paths == ()
    assert plan(SandboxBindMount(PROJ), code=(), script_dir="").guard_import_roots == ()
