"""The CLI's command runner inside the sandbox: the command, under the creation-time supervisor.

Two ways in:

- Deferred calls (the usual one): the compiled front ``sandhold-exec``
  (``_helper/exec.c``) already confined itself, forked the command with the filter
  loaded, and answers its trapped calls, performing the ordinary ones itself
  (``_helper/fastpath.c``). At the first other call it starts ``python3 -I -S -B -c
  BOOT PKGPARENT --setup-fd N --report-fd M --listener-fd L --serve-fd S``: this
  process then answers each call the front sends over S (its ``struct
  seccomp_notif``) and acknowledges it with one byte, until S ends (``answer``).
- Takeover: the front without a fast path execs ``... --listener-fd L --child-pid P``
  at the first trapped call: this process then answers the listener until the
  command exits (``supervise``).
- Whole job (no compiled front): bubblewrap starts ``... --setup-fd N --report-fd M
  -- CMD ARGS...``. It forks; the child loads the notifying seccomp filter, hands
  its listener over and execs the command with the untouched stdio, environment
  and working directory (``serve``).

Either way it exits with the command's status (128+N for death by signal N, as
bubblewrap reports it).

A launch with no supervisor (no writable root) runs ``sandhold-exec --confine``
before the command, or without the compiled front ``python3 -I -S -B -c BOOT
PKGPARENT COUNT PATHS... -- CMD ARGS...`` (``confine_main``): it restores the
forwarded signals' defaults, enters one Landlock domain that writes only below
PATHS and signals nothing outside it, and execs the command in place.

Rules:
- Start-up is on every CLI run's path: only ``os``, ``select``, ``_signal``,
  ``_socket`` and ``marshal`` load before the fork (plus ``ctypes`` for the
  filter). The supervisor itself (``emulate``, the policy's regexes) loads at
  the first trapped call, so a command that creates nothing never pays for it.
- Single-threaded: one ``poll`` over the listener and the command's pidfd.
- The setup arrives as a ``marshal`` blob on fd N (no JSON parser to import):
  ``{"program": bytes, "policy": {CreationPolicy fields}, "landlock": [paths] or None}``.
  With Landlock paths, this process and so the command get a Landlock domain
  that lets them write only below those paths (and the default devices), where
  the kernel has Landlock: a creation the supervisor performs meets it too.
- Violations are written to fd M as JSON lines, each before its call is answered
  (the host reads them after bubblewrap is gone): a command that kills this
  process (it shares its uid) cannot take back what was already refused.
- This process is made non-dumpable before the fork: the command shares its uid
  and must not ptrace it, read its memory or borrow its listener.
- Signals the host forwards to every process of the sandbox are ignored here
  (the command gets its own copy); the child restores every default before exec.
- Anything that fails before the command's exec ends the child with 126 and a
  message on stderr: the command never runs unconfined.
"""

from __future__ import annotations

import marshal
import os
import select

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandhold.backends.linux.supervisor.emulate import Emulator
    from sandhold.backends.linux.supervisor.violation import Violation
    from sandhold.refusals import BoundedRecord

_signal = __import__("_signal")  # the C module: ``signal`` imports enum
_socket = __import__("_socket")

# forwarded by the host to every process of the sandbox (process.FORWARDED)
_FORWARDED = (1, 2, 3, 10, 12, 15)  # HUP INT QUIT USR1 USR2 TERM
# and the terminal's stops: a command that took the foreground must not stop this
# process (TOSTOP) while it answers a call
_IGNORED = (*_FORWARDED, 20, 21, 22)  # TSTP TTIN TTOU
# the child's, before exec: the command keeps the stops' dispositions it inherited
_RESET = (*_FORWARDED, 13, 25)  # and PIPE, XFSZ: Python ignores those
_REASONS = {
    "file-write-create": "refused at creation by the supervisor",
    "file-write-readonly": "a write where the sandbox may not write",
    "unix-socket-connect": "unix socket not in network.allowUnixSockets",
}


def _status(wait_status: int) -> int:
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def _read_setup(fd: int) -> dict[str, object]:
    chunks: list[bytes] = []
    done = 0
    while chunk := os.pread(fd, 1 << 20, done):
        chunks.append(chunk)
        done += len(chunk)
    os.close(fd)
    setup = marshal.loads(b"".join(chunks))
    if not isinstance(setup, dict):
        raise ValueError("setup is not a mapping")
    return setup


def _child(sock: int, program: bytes, argv: list[str]) -> None:
    """Confine this process, send the listener, exec ``argv``. Never returns."""
    try:
        for sig in _RESET:
            _signal.signal(sig, _signal.SIG_DFL)
        from sandhold.backends.linux.supervisor import notify
        from sandhold.backends.linux.supervisor.landlock import confine_command

        confine_command()  # this process makes its names and holds its listener
        listener = notify.install_filter(program)
        notify.send_fd(sock, listener)
        os.close(listener)
        os.close(sock)
        os.execvp(argv[0], argv)
    except OSError as exc:
        what = exc.strerror or str(exc)
        name = argv[0] if exc.filename is None else exc.filename
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        os.write(2, f"sandhold: {name}: {what}\n".encode())
        os._exit(code)
    except BaseException as exc:  # never run the command unconfined
        os.write(2, f"sandhold: the creation-time supervisor failed to start: {exc}\n".encode())
    os._exit(126)


_NO_LANDLOCK = (
    b"sandhold: note: no Landlock on this kernel: writes are confined by the mount plan "
    b"alone, without the second layer\n"
)

MAX_REPORTED = 20_000  # refusals per run on the report memfd (memory, not disk)
MAX_REPORTED_BYTES = 8 << 20  # and their lines' bytes (a path may be 4 KiB long)
_records: dict[int, BoundedRecord] = {}  # report fd -> its bounded record


def _report(fd: int, v: Violation) -> None:
    """One refusal as a line on the report fd (``refusals.line``, the ``--violations``
    shape), bounded by ``MAX_REPORTED`` lines and ``MAX_REPORTED_BYTES``
    (``refusals.BoundedRecord``): the memfd is memory, and the sandbox can make
    refusals as fast as it likes."""
    if fd < 0:
        return
    import time

    from sandhold.refusals import BoundedRecord, line

    record = _records.get(fd)
    if record is None:

        def write(data: bytes) -> None:
            while data:
                data = data[os.write(fd, data) :]

        record = _records[fd] = BoundedRecord(write, MAX_REPORTED, "refusals", MAX_REPORTED_BYTES)
    now = time.time()
    reason = _REASONS.get(v.action, "refused by the supervisor")
    entry = line(v.action, v.target, v.rule, now, kind=v.kind, reason=reason, syscall=v.syscall)
    record.add(entry, now)


def own_lock(inherited: int) -> int:
    """An open file of the user's creation lock of this process's own, the inherited fd
    closed. An flock belongs to the open file: a front that shares the inherited one
    must not hold the lock for us, nor we for it, nor a copy keep it held once its
    holder is gone. -1 stays -1."""
    if inherited < 0:
        return -1
    from sandhold.backends.linux.procfs import own_fd

    fd = os.open(own_fd(inherited), os.O_RDONLY | os.O_CLOEXEC)
    os.close(inherited)
    return fd


def no_core_dumps() -> None:
    """No core files for this process and what it starts: the kernel writes them itself,
    past the supervisor, under a name (``core_pattern``) no rule refuses. The hard limit
    too: raising it needs a capability the sandbox lacks."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def serve(argv: list[str], setup: dict[str, object], report_fd: int) -> int:
    """Run ``argv`` under the supervisor; its exit status."""
    from sandhold.backends.linux.supervisor import notify

    program = setup["program"]
    landlock = setup.get("landlock")
    assert isinstance(program, bytes)
    assert landlock is None or isinstance(landlock, tuple | list)
    notify.load()  # libc before the fork: the child need not load it
    notify.set_dumpable(False)
    if landlock is not None:
        # This process too, not just the command: the creations it performs for the
        # command must meet the same domain (and it may only inspect its own domain).
        from sandhold.backends.linux.supervisor.landlock import LandlockUnavailable, restrict_writes

        try:
            restrict_writes(landlock)
        except LandlockUnavailable:  # a second layer only, but its absence is said
            os.write(2, _NO_LANDLOCK)
    no_core_dumps()
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        ours.close()
        _child(theirs.detach(), program, argv)
    theirs.close()
    for sig in _IGNORED:
        _signal.signal(sig, _signal.SIG_IGN)
    listener = notify.recv_fd(ours.fileno())
    ours.close()
    if listener < 0:  # the child failed before its exec and said why
        _, wait_status = os.waitpid(pid, 0)
        return _status(wait_status)
    return supervise(listener, pid, setup, report_fd)


def supervise(listener: int, pid: int, setup: dict[str, object], report_fd: int) -> int:
    """Answer ``listener`` until child ``pid`` (the command) exits; its exit status.

    The takeover path enters here directly: ``sandhold-exec`` forked the command and
    then exec'd this interpreter with the listener at its first trapped call.
    """
    from sandhold.backends.linux.supervisor import notify

    pidfd = os.pidfd_open(pid)
    emulator: Emulator | None = None
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    gone = select.POLLHUP | select.POLLERR | select.POLLNVAL
    while True:
        for fd, events in poller.poll():
            if fd == pidfd:
                _, wait_status = os.waitpid(pid, 0)
                return _status(wait_status)
            if events & select.POLLIN:
                try:
                    raw = notify.recv(listener)
                except OSError as exc:
                    if exc.errno in (2, 4):  # ENOENT: the caller died; EINTR
                        continue
                    raise
                if emulator is None:
                    emulator = _emulator(setup, report_fd)
                emulator.handle(listener, raw)
            elif events & gone:
                poller.unregister(listener)


def answer(listener: int, sock: int, setup: dict[str, object], report_fd: int) -> int:
    """Answer each notification the compiled front sends over ``sock`` (already
    received from ``listener`` by the front, still waiting), one at a time, until
    the input ends. Returns 0.

    If the command kills this process (it shares its uid), the front fails every
    further call it would send here.
    """
    from sandhold.backends.linux.supervisor import notify

    emulator = _emulator(setup, report_fd)
    size = notify.NOTIF.size
    while True:
        raw = b""
        while len(raw) < size:
            chunk = os.read(sock, size - len(raw))
            if not chunk:
                if raw:
                    raise ValueError("a notification cut short")
                return 0
            raw += chunk
        emulator.handle(listener, raw)
        os.write(sock, b"a")


def _emulator(setup: dict[str, object], report_fd: int) -> Emulator:
    """The emulator for the setup's policy; it writes each refusal to ``report_fd``
    before the refused call is answered, so a command that kills this process (it
    shares its uid) cannot take back what was already refused."""
    from sandhold.backends.linux.supervisor.emulate import Emulator
    from sandhold.policy.creation import CreationPolicy

    fields = setup["policy"]
    assert isinstance(fields, dict)
    lock_fd = setup.get("lock_fd", -1)
    assert isinstance(lock_fd, int)
    emulator = Emulator(CreationPolicy(**fields), lambda v: _report(report_fd, v), lock_fd=lock_fd)
    emulator.bind_thread()
    return emulator


def main(args: Sequence[str]) -> None:
    """``--setup-fd N [--report-fd M] [--lock-fd K] -- CMD ARGS...``, the takeover form
    ``... --listener-fd L --child-pid P`` (both exit with the command's status), or the
    deferred-calls form ``... --listener-fd L --serve-fd S`` (exits 0 at the end of
    S). ``--lock-fd``: the user's creation lock, held around each call."""
    rest = list(args)
    setup_fd = report_fd = listener = child = serve_fd = lock_fd = -1
    try:
        while rest and rest[0] != "--":
            if len(rest) < 2:
                raise ValueError(f"{rest[0]} needs a value")
            flag, value = rest[0], int(rest[1])
            if flag == "--setup-fd":
                setup_fd = value
            elif flag == "--report-fd":
                report_fd = value
            elif flag == "--listener-fd":
                listener = value
            elif flag == "--child-pid":
                child = value
            elif flag == "--serve-fd":
                serve_fd = value
            elif flag == "--lock-fd":
                lock_fd = value
            else:
                raise ValueError(f"unknown argument {flag}")
            del rest[:2]
        takeover = listener >= 0 and child > 0
        deferred = listener >= 0 and serve_fd >= 0
        if setup_fd < 0 or (not (takeover or deferred) and len(rest) < 2):
            raise ValueError("usage: --setup-fd N [--report-fd M] -- CMD ARGS...")
        for fd in (setup_fd, report_fd, listener, serve_fd, lock_fd):
            if fd >= 0:
                os.set_inheritable(fd, False)
        setup = _read_setup(setup_fd)
        setup["lock_fd"] = own_lock(lock_fd)
        if deferred or takeover:
            from sandhold.backends.linux.supervisor import notify

            notify.load()
            notify.set_dumpable(False)  # already (an execute-only interpreter): and stays
        if deferred:
            code = answer(listener, serve_fd, setup, report_fd)
        elif takeover:
            code = supervise(listener, child, setup, report_fd)
        else:
            code = serve(rest[1:], setup, report_fd)
    except Exception as exc:  # reported, and the command does not run
        os.write(2, f"sandhold: the creation-time supervisor failed: {exc}\n".encode())
        code = 126
    os._exit(code)


def confine_main(args: Sequence[str]) -> None:
    """``COUNT PATHS... -- CMD ARGS...``: exec the command in a Landlock domain that
    writes only below PATHS and (ABI 6) signals only within itself; no supervisor,
    nothing left running beside it. Without Landlock it runs without the domain, as
    ``sandhold-exec --confine`` does (see docs/linux-sandbox.md). Never returns."""
    try:
        count = int(args[0])
        if count < 0 or len(args) < count + 3 or args[count + 1] != "--":
            raise ValueError("usage: COUNT PATHS... -- CMD ARGS...")
        paths, argv = list(args[1 : count + 1]), list(args[count + 2 :])
        for sig in _RESET:  # as the supervised child does
            _signal.signal(sig, _signal.SIG_DFL)
        from sandhold.backends.linux.supervisor.landlock import LandlockUnavailable, restrict_writes

        try:
            restrict_writes(paths, devices=(), dirs=(), scope_signals=True)
        except LandlockUnavailable:
            pass  # a second layer only; said by the docs and probe, not at each run
    except BaseException as exc:  # never run the command unconfined
        os.write(2, f"sandhold: the command's Landlock front failed: {exc}\n".encode())
        os._exit(126)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, f"sandhold: {argv[0]}: {exc.strerror or exc}\n".encode())
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
