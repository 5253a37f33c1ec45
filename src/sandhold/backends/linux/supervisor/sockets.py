"""The socket calls: ``bind`` of a unix socket (a new name), ``connect`` (F-NET-5).

Part of the emulator (``emulate.Emulator``).

Rules:
- Sockets are copied with ``pidfd_getfd`` and addresses read once: letting the
  kernel go on would re-read both (a racing thread could swap the address, or dup2
  a unix socket onto the fd, after the check).
- A bind's path is a new name, checked like any other and bound relative to the
  resolved parent (the serving thread's private cwd: there is no ``bindat``).
- A connect's unix path is resolved in the sandbox's view (symlinks followed here),
  pinned as an ``O_PATH`` fd, decided on its real path
  (``creation.unix_socket_denied``) and connected as ``/proc/self/fd/N``; every
  other address is connected as copied.
"""

from __future__ import annotations

import errno
import os
import stat

from sandhold.backends.linux import procfs
from sandhold.backends.linux.supervisor import notify
from sandhold.backends.linux.supervisor.checks import Checks, Denied
from sandhold.backends.linux.supervisor.resolve import (
    AT_FDCWD,
    MAX_SYMLINKS,
    O_CLOEXEC,
    O_NOFOLLOW,
    O_PATH,
    err,
)
from sandhold.policy import creation

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandhold.backends.linux.supervisor.resolve import Args


AF_UNIX = 1
SOCKADDR_MAX = 128  # sizeof(struct sockaddr_storage)
SUN_LEN_MAX = 110  # sizeof(struct sockaddr_un)
SOL_SOCKET, SO_DOMAIN = 1, 39


def _unix_path(addr: bytes) -> bytes:
    """The filesystem path of an AF_UNIX ``sockaddr``, or b"" (another family, an
    abstract name, autobind)."""
    if len(addr) > 2 and int.from_bytes(addr[:2], "little") == AF_UNIX and addr[2] != 0:
        return addr[2:].split(b"\0", 1)[0]
    return b""


class Sockets(Checks):
    """bind and connect (module rules)."""

    def _socket_and_address(self, pid: int, a: Args) -> tuple[int, bytes]:
        """Our copy of the caller's socket (``pidfd_getfd``) and of its address, read once."""
        a1, a2 = a[1], a[2]
        pidfd = notify.pidfd_open(pid)
        try:
            sock = notify.pidfd_getfd(pidfd, a[0] & 0xFFFF_FFFF)  # EBADF first, as the kernel
        finally:
            os.close(pidfd)
        try:
            size = a2 & 0xFFFF_FFFF
            if size > SOCKADDR_MAX:
                raise err(errno.EINVAL)
            addr = self.mem.read(pid, a1, size) if size else b""
            if len(addr) < size:
                raise err(errno.EFAULT)
        except BaseException:
            os.close(sock)
            raise
        return sock, addr

    def _bind(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        sock, addr = self._socket_and_address(pid, a)
        try:
            # as the kernel: a non-socket (ENOTSOCK) or another family's socket
            # (EINVAL/EAFNOSUPPORT) fails whatever name the address holds
            domain = int.from_bytes(notify.getsockopt(sock, SOL_SOCKET, SO_DOMAIN, 4), "little")
            path = _unix_path(addr) if domain == AF_UNIX else b""
            if not path:  # not a filesystem name: abstract, autobind or another family
                self._valid(lfd, nid)
                notify.bind(sock, addr)
                return 0
            if len(addr) > SUN_LEN_MAX:
                raise err(errno.EINVAL)
            base = self._base(pid, AT_FDCWD, path)
            try:
                self._valid(lfd, nid)
                parent = self._parent(pid, base, path)
                try:
                    self._writes(parent)
                    if not parent.special():
                        self._check(parent.path(), parent_fd=parent.fd, git_own=False)
                    os.umask(self._umask(pid))
                    # no bindat(2): bind relative to our (thread-private) cwd
                    os.fchdir(parent.fd)
                    name = parent.name + (b"/" if parent.trailing else b"")
                    notify.bind(sock, addr[:2] + name)  # the kernel ends sun_path itself
                finally:
                    parent.close()
            finally:
                self._close_base(base)
        finally:
            os.close(sock)
        return 0

    def _connect(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        """Every connect is performed here, on a copy of the caller's socket with a copy
        of its address: letting the kernel go on would re-read both (a racing thread
        could swap the address, or dup2 a unix socket onto the fd, after the check)."""
        sock, addr = self._socket_and_address(pid, a)
        try:
            domain = int.from_bytes(notify.getsockopt(sock, SOL_SOCKET, SO_DOMAIN, 4), "little")
            path = _unix_path(addr) if domain == AF_UNIX else b""
            if not path:  # another family, an abstract name (this netns only), or invalid
                self._valid(lfd, nid)
                notify.connect(sock, addr)
                return 0
            target = self._socket_inode(lfd, nid, pid, path)
            try:
                where = procfs.fd_link(target)
                reason = creation.unix_socket_denied(self.policy, where)
                if reason is not None:
                    raise Denied(where, reason, creation.UNIX_ACTION)
                # the pinned inode itself, never a name that could be swapped meanwhile
                notify.connect(sock, addr[:2] + procfs.own_fd(target).encode() + b"\0")
            finally:
                os.close(target)
        finally:
            os.close(sock)
        return 0

    def _socket_inode(self, lfd: int, nid: int, pid: int, path: bytes) -> int:
        """An ``O_PATH`` fd of what ``path`` names for the caller, symlinks followed here."""
        base = self._base(pid, AT_FDCWD, path)
        try:
            self._valid(lfd, nid)
            parent = self._parent(pid, base, path)
            for _ in range(MAX_SYMLINKS):
                try:
                    if parent.special() or parent.trailing:
                        raise err(errno.ECONNREFUSED)
                    fd = self.openat2(parent.fd, parent.name, O_PATH | O_NOFOLLOW | O_CLOEXEC, 0, 0)
                    mode = os.fstat(fd).st_mode
                    if not stat.S_ISLNK(mode):
                        if not stat.S_ISSOCK(mode):
                            os.close(fd)
                            raise err(errno.ECONNREFUSED)
                        return fd
                    os.close(fd)
                    link = self._readlink(parent.fd, parent.name)
                    if not link:
                        raise err(errno.ENOENT)
                    nxt = self._parent(pid, parent.fd, link)
                    if nxt.fd == parent.fd:  # a bare name: the same directory, one owner
                        nxt.owned, parent.owned = parent.owned, False
                finally:
                    parent.close()
                parent = nxt
            parent.close()
            raise err(errno.ELOOP)
        finally:
            self._close_base(base)
