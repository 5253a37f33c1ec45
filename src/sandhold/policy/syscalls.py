"""The system calls a sandboxed process may not make, as a table of rules.

Rules:
- Default allow. This is a denylist of kernel features that would undo or route
  around the mount, user, network and tty isolation bubblewrap sets up; anything
  it does not name is allowed. The allow-lists are ``socket``'s family (inet,
  netlink and unix only) and, unless every unix socket is allowed, the type of a
  ``socketpair`` (stream and seqpacket only).
- A rule names one syscall, an action, an optional test on one argument, and a
  ``why`` that ``--explain`` prints. For one syscall the first matching rule
  wins, in table order; no match means allow.
- Actions are an errno name (the call fails with that error and the process
  goes on), ``KILL_PROCESS``, ``USER_NOTIF`` (the call waits while the
  creation-time supervisor performs it, see ``creation_rules``), or ``ALLOW``
  (an exception ahead of a later rule for the same call). ``ENOSYS`` is
  for calls whose arguments a filter cannot see (``clone3`` keeps its flags
  behind a pointer): libc then falls back to a call it can.
- Argument tests compare only the low 32 bits, ``(arg & mask) == value`` or
  ``!=``: every argument tested here is an ``int``/``unsigned int`` the kernel
  truncates, or flags whose bits all live in the low word. Comparing all 64
  bits would let a caller set the high bits and slip past (the known TIOCSTI
  bypass).
- The ``FOREIGN_ABI`` rule covers every syscall made through a non-native ABI
  (x86 32-bit or x32 on x86_64, AArch32 on arm64), whose numbers mean other
  calls: it kills the process. A compiled filter must carry it.
- Pure data: syscall numbers and BPF belong to the backend
  (``sandhold.backends.linux.seccomp``).
"""

from __future__ import annotations

from sandhold._record import record

TYPE_CHECKING = False  # typing costs ~3 ms at start-up; mypy honours this name
if TYPE_CHECKING:
    from typing import Literal

    Comparison = Literal["eq", "ne"]

EPERM = "EPERM"
ENOSYS = "ENOSYS"
EOPNOTSUPP = "EOPNOTSUPP"
KILL_PROCESS = "KILL_PROCESS"
USER_NOTIF = "USER_NOTIF"
ALLOW = "ALLOW"
ACTIONS = frozenset({EPERM, ENOSYS, EOPNOTSUPP, KILL_PROCESS, USER_NOTIF, ALLOW})

FOREIGN_ABI = "*"
"""The ``syscall`` of the rule that covers every call from a non-native ABI."""

# include/uapi/linux/sched.h
CLONE_NEWTIME = 0x00000080
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (
    CLONE_NEWNS
    | CLONE_NEWUSER
    | CLONE_NEWNET
    | CLONE_NEWPID
    | CLONE_NEWIPC
    | CLONE_NEWUTS
    | CLONE_NEWCGROUP
    | CLONE_NEWTIME
)

AF_UNIX = 1
AF_INET = 2
AF_INET6 = 10
AF_NETLINK = 16
SOCK_STREAM = 1
SOCK_TYPE_MASK = 0xF  # the rest of socket()'s type argument is SOCK_NONBLOCK/SOCK_CLOEXEC
# include/uapi/asm-generic/fcntl.h: the same bit on x86_64 and arm64
O_CREAT = 0o100
# include/uapi/linux/btrfs.h: SNAP_CREATE, SUBVOL_CREATE, SNAP_CREATE_V2, SUBVOL_CREATE_V2
# (_IOW(0x94, n, 4096-byte args); the same numbers on x86_64 and arm64)
BTRFS_NAME_IOCTLS = (0x50009401, 0x5000940E, 0x50009417, 0x50009418)
# include/uapi/linux/fs.h: _IOW('f', 2, long), the same number on x86_64 and arm64. Its
# 32-bit twin FS_IOC32_SETFLAGS (0x40046602) is translated only for 32-bit callers
# (fs/ioctl.c's compat_sys_ioctl), whose every call the FOREIGN_ABI rule kills.
FS_IOC_SETFLAGS = 0x40086602
# include/uapi/linux/fcntl.h
F_SETLEASE = 1024
SOCK_SEQPACKET = 5
# include/uapi/linux/seccomp.h
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
# include/uapi/asm-generic/ioctls.h (x86_64 and arm64 share these numbers)
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
# include/uapi/linux/kd.h and vt.h: the console's ioctls are the plain numbers 0x4Bxx
# (KDSKBMODE, KDSETMODE, fonts, keymaps) and 0x56xx (VT_ACTIVATE, ...)
CONSOLE_IOCTL_TYPES = (0x4B00, 0x5600)
# include/uapi/linux/stat.h
S_ISUID = 0o4000
S_ISGID = 0o2000
S_IWGRP = 0o020
S_IWOTH = 0o002
# include/uapi/linux/resource.h, include/uapi/linux/ioprio.h
PRIO_PROCESS = 0
IOPRIO_WHO_PROCESS = 1

_LOW32 = 0xFFFF_FFFF


@record
class ArgTest:
    """``(args[index] & mask) <comparison> value`` on the low 32 bits of the argument."""

    index: int
    mask: int
    value: int
    comparison: Comparison = "eq"

    def describe(self, syscall: str) -> str:
        arg = f"arg{self.index}" if self.mask == _LOW32 else f"arg{self.index} & {self.mask:#x}"
        op = "==" if self.comparison == "eq" else "!="
        return f"{syscall}({arg} {op} {self.value:#x})"


@record
class Rule:
    """What happens when a sandboxed process calls ``syscall`` (``FOREIGN_ABI``: see module)."""

    syscall: str
    action: str
    why: str
    when: ArgTest | None = None

    def describe(self) -> str:
        """One ``--explain`` line, e.g. ``mount -> EPERM: why``."""
        if self.syscall == FOREIGN_ABI:
            what = "any syscall from a non-native ABI"
        elif self.when is None:
            what = self.syscall
        else:
            what = self.when.describe(self.syscall)
        return f"{what} -> {self.action}: {self.why}"


def _deny(names: str, why: str) -> tuple[Rule, ...]:
    return tuple(Rule(name, EPERM, why) for name in names.split())


_WHY_MOUNT = "mounts must stay as the sandbox set them (read-only binds cannot be undone)"
_WHY_NS = "new namespaces could regain the privileges the sandbox dropped"
_WHY_IO_URING = "io_uring performs syscalls the filter never sees"
_WHY_KEYS = "the kernel keyring is not namespaced: it is shared with the host user"
_WHY_HOST = "acts on the host kernel, not only inside the sandbox"
_WHY_SETID = (
    "a set-user-ID or set-group-ID file made in a writable root, or on a host file the "
    "command was handed as stdio, runs with its owner's rights on the host (root's, "
    "when sandhold runs as root): nosuid holds only inside the sandbox"
)
_WHY_LOOSEN = (
    "group or world write on a file or directory lets another local user change it "
    "after the run: a repository's .git, whose config the host's git then runs, or the "
    "writable root itself (refused on every path: a filter cannot see which)"
)
_WHY_XATTR = (
    "extended attributes are not set in the sandbox: a POSIX ACL (system.posix_acl_*) "
    "gives another user write access, a security.capability makes a file privileged "
    "on the host, and the filter cannot read which attribute is meant"
)
_WHY_GROUP = (
    "process groups and users are not confined by the PID namespace: these reach host "
    "processes in sandhold's group (the harness, a pipeline's other commands)"
)

_BASE_RULES: tuple[Rule, ...] = (
    Rule(
        FOREIGN_ABI,
        KILL_PROCESS,
        "other ABIs number syscalls differently and would bypass every rule below",
    ),
    *_deny(
        "mount umount2 pivot_root move_mount open_tree open_tree_attr fsopen fsconfig "
        "fsmount fspick mount_setattr chroot",
        _WHY_MOUNT,
    ),
    Rule("setns", EPERM, "entering another namespace would step out of the sandbox"),
    Rule("unshare", EPERM, _WHY_NS, ArgTest(0, NAMESPACE_FLAGS, 0, "ne")),
    # For clone the low byte is the exit signal; 0x80 there (CLONE_NEWTIME) is never a
    # valid signal, so matching it only turns the kernel's EINVAL into EPERM.
    Rule("clone", EPERM, _WHY_NS, ArgTest(0, NAMESPACE_FLAGS, 0, "ne")),
    Rule(
        "clone3",
        ENOSYS,
        "its flags sit behind a pointer the filter cannot read; libc falls back to clone",
    ),
    *_deny("io_uring_setup io_uring_enter io_uring_register", _WHY_IO_URING),
    Rule("open_by_handle_at", EPERM, "file handles open files outside the bound paths"),
    Rule(
        "ioctl",
        EPERM,
        "pushing input into the terminal runs commands outside the sandbox",
        ArgTest(1, _LOW32, TIOCSTI),
    ),
    Rule(
        "ioctl",
        EPERM,
        "the console ioctl can paste the selection as terminal input",
        ArgTest(1, _LOW32, TIOCLINUX),
    ),
    *(
        Rule(
            "ioctl",
            EPERM,
            "on a Linux virtual console these switch it to graphics mode, turn the "
            "keyboard off or raw, change its fonts and keymaps or switch consoles, "
            "outside the sandbox",
            ArgTest(1, 0xFFFF_FF00, kind),
        )
        for kind in CONSOLE_IOCTL_TYPES
    ),
    *(
        Rule(
            "ioctl",
            EPERM,
            "btrfs subvolumes and snapshots are names made by an ioctl the supervisor "
            "never sees (a snapshot can carry a .git with hooks)",
            ArgTest(1, _LOW32, request),
        )
        for request in BTRFS_NAME_IOCTLS
    ),
    Rule(
        "ioctl",
        EPERM,
        "file flags (chattr) sit behind a pointer, so all are refused: +F makes an empty "
        "directory case-insensitive (ext4, tmpfs), where a .ENV or .GIT/HOOKS made is the "
        "host's .env or .git/hooks while the supervisor compares names exactly",
        ArgTest(1, _LOW32, FS_IOC_SETFLAGS),
    ),
    Rule(
        "fcntl",
        EPERM,
        "a lease stalls every other opener of the file, on the host too, and the "
        "supervisor with them",
        ArgTest(1, _LOW32, F_SETLEASE),
    ),
    # (mode argument: chmod and fchmod's second, fchmodat and fchmodat2's third; a
    # mode_t, so its low 32 bits are all of it.) mkdir ignores these bits; a new file's
    # mode is checked by the creation-time supervisor.
    Rule("chmod", EPERM, _WHY_SETID, ArgTest(1, S_ISUID | S_ISGID, 0, "ne")),
    Rule("fchmod", EPERM, _WHY_SETID, ArgTest(1, S_ISUID | S_ISGID, 0, "ne")),
    Rule("fchmodat", EPERM, _WHY_SETID, ArgTest(2, S_ISUID | S_ISGID, 0, "ne")),
    Rule("fchmodat2", EPERM, _WHY_SETID, ArgTest(2, S_ISUID | S_ISGID, 0, "ne")),
    Rule("chmod", EPERM, _WHY_LOOSEN, ArgTest(1, S_IWGRP | S_IWOTH, 0, "ne")),
    Rule("fchmod", EPERM, _WHY_LOOSEN, ArgTest(1, S_IWGRP | S_IWOTH, 0, "ne")),
    Rule("fchmodat", EPERM, _WHY_LOOSEN, ArgTest(2, S_IWGRP | S_IWOTH, 0, "ne")),
    Rule("fchmodat2", EPERM, _WHY_LOOSEN, ArgTest(2, S_IWGRP | S_IWOTH, 0, "ne")),
    *(
        Rule(name, EOPNOTSUPP, _WHY_XATTR)
        for name in (
            "setxattr",
            "lsetxattr",
            "fsetxattr",
            "setxattrat",
            "removexattr",
            "lremovexattr",
            "fremovexattr",
            "removexattrat",
        )
    ),
    Rule(
        "prlimit64",
        EPERM,
        "another process's limits: lowered, they kill or starve sandhold's own processes "
        "in the sandbox (its agent, the supervisor's front), which cannot raise them back",
        ArgTest(0, _LOW32, 0, "ne"),
    ),
    Rule("setpriority", EPERM, _WHY_GROUP, ArgTest(0, _LOW32, PRIO_PROCESS, "ne")),
    Rule("ioprio_set", EPERM, _WHY_GROUP, ArgTest(0, _LOW32, IOPRIO_WHO_PROCESS, "ne")),
    *_deny("keyctl add_key request_key", _WHY_KEYS),
    Rule("bpf", EPERM, "eBPF programs inspect and change the kernel"),
    Rule("perf_event_open", EPERM, "performance counters leak host activity"),
    Rule("userfaultfd", EPERM, "page-fault handling in user space widens kernel races"),
    *_deny(
        "kexec_load kexec_file_load init_module finit_module delete_module acct swapon "
        "swapoff reboot syslog quotactl lookup_dcookie vhangup",
        _WHY_HOST,
    ),
)

# socket(): an allow-list of families. The network namespace isolates inet and netlink
# (netlink then sees only the sandbox's lo); other families are not namespaced or not
# needed: AF_VSOCK talks to the hypervisor and the VM's other guests, AF_BLUETOOTH,
# AF_CAN and the like reach hardware, AF_ALG and AF_XDP widen the kernel's surface.
# AF_UNIX falls through to the rules after these.
_FAMILY_RULES = (
    *(
        Rule(
            "socket",
            ALLOW,
            "an inet socket: the network namespace confines it",
            ArgTest(0, _LOW32, family),
        )
        for family in (AF_INET, AF_INET6)
    ),
    Rule(
        "socket",
        ALLOW,
        "netlink sees only the sandbox's network namespace",
        ArgTest(0, _LOW32, AF_NETLINK),
    ),
    Rule(
        "socket",
        EPERM,
        "only inet, netlink and unix sockets: other families (vsock, bluetooth, can, alg, "
        "xdp ...) reach past the network namespace or widen the kernel's surface",
        ArgTest(0, _LOW32, AF_UNIX, "ne"),
    ),
    Rule(
        "socketpair",
        EPERM,
        "only unix socket pairs (other families' pairs are not namespaced)",
        ArgTest(0, _LOW32, AF_UNIX, "ne"),
    ),
)

# A datagram socket pair's sendto can name any socket path: only stream and seqpacket
# pairs, which ignore or refuse an address, unless every unix socket is allowed anyway.
_SOCKETPAIR_RULES = (
    *(
        Rule(
            "socketpair",
            ALLOW,
            "a connected pair that cannot send to another address",
            ArgTest(1, SOCK_TYPE_MASK, kind),
        )
        for kind in (SOCK_STREAM, SOCK_SEQPACKET)
    ),
    Rule(
        "socketpair",
        EPERM,
        "a datagram pair's sendto reaches any unix socket path, past network.allowUnixSockets",
    ),
)

_UNIX_SOCKET_RULE = Rule(
    "socket",
    EPERM,
    "unix sockets reach host services outside the sandbox (stream and seqpacket "
    "socket pairs stay allowed)",
)


_UNIX_STREAM_RULES = (
    Rule(
        "socket",
        ALLOW,
        "a stream unix socket reaches a path only through connect, which the supervisor "
        "checks against network.allowUnixSockets",
        ArgTest(1, SOCK_TYPE_MASK, SOCK_STREAM),
    ),
    Rule(
        "socket",
        EPERM,
        "datagram and seqpacket unix sockets can send to a path without connect "
        "(stream and seqpacket socket pairs stay allowed)",
    ),
)


def syscall_rules(
    *, allow_unix_sockets: bool, supervised_unix_sockets: bool = False
) -> tuple[Rule, ...]:
    """The rules for one sandbox, in order (see the module doc for their meaning).

    Args:
        allow_unix_sockets: let ``socket(AF_UNIX, ...)`` through (other families than
            inet, netlink and unix are refused in every case). A filter cannot see
            socket paths (``connect`` takes a pointer), so this is all or nothing; which
            sockets are reachable is then up to the mount plan.
        supervised_unix_sockets: allow stream unix sockets only, for a sandbox whose
            supervisor performs every ``connect`` (``creation_rules(connect=True)``)
            and so decides which socket paths are reachable (F-NET-5).

    Returns:
        The rules, first match wins per syscall. ``FOREIGN_ABI`` comes first.
    """
    if allow_unix_sockets:
        return (*_BASE_RULES, *_FAMILY_RULES)
    if supervised_unix_sockets:
        return (*_BASE_RULES, *_FAMILY_RULES, *_SOCKETPAIR_RULES, *_UNIX_STREAM_RULES)
    return (*_BASE_RULES, *_FAMILY_RULES, *_SOCKETPAIR_RULES, _UNIX_SOCKET_RULE)


def validate(rules: tuple[Rule, ...]) -> None:
    """Raise ``ValueError`` naming the rule if ``rules`` could not be enforced as written.

    Checks: known actions, argument index 0-5, mask and value within 32 bits, exactly
    one ``FOREIGN_ABI`` rule, and no rule hidden behind an unconditional one.
    """
    unconditional: set[str] = set()
    foreign = 0
    for rule in rules:
        if rule.action not in ACTIONS:
            raise ValueError(f"{rule.describe()}: unknown action {rule.action!r}")
        if rule.syscall == FOREIGN_ABI:
            foreign += 1
            if rule.when is not None:
                raise ValueError(f"{rule.describe()}: the foreign-ABI rule takes no argument test")
            continue
        if rule.syscall in unconditional:
            raise ValueError(
                f"{rule.describe()}: unreachable, an earlier rule matches every {rule.syscall} call"
            )
        test = rule.when
        if test is None:
            unconditional.add(rule.syscall)
            continue
        if not 0 <= test.index <= 5:
            raise ValueError(f"{rule.describe()}: argument index must be 0-5")
        if not (0 <= test.mask <= _LOW32 and 0 <= test.value <= _LOW32):
            raise ValueError(f"{rule.describe()}: mask and value must fit in 32 bits")
        if test.value & ~test.mask:
            raise ValueError(f"{rule.describe()}: value has bits outside the mask")
        if test.comparison not in ("eq", "ne"):
            raise ValueError(f"{rule.describe()}: unknown comparison {test.comparison!r}")
    if foreign != 1:
        raise ValueError(f"need exactly one foreign-ABI rule ({FOREIGN_ABI!r}), got {foreign}")


# -- the creation-time supervisor (F-BE-5) -----------------------------------------

_WHY_CREATE = "creates a name: the supervisor checks it and performs the call itself"

CREATION_RULES: tuple[Rule, ...] = (
    # open/openat/creat only create with O_CREAT; every other open goes straight through.
    # O_TMPFILE makes no name (linkat gives it one, and that is trapped), so it is not trapped.
    Rule("open", USER_NOTIF, _WHY_CREATE, ArgTest(1, O_CREAT, 0, "ne")),
    Rule("openat", USER_NOTIF, _WHY_CREATE, ArgTest(2, O_CREAT, 0, "ne")),
    Rule("creat", USER_NOTIF, _WHY_CREATE),
    Rule(
        "openat2",
        USER_NOTIF,
        "its flags sit behind a pointer the filter cannot read: every call is performed "
        "by the supervisor",
    ),
    *(
        Rule(name, USER_NOTIF, _WHY_CREATE)
        for name in (
            "mkdir",
            "mkdirat",
            "mknod",
            "mknodat",
            "rename",
            "renameat",
            "renameat2",
            "link",
            "linkat",
            "symlink",
            "symlinkat",
        )
    ),
    Rule(
        "bind",
        USER_NOTIF,
        "an AF_UNIX path bind creates a name (the family sits behind a pointer)",
    ),
    Rule(
        "seccomp",
        EPERM,
        "a listener of its own would take the trapped calls from the supervisor's (the "
        "newest filter's listener answers), and could let them all through",
        ArgTest(1, SECCOMP_FILTER_FLAG_NEW_LISTENER, 0, "ne"),
    ),
    Rule(
        "umask",
        USER_NOTIF,
        "the supervisor creates with the caller's umask and tracks changes to it",
    ),
)
"""The calls the creation-time supervisor handles, in addition to a base table.

The legacy calls (``open``, ``creat``, ``mkdir``, ``rename``, ...) do not exist on
arm64; a compiler skips a rule only for a syscall its architecture lacks.
"""


CONNECT_RULE = Rule(
    "connect",
    USER_NOTIF,
    "the socket and its address sit behind an fd and a pointer: the supervisor performs "
    "every connect, and a unix socket path only when network.allowUnixSockets names it",
)


def creation_rules(
    base: tuple[Rule, ...] | None = None, *, connect: bool = False
) -> tuple[Rule, ...]:
    """A rule table with the supervisor's ``USER_NOTIF`` rules appended.

    Args:
        base: the sandbox's own rules (``syscall_rules(...)``), which keep their
            meaning. ``None`` gives a stand-alone table: the ``FOREIGN_ABI`` kill
            rule (a 32-bit call would go around the supervisor) and the creation
            rules, with io_uring and ``open_by_handle_at`` refused so nothing
            reaches files behind the supervisor's back.

        connect: trap ``connect`` too (``CONNECT_RULE``), for per-path unix sockets.

    Returns:
        ``base`` followed by ``CREATION_RULES``; ``validate`` accepts it.
    """
    if base is None:
        base = (
            _BASE_RULES[0],
            *(r for r in _BASE_RULES if r.syscall.startswith("io_uring")),
            *(r for r in _BASE_RULES if r.syscall == "open_by_handle_at"),
        )
    return (*base, *CREATION_RULES, *((CONNECT_RULE,) if connect else ()))
