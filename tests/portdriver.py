"""Run a SandboxPort scenario as the test's identity (root or the unprivileged user).

A scenario is the body of ``async def main(port)``; it records what it saw in
``OUT`` (printed as JSON at the end), and may use the helpers of ``PRELUDE``,
which look at the sandbox from the host through ``/proc``.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

from conftest import World

PRELUDE = '''
import asyncio, json, os, signal, sys, time
from sandhold.port import SandboxPort, BlockingSandboxPort, SandboxManager, PIPE, LaunchFailed
from sandhold.spec import *
from sandhold.errors import *

OUT = {}
WORK = os.environ["WORK"]
HOME = os.environ["HOME"]


def stat_fields(pid):
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    return data[data.rindex(")") + 2 :].split()


def cpu_ticks(pid):
    fields = stat_fields(pid)
    return int(fields[11]) + int(fields[12])


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\\0", b" ").decode()
    except OSError:
        return ""


def ns_pids(ns):
    """Host pids of every live process in PID namespace ``ns``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}/ns/pid").st_ino == ns and stat_fields(name)[0] != "Z":
                found.append(int(name))
        except OSError:
            pass
    return found


def snapshot(handle):
    """(pid, start time) of every process of the sandbox now."""
    snap = []
    for pid in sandbox_pids(handle):
        try:
            snap.append((pid, stat_fields(pid)[19]))
        except OSError:
            pass
    return snap


def alive_of(snap):
    """Those of ``snap`` still alive (same pid and start time, not a zombie)."""
    left = []
    for pid, started in snap:
        try:
            fields = stat_fields(pid)
        except OSError:
            continue
        if fields[19] == started and fields[0] != "Z":
            left.append(pid)
    return left


def ours_in(ns):
    """Processes in namespace ``ns`` that are sandhold's or the tests' (inode numbers of
    dead namespaces are reused at once by other test runs)."""
    marks = (" -I -S -B ", "sandhold-exec --reap ", "sleep 1000", "bwrap", "while :")
    return [p for p in ns_pids(ns) if any(m in cmdline(p) for m in marks)]


def descendants(root):
    kids = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                kids.setdefault(int(stat_fields(name)[1]), []).append(int(name))
            except OSError:
                pass
    out, todo = [], [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return [p for p in out if os.path.exists(f"/proc/{p}")]


def sandbox_pids(handle):
    if handle.backend is SandboxBackend.NATIVE:
        return ns_pids(int(handle.detail("pid_namespace")))
    pid = int(handle.detail("pid"))
    return ([pid] if os.path.exists(f"/proc/{pid}") else []) + descendants(pid)


def find(handle, text, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in sandbox_pids(handle):
            if text in cmdline(pid):
                return pid
        time.sleep(0.01)
    raise AssertionError(f"no process running {text!r}")


def spec(sid="s1", **kw):
    kw.setdefault("bind_mounts", (SandboxBindMount(WORK),))
    return SandboxSpec(sid, "w", **kw)


def kinds(events):
    return [e.type for e in events]
'''

EPILOGUE = """
async def _run():
    async with SandboxPort() as port:
        await main(port)

asyncio.run(_run())
print(json.dumps(OUT, default=str))
"""


# A command looks at its parent (the exec's reaper) and its grandparent (the agent):
# their names, environments, memory and an fd of each (the reaper holds only its
# report pipe, not fd 0).
# Parents as /proc numbers them (a backend-none sandbox has a PID namespace of its
# own but the host's /proc, where $PPID means another process).
REAPER_AND_AGENT = (
    "s=$(awk '/^PPid/ {print $2}' /proc/self/status); "  # awk's parent: this shell
    "r=$(awk '/^PPid/ {print $2}' /proc/$s/status); "
    "for p in $r $(awk '/^PPid/ {print $2}' /proc/$r/status); do cat /proc/$p/comm; "
    "head -c1 /proc/$p/environ 2>&1 | head -1; head -c1 /proc/$p/mem 2>&1 | head -1; "
    "f=$(ls /proc/$p/fd 2>/dev/null | head -1); readlink -v /proc/$p/fd/${f:-0} 2>&1; done"
)


def assert_out_of_reach(out: str) -> None:
    """What REAPER_AND_AGENT printed: the compiled reaper under the agent, neither of
    whose fds, environment or memory the command may reach (both are non-dumpable)."""
    lines = out.splitlines()
    assert len(lines) == 8, lines
    assert lines[0] == "sandhold-reap" and "python" in lines[4], lines
    assert all("Permission denied" in lines[i] for i in (1, 2, 3, 5, 6, 7)), lines


PRELUDE += f"REAPER_AND_AGENT = {REAPER_AND_AGENT!r}\n"


def drive(
    world: World, body: str, *, timeout: float = 120, custom_run: bool = False
) -> dict[str, object]:
    """Run ``body`` (the inside of ``async def main(port)``) as ``world.ident``; returns OUT."""
    code = PRELUDE + "\n" + textwrap.dedent(body)
    if not custom_run:
        code += EPILOGUE
    path = world.mkfile("driver.py", code)
    env = world.env(WORK=str(world.work))
    r = world.ident.run([world.ident.python, str(path)], cwd=world.work, env=env, timeout=timeout)
    assert r.returncode == 0, f"driver failed:\n{r.stdout}\n{r.stderr}"
    # Whatever the scenario did, once its process is gone nothing of its sandboxes may be
    # left: no process naming its work directory or running in it (bwrap's and the
    # agent's command lines name it; commands run in it).
    deadline = time.monotonic() + 3
    while (left := leftovers(world.work)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == [], f"processes outlived the driver: {left}"
    lines = r.stdout.strip().splitlines()
    assert lines, r.stderr
    out: dict[str, object] = json.loads(lines[-1])
    out["_stderr"] = r.stderr
    return out


def leftovers(work: Path) -> list[str]:
    """Processes whose command line names ``work`` or whose cwd is inside it."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        try:
            cwd = os.readlink(f"/proc/{name}/cwd")
        except OSError:
            cwd = ""
        if str(work) in cmd or cwd == str(work) or cwd.startswith(f"{work}/"):
            found.append(f"{name}: {cmd[:100]}")
    return found
