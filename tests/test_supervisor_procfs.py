"""``backends/linux/procfs``: /proc read in one place, checked against the live system
and against the kernel's own numbers (``os.getppid``, ``threading``)."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from sandhold.backends.linux import procfs

GONE = 2**31 - 1  # above any pid_max: never a process


@pytest.mark.parametrize(
    ("line", "state", "threads"),
    [
        (b"12 (sh) S 1 12 12 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0", "S", 1),
        (b"12 (a) b) (c) R 1 12 12 0 -1 0 0 0 0 0 0 0 0 0 20 0 7 0 99 0", "R", 7),
        (b"12 (x y)) Z 1 12 12 0 -1 0 0 0 0 0 0 0 0 0 20 0 2 0 99 0", "Z", 2),
        (b"", "", 0),
    ],
)
def test_stat_is_split_after_the_last_parenthesis(line: bytes, state: str, threads: int) -> None:
    assert procfs.state_and_threads(line) == (state, threads)


def test_the_live_process_reads_as_the_kernel_says() -> None:
    me = os.getpid()
    assert procfs.ppid(me) == os.getppid()
    assert procfs.state_and_threads(procfs.read_stat(me))[0] in "RS"
    assert procfs.start_time(me) is not None and procfs.start_time(me) == procfs.start_time(me)
    fields = procfs.status_fields(procfs.status(me))
    assert int(fields[b"Tgid"]) == me and fields[b"Umask"].isdigit()
    assert set(procfs.status_fields(procfs.status(me), b"UT")) >= {b"Umask", b"Tgid"}
    assert procfs.nspids(me)[-1] == me
    assert me in procfs.children_by_parent()[os.getppid()]
    assert me in procfs.pids() and procfs.namespace(me) == os.stat("/proc/self/ns/pid").st_ino
    done = threading.Event()
    t = threading.Thread(target=done.wait)
    t.start()
    try:
        assert str(t.native_id) in procfs.tasks(me)
        assert procfs.state_and_threads(procfs.read_stat(me, t.native_id))[0] in "RS"
    finally:
        done.set()
        t.join()
    assert procfs.comm(me) == procfs.read_stat(me).split(b"(", 1)[1].rsplit(b")", 1)[0].decode()


def test_a_gone_process_reads_as_nothing() -> None:
    assert procfs.read_stat(GONE) == b"" and procfs.ppid(GONE) == 0
    assert procfs.start_time(GONE) is None and procfs.nspids(GONE) == []
    assert procfs.tasks(GONE) == [] and procfs.namespace(GONE) == 0
    assert procfs.comm(GONE) == "(gone)"
    with pytest.raises(OSError):
        procfs.status(GONE)  # the supervisor tells a gone target apart


def test_fd_links_name_what_the_fd_names(tmp_path: object) -> None:
    fd = os.open(str(tmp_path), os.O_RDONLY)
    try:
        assert procfs.fd_link(fd) == str(tmp_path)
        again = os.open(procfs.own_fd(fd), os.O_RDONLY)
        assert os.path.samestat(os.fstat(again), os.fstat(fd))
        os.close(again)
        assert procfs.fd_path(12, fd) == b"/proc/12/fd/%d" % fd
        assert procfs.cwd_path(12) == b"/proc/12/cwd"
    finally:
        os.close(fd)


def test_the_new_readers_agree_with_the_kernel_and_the_standard_library(tmp_path: Path) -> None:
    me = os.getpid()
    assert procfs.exists(me) and not procfs.exists(GONE)
    assert procfs.owner(me) == os.geteuid() and procfs.owner(GONE) is None
    assert b"PATH=" + os.environb[b"PATH"] in procfs.environ(me) and procfs.environ(GONE) == []
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        assert fd in procfs.own_fds() and {0, 1, 2} <= set(procfs.own_fds())
        assert os.readlink(f"{procfs.fd_dir(me)}/{fd}") == str(tmp_path)
    finally:
        os.close(fd)
    assert procfs.fd_dir(me, 7) == f"/proc/{me}/task/7/fd"
    # the mount table, against findmnt's reading of the same kernel table (util-linux)
    ours = {point: kind for point, kind, _root, _opts in procfs.mounts()}
    found = subprocess.run(
        ["findmnt", "-rn", "-o", "TARGET,FSTYPE"], capture_output=True, text=True, check=True
    ).stdout
    for row in found.splitlines():
        target, kind = row.rsplit(" ", 1)
        target = target.encode().decode("unicode_escape")  # findmnt escapes as \x20
        assert ours.get(target) == kind, (target, kind)
    # cgroups: the v2 line is the one findmnt's cgroup2 mount belongs to
    lines = procfs.cgroups()
    text = Path("/proc/self/cgroup").read_text().splitlines()
    assert [f"{i}:{','.join(c)}:{p}" for i, c, p in lines] == text
    assert procfs.cgroups(GONE) == []
    # the host's IPv6 addresses, against the socket module's own parse of each
    for hexed in procfs.inet6_addresses():
        assert len(hexed) == 32 and socket.inet_pton(socket.AF_INET6, _colons(hexed))
    with pytest.raises(OSError):
        procfs.view_pids(GONE)


def _colons(hexed: str) -> str:
    return ":".join(hexed[i : i + 4] for i in range(0, 32, 4))


def test_a_mount_point_with_a_space_is_unescaped(tmp_path: Path) -> None:
    table = tmp_path / "mountinfo"
    table.write_bytes(
        b"36 35 98:0 /a\\040b /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw\n"
        b"not a mountinfo line\n"
    )
    assert procfs.mounts(str(table)) == [("/mnt/with space", "ext3", "/a b", "rw")]
