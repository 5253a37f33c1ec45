"""Process semantics of the ``sandhold`` command (SPEC §9, §1), with real bubblewrap.

A wrapped command must behave as if it were unwrapped: stdin, stdout and stderr
pass through byte for byte (a stdio MCP server speaks JSON-RPC through sandhold
exactly as without it), the exit status is the command's own or 128+N for death
by signal N, signals sent to sandhold reach every process of the sandbox, and a
SIGKILLed sandhold leaves no process of its sandbox behind. The command-line
grammar (argv form, ``-c``, one quoted shell string, ``--help``, ``--explain``,
unknown options, missing commands) is checked here too, because it decides what
runs. Every test runs as root and as the unprivileged ``sandhold-test`` user.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from conftest import World
from sandhold.backends.linux.supervisor.landlock import landlock_abi

pytestmark = pytest.mark.sandbox

TIMEOUT = 10.0


def _write_settings_allow_work(world: World) -> Path:
    return world.settings({"filesystem": {"allowWrite": [str(world.work)]}})


def _read_line(stream: IO[bytes], timeout: float = TIMEOUT) -> bytes:
    """One line from a pipe, or fail after ``timeout`` seconds (never hang the suite)."""
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, f"no line within {timeout}s"
    return stream.readline()


def _wait_for(
    predicate: Callable[[], bool], timeout: float = TIMEOUT, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _kill_quietly(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=TIMEOUT)


# --- stdio -------------------------------------------------------------------------


def test_binary_stdin_stdout_pass_through_cat(world: World) -> None:
    data = bytes(range(256)) * 64 + b"\r\n\x00\xff" + os.urandom(256 * 1024)
    proc = world.popen(
        "--", "cat", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = proc.communicate(data, timeout=TIMEOUT * 3)
    assert proc.returncode == 0, err
    assert out == data


MCP_SERVER = textwrap.dedent(
    """\
    import json
    import sys

    sys.stderr.write("echo-server: started\\n")
    sys.stderr.flush()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.write(f"echo-server: got {request.get('method')}\\n")
        sys.stderr.flush()
        if "id" not in request:
            continue  # a notification gets no reply
        if request["method"] == "initialize":
            result = {"protocolVersion": "2024-11-05", "serverInfo": {"name": "echo"}}
        elif request["method"] == "echo":
            result = request["params"]
        else:
            reply = {
                "jsonrpc": "2.0",
                "id": request["id"],
                "error": {"code": -32601, "message": "method not found"},
            }
            sys.stdout.write(json.dumps(reply, ensure_ascii=False) + "\\n")
            sys.stdout.flush()
            continue
        reply = {"jsonrpc": "2.0", "id": request["id"], "result": result}
        sys.stdout.write(json.dumps(reply, ensure_ascii=False) + "\\n")
        sys.stdout.flush()
    sys.stderr.write("echo-server: stdin closed\\n")
    """
)


def _expected_reply(request: dict[str, object]) -> dict[str, object] | None:
    if "id" not in request:
        return None
    if request["method"] == "initialize":
        result: object = {"protocolVersion": "2024-11-05", "serverInfo": {"name": "echo"}}
    elif request["method"] == "echo":
        result = request["params"]
    else:
        return {
            "jsonrpc": "2.0",
            "id": request["id"],
            "error": {"code": -32601, "message": "method not found"},
        }
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


def test_stdio_json_rpc_server_round_trips(world: World) -> None:
    script = world.mkfile("work/echo_server.py", MCP_SERVER)
    requests: list[dict[str, object]] = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "echo", "params": {"text": "hello"}},
        {"jsonrpc": "2.0", "id": "three", "method": "echo", "params": {"text": "héllo ✓ 🦀"}},
        {"jsonrpc": "2.0", "id": 4, "method": "echo", "params": {"blob": "x" * 100_000}},
        {"jsonrpc": "2.0", "id": 5, "method": "no/such/method", "params": None},
        {"jsonrpc": "2.0", "id": 6, "method": "echo", "params": [1, 2.5, None, True, "\t\\"]},
    ]
    proc = world.popen(
        "--",
        world.ident.python,
        str(script),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        for request in requests:
            proc.stdin.write(json.dumps(request, ensure_ascii=False).encode() + b"\n")
            proc.stdin.flush()
            expected = _expected_reply(request)
            if expected is None:
                continue
            line = _read_line(proc.stdout)
            # exact bytes: what the server wrote, nothing added, nothing re-encoded
            assert line == json.dumps(expected, ensure_ascii=False).encode() + b"\n"
        proc.stdin.close()
        rest = proc.stdout.read()
        assert rest == b"", "nothing but replies on stdout"
        proc.wait(timeout=TIMEOUT)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
    finally:
        _kill_quietly(proc)
    assert proc.returncode == 0, err
    assert "echo-server: started" in err
    assert "echo-server: got notifications/initialized" in err
    assert "echo-server: stdin closed" in err


def test_stderr_is_separate_from_stdout(world: World) -> None:
    r = world.sandhold("-c", "echo to-stdout; echo to-stderr >&2; echo again-stdout")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "to-stdout\nagain-stdout\n"
    assert "to-stderr\n" in r.stderr
    assert "to-stdout" not in r.stderr


def test_sigpipe_has_default_disposition_in_the_child(world: World) -> None:
    # Python ignores SIGPIPE; an unwrapped `yes | head` ends because `yes` dies of it.
    r = world.sandhold("-c", "yes | head -n 2", timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "y\ny\n"


# --- exit status -------------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 3, 125, 126, 127, 255])
def test_exit_status_passes_through(world: World, code: int) -> None:
    r = world.sandhold("--", "sh", "-c", f"exit {code}")
    assert r.returncode == code, r.stderr


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGSEGV, signal.SIGHUP, signal.SIGUSR1]
)
def test_death_by_signal_exits_128_plus_n(world: World, sig: signal.Signals) -> None:
    r = world.sandhold("--", "sh", "-c", f"kill -{sig.name.removeprefix('SIG')} $$")
    assert r.returncode == 128 + sig.value, r.stderr


# --- signals sent to sandhold --------------------------------------------------------

TRAPPING_CHILD = textwrap.dedent(
    """\
    import os
    import signal
    import sys
    import time

    sig = getattr(signal, sys.argv[1])
    marker, code = sys.argv[2], int(sys.argv[3])

    def handler(signum, frame):
        with open(marker, "w") as f:
            f.write(f"{signal.Signals(signum).name} pid={os.getpid()}\\n")
        os._exit(code)

    signal.signal(sig, handler)
    print("ready", flush=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(99)
    """
)


def _start_ready(world: World, *args: str) -> subprocess.Popen[bytes]:
    proc = world.popen(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        line = _read_line(proc.stdout)
    except AssertionError:
        _kill_quietly(proc)
        assert proc.stderr is not None
        raise AssertionError(f"sandbox never got ready: {proc.stderr.read().decode()!r}") from None
    assert line == b"ready\n", line
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_to_sandhold_reaches_trapping_child(world: World, sig: signal.Signals) -> None:
    settings = _write_settings_allow_work(world)
    script = world.mkfile("work/trap.py", TRAPPING_CHILD)
    marker = world.work / f"got-{secrets.token_hex(4)}"
    proc = _start_ready(
        world,
        "-s",
        str(settings),
        "--",
        world.ident.python,
        str(script),
        sig.name,
        str(marker),
        "42",
    )
    try:
        os.kill(proc.pid, sig)
        proc.wait(timeout=TIMEOUT)
    finally:
        _kill_quietly(proc)
    assert proc.stderr is not None
    assert proc.returncode == 42, proc.stderr.read().decode()
    assert marker.read_text().startswith(sig.name)


def test_signal_to_sandhold_reaches_trapping_shell(world: World) -> None:
    settings = _write_settings_allow_work(world)
    marker = world.work / f"got-{secrets.token_hex(4)}"
    script = f"trap 'echo TERM > {marker}; exit 23' TERM; echo ready; sleep 30 & wait $!; exit 99"
    proc = _start_ready(world, "-s", str(settings), "-c", script)
    try:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=TIMEOUT)
    finally:
        _kill_quietly(proc)
    assert proc.returncode == 23
    assert marker.read_text() == "TERM\n"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_to_sandhold_kills_untrapping_child(world: World, sig: signal.Signals) -> None:
    # python3 with default dispositions: SIGINT raises KeyboardInterrupt, so use a
    # program that has none of its own handlers.
    proc = _start_ready(world, "-c", "echo ready; exec sleep 30")
    try:
        os.kill(proc.pid, sig)
        proc.wait(timeout=TIMEOUT)
    finally:
        _kill_quietly(proc)
    assert proc.returncode == 128 + sig.value


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_to_sandhold_reaches_grandchild(world: World, sig: signal.Signals) -> None:
    # The shell ignores the signal, so only a signal sent to the grandchild itself
    # can make it write the marker and give the shell its exit status.
    settings = _write_settings_allow_work(world)
    script = world.mkfile("work/trap.py", TRAPPING_CHILD)
    marker = world.work / f"got-{secrets.token_hex(4)}"
    shell = (
        f"trap '' {sig.name.removeprefix('SIG')}; "
        f"{world.ident.python} {script} {sig.name} {marker} 17 & wait $!; exit $?"
    )
    proc = _start_ready(world, "-s", str(settings), "-c", shell)
    try:
        os.kill(proc.pid, sig)
        proc.wait(timeout=TIMEOUT)
    finally:
        _kill_quietly(proc)
    assert proc.returncode == 17
    assert marker.read_text().startswith(sig.name)


def test_signal_reaches_whole_tree_sleep_and_wait(world: World) -> None:
    # sh -c 'sleep 100 & wait': nothing traps; the tree must end promptly with 128+N.
    proc = _start_ready(world, "-c", "sleep 100 & echo ready; wait")
    try:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=TIMEOUT)
    finally:
        _kill_quietly(proc)
    assert proc.returncode == 128 + signal.SIGTERM


def _pids_with_marker(marker: bytes, exclude: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == exclude:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if marker in f.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def test_sigkill_of_sandhold_leaves_no_sandbox_process(world: World) -> None:
    token = str(secrets.randbelow(10**9) + 10**9)
    forker = "import os, time; os.fork(); os.fork(); time.sleep(1000)"
    shell = f"sleep 1000.{token} & {world.ident.python} -c '{forker}' {token} & wait"
    proc = world.popen("-c", shell, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = token.encode()
    try:
        # two bwraps (outer, and init of the PID namespace), sh, sleep, 4 pythons
        _wait_for(
            lambda: len(_pids_with_marker(marker, proc.pid)) >= 8,
            what="the sandbox's processes to start",
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=TIMEOUT)
        _wait_for(
            lambda: not _pids_with_marker(marker, proc.pid),
            timeout=5,
            what="every sandbox process to die after SIGKILL of sandhold",
        )
    finally:
        _kill_quietly(proc)
        for pid in _pids_with_marker(marker, proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# --- command-line grammar ------------------------------------------------------------


def test_command_runs_in_callers_cwd(world: World) -> None:
    sub = world.mkdir("work/deeper/sub")
    r = world.sandhold("--", "pwd", cwd=sub)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{sub}\n"
    r = world.sandhold("-c", 'pwd; echo "$PWD"', cwd=sub)
    assert r.stdout == f"{sub}\n{sub}\n"


def test_one_quoted_string_is_a_shell_command(world: World) -> None:
    r = world.sandhold("echo hi")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hi\n"
    r = world.sandhold("echo a && echo b | tr b c; exit 4")
    assert r.returncode == 4
    assert r.stdout == "a\nc\n"


def test_dash_c_passes_arg0_and_args(world: World) -> None:
    r = world.sandhold("-c", "echo $0 $1", "a", "b")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "a b\n"


def test_argv_form_does_not_split_a_string(world: World) -> None:
    r = world.sandhold("--", "echo hi")
    assert r.returncode == 127
    assert r.stdout == ""
    assert "echo hi" in r.stderr
    assert "not found" in r.stderr


def test_missing_command_exits_127_with_message(world: World) -> None:
    name = f"no-such-command-{secrets.token_hex(4)}"
    r = world.sandhold("--", name, "arg")
    assert r.returncode == 127
    assert name in r.stderr
    assert "not found" in r.stderr


def test_missing_command_in_shell_string_exits_127(world: World) -> None:
    name = f"no-such-command-{secrets.token_hex(4)}"
    r = world.sandhold(name)
    assert r.returncode == 127
    assert name in r.stderr


def test_non_executable_command_exits_126(world: World) -> None:
    # It exists, so not 127 and not "command not found": as `env`, `nohup`, `timeout`
    # and every shell do, a command that cannot be executed gives 126.
    world.mkfile("work/not-executable.sh", "echo should-not-run\n", mode=0o644)
    r = world.sandhold("--", "./not-executable.sh")
    assert r.stdout == ""
    assert "not-executable.sh" in r.stderr
    assert "not found" not in r.stderr, r.stderr
    assert r.returncode == 126, r.stderr


def test_command_hidden_by_policy_is_not_a_sandbox_start_failure(world: World) -> None:
    # The sandbox starts fine; the command in it cannot be executed (denyRead).
    # The shell form reports 126, and the argv form must not report 125 ("the
    # sandbox failed to start"), which sends the user hunting for a broken set-up.
    world.mkfile("work/hidden/run.sh", "#!/bin/sh\necho should-not-run\n", mode=0o755)
    settings = world.settings({"filesystem": {"denyRead": [str(world.work / "hidden")]}})
    r = world.sandhold("-s", str(settings), "-c", "./hidden/run.sh")
    assert r.returncode == 126, r.stderr
    r = world.sandhold("-s", str(settings), "--", "./hidden/run.sh")
    assert r.stdout == ""
    assert "run.sh" in r.stderr
    assert "failed to start" not in r.stderr, r.stderr
    assert r.returncode == 126, r.stderr


def test_help_exits_0_and_shows_examples(world: World) -> None:
    for flag in ("--help", "-h"):
        r = world.sandhold(flag)
        assert r.returncode == 0, r.stderr
        assert "usage: sandhold" in r.stdout
        assert "examples:" in r.stdout
        assert "sandhold -- " in r.stdout
        assert "-c 'SHELL COMMAND'" in r.stdout
        examples = r.stdout.split("examples:", 1)[1]
        assert "sandhold -- " in examples  # argv form
        assert "sandhold '" in examples  # one quoted shell string


@pytest.mark.parametrize(
    "args",
    [
        ("--frobnicate", "--", "true"),
        ("-Z", "echo hi"),
        ("--settings",),
        ("-c",),
        ("--backend", "bogus", "--", "touch", "ran"),
        (),
    ],
)
def test_bad_usage_exits_2(world: World, args: tuple[str, ...]) -> None:
    marker = world.work / "ran"
    r = world.sandhold(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("sandhold:")
    assert r.stdout == ""
    assert not marker.exists()


def test_unknown_option_is_named(world: World) -> None:
    r = world.sandhold("--frobnicate", "--", "true")
    assert r.returncode == 2
    assert "--frobnicate" in r.stderr


def test_explain_prints_policy_and_runs_nothing(world: World) -> None:
    settings = _write_settings_allow_work(world)
    marker = world.work / f"marker-{secrets.token_hex(4)}"
    for args in (
        ("--", "touch", str(marker)),
        (f"touch {marker}",),
        ("-c", f"touch {marker}"),
    ):
        r = world.sandhold("--explain", "-s", str(settings), *args)
        assert r.returncode == 0, r.stderr
        assert "effective policy" in r.stdout
        assert str(world.work) in r.stdout  # the writable root is shown
        assert "touch" in r.stdout
        assert not marker.exists()
    # control: the same command without --explain does create it
    r = world.sandhold("-s", str(settings), "--", "touch", str(marker))
    assert r.returncode == 0, r.stderr
    assert marker.exists()


# --- Landlock on every launch: signals, and the terminal by name -----------------------

# default: no supervisor; writable: the supervised front; egress: bwrap started by the
# network namespace's helper (netns.spawn_in_netns)
LAUNCHES = {
    "default": None,
    "writable": {"filesystem": {"allowWrite": ["."]}},
    "egress": {"network": {"allowedDomains": ["example.com"]}},
}


@pytest.mark.skipif(landlock_abi() < 6, reason="signal scoping needs Landlock ABI 6")
@pytest.mark.parametrize("helper", ["1", "0"], ids=["with-front", "python-front"])
@pytest.mark.parametrize("settings", LAUNCHES.values(), ids=LAUNCHES.keys())
def test_the_command_may_not_signal_outside_its_landlock_domain(
    world: World, settings: dict[str, object] | None, helper: str
) -> None:
    """Every launch's command is scoped for signals (ABI 6): the sandbox's init, which
    is outside its domain, answers EPERM; its own processes do not."""
    args = ("-s", str(world.settings(settings))) if settings is not None else ()
    shell = "kill -0 1 2>/dev/null; echo init=$?; kill -0 $$; echo self=$?"
    r = world.sandhold(*args, "-c", shell, env=world.env(SANDHOLD_EXEC_HELPER=helper))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "init=1\nself=0\n", r.stdout


# A small job-control shell: the session leader of a pseudo-terminal, it runs sandhold
# as a job in a process group of its own, gives that group the terminal, waits for it
# (stopped or done) and takes the terminal back, as sh -i does. On a stop it continues
# the job in the foreground (fg). It reports on the fd its first argument names. With
# JOB_BG=1 the job starts in the background (as with &).
JOB_SHELL = textwrap.dedent(
    """\
    import fcntl, json, os, signal, sys, termios
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        signal.signal(signal.SIGTTOU, signal.SIG_DFL)
        os.execvp(sys.argv[2], sys.argv[2:])
    try:
        os.setpgid(pid, pid)
    except PermissionError:
        pass  # the child did, and has exec'd already
    if os.environ.get("JOB_BG") != "1":
        os.tcsetpgrp(0, pid)
    stops = []
    while True:
        _, status = os.waitpid(pid, os.WUNTRACED)
        if not os.WIFSTOPPED(status):
            break
        stops.append(signal.Signals(os.WSTOPSIG(status)).name)
        os.tcsetpgrp(0, os.getpgrp())
        os.write(1, b"shell: job stopped\\r\\n")
        os.tcsetpgrp(0, pid)
        os.killpg(pid, signal.SIGCONT)
    terminal_back = os.tcgetpgrp(0) == pid  # sandhold's group, not the sandbox's
    os.tcsetpgrp(0, os.getpgrp())
    report = {"status": os.waitstatus_to_exitcode(status), "stops": stops,
              "terminal_back": terminal_back}
    os.write(int(sys.argv[1]), json.dumps(report).encode())
    """
)


def _in_terminal(
    world: World,
    shell: str,
    keys: list[tuple[bytes, bytes]],
    *args: str,
    bg: bool = False,
    helper: str = "1",
) -> tuple[dict[str, object], bytes]:
    """Run ``sandhold [args] -c shell`` as a job in a pseudo-terminal; after the output
    shows each ``(wait_for, send)``'s first item, type its second. Returns the job
    shell's report and what the terminal showed."""
    script = world.mkfile("jobshell.py", JOB_SHELL)
    master, slave = os.openpty()
    world.ident.chown(os.ttyname(slave))  # the user's terminal, as after a login
    report_r, report_w = os.pipe()
    argv = [world.ident.python, str(script), str(report_w)]
    argv += [world.ident.python, "-P", "-m", "sandhold"]
    proc = world.ident.popen(
        [*argv, *args, "-c", shell],
        cwd=world.work,
        env=world.env(TERM="dumb", JOB_BG="1" if bg else "0", SANDHOLD_EXEC_HELPER=helper),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        pass_fds=(report_w,),
        start_new_session=True,
    )
    os.close(slave)
    os.close(report_w)
    seen = b""
    try:
        for wait_for, send in keys:
            deadline = time.monotonic() + TIMEOUT
            while wait_for not in seen:
                assert time.monotonic() < deadline, f"no {wait_for!r} in {seen!r}"
                ready, _, _ = select.select([master], [], [], 0.1)
                if ready:
                    seen += os.read(master, 4096)
            os.write(master, send)
        with os.fdopen(report_r, "rb") as f:
            ready, _, _ = select.select([f], [], [], TIMEOUT)
            assert ready, f"the job did not end: {seen!r}"
            report = json.loads(f.read() or b"{}")
        proc.wait(timeout=TIMEOUT)
        while select.select([master], [], [], 0.1)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break  # EIO: the terminal's last holder is gone
            if not chunk:
                break
            seen += chunk
    finally:
        _kill_quietly(proc)
        os.close(master)
    return report, seen


@pytest.mark.parametrize("helper", ["1", "0"], ids=["with-front", "python-front"])
@pytest.mark.parametrize("settings", LAUNCHES.values(), ids=LAUNCHES.keys())
def test_the_terminal_reopened_by_name_stays_writable(
    world: World, settings: dict[str, object] | None, helper: str
) -> None:
    """Landlock refuses reopening a host file given as stdio (test_sandbox_fs), not the
    terminal: ``echo error >/dev/stderr`` works as unwrapped."""
    args = ("-s", str(world.settings(settings))) if settings is not None else ()
    shell = "echo via-stdout >/dev/stdout && echo via-stderr >/dev/stderr && echo via-tty >/dev/tty"
    report, seen = _in_terminal(world, shell, [], *args, helper=helper)
    assert b"via-stdout\r\nvia-stderr\r\nvia-tty" in seen, seen
    assert report["status"] == 0, (report, seen)
