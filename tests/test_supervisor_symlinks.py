"""Symlinks into the kernel's file systems are refused whatever their text's spelling (F-BE-5).

Issue 21's red-team finding: a symlink to ``/proc`` was refused only when its target
was written absolute; ``../../../../proc``, ``./`` padding, double slashes or a
symlink on the way let it through. The supervisor now decides on every place the
link leads through (``policy.symlinks``), from the link's directory in the sandbox's
view. Through the real CLI, as root and as an unprivileged user, with the compiled
front (which hands every symlink call to Python) and with the Python runner alone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import World
from sandhold.policy import symlinks


def _texts(work: Path) -> dict[str, str]:
    """Link name -> text, each leading into /proc, /sys or /dev from ``work``."""
    up = "../" * (len(work.parts) - 1)  # from work to /
    return {
        "abs-proc": "/proc",
        "rel-proc": f"{up}proc",
        "rel-self-root": f"{up}proc/self/root",
        "rel-sys": f"{up}sys/kernel",
        "rel-dev": f"{up}dev/sda",
        "abs-dev": "/dev/mem",
        "dev-via-null": "/dev/null/../shm",
        "padded": "./" + up.replace("/", "/./") + "proc/self",
        "double-slash": up.replace("/", "//") + "sys",
        "past-root": f"{up}../../proc",
        "through-link": "hostproc/self/root/etc",  # hostproc: a symlink to /proc
        "slash-slash": "//proc",
    }


@pytest.mark.parametrize("helper", ["1", "0"], ids=["with-front", "python-runner"])
def test_a_relative_symlink_into_proc_sys_or_dev_is_refused(world: World, helper: str) -> None:
    w = world.work
    world.mkfile("work/ok.txt", "fine\n")
    world.mkdir("work/sub")
    world.symlink("work/hostproc", "/proc")  # there before the run (the host made it)
    world.symlink("work/pre", "../" * (len(w.parts) - 1) + "proc")  # moved during the run
    texts = _texts(w)
    up = "../" * (len(w.parts) - 1)
    ordinary = {
        "plain": "ok.txt",
        "round-trip": f"{up}{str(w)[1:]}/ok.txt",
        "sub/up": "../ok.txt",
        "null": "/dev/null",  # straight to /dev/null: harmless, and common
        "rel-null": f"{up}dev/null",
    }
    script = "".join(
        f"ln -s '{text}' '{name}' 2>/dev/null && echo 'made {name}'; "
        for name, text in {**texts, **ordinary}.items()
    )
    script += "mv pre moved 2>/dev/null && echo 'made moved'; cat plain round-trip sub/up null"
    log = world.root / "refused.jsonl"
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    env = {**world.env(), "SANDHOLD_EXEC_HELPER": helper}
    r = world.sandhold("-s", str(s), "--violations", str(log), "--", "sh", "-c", script, env=env)
    made = {line.split(" ", 1)[1] for line in r.stdout.splitlines() if line.startswith("made ")}
    assert made == set(ordinary), r.stdout + r.stderr
    assert r.stdout.count("fine") == 3, r.stdout
    assert os.readlink(w / "null") == "/dev/null"
    for name in texts:
        assert not (w / name).is_symlink(), name
    assert (w / "pre").is_symlink() and not (w / "moved").is_symlink()
    rules = {
        json.loads(line)["target"].rsplit("/", 1)[1]: json.loads(line)["rule"]
        for line in log.read_text().splitlines()
    }
    assert set(rules) == {*texts, "moved"}, rules
    for name, rule in rules.items():
        assert "/proc" in rule or "/sys" in rule or "/dev" in rule, (name, rule)


HOST = {"/w/hostproc": "/proc", "/w/loop": "loop", "/w/up": "..", "/proc/self": "1234"}


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("/proc", True),
        ("../proc", True),
        ("./..//./proc/", True),
        ("../../../../sys/kernel", True),
        ("../dev/null", False),  # straight to /dev/null
        ("/dev/../dev/null", False),
        ("../dev/zero", True),
        ("/dev/null/../sda", True),
        ("../dev/shm/x", True),
        ("hostproc", True),  # a symlink on the way
        ("hostproc/self/root/etc", True),  # the end is / or /etc: the way went through /proc
        ("up/proc", True),  # up -> ..
        ("../procx", False),
        ("proc", False),  # /w/proc: a plain name in the work tree
        ("../w/ok.txt", False),
        ("loop", False),  # a loop stops after MAX_SYMLINKS (the kernel: ELOOP)
        ("/devices", False),
    ],
)
def test_where_a_symlink_leads_is_judged_step_by_step(text: str, refused: bool) -> None:
    passed = symlinks.steps("/w", text, HOST.get)
    assert (symlinks.kernel_tree_denied(passed) is not None) is refused, passed
    assert len(passed) <= 200


def test_the_lexical_target_comes_first_and_is_normalised() -> None:
    assert symlinks.steps("/w", "//proc", {}.get)[0] == "/proc"
    assert symlinks.normal_target("/w/a", "../../../x") == "/x"
