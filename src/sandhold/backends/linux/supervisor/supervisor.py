"""The creation-time supervisor: one thread that answers every listener of one sandbox.

How a command runs under it (the sandhold agent, or ``sandhold.backends.linux.supervisor.run``):

1. Parent, once: ``notify.set_dumpable(False)`` (the sandboxed tree shares its
   uid and must not ptrace it), ``sup = Supervisor(policy, on_violation);
   sup.start()`` and ``program = build_program()`` (and ``notify.load()`` so the
   child need not load libc).
2. Parent, per command: ``parent_sock, child_sock = socket.socketpair()``; fork.
3. Child, before exec: ``prepare_child(child_sock.fileno(), program,
   landlock=...)``: optionally a Landlock domain, then the seccomp filter with a
   listener, whose fd goes to the parent over the socket (SCM_RIGHTS) and is
   closed here; then exec.
4. Parent: ``sup.add_listener(receive_listener(parent_sock.fileno()))``. The
   listener serves the child and every process it starts; it is dropped by
   itself when the last of them has exited (POLLHUP).
5. ``sup.close()`` when the sandbox goes away; safe to call twice.

Rules:
- One thread serves every listener of a sandbox, so the emulated calls never
  overlap (``emulate`` relies on that). Never start two supervisors for one tree.
- The thread gets its own cwd and umask (``unshare(CLONE_FS)``): it changes
  both per call, the rest of the process must not notice.
- A listener whose supervisor is gone fails the trapped calls with ENOSYS: the
  sandbox can then create nothing, which is the safe side.
- Violations go to ``on_violation`` from the supervisor thread; keep it short
  (append to a list, put on a queue).

Cancellation: ``close()`` wakes the thread through an eventfd, joins it (with a
timeout) and closes every listener; calls still trapped then fail with ENOSYS.
"""

from __future__ import annotations

import errno
import os
import select
import threading

from sandhold.backends.linux.supervisor import notify
from sandhold.backends.linux.supervisor.emulate import Emulator
from sandhold.backends.linux.supervisor.violation import Violation

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from sandhold.policy.creation import CreationPolicy
    from sandhold.policy.syscalls import Rule


def _log_exception(message: str) -> None:
    import logging  # only on a failure: logging costs ~6 ms to import

    logging.getLogger("sandhold.backends.linux.supervisor").exception(message)


def build_program(base: tuple[Rule, ...] | None = None, arch: str | None = None) -> bytes:
    """The seccomp program for a supervised child.

    Args:
        base: the sandbox's own rules (``syscall_rules(...)``) to combine with the
            supervisor's; ``None`` for a stand-alone filter (foreign ABIs killed,
            io_uring and ``open_by_handle_at`` refused, creations trapped).
        arch: ``"x86_64"`` or ``"aarch64"``; default this machine's.
    """
    from sandhold.backends.linux import seccomp
    from sandhold.policy.syscalls import creation_rules

    return seccomp.build_program(creation_rules(base), arch or seccomp.native_arch())


def prepare_child(
    sock_fd: int,
    program: bytes,
    *,
    landlock: Iterable[str] | None = None,
    confine: bool = True,
) -> int:
    """In the forked child, just before exec: confine it and hand its listener over.

    Args:
        sock_fd: the child's end of a unix socketpair with the parent.
        program: from ``build_program``.
        landlock: writable paths for ``landlock.restrict_writes`` (roots and
            scratch), or ``None`` for no Landlock domain.
        confine: nest the child in a domain of its own (``landlock.confine_command``)
            that makes no name itself and may not signal the parent, which holds the
            listener. False when the parent's forking thread is in such a domain
            already, entered after starting what holds the listeners, so that all its
            children share one and may signal and trace each other.

    Returns:
        The Landlock ABI used, 0 without Landlock.

    Raises:
        OSError: a step failed; the child must exit rather than exec unconfined.
        LandlockUnavailable: Landlock was asked for and the kernel has none.
    """
    abi = 0
    if landlock is not None:
        from sandhold.backends.linux.supervisor.landlock import restrict_writes

        abi = restrict_writes(landlock)
    if confine:
        from sandhold.backends.linux.supervisor.landlock import confine_command

        confine_command()  # the parent makes its names and holds its listener
    listener = notify.install_filter(program)
    try:
        notify.send_fd(sock_fd, listener)
    finally:
        os.close(listener)
    return abi


def receive_listener(sock_fd: int, timeout: float = 10.0) -> int:
    """In the parent: the listener fd ``prepare_child`` sent.

    Raises:
        OSError: nothing arrived (the child failed before sending; see its exit).
    """
    fd = notify.recv_fd(sock_fd, timeout)
    if fd < 0:
        raise OSError(errno.ECONNRESET, "the child closed the socket without a listener")
    return fd


class Supervisor:
    """Serves seccomp listeners from one thread (see the module rules).

    Args:
        policy: what may not be created.
        on_violation: called (in the supervisor thread) for each refused creation.
        sync_wakeup: ask the kernel to wake this thread on the target's CPU
            (``SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP``, 6.6+), which shortens each
            round trip when the supervisor waits in ``NOTIF_RECV``.
        lock_fd: the user's creation lock, held around each call (``Emulator``).
    """

    def __init__(
        self,
        policy: CreationPolicy,
        on_violation: Callable[[Violation], None] | None = None,
        *,
        sync_wakeup: bool = True,
        lock_fd: int = -1,
    ) -> None:
        notify.load()
        self._emulator = Emulator(policy, on_violation, lock_fd=lock_fd)
        self._sync_wakeup = sync_wakeup
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._lock = threading.Lock()
        self._pending: list[int] = []
        self._listeners: set[int] = set()
        self._fronts: list[int] = []  # sockets of compiled fronts (add_front); owned
        self._tags: dict[int, object] = {}
        self._idle = threading.Condition(self._lock)
        self._closing = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="sandhold-supervisor", daemon=True)
        self._started = False

    @property
    def counts(self) -> dict[str, int]:
        """Notifications handled so far, by syscall name."""
        return dict(self._emulator.counts)

    @property
    def errors(self) -> int:
        """Calls that failed on a supervisor bug (answered EPERM and logged)."""
        return self._emulator.errors

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def add_listener(self, fd: int, tag: object = None) -> None:
        """Serve ``fd`` (from ``receive_listener``); the supervisor owns and closes it.

        ``tag`` goes into every ``Violation`` of the processes behind ``fd`` (the
        agent passes the exec id, so a refusal is attributed to its exec).
        """
        if self._sync_wakeup:
            notify.set_sync_wakeup(fd)
        with self._lock:
            if self._closing:
                os.close(fd)
                raise OSError(errno.ESHUTDOWN, "supervisor is closed")
            self._pending.append(fd)
            self._tags[fd] = tag
        os.eventfd_write(self._wake, 1)

    def add_front(self, fd: int) -> None:
        """Answer the calls a compiled front (``start_front``) passes on over the seqpacket
        socket ``fd``: each message is the listener's tag (8 bytes), the ``struct
        seccomp_notif`` and the listener (SCM_RIGHTS); each is acknowledged with one
        byte once answered. The supervisor owns and closes ``fd``."""
        with self._lock:
            if self._closing:
                os.close(fd)
                raise OSError(errno.ESHUTDOWN, "supervisor is closed")
            self._fronts.append(fd)
            self._pending.append(fd)
        os.eventfd_write(self._wake, 1)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every listener has hung up (all supervised processes exited)."""
        with self._idle:
            return self._idle.wait_for(
                lambda: not self._pending and not self._listeners, timeout=timeout
            )

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving and close every listener. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closing = True
        os.eventfd_write(self._wake, 1)
        if self._started:
            self._thread.join(timeout)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in {*self._pending, *self._listeners, *self._fronts}:
                os.close(fd)
            self._pending.clear()
            self._listeners.clear()
            self._fronts.clear()
        if not self._thread.is_alive():
            self._emulator.close()
            os.close(self._wake)

    def __enter__(self) -> Supervisor:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException:
            # Never leave a listener open without a reader: its callers would wait
            # forever. Closed, the kernel fails their calls with ENOSYS (nothing made).
            _log_exception("supervisor thread failed; closing its listeners")
            with self._lock:
                self._closing = True
                for fd in {*self._pending, *self._listeners, *self._fronts}:
                    os.close(fd)
                self._pending.clear()
                self._listeners.clear()
                self._fronts.clear()
                self._idle.notify_all()

    def _serve(self) -> None:
        emulator = self._emulator
        emulator.bind_thread()
        poller = select.poll()
        poller.register(self._wake, select.POLLIN)
        recv = notify.recv
        handle = emulator.handle
        pollin = select.POLLIN
        gone = select.POLLHUP | select.POLLERR | select.POLLNVAL
        wake = self._wake
        fronts = self._fronts
        while True:
            for fd, events in poller.poll():
                if fd == wake:
                    if self._commands(poller):
                        return
                    continue
                if fd in fronts:
                    if not (events & pollin and self._passed_on(fd)):
                        poller.unregister(fd)
                        with self._lock:
                            fronts.remove(fd)
                            os.close(fd)
                    continue
                if events & pollin:
                    try:
                        raw = recv(fd)
                    except OSError as exc:
                        if exc.errno in (errno.ENOENT, errno.EINTR):
                            continue  # the target died before we got to it
                        raise
                    emulator.tag = self._tags.get(fd)
                    try:
                        handle(fd, raw)
                    except OSError:
                        # the reply itself failed (handle answers everything else);
                        # the caller is gone or its call was already answered
                        _log_exception("supervisor: reply failed")
                elif events & gone:
                    poller.unregister(fd)
                    with self._lock:
                        self._listeners.discard(fd)
                        self._tags.pop(fd, None)
                        os.close(fd)
                        self._idle.notify_all()

    def _passed_on(self, front: int) -> bool:
        """Answer one call a compiled front passed on; False: the front is gone (or broke
        the protocol, and is dropped: it then fails the calls it would pass on)."""
        data, listener = notify.recv_message(front, 8 + notify.NOTIF.size)
        try:
            if listener < 0 or len(data) != 8 + notify.NOTIF.size:
                return False
            self._emulator.tag = int.from_bytes(data[:8], "little")
            try:
                self._emulator.handle(listener, data[8:])
            except OSError:
                _log_exception("supervisor: reply failed")
        finally:
            if listener >= 0:
                os.close(listener)
        try:
            os.write(front, b"a")
        except OSError:
            return False
        return True

    def _commands(self, poller: select.poll) -> bool:
        """Take new listeners; True when the supervisor is closing."""
        try:
            os.eventfd_read(self._wake)
        except BlockingIOError:
            pass
        with self._lock:
            for fd in self._pending:
                if fd not in self._fronts:
                    self._listeners.add(fd)
                poller.register(fd, select.POLLIN)
            self._pending.clear()
            self._idle.notify_all()
            return self._closing
