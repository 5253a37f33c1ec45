"""The in-sandbox agent, driven directly over a socket pair on the host (no sandbox).

These pin the agent's side of docs/agent-protocol.md: hello first, separate
streams per exec, exit after the leader's output, stdin acknowledgements,
signals to process groups, failures before exec, backpressure, clean-up when
the channel ends, the subreaper mode and the pre-exec hook seam. The same agent
runs inside real sandboxes in test_port_lifecycle.py.
"""

from __future__ import annotations

import collections
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandhold.agent import protocol as P
from sandhold.backends.linux import launcher

TESTS = Path(__file__).resolve().parent
ENV = ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"]


# Every test here runs with each of the agent's two reapers: the compiled one the
# launcher hands over (``--reaper FD``, ``_helper/reap.c``) and the Python one it
# falls back to. REAPER is the one the running test's agents get.
REAPER = "python"


@pytest.fixture(autouse=True, params=["compiled", "python"])
def reaper_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    global REAPER
    if request.param == "compiled":
        fd = launcher._reaper_fd()
        if fd < 0:
            pytest.fail("the compiled helper is not built: run scripts/setup")
        os.close(fd)
    REAPER = request.param
    yield REAPER
    REAPER = "python"


def reaper_args() -> tuple[list[int], tuple[str, ...]]:
    """The fds to pass and the agent arguments for the test's reaper."""
    if REAPER == "python":
        return [], ()
    fd = launcher._reaper_fd()
    assert fd >= 0
    return [fd], ("--reaper", str(fd))


class Agent:
    """An agent process and the host end of its channel."""

    def __init__(self, *extra: str, source: bool = False, reaper: int | None = None) -> None:
        self.sock, child = socket.socketpair()
        boot = launcher.agent_boot()
        if source:
            boot = launcher.AgentBoot(boot.python, boot.package_dir, boot.prefix, b"")
        code_fd = launcher._code_fd(boot) if boot.code else -1
        reaper_fds, reaper_extra = (
            reaper_args() if reaper is None else ([reaper], ("--reaper", str(reaper)))
        )
        fds = [child.fileno(), *reaper_fds] + ([code_fd] if code_fd >= 0 else [])
        self.proc = subprocess.Popen(
            launcher.agent_argv(boot, child.fileno(), code_fd, (*reaper_extra, *extra)),
            pass_fds=fds,
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin", "AGENT_OWN": "secret"},
        )
        child.close()
        for fd in [code_fd, *reaper_fds]:
            if fd >= 0:
                os.close(fd)
        self.decoder = P.FrameDecoder(kinds=P.AGENT_KINDS)
        self.frames: collections.deque[tuple[int, int, bytes]] = collections.deque()
        self.others = []
        self.seen = []

    def send(self, kind: int, ident: int, payload: bytes = b"") -> None:
        self.sock.sendall(P.frame(kind, ident, payload))

    def exec(
        self, ident: int, argv: list[str], *, cwd: str = "/", stdin: int = 0, env: list[str] = ENV
    ) -> None:
        fields = P.encode_fields({"argv": argv, "env": env, "cwd": cwd, "stdin": stdin})
        self.send(P.EXEC, ident, fields)

    def recv(self, timeout: float = 10) -> tuple[int, int, bytes]:
        deadline = time.monotonic() + timeout
        while not self.frames:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                raise TimeoutError("no frame from the agent")
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError("the agent closed the channel")
            self.frames.extend(self.decoder.feed(data))
        return self.frames.popleft()

    def until_exit(self, ident: int) -> tuple[bytes, bytes, dict[str, P.FieldOut], list[int]]:
        """stdout, stderr, the EXIT fields and the kinds seen for ``ident``."""
        out: list[bytes] = []
        err: list[bytes] = []
        kinds = []
        while True:
            mine = [f for f in self.others if f[1] == ident]
            if mine:
                self.others.remove(mine[0])
                kind, i, payload = mine[0]
            else:
                kind, i, payload = self.recv()
            if i != ident:
                self.others.append((kind, i, payload))
                continue
            kinds.append(kind)
            if kind not in (P.STDOUT, P.STDERR):
                self.seen.append((kind, i, payload))
            if kind == P.STDOUT:
                out.append(payload)
            elif kind == P.STDERR:
                err.append(payload)
            elif kind == P.EXIT:
                return b"".join(out), b"".join(err), P.decode_fields(payload), kinds

    others: list[tuple[int, int, bytes]]
    seen: list[tuple[int, int, bytes]]

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def agent() -> Iterator[Agent]:
    a = Agent()
    kind, ident, _payload = a.recv()
    assert (kind, ident) == (P.HELLO, 0)
    yield a
    a.close()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_hello_first_with_version_and_pid() -> None:
    for source in (False, True):
        a = Agent(source=source)
        kind, ident, payload = a.recv()
        fields = P.decode_fields(payload)
        assert (kind, ident, fields["version"], fields["pid"]) == (P.HELLO, 0, 1, a.proc.pid)
        a.close()
        assert a.proc.returncode == 0


def test_concurrent_execs_keep_separate_streams(agent: Agent) -> None:
    agent.exec(1, ["sh", "-c", "sleep 0.3; echo one; echo e1 >&2; exit 1"])
    agent.exec(2, ["sh", "-c", "echo two; echo e2 >&2; exit 2"])
    agent.exec(3, ["sh", "-c", "sleep 0.1; echo three; exit 3"])
    results = {}
    for ident in (2, 3, 1):
        out, err, fields, kinds = agent.until_exit(ident)
        results[ident] = (out, err, fields["code"])
        assert kinds[0] == P.STARTED and kinds[-1] == P.EXIT
    assert results == {
        1: (b"one\n", b"e1\n", 1),
        2: (b"two\n", b"e2\n", 2),
        3: (b"three\n", b"", 3),
    }


def test_environment_and_cwd_are_exactly_what_was_sent(agent: Agent, tmp_path: Path) -> None:
    agent.exec(1, ["env"], env=["ONLY=this", "PATH=/usr/bin:/bin"], cwd=str(tmp_path))
    out, _, _, _ = agent.until_exit(1)
    assert sorted(out.decode().split()) == ["ONLY=this", "PATH=/usr/bin:/bin"]
    agent.exec(2, ["pwd"], cwd=str(tmp_path))
    assert agent.until_exit(2)[0].decode().strip() == str(tmp_path)


@pytest.mark.parametrize(
    ("argv", "cwd", "code", "error"),
    [
        (["no-such-command-x"], "/", 127, "no-such-command-x: command not found"),
        (["/no/such/file"], "/", 127, "/no/such/file: No such file or directory"),
        (["/etc/passwd"], "/", 126, "/etc/passwd: Permission denied"),
        (["true"], "/no/such/dir", 126, "chdir /no/such/dir: No such file or directory"),
    ],
)
def test_failures_before_exec(
    agent: Agent, argv: list[str], cwd: str, code: int, error: str
) -> None:
    agent.exec(1, argv, cwd=cwd)
    _, _, fields, _ = agent.until_exit(1)
    assert fields["code"] == code
    assert P.text(fields["error"]) == error


def test_bad_requests_get_an_exit_not_a_crash(agent: Agent) -> None:
    agent.send(P.EXEC, 5, P.encode_fields({"argv": [], "env": []}))
    _, _, fields, _ = agent.until_exit(5)
    assert fields["code"] == 126 and P.text(fields["error"]) == "exec request needs argv"
    agent.send(P.EXEC, 6, b"\x00\x01garbage")
    _, _, fields, _ = agent.until_exit(6)
    assert fields["code"] == 126 and b"bad exec request" in fields["error"]  # type: ignore[operator]
    agent.exec(7, ["sleep", "1"])
    agent.exec(7, ["true"])  # duplicate id while 7 runs
    _, _, fields, _ = agent.until_exit(7)
    assert b"already in use" in fields["error"]  # type: ignore[operator]


def test_exit_follows_all_of_the_leaders_output(agent: Agent) -> None:
    agent.exec(1, ["head", "-c", "5000000", "/dev/zero"])
    out, _, fields, kinds = agent.until_exit(1)
    assert len(out) == 5_000_000 and fields["code"] == 0 and kinds[-1] == P.EXIT


def test_background_output_may_follow_the_exit(agent: Agent) -> None:
    agent.exec(1, ["sh", "-c", "(sleep 0.3; echo late) & echo early"])
    out, _, _, _ = agent.until_exit(1)
    assert out == b"early\n"
    kind, ident, payload = agent.recv()
    assert (kind, ident, payload) == (P.STDOUT, 1, b"late\n")


def test_stdin_is_streamed_and_acknowledged(agent: Agent) -> None:
    agent.exec(1, ["cat"], stdin=1)
    acked = 0
    for chunk in (b"first\n", b"second\n"):
        agent.send(P.STDIN, 1, chunk)
        seen = b""
        while seen != chunk:
            kind, _, payload = agent.recv()
            if kind == P.STDOUT:
                seen += payload
            elif kind == P.STDIN_ACK:
                acked += P.decode_fields(payload)["n"]  # type: ignore[operator]
    agent.send(P.STDIN, 1, b"")
    _, _, fields, _ = agent.until_exit(1)
    acked += sum(P.decode_fields(p)["n"] for k, _i, p in agent.others if k == P.STDIN_ACK)  # type: ignore[misc]
    assert fields["code"] == 0 and acked == len(b"first\nsecond\n")


def test_large_stdin(agent: Agent) -> None:
    agent.exec(1, ["wc", "-c"], stdin=1)
    blob = os.urandom(1 << 20)
    for _ in range(8):
        agent.send(P.STDIN, 1, blob)
    agent.send(P.STDIN, 1, b"")
    out, _, fields, _ = agent.until_exit(1)
    assert out.strip() == str(8 << 20).encode() and fields["code"] == 0


def test_stdin_of_a_command_that_stopped_reading(agent: Agent) -> None:
    agent.exec(1, ["sh", "-c", "exec 0<&-; sleep 0.2"], stdin=1)
    time.sleep(0.1)
    agent.send(P.STDIN, 1, b"x" * 100)
    while True:
        kind, _, payload = agent.recv()
        if kind == P.STDIN_ACK:
            fields = P.decode_fields(payload)
            assert fields == {"n": 100, "closed": 1}
            break
    agent.until_exit(1)


def test_signals_reach_the_process_group(agent: Agent) -> None:
    agent.exec(1, ["sh", "-c", "sleep 30 & echo $!; wait"])
    kind, _, payload = agent.recv()
    assert kind == P.STARTED
    kind, _, payload = agent.recv()
    child = int(payload)
    agent.send(P.SIGNAL, 1, P.encode_fields({"signo": 15, "group": 0}))  # the leader only
    _, _, fields, _ = agent.until_exit(1)
    assert (fields["code"], fields["signal"]) == (143, 15)
    assert alive(child)
    agent.send(P.SIGNAL, 1, P.encode_fields({"signo": 9, "group": 1}))  # the group, after exit
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not alive(child)


def test_output_backpressure_blocks_the_writer(agent: Agent) -> None:
    agent.exec(1, ["head", "-c", "100000000", "/dev/zero"])
    _, _, payload = agent.recv()
    pid = P.decode_fields(payload)["pid"]
    time.sleep(1.0)  # read nothing: the agent must stop reading the pipe
    assert alive(pid)  # type: ignore[arg-type]
    with open(f"/proc/{agent.proc.pid}/status") as f:
        rss_kb = int(next(ln for ln in f if ln.startswith("VmRSS")).split()[1])
    assert rss_kb < 64 * 1024
    out, _, fields, _ = agent.until_exit(1)
    assert len(out) == 100_000_000 and fields["code"] == 0


def test_ping(agent: Agent) -> None:
    payload = P.encode_fields({"t": 5})
    agent.send(P.PING, 99, payload)
    assert agent.recv() == (P.PONG, 99, payload)


@pytest.mark.parametrize("how", ["eof", "shutdown", "garbage"])
def test_the_end_of_the_channel_kills_every_exec(how: str) -> None:
    a = Agent()
    a.recv()
    a.exec(1, ["sleep", "100"])
    pid = P.decode_fields(a.recv()[2])["pid"]
    if how == "shutdown":
        a.send(P.SHUTDOWN, 0)
    elif how == "garbage":
        a.sock.sendall(P.HEADER.pack(1, 0x7F, 0) + b"x")
    a.close()
    assert a.proc.returncode == 0
    assert not alive(pid)  # type: ignore[arg-type]


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _started(pid: int) -> str | None:
    """``pid``'s start time (with the pid, one process: pids are reused), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def _wait_gone(procs: list[tuple[int, str | None]], timeout: float = 5) -> list[int]:
    """Those of (pid, start time) still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid, t in procs if t is not None and _started(pid) == t]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)


# A setsid child, a double-forked daemon, and a child in a session and group of its own
# that forks again: none stays in the command's process group.
ESCAPERS = (
    "setsid sleep 1000 & echo $!; "
    "sh -c 'sleep 1000 & echo $!' </dev/null; "
    "setsid sh -c 'sleep 1000 & echo $!; exec sleep 1000' & echo $!; "
)


def test_orphans_are_adopted_by_the_exec_reaper_and_killed_at_the_end() -> None:
    a = Agent("--subreaper")
    a.recv()
    a.exec(1, ["sh", "-c", "setsid sleep 100 & echo $!"])
    out, _, _, _ = a.until_exit(1)
    orphan = int(out)
    reaper = _parent(orphan)
    assert reaper != a.proc.pid and _parent(reaper) == a.proc.pid  # the exec's reaper, ours
    a.send(P.SHUTDOWN, 0)
    a.close()
    assert not alive(orphan)


def test_a_tree_kill_ends_every_process_the_command_made() -> None:
    """A timeout's kill (``tree``) ends what left the command's group; a group kill does not."""
    for tree in (1, 0):
        a = Agent()
        a.recv()
        a.exec(1, ["sh", "-c", ESCAPERS + "sleep 1000"])
        assert a.recv()[0] == P.STARTED
        pids: list[int] = []
        while len(pids) < 4:
            _kind, _, payload = a.recv()
            pids += [int(x) for x in payload.split()]
        deadline = time.monotonic() + 5  # each has left its group (setsid) once it is sleep
        while not all(_comm(p) == "sleep" for p in pids) and time.monotonic() < deadline:
            time.sleep(0.005)
        procs = [(pid, _started(pid)) for pid in pids]
        assert all(t is not None for _, t in procs)
        a.send(P.SIGNAL, 1, P.encode_fields({"signo": 9, "group": 1, "tree": tree}))
        _, _, fields, _ = a.until_exit(1)
        assert (fields["code"], fields["signal"]) == (137, 9)
        left = _wait_gone(procs, 5 if tree else 0.2)
        a.send(P.SHUTDOWN, 0)
        a.close()
        if tree:
            assert left == []
        else:
            # the group kill leaves all but the double-forked one, still in the group
            assert left == pids[:1] + pids[2:]
        assert _wait_gone(procs) == []  # and the agent's end takes them all


def test_a_command_that_kills_its_reaper_still_gets_its_exit() -> None:
    """The reaper may be killed by the command; the command becomes the agent's, its
    status is still reported, and a tree kill still ends it."""
    a = Agent()
    a.recv()
    a.exec(1, ["sh", "-c", "kill -9 $PPID; sleep 0.2; exit 7"])
    _, _, fields, _ = a.until_exit(1)
    assert (fields["code"], fields["signal"]) == (7, 0)
    a.exec(2, ["sh", "-c", "kill -9 $PPID; echo $$; exec sleep 1000"])
    assert a.recv()[0] == P.STARTED
    _kind, _, payload = a.recv()
    leader = int(payload)
    deadline = time.monotonic() + 5
    while _parent(leader) != a.proc.pid and time.monotonic() < deadline:
        time.sleep(0.01)
    a.send(P.SIGNAL, 2, P.encode_fields({"signo": 9, "group": 1, "tree": 1}))
    _, _, fields, _ = a.until_exit(2)
    assert (fields["code"], fields["signal"]) == (137, 9)
    a.close()


def test_no_inherited_fd_reaches_a_command_however_high() -> None:
    """An fd the agent inherited is closed however high: 70000 where the hard limit
    lets the test raise the soft one that far, else the top of the table; and above
    the soft limit the agent starts with (where ``os.closerange`` without
    ``close_range`` would stop)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:  # root may raise the hard limit too, given CAP_SYS_RESOURCE
        resource.setrlimit(resource.RLIMIT_NOFILE, (70001, max(hard, 70001)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    high = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 1
    r, w = os.pipe()
    try:
        os.dup2(r, high)  # inheritable
        os.dup2(r, 1000)
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        )
        sock, child = socket.socketpair()
        boot = launcher.agent_boot()
        code_fd = launcher._code_fd(boot)
        # fork/exec with the fds open: what a careless harness would hand over
        reaper_fds, reaper_extra = reaper_args()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            for fd in (child.fileno(), code_fd, *reaper_fds):
                os.set_inheritable(fd, True)
            os.execv(boot.python, launcher.agent_argv(boot, child.fileno(), code_fd, reaper_extra))
        child.close()
        for fd in (code_fd, *reaper_fds):
            os.close(fd)
        a = Agent.__new__(Agent)
        a.sock, a.decoder = sock, P.FrameDecoder(kinds=P.AGENT_KINDS)
        a.frames, a.others, a.seen = collections.deque(), [], []
        a.recv()
        a.exec(1, ["sh", "-c", "ls /proc/self/fd"])
        out, _, _, _ = a.until_exit(1)
        assert sorted(int(x) for x in out.split()) == [0, 1, 2, 3]  # 3: ls's own listing
        assert not os.path.exists(f"/proc/{pid}/fd/{high}")
        sock.close()
        os.waitpid(pid, 0)
    finally:
        for fd in (r, w, high, 1000):
            try:
                os.close(fd)
            except OSError:
                pass
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert high >= 19999  # what this host allows (its hard limit: 20000)


def test_pre_exec_hook_seam(tmp_path: Path) -> None:
    a = Agent("--path", str(TESTS), "--hook", "agent_hook_example:factory")
    a.recv()
    a.exec(4, ["true"], cwd=str(tmp_path))
    _, _, fields, _ = a.until_exit(4)
    assert fields["code"] == 0
    frames = a.seen + a.others
    deadline = time.monotonic() + 5
    while not any(k == P.VIOLATION for k, _, _ in frames) and time.monotonic() < deadline:
        frames.append(a.recv())
    started = next(P.decode_fields(p) for k, i, p in frames if k == P.STARTED and i == 4)
    ident, vf = next((i, P.decode_fields(p)) for k, i, p in frames if k == P.VIOLATION)
    pid, cwd = P.text(vf["target"]).split()
    # the hook ran in the child itself (same pid as the exec), after chdir
    assert (ident, int(pid), cwd) == (4, started["pid"], str(tmp_path))
    assert (P.text(vf["action"]), P.text(vf["rule"])) == ("hook-saw", "test")
    a.exec(5, ["refuse-me"])
    _, _, fields, _ = a.until_exit(5)
    assert fields["code"] == 126
    assert P.text(fields["error"]) == "pre-exec hook: refused by the example hook"
    a.close()


def test_agent_imports_only_what_it_needs() -> None:
    boot = launcher.agent_boot()
    code = "import sys;sys.path.insert(0,sys.argv[1]);import sandhold.agent.main"
    out = subprocess.run(
        [
            boot.python,
            "-I",
            "-S",
            "-X",
            "importtime",
            "-c",
            code,
            os.path.dirname(boot.package_dir),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    loaded = {ln.rsplit("|", 1)[1].strip() for ln in out.stderr.splitlines() if "|" in ln}
    assert loaded & {"signal", "enum", "socket", "json", "ctypes", "subprocess", "re"} == set()
    assert sys.version_info >= (3, 11)
