"""No survivors (issue 21): a timeout ends an exec's whole tree, ``destroy`` ends every
process of a sandbox, and no fd of the harness reaches an exec, however high.

Each test drives a real ``SandboxPort`` as root and as the unprivileged user
(``portdriver.drive``). A process is recorded by pid and start time from the host's
``/proc`` while it runs, and a verdict is that pair gone (or a zombie): a pid reused
by another process does not count as a survivor, nor hide one.
"""

from __future__ import annotations

import pytest

from conftest import World
from portdriver import drive

# What a command does to outlive its process group: a setsid child, a double-forked
# daemon (its parent exits at once), a child in a session and group of its own that
# forks again, then the leader itself. Each ``sleep`` has an argument of its own so
# that the driver can name it once, while it runs.
ESCAPERS = (
    "setsid sleep 1000.1 & "
    "sh -c 'sleep 1000.2 &' </dev/null; "
    "setsid sh -c 'sleep 1000.3 & exec sleep 1000.4' & "
    "exec sleep 1000.5"
)
MARKS = ("1000.1", "1000.2", "1000.3", "1000.4", "1000.5")

HELPERS = """
def started(pid):
    try:
        fields = stat_fields(pid)
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def exactly(handle, argv, timeout=5.0):
    "The process of the sandbox whose command line is ``argv``, and nothing more"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in sandbox_pids(handle):
            if cmdline(pid) == argv + " ":
                return pid
        time.sleep(0.005)
    raise AssertionError(f"no process running exactly {argv!r}")


def record(handle):
    "(pid, start time) of each marked sleep, found once by its whole command line"
    return [(pid, started(pid)) for pid in (exactly(handle, "sleep " + m) for m in MARKS)]


async def gone(procs, timeout=3.0):
    "Those of ``procs`` still alive (same pid, same start time) after ``timeout``."
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid, t in procs if started(pid) == t]
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.01)
"""


def _body(text: str) -> str:
    return f"MARKS = {MARKS!r}\nESCAPERS = {ESCAPERS!r}\n{HELPERS}\nasync def main(port):\n{text}"


@pytest.mark.parametrize("backend", ["native", "none"])
def test_a_timeout_ends_the_exec_whole_tree(world: World, backend: str) -> None:
    out = drive(
        world,
        _body(
            f"""
    h = await port.launch(spec(), backend=SandboxBackend("{backend}"))
    ex = await port.exec(h, ESCAPERS, timeout=1.5)
    procs = record(h)
    OUT["recorded"] = sum(t is not None for _, t in procs)
    r = await ex.output()
    OUT["killed"] = (r.killed and r.killed.value, r.exit_code)
    OUT["left"] = await gone(procs)
    # the sandbox is still there, and a command that ends in time is left alone
    OUT["after"] = (await port.run(h, "echo ok", timeout=5)).stdout.decode()
"""
        ),
        custom_run=False,
    )
    assert out["recorded"] == len(MARKS)
    assert out["killed"] == ["timeout", 137]
    assert out["left"] == []
    assert out["after"] == "ok\n"


def test_destroy_of_a_none_sandbox_ends_what_killed_its_agent(world: World) -> None:
    """The reported survivor: backend none, no cgroup (the user), a command kills the
    agent and its reaper, its ``setsid`` children lived on after ``destroy``. In a PID
    namespace of its own the agent cannot be killed from inside, and its death ends
    them all; whatever the attacker managed, nothing survives ``destroy``."""
    attack = (
        "import os\n"
        "def parent(p):\n"
        "    with open(f'/proc/{p}/stat') as f:\n"
        "        return int(f.read().rsplit(')', 1)[1].split()[1])\n"
        "def cmd(p):\n"
        "    with open(f'/proc/{p}/cmdline', 'rb') as f:\n"
        "        return f.read()\n"
        # the reaper, the agent and the process that started it, as /proc names them,
        # then as this process's namespace does
        "p, chain = parent(int(os.readlink('/proc/self'))), []\n"
        "while b'-I\\0-S\\0-B' in cmd(p) or cmd(p).startswith(b'sandhold-exec\\0--reap\\0'):\n"
        "    chain.append(p)\n"
        "    p = parent(p)\n"
        "for p in chain:\n"
        "    try:\n"
        "        open(f'/proc/{p}/mem', 'r+b').close()\n"
        "        print('opened', p)\n"
        "    except OSError as e:\n"
        "        print('no mem', p, e.errno)\n"
        "for p in [*chain, os.getppid(), 1]:\n"
        "    try:\n"
        "        os.kill(p, 9)\n"
        "        print('killed', p)\n"
        "    except OSError as e:\n"
        "        print('refused', p, e.errno)\n"
    )
    out = drive(
        world,
        _body(
            f"""
    h = await port.launch(spec(), backend=SandboxBackend.NONE)
    OUT["destroy_by"] = h.detail("destroy")
    await port.exec(h, ESCAPERS)
    procs = record(h)
    OUT["recorded"] = sum(t is not None for _, t in procs)
    r = await port.run(h, ["python3", "-c", {attack!r}])
    OUT["attack"] = r.stdout.decode()
    await asyncio.sleep(0.1)
    OUT["alive_before_destroy"] = len(await gone(procs, 0))
    OUT["agent_after"] = (await port.run(h, "echo alive", timeout=5)).stdout.decode()
    await port.destroy(h)
    OUT["left"] = await gone(procs, 0)  # destroy returns once they are gone
"""
        ),
    )
    assert out["destroy_by"].startswith("pid namespace")  # type: ignore[union-attr]
    assert out["recorded"] == len(MARKS)
    # the host's pids name nothing in the namespace; its init ignores the SIGKILL
    assert "refused" in str(out["attack"]) and out["agent_after"] == "alive\n"
    if not world.ident.is_root:  # root may write any process's memory: no isolation
        assert "opened" not in str(out["attack"]), out["attack"]
    assert out["alive_before_destroy"] == len(MARKS)
    assert out["left"] == []


@pytest.mark.parametrize("backend", ["native", "none"])
def test_no_fd_of_the_harness_reaches_an_exec(world: World, backend: str) -> None:
    """An fd at the top of the harness's table (70000 where its hard limit allows: this
    host's is 20000 and the test may not raise it), inheritable, and one low."""
    out = drive(
        world,
        f"""
        async def main(port):
            import resource
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (70001, max(hard, 70001)))
            except (ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            high = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 1
            r, w = os.pipe()
            os.dup2(r, high)
            os.dup2(w, 100)
            OUT["high"] = high
            h = await port.launch(spec(), backend=SandboxBackend("{backend}"))
            res = await port.run(h, "ls /proc/self/fd")
            OUT["fds"] = sorted(int(x) for x in res.stdout.split())
        """,
    )
    assert out["high"] >= 19999  # type: ignore[operator]
    assert out["fds"] == [0, 1, 2, 3]  # 3: ls's own listing
