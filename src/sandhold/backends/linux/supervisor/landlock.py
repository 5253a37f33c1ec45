"""A Landlock domain that lets a process tree write only where the sandbox may write.

Defence in depth under the mount plan: should a mount ever be left writable by
mistake, Landlock still refuses the write.

Rules:
- Reads and execution are not restricted: only the write-like rights of the
  running kernel's ABI are handled (``WRITE_ACCESS`` by ABI: write, truncate,
  remove, make-*, refer, and device ioctls from ABI 5).
- Writes are allowed below the writable roots, the scratch directories, the
  default writable directories (``/dev/pts``, ``/dev/shm``), on the default
  writable devices (``/dev/null``-style) and on the caller's stdio where that is a
  terminal (the host's, which ``/dev/stderr`` reopens). Paths that do not exist are skipped:
  leaving out an *allow* never widens anything.
- ``restrict_writes`` applies to the calling thread and everything it forks or
  execs afterwards (Landlock domains are inherited and cannot be lifted). Call
  it in the child before ``exec``, or in a supervisor process before it starts
  any thread, so the supervisor and its targets share one domain (Landlock only
  lets a process inspect processes in its own domain or a nested one). With
  ``scope_signals`` (ABI 6) the domain may not signal processes outside it
  either: a launch with no supervisor gets this one domain alone.
- No Landlock (kernel < 5.13, or disabled): ``LandlockUnavailable``; the caller
  decides whether that stops the launch.
- ``confine_command`` puts the command in a nested domain that may make no
  name at all: every creating call is trapped and made by the supervisor, which
  stays outside that domain, so a call the filter does not trap (a new system
  call, a gap in the list) is refused by the kernel instead of making a name
  unchecked. Under ABI 6 that domain may not signal processes outside it either:
  the supervisor and its front hold the seccomp listener, and a command that
  killed them could load a listener of its own. Landlock nests the calling
  thread only: SandboxPort's agent enters it on the thread its execs fork from,
  after starting the supervisor thread, which stays outside.
"""

from __future__ import annotations

import errno
import os
import stat

# ``notify`` (struct, fcntl) is imported where it is used: the CLI reads the
# DEFAULT_* lists below at every start.

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

# include/uapi/linux/landlock.h
ACCESS_FS_EXECUTE = 1 << 0
ACCESS_FS_WRITE_FILE = 1 << 1
ACCESS_FS_READ_FILE = 1 << 2
ACCESS_FS_READ_DIR = 1 << 3
ACCESS_FS_REMOVE_DIR = 1 << 4
ACCESS_FS_REMOVE_FILE = 1 << 5
ACCESS_FS_MAKE_CHAR = 1 << 6
ACCESS_FS_MAKE_DIR = 1 << 7
ACCESS_FS_MAKE_REG = 1 << 8
ACCESS_FS_MAKE_SOCK = 1 << 9
ACCESS_FS_MAKE_FIFO = 1 << 10
ACCESS_FS_MAKE_BLOCK = 1 << 11
ACCESS_FS_MAKE_SYM = 1 << 12
ACCESS_FS_REFER = 1 << 13  # ABI 2
ACCESS_FS_TRUNCATE = 1 << 14  # ABI 3
ACCESS_FS_IOCTL_DEV = 1 << 15  # ABI 5
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
SCOPE_SIGNAL = 1 << 1  # ABI 6

MAKE_ACCESS = (
    ACCESS_FS_MAKE_CHAR
    | ACCESS_FS_MAKE_DIR
    | ACCESS_FS_MAKE_REG
    | ACCESS_FS_MAKE_SOCK
    | ACCESS_FS_MAKE_FIFO
    | ACCESS_FS_MAKE_BLOCK
    | ACCESS_FS_MAKE_SYM
)
_WRITE_V1 = ACCESS_FS_WRITE_FILE | ACCESS_FS_REMOVE_DIR | ACCESS_FS_REMOVE_FILE | MAKE_ACCESS
WRITE_ACCESS: dict[int, int] = {
    1: _WRITE_V1,
    2: _WRITE_V1 | ACCESS_FS_REFER,
    3: _WRITE_V1 | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE,
    4: _WRITE_V1 | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE,
    5: _WRITE_V1 | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE | ACCESS_FS_IOCTL_DEV,
}
"""The write-like filesystem rights each ABI knows (later ABIs add none)."""

# rights a rule on a non-directory may carry
_FILE_RIGHTS = (
    ACCESS_FS_EXECUTE
    | ACCESS_FS_WRITE_FILE
    | ACCESS_FS_READ_FILE
    | ACCESS_FS_TRUNCATE
    | ACCESS_FS_IOCTL_DEV
)

DEFAULT_DEVICES: tuple[str, ...] = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
)
DEFAULT_DIRS: tuple[str, ...] = ("/dev/pts", "/dev/shm")


class LandlockUnavailable(OSError):
    """The kernel offers no Landlock (too old, or not enabled at boot)."""


def landlock_abi() -> int:
    """The Landlock ABI version of the running kernel, 0 when there is none."""
    from sandhold.backends.linux.supervisor import notify

    try:
        return notify.raw_syscall("landlock_create_ruleset", 0, 0, CREATE_RULESET_VERSION)
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP):
            return 0
        raise


def handled_access(abi: int) -> int:
    """The write-like rights to handle under ``abi``."""
    return WRITE_ACCESS[min(abi, max(WRITE_ACCESS))]


def restrict_writes(
    writable: Iterable[str],
    *,
    devices: Iterable[str] = DEFAULT_DEVICES,
    dirs: Iterable[str] = DEFAULT_DIRS,
    scope_signals: bool = False,
) -> int:
    """Restrict the calling thread (and what it starts) to writing only below ``writable``.

    Args:
        writable: the writable roots and scratch directories (absolute).
        devices: device files that stay writable (default: ``/dev/null``-style).
        dirs: further directories that stay writable (default: ``/dev/pts``, ``/dev/shm``).
        scope_signals: the domain may not signal processes outside it (ABI 6;
            nothing on older kernels).

    Returns:
        The Landlock ABI version used.

    Raises:
        LandlockUnavailable: no Landlock on this kernel.
        OSError: the kernel refused the ruleset (a bug here, not a host fact).
    """
    abi = landlock_abi()
    if abi <= 0:
        raise LandlockUnavailable(errno.EOPNOTSUPP, "Landlock is not available on this kernel")
    import ctypes as ct

    from sandhold.backends.linux.supervisor import notify

    handled = handled_access(abi)

    class _PathBeneath(ct.Structure):
        _pack_ = 1
        _fields_ = (("allowed_access", ct.c_uint64), ("parent_fd", ct.c_int32))

    # struct landlock_ruleset_attr as of ABI 6 (see _nest)
    attr = (ct.c_uint64 * 3)(handled, 0, SCOPE_SIGNAL if scope_signals and abi >= 6 else 0)
    ruleset = notify.raw_syscall("landlock_create_ruleset", ct.addressof(attr), ct.sizeof(attr), 0)
    try:
        for path, is_dir_rule in (
            *((p, True) for p in writable),
            *((p, True) for p in dirs),
            *((p, False) for p in devices),
        ):
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a missing path: nothing to allow there
            try:
                is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
                rights = handled if is_dir and is_dir_rule else handled & _FILE_RIGHTS
                rule = _PathBeneath(rights, fd)
                notify.raw_syscall(
                    "landlock_add_rule", ruleset, RULE_PATH_BENEATH, ct.addressof(rule), 0
                )
            finally:
                os.close(fd)
        # stdio that is a terminal: reopened by name (/dev/stderr) it writes where the
        # inherited fd writes already. A regular file stays refused: that is the point.
        for fd in (0, 1, 2):
            if os.isatty(fd):
                rule = _PathBeneath(handled & _FILE_RIGHTS, fd)
                try:
                    notify.raw_syscall(
                        "landlock_add_rule", ruleset, RULE_PATH_BENEATH, ct.addressof(rule), 0
                    )
                except OSError:
                    pass  # a rule the kernel refuses only allows less
        notify.set_no_new_privs()
        notify.raw_syscall("landlock_restrict_self", ruleset, 0)
    finally:
        os.close(ruleset)
    return abi


def _nest(handled_fs: int, scoped: int) -> None:
    import ctypes as ct

    from sandhold.backends.linux.supervisor import notify

    # struct landlock_ruleset_attr as of ABI 6: handled_access_fs, handled_access_net,
    # scoped. An older kernel takes the larger struct while the fields it lacks are 0.
    attr = (ct.c_uint64 * 3)(handled_fs, 0, scoped)
    ruleset = notify.raw_syscall("landlock_create_ruleset", ct.addressof(attr), ct.sizeof(attr), 0)
    try:
        notify.set_no_new_privs()
        notify.raw_syscall("landlock_restrict_self", ruleset, 0)
    finally:
        os.close(ruleset)


def confine_command() -> int:
    """Nest the calling thread in a domain that may make no name, nor (ABI 6) signal
    processes outside it.

    Call it before the command's ``exec`` (in its child, or on the thread it forks
    from), after the supervisor that makes its names (and holds its listener) has
    been started outside. Removing names and writing to files are not affected.

    Returns:
        The Landlock ABI used, 0 when the kernel has none (then nothing is nested:
        the filter's traps, and its refusal of a second listener, stand alone).

    Raises:
        OSError: the kernel refused the domain (a bug here, not a host fact).
    """
    abi = landlock_abi()
    if abi > 0:
        _nest(MAKE_ACCESS, SCOPE_SIGNAL if abi >= 6 else 0)
    return abi
