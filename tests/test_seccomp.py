"""The seccomp layer: the rule table, its BPF compilation, and the filter in real sandboxes.

Pure tests run the compiled program in a small classic-BPF interpreter (only the
opcodes ``seccomp.py`` emits) against ``seccomp_data`` rows, for both arches.
Sandbox tests load the program with ``bwrap --seccomp FD`` as root and as an
unprivileged user, and probe with real syscalls; most probes also run without
the filter, to show it is the filter (not dropped capabilities) that refuses.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import Identity
from sandhold.backends.linux import seccomp
from sandhold.errors import UnenforceablePolicy
from sandhold.policy import syscalls
from sandhold.policy.syscalls import (
    BTRFS_NAME_IOCTLS,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWTIME,
    CLONE_NEWUSER,
    F_SETLEASE,
    FOREIGN_ABI,
    FS_IOC_SETFLAGS,
    TIOCLINUX,
    TIOCSTI,
    ArgTest,
    Rule,
    syscall_rules,
    validate,
)

ARCHES = ("x86_64", "aarch64")
HIGH = 1 << 32
SIGCHLD = 17
THREAD_FLAGS = 0x003D0F00  # glibc pthread_create: VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|...
AF_INET = 2
TCGETS = 0x5401
AUDIT_ARCH_I386 = 0x4000_0003
AUDIT_ARCH_ARM = 0x4000_0028

# Calls the rules do not name, for "still allowed" rows.
EXTRA_NUMBERS = {
    "x86_64": {"read": 0, "write": 1, "openat": 257, "execve": 59, "getpid": 39},
    "aarch64": {"read": 63, "write": 64, "openat": 56, "execve": 221, "getpid": 172},
}

UNCONDITIONAL_EPERM = (
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "open_tree_attr",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "setns",
    "chroot",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "quotactl",
    "lookup_dcookie",
    "vhangup",
)


# --- a classic-BPF interpreter, just the opcodes seccomp.py emits ----------------


def _insns(program: bytes) -> list[tuple[int, int, int, int]]:
    assert program and len(program) % 8 == 0
    insns = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    assert len(insns) <= seccomp.BPF_MAXINSNS
    return insns


def check_like_kernel(program: bytes) -> None:
    """What the kernel's classic-BPF and seccomp checkers demand of a filter."""
    insns = _insns(program)
    assert insns[-1][0] == seccomp.BPF_RET_K, "last instruction must return"
    for pc, (code, jt, jf, k) in enumerate(insns):
        if code == seccomp.BPF_LD_W_ABS:
            assert k % 4 == 0 and k + 4 <= 64, f"pc {pc}: load outside seccomp_data"
        elif code in (seccomp.BPF_JMP_JEQ_K, seccomp.BPF_JMP_JGE_K):
            assert pc + 1 + max(jt, jf) < len(insns), f"pc {pc}: jump out of the program"
        else:
            assert code in (seccomp.BPF_ALU_AND_K, seccomp.BPF_RET_K), f"pc {pc}: {code:#x}"


def run_bpf(program: bytes, nr: int, args: tuple[int, ...] = (), *, arch: int) -> int:
    data = struct.pack(
        "<iIQ6Q", nr, arch, 0x4000_1000, *(a & (2**64 - 1) for a in (*args, 0, 0, 0, 0, 0, 0)[:6])
    )
    insns = _insns(program)
    pc, acc = 0, 0
    for _step in range(len(insns)):  # no backward jumps: each instruction runs at most once
        code, jt, jf, k = insns[pc]
        if code == seccomp.BPF_LD_W_ABS:
            (acc,) = struct.unpack_from("<I", data, k)
        elif code == seccomp.BPF_ALU_AND_K:
            acc &= k
        elif code == seccomp.BPF_JMP_JEQ_K:
            pc += jt if acc == k else jf
        elif code == seccomp.BPF_JMP_JGE_K:
            pc += jt if acc >= k else jf
        elif code == seccomp.BPF_RET_K:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x} at {pc}")
        pc += 1
    raise AssertionError("program ran off its end")


def verdict(ret: int) -> str:
    if ret == seccomp.SECCOMP_RET_ALLOW:
        return "ALLOW"
    if ret == seccomp.SECCOMP_RET_KILL_PROCESS:
        return "KILL"
    assert ret & 0xFFFF_0000 == seccomp.SECCOMP_RET_ERRNO, hex(ret)
    return {1: "EPERM", 38: "ENOSYS"}[ret & 0xFFFF]


def decide(
    arch: str,
    call: str | int,
    args: tuple[int, ...] = (),
    *,
    allow_unix: bool = False,
    audit_arch: int | None = None,
) -> str:
    program = seccomp.build_program(syscall_rules(allow_unix_sockets=allow_unix), arch)
    nr = (
        call
        if isinstance(call, int)
        else {**seccomp.ARCHES[arch].numbers, **EXTRA_NUMBERS[arch]}[call]
    )
    audit = seccomp.ARCHES[arch].audit_arch if audit_arch is None else audit_arch
    return verdict(run_bpf(program, nr, args, arch=audit))


# --- pure: the decision table ---------------------------------------------------

# (call, args, allow_unix_sockets, expected)
CASES: list[tuple[str, tuple[int, ...], bool, str]] = [
    *((name, (), False, "EPERM") for name in UNCONDITIONAL_EPERM),
    ("read", (0, 0, 0), False, "ALLOW"),
    ("write", (1, 0, 0), False, "ALLOW"),
    ("openat", (0, 0, 0), False, "ALLOW"),
    ("execve", (0, 0, 0), False, "ALLOW"),
    ("getpid", (), False, "ALLOW"),
    # namespaces
    ("unshare", (CLONE_NEWUSER,), False, "EPERM"),
    ("unshare", (CLONE_NEWNS,), False, "EPERM"),
    ("unshare", (CLONE_NEWTIME,), False, "EPERM"),
    ("unshare", (CLONE_NEWNET | HIGH,), False, "EPERM"),
    ("unshare", (0x400,), False, "ALLOW"),  # CLONE_FILES
    ("unshare", (0,), False, "ALLOW"),
    ("clone", (SIGCHLD, 0, 0, 0, 0), False, "ALLOW"),  # fork
    ("clone", (THREAD_FLAGS, 0, 0, 0, 0), False, "ALLOW"),  # a thread
    ("clone", (0x4111, 0, 0, 0, 0), False, "ALLOW"),  # vfork: VM|VFORK|SIGCHLD
    ("clone", (CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0), False, "EPERM"),
    ("clone", (CLONE_NEWNET | THREAD_FLAGS, 0, 0, 0, 0), False, "EPERM"),
    ("clone", (CLONE_NEWUSER | HIGH, 0, 0, 0, 0), False, "EPERM"),
    ("clone", (HIGH | SIGCHLD, CLONE_NEWUSER, 0, 0, 0), False, "ALLOW"),  # flags are arg0
    ("clone3", (0, 88), False, "ENOSYS"),
    # sockets
    ("socket", (1, 1, 0), False, "EPERM"),  # AF_UNIX, SOCK_STREAM
    ("socket", (1, 0x80805, 0), False, "EPERM"),  # SOCK_SEQPACKET|CLOEXEC|NONBLOCK
    ("socket", (1 | HIGH, 1, 0), False, "EPERM"),  # the kernel truncates the int
    ("socket", (1, 1, 0), True, "ALLOW"),
    ("socket", (AF_INET, 1, 0), False, "ALLOW"),
    ("socket", (10, 2, 0), False, "ALLOW"),  # AF_INET6
    ("socket", (16, 3, 0), False, "ALLOW"),  # AF_NETLINK
    ("socket", (AF_INET, 1, 1), False, "ALLOW"),  # protocol 1 is not a domain
    ("socketpair", (1, 1, 0, 0), False, "ALLOW"),
    ("socketpair", (1 | HIGH, 1, 0, 0), False, "ALLOW"),  # the kernel reads AF_UNIX
    # families: inet, netlink and unix only, whatever the unix setting
    ("socket", (40, 1, 0), False, "EPERM"),  # AF_VSOCK: the hypervisor, past the netns
    ("socket", (40, 1, 0), True, "EPERM"),
    ("socket", (40 | HIGH, 1, 0), False, "EPERM"),
    ("socket", (AF_INET | HIGH, 1, 0), False, "ALLOW"),  # the kernel reads AF_INET
    ("socket", (17, 3, 0), True, "EPERM"),  # AF_PACKET
    ("socket", (31, 5, 0), True, "EPERM"),  # AF_BLUETOOTH
    ("socket", (38, 5, 0), True, "EPERM"),  # AF_ALG
    ("socket", (44, 3, 0), True, "EPERM"),  # AF_XDP
    ("socket", (0, 1, 0), True, "EPERM"),  # AF_UNSPEC
    ("socketpair", (40, 1, 0, 0), True, "EPERM"),
    ("socketpair", (30, 5, 0, 0), True, "EPERM"),  # AF_TIPC makes pairs
    # ioctl: the request is an unsigned int, only its low 32 bits count
    ("ioctl", (0, TIOCSTI, 0), False, "EPERM"),
    ("ioctl", (0, TIOCSTI | HIGH, 0), False, "EPERM"),
    ("ioctl", (0, TIOCSTI | 0xFFFF_FFFF_0000_0000, 0), False, "EPERM"),
    ("ioctl", (0, TIOCLINUX, 0), False, "EPERM"),
    ("ioctl", (0, TIOCLINUX | HIGH, 0), False, "EPERM"),
    ("ioctl", (0, TCGETS, 0), False, "ALLOW"),
    ("ioctl", (TIOCSTI, TCGETS, TIOCSTI), False, "ALLOW"),  # request is arg1 only
    ("ioctl", (0, TIOCSTI + 1, 0), False, "ALLOW"),
    # btrfs subvolumes and snapshots are names made behind the supervisor's back
    *(("ioctl", (3, request, 0), False, "EPERM") for request in BTRFS_NAME_IOCTLS),
    *(("ioctl", (3, request | HIGH, 0), True, "EPERM") for request in BTRFS_NAME_IOCTLS),
    ("ioctl", (3, 0x50009402, 0), False, "ALLOW"),  # BTRFS_IOC_DEFRAG
    ("ioctl", (3, 0x4004_9409, 0), False, "ALLOW"),  # FICLONE: no new name
    # file flags: chattr +F would make a directory case-insensitive
    ("ioctl", (3, FS_IOC_SETFLAGS, 0), False, "EPERM"),
    ("ioctl", (3, FS_IOC_SETFLAGS | HIGH, 0), True, "EPERM"),
    ("ioctl", (3, 0x8008_6601, 0), False, "ALLOW"),  # FS_IOC_GETFLAGS: lsattr reads
    # leases stall other openers; other fcntl commands go through
    ("fcntl", (3, F_SETLEASE, 0), False, "EPERM"),
    ("fcntl", (3, F_SETLEASE | HIGH, 0), True, "EPERM"),
    ("fcntl", (3, 3, 0), False, "ALLOW"),  # F_GETFL
    ("fcntl", (3, 1025, 0), False, "ALLOW"),  # F_GETLEASE
    # socket pairs: a datagram pair's sendto names any socket path
    ("socketpair", (1, 2, 0, 0), False, "EPERM"),  # SOCK_DGRAM
    ("socketpair", (1, 2 | 0x80000, 0, 0), False, "EPERM"),  # | SOCK_CLOEXEC
    ("socketpair", (1, 2 | HIGH, 0, 0), False, "EPERM"),
    ("socketpair", (1, 2, 0, 0), True, "ALLOW"),  # every unix socket is allowed anyway
    ("socketpair", (1, 5, 0, 0), False, "ALLOW"),  # SOCK_SEQPACKET ignores an address
    ("socketpair", (1, 1 | 0x80800, 0, 0), False, "ALLOW"),  # STREAM|CLOEXEC|NONBLOCK
    ("socketpair", (1, 3, 0, 0), False, "EPERM"),  # SOCK_RAW
]


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize(("call", "args", "allow_unix", "expected"), CASES)
def test_decision_table(
    arch: str, call: str, args: tuple[int, ...], allow_unix: bool, expected: str
) -> None:
    assert decide(arch, call, args, allow_unix=allow_unix) == expected


# (arch, audit arch or None for native, nr, expected)
FOREIGN_CASES: list[tuple[str, int | None, int, str]] = [
    ("x86_64", AUDIT_ARCH_I386, 21, "KILL"),  # i386 mount
    ("x86_64", AUDIT_ARCH_I386, 20, "KILL"),  # i386 getpid: every call, harmless or not
    ("x86_64", seccomp.AUDIT_ARCH_AARCH64, 40, "KILL"),
    ("x86_64", None, 0x4000_0000 | 165, "KILL"),  # x32 mount
    ("x86_64", None, 0x4000_0000 | 39, "KILL"),  # x32 getpid
    ("x86_64", None, 0x4000_0000, "KILL"),
    ("x86_64", None, 0x7FFF_FFFF, "KILL"),
    ("x86_64", None, -1, "ALLOW"),  # no syscall at all; the kernel answers ENOSYS
    ("x86_64", None, 0x3FFF_FFFF, "ALLOW"),  # not a syscall either, not x32
    ("aarch64", AUDIT_ARCH_ARM, 21, "KILL"),  # AArch32 compat
    ("aarch64", seccomp.AUDIT_ARCH_X86_64, 165, "KILL"),
    ("aarch64", None, 0x4000_0000 | 40, "ALLOW"),  # no x32 on arm64: an unknown number
    ("aarch64", None, -1, "ALLOW"),
]


@pytest.mark.parametrize(("arch", "audit", "nr", "expected"), FOREIGN_CASES)
def test_foreign_abi(arch: str, audit: int | None, nr: int, expected: str) -> None:
    assert decide(arch, nr, (), audit_arch=audit) == expected


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("allow_unix", [False, True])
def test_program_passes_the_kernel_checks(arch: str, allow_unix: bool) -> None:
    check_like_kernel(seccomp.build_program(syscall_rules(allow_unix_sockets=allow_unix), arch))


_ARG_TESTED = ("unshare", "clone", "socket", "ioctl")
_u64 = st.integers(min_value=0, max_value=2**64 - 1)


@pytest.mark.parametrize("arch", ARCHES)
@given(
    call=st.sampled_from(_ARG_TESTED),
    args=st.tuples(_u64, _u64, _u64),
    high=st.tuples(_u64, _u64, _u64),
)
def test_high_bits_never_change_a_decision(
    arch: str, call: str, args: tuple[int, ...], high: tuple[int, ...]
) -> None:
    low = tuple(a & 0xFFFF_FFFF for a in args)
    noisy = tuple(lo | (h << 32 & (2**64 - 1)) for lo, h in zip(low, high, strict=True))
    assert decide(arch, call, noisy) == decide(arch, call, low)


@pytest.mark.parametrize("arch", ARCHES)
@given(nr=st.integers(min_value=0, max_value=0x3FFF_FFFF), args=st.tuples(_u64, _u64))
def test_unnamed_syscalls_are_allowed(arch: str, nr: int, args: tuple[int, ...]) -> None:
    named = set(seccomp.ARCHES[arch].numbers.values())
    if nr not in named:
        assert decide(arch, nr, args) == "ALLOW"


# --- pure: the rule table itself ------------------------------------------------


def test_rule_table_shape() -> None:
    closed = syscall_rules(allow_unix_sockets=False)
    opened = syscall_rules(allow_unix_sockets=True)
    assert closed[0].syscall == FOREIGN_ABI and closed[0].action == syscalls.KILL_PROCESS
    # closed: unix sockets refused, and socket pairs of the kinds that take no address only
    assert [(r.syscall, r.action, r.when) for r in closed if r not in opened] == [
        ("socketpair", "ALLOW", ArgTest(1, 0xF, 1)),
        ("socketpair", "ALLOW", ArgTest(1, 0xF, 5)),
        ("socketpair", "EPERM", None),
        ("socket", "EPERM", None),
    ]
    # the families allowed are the same either way: inet, netlink, then unix
    assert [r.when for r in opened if r.action == "ALLOW"] == [
        ArgTest(0, 0xFFFF_FFFF, family) for family in (2, 10, 16)
    ]
    assert {r.syscall for r in closed if r.action == "EPERM"} >= {"socket", "socketpair"}
    for rules in (closed, opened):
        validate(rules)
        assert all(r.why and r.action in syscalls.ACTIONS for r in rules)


def test_describe_is_one_readable_line() -> None:
    lines = [r.describe() for r in syscall_rules(allow_unix_sockets=False)]
    assert "mount -> EPERM: " + syscall_rules(allow_unix_sockets=False)[1].why in lines
    assert any(line.startswith("ioctl(arg1 == 0x5412) -> EPERM: ") for line in lines)
    assert any(line.startswith("clone(arg0 & 0x7e020080 != 0x0) -> EPERM") for line in lines)
    assert lines[0].startswith("any syscall from a non-native ABI -> KILL_PROCESS: ")


_FOREIGN = Rule(FOREIGN_ABI, "KILL_PROCESS", "w")
BAD_RULES: list[tuple[tuple[Rule, ...], str]] = [
    ((Rule("mount", "EPERM", "w"),), "exactly one foreign-ABI rule"),
    ((_FOREIGN, _FOREIGN), "exactly one foreign-ABI rule"),
    ((_FOREIGN, Rule("mount", "EPERM", "w"), Rule("mount", "ENOSYS", "w")), "unreachable"),
    (
        (_FOREIGN, Rule("ioctl", "EPERM", "w"), Rule("ioctl", "EPERM", "w", ArgTest(1, 1, 1))),
        "unreachable",
    ),
    ((_FOREIGN, Rule("mount", "EACCES", "w")), "unknown action"),
    ((_FOREIGN, Rule("ioctl", "EPERM", "w", ArgTest(6, 1, 1))), "index must be 0-5"),
    ((_FOREIGN, Rule("ioctl", "EPERM", "w", ArgTest(1, HIGH, 0))), "fit in 32 bits"),
    ((_FOREIGN, Rule("ioctl", "EPERM", "w", ArgTest(1, 0xFF, 0x100))), "outside the mask"),
    (
        (_FOREIGN, Rule("ioctl", "EPERM", "w", ArgTest(1, 1, 1, "lt"))),  # type: ignore[arg-type]
        "unknown comparison",
    ),
    ((Rule(FOREIGN_ABI, "KILL_PROCESS", "w", ArgTest(0, 1, 1)),), "takes no argument test"),
]


@pytest.mark.parametrize(("rules", "message"), BAD_RULES)
def test_bad_rules_are_refused(rules: tuple[Rule, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate(rules)
    with pytest.raises(UnenforceablePolicy, match=message) as info:
        seccomp.build_program(rules, "x86_64")
    assert isinstance(info.value.__cause__, ValueError)


def test_first_matching_rule_wins() -> None:
    rules = (
        _FOREIGN,
        Rule("ioctl", "ENOSYS", "w", ArgTest(1, 0xFF, 0x12)),
        Rule("ioctl", "EPERM", "w", ArgTest(1, 0xFF00, 0x5400)),
    )
    program = seccomp.build_program(rules, "x86_64")
    check_like_kernel(program)
    audit = seccomp.AUDIT_ARCH_X86_64
    assert verdict(run_bpf(program, 16, (0, 0x5412), arch=audit)) == "ENOSYS"
    assert verdict(run_bpf(program, 16, (0, 0x5401), arch=audit)) == "EPERM"
    assert verdict(run_bpf(program, 16, (0, 0x1112), arch=audit)) == "ENOSYS"
    assert verdict(run_bpf(program, 16, (0, 0x1111), arch=audit)) == "ALLOW"


def test_unknown_arch_and_syscall_fail_loudly() -> None:
    with pytest.raises(UnenforceablePolicy, match="no syscall table for 'riscv64'"):
        seccomp.build_program(syscall_rules(allow_unix_sockets=False), "riscv64")
    with pytest.raises(UnenforceablePolicy, match="no x86_64 syscall number for 'uselib'"):
        seccomp.build_program((_FOREIGN, Rule("uselib", "EPERM", "w")), "x86_64")


@pytest.mark.parametrize(
    ("machine", "expected"), [("x86_64", "x86_64"), ("aarch64", "aarch64"), ("arm64", "aarch64")]
)
def test_native_arch(monkeypatch: pytest.MonkeyPatch, machine: str, expected: str) -> None:
    real = os.uname()
    fake = os.uname_result((*real[:4], machine))
    monkeypatch.setattr(os, "uname", lambda: fake)
    assert seccomp.native_arch() == expected


@pytest.mark.parametrize("machine", ["i686", "armv7l", "riscv64", "ppc64le", "s390x"])
def test_native_arch_refuses_unknown_machines(
    monkeypatch: pytest.MonkeyPatch, machine: str
) -> None:
    fake = os.uname_result((*os.uname()[:4], machine))
    monkeypatch.setattr(os, "uname", lambda: fake)
    with pytest.raises(UnenforceablePolicy, match=f"no syscall table for machine '{machine}'"):
        seccomp.native_arch()


def test_every_named_syscall_has_a_number_on_every_arch() -> None:
    names = {r.syscall for r in syscall_rules(allow_unix_sockets=False)} - {FOREIGN_ABI}
    for arch in ARCHES:
        numbers = seccomp.ARCHES[arch].numbers
        absent = seccomp.ARCHES[arch].absent  # legacy calls the arch never had
        assert (names | {"socketpair"}) - absent == set(numbers), arch
        assert len(set(numbers.values())) == len(numbers), f"{arch}: duplicate numbers"


_HEADERS = {
    "x86_64": ("/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "/usr/include/asm/unistd_64.h"),
    "aarch64": ("/usr/include/asm-generic/unistd.h",),
}


@pytest.mark.parametrize("arch", ARCHES)
def test_numbers_match_the_kernel_headers(arch: str) -> None:
    header = next((h for h in _HEADERS[arch] if os.path.exists(h)), None)
    if header is None:
        pytest.skip(f"no kernel header for {arch} here (install linux-libc-dev)")
    defined: dict[str, int] = {}
    for line in Path(header).read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "#define" and parts[2].isdigit():
            for prefix in ("__NR_", "__NR3264_"):
                if parts[1].startswith(prefix):
                    defined[parts[1].removeprefix(prefix)] = int(parts[2])
    defined.update(NEWER_THAN_THE_HEADERS)
    assert {n: defined.get(n) for n in seccomp.ARCHES[arch].numbers} == seccomp.ARCHES[arch].numbers


# Calls newer than Debian 12's linux-libc-dev (6.1); one number on every architecture
# since 6.11's unified table. The probes below show the kernel here has them.
NEWER_THAN_THE_HEADERS = {
    "fchmodat2": 452,
    "open_tree_attr": 467,
    "setxattrat": 463,
    "removexattrat": 466,
}


def test_import_stays_cheap() -> None:
    code = (
        "import sys, sandhold.backends.linux.seccomp; "
        "print(sorted({'ctypes', 'typing', 'dataclasses', 'inspect'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(seccomp.__file__).parents[3])},
    )
    assert out.stdout.strip() == "[]"


# --- real sandboxes -------------------------------------------------------------

NATIVE = seccomp.native_arch() if sys.platform == "linux" else "x86_64"

PRELUDE = textwrap.dedent(f"""\
    import ctypes, errno, fcntl, os, socket, subprocess, sys, termios
    NR = {seccomp.ARCHES[NATIVE].numbers!r}
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long

    def sc(nr, *args):
        nr = NR[nr] if isinstance(nr, str) else nr
        ctypes.set_errno(0)
        r = libc.syscall(ctypes.c_long(nr), *(ctypes.c_ulong(a % 2**64) for a in args))
        if r == -1:
            return errno.errorcode[ctypes.get_errno()]
        return "ok"

    def py(f):
        try:
            f()
            return "ok"
        except OSError as e:
            return errno.errorcode[e.errno]

    def with_ctty(f):
        # TIOCSTI needs the pty to be the caller's controlling terminal, or the kernel
        # refuses it on its own; so run f in a new session that owns the pty.
        master, slave = os.openpty()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
            os.write(w, f(slave).encode())
            os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        return os.read(r, 100).decode()

    def new_file():
        # a file of the caller's own where it may write (bwrap's /dev is a tmpfs)
        with open('/dev/shm/f', 'w'):
            return '/dev/shm/f'

    def run(argv):
        p = subprocess.run(argv, capture_output=True, text=True)
        return p.stdout.strip() if p.returncode == 0 else "exit %d: %s" % (p.returncode,
            p.stderr.strip().rsplit(": ", 1)[-1])
    """)

TIOCSTI_PY = "lambda fd: py(lambda: fcntl.ioctl(fd, termios.TIOCSTI, b'x'))"
TIOCSTI_HIGH = (
    "lambda fd: sc('ioctl', fd, termios.TIOCSTI | 1 << 32, "
    "ctypes.addressof(ctypes.create_string_buffer(b'x')))"
)
CLONE_NEWUSER_RAW = (  # a raw clone that succeeded would return twice: end the child
    f"(lambda r: os._exit(0) if r == 'ok' and os.getpid() != PID else r)"
    f"(sc('clone', {CLONE_NEWUSER | SIGCHLD}, 0, 0, 0, 0))"
)

OPEN_TREE_ATTR = (  # the lambda keeps the path buffer alive through the call
    "(lambda b: sc('open_tree_attr', -100, ctypes.addressof(b), 0, 0, 0))"
    "(ctypes.create_string_buffer(b'/'))"
)
FCHMODAT = (  # fchmodat(AT_FDCWD, new file, mode[, flags])
    "(lambda b: sc('{nr}', -100, ctypes.addressof(b), {mode}, 0))"
    "(ctypes.create_string_buffer(new_file().encode()))"
)
LIMIT = "ctypes.addressof(ctypes.create_string_buffer(16))"  # a struct rlimit64 to read into
CWD_FD = "os.open('.', os.O_RDONLY)"
OWN_FILE = "os.open('own', os.O_RDONLY)"  # made by the workdir fixture
VSOCK = "socket.AF_VSOCK, socket.SOCK_STREAM"
NETLINK_ROUTE = "socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE"

# (id, expression printed inside the sandbox, allow_unix_sockets, with filter, without)
# "without" is None where the kernel's answer without the filter is not worth pinning.
PROBES: list[tuple[str, str, bool, str, str | None]] = [
    ("mount", "sc('mount', 1, 1, 1, 0, 0)", False, "EPERM", "EFAULT"),
    ("umount2", "sc('umount2', 1, 0)", False, "EPERM", "EFAULT"),
    ("fsopen", "sc('fsopen', 1, 0)", False, "EPERM", None),  # caps first
    ("unshare_newuser", f"sc('unshare', {CLONE_NEWUSER})", False, "EPERM", "ENOSPC"),
    (
        "unshare_cmd",
        "run(['unshare', '-r', 'true'])",
        False,
        "exit 1: Operation not permitted",
        "exit 1: No space left on device",
    ),
    ("clone_newuser", CLONE_NEWUSER_RAW, False, "EPERM", "ENOSPC"),
    ("clone3", "sc('clone3', 0, 0)", False, "ENOSYS", "EINVAL"),
    ("unix_socket", "py(lambda: socket.socket(socket.AF_UNIX).close())", False, "EPERM", "ok"),
    ("unix_socket_high", f"sc('socket', 1 | {HIGH}, 1, 0)", False, "EPERM", "ok"),
    ("unix_socket_allowed", "py(lambda: socket.socket(socket.AF_UNIX).close())", True, "ok", "ok"),
    ("inet_socket", "py(lambda: socket.socket(socket.AF_INET).close())", False, "ok", "ok"),
    ("inet6_socket", "py(lambda: socket.socket(socket.AF_INET6).close())", False, "ok", "ok"),
    ("netlink", f"py(lambda: socket.socket({NETLINK_ROUTE}).close())", True, "ok", "ok"),
    ("vsock", f"py(lambda: socket.socket({VSOCK}).close())", False, "EPERM", None),
    ("vsock_unix_allowed", f"py(lambda: socket.socket({VSOCK}).close())", True, "EPERM", None),
    (
        "socketpair",
        "py(lambda: [s.close() for s in socket.socketpair(socket.AF_UNIX)])",
        False,
        "ok",
        "ok",
    ),
    ("io_uring_setup", "sc('io_uring_setup', 1, 0)", False, "EPERM", "EFAULT"),
    ("open_tree_attr", OPEN_TREE_ATTR, False, "EPERM", "ok"),
    (
        "socketpair_dgram",
        "py(lambda: [s.close() for s in socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)])",
        False,
        "EPERM",
        "ok",
    ),
    (
        "socketpair_seqpacket",
        "py(lambda: [s.close() for s in socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)])",
        False,
        "ok",
        "ok",
    ),
    ("btrfs_snap_create_v2", f"sc('ioctl', {CWD_FD}, 0x50009417, 0)", False, "EPERM", "ENOTTY"),
    ("btrfs_subvol_create", f"sc('ioctl', {CWD_FD}, 0x5000940E, 0)", True, "EPERM", "ENOTTY"),
    ("fs_ioc_setflags", f"sc('ioctl', {CWD_FD}, {FS_IOC_SETFLAGS}, 0)", False, "EPERM", "EFAULT"),
    # the 32-bit twin means nothing to a 64-bit caller (translated for compat callers only)
    ("fs_ioc32_setflags", f"sc('ioctl', {CWD_FD}, 0x40046602, 0)", False, "ENOTTY", "ENOTTY"),
    ("kdskbmode", f"sc('ioctl', {CWD_FD}, 0x4B45, 0)", False, "EPERM", "ENOTTY"),
    ("vt_activate", f"sc('ioctl', {CWD_FD}, 0x5606, 1)", False, "EPERM", "ENOTTY"),
    ("kd_high_bits", f"sc('ioctl', {CWD_FD}, 0x4B3A | {HIGH}, 0)", False, "EPERM", "ENOTTY"),
    ("lease", f"sc('fcntl', {OWN_FILE}, {F_SETLEASE}, 0)", False, "EPERM", "ok"),  # F_RDLCK
    ("getlease", f"sc('fcntl', {OWN_FILE}, 1025, 0)", False, "ok", "ok"),
    ("tiocsti", f"with_ctty({TIOCSTI_PY})", False, "EPERM", "ok"),
    ("tiocsti_high_bits", f"with_ctty({TIOCSTI_HIGH})", False, "EPERM", "ok"),
    ("chmod_plain", "py(lambda: os.chmod(new_file(), 0o755))", False, "ok", "ok"),
    ("chmod_sticky", "py(lambda: os.chmod(new_file(), 0o1755))", False, "ok", "ok"),
    ("chmod_group_write", "py(lambda: os.chmod(new_file(), 0o775))", False, "EPERM", "ok"),
    ("chmod_world_write", "py(lambda: os.chmod(new_file(), 0o757))", False, "EPERM", "ok"),
    (
        "fchmod_world_write",
        "py(lambda: os.fchmod(os.open(new_file(), os.O_RDONLY), 0o666))",
        False,
        "EPERM",
        "ok",
    ),
    (
        "fchmodat_group_write_high",
        f"{FCHMODAT.format(nr='fchmodat', mode=0o020 | HIGH)}",
        False,
        "EPERM",
        "ok",
    ),
    ("fchmodat2_world", f"{FCHMODAT.format(nr='fchmodat2', mode=0o777)}", False, "EPERM", "ok"),
    (
        "setxattr_acl",
        "py(lambda: os.setxattr(new_file(), 'system.posix_acl_access', b'\\x02\\0\\0\\0'))",
        False,
        "ENOTSUP",  # Python's name for 95, EOPNOTSUPP on Linux
        None,
    ),
    (
        "fsetxattr_user",
        "py(lambda: os.setxattr(os.open(new_file(), os.O_RDONLY), 'user.x', b'1'))",
        False,
        "ENOTSUP",  # Python's name for 95, EOPNOTSUPP on Linux
        None,
    ),
    (
        "removexattr",
        "py(lambda: os.removexattr(new_file(), 'system.posix_acl_access'))",
        False,
        "ENOTSUP",  # Python's name for 95, EOPNOTSUPP on Linux
        None,
    ),
    ("chmod_setuid", "py(lambda: os.chmod(new_file(), 0o4755))", False, "EPERM", "ok"),
    (
        "fchmod_setgid",
        "py(lambda: os.fchmod(os.open(new_file(), os.O_RDONLY), 0o2755))",
        False,
        "EPERM",
        "ok",
    ),
    (
        "fchmodat_setuid_high",
        f"{FCHMODAT.format(nr='fchmodat', mode=0o4755 | HIGH)}",
        False,
        "EPERM",
        "ok",
    ),
    ("fchmodat2_setuid", f"{FCHMODAT.format(nr='fchmodat2', mode=0o4755)}", False, "EPERM", "ok"),
    ("prlimit_self", f"sc('prlimit64', 0, 7, 0, {LIMIT})", False, "ok", "ok"),
    ("prlimit_other", f"sc('prlimit64', 1, 7, 0, {LIMIT})", False, "EPERM", "ok"),
    ("prlimit_other_high", f"sc('prlimit64', 1 | {HIGH}, 7, 0, {LIMIT})", False, "EPERM", "ok"),
    ("setpriority_process", "sc('setpriority', 0, 0, 0)", False, "ok", "ok"),
    # (the group holds the test's own processes too: without the filter, EPERM for
    # those of another user)
    ("setpriority_pgrp", "sc('setpriority', 1, 0, 0)", False, "EPERM", None),  # PRIO_PGRP
    ("setpriority_user", "sc('setpriority', 2, 0, 0)", False, "EPERM", "ok"),  # PRIO_USER
    ("ioprio_set_process", "sc('ioprio_set', 1, 0, 0)", False, "ok", "ok"),
    ("ioprio_set_pgrp", "sc('ioprio_set', 2, 0, 0)", False, "EPERM", None),  # WHO_PGRP
    ("keyctl", "sc('keyctl', 0, -3, 0)", False, "EPERM", None),  # KEYCTL_GET_KEYRING_ID
    ("add_key", "sc('add_key', 1, 1, 0, 0, 0)", False, "EPERM", "EFAULT"),
    (
        "threads",
        "run([sys.executable, '-c', 'import threading; t = threading.Thread("
        'target=print, args=("ok",)); t.start(); t.join()\'])',
        False,
        "ok",
        "ok",
    ),
    (
        "fork",
        "(lambda pid: os._exit(0) if pid == 0 else str(os.waitpid(pid, 0)[1]))(os.fork())",
        False,
        "0",
        "0",
    ),
    ("shell_pipe", "run(['sh', '-c', 'echo ok | cat'])", False, "ok", "ok"),
    ("git", "run(['git', '--version']).split(' ')[0]", False, "git", "git"),
]


@pytest.fixture
def workdir(ident: Identity) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sandhold-seccomp-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    ident.chown(path)
    (path / "own").touch()  # a file of the identity's own, for a lease
    ident.chown(path / "own")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def sandboxed(
    ident: Identity, workdir: Path, code: str, program: bytes | None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code`` in bwrap as ``ident``, with ``program`` on an fd if given."""
    fd = os.memfd_create("sandhold-seccomp")
    try:
        os.write(fd, program or b"")
        os.lseek(fd, 0, os.SEEK_SET)
        argv = [
            "bwrap",
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--cap-drop",
            "ALL",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
        ]
        if program is not None:
            argv += ["--seccomp", str(fd)]
        argv += ["--", ident.python, "-c", code]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(workdir), "LANG": "C.UTF-8"}
        proc = ident.popen(
            argv,
            cwd=workdir,
            env=env,
            pass_fds=(fd,),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(fd)
    return subprocess.CompletedProcess(argv, proc.returncode, out.decode(), err.decode())


def _probe_code(expr: str) -> str:
    return PRELUDE + f"PID = os.getpid()\nprint({expr})\n"


sandbox = pytest.mark.skipif(sys.platform != "linux", reason="bubblewrap is Linux-only")


@sandbox
@pytest.mark.sandbox
@pytest.mark.parametrize(
    ("expr", "allow_unix", "expected"), [pytest.param(e, a, w, id=i) for i, e, a, w, _ in PROBES]
)
def test_filter_in_bwrap(
    ident: Identity, workdir: Path, expr: str, allow_unix: bool, expected: str
) -> None:
    program = seccomp.build_program(syscall_rules(allow_unix_sockets=allow_unix), NATIVE)
    result = sandboxed(ident, workdir, _probe_code(expr), program)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected, result.stderr


@sandbox
@pytest.mark.sandbox
@pytest.mark.parametrize(
    ("expr", "without"),
    [pytest.param(e, wo, id=i) for i, e, _a, _w, wo in PROBES if wo is not None],
)
def test_same_probes_without_the_filter(
    ident: Identity, workdir: Path, expr: str, without: str
) -> None:
    """The control: where the filter says EPERM, the sandbox alone says something else."""
    result = sandboxed(ident, workdir, _probe_code(expr), None)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == without, result.stderr


# Foreign ABIs from inside the sandbox: an i386 ``int $0x80`` and an x32 syscall number.
FOREIGN_PROBE = PRELUDE + textwrap.dedent("""\
    import mmap
    if sys.argv[1] == "i386":
        # mov eax, 20 (i386 getpid); int 0x80; ret
        code = bytes.fromhex("b814000000" "cd80" "c3")
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(code)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
        result = ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
        print("survived", "ok" if result == os.getpid() else result, flush=True)
    else:
        print("survived", sc(0x40000000 | 39), flush=True)  # x32 getpid
    """)


@sandbox
@pytest.mark.sandbox
@pytest.mark.skipif(NATIVE != "x86_64", reason="x86_64 ABIs")
@pytest.mark.parametrize(("abi", "without"), [("i386", "survived ok"), ("x32", None)])
def test_foreign_abi_is_killed(
    ident: Identity, workdir: Path, abi: str, without: str | None
) -> None:
    code = FOREIGN_PROBE.replace("sys.argv[1]", repr(abi))
    program = seccomp.build_program(syscall_rules(allow_unix_sockets=False), NATIVE)
    killed = sandboxed(ident, workdir, code, program)
    assert killed.stdout == "" and killed.returncode == 128 + 31, killed  # SIGSYS
    control = sandboxed(ident, workdir, code, None)
    assert control.returncode == 0, control.stderr
    if without is not None:  # x32: ENOSYS, or "ok" where the kernel has CONFIG_X86_X32_ABI
        assert control.stdout.strip() == without
