"""The real ``HostView``: what the mount plan needs to know about this host's files.

Rules:
- ``pin_sources`` opens every source a plan binds (``SpecPlan.pins``) with
  ``O_PATH|O_NOFOLLOW`` and checks it is the object the plan saw (device and
  inode, not a symlink); bubblewrap is handed the open files (``--bind-fd``), so
  what is mounted is what was planned. A source that changed fails the launch,
  naming it: nothing else is ever mounted in its place.
- ``home_facts`` reads the password database: the account's home and every home
  in it, whose secret locations the plan hides inside any bind.
- ``read_masked_file`` reads a masked credential file for the plan to mask: not
  through a symlink, only a regular file of at most ``MAX_MASKED_FILE`` bytes of
  UTF-8; anything else is None (the plan then denies the file instead).
"""

from __future__ import annotations

import errno
import os
import stat as _stat

from sandhold.policy.fsplan import DIR, FILE, OTHER, SYMLINK, LinkScan, Stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Container, Iterator, Sequence

    from sandhold.errors import LaunchError
    from sandhold.policy.specplan import Pin

# Pseudo-filesystems a walk of a writable root never descends into.
_SKIP_WALK = ("/proc", "/sys", "/dev")


# Kernel file systems whose mounts show the host itself (processes, devices, kernel
# settings, cgroups, tracing): never to be shown in a sandbox through a bind.
KERNEL_FS_TYPES = frozenset(
    {
        "proc",
        "sysfs",
        "devtmpfs",
        "devpts",
        "cgroup",
        "cgroup2",
        "debugfs",
        "tracefs",
        "securityfs",
        "bpf",
        "configfs",
        "efivarfs",
        "pstore",
        "mqueue",
        "binfmt_misc",
        "fusectl",
    }
)


def kernel_mounts(mountinfo: str = "/proc/self/mountinfo") -> tuple[tuple[str, str], ...]:
    """(mount point, type) of every mount of a ``KERNEL_FS_TYPES`` file system here.

    Raises:
        OSError: the table cannot be read: the caller cannot tell what a bind holds.
    """
    from sandhold.backends.linux import procfs

    return tuple(
        (point, kind)
        for point, kind, _root, _opts in procfs.mounts(mountinfo)
        if kind in KERNEL_FS_TYPES
    )


class OsHostView:
    """``HostView`` over the live filesystem. Walks never follow symlinks.

    One view serves one plan, made in a few milliseconds: ``realpath`` answers are
    kept for its life (the plan asks for the same ones many times, each a walk
    of ``lstat`` calls); make a new view for each launch."""

    def __init__(self) -> None:
        self._real: dict[str, str] = {}

    def realpath(self, path: str) -> str:
        """``os.path.realpath(path)``, one ``lstat`` per new name: a plain path's
        parent is resolved once for all its entries (the plan asks for dozens below
        the home), and a name that is no symlink is simply appended to it."""
        real = self._real.get(path)
        if real is not None:
            return real
        parent, _, name = path.rpartition("/")
        plain = path.startswith("/") and name not in ("", ".", "..")
        if not plain or "//" in path or "/./" in path or "/../" in path:
            real = _realpath(path)  # a spelling to normalise first: the slow way
        else:
            base = self.realpath(parent) if parent else "/"
            at = f"{base.rstrip('/')}/{name}"
            try:
                link = _stat.S_ISLNK(os.lstat(at).st_mode)
            except (OSError, ValueError):
                link = False  # gone, or below a file: kept as spelled, as realpath does
            real = _realpath(at) if link else at
        self._real[path] = real
        return real

    def lstat(self, path: str) -> Stat | None:
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except ValueError:  # a NUL in it: no such name can exist
            return None
        except PermissionError:
            # An unreadable parent: the sandboxed user cannot reach it either, and a
            # rule on it is kept by mounting over the nearest ancestor we can see.
            return None
        except OSError as exc:
            raise _unplannable(path, exc) from None
        mode = st.st_mode
        if _stat.S_ISDIR(mode):
            kind = DIR
        elif _stat.S_ISREG(mode):
            kind = FILE
        elif _stat.S_ISLNK(mode):
            kind = SYMLINK
        else:
            kind = OTHER
        return Stat(kind, st.st_dev, st.st_ino, st.st_nlink)

    def readlink(self, path: str) -> str | None:
        try:
            return os.readlink(path)
        except OSError:  # not a symlink, or gone
            return None

    def read_bytes(self, path: str, limit: int) -> bytes | None:
        # O_NONBLOCK: a FIFO planted where a config was expected opens at once (and
        # is refused below) instead of waiting for a writer
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise _unplannable(path, exc, "what it holds") from None
        try:
            if not _stat.S_ISREG(os.fstat(fd).st_mode):
                not_file = OSError(errno.EINVAL, "not a regular file")
                raise _unplannable(path, not_file, "what it holds")
            chunks = []
            left = limit
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        except OSError as exc:
            raise _unplannable(path, exc, "what it holds") from None
        finally:
            os.close(fd)

    def walk(
        self, root: str, unreadable: list[str] | None = None
    ) -> Iterator[tuple[str, list[str], list[str]]]:
        stack = [root]
        while stack:
            top = stack.pop()
            dirs: list[str] = []
            files: list[str] = []
            if not os.access(top, os.R_OK | os.X_OK):
                # listable but not searchable (mode 0644) hides its names as well as
                # an unlistable one does, and its owner can chmod it from inside
                if unreadable is not None:
                    unreadable.append(top)
                continue
            try:
                with os.scandir(top) as it:
                    for entry in it:
                        try:
                            is_dir = entry.is_dir(follow_symlinks=False)
                        except OSError:
                            is_dir = False
                        (dirs if is_dir else files).append(entry.name)
            except OSError as exc:
                if exc.errno == errno.ENAMETOOLONG:
                    raise _unplannable(top, exc) from None  # its names go unchecked
                if unreadable is not None and exc.errno in (errno.EACCES, errno.EPERM):
                    unreadable.append(top)
                continue  # gone, or not listable by this user (the sandbox's too, for now)
            yield top, dirs, files
            for name in reversed(dirs):
                path = f"{top}/{name}" if top != "/" else f"/{name}"
                if path not in _SKIP_WALK:
                    stack.append(path)

    def scan_links(self, root: str, skip: Container[str], limit: int) -> LinkScan:
        # One lstat per regular file (the link count is in the inode, not in the
        # directory), made relative to the open directory so that no path is looked
        # up again; directories and symlinks are told apart by the entry's type
        # alone. As fast as GNU find (the kernel's stat is the cost), without its
        # start-up, and it stops at the limit.
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        found: list[tuple[str, int, int, int]] = []
        seen = 0
        stack = [root]
        while stack:
            top = stack.pop()
            try:
                fd = os.open(top, flags)
            except OSError:
                continue  # gone, or not listable: its names are not known to us either
            try:
                with os.scandir(fd) as it:
                    for entry in it:
                        if seen >= limit:
                            return LinkScan(tuple(found), seen, False)
                        seen += 1
                        path = f"{top.rstrip('/')}/{entry.name}"
                        if path in skip:
                            continue
                        try:
                            if entry.is_dir(follow_symlinks=False):
                                stack.append(path)
                            elif entry.is_file(follow_symlinks=False):
                                st = entry.stat(follow_symlinks=False)
                                if st.st_nlink > 1:
                                    found.append((path, st.st_dev, st.st_ino, st.st_nlink))
                        except OSError:
                            continue  # gone since it was listed: no name of it is here
            except OSError:
                continue  # listable but not searchable: as unlistable (see walk)
            finally:
                os.close(fd)
        return LinkScan(tuple(found), seen, True)


def _realpath(path: str) -> str:
    """``os.path.realpath``; a link that stops being one mid-walk (``readlink`` fails
    with EINVAL: something is swapping it) stops the plan, naming the path."""
    try:
        return os.path.realpath(path)
    except OSError as exc:
        from sandhold.errors import UnenforceablePolicy

        raise UnenforceablePolicy(
            path,
            "native",
            f"it changed while the plan was made ({exc.strerror}): something is "
            "swapping it (a sandbox that can write its parent?); nothing was launched",
        ) from exc


def _unplannable(path: str, exc: OSError, what: str = "the names in it") -> Exception:
    """A path the plan cannot look at (deeper than PATH_MAX, say, which an earlier
    sandbox can build): ``what`` it holds cannot be checked, so the launch stops."""
    from sandhold.errors import UnenforceablePolicy

    shown = path if len(path) <= 200 else f"{path[:100]}…{path[-100:]}"
    return UnenforceablePolicy(
        shown,
        "native",
        f"sandhold cannot look at it ({exc.strerror}), so {what} cannot be "
        "checked. Move or remove that tree (or take it out of the writable roots)",
    )


def pin_sources(pins: Sequence[Pin]) -> list[tuple[str, int]]:
    """(path, fd) of each pinned source, opened ``O_PATH|O_NOFOLLOW|O_CLOEXEC``: the
    caller passes the fds to bubblewrap alone and closes them once it is spawned.

    Raises:
        LaunchError: a source is gone, a symlink now, or another object than the
            plan saw (swapped between plan and launch); the fds opened are closed.
    """

    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    opened: list[tuple[str, int]] = []
    try:
        for pin in pins:
            try:
                fd = os.open(pin.path, flags)
            except OSError as exc:
                raise _swapped(pin.path, f"it cannot be opened ({exc.strerror})") from exc
            opened.append((pin.path, fd))
            st = os.fstat(fd)
            if _stat.S_ISLNK(st.st_mode):
                raise _swapped(pin.path, "it is a symlink now")
            if (st.st_dev, st.st_ino) != (pin.dev, pin.ino):
                raise _swapped(pin.path, "another file or directory is there now")
    except BaseException:
        for _, fd in opened:
            os.close(fd)
        raise
    return opened


def _swapped(path: str, what: str) -> LaunchError:
    from sandhold.errors import LaunchError

    return LaunchError(
        "native",
        "pin mount sources",
        f"{path} changed between the plan and the mount: {what}. Something is swapping "
        "it (a sandbox that can write its parent?); nothing was mounted in its place. "
        "Launch again once it stays put",
    )


def home_facts() -> dict[str, object]:
    """``SpecHost`` facts from the password database: ``account_home`` (this uid's
    home, whatever ``$HOME`` says) and ``homes`` (every account's)."""
    import pwd

    try:
        account = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        account = ""  # no entry: $HOME is all there is
    homes = tuple(dict.fromkeys(e.pw_dir for e in pwd.getpwall() if e.pw_dir.startswith("/")))
    return {"account_home": account, "homes": homes}


MAX_MASKED_FILE = 1 << 20


def read_masked_file(path: str) -> str | None:
    """The text of a masked credential file, or None (module rules)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not _stat.S_ISREG(st.st_mode) or st.st_size > MAX_MASKED_FILE:
            return None
        try:
            data = f.read(MAX_MASKED_FILE + 1)
        except OSError:
            return None
    if len(data) > MAX_MASKED_FILE:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
