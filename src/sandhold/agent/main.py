"""The in-sandbox agent: one small process that runs the host's exec requests and streams them back.

It is the command the sandbox starts (``python3 -I -S -B -c BOOT PKGDIR --fd N``)
and it speaks the framed protocol of ``sandhold.agent.protocol`` over fd ``N``,
whatever carries it (a socket pair today, vsock or a serial line in a microVM).

Rules:
- Single-threaded: one ``poll`` loop over the channel, each exec's output pipes,
  stdin pipes and pidfds. No signal handlers: exits are seen through pidfds.
- Each exec is a forked child in a process group of its own (set by both the
  child and the agent, so a group signal reaches it from the moment ``fork``
  returns), gets its own stdin (``/dev/null`` or a pipe), stdout and stderr pipes,
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
- End of the channel, or ``SHUTDOWN``: every exec's process group is killed and
  the agent exits. With ``--subreaper`` (the ``none`` backend, no PID
  namespace) the agent adopts orphans and kills every descendant too.
- Start-up is on the launch-to-ready path: this module imports only ``os``,
  ``select``, ``struct`` and ``fcntl``, and sends ``HELLO`` first thing; ``ctypes``
  (for ``prctl``) is loaded after it, or before it for ``--subreaper``.

Hooks (the pre-exec seam). ``--hook MODULE:FACTORY`` loads ``FACTORY(agent)``
(``--hook MODULE:FACTORY=ARG``: ``FACTORY(agent, ARG)``), an object with three
methods, each called for every exec:

- ``prepare(ctx) -> state`` in the agent before ``fork`` (e.g. make a socket
  pair to receive a seccomp listener fd);
- ``pre_exec(ctx, state)`` in the child after ``setpgid``, the stdio ``dup2`` and
  ``chdir``, right before ``execve`` (e.g. install a seccomp filter with
  ``SECCOMP_FILTER_FLAG_NEW_LISTENER`` and send the listener fd over the pair).
  Raising ``OSError`` fails the exec (exit 126, ``error`` says "hook");
- ``spawned(ctx, state, pid)`` in the agent after ``fork``; it may
  ``agent.watch(fd, callback)`` and report refusals with
  ``agent.violation(exec_id, action, target, raw, rule)``.

``ctx`` is an ``ExecContext`` (exec id, argv, env, cwd). A hook may also set
``agent.fork`` to a function that forks elsewhere: it gets the child's routine
(which never returns) and returns the pid, or raises ``OSError`` (a thread of
its own that entered the command's Landlock domain, so that the agent's main
thread, whose pid the commands can name, stays outside it).

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

from sandhold.agent import protocol as P

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
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
SIGKILL = 9
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
F_SETPIPE_SZ = 1031
POLLIN, POLLOUT = select.POLLIN, select.POLLOUT
POLLERRS = select.POLLHUP | select.POLLERR | select.POLLNVAL


class ExecContext:
    """What a hook sees of one exec."""

    __slots__ = ("argv", "cwd", "env", "exec_id")

    def __init__(self, exec_id: int, argv: list[bytes], env: list[bytes], cwd: bytes) -> None:
        self.exec_id, self.argv, self.env, self.cwd = exec_id, argv, env, cwd


class _Exec:
    __slots__ = ("ctx", "ident", "pid", "readers", "reaped", "stdin_buf", "stdin_close", "stdin_fd")

    def __init__(self, ident: int, ctx: ExecContext) -> None:
        self.ident = ident
        self.ctx = ctx
        self.pid = 0
        self.readers: list[int] = []
        self.reaped = False
        self.stdin_fd = -1
        self.stdin_buf: list[bytes] = []
        self.stdin_close = False


def _prctl(option: int, value: int) -> None:
    import ctypes  # 4 ms: loaded after HELLO (module rules)

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _nonblocking_pipe() -> tuple[int, int]:
    """A close-on-exec pipe whose read end (ours) does not block."""
    r, w = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(r, False)
    return r, w


class Agent:
    """The agent's state and loop (see module rules)."""

    def __init__(self, fd: int, hooks: Sequence[Hook] = (), *, subreaper: bool = False) -> None:
        self.fd = fd
        self.hooks = list(hooks)
        # Set right after HELLO, and checked again before every fork (module doc).
        self.undumpable = False
        self.subreaper = subreaper
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
        self._pidfds: dict[int, int] = {}  # pid -> pidfd
        self.fork: Callable[[Callable[[], None]], int] = fork_here  # a hook may replace it

    def _undumpable(self) -> None:
        if not self.undumpable:
            _prctl(PR_SET_DUMPABLE, 0)
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
        idle_ms = 1000 if self.subreaper else -1
        while not self.done:
            mask = POLLIN | (POLLOUT if self.outq else 0)
            if mask != self.channel_mask:
                self.poll.modify(self.fd, mask)
                self.channel_mask = mask
            for fd, events in self.poll.poll(idle_ms):
                handler = self.handlers.get(fd)
                if handler is not None:
                    handler(fd, events)
            if self.subreaper:
                self._reap()
            self._flush()
            self._throttle()
        self._kill_all()
        self._flush_blocking()

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
            self._signal(ident, P.integer(fields.get("signo")), bool(fields.get("group")))
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
            self._undumpable()
            states = [h.prepare(ctx) for h in self.hooks]
            hooks = self.hooks
            pid = self.fork(lambda: _child(ctx, (stdin, out_w, err_w), fail_w, hooks, states))
        except OSError as exc:
            for fd in ours:
                os.close(fd)
            self.send_fields(P.EXIT, ident, code=126, signal=0, error=f"cannot start: {exc}")
            return
        try:
            os.setpgid(pid, pid)  # as the child does: its group exists before we go on
        except OSError:
            pass  # the child got there first (or already exec'd)
        for fd in child_fds:
            os.close(fd)
        ex.pid = pid
        self.execs[ident] = ex
        self.by_pid[pid] = ex
        self._fail_pipes[pid] = fail_r
        for fd, kind in ((out_r, P.STDOUT), (err_r, P.STDERR)):
            ex.readers.append(fd)
            self.readers[fd] = (ex, kind)
            self.handlers[fd] = self._on_output
            if not self.throttled:
                self.poll.register(fd, POLLIN)
        pidfd = os.pidfd_open(pid)
        self.handlers[pidfd] = self._on_pidfd
        self.poll.register(pidfd, POLLIN)
        self._pidfds[pid] = pidfd
        for hook, state in zip(self.hooks, states, strict=True):
            hook.spawned(ctx, state, pid)
        self.send_fields(P.STARTED, ident, pid=pid)

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

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            ex = self.by_pid.pop(pid, None)
            if ex is not None:
                self._exited(ex, status)
            # else: an orphan we adopted as subreaper; reaping it is all there is to do

    def _exited(self, ex: _Exec, status: int) -> None:
        ex.reaped = True
        pidfd = self._pidfds.pop(ex.pid)
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

    def _signal(self, ident: int, signo: int, group: bool) -> None:
        ex = self.execs.get(ident)
        if ex is None or not 0 < signo < 65:
            return
        try:
            if group:
                os.killpg(ex.pid, signo)
            elif not ex.reaped:
                os.kill(ex.pid, signo)
        except OSError:
            pass  # already gone

    def _kill_all(self) -> None:
        for ex in self.execs.values():
            try:
                os.killpg(ex.pid, SIGKILL)
            except OSError:
                pass
        if self.subreaper:
            _kill_descendants(os.getpid())
        for _ in range(100):
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break


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
        # Python ignores these; an ignored disposition survives execve
        _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
        _signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
        if ctx.cwd:
            stage = b"chdir"
            os.chdir(ctx.cwd)
        stage = b"pre-exec hook"
        for hook, state in zip(hooks, states, strict=True):
            hook.pre_exec(ctx, state)
        stage = b"exec"
        env = {}
        for item in ctx.env:
            name, sep, value = item.partition(b"=")
            if sep and name:
                env[name] = value
        _execvpe(ctx.argv, env)
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


def _kill_descendants(root: int) -> None:
    """SIGSTOP, then SIGKILL, every process below ``root`` (found through /proc)."""
    from sandhold.backends.linux.procfs import descendants  # loaded with the agent

    for sig in (19, SIGKILL):  # SIGSTOP first, so nothing forks while we look
        for _ in range(20):
            found = descendants(root)
            for pid in found:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            if not found or sig == SIGKILL:
                break


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

    Never returns normally: the process exits when the channel ends.
    """
    fd = -1
    subreaper = False
    hook_specs: list[str] = []
    kept: set[int] = set()
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--fd":
            fd = int(args.pop(0))
        elif arg == "--keep-fd":
            kept.add(int(args.pop(0)))
        elif arg == "--subreaper":
            subreaper = True
        elif arg == "--hook":
            hook_specs.append(args.pop(0))
        elif arg == "--path":
            import sys

            sys.path.append(args.pop(0))
        else:
            raise SystemExit(f"sandhold-agent: unknown argument {arg!r}")
    if fd < 0:
        raise SystemExit("sandhold-agent: --fd N is required")
    # Whatever else we inherited is not for the commands we run.
    low = 3
    for keep in sorted({fd, *kept}):
        if keep < 3:
            raise SystemExit(f"sandhold-agent: fd {keep} is stdio")
        os.set_inheritable(keep, False)
        os.closerange(low, keep)
        low = keep + 1
    os.closerange(low, 1 << 16)
    if subreaper:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    agent = Agent(fd, subreaper=subreaper)
    if hook_specs:
        agent.hooks = [_load_hook(s, agent) for s in hook_specs]
    agent.run()
    os._exit(0)
