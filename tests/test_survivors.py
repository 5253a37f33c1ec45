"""No process of a sandbox outlives what should end it (issue 21), through the real
SandboxPort, as root and as the unprivileged user, with verdicts read from the host's
``/proc``: a timed-out exec's whole tree (a ``setsid`` child, a double-forked
grandchild), a ``none`` sandbox whose command went for its agent, and no inherited fd
above 65536 reaching a command.
"""

from __future__ import annotations

import random
import resource

import pytest

from conftest import REPO, World
from portdriver import drive

HELPERS = '''
def sleepers(n):
    """Live processes (not zombies) whose command line is exactly ``sleep n``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and cmdline(name).strip() == f"sleep {n}":
            try:
                if stat_fields(name)[0] not in "ZX":
                    found.append(int(name))
            except OSError:
                pass
    return found


async def settle(check, timeout=3.0):
    """``check()`` once it is false, or at the deadline (what is dying may take a moment)."""
    deadline = time.monotonic() + timeout
    while (left := check()) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return left


async def appear(n, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not sleepers(n) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return bool(sleepers(n))
'''


def _marks(k: int) -> list[int]:
    return random.sample(range(100000, 999999), k)


@pytest.mark.parametrize("backend", ["native", "none"])
def test_a_timeout_ends_the_execs_whole_tree(world: World, backend: str) -> None:
    a, b = _marks(2)
    out = drive(
        world,
        HELPERS
        + f"""
async def main(port):
    h = await port.launch(spec(), backend=SandboxBackend({backend!r}))
    # a child in a session of its own, and a grandchild orphaned by a double fork
    # (in a session of its own too): neither is in the exec's process group
    ex = await port.exec(h, "setsid sleep {a} & (setsid sleep {b} &); sleep 30", timeout=1.5)
    OUT["seen"] = [await appear({a}), await appear({b})]
    r = await ex.output()
    OUT["killed"] = r.killed.value if r.killed else None
    OUT["left"] = await settle(lambda: sleepers({a}) + sleepers({b}))
    await port.destroy(h)
""",
    )
    assert out["seen"] == [True, True]
    assert out["killed"] == "timeout"
    assert out["left"] == []


def test_none_destroy_ends_everything_after_the_command_went_for_the_agent(
    world: World,
) -> None:
    a, b, c = _marks(3)
    out = drive(
        world,
        HELPERS
        + f"""
async def main(port):
    # The command signals its parent, the agent, as a process of its uid may
    # ($PPID names it), after leaving a child outside its session.
    h = await port.launch(spec("s1"), backend=SandboxBackend.NONE)
    ex = await port.exec(h, "setsid sleep {a} & (setsid sleep {b} &); kill -9 $PPID; sleep 0.3")
    OUT["seen"] = [await appear({a}), await appear({b})]
    await ex.wait()
    await asyncio.sleep(0.2)
    await port.destroy(h)
    OUT["left"] = await settle(lambda: sleepers({a}) + sleepers({b}))

    # A host process of the same uid kills what the host started (the keeper): the
    # sandbox's processes die with it, before any destroy.
    h = await port.launch(spec("s2"), backend=SandboxBackend.NONE)
    await port.run(h, "setsid sleep {c} &")
    OUT["seen2"] = await appear({c})
    os.kill(int(h.detail("pid")), signal.SIGKILL)
    OUT["left_dead_agent"] = await settle(lambda: sleepers({c}))
    await port.destroy(h)
    OUT["left2"] = await settle(lambda: sleepers({c}))
""",
    )
    assert out["seen"] == [True, True] and out["seen2"] is True
    assert out["left"] == []
    assert out["left_dead_agent"] == []
    assert out["left2"] == []


@pytest.mark.parametrize("backend", ["native", "none"])
def test_a_high_inherited_fd_does_not_reach_an_exec(world: World, backend: str) -> None:
    """An fd as high as this host allows (the hard RLIMIT_NOFILE; above 65536 where the
    host allows that, which this machine does not: see the test below for that case)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    high = hard - 1
    try:
        out = drive(
            world,
            f"""
async def main(port):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    src = os.open(WORK, os.O_RDONLY | os.O_DIRECTORY)
    os.dup2(src, {high}, inheritable=True)  # a host directory, open high up
    h = await port.launch(spec(), backend=SandboxBackend({backend!r}))
    r = await port.run(h, ["ls", "/proc/self/fd"])
    OUT["fds"] = sorted(int(x) for x in r.stdout.split())
    await port.destroy(h)
""",
        )
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    # 0-2 and ls's own directory fd; nothing the host had open
    assert high not in out["fds"]  # type: ignore[operator]
    assert len(out["fds"]) <= 4, out["fds"]  # type: ignore[arg-type]


_CLOSER = """
import os, sys
sys.path.insert(0, {src!r})
from sandhold.agent import main as agent
fds = {{}}
base = os.open("/", os.O_RDONLY)
for n in (7, 300, {high}):
    fds[n] = os.dup2(base, n, inheritable=True)
os.close(base)
if {no_proc}:
    def no_listing(path):
        raise PermissionError(path)
    os.listdir = no_listing  # as where /proc is not mounted: close_range to ~0U instead
agent._close_inherited({{300}})
alive = []
for n in fds:
    try:
        os.fstat(n)
        alive.append(n)
    except OSError:
        pass
print(alive)
"""


@pytest.mark.parametrize("no_proc", [False, True])
def test_the_agent_closes_every_inherited_fd_by_the_real_calls(no_proc: bool) -> None:
    """Both ways the agent closes fds (``/proc/self/fd``, and ``close_range`` to ``~0U``
    without it) run for real in a child: only the kept one survives, however high."""
    import subprocess
    import sys

    high = resource.getrlimit(resource.RLIMIT_NOFILE)[1] - 1
    code = _CLOSER.format(src=str(REPO / "src"), high=high, no_proc=no_proc)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[300]", out.stdout + out.stderr


def test_an_fd_past_65536_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's hard RLIMIT_NOFILE (20000) allows no fd past 65536, so the listing
    is given: the agent closes what ``/proc/self/fd`` names, with no bound of its own
    (a ``closerange(3, 65536)`` would leave 70000 and 2**31-1 open)."""
    from sandhold.agent import main as agent

    closed: list[int] = []
    monkeypatch.setattr(
        agent.os, "listdir", lambda path: ["0", "1", "2", "5", "70000", "2147483647"]
    )
    monkeypatch.setattr(agent.os, "close", closed.append)
    monkeypatch.setattr(agent.os, "closerange", lambda lo, hi: closed.extend(range(lo, min(hi, 8))))
    agent._close_inherited({5})
    assert sorted(closed) == [70000, 2147483647]
