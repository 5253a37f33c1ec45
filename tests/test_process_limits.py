"""A CLI sandbox cannot exhaust the host's process table (issue 16).

A red-team run started 3,000 processes, visible on the host. The rules
(``policy.limits``): every CLI sandbox has a process limit (``limits.processes``)
and a per-process memory limit (``limits.memoryMiB``); unprivileged, RLIMIT_NPROC
set inside the sandbox's user namespace makes the fork fail at the limit; as root
(whom the kernel exempts from RLIMIT_NPROC) sandhold counts the sandbox's processes
and kills it past the limit. A fork loop (bounded: 300 forks of children that sleep
3 s) runs as root and unprivileged, and nothing of it is left afterwards.
"""

from __future__ import annotations

import time

import pytest

from conftest import World
from sandhold.errors import SettingsError
from sandhold.policy import limits
from sandhold.settings import parse_settings

FORK_LOOP = """
import os, sys, time
kids = []
for i in range(300):
    try:
        pid = os.fork()
    except OSError as e:
        print("refused", len(kids), e.errno)
        break
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
else:
    print("all", len(kids))
sys.stdout.flush()
for k in kids:
    os.kill(k, 9)
"""


def test_the_choice_of_mechanism() -> None:
    user = limits.choose(root=False, processes=None, memory_mib=None)
    assert (user.processes, user.memory_mib) == (
        limits.DEFAULT_PROCESSES,
        limits.DEFAULT_MEMORY_MIB,
    )
    assert user.process_mechanism == limits.NPROC
    root = limits.choose(root=True, processes=64, memory_mib=512)
    assert (root.processes, root.memory_mib, root.process_mechanism) == (64, 512, limits.WATCH)
    assert limits.prlimit_argv(user, "/usr/bin/prlimit") == (
        "/usr/bin/prlimit",
        f"--data={limits.DEFAULT_MEMORY_MIB << 20}:{limits.DEFAULT_MEMORY_MIB << 20}",
        f"--nproc={limits.DEFAULT_PROCESSES}:{limits.DEFAULT_PROCESSES}",
        "--",
    )
    assert "--nproc" not in " ".join(limits.prlimit_argv(root, "p"))  # root: no use


def test_the_settings_keys() -> None:
    s = parse_settings('{"limits": {"processes": 100, "memoryMiB": 2048}}', "s.json")
    assert (s.limit_processes, s.limit_memory_mib) == (100, 2048)
    assert parse_settings("{}", "s.json").limit_processes is None
    with pytest.raises(SettingsError):
        parse_settings('{"limits": {"processes": 1}}', "s.json")


@pytest.mark.sandbox
def test_a_fork_loop_stops_at_the_limit(world: World) -> None:
    from portdriver import leftovers

    world.mkfile("work/loop.py", FORK_LOOP)
    s = world.settings({"limits": {"processes": 40}})
    started = time.monotonic()
    r = world.sandhold("-s", str(s), "--", "python3", "loop.py", timeout=30)
    took = time.monotonic() - started
    if world.ident.name == "root":
        # counted and killed: the loop never finished (its children sleep 3 s)
        assert r.returncode == 137, (r.stdout, r.stderr)
        assert "limit of 40 processes (limits.processes)" in r.stderr
        assert "all" not in r.stdout
    else:
        assert r.returncode == 0, r.stderr
        word, count, errno_ = r.stdout.split()
        assert word == "refused" and int(count) <= 40 and errno_ == "11", r.stdout
    assert took < 3, took  # nothing waited for the sleeping children
    deadline = time.monotonic() + 3
    while (left := leftovers(world.work)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []


@pytest.mark.sandbox
def test_explain_says_which_limits_apply(world: World) -> None:
    r = world.sandhold("--explain", "--", "true")
    assert r.returncode == 0, r.stderr
    how = "counted every" if world.ident.name == "root" else "RLIMIT_NPROC"
    assert f"processes: at most {limits.DEFAULT_PROCESSES}" in r.stdout and how in r.stdout
    assert "RLIMIT_DATA" in r.stdout
