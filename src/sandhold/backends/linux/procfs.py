"""Reading ``/proc``: one place for the fields, task lists, fd links and namespaces.

Rules:
- ``/proc/PID/stat`` is split after the *last* ``)``: the command name in between
  may hold spaces and parentheses of its own. ``stat_fields`` gives the fields from
  the state on (``fields[0]`` is stat(5)'s field 3).
- A process that is gone reads as nothing (``b""``, ``[]``, ``0``, None), never as an
  error: callers ask about processes that may exit at any moment. Where a caller
  must tell "gone" apart (the supervisor: a gone target fails its call), the
  function raises ``OSError`` and says so.
- Cheap: ``os`` only, one ``read`` of a small file, no text decoding that is not
  needed (the supervisor reads a target's status on its hot path, ~11 µs).
- Paths that go through a magic link (``/proc/PID/cwd``, ``/proc/PID/fd/N``,
  ``/proc/self/fd/N``) are built here; opening them, and with which flags, is the
  caller's.
"""

from __future__ import annotations

import os

_RDONLY = os.O_RDONLY | os.O_CLOEXEC


def _read(path: bytes | str) -> bytes:
    """The start of a small /proc file (one read: the kernel makes it whole)."""
    fd = os.open(path, _RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def read_stat(pid: int, tid: int | str | None = None) -> bytes:
    """``/proc/PID/stat`` (of thread ``tid`` when given), or b"" when it is gone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        return _read(path)
    except OSError:
        return b""


def stat_fields(data: bytes) -> list[bytes]:
    """The fields of a ``/proc/PID/stat`` line from the state on; [] from b""."""
    if not data:
        return []
    return data[data.rindex(b")") + 2 :].split()


def state_and_threads(data: bytes) -> tuple[str, int]:
    """(state, number of threads) from a ``/proc/PID/stat`` line; ("", 0) from b""."""
    fields = stat_fields(data)
    if not fields:
        return "", 0
    return fields[0].decode(), int(fields[17])


def ppid(pid: int) -> int:
    """The parent of ``pid`` (0 when it is gone)."""
    fields = stat_fields(read_stat(pid))
    return int(fields[1]) if fields else 0


def start_time(pid: int) -> str | None:
    """When ``pid`` started, in clock ticks since boot as /proc writes it (None: gone).
    With the pid, it names one process: pids are reused, start times with them not."""
    fields = stat_fields(read_stat(pid))
    return fields[19].decode() if fields else None


def status(pid: int) -> bytes:
    """``/proc/PID/status`` (``pid`` may be a thread's id).

    Raises:
        OSError: the task is gone (ENOENT, ESRCH) or not ours to read.
    """
    return _read(b"/proc/%d/status" % pid)


def status_fields(data: bytes, first: bytes = b"") -> dict[bytes, bytes]:
    """The ``Name:\\tvalue`` fields of a ``/proc/PID/status`` text, each value as
    written; only those whose name starts with one of the bytes of ``first`` (all
    when it is empty: the supervisor parses only the few it reads)."""
    return dict(
        line.split(b":\t", 1)
        for line in data.split(b"\n")
        if b":\t" in line and (not first or line[:1] in first)
    )


def nspids(pid: int) -> list[int]:
    """``pid`` in each PID namespace it is in, outermost (the host's) first ([]: gone)."""
    try:
        value = status_fields(status(pid), b"N").get(b"NSpid", b"")
        return [int(x) for x in value.split()]
    except (OSError, ValueError):
        return []  # gone: no pids


def comm(pid: int) -> str:
    """The command name of ``pid`` ("(gone)" when it is gone)."""
    try:
        return _read(f"/proc/{pid}/comm").strip().decode(errors="replace")
    except OSError:
        return "(gone)"


def pids() -> list[int]:
    """Every process /proc shows (its numeric entries)."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def tasks(pid: int) -> list[str]:
    """The thread ids of ``pid`` ([] when it is gone)."""
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def children_by_parent() -> dict[int, list[int]]:
    """Every process's direct children, from each ``/proc/PID/stat``:
    ``/proc/PID/task/TID/children`` needs ``CONFIG_PROC_CHILDREN``, which kernels may
    leave out."""
    children: dict[int, list[int]] = {}
    for pid in pids():
        fields = stat_fields(read_stat(pid))
        if fields:  # else gone meanwhile
            children.setdefault(int(fields[1]), []).append(pid)
    return children


def descendants(root: int) -> list[int]:
    """Pids below ``root`` in the process tree (the agent keeps a copy of its own:
    it runs from four modules loaded into the sandbox, and this is not one)."""
    children = children_by_parent()
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def namespace(pid: int, kind: str = "pid") -> int:
    """The inode of ``pid``'s namespace of ``kind`` (``pid``, ``net``...); 0 when gone."""
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return 0


def cwd_path(pid: int) -> bytes:
    """The magic link to task ``pid``'s working directory."""
    return b"/proc/%d/cwd" % pid


def fd_path(pid: int, fd: int) -> bytes:
    """The magic link to task ``pid``'s descriptor ``fd``."""
    return b"/proc/%d/fd/%d" % (pid, fd)


def own_fd(fd: int) -> str:
    """The magic link to this process's descriptor ``fd``: open it to open what ``fd``
    names anew (other flags, not sharing the file offset)."""
    return f"/proc/self/fd/{fd}"


def fd_link(fd: int) -> str:
    """Where this process's descriptor ``fd`` points, as /proc spells it (an absolute
    path, `` (deleted)`` after it when removed; ``pipe:[N]``...).

    Raises:
        OSError: ``fd`` is not open.
    """
    return os.readlink(own_fd(fd))
