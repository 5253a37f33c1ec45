"""The agent's compiled exec reaper (``_helper/reap.c``, ``sandhold-exec --reap``).

Its semantics are those of the Python reaper and are tested for both in
test_agent_process.py. Here: its own input (arguments and SPEC, refused whole when
malformed, before anything runs), what it exposes to other processes (nothing of the
exec in its command line; non-dumpable), and that real sandboxes use it, with the
Python reaper as the fallback (``SANDHOLD_EXEC_HELPER=0``), as root and as an
unprivileged user.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import World
from portdriver import assert_out_of_reach, drive
from sandhold.backends.linux.supervisor.front import confining_front
from sandhold.backends.linux.supervisor.notify import sealed_memfd

ENV = [b"PATH=/usr/bin:/bin"]


@pytest.fixture(scope="module")
def helper() -> str:
    exe = confining_front()
    if exe is None:
        pytest.fail("the compiled helper is not built: run scripts/setup")
    return exe


def _spec(fields: list[bytes]) -> bytes:
    return b"\0".join(fields) + b"\0"


def reap(
    helper: str, spec: bytes | None, *, args: list[str] | None = None, prog: bytes | None = None
) -> tuple[bytes, bytes, bytes, int]:
    """Run the reaper as the agent would, with ``spec`` in a memfd (None: no SPEC fd at
    all). Returns its report, what FAIL got, the command's stdout and the reaper's exit."""
    report_r, report_w = os.pipe()
    fail_r, fail_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe()
    null = os.open("/dev/null", os.O_RDONLY)
    spec_fd = sealed_memfd("spec", spec) if spec is not None else -1
    prog_fd, ours, theirs = -1, -1, -1
    if prog is not None:
        import socket

        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours, theirs = a.detach(), b.detach()
        prog_fd = sealed_memfd("prog", prog)
    fds = [report_w, fail_w, null, out_w, out_w, prog_fd, theirs, spec_fd]
    if args is None:
        args = [str(fd) for fd in fds]
    proc = subprocess.Popen(
        [helper, "--reap", *args],
        pass_fds=[fd for fd in fds if fd >= 0],
        stdin=subprocess.DEVNULL,
    )
    for fd in (report_w, fail_w, out_w, null, spec_fd, prog_fd, theirs):
        if fd >= 0:
            os.close(fd)
    code = proc.wait(10)
    chunks = []
    for fd in (report_r, fail_r, out_r, ours):
        data = b""
        if fd >= 0:
            while chunk := os.read(fd, 65536):
                data += chunk
            os.close(fd)
        chunks.append(data)
    return chunks[0], chunks[1], chunks[2], code


def test_a_well_formed_exec_runs_and_is_reported(helper: str, tmp_path: Path) -> None:
    report, fail, out, code = reap(
        helper, _spec([str(tmp_path).encode(), b"3", b"sh", b"-c", b"pwd; echo $X", *ENV, b"X=1"])
    )
    assert code == 0 and fail == b""
    assert out == f"{tmp_path}\n1\n".encode()
    assert len(report) == 12 and int.from_bytes(report[8:], "little") == 0  # exit status 0


def test_failures_before_exec_are_reported_in_the_python_format(helper: str) -> None:
    report, fail, out, _ = reap(helper, _spec([b"/nonexistent", b"1", b"true", *ENV]))
    assert fail.split(b"\0")[:2] == [b"chdir", b"2"] and out == b""
    assert int.from_bytes(report[8:], "little") == 127 << 8
    _, fail, _, _ = reap(helper, _spec([b"", b"1", b"no-such-command-here", *ENV]))
    assert fail == b"exec\x002\x00command not found"


BAD_SPECS = {
    "no trailing NUL": b"/\x001\x00true",
    "argc beyond the fields": _spec([b"/", b"5", b"true"]),
    "argc zero": _spec([b"/", b"0", b"PATH=/bin"]),
    "argc not a number": _spec([b"/", b"1x", b"true"]),
    "argc negative": _spec([b"/", b"-1", b"true"]),
    "too few fields": _spec([b"/", b"1"]),
    "empty": b"",
}


@pytest.mark.parametrize("name", list(BAD_SPECS))
def test_a_malformed_spec_runs_nothing_and_reports_nothing(helper: str, name: str) -> None:
    report, fail, out, code = reap(helper, BAD_SPECS[name])
    assert (report, fail, out, code) == (b"", b"", b"", 0)


@pytest.mark.parametrize(
    "args",
    [
        [],  # no fields at all
        ["3", "4", "5", "6", "7", "-1", "-1"],  # no SPEC
        ["3", "4", "5", "6", "7", "-1", "-1", "8", "extra"],
        ["3", "4", "5", "6", "7", "8", "-1", "9"],  # a filter with no socket
        ["3", "4", "5", "6", "7", "-1", "-1", "x9"],
        ["-1", "4", "5", "6", "7", "-1", "-1", "8"],
        ["3", "4", "5", "6", "7", "-1", "-1", "99999999999"],
    ],
)
def test_a_malformed_argument_line_runs_nothing(helper: str, args: list[str]) -> None:
    report, fail, out, code = reap(helper, _spec([b"/", b"1", b"touch", b"/tmp/x"]), args=args)
    assert (report, fail, out, code) == (b"", b"", b"", 0)


@pytest.mark.parametrize("insns", [0, 4097])
def test_a_filter_it_cannot_load_whole_stops_the_command(helper: str, insns: int) -> None:
    """A filter longer than the kernel's limit is refused, never cut to what fits."""
    allow = (0x06).to_bytes(2, "little") + b"\0\0" + (0x7FFF0000).to_bytes(4, "little")
    prog = allow * insns + (b"\0" * 3 if insns == 0 else b"")
    report, fail, out, _ = reap(helper, _spec([b"/", b"2", b"echo", b"ran", *ENV]), prog=prog)
    assert out == b"" and fail.startswith(b"pre-exec hook\0")
    assert int.from_bytes(report[8:], "little") == 127 << 8


def test_nothing_of_the_exec_is_in_the_reapers_command_line(helper: str) -> None:
    """Any process may read /proc/PID/cmdline: the exec's argv and env go in SPEC."""
    report_r, report_w = os.pipe()
    fail_r, fail_w = os.pipe2(os.O_CLOEXEC)
    null = os.open("/dev/null", os.O_RDWR)
    spec = sealed_memfd("spec", _spec([b"/", b"2", b"sleep", b"5", *ENV, b"TOKEN=s3cr3t-mark"]))
    fds = [report_w, fail_w, null, null, null, -1, -1, spec]
    proc = subprocess.Popen(
        [helper, "--reap", *(str(fd) for fd in fds)], pass_fds=[report_w, fail_w, null, spec]
    )
    for fd in (report_w, fail_w, null, spec):
        os.close(fd)
    head = os.read(report_r, 8)
    child = int.from_bytes(head[:4], "little")
    try:
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{proc.pid}/comm") as f:
            comm = f.read().strip()
        assert cmdline.startswith(helper.encode() + b"\0--reap\0")
        assert b"sleep" not in cmdline and b"s3cr3t" not in cmdline
        assert comm == "sandhold-reap"
        deadline = time.monotonic() + 5
        while _cmdline(child) != b"sleep\x005\x00" and time.monotonic() < deadline:
            time.sleep(0.01)  # between its fork and its exec
        assert _cmdline(child) == b"sleep\x005\x00"
    finally:
        os.kill(child, 9)
        proc.wait(10)
        os.close(report_r)
        os.close(fail_r)


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


# -- in real sandboxes ----------------------------------------------------------------


@pytest.mark.parametrize("backend", ["native", "none"])
def test_sandboxes_run_each_exec_under_the_compiled_reaper(world: World, backend: str) -> None:
    """The exec's parent is the compiled reaper, out of the command's reach, and holds
    nothing of the exec where another process could read it."""
    out = drive(
        world,
        f"""
        async def main(port):
            h = await port.launch(spec(), backend=SandboxBackend("{backend}"))
            r = await port.run(h, REAPER_AND_AGENT)
            OUT["reach"] = r.stdout.decode()
            ex = await port.exec(h, ["sleep", "7.25"], env={{"TOKEN": "s3cr3t-mark"}})
            await asyncio.sleep(0.3)
            leaks = []
            for name in os.listdir("/proc"):
                if name.isdigit():
                    try:
                        with open(f"/proc/{{name}}/cmdline", "rb") as f:
                            c = f.read()
                    except OSError:
                        continue
                    if b"s3cr3t" in c or (b"7.25" in c and not c.startswith(b"sleep")):
                        leaks.append(c.decode(errors="replace"))
            OUT["leaks"] = leaks
            await ex.kill()
            await ex.wait()
            await port.destroy(h)
        """,
    )
    assert out["leaks"] == []
    if backend == "native" or not world.ident.is_root:  # host root may read anything
        assert_out_of_reach(str(out["reach"]))


def test_without_the_helper_the_python_reaper_runs_and_creations_are_still_refused(
    world: World,
) -> None:
    out = drive(
        world,
        """
        os.environ["SANDHOLD_EXEC_HELPER"] = "0"

        async def main(port):
            h = await port.launch(spec())
            r = await port.run(h, f"cat /proc/$PPID/comm; cd {WORK} && (echo > .env) 2>&1; true")
            OUT["r"] = r.stdout.decode()
            await port.destroy(h)
        """,
    )
    lines = str(out["r"]).splitlines()
    assert "python" in lines[0], lines
    assert "Permission denied" in lines[1] or "not permitted" in lines[1], lines
    assert not (world.work / ".env").exists()


def test_the_compiled_reaper_keeps_supervised_creations_refused(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            ex = await port.exec(h, ["sh", "-c", f"cat /proc/$PPID/comm; cd {WORK} && "
                                     "(echo > .env; mkdir .vscode; ln -s x id_rsa; "
                                     "echo ok > fine) 2>/dev/null; true"])
            evs = [e async for e in ex]
            OUT["comm"] = b"".join(e.data for e in evs if e.type == "stdout").decode()
            OUT["refused"] = sorted(e.violation.target for e in evs if e.type == "violation")
            await port.destroy(h)
        """,
    )
    w = world.work
    assert out["comm"] == "sandhold-reap\n"
    assert out["refused"] == [f"{w}/.env", f"{w}/.vscode", f"{w}/id_rsa"]
    assert sorted(p.name for p in w.iterdir()) == ["fine"]


# A command of the sandbox SIGSTOPs every pid just after the last one made: each new
# exec's spawn child (between its clone and its exec) and reaper (before its first
# report) are stopped on their way. Neither may freeze the agent.
STOPPER = """
import os, sys, time
me, end, hits = os.getpid(), time.time() + float(sys.argv[1]), 0
with open("/proc/sys/kernel/ns_last_pid") as f:
    while time.time() < end:
        f.seek(0)
        last = int(f.read())
        for p in range(last - 1, last + 4):
            if p != me and p > 3:
                try:
                    os.kill(p, 19)
                    hits += 1
                except OSError:
                    pass
print(hits)
"""


@pytest.mark.parametrize("writable", [True, False], ids=["supervised", "read-only"])
def test_a_command_stopping_new_execs_on_their_way_cannot_freeze_the_agent(
    world: World, writable: bool
) -> None:
    stopper = world.mkfile("work/stopper.py", STOPPER)
    out = drive(
        world,
        f"""
        async def main(port):
            mount = SandboxBindMount(WORK, read_only={not writable})
            h = await port.launch(spec(bind_mounts=(mount,)))
            attacker = await port.exec(h, ["python3", {str(stopper)!r}, "3"])
            await asyncio.sleep(0.3)
            victims = [await port.exec(h, ["true"]) for _ in range(3)]
            stopped = await attacker.output()
            OUT["hits"] = int(stopped.stdout or 0)
            t = time.monotonic()
            r = await asyncio.wait_for(port.run(h, ["echo", "alive"]), 20)
            OUT["after"] = (r.stdout.decode(), round(time.monotonic() - t, 1))
            for v in victims:  # each ended one way or another, none hangs
                await asyncio.wait_for(v.output(), 20)
            await port.destroy(h)
        """,
    )
    assert out["hits"] > 0  # type: ignore[operator]
    assert out["after"][0] == "alive\n", out  # type: ignore[index]


def test_a_command_that_stops_its_reaper_still_ends_by_its_timeout_alone(world: World) -> None:
    """A stopped reaper reports nothing: the timeout's tree kill ends it too, the exec
    gets its status at once, and the sandbox and its other execs live on."""
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            other = await port.exec(h, ["sleep", "30"])
            t = time.monotonic()
            r = await port.run(h, "kill -STOP $PPID; exit 3", timeout=1)
            OUT["stopped"] = (r.exit_code, round(time.monotonic() - t, 1))
            r = await port.run(h, ["echo", "alive"])
            OUT["after"] = r.stdout.decode()
            OUT["state"] = port.handle(h).state.value
            await other.kill()
            OUT["other"] = (await other.output()).signal
            await port.destroy(h)
        """,
    )
    code, took = out["stopped"]  # type: ignore[misc]
    assert code in (3, 137) and took < 4, out  # its status, or the kill's
    assert out["after"] == "alive\n" and out["state"] == "active"
    assert out["other"] == 9  # still running until killed here, not by the sandbox's end
