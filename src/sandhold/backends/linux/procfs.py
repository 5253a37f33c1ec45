"""Reading ``/proc``: one place for the fields, task lists, fd links, namespaces, the
mount table, cgroups, environments and the network tables.

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
- The sandbox's agent reads its descendants through this module too: it is one of
  the modules the launcher loads into the sandbox (``launcher.AGENT_MODULES``), so it
  imports nothing but ``os``.
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


def _read_all(path: bytes | str) -> bytes:
    """A /proc file of any length (the mount table, an environment, a socket table)."""
    fd = os.open(path, _RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
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
    """Pids below ``root`` in the process tree."""
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


def exists(pid: int) -> bool:
    """/proc shows ``pid`` (a process, a zombie, or a thread id)."""
    return os.path.exists(f"/proc/{pid}")


def owner(pid: int) -> int | None:
    """The uid that owns ``pid``'s /proc entry (its effective uid), or None: gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def environ(pid: int) -> list[bytes]:
    """``pid``'s environment as it started (``NAME=value`` items); [] when it is gone
    or not ours to read."""
    try:
        return _read_all(f"/proc/{pid}/environ").split(b"\0")
    except OSError:
        return []


def own_fds() -> list[int]:
    """This process's open descriptors (the listing's own fd among them, closed by
    the time the caller looks)."""
    return [int(name) for name in os.listdir("/proc/self/fd")]


def fd_dir(pid: int, tid: int | str | None = None) -> str:
    """Where ``pid``'s descriptor table shows (through thread ``tid`` when given: a
    leader that has exited shows none of its own)."""
    return f"/proc/{pid}/fd" if tid is None else f"/proc/{pid}/task/{tid}/fd"


def view_pids(init: int) -> int:
    """How many processes the /proc that ``init``'s mount namespace has at ``/proc``
    lists (a sandbox's own /proc, through ``/proc/INIT/root``): what a PID namespace
    holds, at a cost that grows with it, not with the host.

    Raises:
        OSError: not there (not mounted yet, or ``init`` gone).
    """
    return sum(1 for name in os.listdir(f"/proc/{init}/root/proc") if name.isdigit())


def net_table(pid: int, table: str) -> list[list[str]]:
    """The rows of ``/proc/PID/net/TABLE`` (``tcp``, ``tcp6``...) of ``pid``'s network
    namespace, split into fields, the heading left out; [] when it cannot be read."""
    try:
        text = _read_all(f"/proc/{pid}/net/{table}").decode("ascii", "replace")
    except OSError:
        return []
    return [row.split() for row in text.splitlines()[1:]]


def inet6_addresses() -> list[str]:
    """The host's IPv6 addresses as ``/proc/net/if_inet6`` writes them (32 hex digits);
    [] without IPv6."""
    try:
        text = _read_all("/proc/net/if_inet6").decode("ascii", "replace")
    except OSError:
        return []
    return [f[0] for f in (row.split() for row in text.splitlines()) if f and len(f[0]) == 32]


def mounts(path: str = "/proc/self/mountinfo") -> list[tuple[str, str, str, str]]:
    """(mount point, file system type, root within it, super options) of each mount in
    a ``mountinfo`` table, paths unescaped.

    Raises:
        OSError: the table cannot be read.
    """
    out = []
    for line in _read_all(path).splitlines():
        fields = line.split(b" ")
        try:
            dash = fields.index(b"-", 6)
            kind, options = fields[dash + 1].decode(), fields[dash + 3].decode()
        except (ValueError, IndexError):
            continue  # not a mountinfo line
        out.append((_unescape(fields[4]), kind, _unescape(fields[3]), options))
    return out


def _unescape(field: bytes) -> str:
    """A mountinfo path: space, tab, newline and backslash are octal escapes there."""
    out = bytearray()
    i = 0
    while i < len(field):
        digits = field[i + 1 : i + 4]
        if field[i] == 0x5C and len(digits) == 3 and digits.isdigit():
            out.append(int(digits, 8))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return os.fsdecode(bytes(out))


def cgroups(pid: int | str = "self") -> list[tuple[str, tuple[str, ...], str]]:
    """(hierarchy id, controllers, path) of each line of ``/proc/PID/cgroup``: ``("0",
    (), path)`` is the v2 one, a v1 hierarchy names its controllers (``("4",
    ("pids",), "/user.slice")``); [] when it is gone.
    """
    try:
        text = _read_all(f"/proc/{pid}/cgroup").decode("utf-8", "replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        ident, _, rest = line.partition(":")
        names, _, where = rest.partition(":")
        out.append((ident, tuple(n for n in names.split(",") if n), where))
    return out
