"""Performs each trapped call on the target's behalf, so no re-read of its memory ever decides.

The seccomp filter stops every call that can create a name (``CREATION_RULES``)
and hands it to the supervisor. ``Emulator.handle`` answers one notification.

Modules, by job: ``resolve`` (the target's view: starting points, parents,
``/proc``, umask), ``checks`` (the policy check and the repository lookups),
``opens`` (open, openat, creat, openat2), ``names`` (mkdir, mknod, symlink, link,
rename), ``sockets`` (bind, connect); this one dispatches, under the lock.

Rules:
- Never ``CONTINUE`` a trapped call whose outcome depends on target memory
  (``umask`` and an ``open``/``openat`` with ``O_PATH`` depend on registers only
  and make no name). Target memory (paths, ``open_how``,
  ``sockaddr``) is read exactly once, into the supervisor; the decision and
  the operation both use that copy. A thread of the target that rewrites the
  buffer afterwards changes nothing, because the kernel never looks at it again.
- The target's starting points are copied, not named: its cwd and dirfds are
  opened through ``/proc/<tid>/cwd`` and ``/proc/<tid>/fd/<n>`` (the same
  directory, not a path to it), sockets with ``pidfd_getfd``. Then
  ``NOTIF_ID_VALID`` proves the tid still belongs to the waiting target.
- The parent directory is resolved with ``openat2(RESOLVE_NO_MAGICLINKS)``
  into an fd; its absolute path is read back from that fd (``/proc/self/fd``),
  the policy decides on that path plus the final component, and the operation
  runs relative to the fd with the final component only. The final component
  is never followed where following could create a name elsewhere: ``O_CREAT``
  without ``O_EXCL`` first opens without ``O_CREAT`` and ``O_NOFOLLOW``, creates
  with ``O_EXCL`` if nothing is there, and follows a symlink by reading it and
  resolving its text as a new path, checked again (a dangling symlink to
  ``.env`` is refused like ``.env``).
- ``/proc`` is resolved as the target sees it: a directory that resolved to the
  supervisor's own ``/proc/<pid>`` (through ``self``, ``thread-self``,
  ``/dev/fd`` ...) is re-opened as the target's; any other numeric ``/proc``
  entry than the target's own is refused, and nothing is ever created there.
  So a target can never have the supervisor open the supervisor's own files.
- One thread performs every call of a sandbox, one after another, holding the
  creation lock all sandboxes of the user share (``lock_fd``). While it
  works on one call no other sandboxed call can create, rename or link a name,
  so the parent it resolved keeps its path until the operation is done, and a
  directory rename can check the whole subtree it moves first.
- A refusal answers ``EACCES`` and reports a ``Violation``. A failure of the
  operation answers its errno. A bug here answers ``EPERM`` and is logged:
  the call fails closed, it never runs unchecked.
- Opens return their fd with ``NOTIF_ADDFD | ADDFD_FLAG_SEND``: installing the
  fd and answering the call are one atomic step.
- An open that would wait at an existing FIFO for its other end is answered by
  a thread of its own, which opens the FIFO pinned beforehand (an ``O_PATH`` fd,
  so no name is looked up again): waiting in the serving thread would hold up
  every other call of the sandbox, and the other end may need one first.

Emulated calls run with the supervisor's credentials, umask set to the target's,
and in the supervisor's mount namespace and root, which in the sandhold agent are
the target's own (the agent runs inside the sandbox, ``chroot`` is refused).
"""

from __future__ import annotations

import errno
import fcntl
import os

from sandhold.backends.linux.supervisor import notify
from sandhold.backends.linux.supervisor.checks import Denied
from sandhold.backends.linux.supervisor.names import Names
from sandhold.backends.linux.supervisor.opens import valid_open_flags
from sandhold.backends.linux.supervisor.resolve import DIR_PATH, err
from sandhold.backends.linux.supervisor.sockets import Sockets
from sandhold.policy import creation
from sandhold.policy.refusal import READ_ONLY, Refusal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from sandhold.backends.linux.supervisor.resolve import Handler
    from sandhold.backends.linux.supervisor.violation import Violation


_UNLOCKED = frozenset({"connect", "umask"})  # calls that make no name
_READ_ONLY = {
    errno.EROFS: "read-only in the sandbox",
    errno.EACCES: "not writable in the sandbox",
}
LOCK_WAIT = 10.0  # seconds, as LOCK_WAIT_MS in fastpath.c
_lock_said = False


def take_lock(fd: int, wait: float = LOCK_WAIT) -> bool:
    """The user's creation lock, waited for at most ``wait`` seconds: another sandbox
    holding it longer (stopped, or checking a huge tree) makes the call fail (EAGAIN)
    rather than hang. False on timeout (said once on stderr).

    Raises:
        OSError: the lock cannot be taken at all (the call fails with its errno).
    """
    import time

    global _lock_said
    step, deadline = 0.00005, time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        if time.monotonic() >= deadline:
            break
        time.sleep(step)
        step = min(step * 2, 0.005)
    if not _lock_said:
        _lock_said = True
        os.write(
            2,
            b"sandhold: another sandbox of this user has held the creation lock for "
            b"%d s: calls that make a name fail with EAGAIN until it lets go\n" % wait,
        )
    return False


class Emulator(Names, Sockets):
    """Answers notifications for one policy (see the module rules). One thread only."""

    def __init__(
        self,
        policy: creation.CreationPolicy,
        on_violation: Callable[[Violation], None] | None = None,
        *,
        lock_fd: int = -1,
    ) -> None:
        from sandhold.backends.linux.seccomp import ARCHES, native_arch

        arch = native_arch()
        self.policy = policy
        self.decider = creation.Decider(policy)
        self.on_violation = on_violation
        self.mem = notify.MemReader()
        self.openat2 = notify.Openat2()
        self.root = os.open("/", DIR_PATH)
        self.my_tgid = os.getpid()
        self.my_tid = self.my_tgid  # set by bind_thread() in the serving thread
        self.valid_open = valid_open_flags(arch)
        self.counts: dict[str, int] = {}
        self._alive = notify.PidfdAlive()
        self._umasks: dict[int, tuple[int, int, int]] = {}  # tid -> (pidfd, tgid, umask)
        self.errors = 0
        numbers = ARCHES[arch].creation_numbers or {}
        handlers: dict[str, Handler] = {
            "open": self._open,
            "openat": self._openat,
            "creat": self._creat,
            "openat2": self._openat2,
            "mkdir": self._mkdir,
            "mkdirat": self._mkdirat,
            "mknod": self._mknod,
            "mknodat": self._mknodat,
            "rename": self._rename,
            "renameat": self._renameat,
            "renameat2": self._renameat2,
            "link": self._link,
            "linkat": self._linkat,
            "symlink": self._symlink,
            "symlinkat": self._symlinkat,
            "bind": self._bind,
            "connect": self._connect,
            "umask": self._umask_call,
        }
        self.table: dict[int, tuple[str, Handler]] = {
            numbers[name]: (name, fn) for name, fn in handlers.items() if name in numbers
        }
        # the current notification, for violation records
        self._pid = 0
        self._call = ""
        self._where: str | None = None  # the name it writes, once resolved (see _writes)
        self.tag: object = None  # set by the caller per listener; copied into violations
        # (dev, ino) of the .git directories made during the run, and of their hooks
        self.fresh: set[tuple[int, int]] = set()
        # (dev, ino) of the .hg and .jj directories made during the run: no work tree
        # of the user's (they get no config of their own either: creation rule 3)
        self.fresh_hg: set[tuple[int, int]] = set()
        self.fresh_jj: set[tuple[int, int]] = set()
        self.lock_fd = lock_fd  # the user's creation lock (session.creation_lock), or -1

    def bind_thread(self) -> None:
        """Call from the serving thread: its own cwd/umask, and its tid for /proc rewriting."""
        import threading

        notify.unshare_fs()
        self.my_tid = threading.get_native_id()

    def close(self) -> None:
        os.close(self.root)
        for pidfd, _tgid, _umask in self._umasks.values():
            os.close(pidfd)
        self._umasks.clear()

    # -- one notification --------------------------------------------------------

    def handle(self, listener: int, raw: bytes) -> None:
        """Answer one ``struct seccomp_notif`` read from ``listener``."""
        nid, pid, _flags, nr, _arch, _ip, *args = notify.NOTIF.unpack(raw)
        entry = self.table.get(nr)
        if entry is None:  # the filter traps nothing else; answer as the kernel would
            self._reply(listener, nid, 0, errno.ENOSYS)
            return
        name, fn = entry
        self.counts[name] = self.counts.get(name, 0) + 1
        self._pid = pid
        self._call = name
        self._where = None
        # Check and call under the lock every sandbox of this user shares, so that no
        # rename elsewhere moves a directory between the two. Not for calls that make
        # no name: a connect may wait for a full backlog.
        locked = self.lock_fd >= 0 and name not in _UNLOCKED
        try:
            if locked and not take_lock(self.lock_fd):
                locked = False
                raise err(errno.EAGAIN)
            result = fn(listener, nid, pid, tuple(args))
        except Denied as denied:
            self._report(denied)
            self._reply(listener, nid, 0, errno.EACCES)
        except OSError as exc:
            code = exc.errno or errno.EIO
            where = self._where
            if where is not None and self.decider.read_only(where, code):
                refusal = Refusal(READ_ONLY, _READ_ONLY[code])
                self._report(Denied(where, refusal, creation.READ_ONLY_ACTION))
            self._reply(listener, nid, 0, code)
        except Exception:
            # a bug in the supervisor: fail the call closed, keep serving the others
            self.errors += 1
            import logging  # only on a bug: logging costs ~6 ms at start-up

            logging.getLogger("sandhold.backends.linux.supervisor").exception(
                "supervisor: %s from pid %d failed", name, pid
            )
            self._reply(listener, nid, 0, errno.EPERM)
        else:
            if result is not None:
                self._reply(listener, nid, result, 0)
        finally:
            if locked:
                try:
                    fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
                except OSError:
                    pass  # the call is answered; a lock fd gone bad fails the next one
