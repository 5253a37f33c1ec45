"""The supervisor's seccomp rules and their compilation (pure: no process is filtered).

Checks the USER_NOTIF rows of ``policy.syscalls.creation_rules`` in the small
classic-BPF interpreter of ``test_seccomp`` for both architectures: which calls
reach the supervisor, which go straight through, and that the base rules keep
their meaning when the two tables are combined. Also: syscall numbers against
the kernel headers, and that the bindings stay off the import path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandhold.backends.linux import seccomp
from sandhold.policy.syscalls import (
    CONNECT_RULE,
    CREATION_RULES,
    FOREIGN_ABI,
    USER_NOTIF,
    creation_rules,
    syscall_rules,
    validate,
)
from test_seccomp import _HEADERS, ARCHES, run_bpf

NOTIF = "NOTIF"
O_CREAT = 0o100
O_TMPFILE = 0o20000000 | 0o200000  # x86_64 spelling; arm64 differs only in O_DIRECTORY
O_WRONLY = 1
AT_FDCWD = 2**32 - 100
ALL_CREATION = {r.syscall for r in CREATION_RULES} | {CONNECT_RULE.syscall}


def _verdict(ret: int) -> str:
    if ret == seccomp.SECCOMP_RET_USER_NOTIF:
        return NOTIF
    if ret == seccomp.SECCOMP_RET_ALLOW:
        return "ALLOW"
    if ret == seccomp.SECCOMP_RET_KILL_PROCESS:
        return "KILL"
    return {1: "EPERM", 38: "ENOSYS"}[ret & 0xFFFF]


def _decide(arch: str, call: str, args: tuple[int, ...] = (), *, base: bool = False) -> str:
    rules = creation_rules(syscall_rules(allow_unix_sockets=False) if base else None)
    table = seccomp.ARCHES[arch]
    numbers = {**table.numbers, **(table.creation_numbers or {})}
    program = seccomp.build_program(rules, arch)
    return _verdict(run_bpf(program, numbers[call], args, arch=table.audit_arch))


# (call, args, expected) on x86_64; the *at calls are checked on both arches below
ROWS: list[tuple[str, tuple[int, ...], str]] = [
    ("open", (0, O_WRONLY | O_CREAT, 0o644), NOTIF),
    ("open", (0, O_WRONLY, 0), "ALLOW"),
    ("open", (0, O_WRONLY | O_CREAT | 2**32, 0), NOTIF),  # the kernel truncates to int
    ("open", (0, O_WRONLY | 2**32 | 0o100 << 32, 0), "ALLOW"),  # high bits are no O_CREAT
    ("open", (0, O_TMPFILE | O_WRONLY, 0o600), "ALLOW"),  # no name: linkat names it
    ("openat", (AT_FDCWD, 0, O_CREAT | O_WRONLY, 0o644), NOTIF),
    ("openat", (AT_FDCWD, 0, 0, 0), "ALLOW"),
    ("creat", (0, 0o644), NOTIF),
    ("openat2", (AT_FDCWD, 0, 0, 24), NOTIF),  # flags behind a pointer: always
    *((name, (), NOTIF) for name in ("mkdir", "mkdirat", "mknod", "mknodat", "rename")),
    *((name, (), NOTIF) for name in ("renameat", "renameat2", "link", "linkat", "symlink")),
    ("symlinkat", (), NOTIF),
    ("bind", (3, 0, 110), NOTIF),
    ("umask", (0o022,), NOTIF),
]


@pytest.mark.parametrize(("call", "args", "expected"), ROWS)
@pytest.mark.parametrize("base", [False, True], ids=["standalone", "with-base"])
def test_x86_64_decisions(call: str, args: tuple[int, ...], expected: str, base: bool) -> None:
    assert _decide("x86_64", call, args, base=base) == expected


AT_CALLS = ("openat2", "mkdirat", "mknodat", "renameat2", "linkat", "symlinkat", "bind", "umask")


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("call", AT_CALLS)
def test_every_arch_traps_the_at_calls(arch: str, call: str) -> None:
    assert _decide(arch, call) == NOTIF
    assert _decide(arch, "openat", (AT_FDCWD, 0, O_CREAT, 0)) == NOTIF
    assert _decide(arch, "openat", (AT_FDCWD, 0, 0, 0)) == "ALLOW"


def test_arm64_has_no_legacy_calls_and_skips_their_rules() -> None:
    table = seccomp.ARCHES["aarch64"]
    legacy = {"open", "creat", "mkdir", "mknod", "rename", "renameat", "link", "symlink"}
    assert legacy | {"chmod"} == table.absent  # (chmod: a base rule's call, fchmodat there)
    assert not legacy & set(table.creation_numbers or {})
    assert ALL_CREATION - legacy == set(table.creation_numbers or {})
    assert set(seccomp.ARCHES["x86_64"].creation_numbers or {}) == ALL_CREATION


AF_INET, AF_UNIX, SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET = 2, 1, 1, 2, 5
SOCK_NONBLOCK_CLOEXEC = 0o4000 | 0o2000000


@pytest.mark.parametrize("arch", ARCHES)
def test_unix_sockets_by_path_stream_only_and_every_connect_trapped(arch: str) -> None:
    """F-NET-5: with per-path unix sockets the base filter lets only stream unix sockets be
    made (their one way to a path is connect), and the supervisor's filter traps connect."""
    table = seccomp.ARCHES[arch]
    numbers = {**table.numbers, **(table.creation_numbers or {})}
    base = syscall_rules(allow_unix_sockets=False, supervised_unix_sockets=True)
    program = seccomp.build_program(base, arch)

    def sock(*args: int) -> str:
        return _verdict(run_bpf(program, numbers["socket"], args, arch=table.audit_arch))

    assert sock(AF_INET, SOCK_DGRAM, 0) == "ALLOW"
    assert sock(AF_UNIX, SOCK_STREAM, 0) == "ALLOW"
    assert sock(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK_CLOEXEC, 0) == "ALLOW"
    assert sock(AF_UNIX, SOCK_DGRAM, 0) == "EPERM"
    assert sock(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK_CLOEXEC, 0) == "EPERM"
    assert sock(AF_UNIX | 2**32, SOCK_DGRAM, 0) == "EPERM"  # the kernel reads an int
    assert sock(AF_UNIX, SOCK_DGRAM | SOCK_STREAM << 32, 0) == "EPERM"
    strict = seccomp.build_program(syscall_rules(allow_unix_sockets=False), arch)
    assert _verdict(run_bpf(strict, numbers["socket"], (AF_UNIX, 1, 0), arch=table.audit_arch)) == (
        "EPERM"
    )
    trapping = seccomp.build_program(creation_rules(base, connect=True), arch)
    assert _verdict(run_bpf(trapping, numbers["connect"], (3, 0, 110), arch=table.audit_arch)) == (
        NOTIF
    )
    plain = seccomp.build_program(creation_rules(base), arch)
    assert _verdict(run_bpf(plain, numbers["connect"], (3, 0, 110), arch=table.audit_arch)) == (
        "ALLOW"
    )


@pytest.mark.parametrize("arch", ARCHES)
def test_the_base_rules_keep_their_meaning(arch: str) -> None:
    for call, expected in (("io_uring_setup", "EPERM"), ("open_by_handle_at", "EPERM")):
        assert _decide(arch, call) == expected  # stand-alone: nothing goes around
        assert _decide(arch, call, base=True) == expected
    assert _decide(arch, "mount", base=True) == "EPERM"
    assert _decide(arch, "clone3", base=True) == "ENOSYS"
    foreign = seccomp.build_program(creation_rules(), arch)
    assert _verdict(run_bpf(foreign, 5, (), arch=0x4000_0003)) == "KILL"  # i386 open


@pytest.mark.parametrize("arch", ARCHES)
@given(nr=st.integers(min_value=0, max_value=0x3FFF_FFFF))
def test_nothing_else_reaches_the_supervisor(arch: str, nr: int) -> None:
    table = seccomp.ARCHES[arch]
    program = seccomp.build_program(creation_rules(), arch)
    verdict = _verdict(run_bpf(program, nr, (0, O_CREAT, O_CREAT), arch=table.audit_arch))
    if nr not in (table.creation_numbers or {}).values():
        assert verdict != NOTIF


def test_tables_validate() -> None:
    validate(creation_rules())
    validate(creation_rules(syscall_rules(allow_unix_sockets=True)))
    assert creation_rules()[0].syscall == FOREIGN_ABI
    assert all(r.why for r in CREATION_RULES)
    # besides the trapped calls, only the refusal of a second listener (test_supervisor_takeover)
    assert {r.syscall for r in CREATION_RULES if r.action != USER_NOTIF} == {"seccomp"}


@pytest.mark.parametrize("arch", ARCHES)
def test_creation_numbers_match_the_kernel_headers(arch: str) -> None:
    header = next((h for h in _HEADERS[arch] if os.path.exists(h)), None)
    if header is None:
        pytest.skip(f"no kernel header for {arch} here (install linux-libc-dev)")
    defined: dict[str, int] = {}
    for line in Path(header).read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].startswith("__NR_") and parts[2].isdigit():
            defined[parts[1].removeprefix("__NR_")] = int(parts[2])
    numbers = seccomp.ARCHES[arch].creation_numbers or {}
    assert {n: defined.get(n) for n in numbers} == dict(numbers)


def test_bindings_are_not_imported_by_policy_or_compiler() -> None:
    code = (
        "import sys, sandhold.policy.creation, sandhold.backends.linux.seccomp; "
        "print(sorted({'ctypes', 'fcntl', 'socket', 'select',"
        " 'sandhold.backends.linux.supervisor.notify'}"
        " & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(seccomp.__file__).parents[3])},
    )
    assert out.stdout.strip() == "[]"


def test_notify_loads_ctypes_only_when_used() -> None:
    code = "import sys, sandhold.backends.linux.supervisor.notify; print('ctypes' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(seccomp.__file__).parents[3])},
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, (0, True, False)),  # no Yama: (scope, compiled front, supervisor blocked)
        ("0\n", (0, True, False)),
        ("1\n", (1, False, False)),  # only ancestors: the Python supervisor alone
        ("2\n", (2, False, True)),  # no ordinary process: refused, loudly
        ("x\n", (3, False, True)),  # unreadable: the strictest reading
    ],
)
def test_yama_decides_the_supervisor_layout(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    content: str | None,
    expected: tuple[int, bool, bool],
) -> None:
    """From ptrace_scope 1 on, only an ancestor may read a process's memory: the compiled
    front (no ancestor of what the Python side or the port serves) steps aside; from 2 on
    nothing can, and the supervisor is unavailable with a reason."""
    from sandhold.backends.linux import hostprobe as sc
    from sandhold.backends.linux.supervisor import front as fr

    path = tmp_path / "ptrace_scope"
    if content is not None:
        path.write_text(content)
    monkeypatch.setattr(sc, "YAMA_SCOPE", str(path))
    monkeypatch.delenv("SANDHOLD_EXEC_HELPER", raising=False)
    why = sc.supervisor_blocker()
    got = (sc.yama_ptrace_scope(), fr.compiled_front() is not None, why is not None)
    assert got == expected
    assert why is None or "ptrace_scope" in why
