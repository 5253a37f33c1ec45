"""Compile the syscall rules of ``sandhold.policy.syscalls`` into a seccomp program for bwrap.

The result is the raw array of ``struct sock_filter`` (classic BPF) that
``bwrap --seccomp FD`` reads from the descriptor and loads with
``SECCOMP_SET_MODE_FILTER`` just before it executes the command.

Rules:
- The program first checks ``seccomp_data.arch`` against the native ABI and, on
  x86_64, rejects x32 calls (``nr >= 0x40000000``); both take the policy's
  ``FOREIGN_ABI`` action (kill the process), since their syscall numbers name
  other calls. ``nr == -1`` is let through as libseccomp does: it is no syscall
  in any ABI (the kernel answers ENOSYS) and ptrace uses it to skip a call.
- Then one ``jeq`` per syscall the rules name, each followed by that syscall's
  rules in table order, ending in ALLOW. Anything else is allowed (default allow).
- Argument tests read the low 32-bit word of ``args[i]`` (both supported
  architectures are little-endian, so it sits at ``16 + 8*i``), as the policy
  specifies.
- Syscall numbers come from the hand-written tables below, one per
  architecture, holding only the syscalls the rules name. A rule naming a
  syscall missing from the table is an error, never skipped, with one
  exception: the legacy calls an architecture does not have at all (arm64 has
  no ``open``, ``mkdir``, ``rename``, ...) are listed as absent there, and a
  rule for one of them is dropped for that architecture (nothing can call it).
- ``USER_NOTIF`` rules (the creation-time supervisor's) return
  ``SECCOMP_RET_USER_NOTIF``; the program must then be loaded with
  ``SECCOMP_FILTER_FLAG_NEW_LISTENER`` (``sandhold.backends.linux.supervisor.notify``).
- No decisions here: which calls to refuse is ``policy/syscalls.py``'s job.

Why pure Python with ``struct`` and not libseccomp: the libseccomp bindings
are not on PyPI (they come from the distribution, so a venv cannot use them),
and loading libseccomp through ``ctypes`` costs about 3 ms at start-up, while the
program is ~100 instructions we can emit and test directly.
"""

from __future__ import annotations

import os
import struct

from sandhold._record import record
from sandhold.errors import UnenforceablePolicy
from sandhold.policy.syscalls import ALLOW, FOREIGN_ABI, KILL_PROCESS, USER_NOTIF, validate

TYPE_CHECKING = False  # typing costs ~3 ms at start-up; mypy honours this name
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sandhold.policy.syscalls import Rule

_BACKEND = "native"
_RULE = "seccomp syscall filter"

# include/uapi/linux/filter.h, bpf_common.h: the opcodes this module emits.
BPF_LD_W_ABS = 0x20  # A = *(u32 *)(data + k)
BPF_ALU_AND_K = 0x54  # A &= k
BPF_JMP_JEQ_K = 0x15  # pc += (A == k) ? jt : jf
BPF_JMP_JGE_K = 0x35  # pc += (A >= k) ? jt : jf
BPF_RET_K = 0x06  # return k
BPF_MAXINSNS = 4096

# include/uapi/linux/seccomp.h
SECCOMP_RET_KILL_PROCESS = 0x8000_0000
SECCOMP_RET_ERRNO = 0x0005_0000
SECCOMP_RET_ALLOW = 0x7FFF_0000
SECCOMP_RET_USER_NOTIF = 0x7FC0_0000

# struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; }
OFFSET_NR = 0
OFFSET_ARCH = 4
OFFSET_ARGS = 16

# include/uapi/linux/audit.h: EM_* | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
AUDIT_ARCH_X86_64 = 0xC000_003E
AUDIT_ARCH_AARCH64 = 0xC000_00B7
X32_SYSCALL_BIT = 0x4000_0000

# errno numbers of the generic table (include/uapi/asm-generic/errno*.h), shared by
# x86_64 and arm64; the host's ``errno`` module is not consulted so the program is
# the same wherever it is built.
_ERRNO = {"EPERM": 1, "ENOSYS": 38, "EOPNOTSUPP": 95}

_INSN = struct.Struct("<HBBI")  # struct sock_filter, little-endian like both targets

# arch/x86/entry/syscalls/syscall_64.tbl (checked against asm/unistd_64.h)
_X86_64 = {
    "ioctl": 16,
    "fcntl": 72,
    "chmod": 90,
    "fchmod": 91,
    "setpriority": 141,
    "ioprio_set": 251,
    "fchmodat": 268,
    "prlimit64": 302,
    "socket": 41,
    "socketpair": 53,
    "clone": 56,
    "syslog": 103,
    "vhangup": 153,
    "pivot_root": 155,
    "chroot": 161,
    "acct": 163,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "lookup_dcookie": 212,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "open_by_handle_at": 304,
    "setns": 308,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "mount_setattr": 442,
    "fchmodat2": 452,
    "open_tree_attr": 467,
    "setxattr": 188,
    "lsetxattr": 189,
    "fsetxattr": 190,
    "removexattr": 197,
    "lremovexattr": 198,
    "fremovexattr": 199,
    "setxattrat": 463,
    "removexattrat": 466,
}

# include/uapi/asm-generic/unistd.h (arm64 uses the generic table)
_AARCH64 = {
    "lookup_dcookie": 18,
    "fcntl": 25,
    "ioctl": 29,
    "ioprio_set": 30,
    "fchmod": 52,
    "fchmodat": 53,
    "umount2": 39,
    "mount": 40,
    "pivot_root": 41,
    "chroot": 51,
    "vhangup": 58,
    "quotactl": 60,
    "acct": 89,
    "unshare": 97,
    "kexec_load": 104,
    "init_module": 105,
    "delete_module": 106,
    "syslog": 116,
    "setpriority": 140,
    "reboot": 142,
    "prlimit64": 261,
    "socket": 198,
    "socketpair": 199,
    "add_key": 217,
    "request_key": 218,
    "keyctl": 219,
    "clone": 220,
    "swapon": 224,
    "swapoff": 225,
    "perf_event_open": 241,
    "open_by_handle_at": 265,
    "setns": 268,
    "finit_module": 273,
    "bpf": 280,
    "userfaultfd": 282,
    "kexec_file_load": 294,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "mount_setattr": 442,
    "fchmodat2": 452,
    "open_tree_attr": 467,
    "setxattr": 5,
    "lsetxattr": 6,
    "fsetxattr": 7,
    "removexattr": 14,
    "lremovexattr": 15,
    "fremovexattr": 16,
    "setxattrat": 463,
    "removexattrat": 466,
}


# The calls the creation-time supervisor traps (``policy.syscalls.CREATION_RULES``),
# kept apart from the base tables above so those stay exactly the base rules' calls.
_X86_64_CREATION = {
    "open": 2,
    "connect": 42,
    "bind": 49,
    "rename": 82,
    "mkdir": 83,
    "creat": 85,
    "link": 86,
    "symlink": 88,
    "umask": 95,
    "mknod": 133,
    "seccomp": 317,
    "openat": 257,
    "mkdirat": 258,
    "mknodat": 259,
    "renameat": 264,
    "linkat": 265,
    "symlinkat": 266,
    "renameat2": 316,
    "openat2": 437,
}

_AARCH64_CREATION = {
    "mknodat": 33,
    "mkdirat": 34,
    "symlinkat": 36,
    "linkat": 37,
    "openat": 56,
    "umask": 166,
    "bind": 200,
    "seccomp": 277,
    "connect": 203,
    "renameat2": 276,
    "openat2": 437,
}

# Legacy calls arm64 never had (asm-generic/unistd.h without __ARCH_WANT_RENAMEAT etc.).
_AARCH64_ABSENT = frozenset(
    {"open", "creat", "mkdir", "mknod", "rename", "renameat", "link", "symlink", "chmod"}
)


@record
class _Arch:
    audit_arch: int
    reject_x32: bool
    numbers: Mapping[str, int]
    creation_numbers: Mapping[str, int] | None = None
    absent: frozenset[str] = frozenset()


ARCHES: dict[str, _Arch] = {
    "x86_64": _Arch(AUDIT_ARCH_X86_64, True, _X86_64, _X86_64_CREATION),
    "aarch64": _Arch(AUDIT_ARCH_AARCH64, False, _AARCH64, _AARCH64_CREATION, _AARCH64_ABSENT),
}

_MACHINES = {"x86_64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def native_arch() -> str:
    """The seccomp architecture name of this kernel (``"x86_64"`` or ``"aarch64"``).

    Raises:
        UnenforceablePolicy: the machine has no syscall table here; launching
            without the filter would weaken the policy, so the launch is refused.
    """
    machine = os.uname().machine
    arch = _MACHINES.get(machine)
    if arch is None:
        raise UnenforceablePolicy(
            _RULE,
            _BACKEND,
            f"no syscall table for machine {machine!r} (supported: {', '.join(ARCHES)})",
        )
    return arch


def _insn(code: int, k: int = 0, jt: int = 0, jf: int = 0) -> tuple[int, int, int, int]:
    return (code, jt, jf, k)


def _action(action: str) -> int:
    if action == ALLOW:
        return SECCOMP_RET_ALLOW
    if action == KILL_PROCESS:
        return SECCOMP_RET_KILL_PROCESS
    if action == USER_NOTIF:
        return SECCOMP_RET_USER_NOTIF
    return SECCOMP_RET_ERRNO | _ERRNO[action]


def _syscall_block(rules: Sequence[Rule]) -> list[tuple[int, int, int, int]]:
    """The instructions for one syscall's rules; every path ends in a return."""
    block: list[tuple[int, int, int, int]] = []
    for rule in rules:
        ret = _insn(BPF_RET_K, _action(rule.action))
        test = rule.when
        if test is None:
            block.append(ret)
            return block  # validate() refused any rule after this one
        block.append(_insn(BPF_LD_W_ABS, OFFSET_ARGS + 8 * test.index))
        if test.mask != 0xFFFF_FFFF:
            block.append(_insn(BPF_ALU_AND_K, test.mask))
        if test.comparison == "eq":
            block.append(_insn(BPF_JMP_JEQ_K, test.value, jt=0, jf=1))
        else:
            block.append(_insn(BPF_JMP_JEQ_K, test.value, jt=1, jf=0))
        block.append(ret)
    block.append(_insn(BPF_RET_K, SECCOMP_RET_ALLOW))
    return block


def build_program(rules: Sequence[Rule], arch: str) -> bytes:
    """Compile ``rules`` for ``arch`` into the bytes ``bwrap --seccomp FD`` expects.

    Args:
        rules: from ``sandhold.policy.syscalls.syscall_rules``; must hold exactly one
            ``FOREIGN_ABI`` rule.
        arch: ``"x86_64"`` or ``"aarch64"`` (see ``native_arch``).

    Returns:
        ``struct sock_filter[]``: 8 bytes per instruction, little-endian.

    Raises:
        UnenforceablePolicy: unknown arch, a syscall or action this module has no
            number for, or rules ``validate`` refuses. Nothing is ever left out.
    """
    table = ARCHES.get(arch)
    if table is None:
        raise UnenforceablePolicy(
            _RULE, _BACKEND, f"no syscall table for {arch!r} (supported: {', '.join(ARCHES)})"
        )
    try:
        validate(tuple(rules))
    except ValueError as exc:
        raise UnenforceablePolicy(_RULE, _BACKEND, str(exc)) from exc

    foreign = 0
    by_nr: dict[int, list[Rule]] = {}
    for rule in rules:
        if rule.action not in (ALLOW, KILL_PROCESS, USER_NOTIF) and rule.action not in _ERRNO:
            raise UnenforceablePolicy(rule.describe(), _BACKEND, "no errno number for it")
        if rule.syscall == FOREIGN_ABI:
            foreign = _action(rule.action)
            continue
        nr = table.numbers.get(rule.syscall)
        if nr is None and table.creation_numbers is not None:
            nr = table.creation_numbers.get(rule.syscall)
        if nr is None and rule.syscall in table.absent:
            continue  # the architecture has no such call: nothing can make it
        if nr is None:
            raise UnenforceablePolicy(
                rule.describe(), _BACKEND, f"no {arch} syscall number for {rule.syscall!r}"
            )
        by_nr.setdefault(nr, []).append(rule)

    prog = [
        _insn(BPF_LD_W_ABS, OFFSET_ARCH),
        _insn(BPF_JMP_JEQ_K, table.audit_arch, jt=1, jf=0),
        _insn(BPF_RET_K, foreign),
        _insn(BPF_LD_W_ABS, OFFSET_NR),
    ]
    if table.reject_x32:
        prog += [
            _insn(BPF_JMP_JGE_K, X32_SYSCALL_BIT, jt=0, jf=2),
            _insn(BPF_JMP_JEQ_K, 0xFFFF_FFFF, jt=1, jf=0),
            _insn(BPF_RET_K, foreign),
        ]
    for nr, group in by_nr.items():
        block = _syscall_block(group)
        if len(block) > 255:  # jf is a u8
            raise UnenforceablePolicy(_RULE, _BACKEND, f"too many rules for syscall {nr}")
        prog.append(_insn(BPF_JMP_JEQ_K, nr, jt=0, jf=len(block)))
        prog += block
    prog.append(_insn(BPF_RET_K, SECCOMP_RET_ALLOW))
    if len(prog) > BPF_MAXINSNS:
        raise UnenforceablePolicy(_RULE, _BACKEND, f"program too long ({len(prog)} insns)")
    return b"".join(_INSN.pack(*insn) for insn in prog)
