"""A sandbox session's private directory on the host.

Each session owns ``<base>/sandhold-<uid>/<id>/`` holding its TMPDIR, the empty
mode-000 file that hides denied files and an ``owner`` file (pid and start
time), so that the next session can sweep the directory of an owner killed with
SIGKILL. Nothing is ever created in the user's tree: names that do not exist yet
are the creation-time supervisor's. The base directory must be ours and private;
a squatted or loose one stops the launch.

Cancellation: ``close()`` is idempotent and is also the SIGKILL story's second
half: whatever it did not get to, the next ``open_session`` sweeps.
"""

from __future__ import annotations

import os
import stat

from sandhold.backends.linux import procfs
from sandhold.errors import LaunchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence


def private_base() -> str:
    """Where this user's sessions live: ``$TMPDIR`` (or /tmp)/sandhold-<uid>."""
    tmp = os.environ.get("TMPDIR") or "/tmp"
    if not tmp.startswith("/"):
        tmp = "/tmp"
    return f"{tmp.rstrip('/')}/sandhold-{os.geteuid()}"


def _ensure_private_dir(path: str) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise LaunchError("native", "private directory", f"{path}: {exc.strerror}") from exc
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise LaunchError(
            "native",
            "private directory",
            f"{path} is not a directory private to uid {os.geteuid()}; "
            "refusing to keep sandbox data there (remove it or set TMPDIR)",
        )


class Session:
    """The host-side private state of one sandbox run."""

    def __init__(self, base: str, name: str) -> None:
        self.base = base
        self.path = f"{base}/{name}"
        self.tmpdir = f"{self.path}/tmp"
        self.hidden_file = f"{self.path}/hidden"
        self.hidden_dir = f"{self.path}/hidden-dir"
        self._closed = False

    def write_copies(
        self, files: Sequence[tuple[str, bytes]], prefix: str = "masked"
    ) -> tuple[tuple[str, str], ...]:
        """Write each (path in the sandbox, content) into this private directory, which
        no sandbox sees, read-only: masked credential files' copies (placeholders only)
        and the trust bundle, for bwrap to bind at their paths (``BwrapFds.masked``).

        Raises:
            LaunchError: a copy could not be written.
        """
        out = []
        for i, (path, data) in enumerate(files):
            copy = f"{self.path}/{prefix}-{i}"
            try:
                fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            except OSError as exc:
                raise LaunchError(
                    "native", f"private copy of {path}", f"{copy}: {exc.strerror}"
                ) from exc
            out.append((path, copy))
        return tuple(out)

    # -- teardown ----------------------------------------------------------------

    def close(self) -> None:
        """Remove TMPDIR and the session directory."""
        if self._closed:
            return
        self._closed = True
        _remove_tree(self.path)


def _remove_tree(path: str) -> None:
    try:
        os.rmdir(f"{path}/tmp")
    except FileNotFoundError:
        pass
    except OSError:
        _rmtree_forced(f"{path}/tmp")
    # the files sandhold put here (hidden, owner, the private copies): no shutil, which
    # costs the CLI ~5 ms to import, for a directory only sandhold writes
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        names = []
    for name in names:
        if name not in ("tmp", "hidden-dir"):
            try:
                os.unlink(f"{path}/{name}")
            except (FileNotFoundError, IsADirectoryError, PermissionError):
                pass  # a directory: the forced removal below takes it
    try:
        os.rmdir(f"{path}/hidden-dir")
    except FileNotFoundError:
        pass
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        _rmtree_forced(path)


def _rmtree_forced(path: str) -> None:
    """Remove a tree the sandbox wrote, even where it dropped its own permissions."""
    import shutil  # rarely needed: only when the sandbox left files behind

    for dirpath, dirnames, _files in os.walk(path):
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                try:
                    os.chmod(full, 0o700)
                except OSError:
                    pass
    shutil.rmtree(path, ignore_errors=True)


def _is_session_name(name: str) -> bool:
    """``<pid>-<8 hex digits>``, as ``open_session`` names them."""
    pid, _, tag = name.partition("-")
    return pid.isdigit() and len(tag) == 8 and all(c in "0123456789abcdef" for c in tag)


def _sweep(base: str) -> None:
    """Clean up after sessions whose owner died without closing them."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if not _is_session_name(name):
            continue  # not a session: the execute-only interpreters in bin/, say
        path = f"{base}/{name}"
        try:
            with open(f"{path}/owner", encoding="utf-8") as f:
                pid_text, _, started = f.read().strip().partition(" ")
        except FileNotFoundError:
            pid_text, started = "", ""
        except OSError:
            continue
        if pid_text.isdigit() and procfs.start_time(int(pid_text)) == started:
            continue  # alive
        if not pid_text:
            # No owner file: a session that died while starting, or one starting now.
            try:
                if os.lstat(path).st_mtime > _now() - 60:
                    continue
            except OSError:
                continue
        _remove_tree(path)


def _now() -> float:
    import time

    return time.time()


def creation_lock(base: str) -> int:
    """The fd (close-on-exec) of this user's creation lock, ``<base>/creation.lock``.

    Every creation-time supervisor of this user's sandboxes holds it (``flock``)
    while it checks and performs a call, so a rename in one sandbox cannot move a
    directory between another one's check and its call. It lives in the private
    base, which no sandbox sees: a sandboxed process cannot hold it up.

    Raises:
        LaunchError: it cannot be opened.
    """
    try:
        return os.open(
            f"{base}/creation.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except OSError as exc:
        raise LaunchError("native", "creation lock", f"{base}: {exc.strerror}") from exc


def open_session() -> Session:
    """Sweep dead sessions, then create this one's private directory.

    Raises:
        LaunchError: the private base directory is unsafe or cannot be made.
    """
    base = private_base()
    _ensure_private_dir(base)
    _sweep(base)
    pid = os.getpid()
    name = f"{pid}-{os.urandom(4).hex()}"
    session = Session(base, name)
    try:
        os.mkdir(session.path, 0o700)
        with open(f"{session.path}/owner", "w", encoding="utf-8") as f:
            f.write(f"{pid} {procfs.start_time(pid)}\n")
        os.mkdir(session.tmpdir, 0o700)
        fd = os.open(session.hidden_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0)
        os.close(fd)
        os.mkdir(session.hidden_dir, 0)
    except OSError as exc:
        session.close()
        raise LaunchError("native", "session directory", f"{exc.filename}: {exc.strerror}") from exc
    return session
