"""Bindings for seccomp user notification and the calls a supervisor needs around it.

Covers: loading a filter with ``SECCOMP_FILTER_FLAG_NEW_LISTENER``, the listener
ioctls (``NOTIF_RECV``, ``NOTIF_SEND`` with or without
``SECCOMP_USER_NOTIF_FLAG_CONTINUE``, ``NOTIF_ID_VALID``, ``NOTIF_ADDFD`` with
``SECCOMP_ADDFD_FLAG_SEND``, ``NOTIF_SET_FLAGS``), reading strings and structs
from the target's memory (``process_vm_readv``), ``pidfd_open``/``pidfd_getfd``,
``openat2``, ``renameat2``, raw ``bind`` and ``unshare(CLONE_FS)``.

Rules:
- ``ctypes`` is imported on first use (``_lib()``), never at import time: nothing
  here is on the CLI's start-up path, and the seccomp compiler must stay cheap.
- Struct layouts are those of ``include/uapi/linux/seccomp.h`` and
  ``openat2.h``. x86_64 and aarch64 are both LP64 and little-endian and the
  structs have no architecture-dependent members, so one layout serves both;
  only syscall numbers differ (``_NUMBERS``).
- The ioctls go through ``fcntl.ioctl`` on ``bytes``: one C call, no ctypes
  marshalling, and a zero-filled input for ``NOTIF_RECV`` as the kernel demands.
- Errors surface as ``OSError`` with the kernel's errno, nothing else.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

# include/uapi/linux/seccomp.h
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV = 1 << 5
SECCOMP_USER_NOTIF_FLAG_CONTINUE = 1
SECCOMP_ADDFD_FLAG_SETFD = 1
SECCOMP_ADDFD_FLAG_SEND = 2
SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP = 1

# _IOWR('!', 0, struct seccomp_notif) etc.; the generic ioctl encoding of both arches
NOTIF_RECV = 0xC050_2100
NOTIF_SEND = 0xC018_2101
NOTIF_ID_VALID = 0x4008_2102
NOTIF_ADDFD = 0x4018_2103
NOTIF_SET_FLAGS = 0x4008_2104

# struct seccomp_notif { u64 id; u32 pid; u32 flags; struct seccomp_data data; }
# struct seccomp_data { s32 nr; u32 arch; u64 instruction_pointer; u64 args[6]; }
NOTIF = struct.Struct("<QIIiIQ6Q")
# struct seccomp_notif_resp { u64 id; s64 val; s32 error; u32 flags; }
RESP = struct.Struct("<QqiI")
# struct seccomp_notif_addfd { u64 id; u32 flags; u32 srcfd; u32 newfd; u32 newfd_flags; }
ADDFD = struct.Struct("<QIIII")
# struct open_how { u64 flags; u64 mode; u64 resolve; }
OPEN_HOW = struct.Struct("<QQQ")
OPEN_HOW_SIZE_VER0 = 24

_ZERO_NOTIF = bytes(NOTIF.size)

# include/uapi/linux/openat2.h
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
RESOLVE_CACHED = 0x20
RESOLVE_ALL = 0x3F

PIDFD_THREAD = os.O_EXCL  # include/uapi/linux/pidfd.h (6.9+)
CLONE_FS = 0x200
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PAGE = 4096
PATH_MAX = 4096

_NUMBERS = {
    "x86_64": {
        "seccomp": 317,
        "pidfd_send_signal": 424,
        "pidfd_open": 434,
        "pidfd_getfd": 438,
        "openat2": 437,
        "renameat2": 316,
        "landlock_create_ruleset": 444,
        "landlock_add_rule": 445,
        "landlock_restrict_self": 446,
    },
    "aarch64": {
        "seccomp": 277,
        "pidfd_send_signal": 424,
        "pidfd_open": 434,
        "pidfd_getfd": 438,
        "openat2": 437,
        "renameat2": 276,
        "landlock_create_ruleset": 444,
        "landlock_add_rule": 445,
        "landlock_restrict_self": 446,
    },
}


class _Lib:
    """libc entry points, loaded once; ``ctypes`` stays out of import time."""

    def __init__(self) -> None:
        import ctypes

        self.ctypes = ctypes
        # not seccomp.native_arch(): that module's tables cost the runner ~2 ms to load
        arch = {"x86_64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(
            os.uname().machine
        )
        if arch is None:
            raise OSError(errno.ENOSYS, f"no syscall numbers for {os.uname().machine}")
        self.nr = _NUMBERS[arch]
        libc = ctypes.CDLL(None, use_errno=True)
        self.libc = libc
        syscall = libc.syscall
        syscall.restype = ctypes.c_long
        self.syscall = syscall
        prctl = libc.prctl
        prctl.restype = ctypes.c_int
        # all five arguments: PR_SET_NO_NEW_PRIVS refuses (EINVAL) a non-zero arg5,
        # and a missing argument is whatever the register held
        prctl.argtypes = [ctypes.c_int, *(ctypes.c_ulong,) * 4]
        self.prctl = prctl
        bind = libc.bind
        bind.restype = ctypes.c_int
        bind.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        self.bind = bind
        connect = libc.connect
        connect.restype = ctypes.c_int
        connect.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        self.connect = connect
        getsockopt = libc.getsockopt
        getsockopt.restype = ctypes.c_int
        getsockopt.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_uint),
        ]
        self.getsockopt = getsockopt
        unshare = libc.unshare
        unshare.restype = ctypes.c_int
        unshare.argtypes = [ctypes.c_int]
        self.unshare = unshare

        # one struct class and one prototype per process: libc's function objects are
        # shared, so setting argtypes per user would break the users before
        class Iovec(ctypes.Structure):
            _fields_ = (("base", ctypes.c_void_p), ("len", ctypes.c_size_t))

        self.Iovec = Iovec

        class SockFprog(ctypes.Structure):  # struct sock_fprog
            _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

        self.SockFprog = SockFprog
        pvr = libc.process_vm_readv
        pvr.restype = ctypes.c_ssize_t
        pvr.argtypes = [
            ctypes.c_int,
            ctypes.POINTER(Iovec),
            ctypes.c_ulong,
            ctypes.POINTER(Iovec),
            ctypes.c_ulong,
            ctypes.c_ulong,
        ]
        self.process_vm_readv = pvr

    def check(self, ret: int) -> int:
        if ret < 0:
            err = self.ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return ret


_LIB: _Lib | None = None
_SOL_SOCKET, _SCM_RIGHTS = 1, 1


def _lib() -> _Lib:
    global _LIB
    if _LIB is None:
        _LIB = _Lib()
    return _LIB


def _syscall_address() -> int:
    """libc's ``syscall``, to bind with a fixed prototype (faster, and no shared argtypes)."""
    import ctypes

    address = ctypes.cast(_lib().libc.syscall, ctypes.c_void_p).value
    if address is None:
        raise OSError(errno.ENOSYS, "libc has no syscall()")
    return address


def load() -> None:
    """Load libc now (before ``fork``, so the child does not have to)."""
    _lib()


# -- in the child: the filter ------------------------------------------------------


def set_no_new_privs() -> None:
    """``prctl(PR_SET_NO_NEW_PRIVS, 1)``: needed to load a filter or a Landlock domain."""
    lib = _lib()
    lib.check(lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))


def install_filter(program: bytes, *, listener: bool = True) -> int:
    """Load ``program`` (``struct sock_filter[]``) on the calling thread; return the listener.

    Sets ``no_new_privs`` first. With ``listener`` the filter is loaded with
    ``NEW_LISTENER | WAIT_KILLABLE_RECV``: once the supervisor has received a
    notification, only a fatal signal can interrupt the waiting call, so a call
    the supervisor has already performed is never restarted and performed twice.

    Returns:
        The listener fd (close-on-exec), or 0 without ``listener``.

    Raises:
        OSError: the kernel refused the filter (EINVAL for a flag it lacks).
    """
    import ctypes as ct

    lib = _lib()
    set_no_new_privs()
    insns = len(program) // 8
    buf = ct.create_string_buffer(program, len(program))
    prog = lib.SockFprog(insns, ct.addressof(buf))
    flags = (
        SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV if listener else 0
    )
    fd = lib.check(
        lib.syscall(
            ct.c_long(lib.nr["seccomp"]),
            ct.c_ulong(SECCOMP_SET_MODE_FILTER),
            ct.c_ulong(flags),
            ct.byref(prog),
        )
    )
    if listener:
        os.set_inheritable(fd, False)
    return fd


def set_dumpable(dumpable: bool) -> None:
    """``prctl(PR_SET_DUMPABLE)``. A non-dumpable supervisor cannot be ptraced, nor its
    ``/proc/<pid>/mem`` opened, by the sandboxed processes that share its uid; exec
    resets it to dumpable, so the children it starts are not affected.
    """
    lib = _lib()
    lib.check(lib.prctl(PR_SET_DUMPABLE, int(dumpable), 0, 0, 0))


# -- in the supervisor: the listener -------------------------------------------------


def recv(listener: int) -> bytes:
    """``NOTIF_RECV``: the raw ``struct seccomp_notif`` (unpack with ``NOTIF``).

    Raises:
        OSError: ENOENT when the target died between poll and receive.
    """
    return fcntl.ioctl(listener, NOTIF_RECV, _ZERO_NOTIF)


def send(listener: int, notif_id: int, val: int, error: int) -> None:
    """``NOTIF_SEND``: the call returns ``val``, or fails with ``error`` (a positive errno)."""
    fcntl.ioctl(listener, NOTIF_SEND, RESP.pack(notif_id, val, -error if error else 0, 0))


def send_continue(listener: int, notif_id: int) -> None:
    """Let the kernel run the call. Only safe when the decision read no target memory."""
    fcntl.ioctl(listener, NOTIF_SEND, RESP.pack(notif_id, 0, 0, SECCOMP_USER_NOTIF_FLAG_CONTINUE))


def id_valid(listener: int, notif_id: int) -> bool:
    """``NOTIF_ID_VALID``: the target is still waiting in this very call."""
    try:
        fcntl.ioctl(listener, NOTIF_ID_VALID, notif_id.to_bytes(8, "little"))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    return True


def addfd_send(listener: int, notif_id: int, fd: int, cloexec: bool) -> None:
    """Install ``fd`` in the target and make it the call's return value, atomically."""
    fcntl.ioctl(
        listener,
        NOTIF_ADDFD,
        ADDFD.pack(notif_id, SECCOMP_ADDFD_FLAG_SEND, fd, 0, os.O_CLOEXEC if cloexec else 0),
    )


def set_sync_wakeup(listener: int) -> bool:
    """Ask for ``SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP`` (6.6+); False if the kernel lacks it."""
    try:
        # the flags are the ioctl's argument itself, not a pointer to them
        fcntl.ioctl(listener, NOTIF_SET_FLAGS, SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP)
    except OSError:
        return False  # an optimisation only: the supervisor is correct without it
    return True


# -- the target's memory and files -----------------------------------------------------


class MemReader:
    """Reads from another process with ``process_vm_readv`` into one reused buffer.

    A read that runs into an unmapped page returns what came before it, so a
    string near the end of a mapping is still found.
    """

    def __init__(self, size: int = PATH_MAX) -> None:
        import ctypes as ct

        lib = _lib()
        self._size = size
        self._buf = ct.create_string_buffer(size)
        self._local = lib.Iovec(ct.addressof(self._buf), size)
        self._remote = lib.Iovec(0, 0)
        self._fn = lib.process_vm_readv
        self._string_at = ct.string_at
        self._addr = ct.addressof(self._buf)
        self._get_errno = ct.get_errno
        self._local_p = ct.pointer(self._local)
        self._remote_p = ct.pointer(self._remote)

    def read(self, pid: int, addr: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``addr`` (fewer if the mapping ends); EFAULT if none."""
        size = min(size, self._size)
        self._local.len = size
        self._remote.base = addr
        self._remote.len = size
        n: int = self._fn(pid, self._local_p, 1, self._remote_p, 1, 0)
        if n < 0:
            err = self._get_errno()
            raise OSError(err, os.strerror(err))
        if n == 0 and size:
            raise OSError(errno.EFAULT, os.strerror(errno.EFAULT))
        data: bytes = self._string_at(self._addr, n)
        return data

    def cstring(self, pid: int, addr: int, limit: int = PATH_MAX) -> bytes:
        """The NUL-terminated string at ``addr``, without the NUL.

        Raises:
            OSError: EFAULT for a bad address, ENAMETOOLONG when no NUL comes
                within ``limit`` bytes (what the kernel answers for a path).
        """
        if not addr:
            raise OSError(errno.EFAULT, os.strerror(errno.EFAULT))
        # the rest of the first page first: most paths are short, and the next page
        # may not be mapped
        first = PAGE - (addr & (PAGE - 1))
        data = self.read(pid, addr, min(first, limit))
        end = data.find(b"\0")
        if end >= 0:
            return data[:end]
        if len(data) < min(first, limit) or first >= limit:
            raise OSError(
                errno.EFAULT if len(data) < min(first, limit) else errno.ENAMETOOLONG,
                "unterminated string",
            )
        more = self.read(pid, addr + first, limit - first)
        end = more.find(b"\0")
        if end >= 0:
            return data + more[:end]
        if len(more) < limit - first:
            raise OSError(errno.EFAULT, os.strerror(errno.EFAULT))
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))


def pidfd_open(pid: int) -> int:
    """A pidfd for thread ``pid`` (``PIDFD_THREAD`` first, then a process pidfd)."""
    try:
        return os.pidfd_open(pid, PIDFD_THREAD)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return os.pidfd_open(pid)


class PidfdAlive:
    """``pidfd_send_signal(pidfd, 0)``: is the task behind a pidfd still there?"""

    def __init__(self) -> None:
        import ctypes as ct

        lib = _lib()
        self._fn = ct.CFUNCTYPE(
            ct.c_long, ct.c_long, ct.c_int, ct.c_int, ct.c_void_p, ct.c_uint, use_errno=True
        )(_syscall_address())
        self._nr = lib.nr["pidfd_send_signal"]

    def __call__(self, pidfd: int) -> bool:
        return bool(self._fn(self._nr, pidfd, 0, None, 0) == 0)


def pidfd_getfd(pidfd: int, target_fd: int) -> int:
    """A copy of the target's ``target_fd`` (same open file description), close-on-exec."""
    lib = _lib()
    ct = lib.ctypes
    return lib.check(
        lib.syscall(
            ct.c_long(lib.nr["pidfd_getfd"]), ct.c_int(pidfd), ct.c_int(target_fd), ct.c_uint(0)
        )
    )


class Openat2:
    """``openat2`` with a reused ``struct open_how``; the hot path of path resolution."""

    def __init__(self) -> None:
        import ctypes as ct

        lib = _lib()

        class _OpenHow(ct.Structure):
            _fields_ = (("flags", ct.c_uint64), ("mode", ct.c_uint64), ("resolve", ct.c_uint64))

        self._how = _OpenHow(0, 0, 0)
        self._how_p = ct.pointer(self._how)
        self._fn = ct.CFUNCTYPE(
            ct.c_long, ct.c_long, ct.c_int, ct.c_char_p, ct.c_void_p, ct.c_size_t, use_errno=True
        )(_syscall_address())
        self._nr = lib.nr["openat2"]
        self._size = ct.sizeof(_OpenHow)
        self._get_errno = ct.get_errno

    def __call__(self, dirfd: int, path: bytes, flags: int, mode: int, resolve: int) -> int:
        how = self._how
        how.flags = flags
        how.mode = mode
        how.resolve = resolve
        fd: int = self._fn(self._nr, dirfd, path, self._how_p, self._size)
        if fd < 0:
            err = self._get_errno()
            raise OSError(err, os.strerror(err), path)
        return fd


def renameat2(olddirfd: int, old: bytes, newdirfd: int, new: bytes, flags: int) -> None:
    """``renameat2``; ``os.rename`` cannot pass ``RENAME_EXCHANGE`` and friends."""
    lib = _lib()
    ct = lib.ctypes
    lib.check(
        lib.syscall(
            ct.c_long(lib.nr["renameat2"]),
            ct.c_int(olddirfd),
            ct.c_char_p(old),
            ct.c_int(newdirfd),
            ct.c_char_p(new),
            ct.c_uint(flags),
        )
    )


def bind(fd: int, sockaddr: bytes) -> None:
    """``bind(fd, sockaddr)`` with the raw address bytes (any family)."""
    lib = _lib()
    lib.check(lib.bind(fd, sockaddr, len(sockaddr)))


def connect(fd: int, sockaddr: bytes) -> None:
    """``connect(fd, sockaddr)`` with the raw address bytes (any family)."""
    lib = _lib()
    lib.check(lib.connect(fd, sockaddr, len(sockaddr)))


def getsockopt(fd: int, level: int, option: int, size: int) -> bytes:
    """``getsockopt`` on a raw fd (no ``socket`` object, which would own and close it)."""
    lib = _lib()
    ct = lib.ctypes
    buf = ct.create_string_buffer(size)
    length = ct.c_uint(size)
    lib.check(lib.getsockopt(fd, level, option, buf, ct.byref(length)))
    raw: bytes = buf.raw
    return raw[: length.value]


def sealed_memfd(name: str, data: bytes, *, mode: int | None = None) -> int:
    """A close-on-exec memfd holding ``data``, sealed against any change; ``mode``: its
    permission bits (0o111: execute-only, so what runs from it is non-dumpable)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        if mode is not None:
            os.fchmod(fd, mode)
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except BaseException:
        os.close(fd)
        raise
    return fd


def send_fd(sock_fd: int, fd: int, data: bytes = b"L") -> None:
    """Send ``fd`` over the unix socket ``sock_fd`` (SCM_RIGHTS), with ``data``.

    Through ``_socket``: the ``socket`` module imports ``enum`` (~4 ms), and this runs
    on every supervised start.
    """
    import _socket

    sock = _socket.socket(fileno=os.dup(sock_fd))
    try:
        sock.sendmsg([data], [(_SOL_SOCKET, _SCM_RIGHTS, fd.to_bytes(4, "little"))])
    finally:
        sock.close()


def recv_fd(sock_fd: int, timeout: float | None = None) -> int:
    """The fd ``send_fd`` sent over ``sock_fd`` (close-on-exec), or -1 at end of stream.

    Raises:
        OSError: ETIMEDOUT when nothing arrived within ``timeout`` seconds.
    """
    return recv_message(sock_fd, 1, timeout)[1]


def recv_message(sock_fd: int, size: int, timeout: float | None = None) -> tuple[bytes, int]:
    """Up to ``size`` bytes and the fd sent with them (close-on-exec; -1: none).

    Raises:
        OSError: ETIMEDOUT when nothing arrived within ``timeout`` seconds.
    """
    import _socket

    sock = _socket.socket(fileno=os.dup(sock_fd))
    try:
        sock.settimeout(timeout)
        try:
            msg, ancdata, _flags, _addr = sock.recvmsg(size, _socket.CMSG_SPACE(4))
        except TimeoutError as exc:
            raise OSError(errno.ETIMEDOUT, "no fd arrived") from exc
    finally:
        sock.close()
    fds = [
        int.from_bytes(data[i : i + 4], "little")
        for level, kind, data in ancdata
        if level == _SOL_SOCKET and kind == _SCM_RIGHTS
        for i in range(0, len(data) - len(data) % 4, 4)
    ]
    for extra in fds[1:]:
        os.close(extra)
    if not fds:
        return msg, -1
    os.set_inheritable(fds[0], False)
    return msg, fds[0]


def unshare_fs() -> None:
    """Give the calling thread its own cwd and umask (``unshare(CLONE_FS)``).

    The supervisor thread changes both per call (``fchdir`` for ``bind``, the
    target's umask for creations); other threads of the process must not see it.
    """
    lib = _lib()
    lib.check(lib.unshare(CLONE_FS))


def raw_syscall(name: str, *args: int) -> int:
    """A syscall by name from ``_NUMBERS`` with integer arguments (Landlock, tests)."""
    lib = _lib()
    ct = lib.ctypes
    return lib.check(lib.syscall(ct.c_long(lib.nr[name]), *(ct.c_ulong(a) for a in args)))
