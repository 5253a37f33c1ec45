"""The open calls: ``open``, ``openat``, ``creat``, ``openat2``, performed for the target.

Part of the emulator (``emulate.Emulator``).

Rules:
- The final component is never followed where following could create a name
  elsewhere: ``O_CREAT`` without ``O_EXCL`` first opens without ``O_CREAT`` and with
  ``O_NOFOLLOW``, creates with ``O_EXCL`` if nothing is there, and follows a
  symlink by reading it and resolving its text as a new path, checked again (a
  dangling symlink to ``.env`` is refused like ``.env``).
- ``open_how`` is read once; ``O_PATH`` open/openat calls make no name and run as
  they are (their flags are a register).
- Opens return their fd with ``NOTIF_ADDFD | ADDFD_FLAG_SEND``: installing the fd
  and answering the call are one atomic step.
- An open that would wait at an existing FIFO for its other end is answered by a
  thread of its own, which opens the FIFO pinned beforehand (an ``O_PATH`` fd, so
  no name is looked up again): waiting in the serving thread would hold up every
  other call of the sandbox, and the other end may need one first.
"""

from __future__ import annotations

import errno
import os
import stat

from sandhold.backends.linux import procfs
from sandhold.backends.linux.supervisor import notify
from sandhold.backends.linux.supervisor.checks import Checks
from sandhold.backends.linux.supervisor.resolve import (
    AT_FDCWD,
    MAX_SYMLINKS,
    O_CLOEXEC,
    O_CREAT,
    O_DIRECTORY,
    O_EXCL,
    O_NOFOLLOW,
    O_PATH,
    O_TMPFILE,
    O_TMPFILE_BIT,
    RESOLVE_CACHED,
    RESOLVE_NO_MAGICLINKS,
    RESOLVE_NO_SYMLINKS,
    RESOLVE_SCOPED,
    Parent,
    err,
    exists,
    no_set_id,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandhold.backends.linux.supervisor.resolve import Args


_O_PATH_FLAGS = O_DIRECTORY | O_NOFOLLOW | O_PATH | O_CLOEXEC
# include/linux/fcntl.h VALID_OPEN_FLAGS: open(2) drops other bits, openat2(2) refuses them.
# O_LARGEFILE differs by arch and is 0 in 64-bit userspace headers, so it is spelled here.
_O_LARGEFILE = {"x86_64": 0o100000, "aarch64": 0o400000}
_FASYNC = 0o20000
_VALID_OPEN_BASE = (
    os.O_ACCMODE
    | O_CREAT
    | O_EXCL
    | os.O_NOCTTY
    | os.O_TRUNC
    | os.O_APPEND
    | os.O_NONBLOCK
    | os.O_SYNC
    | os.O_DSYNC
    | _FASYNC
    | os.O_DIRECT
    | O_DIRECTORY
    | O_NOFOLLOW
    | os.O_NOATIME
    | O_CLOEXEC
    | O_PATH
    | O_TMPFILE
)


def valid_open_flags(arch: str) -> int:
    """The open flags the kernel of ``arch`` knows (``VALID_OPEN_FLAGS``)."""
    return _VALID_OPEN_BASE | _O_LARGEFILE[arch]


class _Fifo(Exception):
    """The open would wait at a FIFO: answered later, from a thread (``pin``: O_PATH fd)."""

    def __init__(self, pin: int) -> None:
        super().__init__(pin)
        self.pin = pin


def _check_create_flags(flags: int) -> None:
    """The kernel's EINVAL cases that stripping O_CREAT for a first attempt would hide."""
    if flags & O_TMPFILE_BIT:
        if flags & (O_TMPFILE | O_CREAT) != O_TMPFILE:
            raise err(errno.EINVAL)
    elif flags & O_CREAT and flags & O_DIRECTORY:
        raise err(errno.EINVAL)  # since Linux 6.4


class Opens(Checks):
    """The open calls (module rules)."""

    valid_open: int  # the open flags this arch knows

    def _open_path(
        self,
        pid: int,
        base: int,
        path: bytes,
        *,
        flags: int,
        mode: int,
        resolve: int,
        depth: int = 0,
    ) -> int:
        """Open ``path`` from ``base`` as the target's open would; return our fd."""
        parent = self._parent(pid, base, path, resolve)
        try:
            return self._open_in(
                pid, base, parent, flags=flags, mode=mode, resolve=resolve, depth=depth
            )
        finally:
            parent.close()

    def _open_in(
        self,
        pid: int,
        base: int,
        parent: Parent,
        *,
        flags: int,
        mode: int,
        resolve: int,
        depth: int,
    ) -> int:
        creating = bool(flags & O_CREAT)
        name = parent.name
        if not flags & O_PATH and (creating or flags & (os.O_ACCMODE | os.O_TRUNC | O_TMPFILE_BIT)):
            self._writes(parent)
        if parent.special():
            if creating:
                raise err(errno.EISDIR)
            tmp_mode = self._tmpfile_mode(pid, flags, mode)  # O_TMPFILE in "." or ".."
            return self.openat2(parent.fd, name or b".", flags | O_CLOEXEC, tmp_mode, resolve)
        if parent.trailing:
            if creating:
                raise err(errno.EISDIR)
            name += b"/"
        if parent.in_proc:
            # Nothing can be created in procfs. Below /proc/<target> the magic links
            # are the target's own, so the kernel may follow them; the symlinks of
            # /proc itself (self, mounts, net) point at the reader, so they are
            # followed below, by text, and land in the target's entry again.
            if creating and flags & O_EXCL and exists(parent.fd, name):
                raise err(errno.EEXIST)  # a magic link is a name that exists
            # (with O_TMPFILE, O_EXCL means "never linkable": it stays)
            flags &= ~(O_CREAT if flags & O_TMPFILE_BIT else O_CREAT | O_EXCL)
            tmp_mode = self._tmpfile_mode(pid, flags, mode)  # a magic link's directory
            if parent.abs != "/proc":
                if resolve & (RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS):
                    flags |= O_NOFOLLOW
                elif (
                    not flags & (os.O_NONBLOCK | O_PATH | O_NOFOLLOW)
                    and flags & os.O_ACCMODE != os.O_RDWR
                ):
                    # A magic link to a FIFO (an O_PATH fd of one) waits like the FIFO.
                    # The target's fd table is not trapped (a thread may dup2 a FIFO
                    # onto it at any time): pin what it names now and open only that.
                    # With O_NOFOLLOW the open below fails on the link (ELOOP), as it would.
                    pin = self.openat2(parent.fd, name, O_PATH | O_CLOEXEC, 0, 0)
                    return self._open_pinned(pin, flags, tmp_mode, creating=creating)
                fd = self.openat2(parent.fd, name, flags | O_CLOEXEC, tmp_mode, 0)
                if creating and stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.close(fd)
                    raise err(errno.EISDIR)  # O_CREAT on a directory, as in the kernel
                return fd
            creating = False
        if creating:
            self._check(parent.path(), parent_fd=parent.fd)
        if flags & O_TMPFILE_BIT:
            no_set_id(mode)
        if creating or flags & O_TMPFILE_BIT:
            os.umask(self._umask(pid))
        else:
            mode = 0
        if creating and flags & O_EXCL:
            no_set_id(mode)
            return self.openat2(parent.fd, name, flags | O_CLOEXEC, mode, 0)  # never follows
        follow = not (flags & O_NOFOLLOW or resolve & RESOLVE_NO_SYMLINKS)
        plain = (flags & ~O_CREAT) | O_NOFOLLOW | O_CLOEXEC
        plain_mode = mode if flags & O_TMPFILE_BIT else 0
        waits = not flags & (os.O_NONBLOCK | O_PATH | O_TMPFILE_BIT) and (
            flags & os.O_ACCMODE != os.O_RDWR
        )
        for _attempt in range(8):
            if waits:
                self._no_fifo(parent.fd, name)
            try:
                fd = self.openat2(parent.fd, name, plain, plain_mode, 0)
            except OSError as exc:
                if exc.errno == errno.ENOENT and creating:
                    no_set_id(mode)
                    try:
                        return self.openat2(parent.fd, name, flags | O_EXCL | O_CLOEXEC, mode, 0)
                    except FileExistsError:
                        continue  # it appeared meanwhile: open it instead
                if not (follow and exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR)):
                    raise
                link = self._readlink(parent.fd, parent.name)
                if link is None:
                    raise
            else:
                kind = os.fstat(fd).st_mode
                if creating and stat.S_ISDIR(kind):  # O_CREAT on a directory, any access
                    os.close(fd)
                    raise err(errno.EISDIR)
                if not (flags & O_PATH and follow and stat.S_ISLNK(kind)):
                    return fd
                os.close(fd)
                link = self._readlink(parent.fd, parent.name)
                if link is None:
                    continue  # no longer a symlink: open what is there now
            return self._follow(
                pid, base, parent, link, flags=flags, mode=mode, resolve=resolve, depth=depth
            )
        raise err(errno.EAGAIN)

    def _tmpfile_mode(self, pid: int, flags: int, mode: int) -> int:
        """The mode to open with: O_TMPFILE's is the caller's, under the caller's umask
        (set here); any other open of an existing name takes none."""
        if not flags & O_TMPFILE_BIT:
            return 0
        no_set_id(mode)
        os.umask(self._umask(pid))
        return mode

    @staticmethod
    def _open_pinned(pin: int, flags: int, mode: int, *, creating: bool) -> int:
        """Open what the O_PATH fd ``pin`` names with ``flags`` (no O_CREAT) and ``mode``
        (O_TMPFILE's); a FIFO goes to a worker (``_Fifo``, which then owns ``pin``)."""
        try:
            kind = os.fstat(pin).st_mode
        except BaseException:
            os.close(pin)
            raise
        if stat.S_ISFIFO(kind):
            raise _Fifo(pin)
        try:
            fd = os.open(procfs.own_fd(pin), flags | O_CLOEXEC, mode)
        finally:
            os.close(pin)
        if creating and stat.S_ISDIR(kind):
            os.close(fd)
            raise err(errno.EISDIR)  # O_CREAT on a directory, as in the kernel
        return fd

    @staticmethod
    def _no_fifo(dirfd: int, name: bytes) -> None:
        """Raise ``_Fifo`` with a pinned fd if ``name`` is a FIFO (an open of it waits)."""
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except OSError:
            return  # the open says what is (not) there
        if stat.S_ISFIFO(st.st_mode):
            pin = os.open(name, O_PATH | O_NOFOLLOW | O_CLOEXEC, dir_fd=dirfd)
            if stat.S_ISFIFO(os.fstat(pin).st_mode):
                raise _Fifo(pin)
            os.close(pin)

    def _open_fifo_later(self, listener: int, nid: int, pin: int, flags: int) -> None:
        """Open the pinned FIFO in a thread that answers the call once the other end is
        there: waiting here would hold up every other call of the sandbox, and the
        other end may need one first (``mkfifo p; echo hi > p & wc -c > out < p``)."""
        import threading

        # its own copy: the caller may close ``listener`` (a front passes one per call)
        listener = os.dup(listener)

        def work() -> None:
            try:
                try:
                    # the pin is the FIFO itself: O_NOFOLLOW would refuse the magic link
                    reopen = flags & ~(O_CREAT | O_EXCL | O_NOFOLLOW)
                    fd = os.open(procfs.own_fd(pin), reopen | O_CLOEXEC)
                except OSError as exc:
                    self._reply(listener, nid, 0, exc.errno or errno.EIO)
                    return
                finally:
                    os.close(pin)
                try:
                    self._reply_fd(listener, nid, fd, flags)
                except OSError as exc:
                    self._reply(listener, nid, 0, exc.errno or errno.EIO)
            finally:
                os.close(listener)

        threading.Thread(target=work, name="sandhold-fifo", daemon=True).start()

    def _follow(
        self,
        pid: int,
        base: int,
        parent: Parent,
        link: bytes,
        *,
        flags: int,
        mode: int,
        resolve: int,
        depth: int,
    ) -> int:
        """Open what the symlink ``link`` (found in ``parent``) points to, checked anew."""
        if depth >= MAX_SYMLINKS:
            raise err(errno.ELOOP)
        if link.startswith(b"/"):
            if resolve & notify.RESOLVE_BENEATH:
                raise err(errno.EXDEV)
            start = base if resolve & notify.RESOLVE_IN_ROOT else self.root
        else:
            start = parent.fd  # relative to the directory holding the link
        return self._open_path(
            pid, start, link, flags=flags, mode=mode, resolve=resolve, depth=depth + 1
        )

    def _reply_fd(self, listener: int, nid: int, fd: int, flags: int) -> None:
        try:
            notify.addfd_send(listener, nid, fd, bool(flags & O_CLOEXEC))
        finally:
            os.close(fd)

    def _emulate_open(
        self,
        listener: int,
        nid: int,
        pid: int,
        dirfd: int,
        path_addr: int,
        *,
        flags: int,
        mode: int,
        resolve: int = 0,
    ) -> None:
        path = self.mem.cstring(pid, path_addr)
        base = self._base(pid, dirfd, path, resolve)
        try:
            self._valid(listener, nid)
            fd = self._open_path(pid, base, path, flags=flags, mode=mode, resolve=resolve)
        except _Fifo as fifo:
            self._open_fifo_later(listener, nid, fifo.pin, flags)
            return
        finally:
            self._close_base(base)
        self._reply_fd(listener, nid, fd, flags)

    def _legacy_flags(self, flags: int, mode: int) -> tuple[int, int]:
        """open(2)/openat(2) semantics mapped onto openat2's stricter ones."""
        flags &= self.valid_open
        if flags & O_PATH:
            flags &= _O_PATH_FLAGS  # open(2) ignores the rest, O_CREAT included
        else:
            _check_create_flags(flags)
        if not flags & (O_CREAT | O_TMPFILE_BIT):
            mode = 0
        return flags, mode & 0o7777

    def _path_only(self, lfd: int, nid: int, flags: int) -> bool:
        """open/openat with O_PATH: the kernel drops O_CREAT, so the call makes no name
        whatever the path says; its flags are a register. Let it run (an O_PATH fd cannot
        be passed back with NOTIF_ADDFD at all)."""
        if not flags & self.valid_open & O_PATH:
            return False
        notify.send_continue(lfd, nid)
        return True

    def _open(self, lfd: int, nid: int, pid: int, a: Args) -> None:
        a0, a1, a2 = a[:3]
        if self._path_only(lfd, nid, a1):
            return
        flags, mode = self._legacy_flags(a1, a2)
        self._emulate_open(lfd, nid, pid, AT_FDCWD, a0, flags=flags, mode=mode)

    def _openat(self, lfd: int, nid: int, pid: int, a: Args) -> None:
        a0, a1, a2, a3 = a[:4]
        if self._path_only(lfd, nid, a2):
            return
        flags, mode = self._legacy_flags(a2, a3)
        self._emulate_open(lfd, nid, pid, a0, a1, flags=flags, mode=mode)

    def _creat(self, lfd: int, nid: int, pid: int, a: Args) -> None:
        a0, a1 = a[:2]
        flags, mode = self._legacy_flags(O_CREAT | os.O_WRONLY | os.O_TRUNC, a1)
        self._emulate_open(lfd, nid, pid, AT_FDCWD, a0, flags=flags, mode=mode)

    def _openat2(self, lfd: int, nid: int, pid: int, a: Args) -> None:
        a0, a1, a2, a3 = a[:4]
        size = a3
        if size < notify.OPEN_HOW_SIZE_VER0:
            raise err(errno.EINVAL)
        if size > notify.PAGE:
            raise err(errno.E2BIG)
        raw = self.mem.read(pid, a2, size)
        if len(raw) < size:
            raise err(errno.EFAULT)
        if raw[notify.OPEN_HOW_SIZE_VER0 :].strip(b"\0"):
            raise err(errno.E2BIG)  # a newer struct with fields we do not know
        flags, mode, resolve = notify.OPEN_HOW.unpack_from(raw)
        if flags >> 32 or mode >> 32 or resolve & ~notify.RESOLVE_ALL:
            raise err(errno.EINVAL)
        if resolve & RESOLVE_SCOPED == RESOLVE_SCOPED or (
            flags & O_PATH and flags & ~_O_PATH_FLAGS
        ):
            raise err(errno.EINVAL)  # as the kernel: openat2 refuses what open(2) drops
        _check_create_flags(flags)
        if (mode and not flags & (O_CREAT | O_TMPFILE_BIT)) or mode & ~0o7777:
            raise err(errno.EINVAL)  # openat2 refuses a mode it would not use, or no mode
        if flags & O_PATH:
            # NOTIF_ADDFD cannot pass an O_PATH fd back, and CONTINUE would let the kernel
            # re-read open_how (a racing thread could swap O_PATH for O_CREAT): refused as
            # unsupported, so callers fall back to openat(O_PATH), which is not trapped
            raise err(errno.ENOSYS)
        if resolve & RESOLVE_CACHED and flags & (O_CREAT | os.O_TRUNC | O_TMPFILE_BIT):
            raise err(errno.EAGAIN)  # as the kernel: these never resolve from the cache
        self._emulate_open(lfd, nid, pid, a0, a1, flags=flags, mode=mode, resolve=resolve)
