"""The in-sandbox agent: one small process that runs the host's exec requests and streams them back.

It is the command the sandbox starts (``python3 -I -S -B -c BOOT PKGDIR --fd N``)
and it speaks the framed protocol of ``sandhold.agent.protocol`` over fd ``N``,
whatever carries it (a socket pair today, vsock or a serial line in a microVM).

Rules:
- Single-threaded: one ``poll`` loop over the channel, each exec's output pipes,
  stdin pipes and pidfds. No signal handlers: exits are seen through pidfds.
- Each exec runs under a reaper of its own: the agent forks the reaper (a child
  subreaper, ``PR_SET_CHILD_SUBREAPER``), which forks the command and reports
  its pid, then its wait status, on a pipe. Whatever the command's tree does
  (``setsid``, a double fork, a session and group of its own), its orphans
  reparent to the reaper, so the exec's whole tree is the reaper's descendants
  while the command runs; a timeout or kill (``SIGNAL`` with ``tree``) stops and
  kills all of them, each through an fd on its ``/proc`` directory opened and
  checked to be below the reaper (a reused pid is never hit). The reaper lingers,
  reaping, until its last descendant is gone. The agent is a subreaper too: a
  command that kills its reaper (it may: same uid, same domain) moves its
  orphans to the agent, where the end of the sandbox finds them.
- With ``--reaper FD`` (an execute-only sealed memfd of ``_helper/sandhold-exec``,
  from the host) the reaper and the command's set-up before ``execve`` are
  compiled code (``reap.c``) the agent ``posix_spawn``s: same steps, same reports,
  same failures, without copying the agent's interpreter twice per exec (those two
  forks, their copy-on-write faults and their teardown were ~5 of ~7 ms of CPU for
  ``true``). Execute-only, it is non-dumpable from its first instruction. A hook
  without ``compiled_pre_exec``, or a spawn that fails, takes the Python reaper
  (``fork``) for that exec; a spawn the kernel refuses (no ``/proc``, a noexec
  memfd) for every later one too.
- No command can freeze the agent by stopping what it starts (they share its
  uid): the compiled reaper is spawned through libc with the GIL released, from a
  thread of its own (``Forker``; ``posix_spawn`` waits for its child's exec), and
  a spawn stuck on a stopped child gets that child killed; a reaper that gives no
  first report and stays stopped is killed, and the command child it forked dies
  with it until its ``execve`` (``PR_SET_PDEATHSIG``); a reaper found stopped
  later is continued, and a tree kill ends the reaper too.
- The command is in a process group of its own (set by both the command and
  the reaper, so a group signal reaches it from the moment its pid is
  reported), gets its own stdin (``/dev/null`` or a pipe), stdout and stderr pipes,
  its working directory and exactly the environment the host sent (nothing of
  the agent's own), then runs the pre-exec hooks and ``execve``. A failure
  before ``execve`` is reported on a close-on-exec pipe and becomes the exec's
  ``EXIT`` with ``error`` set (127: not found, 126: anything else).
- Output frames are sent in the order read; an exec's ``EXIT`` follows
  everything its leader wrote (the pipes are drained when it is reaped).
  Output of background processes that outlive the leader may follow ``EXIT``.
- Backpressure: when more than ``HIGH_WATER`` bytes wait to go to the host, the
  agent stops reading output pipes (writers block) until it drains below
  ``LOW_WATER``; it always keeps reading the channel, so kills get through.
- stdin bytes are acknowledged (``STDIN_ACK``) once written to the pipe, which
  is the host's flow control; a reader that went away acknowledges with
  ``closed`` and the rest is dropped.
- End of the channel, or ``SHUTDOWN``: every exec's process group, and every
  process below the agent, is killed and the agent exits.
- Inherited descriptors: every fd but stdio and the ones named on the command
  line is closed at start, however high (``close_range`` to the top, then what
  ``/proc/self/fd`` still lists); every fd the agent opens is close-on-exec.
- With ``--pid-namespace`` (the ``none`` backend) the agent is the init of a PID
  namespace of its own where the host allows one (``own_pid_namespace``).
- Start-up is on the launch-to-ready path: this module imports only ``os``,
  ``select``, ``struct`` and ``fcntl``, and sends ``HELLO`` first thing; ``ctypes``
  (for ``prctl``) is loaded after it, or before it for ``--pid-namespace``.

Hooks (the pre-exec seam). ``--hook MODULE:FACTORY`` loads ``FACTORY(agent)``
(``--hook MODULE:FACTORY=ARG``: ``FACTORY(agent, ARG)``), an object with three
methods, each called for every exec:

- ``prepare(ctx) -> state`` in the agent before ``fork`` (e.g. make a socket
  pair to receive a seccomp listener fd);
- ``pre_exec(ctx, state)`` in the command's process after ``setpgid``, the stdio ``dup2`` and
  ``chdir``, right before ``execve`` (e.g. install a seccomp filter with
  ``SECCOMP_FILTER_FLAG_NEW_LISTENER`` and send the listener fd over the pair).
  Raising ``OSError`` fails the exec (exit 126, ``error`` says "hook");
- ``spawned(ctx, state, pid)`` in the agent once the command's pid is known; it may
  ``agent.watch(fd, callback)`` and report refusals with
  ``agent.violation(exec_id, action, target, raw, rule)``;
- optionally ``compiled_pre_exec(ctx, state) -> (prog_fd, sock_fd) | None``, in the
  agent: what ``pre_exec`` would do, for the compiled reaper: load the seccomp filter
  read from ``prog_fd`` (``pread``) with ``NEW_LISTENER`` and send the listener over
  ``sock_fd`` (``(-1, -1)``: nothing to do; ``None``: it cannot, the Python reaper
  runs this exec; at most one hook may ask for a filter);
- optionally ``warm()``, once, right after ``HELLO`` and before the loop: set-up
  the first exec would otherwise pay for (a sandbox is launched to run commands,
  and a harness's first one usually comes while the host is still busy). It must
  not raise: what fails there is done again, and reported, by ``prepare``.

``ctx`` is an ``ExecContext`` (exec id, argv, env, cwd). A hook may also set
``agent.fork`` to a function that forks elsewhere: it gets the child's routine
(which never returns) and returns the pid, or raises ``OSError`` (a thread of
its own that entered the command's Landlock domain, so that the agent's main
thread, whose pid the commands can name, stays outside it); and then
``agent.spawn_from`` too, which runs a function (the compiled reaper's
spawn) on that same thread and returns what it returns (``Forker`` does both).

The agent makes itself non-dumpable right after ``HELLO``, before its first
fork, hook or not: the sandboxed processes share its uid, and could otherwise
ptrace it or take its fds (``pidfd_getfd``, ``/proc/PID/fd``), the channel
among them, and speak to the host in its name. (``execve`` makes what it runs
dumpable again.)
"""

from __future__ import annotations

import fcntl
import os
import select
import time

from sandhold.agent import protocol as P

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Sequence
    from typing import Any, Protocol

    class Hook(Protocol):
        def prepare(self, ctx: ExecContext) -> object: ...

        def pre_exec(self, ctx: ExecContext, state: object) -> None: ...

        def spawned(self, ctx: ExecContext, state: object, pid: int) -> None: ...


_signal: Any = __import__("_signal")  # the C module: ``signal`` pulls in enum (4 ms)

HIGH_WATER = 4 << 20
LOW_WATER = 1 << 20
PIPE_SIZE = 256 << 10  # asked of each output pipe; fewer wake-ups per megabyte
DRAIN_READS = 16  # reads per pipe when a leader exits (its output is all buffered)
IOV_MAX = 512
SIGKILL, SIGCONT = 9, 18
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
CLONE_NEWUSER, CLONE_NEWPID = 0x10000000, 0x20000000
MAX_FD = 0x7FFFFFFF  # close_range's top: an fd number is an int
# a reaper's first report: how long a stopped one is waited for, and any one
HEAD_STOPPED_S, HEAD_WAIT_S, HEAD_TICK_MS = 1.0, 30.0, 200
RESUME_EVERY_S = 0.5  # how often stopped reapers are looked for
STOP_ROUNDS = 50  # looks at a tree being stopped before it is killed as it stands
F_SETPIPE_SZ = 1031
POLLIN, POLLOUT = select.POLLIN, select.POLLOUT
POLLERRS = select.POLLHUP | select.POLLERR | select.POLLNVAL
# the compiled reaper cannot run here (no /proc, a noexec memfd, a refused exec)
_REAPER_GONE = frozenset({1, 2, 8, 13, 20, 40})  # EPERM ENOENT ENOEXEC EACCES ENOTDIR ELOOP


class ExecContext:
    """What a hook sees of one exec."""

    __slots__ = ("argv", "cwd", "env", "exec_id")

    def __init__(self, exec_id: int, argv: list[bytes], env: list[bytes], cwd: bytes) -> None:
        self.exec_id, self.argv, self.env, self.cwd = exec_id, argv, env, cwd

    def environment(self) -> dict[bytes, bytes]:
        """The command's environment: ``NAME=VALUE`` items, the last of a name winning;
        an item without ``=`` or a name is dropped."""
        env: dict[bytes, bytes] = {}
        for item in self.env:
            name, sep, value = item.partition(b"=")
            if sep and name:
                env[name] = value
        return env


class _Exec:
    __slots__ = (
        "ctx",
        "ident",
        "pid",
        "readers",
        "reaped",
        "reaper",
        "reaper_proc",
        "stdin_buf",
        "stdin_close",
        "stdin_fd",
    )

    def __init__(self, ident: int, ctx: ExecContext) -> None:
        self.ident = ident
        self.ctx = ctx
        self.pid = 0  # the command
        self.reaper = 0  # its reaper, our child
        self.reaper_proc = 0  # the reaper as /proc numbers it
        self.readers: list[int] = []
        self.reaped = False
        self.stdin_fd = -1
        self.stdin_buf: list[bytes] = []
        self.stdin_close = False


_LIBC: list[Any] = []  # (ctypes, libc), loaded once: reapers call prctl in forked children


def _loaded() -> tuple[Any, Any]:
    """(ctypes, libc), imported on first use."""
    if not _LIBC:
        import ctypes  # 4 ms: loaded after HELLO (module rules)

        _LIBC.append((ctypes, ctypes.CDLL(None, use_errno=True)))
    ctypes, libc = _LIBC[0]
    return ctypes, libc


def _libc(name: str, *args: int) -> None:
    ctypes, libc = _loaded()
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def spawn_released(path: bytes, args: list[bytes], fds: Sequence[int]) -> int:
    """``posix_spawn`` of ``path`` with ``args``, an empty environment, every signal
    blocked and each of ``fds`` at its own number (close-on-exec cleared), through
    libc with the GIL released: ``os.posix_spawn`` holds it while glibc waits for the
    child to exec (a vfork), and a command may SIGSTOP that child on its way, which
    would freeze every thread of the agent (``Forker.call`` must be able to
    notice, and kill it). Returns the pid.

    Raises:
        OSError: what posix_spawn returned.
    """
    ctypes, libc = _loaded()
    actions = ctypes.create_string_buffer(256)  # posix_spawn_file_actions_t: 80 bytes
    attr = ctypes.create_string_buffer(1024)  # posix_spawnattr_t: 336 bytes
    mask = ctypes.create_string_buffer(128)  # sigset_t
    if libc.posix_spawn_file_actions_init(actions) or libc.posix_spawnattr_init(attr):
        raise OSError(12, os.strerror(12))  # ENOMEM: what either can fail with
    try:
        libc.sigfillset(mask)
        err = libc.posix_spawnattr_setsigmask(attr, mask)
        err = err or libc.posix_spawnattr_setflags(attr, ctypes.c_short(0x08))  # SETSIGMASK
        for fd in fds:
            err = err or libc.posix_spawn_file_actions_adddup2(actions, fd, fd)
        argv = (ctypes.c_char_p * (len(args) + 1))(*args, None)
        envp = (ctypes.c_char_p * 1)(None)
        pid = ctypes.c_int(0)
        err = err or libc.posix_spawn(ctypes.byref(pid), path, actions, attr, argv, envp)
    finally:
        libc.posix_spawn_file_actions_destroy(actions)
        libc.posix_spawnattr_destroy(attr)
    if err:
        raise OSError(err, os.strerror(err))
    return int(pid.value)


def _prctl(option: int, value: int) -> None:
    _libc("prctl", option, value, 0, 0, 0)


def close_fds(keep: set[int]) -> None:
    """Close every fd from 3 up but ``keep``, however high: ``close_range`` to the top
    (where it is missing, Python stops at the soft ``RLIMIT_NOFILE``, and an fd above
    a lowered limit stays open), then whatever ``/proc/self/fd`` still lists."""
    low = 3
    for fd in sorted(keep):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, MAX_FD)
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return  # no /proc: close_range was all there is
    for name in names:
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own fd, closed by now


def _nonblocking_pipe() -> tuple[int, int]:
    """A close-on-exec pipe whose read end (ours) does not block."""
    r, w = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(r, False)
    return r, w


class Agent:
    """The agent's state and loop (see module rules)."""

    def __init__(self, fd: int, hooks: Sequence[Hook] = ()) -> None:
        self.fd = fd
        self.hooks = list(hooks)
        # Set right after HELLO, and checked again before every fork (module doc).
        self.undumpable = False
        self.decoder = P.FrameDecoder(kinds=P.HOST_KINDS)
        self.outq: list[bytes | memoryview] = []
        self.out_bytes = 0
        self.execs: dict[int, _Exec] = {}
        self.by_pid: dict[int, _Exec] = {}
        self.handlers: dict[int, Callable[[int, int], None]] = {}
        self.readers: dict[int, tuple[_Exec, int]] = {}  # fd -> (exec, STDOUT/STDERR)
        self.poll = select.poll()
        self.throttled = False
        self.channel_mask = 0
        self.done = False
        self.devnull = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        self._fail_pipes: dict[int, int] = {}  # pid -> read end of its exec-failure pipe
        self._pidfds: dict[int, int] = {}  # command pid -> pidfd, once its reaper died early
        self._reports: dict[int, _Exec] = {}  # read end of a reaper's report pipe -> its exec
        self.reapers: dict[int, int] = {}  # live (unreaped) reaper pid -> its /proc pid
        self.resume_at = 0.0  # when _resume_reapers looks next
        self.fork: Callable[[Callable[[], None]], int] = fork_here  # a hook may replace it
        # --reaper FD: the compiled reaper (module doc); -1 once it cannot run here
        self.reaper_fd = -1
        # runs a spawn (the compiled reaper's) off the main thread: a hook that replaces
        # ``fork`` replaces it too, so that both start children in the same place
        self.spawn_from: Callable[[Callable[[], int]], int] = self._spawn_elsewhere
        self._forker: Forker | None = None

    def _undumpable(self) -> None:
        if not self.undumpable:
            _prctl(PR_SET_DUMPABLE, 0)
            # and adopt what a killed reaper leaves (module rules), before any fork
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
            self.undumpable = True

    # -- sending -------------------------------------------------------------

    def send(self, kind: int, ident: int, payload: bytes = b"") -> None:
        self.outq.append(P.header(kind, ident, len(payload)))
        if payload:
            self.outq.append(payload)
        self.out_bytes += P.HEADER_SIZE + len(payload)

    def send_fields(self, kind: int, ident: int, **fields: P.FieldIn) -> None:
        self.send(kind, ident, P.encode_fields(fields))

    def violation(
        self, exec_id: int, action: str, target: str, raw: str = "", rule: str = ""
    ) -> None:
        """Report a refusal to the host, attributed to ``exec_id`` (for hooks)."""
        self.send_fields(P.VIOLATION, exec_id, action=action, target=target, raw=raw, rule=rule)

    def watch(self, fd: int, callback: Callable[[int, int], None], mask: int = POLLIN) -> None:
        """Call ``callback(fd, events)`` when ``fd`` is ready (for hooks); ``unwatch`` ends it."""
        self.handlers[fd] = callback
        self.poll.register(fd, mask)

    def unwatch(self, fd: int) -> None:
        if self.handlers.pop(fd, None) is not None:
            self.poll.unregister(fd)

    def _flush(self) -> None:
        q = self.outq
        while q:
            try:
                n = os.writev(self.fd, q[:IOV_MAX])
            except BlockingIOError:
                return
            except OSError:
                self.done = True  # the host is gone
                q.clear()
                return
            self.out_bytes -= n
            i = 0
            while i < len(q) and n >= len(q[i]):
                n -= len(q[i])
                i += 1
            del q[:i]
            if n:
                q[0] = memoryview(q[0])[n:]

    # -- the loop ------------------------------------------------------------

    def run(self) -> None:
        os.set_blocking(self.fd, False)
        self.handlers[self.fd] = self._on_channel
        self.poll.register(self.fd, POLLIN)
        self.channel_mask = POLLIN
        self.send_fields(P.HELLO, 0, version=P.VERSION, pid=os.getpid())
        self._flush()
        # after HELLO: ctypes costs milliseconds, off the launch-to-ready path and
        # still before anything else runs in the sandbox
        self._undumpable()
        for hook in self.hooks:
            warm = getattr(hook, "warm", None)
            if warm is not None:
                warm()
        idle_ms = 1000  # orphans (adopted: a subreaper) are reaped at least this often
        while not self.done:
            mask = POLLIN | (POLLOUT if self.outq else 0)
            if mask != self.channel_mask:
                self.poll.modify(self.fd, mask)
                self.channel_mask = mask
            for fd, events in self.poll.poll(idle_ms):
                handler = self.handlers.get(fd)
                if handler is not None:
                    handler(fd, events)
            self._reap()
            self._resume_reapers()
            self._flush()
            self._throttle()
        self._kill_all()
        self._flush_blocking()

    def _resume_reapers(self) -> None:
        """Continue any reaper found stopped, at most every ``RESUME_EVERY_S``. Nothing
        but a command stops one (the host's freezer stops the agent as well, and
        continues every process), and a stopped reaper reports nothing: the exec it
        runs, another command's or the stopper's own, would never end."""
        now = time.monotonic()
        if now < self.resume_at:
            return
        self.resume_at = now + RESUME_EVERY_S
        for reaper in list(self.reapers):
            _signal_if_stopped(reaper, SIGCONT)

    def _throttle(self) -> None:
        if not self.throttled and self.out_bytes > HIGH_WATER:
            self.throttled = True
            for fd in self.readers:
                self.poll.unregister(fd)
        elif self.throttled and self.out_bytes < LOW_WATER:
            self.throttled = False
            for fd in self.readers:
                self.poll.register(fd, POLLIN)

    def _flush_blocking(self) -> None:
        try:
            os.set_blocking(self.fd, True)
            self._flush()
        except OSError:
            pass  # the host is gone: nobody to tell

    # -- the channel -----------------------------------------------------------

    def _on_channel(self, fd: int, events: int) -> None:
        if events & POLLIN or not events & POLLOUT:
            try:
                data = os.read(fd, 1 << 20)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.done = True
                return
            try:
                frames = self.decoder.feed(data)
            except P.ProtocolError as exc:
                self.send_fields(P.LOG, 0, message=f"protocol error from host: {exc}")
                self.done = True
                return
            for kind, ident, payload in frames:
                try:
                    self._dispatch(kind, ident, payload)
                except P.ProtocolError as exc:
                    self.send_fields(P.LOG, 0, message=f"bad frame from host: {exc}")
                    self.done = True
                    return

    def _dispatch(self, kind: int, ident: int, payload: bytes) -> None:
        if kind == P.STDIN:
            self._stdin(ident, payload)
        elif kind == P.EXEC:
            self._exec(ident, payload)
        elif kind == P.SIGNAL:
            fields = P.decode_fields(payload)
            self._signal(
                ident,
                P.integer(fields.get("signo")),
                bool(fields.get("group")),
                bool(fields.get("tree")),
            )
        elif kind == P.PING:
            self.send(P.PONG, ident, payload)
        elif kind == P.SHUTDOWN:
            self.done = True

    # -- exec ------------------------------------------------------------------

    def _exec(self, ident: int, payload: bytes) -> None:
        try:
            fields = P.decode_fields(payload)
        except P.ProtocolError as exc:
            self.send_fields(P.EXIT, ident, code=126, signal=0, error=f"bad exec request: {exc}")
            return
        argv = fields.get("argv")
        env = fields.get("env")
        cwd = fields.get("cwd")
        if ident in self.execs or ident == 0:
            self.send_fields(P.EXIT, ident, code=126, signal=0, error="exec id already in use")
            return
        if not isinstance(argv, list) or not argv or not isinstance(env, list):
            self.send_fields(P.EXIT, ident, code=126, signal=0, error="exec request needs argv")
            return
        ctx = ExecContext(ident, argv, env, cwd if isinstance(cwd, bytes) else b"")
        ex = _Exec(ident, ctx)
        child_fds: list[int] = []
        ours: list[int] = []
        try:
            out_r, out_w = _nonblocking_pipe()
            ours += (out_r, out_w)
            err_r, err_w = _nonblocking_pipe()
            ours += (err_r, err_w)
            fail_r, fail_w = _nonblocking_pipe()
            ours += (fail_r, fail_w)
            child_fds = [out_w, err_w, fail_w]
            for w in (out_w, err_w):
                try:
                    fcntl.fcntl(w, F_SETPIPE_SZ, PIPE_SIZE)
                except OSError:
                    pass  # over the user's pipe-buffer quota: the default size works
            if fields.get("stdin") == 1:
                in_r, in_w = os.pipe2(os.O_CLOEXEC)
                ours += (in_r, in_w)
                os.set_blocking(in_w, False)
                ex.stdin_fd = in_w
                child_fds.append(in_r)
                stdin = in_r
            else:
                stdin = self.devnull
            report_r, report_w = os.pipe2(os.O_CLOEXEC)
            ours += (report_r, report_w)
            child_fds.append(report_w)
            self._undumpable()
            states = [h.prepare(ctx) for h in self.hooks]
            hooks = self.hooks
            stdio = (stdin, out_w, err_w)
            reaper = self._spawn_reaper(ctx, (report_w, fail_w, *stdio), states)
            if reaper < 0:
                reaper = self.fork(
                    lambda: _reaper(report_w, lambda: _child(ctx, stdio, fail_w, hooks, states))
                )
        except OSError as exc:
            for fd in ours:
                os.close(fd)
            self.send_fields(P.EXIT, ident, code=126, signal=0, error=f"cannot start: {exc}")
            return
        for fd in child_fds:
            os.close(fd)
        self.reapers[reaper] = reaper  # until it reports how /proc numbers it
        head = _read_head(report_r, reaper)  # the reaper writes it right after its fork
        if len(head) < 8:
            self._end_reaper(reaper)
            for fd in (out_r, err_r, fail_r, report_r, ex.stdin_fd):
                if fd >= 0:
                    os.close(fd)
            self.send_fields(
                P.EXIT, ident, code=126, signal=0, error="cannot start: the exec's reaper failed"
            )
            return
        pid = int.from_bytes(head[:4], "little")
        ex.pid, ex.reaper = pid, reaper
        ex.reaper_proc = self.reapers[reaper] = int.from_bytes(head[4:], "little")
        self.execs[ident] = ex
        self.by_pid[pid] = ex
        self._fail_pipes[pid] = fail_r
        for fd, kind in ((out_r, P.STDOUT), (err_r, P.STDERR)):
            ex.readers.append(fd)
            self.readers[fd] = (ex, kind)
            self.handlers[fd] = self._on_output
            if not self.throttled:
                self.poll.register(fd, POLLIN)
        os.set_blocking(report_r, False)
        self._reports[report_r] = ex
        self.watch(report_r, self._on_report)
        for hook, state in zip(self.hooks, states, strict=True):
            hook.spawned(ctx, state, pid)
        self.send_fields(P.STARTED, ident, pid=pid)

    def _spawn_elsewhere(self, spawn: Callable[[], int]) -> int:
        if self._forker is None:
            self._forker = Forker(self.reapers)
        return self._forker.call(spawn)

    def _end_reaper(self, reaper: int) -> None:
        """A reaper that gave no head: killed (it may be stopped) and reaped. A command
        child it forked before it stopped dies with it (``PR_SET_PDEATHSIG`` until
        its exec)."""
        try:
            os.kill(reaper, SIGKILL)
            os.waitpid(reaper, 0)
        except OSError:
            pass  # reaped already
        self.reapers.pop(reaper, None)

    def _spawn_reaper(self, ctx: ExecContext, fds: tuple[int, ...], states: list[object]) -> int:
        """Start the compiled reaper for this exec (module doc), or return -1: the
        Python one does it (no ``--reaper``, a hook it cannot stand in for, or a spawn
        that failed). ``fds``: report, fail, stdin, stdout, stderr."""
        if self.reaper_fd < 0:
            return -1
        seccomp = (-1, -1)  # the filter to load and the socket its listener goes over
        for hook, state in zip(self.hooks, states, strict=True):
            compiled = getattr(hook, "compiled_pre_exec", None)
            got = None if compiled is None else compiled(ctx, state)
            if got is None or (got[0] >= 0 and seccomp[0] >= 0):
                return -1
            if got[0] >= 0:
                seccomp = got
        env = ctx.environment()
        fields = [
            ctx.cwd,
            b"%d" % len(ctx.argv),
            *ctx.argv,
            *(k + b"=" + v for k, v in env.items()),
        ]
        if any(b"\0" in f for f in fields):
            return -1  # the Python reaper reports it as it always has
        # cwd, argv and env in a memfd, not in the reaper's arguments: any process may
        # read /proc/PID/cmdline, and the environment may hold a secret
        spec = os.memfd_create("sandhold-exec-spec", os.MFD_CLOEXEC)
        try:
            data = memoryview(b"\0".join(fields) + b"\0")
            while data:
                data = data[os.write(spec, data) :]
            passed = (*fds, *seccomp, spec)
            args = [b"sandhold-exec", b"--reap", *(b"%d" % fd for fd in passed)]
            # each fd at its own number, close-on-exec cleared in the child alone
            keep = sorted({fd for fd in passed if fd >= 0})
            exe = b"/proc/self/fd/%d" % self.reaper_fd
            return self.spawn_from(lambda: spawn_released(exe, args, keep))
        except OSError as exc:
            if exc.errno in _REAPER_GONE:  # it will not run here: never try it again
                os.close(self.reaper_fd)
                self.reaper_fd = -1
            return -1
        finally:
            os.close(spec)

    def _on_output(self, fd: int, events: int) -> None:
        ex, kind = self.readers[fd]
        try:
            data = os.read(fd, P.DATA_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.send(kind, ex.ident, data)
            return
        self._close_reader(ex, fd)

    def _close_reader(self, ex: _Exec, fd: int) -> None:
        del self.readers[fd]
        del self.handlers[fd]
        if not self.throttled:
            self.poll.unregister(fd)
        os.close(fd)
        ex.readers.remove(fd)
        if ex.reaped and not ex.readers:
            self.execs.pop(ex.ident, None)

    def _on_pidfd(self, fd: int, events: int) -> None:
        self._reap()

    def _on_report(self, fd: int, events: int) -> None:
        """The reaper's second report: the command's wait status, or the reaper's end."""
        try:
            data = os.read(fd, 4)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        ex = self._reports.pop(fd)
        self.unwatch(fd)
        os.close(fd)
        if ex.reaped:
            return
        if len(data) == 4:
            self.by_pid.pop(ex.pid, None)
            self._exited(ex, int.from_bytes(data, "little", signed=True))
            return
        # The reaper died before the command's end (it was killed). Once the reaper is
        # reaped, its children, the command among them, are ours (a subreaper).
        if ex.reaper in self.reapers:
            try:
                os.waitpid(ex.reaper, 0)
            except ChildProcessError:
                pass  # reaped already
            self.reapers.pop(ex.reaper, None)
        self._reap()
        if ex.reaped:
            return
        try:
            got, status = os.waitpid(ex.pid, os.WNOHANG)
        except ChildProcessError:  # gone with its status: the reaper took it
            got, status = ex.pid, SIGKILL
        if got == ex.pid:
            self.by_pid.pop(ex.pid, None)
            self._exited(ex, status)
            return
        pidfd = os.pidfd_open(ex.pid)  # ours now: its pid is not reused before we reap it
        self.handlers[pidfd] = self._on_pidfd
        self.poll.register(pidfd, POLLIN)
        self._pidfds[ex.pid] = pidfd

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.reapers.pop(pid, None)
            ex = self.by_pid.pop(pid, None)
            if ex is not None:
                self._exited(ex, status)
            # else: a reaper whose tree is empty, or an orphan we adopted (a subreaper)

    def _exited(self, ex: _Exec, status: int) -> None:
        ex.reaped = True
        pidfd = self._pidfds.pop(ex.pid, None)
        if pidfd is not None:
            self.unwatch(pidfd)
            os.close(pidfd)
        for fd in list(ex.readers):
            _, kind = self.readers[fd]
            for _ in range(DRAIN_READS):
                try:
                    data = os.read(fd, P.DATA_CHUNK)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:
                    self._close_reader(ex, fd)
                    break
                self.send(kind, ex.ident, data)
        fail_r = self._fail_pipes.pop(ex.pid)
        try:
            failure = os.read(fail_r, 4096)
        except OSError:
            failure = b""
        os.close(fail_r)
        if ex.stdin_fd >= 0:
            os.close(ex.stdin_fd)
            ex.stdin_fd = -1
            ex.stdin_buf.clear()
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        code = 128 + sig if sig else os.waitstatus_to_exitcode(status)
        error = ""
        if failure:
            stage, _, rest = failure.partition(b"\0")
            errno_text, _, message = rest.partition(b"\0")
            if stage == b"exec":
                what = ex.ctx.argv[0]
            elif stage == b"chdir":
                what = b"chdir " + ex.ctx.cwd
            else:
                what = stage
            error = (what + b": " + message).decode("utf-8", "replace")
            code = 127 if stage == b"exec" and errno_text == b"2" else 126
        self.send_fields(P.EXIT, ex.ident, code=code, signal=sig, error=error)
        if not ex.readers:
            self.execs.pop(ex.ident, None)

    # -- stdin and signals ---------------------------------------------------------

    def _stdin(self, ident: int, data: bytes) -> None:
        ex = self.execs.get(ident)
        if ex is None or ex.stdin_fd < 0:
            self.send_fields(P.STDIN_ACK, ident, n=len(data), closed=1)
            return
        if data:
            ex.stdin_buf.append(data)
        else:
            ex.stdin_close = True
        self._write_stdin(ex)

    def _on_stdin_writable(self, fd: int, events: int) -> None:
        for ex in self.execs.values():
            if ex.stdin_fd == fd:
                self._write_stdin(ex)
                return

    def _write_stdin(self, ex: _Exec) -> None:
        fd = ex.stdin_fd
        written = 0
        closed = False
        while ex.stdin_buf:
            chunk = ex.stdin_buf[0]
            try:
                n = os.write(fd, chunk)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: the reader went away
                closed = True
                break
            written += n
            if n == len(chunk):
                ex.stdin_buf.pop(0)
            else:
                ex.stdin_buf[0] = chunk[n:]
        if closed:
            written += sum(len(c) for c in ex.stdin_buf)
            ex.stdin_buf.clear()
        watching = fd in self.handlers
        if closed or (ex.stdin_close and not ex.stdin_buf):
            if watching:
                self.unwatch(fd)
            os.close(fd)
            ex.stdin_fd = -1
        elif ex.stdin_buf and not watching:
            self.watch(fd, self._on_stdin_writable, POLLOUT)
        elif not ex.stdin_buf and watching:
            self.unwatch(fd)
        if written or closed:
            self.send_fields(P.STDIN_ACK, ex.ident, n=written, closed=int(closed))

    def _signal(self, ident: int, signo: int, group: bool, tree: bool = False) -> None:
        ex = self.execs.get(ident)
        if ex is None or not 0 < signo < 65:
            return
        if tree and signo == SIGKILL:
            self._kill_tree(ex)
            return
        try:
            if group:
                os.killpg(ex.pid, signo)
            elif not ex.reaped:
                os.kill(ex.pid, signo)
        except OSError:
            pass  # already gone

    def _kill_tree(self, ex: _Exec) -> None:
        """SIGKILL the exec's whole tree: its group, and everything below its reaper."""
        try:
            os.killpg(ex.pid, SIGKILL)
        except OSError:
            pass  # gone already
        if ex.reaper in self.reapers:  # not reaped by us: its pid is still its own
            kill_below(ex.reaper_proc)
            # and the reaper itself: a command may have stopped it, and a stopped
            # reaper reaps nothing and reports nothing (its end is handled in
            # _on_report: the command's zombie becomes ours)
            try:
                os.kill(ex.reaper, SIGKILL)
            except OSError:
                pass
        elif not ex.reaped:
            try:  # its reaper was killed: the command is ours now
                os.kill(ex.pid, SIGKILL)
            except OSError:
                pass

    def _kill_all(self) -> None:
        for ex in self.execs.values():
            try:
                os.killpg(ex.pid, SIGKILL)
            except OSError:
                pass
        kill_below(_proc_pid())
        for _ in range(100):
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break


class Forker:
    """Forks (and spawns) on a thread of its own, which first called ``enter`` (the
    supervisor hook's: a Landlock domain the children inherit, while the caller's
    thread stays outside). ``call`` and ``fork`` are synchronous, and the caller
    stays free to notice a spawn stuck on a stopped child (``call``); if ``enter``
    failed, each raises its error (fail closed)."""

    def __init__(self, known: Collection[int], enter: Callable[[], object] = lambda: None) -> None:
        """``known``: the caller's children that are never the one being spawned (the
        agent's live ``reapers``), spared when a stuck spawn's child is looked for."""
        import _queue  # C modules: ``queue`` and ``threading`` import more
        import _thread

        self.known = known
        self._requests: Any = _queue.SimpleQueue()
        self._results: Any = _queue.SimpleQueue()
        self._broken: OSError | None = None
        _thread.start_new_thread(self._serve, (enter,))
        ready = self._results.get()
        if isinstance(ready, OSError):
            self._broken = ready

    def _serve(self, enter: Callable[[], object]) -> None:
        try:
            enter()
        except OSError as exc:
            self._results.put(exc)
            return
        self._results.put(0)
        while True:
            request = self._requests.get()
            try:
                self._results.put(request())
            except Exception as exc:  # raised in the caller: this thread must live on
                self._results.put(exc)

    def call(self, spawn: Callable[[], int]) -> int:
        """``spawn()`` on the forking thread: a pid, or what it raised."""
        import _queue

        if self._broken is not None:
            raise OSError(self._broken.errno, f"the command's domain: {self._broken.strerror}")
        self._requests.put(spawn)
        while True:
            try:
                result = self._results.get(timeout=SPAWN_WAIT_S)
                break
            except _queue.Empty:
                # posix_spawn waits for its child to exec, and a command of the same
                # domain may SIGSTOP that child on its way: it is killed (the spawn
                # then returns a dead reaper, which the agent reports as failed)
                _kill_stopped_children(self.known)
        if isinstance(result, Exception):
            raise result
        return int(result)

    def fork(self, child: Callable[[], None]) -> int:
        return self.call(lambda: fork_here(child))


SPAWN_WAIT_S = 2.0  # a spawn normally returns in a millisecond


def _kill_stopped_children(known: Collection[int]) -> None:
    """SIGKILL every child of this process that is stopped and not in ``known``. The
    agent's /proc numbers processes as its PID namespace does (a native sandbox; for
    ``none``, where they differ, no child is found and nothing is killed)."""
    if _proc_pid() != os.getpid():
        return
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                children = [int(p) for p in f.read().split()]
        except OSError:
            continue
        for pid in children:
            if pid not in known:
                _signal_if_stopped(pid, SIGKILL)


def fork_here(child: Callable[[], None]) -> int:
    """Fork on the calling thread; the child runs ``child``, which never returns."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; reported through its fail pipe
        child()
        os._exit(127)
    return pid


def _child(
    ctx: ExecContext,
    stdio: tuple[int, int, int],
    fail_w: int,
    hooks: Sequence[Hook],
    states: Sequence[object],
) -> None:  # pragma: no cover - runs in the forked child
    stage = b"setup"
    try:
        os.setpgid(0, 0)
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        # Python ignores these; an ignored disposition survives execve, and so does
        # the mask (the reaper blocks every signal)
        _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
        _signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
        if ctx.cwd:
            stage = b"chdir"
            os.chdir(ctx.cwd)
        stage = b"pre-exec hook"
        for hook, state in zip(hooks, states, strict=True):
            hook.pre_exec(ctx, state)
        stage = b"exec"
        _prctl(PR_SET_PDEATHSIG, 0)  # the command outlives its reaper (module rules)
        _execvpe(ctx.argv, ctx.environment())
    except OSError as exc:
        message = (exc.strerror or str(exc)).encode()
        try:
            os.write(fail_w, stage + b"\0" + str(exc.errno or 0).encode() + b"\0" + message)
        except OSError:
            pass
    except BaseException:  # nothing may unwind into a copy of the agent's loop
        pass
    os._exit(127)


def _execvpe(argv: list[bytes], env: dict[bytes, bytes]) -> None:
    """``execvpe`` over the exec's own PATH: ENOENT only if no candidate exists."""
    name = argv[0]
    if b"/" in name:
        os.execve(name, argv, env)
    saved: OSError | None = None
    for d in env.get(b"PATH", b"/usr/local/bin:/usr/bin:/bin").split(b":"):
        try:
            os.execve((d or b".") + b"/" + name, argv, env)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            if saved is None:
                saved = exc
    if saved is not None:
        raise saved
    raise FileNotFoundError(2, "command not found")


def _reaper(report: int, command: Callable[[], None]) -> None:  # pragma: no cover - the reaper
    """An exec's reaper (module rules): fork the command, report its pid and how /proc
    numbers the reaper, hold nothing else open, report the command's wait status, and
    reap its orphans until none is left. Every catchable signal is blocked: only
    SIGKILL ends it before then (the command unblocks them in ``_child``)."""
    try:
        _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        me = os.getpid()
        pid = os.fork()
        if pid == 0:
            # dies with the reaper until its exec (_child clears it): a reaper killed
            # for giving no report (_read_head) leaves no command behind
            _prctl(PR_SET_PDEATHSIG, SIGKILL)
            if os.getppid() != me:
                os._exit(127)
            command()
            os._exit(127)
        try:
            os.setpgid(pid, pid)  # as the command does: its group exists once reported
        except OSError:
            pass  # the command got there first (or already exec'd)
        os.write(report, pid.to_bytes(4, "little") + _proc_pid().to_bytes(4, "little"))
        # the channel, the command's pipes (their end is the exec's), the agent's fds
        close_fds({report})
        while True:
            try:
                got, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if got == pid:
                os.write(report, status.to_bytes(4, "little", signed=True))
                os.close(report)
    except BaseException:  # nothing may unwind into a copy of the agent's loop
        pass
    os._exit(0)


def _proc_pid() -> int:
    """This process's pid as /proc numbers it: in a PID namespace of its own with the
    host's /proc, not ``getpid()``."""
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return os.getpid()


def _read_head(fd: int, reaper: int) -> bytes:
    """The reaper's first report (8 bytes) from ``fd``, or fewer: at its end, or when
    the reaper stays stopped (a command may SIGSTOP it: the agent must not wait for
    ever) for ``HEAD_STOPPED_S``, or after ``HEAD_WAIT_S`` whatever its state (a
    suspended sandbox's reaper is stopped too, but then so is the agent)."""
    poll = select.poll()
    poll.register(fd, POLLIN)
    data = b""
    stopped_since = None
    deadline = time.monotonic() + HEAD_WAIT_S
    while len(data) < 8:
        if not poll.poll(HEAD_TICK_MS):
            now = time.monotonic()
            if _stopped(reaper):
                stopped_since = stopped_since or now
                if now - stopped_since >= HEAD_STOPPED_S:
                    break
            else:
                stopped_since = None
            if now >= deadline:
                break
            continue
        chunk = os.read(fd, 8 - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _stopped(pid: int) -> bool:
    """Whether our child ``pid`` is stopped by a signal now (``waitid`` leaves it be)."""
    try:
        got = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return got is not None and got.si_code == os.CLD_STOPPED


def _signal_if_stopped(pid: int, sig: int) -> None:
    """Send ``sig`` to our child ``pid`` if it is stopped now."""
    if _stopped(pid):
        try:
            os.kill(pid, sig)
        except OSError:
            pass  # gone meanwhile


def _signal_below(pid: int, allowed: set[int], sig: int) -> None:
    """Send ``sig`` to ``pid`` if its parent is in ``allowed``, through an fd on its
    /proc directory: the check and the signal reach the same process, so a pid that
    was reused meanwhile gets nothing."""
    try:
        fd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return  # gone
    try:
        sfd = os.open("stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=fd)
        try:
            data = os.read(sfd, 4096)
        finally:
            os.close(sfd)
        if int(data[data.rindex(b")") + 2 :].split()[1]) in allowed:
            _signal.pidfd_send_signal(fd, sig)
    except (OSError, ValueError, IndexError):
        pass  # gone meanwhile
    finally:
        os.close(fd)


def kill_below(root: int) -> None:
    """SIGSTOP every process below ``root`` (a /proc pid) until no new one appears, then
    SIGKILL them all: stopped, none forks while it is looked for."""
    from sandhold.backends.linux.procfs import descendants  # loaded with the agent

    stopped: set[int] = set()
    for _ in range(STOP_ROUNDS):
        found = descendants(root)
        new = [pid for pid in found if pid not in stopped]
        if not new:
            break
        allowed = {root, *found}
        for pid in new:
            _signal_below(pid, allowed, 19)
        stopped.update(new)
    found = descendants(root)
    allowed = {root, *found}
    for pid in found:
        _signal_below(pid, allowed, SIGKILL)


def own_pid_namespace() -> bool:
    """Become the init of a PID namespace of our own (``--pid-namespace``: the ``none``
    backend), if the host allows it; returns whether we did.

    Why: on the host, every process of the sandbox shares the user's uid, so it can
    kill the agent, its reapers and any helper of ours, and its orphans would go to
    the host's init, out of reach. A PID namespace cannot be left, the processes in
    it cannot signal its init nor anything outside it, and its init's death kills
    every one of them: ``destroy`` is then whole and needs no pid to be right.

    It takes nothing else away: no mount, network or IPC namespace, the host's
    ``/proc`` (so ``/proc/self`` is right, while a pid a command sees is its
    namespace's), the same files read and written as the same user. As root the PID
    namespace is all; unprivileged it needs a user namespace, which maps the user to
    itself (its supplementary groups still count; ``setgroups`` is refused, and a
    set-user-ID program runs without its owner's rights). Where unavailable (user
    namespaces off), the agent runs as before, and says nothing: the host checks
    from outside which it got.

    The process that was started stays outside, as the namespace's parent, holding no
    fd and non-dumpable: it waits for the init and exits with its status. The init
    dies with it (``PDEATHSIG``).
    """
    flags = CLONE_NEWPID if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWPID
    uid, gid = os.geteuid(), os.getegid()
    try:
        _libc("unshare", flags)
    except OSError:
        return False  # not allowed here: the host sees no namespace and says so
    # the user as itself (setgroups first: an unprivileged gid_map needs it denied)
    maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1\n"), ("gid_map", f"{gid} {gid} 1\n"))
    for name, text in maps if flags & CLONE_NEWUSER else ():
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    # The parent stays outside the namespace, and /proc shows it to the commands: were
    # it dumpable, they could write its memory (same uid) and have it make a PID
    # namespace beside ours, out of destroy's reach. The init inherits this. (After
    # the maps: a non-dumpable process's /proc/self files are root's.)
    _prctl(PR_SET_DUMPABLE, 0)
    mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
    alive_r, alive_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)
        _prctl(PR_SET_PDEATHSIG, SIGKILL)
        if select.select([alive_r], [], [], 0)[0]:  # the parent died before that
            os._exit(1)
        os.close(alive_r)
        return True
    close_fds({alive_w})  # the channel is the init's alone
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except InterruptedError:
            continue
        os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def _load_hook(spec: str, agent: Agent) -> Hook:
    import importlib

    spec, eq, arg = spec.partition("=")
    module, _, attr = spec.partition(":")
    factory = getattr(importlib.import_module(module), attr or "hook")
    hook: Hook = factory(agent, arg) if eq else factory(agent)
    return hook


def main(argv: Sequence[str]) -> None:
    """Run the agent: ``--fd N [--keep-fd K]... [--subreaper] [--hook MODULE:FACTORY]...
    [--path DIR]...``. ``--keep-fd``: an inherited fd a hook was told about (kept,
    made close-on-exec); every other inherited fd but the channel is closed.
    ``--subreaper`` is accepted and changes nothing (the agent always is one);
    ``--pid-namespace``: see ``own_pid_namespace``.

    Never returns normally: the process exits when the channel ends.
    """
    fd = -1
    namespace = False
    hook_specs: list[str] = []
    kept: set[int] = set()
    reaper_fd = -1
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--fd":
            fd = int(args.pop(0))
        elif arg == "--keep-fd":
            kept.add(int(args.pop(0)))
        elif arg == "--reaper":
            reaper_fd = int(args.pop(0))
            kept.add(reaper_fd)
        elif arg == "--subreaper":
            pass  # always one now (module rules)
        elif arg == "--pid-namespace":
            namespace = True
        elif arg == "--hook":
            hook_specs.append(args.pop(0))
        elif arg == "--path":
            import sys

            sys.path.append(args.pop(0))
        else:
            raise SystemExit(f"sandhold-agent: unknown argument {arg!r}")
    if fd < 0:
        raise SystemExit("sandhold-agent: --fd N is required")
    # Whatever else we inherited is not for the commands we run, however high its number.
    for keep in {fd, *kept}:
        if keep < 3:
            raise SystemExit(f"sandhold-agent: fd {keep} is stdio")
        os.set_inheritable(keep, False)
    close_fds({fd, *kept})
    if namespace:
        own_pid_namespace()
    agent = Agent(fd)
    agent.reaper_fd = reaper_fd
    if hook_specs:
        agent.hooks = [_load_hook(s, agent) for s in hook_specs]
    agent.run()
    os._exit(0)
