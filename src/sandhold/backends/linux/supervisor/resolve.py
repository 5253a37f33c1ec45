"""The target's view: where a trapped call's paths start and what their parents are.

Part of the emulator (``emulate.Emulator``): the resolution every emulated call shares.

Rules:
- The target's starting points are copied, not named: its cwd and dirfds are
  opened through ``/proc/<tid>/cwd`` and ``/proc/<tid>/fd/<n>`` (the same
  directory, not a path to it). Then ``NOTIF_ID_VALID`` (``_valid``) proves the
  tid still belongs to the waiting target.
- The parent directory is resolved with ``openat2(RESOLVE_NO_MAGICLINKS)`` into an
  fd; its absolute path is read back from that fd (``/proc/self/fd``); the call
  then runs relative to the fd with the final component only.
- ``/proc`` is resolved as the target sees it: a directory that resolved to the
  supervisor's own ``/proc/<pid>`` (through ``self``, ``thread-self``,
  ``/dev/fd`` ...) is re-opened as the target's; any other numeric ``/proc``
  entry than the target's own is refused.
- The target's umask is read from ``/proc/<tid>/status``, cached only while
  provably current (``_umask``).
"""

from __future__ import annotations

import errno
import os
import stat

from sandhold.backends.linux import procfs
from sandhold.backends.linux.supervisor import notify
from sandhold.policy import symlinks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    Args = tuple[int, int, int, int, int, int]
    Handler = Callable[[int, int, int, Args], "int | None"]


AT_FDCWD = 0xFFFF_FF9C  # -100 as the kernel's 32-bit int
MAX_SYMLINKS = symlinks.MAX_SYMLINKS  # the kernel's MAXSYMLINKS

O_PATH = os.O_PATH
O_CREAT = os.O_CREAT
O_EXCL = os.O_EXCL
O_NOFOLLOW = os.O_NOFOLLOW
O_DIRECTORY = os.O_DIRECTORY
O_CLOEXEC = os.O_CLOEXEC
O_TMPFILE = os.O_TMPFILE
O_TMPFILE_BIT = O_TMPFILE & ~O_DIRECTORY
DIR_PATH = O_PATH | O_DIRECTORY | O_CLOEXEC

RESOLVE_NO_MAGICLINKS = notify.RESOLVE_NO_MAGICLINKS
RESOLVE_NO_SYMLINKS = notify.RESOLVE_NO_SYMLINKS
RESOLVE_CACHED = notify.RESOLVE_CACHED
RESOLVE_SCOPED = notify.RESOLVE_BENEATH | notify.RESOLVE_IN_ROOT


def err(code: int) -> OSError:
    """The OSError a failed call answers with (its errno)."""
    return OSError(code, os.strerror(code))


def no_set_id(mode: int) -> None:
    """A new file may not be set-user-ID or set-group-ID: on the host it would run with
    its owner's rights (root's, when sandhold runs as root); nosuid holds only in the
    sandbox. As the filter refuses chmod to such a mode (policy.syscalls)."""
    if mode & (stat.S_ISUID | stat.S_ISGID):
        raise err(errno.EPERM)


def exists(dirfd: int, name: bytes) -> bool:
    """``name`` in ``dirfd`` is there (whatever it is; a symlink is not followed)."""
    try:
        os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except OSError:
        return False
    return True


def join(parent: str, name: bytes) -> str:
    """The absolute path of ``name`` in the directory ``parent``."""
    return (parent if parent != "/" else "") + "/" + os.fsdecode(name)


class Parent:
    """The resolved parent directory of a path: an fd, its absolute path, the last name."""

    __slots__ = ("abs", "fd", "in_proc", "name", "owned", "trailing")

    def __init__(
        self, fd: int, owned: bool, name: bytes, *, abs_path: str, trailing: bool, in_proc: bool
    ) -> None:
        self.fd = fd
        self.owned = owned
        self.name = name
        self.abs = abs_path
        self.trailing = trailing
        self.in_proc = in_proc

    def close(self) -> None:
        if self.owned:
            self.owned = False
            os.close(self.fd)

    def path(self) -> str:
        return join(self.abs, self.name)

    def special(self) -> bool:
        """The last component is no new name (``/``, ``.``, ``..``): the call cannot create."""
        return self.name in (b"", b".", b"..")


class Resolver:
    """The target's view: starting points, parents, ``/proc``, umask (module rules).

    The state lives on the ``emulate.Emulator`` that inherits this; one thread only.
    """

    root: int  # our "/", an O_PATH fd
    mem: notify.MemReader
    openat2: notify.Openat2
    my_tgid: int
    my_tid: int  # the serving thread's (bind_thread)
    _alive: notify.PidfdAlive
    _umasks: dict[int, tuple[int, int, int]]  # tid -> (pidfd, tgid, umask)

    def _reply(self, listener: int, nid: int, val: int, error: int) -> None:
        try:
            notify.send(listener, nid, val, error)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # ENOENT: the target died meanwhile
                raise

    @staticmethod
    def _valid(listener: int, nid: int) -> None:
        if not notify.id_valid(listener, nid):
            raise err(errno.ENOENT)

    @staticmethod
    def _status(pid: int) -> tuple[int, int, int]:
        """(tgid, umask, threads) of task ``pid`` from /proc/<pid>/status."""
        fields = procfs.status_fields(procfs.status(pid), b"UT")
        return (
            int(fields.get(b"Tgid", b"%d" % pid)),
            int(fields.get(b"Umask", b"0022"), 8),
            int(fields.get(b"Threads", b"2")),
        )

    def _tgid(self, pid: int) -> int:
        return self._status(pid)[0]

    def _umask(self, pid: int) -> int:
        """The target's umask: cached per thread while provably current (see below).

        Reading /proc/<tid>/status costs ~11 µs, more than the rest of a call. An
        entry is kept only for a single-threaded process, where nothing but the
        thread's own (trapped, so seen) umask(2) calls can change it; its pidfd
        says whether the tid still is that task, since tids are reused.
        """
        entry = self._umasks.get(pid)
        if entry is not None:
            if self._alive(entry[0]):
                return entry[2]
            os.close(entry[0])
            del self._umasks[pid]
        try:
            pidfd = os.pidfd_open(pid, notify.PIDFD_THREAD)  # first: see _umask_call
        except OSError:
            pidfd = -1  # no thread pidfds (before 6.9): no cache
        tgid, umask, threads = self._status(pid)
        if pidfd >= 0:
            if threads == 1:
                if len(self._umasks) >= 1024:
                    self._sweep_umasks()
                self._umasks[pid] = (pidfd, tgid, umask)
            else:
                os.close(pidfd)
        return umask

    def _sweep_umasks(self) -> None:
        for tid, (pidfd, _tgid, _umask) in list(self._umasks.items()):
            if not self._alive(pidfd):
                os.close(pidfd)
                del self._umasks[tid]

    def _umask_call(self, lfd: int, nid: int, pid: int, a: Args) -> None:
        """umask(2): note the new value for every cached thread of the process, then let
        the kernel run it. CONTINUE is safe here: the argument is a register, no memory.
        """
        new = a[0] & 0o777
        entry = self._umasks.get(pid)
        try:
            tgid = entry[1] if entry is not None else self._tgid(pid)
        except OSError:
            tgid = -1  # gone: nothing cached can be its
        for tid, (pidfd, group, _old) in list(self._umasks.items()):
            if group == tgid:
                self._umasks[tid] = (pidfd, group, new)
        notify.send_continue(lfd, nid)

    def _base(self, pid: int, dirfd: int, path: bytes, resolve: int = 0) -> int:
        """An fd ``path`` starts from: the root, or a copy of the target's cwd or dirfd."""
        if path[:1] == b"/" and not resolve & RESOLVE_SCOPED:
            return self.root
        dirfd &= 0xFFFF_FFFF
        if dirfd == AT_FDCWD:
            return os.open(procfs.cwd_path(pid), DIR_PATH)
        if dirfd >= 0x8000_0000:
            raise err(errno.EBADF)
        try:
            fd = os.open(procfs.fd_path(pid, dirfd), O_PATH | O_CLOEXEC)
        except FileNotFoundError:
            raise err(errno.EBADF) from None
        if path and not stat.S_ISDIR(os.fstat(fd).st_mode):
            os.close(fd)
            raise err(errno.ENOTDIR)  # a pipe or a file as the starting directory
        return fd

    def _close_base(self, fd: int) -> None:
        if fd != self.root:
            os.close(fd)

    def _parent(self, pid: int, base: int, path: bytes, resolve: int = 0) -> Parent:
        """Resolve everything but the last component of ``path`` from ``base``."""
        if not path:
            raise err(errno.ENOENT)
        end = len(path)
        while end > 1 and path[end - 1] == 0x2F:  # trailing slashes
            end -= 1
        trailing = end != len(path)
        cut = path.rfind(b"/", 0, end)
        name = path[cut + 1 : end]
        if cut < 0:
            fd, owned = base, False
        elif cut == 0 and not resolve & RESOLVE_SCOPED:
            fd, owned = self.root, False
        else:
            fd = self.openat2(base, path[: cut or 1], DIR_PATH, 0, resolve | RESOLVE_NO_MAGICLINKS)
            owned = True
        try:
            abs_path = "/" if fd == self.root else procfs.fd_link(fd)
            if not abs_path.startswith("/") or abs_path.endswith(" (deleted)"):
                raise err(errno.ENOENT)  # removed, or outside our root: nothing to create in
            in_proc = abs_path == "/proc" or abs_path.startswith("/proc/")
            if in_proc:
                fd, owned, name, abs_path = self._procfs(pid, fd, owned, name, abs_path)
        except BaseException:
            if owned:
                os.close(fd)
            raise
        return Parent(fd, owned, name, abs_path=abs_path, trailing=trailing, in_proc=in_proc)

    def _procfs(
        self, pid: int, fd: int, owned: bool, name: bytes, abs_path: str
    ) -> tuple[int, bool, bytes, str]:
        """Make a /proc parent mean the target's /proc, never the supervisor's."""
        parts = abs_path.split("/")  # ["", "proc", entry, ...]
        if len(parts) == 2:  # the /proc directory itself: the last name is the entry
            if name == b"self":
                name = b"%d" % self._tgid(pid)
            elif name == b"thread-self":
                tgid = self._tgid(pid)
                new = f"/proc/{tgid}/task"
                nfd = self.openat2(self.root, new.encode(), DIR_PATH, 0, RESOLVE_NO_MAGICLINKS)
                if owned:
                    os.close(fd)
                return nfd, True, b"%d" % pid, new
            if name.isdigit() and int(name) not in (pid, self._tgid(pid)):
                raise err(errno.EACCES)
            return fd, owned, name, abs_path
        entry = parts[2]
        if not entry.isdigit():
            return fd, owned, name, abs_path  # /proc/sys, /proc/fs, ...: not per process
        if int(entry) == self.my_tgid:
            parts[2] = str(self._tgid(pid))
            if len(parts) > 4 and parts[3] == "task" and parts[4] == str(self.my_tid):
                parts[4] = str(pid)
            new = "/".join(parts)
            nfd = self.openat2(self.root, new.encode(), DIR_PATH, 0, RESOLVE_NO_MAGICLINKS)
            if owned:
                os.close(fd)
            return nfd, True, name, new
        if int(entry) not in (pid, self._tgid(pid)):
            raise err(errno.EACCES)  # another process's entries: not through us
        return fd, owned, name, abs_path

    @staticmethod
    def _readlink(dirfd: int, name: bytes) -> bytes | None:
        try:
            return os.readlink(name, dir_fd=dirfd)
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOENT):
                return None  # not a symlink (any more)
            raise
