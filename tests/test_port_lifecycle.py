"""SandboxPort on real sandboxes, as root and as an unprivileged user (issue 4).

Each test runs a scenario in a driver process under the test identity
(``portdriver.drive``) and checks what it recorded. Host-side checks (CPU time,
leftover processes) read ``/proc`` from that driver, outside the sandbox.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import World
from portdriver import drive


def test_states_and_invalid_transitions(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            OUT["launched"] = h.state.value
            OUT["backend"] = h.backend.value
            seen = []
            async def watch():
                async for ev in port.events(h):
                    seen.append(ev)
            watcher = asyncio.get_running_loop().create_task(watch())
            ex = await port.exec(h, ["sleep", "0.3"])
            OUT["during"] = port.handle(h).state.value
            await ex.wait()
            OUT["after"] = port.handle(h).state.value
            bad = []
            async def expect_invalid(coro):
                before = port.handle(h)
                try:
                    await coro
                except InvalidTransition as exc:
                    assert port.handle(h) == before, "an invalid move changed the state"
                    bad.append((exc.state.value, exc.action.value))
            await expect_invalid(port.resume(h))
            OUT["suspend"] = (await port.suspend(h)).state.value
            await expect_invalid(port.suspend(h))
            await expect_invalid(port.exec(h, ["true"]))
            OUT["resume"] = (await port.resume(h)).state.value
            busy = await port.exec(h, ["sleep", "5"])
            OUT["busy_suspend"] = (await port.suspend(h)).state.value
            OUT["busy_resume"] = (await port.resume(h)).state.value
            await busy.kill()
            await busy.wait()
            OUT["idle_again"] = port.handle(h).state.value
            OUT["destroy"] = (await port.destroy(h)).state.value
            await expect_invalid(port.destroy(h))
            await expect_invalid(port.exec(h, ["true"]))
            await expect_invalid(port.suspend(h))
            await asyncio.wait_for(watcher, 5)
            OUT["invalid"] = bad
            OUT["events"] = kinds(seen)
            OUT["event_backends"] = sorted({e.backend.value for e in seen})

            # error: the agent cannot start (no such interpreter) -> error, then destroyed
            broken = SandboxPort(python="/nonexistent/python3")
            try:
                await broken.launch(spec("s2"))
            except LaunchFailed as exc:
                OUT["failed"] = (exc.handle.state.value, bool(exc.handle.error))
                OUT["failed_now"] = broken.handle("s2").state.value
                OUT["failed_destroy"] = (await broken.destroy("s2")).state.value
            await broken.aclose()

            # created -> destroyed: a launch cancelled midway leaves nothing behind
            task = asyncio.get_running_loop().create_task(port.launch(spec("s3")))
            await asyncio.sleep(0.002)
            task.cancel()
            try:
                await task
                OUT["cancelled"] = "finished first"
            except asyncio.CancelledError:
                OUT["cancelled"] = port.handle("s3").state.value
        """,
    )
    assert out["launched"] == "warm" and out["backend"] == "native"
    assert (out["during"], out["after"]) == ("active", "warm")
    assert (out["suspend"], out["resume"]) == ("suspended", "warm")
    assert (out["busy_suspend"], out["busy_resume"], out["idle_again"]) == (
        "suspended",
        "active",
        "warm",
    )
    assert out["destroy"] == "destroyed"
    assert out["invalid"] == [
        ["warm", "resume"],
        ["suspended", "suspend"],
        ["suspended", "exec"],
        ["destroyed", "destroy"],
        ["destroyed", "exec"],
        ["destroyed", "suspend"],
    ]
    assert out["events"][:2] == ["starting", "ready"]
    assert out["events"].count("killed") == 1 and out["events"][-1] == "exit"
    assert out["event_backends"] == ["native"]
    assert out["failed"] == ["error", True] and out["failed_now"] == "error"
    assert out["failed_destroy"] == "destroyed"
    assert out["cancelled"] in ("destroyed", "finished first")


def test_concurrent_execs_have_separate_streams(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            scripts = {
                i: f"sleep 0.{5 - i}; echo out{i}; echo err{i} >&2; sleep 0.1; "
                f"echo more{i}; exit {i}"
                for i in range(1, 6)
            }
            execs = [await port.exec(h, s) for s in scripts.values()]
            OUT["state"] = port.handle(h).state.value
            results = await asyncio.gather(*(e.output() for e in execs))
            OUT["results"] = [(r.stdout.decode(), r.stderr.decode(), r.exit_code) for r in results]
            OUT["ids"] = [e.exec_id for e in execs]
            OUT["state_after"] = port.handle(h).state.value
        """,
    )
    assert out["state"] == "active" and out["state_after"] == "warm"
    assert out["results"] == [[f"out{i}\nmore{i}\n", f"err{i}\n", i] for i in range(1, 6)]
    assert len(set(out["ids"])) == 5  # type: ignore[arg-type]


def test_stdin_streaming(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            # interactive: each line comes back before the next is sent
            cat = await port.exec(h, ["cat"], stdin=PIPE)
            stream = cat.__aiter__()
            echoed = []
            for line in (b"one\\n", b"two\\n", b"three\\n"):
                await cat.write(line)
                ev = await anext(stream)
                while ev.type != "stdout":
                    ev = await anext(stream)
                echoed.append(ev.data.decode())
            await cat.close_stdin()
            await cat.close_stdin()  # twice is fine
            OUT["echoed"] = echoed
            OUT["cat_exit"] = (await cat.wait()).exit_code
            # bytes: 6 MB through flow control
            blob = os.urandom(6 << 20)
            r = await port.run(h, ["sha256sum"], stdin=blob)
            import hashlib
            OUT["sha_ok"] = r.stdout.split()[0].decode() == hashlib.sha256(blob).hexdigest()
            # an async iterator
            async def gen():
                for i in range(3):
                    yield f"line{i}\\n".encode()
                    await asyncio.sleep(0.01)
            r = await port.run(h, ["wc", "-l"], stdin=gen())
            OUT["lines"] = r.stdout.decode().strip()
            # no stdin: /dev/null
            r = await port.run(h, ["cat"])
            OUT["devnull"] = (r.stdout.decode(), r.exit_code)
            # a reader that goes away
            gone = await port.exec(h, ["true"], stdin=PIPE)
            await gone.wait()
            try:
                await gone.write(b"x")
                OUT["broken"] = "no error"
            except BrokenPipeError:
                OUT["broken"] = "BrokenPipeError"
        """,
    )
    assert out["echoed"] == ["one\n", "two\n", "three\n"] and out["cat_exit"] == 0
    assert out["sha_ok"] is True and out["lines"] == "3"
    assert out["devnull"] == ["", 0] and out["broken"] == "BrokenPipeError"


def test_cwd_env_and_failures(world: World) -> None:
    world.mkdir("work/sub")
    out = drive(
        world,
        """
        async def main(port):
            os.environ["GITHUB_TOKEN"] = "ghp_secret"
            os.environ["MY_SETTING"] = "not on the allow-list"
            h = await port.launch(spec())
            async def sh(cmd, **kw):
                r = await port.run(h, cmd, **kw)
                return (r.stdout.decode().strip(), r.exit_code, r.error)
            OUT["default_cwd"] = await sh("pwd")
            OUT["relative_cwd"] = await sh("pwd", cwd="sub")
            OUT["absolute_cwd"] = await sh("pwd", cwd="/tmp")
            show = 'echo "$FOO|$GITHUB_TOKEN|$MY_SETTING|$TMPDIR|$HOME|$PWD"'
            OUT["env"] = await sh(show, env={"FOO": "bar"}, cwd="sub")
            OUT["env_not_kept"] = await sh('echo "${FOO-unset}"')
            OUT["missing_cwd"] = await sh("true", cwd="/nope")
            OUT["missing_cmd"] = await sh(["no-such-cmd"])
            OUT["exit_code"] = await sh("exit 42")
            OUT["signal"] = await sh("kill -TERM $$")
            try:
                await port.exec(h, [])
            except ValueError:
                OUT["empty"] = "ValueError"
        """,
    )
    work = str(world.work)
    assert out["default_cwd"] == [work, 0, ""]
    assert out["relative_cwd"] == [f"{work}/sub", 0, ""]
    assert out["absolute_cwd"] == ["/tmp", 0, ""]
    assert out["env"] == [f"bar|||/tmp|/tmp|{work}/sub", 0, ""]  # home is not bound: HOME=/tmp
    assert out["env_not_kept"] == ["unset", 0, ""]
    assert out["missing_cwd"] == ["", 126, "chdir /nope: No such file or directory"]
    assert out["missing_cmd"] == ["", 127, "no-such-cmd: command not found"]
    assert out["exit_code"] == ["", 42, ""] and out["signal"] == ["", 143, ""]
    assert out["empty"] == "ValueError"


def test_timeouts_and_kills_produce_killed_then_exit(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            t = time.monotonic()
            ex = await port.exec(h, "sleep 30 & sleep 30; echo never", timeout=0.5)
            evs = [ev async for ev in ex]
            OUT["timeout"] = [(e.type, getattr(e, "reason", None) and e.reason.value) for e in evs]
            OUT["exit"] = (evs[-1].exit_code, evs[-1].signal)
            OUT["elapsed"] = time.monotonic() - t
            await asyncio.sleep(0.2)
            # the whole process group went: only init, the agent and its compiled front
            # (the creation-time supervisor's, started at the first exec) are left
            OUT["left"] = len(sandbox_pids(h))
            ex = await port.exec(h, ["sleep", "30"])
            await asyncio.sleep(0.1)
            await ex.kill()
            r = await ex.output()
            OUT["manual"] = (r.killed.value, r.exit_code, r.signal)
            # a command that exits in time is not killed
            r = await port.run(h, ["true"], timeout=5)
            OUT["in_time"] = (r.killed, r.exit_code)
            # a finished execution can be read again: it is simply over
            OUT["again"] = ((await ex.wait()).exit_code, (await ex.output()).exit_code)
            # the timeout does not run while the sandbox is suspended
            ex = await port.exec(h, "for i in $(seq 30); do sleep 0.1; done", timeout=1.0)
            await asyncio.sleep(0.3)
            await port.suspend(h)
            await asyncio.sleep(1.2)
            await port.resume(h)
            t = time.monotonic()
            r = await ex.output()
            OUT["suspended_timeout"] = (r.killed and r.killed.value, r.exit_code)
            OUT["killed_after_resume"] = time.monotonic() - t
        """,
    )
    assert out["timeout"] == [["killed", "timeout"], ["exit", None]]
    assert out["exit"] == [137, 9] and out["elapsed"] < 5  # type: ignore[operator]
    assert out["left"] == 3
    assert out["manual"] == ["manual", 137, 9]
    assert out["in_time"] == [None, 0] and out["again"] == [137, 137]
    assert out["suspended_timeout"] == ["timeout", 137]
    assert 0.4 < out["killed_after_resume"] < 2.0  # type: ignore[operator]  # the 0.7 s left


def test_suspend_freezes_a_busy_loop_and_resume_continues(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            OUT["freezer"] = h.detail("freezer")
            ex = await port.exec(h, ["sh", "-c", "while :; do :; done"])
            pid = find(h, "while")
            await asyncio.sleep(0.3)
            assert cpu_ticks(pid) > 0
            h2 = await port.suspend(h)
            OUT["frozen_by"] = h2.detail("frozen_by")
            await asyncio.sleep(0.1)
            t0 = cpu_ticks(pid)
            await asyncio.sleep(0.7)
            t1 = cpu_ticks(pid)
            OUT["frozen_delta"] = t1 - t0
            OUT["agent_answers_while_frozen"] = False
            await port.resume(h)
            await asyncio.sleep(0.7)
            OUT["thawed_delta"] = cpu_ticks(pid) - t1
            OUT["ping_ms"] = await port.ping(h) * 1000
            await ex.kill()
            await ex.wait()
        """,
    )
    expected = "cgroup" if world.ident.is_root else "sigstop"
    assert out["freezer"] == expected and out["frozen_by"] == expected
    assert out["frozen_delta"] == 0
    assert out["thawed_delta"] > 20  # type: ignore[operator]  # ~70 ticks of 10 ms


def test_pings_each_get_their_answer_time_out_and_fail_when_the_agent_goes(
    world: World,
) -> None:
    """Concurrent pings each get their own answer. A ping the agent cannot answer
    (stopped) times out; pings waiting when the sandbox is destroyed,
    or when its agent dies, fail with InvalidTransition instead of hanging."""
    out = drive(
        world,
        """
        def agent_host_pid(h):
            inner = h.detail("agent_pid_in_sandbox")
            for pid in sandbox_pids(h):
                with open(f"/proc/{pid}/status") as f:
                    nspid = next(l for l in f if l.startswith("NSpid:")).split()
                if nspid[-1] == inner:
                    return pid
            raise AssertionError("no agent")

        async def outcome(task):
            try:
                await asyncio.wait_for(task, 5)
                return "answered"
            except TimeoutError:
                return "hangs"
            except InvalidTransition as exc:
                return f"InvalidTransition: {exc}"

        async def main(port):
            h = await port.launch(spec())
            pings = [asyncio.ensure_future(port.ping(h)) for _ in range(8)]
            OUT["concurrent"] = [await outcome(t) for t in pings]

            # The agent stopped (a sandbox cannot do that: test_supervised_launches; the
            # host can): the ping says so in time.
            os.kill(agent_host_pid(h), signal.SIGSTOP)
            t = time.monotonic()
            try:
                await port.ping(h, timeout=0.5)
                OUT["stopped"] = "answered"
            except TimeoutError as exc:
                OUT["stopped"] = str(exc)
            OUT["stopped_s"] = time.monotonic() - t
            OUT["state_after_timeout"] = port.handle(h).state.value

            waiting = [asyncio.ensure_future(port.ping(h, timeout=None)) for _ in range(3)]
            await asyncio.sleep(0.2)
            await port.destroy(h)
            OUT["destroyed"] = [await outcome(t) for t in waiting]
            try:
                await port.ping(h)
            except InvalidTransition as exc:
                OUT["after"] = str(exc)

            # The agent dies (killed from the host) while pings wait.
            h = await port.launch(spec("s2"))
            agent = agent_host_pid(h)
            os.kill(agent, signal.SIGSTOP)
            waiting = [asyncio.ensure_future(port.ping(h, timeout=None)) for _ in range(3)]
            await asyncio.sleep(0.2)
            os.kill(agent, signal.SIGKILL)
            OUT["agent_died"] = [await outcome(t) for t in waiting]
            OUT["died_state"] = port.handle(h).state.value
            for bad in (0, -1, float("nan"), float("inf")):
                try:
                    await port.ping(h, timeout=bad)
                except ValueError:
                    OUT.setdefault("bad_timeouts", []).append(str(bad))
        """,
    )
    assert out["concurrent"] == ["answered"] * 8
    assert "did not answer within 0.5 s" in str(out["stopped"])
    assert out["stopped_s"] < 2  # type: ignore[operator]
    assert out["state_after_timeout"] == "warm"
    gone = "InvalidTransition: cannot exec a sandbox that is"
    assert out["destroyed"] == [f"{gone} destroyed"] * 3
    assert out["after"] == "cannot exec a sandbox that is destroyed"
    assert out["agent_died"] == [f"{gone} error"] * 3
    assert out["died_state"] == "error"
    assert out["bad_timeouts"] == ["0", "-1", "nan", "inf"]


def test_destroy_leaves_no_process_behind(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            import os
            h = await port.launch(spec())
            ns = int(h.detail("pid_namespace"))
            bwrap = int(h.detail("pid"))
            cgroup = h.detail("cgroup")
            running = await port.exec(
                h,
                "sleep 1000 & setsid sh -c 'sleep 1000 &'; "
                "nohup sleep 1000 >/dev/null 2>&1 & sleep 1000",
            )
            await asyncio.sleep(0.3)
            before = snapshot(h)
            OUT["before"] = len(before)
            base = os.path.dirname(os.path.dirname(h.detail("workdir")))
            evs = []
            async def collect():
                async for ev in running:
                    evs.append(ev)
            task = asyncio.get_running_loop().create_task(collect())
            t = time.monotonic()
            gone = await port.destroy(h)
            OUT["destroy_ms"] = (time.monotonic() - t) * 1000
            OUT["state"] = gone.state.value
            OUT["after"] = alive_of(before) + ours_in(ns)
            OUT["bwrap_alive"] = os.path.exists(f"/proc/{bwrap}")
            OUT["cgroup_left"] = bool(cgroup) and os.path.exists(cgroup)
            await asyncio.wait_for(task, 5)
            OUT["exec_events"] = [
                (e.type, getattr(e, "reason", None) and e.reason.value) for e in evs
            ]
            OUT["dot_names_left"] = sorted(n for n in os.listdir(WORK) if n.startswith("."))
            # a suspended sandbox is destroyed as well
            h = await port.launch(spec("s2"))
            ns = int(h.detail("pid_namespace"))
            await port.exec(h, "sleep 1000 & sleep 1000")
            await asyncio.sleep(0.2)
            await port.suspend(h)
            before = snapshot(h)
            await port.destroy(h)
            OUT["suspended_after"] = alive_of(before) + ours_in(ns)
            # and the port's aclose destroys what is left
            h = await port.launch(spec("s3"))
            ns = int(h.detail("pid_namespace"))
            await port.exec(h, "sleep 1000")
            await asyncio.sleep(0.1)
            before = snapshot(h)
            await port.aclose()
            OUT["aclose_left"] = alive_of(before) + ours_in(ns)
        """,
    )
    assert out["before"] >= 5  # type: ignore[operator]
    assert out["state"] == "destroyed" and out["after"] == [] and out["bwrap_alive"] is False
    assert out["cgroup_left"] is False
    assert out["exec_events"] == [["killed", "destroyed"], ["exit", None]]
    assert out["dot_names_left"] == []  # nothing was made in the user's tree
    assert out["suspended_after"] == []
    assert out["aclose_left"] == []


# A process whose main thread has exited: its leader shows Z in /proc while its other
# thread runs on. With a second argument the thread also SIGCONTs everything it may.
ZOMBIE_LEADER_C = r"""
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
static int fd, cont;
static void *tick(void *arg) {
    for (;;) {
        if (write(fd, ".", 1) != 1) _exit(1);
        if (cont) kill(-1, SIGCONT);
        usleep(5000);
    }
    return arg;
}
int main(int argc, char **argv) {
    pthread_t t;
    fd = open(argv[1], O_WRONLY | O_CREAT | O_APPEND, 0644);
    cont = argc > 2;
    if (fd < 0 || pthread_create(&t, 0, tick, 0)) return 1;
    pthread_exit(0);
}
"""


def _compile_zombie_leader(directory: Path, name: str) -> Path:
    source = directory / f"{name}.c"
    source.write_text(ZOMBIE_LEADER_C)
    binary = directory / name
    subprocess.run(["gcc", "-O2", "-pthread", "-o", str(binary), str(source)], check=True)
    os.chmod(binary, 0o755)
    return binary


def _kill_named(name: str) -> None:
    """SIGKILL every process called ``name`` (a test's own, should it outlive the test)."""
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == name:
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            continue


ZOMBIE_LEADER_HELPERS = """
def named(name, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in os.listdir("/proc"):
            try:
                with open(f"/proc/{p}/comm") as f:
                    if f.read().strip() == name:
                        return int(p)
            except OSError:
                pass
        time.sleep(0.01)
    raise AssertionError(f"no process called {name!r}")


def live_threads(pid, started):
    '''The states of ``pid``'s threads that are not dead (if it is still the same process).'''
    try:
        if stat_fields(pid)[19] != started:
            return []
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    states = []
    for tid in tids:
        try:
            state = stat_fields(f"{pid}/task/{tid}")[0]
        except OSError:
            continue
        if state not in "ZXx":
            states.append(state)
    return states


async def grows(path):
    n = os.path.getsize(path)
    await asyncio.sleep(0.3)
    return os.path.getsize(path) - n


async def start(port, sid, name, cont=""):
    '''A sandbox running ``name`` in the background: (handle, pid, start time, tick file).'''
    h = await port.launch(spec(sid), backend=SandboxBackend(BACKEND))
    ticks = f"{WORK}/ticks-{sid}"
    await port.run(h, f"({WORK}/{name} {ticks} {cont} &)")
    pid = named(name)
    started = stat_fields(pid)[19]
    await asyncio.sleep(0.2)
    OUT[f"{sid}_leader"] = stat_fields(pid)[0]
    OUT[f"{sid}_threads"] = len(live_threads(pid, started))
    OUT[f"{sid}_ticking"] = await grows(ticks) > 0
    return h, pid, started, ticks
"""


def _zombie_leader_run(
    world: World, names: list[str], backend: str, body: str
) -> dict[str, object]:
    """Compile the program as each of ``names`` in the work directory, then drive ``body``."""
    binary = _compile_zombie_leader(world.work, names[0])
    for name in names[1:]:
        shutil.copy(binary, world.work / name)
    for name in names:
        world.ident.chown(world.work / name)
    header = f"BACKEND = {backend!r}\nNAMES = {names!r}\n"
    try:
        return drive(world, header + ZOMBIE_LEADER_HELPERS + textwrap.dedent(body))
    finally:
        for name in names:
            _kill_named(name)


@pytest.mark.parametrize("backend", ["native", "none"])
def test_suspend_holds_a_process_whose_main_thread_exited(world: World, backend: str) -> None:
    """A leader that called pthread_exit shows Z while its process runs on: it is frozen
    all the same (cgroup freezer, or SIGSTOP until every thread is stopped) and thawed.
    Natively it also SIGCONTs everything it may, which must not thaw the others."""
    out = _zombie_leader_run(
        world,
        [f"zl{uuid.uuid4().hex[:10]}"],
        backend,
        """
        async def main(port):
            cont = "cont" if BACKEND == "native" else ""  # on the host, kill(-1) reaches too far
            h, pid, started, ticks = await start(port, "a", NAMES[0], cont)
            OUT["freezer"] = h.detail("freezer")
            ex = await port.exec(h, ["sh", "-c", "while :; do :; done"])
            loop = find(h, "while")
            h = await port.suspend(h)
            OUT["frozen_by"] = h.detail("frozen_by")
            await asyncio.sleep(0.1)
            t0 = cpu_ticks(loop)
            OUT["ticks_suspended"] = await grows(ticks) + await grows(ticks)
            OUT["loop_suspended"] = cpu_ticks(loop) - t0
            if h.detail("freezer") == "sigstop":
                OUT["states_suspended"] = sorted(set(live_threads(pid, started)))
            h = await port.resume(h)
            OUT["ticks_resumed"] = await grows(ticks) > 0
            OUT["loop_resumed"] = cpu_ticks(loop) - t0 > 0
        """,
    )
    assert (out["a_leader"], out["a_threads"], out["a_ticking"]) == ("Z", 1, True)
    expected = "cgroup" if world.ident.is_root else "sigstop"
    assert out["freezer"] == expected and out["frozen_by"] == expected
    assert (out["ticks_suspended"], out["loop_suspended"]) == (0, 0)
    assert out.get("states_suspended", ["T"]) == ["T"]
    assert out["ticks_resumed"] is True and out["loop_resumed"] is True


@pytest.mark.parametrize("backend", ["native", "none"])
def test_destroy_kills_a_process_whose_main_thread_exited(world: World, backend: str) -> None:
    """Such a process dies with its sandbox: by destroy while it runs, and by the port's
    aclose while it is suspended; no thread of it is left and nothing more is written."""
    tag = uuid.uuid4().hex[:10]
    out = _zombie_leader_run(
        world,
        [f"zl{tag}a", f"zl{tag}b"],
        backend,
        """
        async def main(port):
            h, pid, started, ticks = await start(port, "a", NAMES[0])
            OUT["destroyed"] = (await port.destroy(h)).state.value
            OUT["a_left"] = live_threads(pid, started)
            OUT["a_ticks_after"] = await grows(ticks)
            h, pid, started, ticks = await start(port, "b", NAMES[1])
            await port.suspend(h)
            await port.aclose()
            OUT["b_left"] = live_threads(pid, started)
            OUT["b_ticks_after"] = await grows(ticks)
        """,
    )
    for sid in ("a", "b"):
        assert (out[f"{sid}_leader"], out[f"{sid}_threads"], out[f"{sid}_ticking"]) == (
            "Z",
            1,
            True,
        )
    assert out["destroyed"] == "destroyed"
    assert (out["a_left"], out["a_ticks_after"]) == ([], 0)
    assert (out["b_left"], out["b_ticks_after"]) == ([], 0)


def test_a_process_is_judged_by_its_threads_not_by_its_leader(tmp_path: Path) -> None:
    """The launcher's liveness and stop checks, on the host: a process whose leader has
    exited is alive and stopped only once its running thread is; a leader with no
    thread left (killed, not yet reaped) is a plain zombie: dead."""
    from sandhold.backends.linux import launcher

    line = b"42 (a (b) Z 1) Z 1 42 42 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 3 0 77"
    from sandhold.backends.linux import procfs

    assert procfs.state_and_threads(line) == ("Z", 3)
    assert procfs.state_and_threads(b"") == ("", 0)

    def settled(check: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + 2
        while not check() and time.monotonic() < deadline:
            time.sleep(0.005)
        return check()

    binary = _compile_zombie_leader(tmp_path, f"zl{uuid.uuid4().hex[:10]}")
    proc = subprocess.Popen([str(binary), str(tmp_path / "ticks")])
    pid = proc.pid
    try:
        assert settled(lambda: launcher._state(pid) == "Z")
        assert launcher._alive(pid) and launcher._live([pid]) == [pid]
        assert launcher._thread_states(pid) in (["S"], ["R"])  # the ticker's, not the leader's
        stop = (lambda: [pid], launcher.SIGSTOP, lambda s: s in ("T", "t"), "SIGSTOP")
        launcher._signal_until(*stop)
        assert launcher._thread_states(pid) == ["T"]
        launcher._signal_until(lambda: [pid], launcher.SIGCONT, lambda s: s != "T", "SIGCONT")
        assert launcher._thread_states(pid) in (["S"], ["R"])
        os.kill(pid, signal.SIGKILL)  # the whole group; the leader stays unreaped
        assert settled(lambda: not launcher._alive(pid))
        assert launcher._state(pid) == "Z" and launcher._thread_states(pid) == []
        assert launcher._live([pid]) == []
        launcher._signal_until(*stop)  # nothing left to stop: returns at once
    finally:
        proc.kill()
        proc.wait()


def test_twenty_sandboxes_at_once_without_cross_talk(world: World) -> None:
    for i in range(20):
        world.mkdir(f"work/s{i}")
    out = drive(
        world,
        """
        async def main(port):
            specs = [
                spec(f"s{i}", bind_mounts=(SandboxBindMount(f"{WORK}/s{i}"),)) for i in range(20)
            ]
            t = time.monotonic()
            handles = await asyncio.gather(*(port.launch(s) for s in specs))
            OUT["launch_all_ms"] = (time.monotonic() - t) * 1000
            OUT["namespaces"] = len({h.detail("pid_namespace") for h in handles})
            script = (
                'echo "$MARK" > /tmp/mark; echo "$MARK" > mine; sleep 0.2; '
                # files only: a checkout under /tmp shows the agent's own (read-only) dirs there
                "cat /tmp/mark; find /tmp -maxdepth 1 -type f -printf '%f\\n'; ls ..; "
                'for i in 1 2 3; do echo "$MARK-$i"; done'
            )
            execs = await asyncio.gather(
                *(port.exec(h, script, env={"MARK": h.session_id}) for h in handles)
            )
            results = await asyncio.gather(*(e.output() for e in execs))
            OUT["ok"] = all(
                r.stdout.decode().split() == [h.session_id, "mark", h.session_id]
                + [f"{h.session_id}-{i}" for i in (1, 2, 3)]
                and r.exit_code == 0
                for h, r in zip(handles, results)
            )
            OUT["bad"] = [
                r.stdout.decode()
                for h, r in zip(handles, results)
                if h.session_id not in r.stdout.decode()
            ]
            OUT["files"] = sorted(open(f"{WORK}/s{i}/mine").read().strip() for i in range(20))
            OUT["states"] = sorted({port.handle(h).state.value for h in handles})
            snaps = [snapshot(h) for h in handles]
            await port.aclose()
            await port.aclose()  # twice is fine
            OUT["left"] = sum(len(alive_of(snap)) for snap in snaps)
        """,
    )
    assert out["namespaces"] == 20
    assert out["ok"] is True, out["bad"]
    assert out["files"] == sorted(f"s{i}" for i in range(20))
    assert out["states"] == ["warm"] and out["left"] == 0


def test_violations_reach_the_stream_attributed_to_their_exec(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            stream = port.events(h)
            ex = await port.exec(h, ["sleep", "0.2"])
            v = SandboxViolation("network-outbound", "evil.example", "raw", "not allowed")
            port.report_violation(h, v, ex.exec_id)
            evs = [e async for e in ex]
            OUT["exec"] = [e.type for e in evs]
            v = next(e for e in evs if e.type == "violation")
            OUT["violation"] = (v.exec_id == ex.exec_id, v.violation.target, v.backend.value)
            seen = []
            async for e in stream:
                seen.append(e.type)
                if e.type == "exit":
                    break
            OUT["handle_stream"] = seen
            OUT["json"] = event_from_json(json.loads(json_dumps(v))) == v
        """,
    )
    assert out["exec"] == ["violation", "exit"]
    assert out["violation"] == [True, "evil.example", "native"]
    assert out["handle_stream"] == ["starting", "ready", "violation", "exit"]
    assert out["json"] is True


def test_blocking_facade(world: World) -> None:
    out = drive(
        world,
        """
        with BlockingSandboxPort() as port:
            h = port.launch(spec())
            r = port.run(h, "echo hi; echo err >&2; exit 3")
            OUT["run"] = (r.stdout.decode(), r.stderr.decode(), r.exit_code)
            OUT["suspend"] = port.suspend(h).state.value
            OUT["resume"] = port.resume(h).state.value
            OUT["destroy"] = port.destroy(h).state.value
        print(json.dumps(OUT))
        """,
        custom_run=True,
    )
    assert out["run"] == ["hi\n", "err\n", 3]
    assert (out["suspend"], out["resume"], out["destroy"]) == ("suspended", "warm", "destroyed")


def test_backend_none_runs_on_the_host_scrubbed(world: World) -> None:
    world.mkfile("home/visible.txt", "host file\n")
    out = drive(
        world,
        """
        async def main(port):
            os.environ["AWS_SECRET_ACCESS_KEY"] = "s3cr3t"
            h = await port.launch(spec(), backend=SandboxBackend.NONE)
            OUT["backend"] = h.backend.value
            show = 'cat "$HOME/visible.txt"; echo "${AWS_SECRET_ACCESS_KEY-scrubbed}"; pwd'
            r = await port.run(h, show)
            OUT["run"] = r.stdout.decode().split("\\n")
            stream = port.events(h)
            OUT["first"] = [(e.type, e.backend.value) async for e in _take(stream, 2)]
            ex = await port.exec(h, "setsid sh -c 'sleep 1000 &'; sleep 1000 & while :; do :; done")
            pid = find(h, "while")
            await port.suspend(h)
            t0 = cpu_ticks(pid); await asyncio.sleep(0.5)
            OUT["frozen_delta"] = cpu_ticks(pid) - t0
            await port.resume(h)
            await asyncio.sleep(0.2)
            tree = sandbox_pids(h)
            OUT["tree"] = len(tree)
            await port.destroy(h)
            OUT["left"] = [
                p for p in tree if os.path.exists(f"/proc/{p}") and stat_fields(p)[0] != "Z"
            ]

        async def _take(stream, n):
            async for e in stream:
                yield e
                n -= 1
                if not n:
                    return
        """,
    )
    assert out["backend"] == "none"
    assert out["run"] == ["host file", "scrubbed", str(world.work), ""]
    assert out["first"] == [["starting", "none"], ["ready", "none"]]
    assert out["frozen_delta"] == 0
    assert out["tree"] >= 4 and out["left"] == []  # type: ignore[operator]
    assert "without isolation" in str(out["_stderr"])


@pytest.mark.parametrize("policy", ["require", "on", "off"])
def test_backend_selection_rules(world: World, policy: str) -> None:
    """F-BE-1/6/7: explicit backends are exact; only an unspecified one may fall back."""
    out = drive(
        world,
        f"""
        async def main(port):
            import logging
            logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="LOG %(message)s")
            results = {{}}
            for bwrap in ("bwrap", "/nonexistent/bwrap"):
                p = SandboxPort(sandbox="{policy}", bwrap=bwrap)
                for requested in (None, *SandboxBackend):
                    where = "bwrap" if bwrap == "bwrap" else "nobwrap"
                    key = f"{{where}}/{{requested and requested.value}}"
                    try:
                        h = await p.launch(spec(key.replace("/", "-")), backend=requested)
                        results[key] = h.backend.value
                        r = await p.run(h, ["true"])
                        assert r.exit_code == 0
                    except BackendUnavailable as exc:
                        results[key] = "unavailable:" + exc.backend
                await p.aclose()
            OUT["results"] = results
        """,
    )
    fallback = {"require": "unavailable:native", "on": "none", "off": "none"}[policy]
    assert out["results"] == {
        "bwrap/None": "none" if policy == "off" else "native",
        "bwrap/native": "native",
        "bwrap/none": "none",
        "bwrap/microvm": "unavailable:microvm",
        "nobwrap/None": fallback,
        "nobwrap/native": "unavailable:native",
        "nobwrap/none": "none",
        "nobwrap/microvm": "unavailable:microvm",
    }
    log = str(out["_stderr"])
    if policy != "off":
        assert "LOG no microVM backend on this host: using native" in log
    else:
        assert "DISABLED by sandbox=off" in log


def test_limits_are_never_pretended(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            from sandhold.backends.linux import cgroups
            support = cgroups.probe()
            OUT["delegated"] = bool(support.controllers)
            try:
                limits = ResourceLimits(memory_bytes=256 << 20, pids=64)
                h = await port.launch(spec(), limits=limits)
                OUT["limits"] = h.detail("limits")
            except UnenforceablePolicy as exc:
                OUT["refused"] = str(exc)
                OUT["handles"] = len(port.handles())
            h = await port.launch(spec("s2"))
            OUT["detail"] = h.detail("limits")
        """,
    )
    if out["delegated"]:
        assert out["limits"] == "memory, pids"
    else:
        assert "cannot enforce resource limits" in str(out["refused"]) and out["handles"] == 0
        assert str(out["detail"]).startswith("unavailable: ")


def test_exec_refuses_bad_arguments_before_anything_runs(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            marker = os.path.join(WORK, "ran")
            bad = [dict(timeout="5"), dict(timeout=float("nan")), dict(timeout=-1),
                   dict(timeout=True), dict(stdin=5), dict(env={"A": 1}), dict(cwd=3)]
            errors = []
            for kw in bad:
                try:
                    await port.exec(h, ["touch", marker], **kw)
                    errors.append("accepted")
                except (TypeError, ValueError) as e:
                    errors.append(type(e).__name__)
            OUT["errors"] = errors
            OUT["ran"] = os.path.exists(marker)
            r = await port.run(h, "echo fine", timeout=5)
            OUT["after"] = r.stdout.decode()
            await port.destroy(h)
        """,
    )
    assert out["errors"] == ["TypeError", "ValueError", "ValueError", "TypeError", "TypeError",
                             "TypeError", "TypeError"]  # fmt: skip
    assert out["ran"] is False and out["after"] == "fine\n"


def test_the_str_pipe_is_stdin_data_and_an_unread_dropped_stream_holds_nothing_back(
    world: World,
) -> None:
    """``stdin="pipe"`` is five bytes for the command, not ``PIPE``; and an
    ``events()`` stream made and dropped without being read does not stop the port
    reading the sandbox once 8 MiB of output are past it."""
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            for stdin in ("pipe", b"pipe"):
                try:
                    r = await asyncio.wait_for(port.run(h, ["cat"], stdin=stdin), 10)
                    OUT.setdefault("cat", []).append(r.stdout.decode())
                except TimeoutError:
                    OUT.setdefault("cat", []).append("hung")
            OUT["pipe"] = repr(PIPE)
            port.events(h)  # made, never iterated, dropped
            try:
                r = await asyncio.wait_for(port.run(h, "head -c 20000000 /dev/zero | wc -c"), 30)
                OUT["big"] = r.stdout.decode().strip()
            except TimeoutError:
                OUT["big"] = "hung"
            try:
                r = await asyncio.wait_for(port.run(h, "head -c 20000000 /dev/zero"), 30)
                OUT["out"] = len(r.stdout)
            except TimeoutError:
                OUT["out"] = "hung"
            await port.destroy(h)
        """,
    )
    assert out["cat"] == ["pipe", "pipe"] and out["pipe"] == "PIPE"
    assert out["big"] == "20000000" and out["out"] == 20000000


def test_sandbox_manager_keeps_the_one_shot_wrap(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            m = SandboxManager()
            OUT["argv"] = m.wrap("echo hi")[1:]
            OUT["code"] = m.run(["sh", "-c", "exit 7"])
            OUT["acode"] = await m.arun("exit 5")
            # a sandhold package planted in a writable cwd must not be what runs next
            s = os.path.join(WORK, "s.json")
            with open(s, "w") as f:
                f.write('{"filesystem": {"allowWrite": ["."]}}')
            m = SandboxManager(settings=s)
            OUT["plant"] = m.run("mkdir -p sandhold && echo 'open(\\"ESCAPED\\", \\"w\\")' "
                                 "| tee sandhold/__init__.py > sandhold/__main__.py", cwd=WORK)
            OUT["second"] = m.run("true", cwd=WORK)
            OUT["escaped"] = os.path.exists(os.path.join(WORK, "ESCAPED"))
        """,
    )
    assert out["plant"] == out["second"] == 0 and out["escaped"] is False
    assert out["argv"] == ["-P", "-m", "sandhold", "-c", "echo hi"]
    assert out["code"] == 7 and out["acode"] == 5


def test_a_port_keeps_only_the_last_destroyed_handles(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            import sandhold.port.api
            sandhold.port.api.KEEP_DESTROYED = 2
            for i in range(5):
                await port.destroy(await port.launch(spec(f"s{i}")))
            OUT["kept"] = sorted(h.session_id for h in port.handles())
            OUT["last"] = port.handle("s4").state.value
            try:
                port.handle("s0")
                OUT["first"] = "kept"
            except SpecError:
                OUT["first"] = "forgotten"
        """,
    )
    # the newest launch prunes before it is destroyed itself: at most KEEP + 1 remain
    assert out["kept"] in (["s2", "s3", "s4"], ["s3", "s4"])
    assert out["last"] == "destroyed" and out["first"] == "forgotten"


def test_cancelling_at_any_point_leaks_nothing(world: World) -> None:
    """STYLE §11: a launch cancelled anywhere, and cancelled waits, leave nothing behind."""
    out = drive(
        world,
        """
        async def main(port):
            from sandhold.backends.linux import cgroups
            from sandhold.backends.linux.session import private_base
            me = os.getpid()
            await port.destroy(await port.launch(spec("warm-up")))
            fds = len(os.listdir("/proc/self/fd"))
            outcomes = []
            for delay_ms in range(0, 40, 2):
                task = asyncio.get_running_loop().create_task(port.launch(spec(f"c{delay_ms}")))
                await asyncio.sleep(delay_ms / 1000)
                task.cancel()
                try:
                    await port.destroy(await task)
                    outcomes.append("finished")
                except asyncio.CancelledError:
                    outcomes.append(port.handle(f"c{delay_ms}").state.value)
            # a cancelled wait leaves the command running; destroy still reaps it
            h = await port.launch(spec("w"))
            ex = await port.exec(h, ["sleep", "1000"])
            try:
                await asyncio.wait_for(ex.wait(), 0.1)
            except TimeoutError:
                pass
            OUT["running_after_cancelled_wait"] = port.handle(h).state.value
            destroy = asyncio.get_running_loop().create_task(port.destroy(h))
            await asyncio.sleep(0)
            destroy.cancel()  # shielded: the teardown completes anyway
            try:
                await destroy
            except asyncio.CancelledError:
                pass
            await asyncio.sleep(0.5)
            OUT["after_cancelled_destroy"] = port.handle(h).state.value
            OUT["outcomes"] = sorted(set(outcomes))
            OUT["children"] = [p for p in descendants(me) if stat_fields(p)[0] != "Z"]
            OUT["fds"] = len(os.listdir("/proc/self/fd")) - fds
            base = private_base()
            OUT["sessions"] = [d for d in os.listdir(base) if d.startswith(f"{me}-")]
            cg = cgroups.probe().base
            mine = f"sandhold-{me}-"
            OUT["cgroups"] = [d for d in os.listdir(cg) if d.startswith(mine)] if cg else []
        """,
    )
    assert set(out["outcomes"]) <= {"destroyed", "finished"}  # type: ignore[arg-type]
    assert "destroyed" in out["outcomes"]  # type: ignore[operator]
    assert out["running_after_cancelled_wait"] == "active"
    assert out["after_cancelled_destroy"] == "destroyed"
    assert out["children"] == [] and out["fds"] == 0
    assert out["sessions"] == [] and out["cgroups"] == []


def test_sandboxes_die_with_a_killed_host(world: World) -> None:
    """SPEC §9: SIGKILL the process holding the port; nothing of its sandboxes survives."""
    from portdriver import PRELUDE, leftovers

    code = PRELUDE + textwrap.dedent(
        """
        async def main():
            port = SandboxPort()
            for backend in (SandboxBackend.NATIVE, SandboxBackend.NONE):
                h = await port.launch(spec(backend.value), backend=backend)
                await port.exec(h, "setsid sh -c 'sleep 1000 &'; sleep 1000 & sleep 1000")
            await asyncio.sleep(0.5)
            print("up", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

        asyncio.run(main())
        """
    )
    script = world.mkfile("killed.py", code)
    r = world.ident.run(
        [world.ident.python, str(script)], cwd=world.work, env=world.env(WORK=str(world.work))
    )
    assert r.returncode == -9 and r.stdout.strip() == "up", r.stderr
    deadline = time.monotonic() + 5
    while (left := leftovers(world.work)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []


def test_a_reader_that_falls_behind_gets_refusals_counted_not_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Output waits for a slow reader; refusals cannot: past a bound, one
    violations-dropped event stands for each run of them."""
    import asyncio

    from sandhold.port import flow as port_module
    from sandhold.spec import SandboxBackend, SandboxViolation, StdoutEvent, ViolationEvent

    monkeypatch.setattr(port_module, "MAX_QUEUED_VIOLATIONS", 3)
    sub = port_module.Subscriber(None)

    def refusal(i: int) -> ViolationEvent:
        v = SandboxViolation("network-outbound", f"h{i}.test", rule="not allowed")
        return ViolationEvent("s", SandboxBackend.NATIVE, 1, v)

    for i in range(5):
        sub.put(refusal(i))
    sub.put(StdoutEvent("s", SandboxBackend.NATIVE, 1, b"out"))
    for i in range(5, 7):
        sub.put(refusal(i))
    sub.put(None)

    async def drain() -> list[str]:
        out = []
        while (e := await sub.get()) is not None:
            out.append(
                f"{e.violation.action}:{e.violation.target}" if isinstance(e, ViolationEvent)
                else e.type
            )  # fmt: skip
        return out

    got = asyncio.run(drain())
    assert got == [
        "network-outbound:h0.test",
        "network-outbound:h1.test",
        "network-outbound:h2.test",
        "violations-dropped:2",
        "stdout",
        "violations-dropped:2",
    ]
    assert sub.violations == 0


class _FakeTransport:
    def __init__(self) -> None:
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return False


def test_tiny_writes_pause_reading_once_the_budget_of_real_memory_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sandbox writing a byte at a time: each queued event costs ~130 bytes besides
    its data, and flow control counts that, so reading stops once an unread queue
    takes HIGH_WATER bytes of memory (measured here), not ~130 times as much."""
    import asyncio
    import tracemalloc

    from sandhold.agent import protocol as P
    from sandhold.port import flow as port_module
    from sandhold.port import sandbox as sandbox_module
    from sandhold.spec import SandboxBackend, SandboxSpec

    budget = 1 << 20
    monkeypatch.setattr(port_module, "HIGH_WATER", budget)
    per_event = 1 + port_module.EVENT_COST

    async def flood() -> tuple[bool, int, int, int]:
        sb = sandbox_module.Sandbox(None, SandboxSpec("s", "w"), SandboxBackend.NATIVE)  # type: ignore[arg-type]
        transport = _FakeTransport()
        sb.transport = transport  # type: ignore[assignment]
        sb.next_id = 1001  # exec ids above the small ints Python shares
        sub = sb.subscribe(1000)
        channel = sandbox_module.Channel(sb)
        reads = b"".join(P.frame(P.STDOUT, 1000, b"x") for _ in range(8))
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(250_000):  # 2M events: what 2 MiB of data counted alone allowed
            if transport.paused:
                break
            channel.data_received(reads)
        used = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        return transport.paused, len(sub.queue), sub.pending, used

    paused, queued, counted, used = asyncio.run(flood())
    assert paused
    assert queued * per_event <= budget + 8 * per_event, queued
    assert used <= counted * 1.15, (used, counted)  # what is counted is the memory
    assert used <= budget * 1.2, used


def test_on_events_in_a_real_sandbox_replays_follows_stops_and_ends(world: World) -> None:
    """``port.on_events``: the replay before it returns, a command's output and exit as
    they are read, nothing after its ``stop()``, and ``None`` once at the destroy."""
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            first, kept = [], []
            stop = port.on_events(h, first.append)
            port.on_events(h, kept.append)
            OUT["replay"] = [e.type for e in first]
            await port.run(h, ["echo", "hi"])
            stop()
            await port.run(h, ["echo", "late"])
            await port.destroy(h)
            name = lambda e: "END" if e is None else e.type
            OUT["first"] = [name(e) for e in first]
            OUT["kept"] = [name(e) for e in kept]
            OUT["kept_out"] = [e.data.decode() for e in kept if name(e) == "stdout"]
        """,
    )
    assert out["replay"] == ["starting", "ready"]
    assert out["first"] == ["starting", "ready", "stdout", "exit"]
    kept = out["kept"]
    assert isinstance(kept, list)
    assert kept[:4] == ["starting", "ready", "stdout", "exit"]
    assert kept[-1] == "END" and kept.count("END") == 1
    assert out["kept_out"] == ["hi\n", "late\n"]


def test_a_listener_gets_each_event_as_it_is_read_and_never_holds_the_channel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``on_events``' listener: every event in order, in the call that read its frame,
    then None once; it queues nothing, so output past HIGH_WATER never pauses reading."""
    import asyncio

    from sandhold.agent import protocol as P
    from sandhold.port import flow as port_module
    from sandhold.port import sandbox as sandbox_module
    from sandhold.spec import SandboxBackend, SandboxSpec

    monkeypatch.setattr(port_module, "HIGH_WATER", 1024)

    async def run() -> tuple[list[object], bool]:
        sb = sandbox_module.Sandbox(None, SandboxSpec("s", "w"), SandboxBackend.NATIVE)  # type: ignore[arg-type]
        transport = _FakeTransport()
        sb.transport = transport  # type: ignore[assignment]
        sb.next_id = 2
        got: list[object] = []
        sb.subscribe(None, port_module.Listener(got.append))
        channel = sandbox_module.Channel(sb)
        for i in range(64):  # 64 KiB: 64 times the budget a queued reader may take
            channel.data_received(P.frame(P.STDOUT, 1, bytes([i]) * 1024))
            assert len(got) == i + 1  # already there: no turn of the loop between
        paused = transport.paused
        sb.end_streams()
        sb.end_streams()  # None comes once
        return got, paused

    got, paused = asyncio.run(run())
    assert not paused
    assert got[-1] is None and got.count(None) == 1
    data = [e.data for e in got if e is not None]  # type: ignore[attr-defined]
    assert data == [bytes([i]) * 1024 for i in range(64)]


def test_a_listener_that_raises_stops_alone(caplog: pytest.LogCaptureFixture) -> None:
    """A failing listener is logged and gets nothing more; the channel and the other
    readers go on; an unsubscribed listener (what ``on_events``' stop does) gets no
    more."""
    import asyncio

    from sandhold.agent import protocol as P
    from sandhold.port import flow as port_module
    from sandhold.port import sandbox as sandbox_module
    from sandhold.spec import SandboxBackend, SandboxSpec

    calls: list[object] = []

    def bad(event: object) -> None:
        calls.append(event)
        raise RuntimeError("boom")

    async def run() -> list[object]:
        sb = sandbox_module.Sandbox(None, SandboxSpec("s", "w"), SandboxBackend.NATIVE)  # type: ignore[arg-type]
        sb.transport = _FakeTransport()  # type: ignore[assignment]
        sb.next_id = 2
        good: list[object] = []
        sb.subscribe(None, port_module.Listener(bad))
        later = sb.subscribe(None, port_module.Listener(good.append))
        channel = sandbox_module.Channel(sb)
        channel.data_received(P.frame(P.STDOUT, 1, b"a") + P.frame(P.STDOUT, 1, b"b"))
        sb.unsubscribe(later)
        channel.data_received(P.frame(P.STDOUT, 1, b"c"))
        return [e.data for e in good if e is not None]  # type: ignore[attr-defined]

    with caplog.at_level("ERROR", logger="sandhold"):
        data = asyncio.run(run())
    assert len(calls) == 1  # the first event, then nothing more
    assert data == [b"a", b"b"]  # the other listener, until it unsubscribed
    assert "an event listener failed" in caplog.text


def test_a_command_writing_a_byte_at_a_time_to_nobody_is_held_back(world: World) -> None:
    """Many processes dripping a byte at a time into one exec nobody reads: the port
    stops reading once the queued events take the budget, counting each event's cost
    (with the budget counted as data alone it would queue for minutes)."""
    out = drive(
        world,
        """
        import sandhold.port.flow as pm

        async def main(port):
            pm.HIGH_WATER, pm.LOW_WATER = 256 << 10, 64 << 10
            h = await port.launch(spec())
            drip = "import os, time\\nwhile True:\\n os.write(1, b'x'); time.sleep(0.001)"
            cmd = f"for i in $(seq 32); do python3 -c \\"{drip}\\" & done; wait"
            ex = await port.exec(h, ["sh", "-c", cmd])  # never read
            sb = port._sandboxes["s1"]
            sub = next(s for s in sb.subscribers if s.exec_id == ex.exec_id)
            t = time.monotonic()
            while not sb.paused and time.monotonic() - t < 5:
                await asyncio.sleep(0.05)
            OUT["paused"] = sb.paused
            OUT["seconds"] = time.monotonic() - t
            await asyncio.sleep(0.5)  # paused: nothing more comes in
            OUT["events"] = len(sub.queue)
            OUT["data"] = sum(len(e.data) for e in sub.queue)
            await ex.kill()
            OUT["exit"] = (await ex.wait()).exit_code
        """,
    )
    assert out["paused"], out
    # ~130 bytes of memory per queued event besides its data (see the test above);
    # the rest of one batch of decoded frames (1,024) may land after the pause
    memory = out["events"] * 130 + out["data"]  # type: ignore[operator]
    assert memory <= (256 << 10) + 1024 * 131, out
    assert out["exit"] == 137


def test_reading_stops_within_a_batch_of_one_read_and_the_rest_follows_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One read of the channel can hold 256 KiB of tiny frames (~26,000 events, some
    3.5 MiB once queued): they are decoded a batch at a time, so the queue stops
    near the budget; what is held back follows, in order, as the reader catches up."""
    import asyncio

    from sandhold.agent import protocol as P
    from sandhold.port import flow as port_module
    from sandhold.port import sandbox as sandbox_module
    from sandhold.spec import SandboxBackend, SandboxSpec, StdoutEvent

    budget = 64 << 10
    monkeypatch.setattr(port_module, "HIGH_WATER", budget)
    monkeypatch.setattr(port_module, "LOW_WATER", budget // 4)
    frame = len(P.frame(P.STDOUT, 1, b"0"))
    count = (256 << 10) // frame

    async def flood() -> tuple[int, list[int]]:
        sb = sandbox_module.Sandbox(None, SandboxSpec("s", "w"), SandboxBackend.NATIVE)  # type: ignore[arg-type]
        transport = _FakeTransport()
        sb.transport = transport  # type: ignore[assignment]
        sb.next_id = 2
        sub = sb.subscribe(1)
        channel = sandbox_module.Channel(sb)
        channel.data_received(
            b"".join(P.frame(P.STDOUT, 1, b"%d" % (i % 10)) for i in range(count))
        )
        queued_at_pause = len(sub.queue)
        got = []
        while len(got) < count:
            event = await asyncio.wait_for(sub.get(), 1)
            assert isinstance(event, StdoutEvent)
            got.append(int(event.data))
            sb.maybe_resume_reading()
        return queued_at_pause, got

    queued, got = asyncio.run(flood())
    per_event = 1 + port_module.EVENT_COST
    assert queued <= budget // per_event + sandbox_module.DECODE_BATCH, queued
    assert got == [i % 10 for i in range(count)]
