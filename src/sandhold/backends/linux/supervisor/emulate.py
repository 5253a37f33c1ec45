"""Performs each trapped call on the target's behalf, so no re-read of its memory ever decides.

The seccomp filter stops every call that can create a name (``CREATION_RULES``)
and hands it to the supervisor. ``Emulator.handle`` answers one notification.

Rules:
- Never ``CONTINUE`` a trapped call whose outcome depends on target memory
  (``umask`` and an ``open``/``openat`` with ``O_PATH`` depend on registers only
  and make no name). Target memory (paths, ``open_how``,
  ``sockaddr``) is read exactly once, into the supervisor; the decision and
  the operation both use that copy. A thread of the target that rewrites the
  buffer afterwards changes nothing, because the kernel never looks at it again.
- The target's starting points are copied, not named: its cwd and dirfds are
  opened through ``/proc/<tid>/cwd`` and ``/proc/<tid>/fd/<n>`` (the same
  directory, not a path to it), sockets with ``pidfd_getfd``. Then
  ``NOTIF_ID_VALID`` proves the tid still belongs to the waiting target.
- The parent directory is resolved with ``openat2(RESOLVE_NO_MAGICLINKS)``
  into an fd; its absolute path is read back from that fd (``/proc/self/fd``),
  the policy decides on that path plus the final component, and the operation
  runs relative to the fd with the final component only. The final component
  is never followed where following could create a name elsewhere: ``O_CREAT``
  without ``O_EXCL`` first opens without ``O_CREAT`` and ``O_NOFOLLOW``, creates
  with ``O_EXCL`` if nothing is there, and follows a symlink by reading it and
  resolving its text as a new path, checked again (a dangling symlink to
  ``.env`` is refused like ``.env``).
- ``/proc`` is resolved as the target sees it: a directory that resolved to the
  supervisor's own ``/proc/<pid>`` (through ``self``, ``thread-self``,
  ``/dev/fd`` ...) is re-opened as the target's; any other numeric ``/proc``
  entry than the target's own is refused, and nothing is ever created there.
  So a target can never have the supervisor open the supervisor's own files.
- One thread performs every call of a sandbox, one after another, holding the
  creation lock all sandboxes of the user share (``lock_fd``). While it
  works on one call no other sandboxed call can create, rename or link a name,
  so the parent it resolved keeps its path until the operation is done, and a
  directory rename can check the whole subtree it moves first.
- A refusal answers ``EACCES`` and reports a ``Violation``. A failure of the
  operation answers its errno. A bug here answers ``EPERM`` and is logged:
  the call fails closed, it never runs unchecked.
- Opens return their fd with ``NOTIF_ADDFD | ADDFD_FLAG_SEND``: installing the
  fd and answering the call are one atomic step.
- An open that would wait at an existing FIFO for its other end is answered by
  a thread of its own, which opens the FIFO pinned beforehand (an ``O_PATH`` fd,
  so no name is looked up again): waiting in the serving thread would hold up
  every other call of the sandbox, and the other end may need one first.

Emulated calls run with the supervisor's credentials, umask set to the target's,
and in the supervisor's mount namespace and root, which in the sandhold agent are
the target's own (the agent runs inside the sandbox, ``chroot`` is refused).
"""

from __future__ import annotations

import errno
import fcntl
import os
import posixpath
import stat

from sandhold.backends.linux import procfs
from sandhold.backends.linux.supervisor import notify
from sandhold.backends.linux.supervisor.violation import Violation
from sandhold.policy import creation, paths, symlinks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    Args = tuple[int, int, int, int, int, int]
    Handler = Callable[[int, int, int, Args], "int | None"]


AT_FDCWD = 0xFFFF_FF9C  # -100 as the kernel's 32-bit int
AT_SYMLINK_FOLLOW = 0x400
AT_EMPTY_PATH = 0x1000
RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT = 1 << 0, 1 << 1, 1 << 2
AF_UNIX = 1
SOCKADDR_MAX = 128  # sizeof(struct sockaddr_storage)
SUN_LEN_MAX = 110  # sizeof(struct sockaddr_un)
SOL_SOCKET, SO_DOMAIN = 1, 39
MAX_SYMLINKS = 40  # the kernel's MAXSYMLINKS

O_PATH = os.O_PATH
O_CREAT = os.O_CREAT
O_EXCL = os.O_EXCL
O_NOFOLLOW = os.O_NOFOLLOW
O_DIRECTORY = os.O_DIRECTORY
O_CLOEXEC = os.O_CLOEXEC
O_TMPFILE = os.O_TMPFILE
_O_TMPFILE_BIT = O_TMPFILE & ~O_DIRECTORY
_DIR_PATH = O_PATH | O_DIRECTORY | O_CLOEXEC
_DIR_READ = os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC
_GIT = "mandatory: .git/"  # the reason prefix of creation rule 3's git names
_O_PATH_FLAGS = O_DIRECTORY | O_NOFOLLOW | O_PATH | O_CLOEXEC
# include/linux/fcntl.h VALID_OPEN_FLAGS: open(2) drops other bits, openat2(2) refuses them.
# O_LARGEFILE differs by arch and is 0 in 64-bit userspace headers, so it is spelled here.
_O_LARGEFILE = {"x86_64": 0o100000, "aarch64": 0o400000}
_FASYNC = 0o20000
_VALID_OPEN_BASE = (
    os.O_ACCMODE
    | O_CREAT
    | O_EXCL
    | os.O_NOCTTY
    | os.O_TRUNC
    | os.O_APPEND
    | os.O_NONBLOCK
    | os.O_SYNC
    | os.O_DSYNC
    | _FASYNC
    | os.O_DIRECT
    | O_DIRECTORY
    | O_NOFOLLOW
    | os.O_NOATIME
    | O_CLOEXEC
    | O_PATH
    | O_TMPFILE
)
RESOLVE_NO_MAGICLINKS = notify.RESOLVE_NO_MAGICLINKS
RESOLVE_NO_SYMLINKS = notify.RESOLVE_NO_SYMLINKS
RESOLVE_CACHED = notify.RESOLVE_CACHED
RESOLVE_SCOPED = notify.RESOLVE_BENEATH | notify.RESOLVE_IN_ROOT


class Denied(Exception):
    """The policy refuses ``path`` (a creation, or a unix socket connect); EACCES, reported."""

    def __init__(self, path: str, reason: str, action: str = creation.ACTION) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason
        self.action = action


def _open_listed(name: bytes | str, dirfd: int) -> tuple[int, list[tuple[str, bool, bool]]]:
    """The directory ``name`` in ``dirfd``, open, and (name, is a directory, is a symlink)
    of each entry."""
    fd = os.open(name, _DIR_READ, dir_fd=dirfd)
    try:
        with os.scandir(fd) as entries:
            return fd, [(e.name, e.is_dir(follow_symlinks=False), e.is_symlink()) for e in entries]
    except BaseException:
        os.close(fd)
        raise


def _link_targets(path: str, target: bytes) -> tuple[str, ...]:
    """Where a symlink at ``path`` to ``target`` leads: as written (normalised) and as
    resolved now. Both count (creation rule 4): no symlink that leads into an exempt
    tree can be made, so none can be switched into one after this check either."""
    directory, text = posixpath.dirname(path), os.fsdecode(target)
    resolved = os.path.realpath(posixpath.join(directory, text))
    return tuple(dict.fromkeys((symlinks.normal_target(directory, text), resolved)))


def _readlink_text(path: str) -> str | None:
    """The text of the symlink at ``path`` in the sandbox's view, or None (no symlink,
    or none this user can read: the places passed before it still count)."""
    try:
        return os.readlink(path)
    except OSError:
        return None


def _symlink_at(dirfd: int, name: bytes | str) -> bytes | None:
    """The target of the symlink ``name`` in ``dirfd``, or None when it is none."""
    try:
        return os.readlink(os.fsencode(name), dir_fd=dirfd)
    except OSError:
        return None


def _exists(dirfd: int, name: bytes) -> bool:
    try:
        os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except OSError:
        return False
    return True


class _Fifo(Exception):
    """The open would wait at a FIFO: answered later, from a thread (``pin``: O_PATH fd)."""

    def __init__(self, pin: int) -> None:
        super().__init__(pin)
        self.pin = pin


def _err(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def _no_set_id(mode: int) -> None:
    """A new file may not be set-user-ID or set-group-ID: on the host it would run with
    its owner's rights (root's, when sandhold runs as root); nosuid holds only in the
    sandbox. As the filter refuses chmod to such a mode (policy.syscalls)."""
    if mode & (stat.S_ISUID | stat.S_ISGID):
        raise _err(errno.EPERM)


def _check_create_flags(flags: int) -> None:
    """The kernel's EINVAL cases that stripping O_CREAT for a first attempt would hide."""
    if flags & _O_TMPFILE_BIT:
        if flags & (O_TMPFILE | O_CREAT) != O_TMPFILE:
            raise _err(errno.EINVAL)
    elif flags & O_CREAT and flags & O_DIRECTORY:
        raise _err(errno.EINVAL)  # since Linux 6.4


def _unix_path(addr: bytes) -> bytes:
    """The filesystem path of an AF_UNIX ``sockaddr``, or b"" (another family, an
    abstract name, autobind)."""
    if len(addr) > 2 and int.from_bytes(addr[:2], "little") == AF_UNIX and addr[2] != 0:
        return addr[2:].split(b"\0", 1)[0]
    return b""


def _join(parent: str, name: bytes) -> str:
    return (parent if parent != "/" else "") + "/" + os.fsdecode(name)


class _Parent:
    """The resolved parent directory of a path: an fd, its absolute path, the last name."""

    __slots__ = ("abs", "fd", "in_proc", "name", "owned", "trailing")

    def __init__(
        self, fd: int, owned: bool, name: bytes, *, abs_path: str, trailing: bool, in_proc: bool
    ) -> None:
        self.fd = fd
        self.owned = owned
        self.name = name
        self.abs = abs_path
        self.trailing = trailing
        self.in_proc = in_proc

    def close(self) -> None:
        if self.owned:
            self.owned = False
            os.close(self.fd)

    def path(self) -> str:
        return _join(self.abs, self.name)

    def special(self) -> bool:
        """The last component is no new name (``/``, ``.``, ``..``): the call cannot create."""
        return self.name in (b"", b".", b"..")


_UNLOCKED = frozenset({"connect", "umask"})  # calls that make no name
_READ_ONLY = {
    errno.EROFS: "read-only in the sandbox",
    errno.EACCES: "not writable in the sandbox",
}
LOCK_WAIT = 10.0  # seconds, as LOCK_WAIT_MS in fastpath.c
_lock_said = False


def take_lock(fd: int, wait: float = LOCK_WAIT) -> bool:
    """The user's creation lock, waited for at most ``wait`` seconds: another sandbox
    holding it longer (stopped, or checking a huge tree) makes the call fail (EAGAIN)
    rather than hang. False on timeout (said once on stderr).

    Raises:
        OSError: the lock cannot be taken at all (the call fails with its errno).
    """
    import time

    global _lock_said
    step, deadline = 0.00005, time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        if time.monotonic() >= deadline:
            break
        time.sleep(step)
        step = min(step * 2, 0.005)
    if not _lock_said:
        _lock_said = True
        os.write(
            2,
            b"sandhold: another sandbox of this user has held the creation lock for "
            b"%d s: calls that make a name fail with EAGAIN until it lets go\n" % wait,
        )
    return False


class Emulator:
    """Answers notifications for one policy (see the module rules). One thread only."""

    def __init__(
        self,
        policy: creation.CreationPolicy,
        on_violation: Callable[[Violation], None] | None = None,
        *,
        lock_fd: int = -1,
    ) -> None:
        from sandhold.backends.linux.seccomp import ARCHES, native_arch

        arch = native_arch()
        self.policy = policy
        self.decider = creation.Decider(policy)
        self.on_violation = on_violation
        self.mem = notify.MemReader()
        self.openat2 = notify.Openat2()
        self.root = os.open("/", _DIR_PATH)
        self.my_tgid = os.getpid()
        self.my_tid = self.my_tgid  # set by bind_thread() in the serving thread
        self.valid_open = _VALID_OPEN_BASE | _O_LARGEFILE[arch]
        self.counts: dict[str, int] = {}
        self._alive = notify.PidfdAlive()
        self._umasks: dict[int, tuple[int, int, int]] = {}  # tid -> (pidfd, tgid, umask)
        self.errors = 0
        numbers = ARCHES[arch].creation_numbers or {}
        handlers: dict[str, Handler] = {
            "open": self._open,
            "openat": self._openat,
            "creat": self._creat,
            "openat2": self._openat2,
            "mkdir": self._mkdir,
            "mkdirat": self._mkdirat,
            "mknod": self._mknod,
            "mknodat": self._mknodat,
            "rename": self._rename,
            "renameat": self._renameat,
            "renameat2": self._renameat2,
            "link": self._link,
            "linkat": self._linkat,
            "symlink": self._symlink,
            "symlinkat": self._symlinkat,
            "bind": self._bind,
            "connect": self._connect,
            "umask": self._umask_call,
        }
        self.table: dict[int, tuple[str, Handler]] = {
            numbers[name]: (name, fn) for name, fn in handlers.items() if name in numbers
        }
        # the current notification, for violation records
        self._pid = 0
        self._call = ""
        self._where: str | None = None  # the name it writes, once resolved (see _writes)
        self.tag: object = None  # set by the caller per listener; copied into violations
        # (dev, ino) of the .git directories made during the run, and of their hooks
        self.fresh: set[tuple[int, int]] = set()
        # (dev, ino) of the .hg and .jj directories made during the run: no work tree
        # of the user's (they get no config of their own either: creation rule 3)
        self.fresh_hg: set[tuple[int, int]] = set()
        self.fresh_jj: set[tuple[int, int]] = set()
        self.lock_fd = lock_fd  # the user's creation lock (session.creation_lock), or -1

    def bind_thread(self) -> None:
        """Call from the serving thread: its own cwd/umask, and its tid for /proc rewriting."""
        import threading

        notify.unshare_fs()
        self.my_tid = threading.get_native_id()

    def close(self) -> None:
        os.close(self.root)
        for pidfd, _tgid, _umask in self._umasks.values():
            os.close(pidfd)
        self._umasks.clear()

    # -- one notification --------------------------------------------------------

    def handle(self, listener: int, raw: bytes) -> None:
        """Answer one ``struct seccomp_notif`` read from ``listener``."""
        nid, pid, _flags, nr, _arch, _ip, *args = notify.NOTIF.unpack(raw)
        entry = self.table.get(nr)
        if entry is None:  # the filter traps nothing else; answer as the kernel would
            self._reply(listener, nid, 0, errno.ENOSYS)
            return
        name, fn = entry
        self.counts[name] = self.counts.get(name, 0) + 1
        self._pid = pid
        self._call = name
        self._where = None
        # Check and call under the lock every sandbox of this user shares, so that no
        # rename elsewhere moves a directory between the two. Not for calls that make
        # no name: a connect may wait for a full backlog.
        locked = self.lock_fd >= 0 and name not in _UNLOCKED
        try:
            if locked and not take_lock(self.lock_fd):
                locked = False
                raise _err(errno.EAGAIN)
            result = fn(listener, nid, pid, tuple(args))
        except Denied as denied:
            self._report(denied)
            self._reply(listener, nid, 0, errno.EACCES)
        except OSError as exc:
            code = exc.errno or errno.EIO
            where = self._where
            if where is not None and self.decider.read_only(where, code):
                self._report(Denied(where, _READ_ONLY[code], creation.READ_ONLY_ACTION))
            self._reply(listener, nid, 0, code)
        except Exception:
            # a bug in the supervisor: fail the call closed, keep serving the others
            self.errors += 1
            import logging  # only on a bug: logging costs ~6 ms at start-up

            logging.getLogger("sandhold.backends.linux.supervisor").exception(
                "supervisor: %s from pid %d failed", name, pid
            )
            self._reply(listener, nid, 0, errno.EPERM)
        else:
            if result is not None:
                self._reply(listener, nid, result, 0)
        finally:
            if locked:
                try:
                    fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
                except OSError:
                    pass  # the call is answered; a lock fd gone bad fails the next one

    def _reply(self, listener: int, nid: int, val: int, error: int) -> None:
        try:
            notify.send(listener, nid, val, error)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # ENOENT: the target died meanwhile
                raise

    def _writes(self, parent: _Parent) -> None:
        """The call is about to write at ``parent``'s name: if the kernel refuses it for
        want of write access there, that is a write to a read-only path, reported."""
        self._where = parent.abs if parent.special() else parent.path()

    def _report(self, denied: Denied) -> None:
        if self.on_violation is None:
            return
        self.on_violation(
            Violation(denied.action, denied.path, denied.reason, self._call, self._pid, self.tag)
        )

    def _check(
        self,
        path: str,
        *,
        directory: bool = False,
        parent_fd: int = -1,
        link_to: bytes | None = None,
        git_own: bool = True,
        moved: bool = False,
    ) -> None:
        """Refuse making ``path`` (a directory; a symlink whose target is ``link_to``).

        ``parent_fd`` is the directory that would hold it: its other names decide the
        bare repository rule, and whether it is a ``.git`` made during the run (not for
        ``git_own`` False: a link or a socket is never one of git's own files there).
        ``moved``: ``path`` comes with a directory moved there, ``parent_fd`` the
        directory that brings it along.
        """
        reason = None
        targets = None
        if link_to is not None and not self.decider.exempt(path):
            text = os.fsdecode(link_to)
            reason = creation.link_text_denied(text) or symlinks.kernel_tree_denied(
                symlinks.steps(posixpath.dirname(path), text, _readlink_text)
            )
            targets = _link_targets(path, link_to)
        if reason is None:
            reason = self.decider.denied(path, directory=directory, link_to=targets)
        if reason is None and targets is not None:
            reason = self._repository_link(path, targets)
        if (
            reason is not None
            and self.fresh
            and git_own
            and parent_fd >= 0
            and reason.startswith(_GIT)
        ):
            # maybe git's own files in a repository made during this run (creation rule 3)
            st = os.fstat(parent_fd)
            if (st.st_dev, st.st_ino) in self.fresh:
                reason = self.decider.denied(path, directory=directory, fresh=True)
        if reason is None and directory and path.endswith(("/.git", "/.hg", "/.jj")):
            reason = self._nested_repository(path)
        if reason is None and parent_fd >= 0 and self.decider.git_dir_name(path):
            reason = self._bare_repository(path, parent_fd, moved)
        if reason is not None:
            raise Denied(path, reason)

    def _bare_repository(self, path: str, parent_fd: int, moved: bool) -> str | None:
        """Why making ``path`` (a name of ``creation.GIT_DIR_NAMES``) in the directory
        ``parent_fd`` may not go ahead: it would leave a git directory there, or give
        one a config (``creation.bare_repository_denied``, over the names it holds now),
        inside the work tree of a repository that existed before the run, where git run
        on the host would take it for a repository (a bare one) and use its config. The
        creation lock keeps those names as they are until the call is done."""
        names = [n for n in creation.GIT_DIR_NAMES if _exists(parent_fd, n.encode())]
        if not creation.bare_repository_denied(posixpath.basename(path), names, moved=moved):
            return None
        work = self._work_tree(posixpath.dirname(path))
        if work is None:
            return None
        return (
            f"mandatory: a git directory (HEAD with refs or commondir) inside the work tree "
            f"of {work} (git run there on the host would take it for a repository)"
        )

    def _nested_repository(self, path: str) -> str | None:
        """Why a new repository at ``path`` (its ``.git``, ``.hg`` or ``.jj``) may not be
        made: it lies in the work tree of a git, hg or jj repository that existed before
        the run, where the host runs git, hg or jj (a shell prompt's ``git status``) and
        would use the new one instead: a new git one's config, which the sandbox wrote.
        A new ``.hg`` or ``.jj`` gets no config (creation rule 3), but hg or jj on the
        host would still take it for your repository there (``hg commit`` into it; ``jj
        git push`` runs git in the git repository a new ``.jj`` keeps, with its
        hooks)."""
        if self.decider.exempt(path):
            return None
        work = self._work_tree(posixpath.dirname(path), skip=path)
        if work is None:
            return None
        return (
            f"mandatory: a repository inside the work tree of {work} (git, hg or jj run "
            "there on the host would use it)"
        )

    def _repository_link(self, path: str, targets: tuple[str, ...]) -> str | None:
        """Why a symlink at ``path`` may not lead to ``targets``: inside the work tree of
        a repository that existed before the run, one that leads out of it to where the
        sandbox may make names would let git on the host, following it, find a
        repository the sandbox made there (the same as making one inside)."""
        work = self._work_tree(posixpath.dirname(path))
        if work is None:
            return None
        for target in targets:
            if not paths.is_within(target, work) and self.decider.may_make(target):
                return (
                    f"mandatory: a symlink inside the work tree of {work} to {target}, "
                    "where a repository could be made (git on the host would use it)"
                )
        return None

    def _work_tree(self, start: str, skip: str = "") -> str | None:
        """The nearest of ``start`` and its ancestors holding a ``.git`` (a directory or a
        gitfile), a ``.hg`` or a ``.jj`` that the supervisor did not make during this run
        (one moved away and back is no fresh one). Looked up in the sandbox's view;
        existing ``.git`` names are rename guarded, a ``.hg`` or ``.jj`` only when it
        holds a protected name (a ``.jj`` of jj's git backend always does, its
        ``git_target``): moved away, it leaves a directory hg or jj no longer takes for
        a repository, and no ``.hg`` or ``.jj`` made in its place gets a config. The
        repositories the host saw at launch above the writable roots count too
        (``policy.work_trees``): a ``denyRead`` may hide them from this view."""
        known = self.policy.work_trees
        at = start
        while True:
            if at in known:
                return at
            for name, fresh in (
                (".git", self.fresh),
                (".hg", self.fresh_hg),
                (".jj", self.fresh_jj),
            ):
                repo = posixpath.join(at, name)
                try:
                    st = os.lstat(repo)
                except OSError:
                    continue
                if repo != skip and (st.st_dev, st.st_ino) not in fresh:
                    return at
            if at == "/":
                return None
            at = posixpath.dirname(at)

    def _note_fresh(self, parent: _Parent, name: bytes) -> None:
        """After a mkdir: remember a new ``.git``, ``.hg`` or ``.jj``, and the ``hooks``
        made inside a new ``.git``."""
        made = self.fresh_hg if name == b".hg" else self.fresh_jj if name == b".jj" else None
        if made is not None:
            try:
                st = os.stat(name, dir_fd=parent.fd, follow_symlinks=False)
            except OSError:
                return
            if stat.S_ISDIR(st.st_mode):
                made.add((st.st_dev, st.st_ino))
            return
        if name == b".git" or (name == b"hooks" and self.fresh):
            try:
                if name == b"hooks":
                    st = os.fstat(parent.fd)
                    if (st.st_dev, st.st_ino) not in self.fresh:
                        return
                st = os.stat(name, dir_fd=parent.fd, follow_symlinks=False)
            except OSError:
                return
            if stat.S_ISDIR(st.st_mode):
                self.fresh.add((st.st_dev, st.st_ino))

    @staticmethod
    def _valid(listener: int, nid: int) -> None:
        if not notify.id_valid(listener, nid):
            raise _err(errno.ENOENT)

    # -- the target's view ---------------------------------------------------------

    @staticmethod
    def _status(pid: int) -> tuple[int, int, int]:
        """(tgid, umask, threads) of task ``pid`` from /proc/<pid>/status."""
        fields = procfs.status_fields(procfs.status(pid), b"UT")
        return (
            int(fields.get(b"Tgid", b"%d" % pid)),
            int(fields.get(b"Umask", b"0022"), 8),
            int(fields.get(b"Threads", b"2")),
        )

    def _tgid(self, pid: int) -> int:
        return self._status(pid)[0]

    def _umask(self, pid: int) -> int:
        """The target's umask: cached per thread while provably current (see below).

        Reading /proc/<tid>/status costs ~11 µs, more than the rest of a call. An
        entry is kept only for a single-threaded process, where nothing but the
        thread's own (trapped, so seen) umask(2) calls can change it; its pidfd
        says whether the tid still is that task, since tids are reused.
        """
        entry = self._umasks.get(pid)
        if entry is not None:
            if self._alive(entry[0]):
                return entry[2]
            os.close(entry[0])
            del self._umasks[pid]
        try:
            pidfd = os.pidfd_open(pid, notify.PIDFD_THREAD)  # first: see _umask_call
        except OSError:
            pidfd = -1  # no thread pidfds (before 6.9): no cache
        tgid, umask, threads = self._status(pid)
        if pidfd >= 0:
            if threads == 1:
                if len(self._umasks) >= 1024:
                    self._sweep_umasks()
                self._umasks[pid] = (pidfd, tgid, umask)
            else:
                os.close(pidfd)
        return umask

    def _sweep_umasks(self) -> None:
        for tid, (pidfd, _tgid, _umask) in list(self._umasks.items()):
            if not self._alive(pidfd):
                os.close(pidfd)
                del self._umasks[tid]

    def _umask_call(self, lfd: int, nid: int, pid: int, a: Args) -> None:
        """umask(2): note the new value for every cached thread of the process, then let
        the kernel run it. CONTINUE is safe here: the argument is a register, no memory.
        """
        new = a[0] & 0o777
        entry = self._umasks.get(pid)
        try:
            tgid = entry[1] if entry is not None else self._tgid(pid)
        except OSError:
            tgid = -1  # gone: nothing cached can be its
        for tid, (pidfd, group, _old) in list(self._umasks.items()):
            if group == tgid:
                self._umasks[tid] = (pidfd, group, new)
        notify.send_continue(lfd, nid)

    def _base(self, pid: int, dirfd: int, path: bytes, resolve: int = 0) -> int:
        """An fd ``path`` starts from: the root, or a copy of the target's cwd or dirfd."""
        if path[:1] == b"/" and not resolve & RESOLVE_SCOPED:
            return self.root
        dirfd &= 0xFFFF_FFFF
        if dirfd == AT_FDCWD:
            return os.open(procfs.cwd_path(pid), _DIR_PATH)
        if dirfd >= 0x8000_0000:
            raise _err(errno.EBADF)
        try:
            fd = os.open(procfs.fd_path(pid, dirfd), O_PATH | O_CLOEXEC)
        except FileNotFoundError:
            raise _err(errno.EBADF) from None
        if path and not stat.S_ISDIR(os.fstat(fd).st_mode):
            os.close(fd)
            raise _err(errno.ENOTDIR)  # a pipe or a file as the starting directory
        return fd

    def _close_base(self, fd: int) -> None:
        if fd != self.root:
            os.close(fd)

    def _parent(self, pid: int, base: int, path: bytes, resolve: int = 0) -> _Parent:
        """Resolve everything but the last component of ``path`` from ``base``."""
        if not path:
            raise _err(errno.ENOENT)
        end = len(path)
        while end > 1 and path[end - 1] == 0x2F:  # trailing slashes
            end -= 1
        trailing = end != len(path)
        cut = path.rfind(b"/", 0, end)
        name = path[cut + 1 : end]
        if cut < 0:
            fd, owned = base, False
        elif cut == 0 and not resolve & RESOLVE_SCOPED:
            fd, owned = self.root, False
        else:
            fd = self.openat2(base, path[: cut or 1], _DIR_PATH, 0, resolve | RESOLVE_NO_MAGICLINKS)
            owned = True
        try:
            abs_path = "/" if fd == self.root else procfs.fd_link(fd)
            if not abs_path.startswith("/") or abs_path.endswith(" (deleted)"):
                raise _err(errno.ENOENT)  # removed, or outside our root: nothing to create in
            in_proc = abs_path == "/proc" or abs_path.startswith("/proc/")
            if in_proc:
                fd, owned, name, abs_path = self._procfs(pid, fd, owned, name, abs_path)
        except BaseException:
            if owned:
                os.close(fd)
            raise
        return _Parent(fd, owned, name, abs_path=abs_path, trailing=trailing, in_proc=in_proc)

    def _procfs(
        self, pid: int, fd: int, owned: bool, name: bytes, abs_path: str
    ) -> tuple[int, bool, bytes, str]:
        """Make a /proc parent mean the target's /proc, never the supervisor's."""
        parts = abs_path.split("/")  # ["", "proc", entry, ...]
        if len(parts) == 2:  # the /proc directory itself: the last name is the entry
            if name == b"self":
                name = b"%d" % self._tgid(pid)
            elif name == b"thread-self":
                tgid = self._tgid(pid)
                new = f"/proc/{tgid}/task"
                nfd = self.openat2(self.root, new.encode(), _DIR_PATH, 0, RESOLVE_NO_MAGICLINKS)
                if owned:
                    os.close(fd)
                return nfd, True, b"%d" % pid, new
            if name.isdigit() and int(name) not in (pid, self._tgid(pid)):
                raise _err(errno.EACCES)
            return fd, owned, name, abs_path
        entry = parts[2]
        if not entry.isdigit():
            return fd, owned, name, abs_path  # /proc/sys, /proc/fs, ...: not per process
        if int(entry) == self.my_tgid:
            parts[2] = str(self._tgid(pid))
            if len(parts) > 4 and parts[3] == "task" and parts[4] == str(self.my_tid):
                parts[4] = str(pid)
            new = "/".join(parts)
            nfd = self.openat2(self.root, new.encode(), _DIR_PATH, 0, RESOLVE_NO_MAGICLINKS)
            if owned:
                os.close(fd)
            return nfd, True, name, new
        if int(entry) not in (pid, self._tgid(pid)):
            raise _err(errno.EACCES)  # another process's entries: not through us
        return fd, owned, name, abs_path

    # -- open ---------------------------------------------------------------------------

    def _open_path(
        self,
        pid: int,
        base: int,
        path: bytes,
        *,
        flags: int,
        mode: int,
        resolve: int,
        depth: int = 0,
    ) -> int:
        """Open ``path`` from ``base`` as the target's open would; return our fd."""
        parent = self._parent(pid, base, path, resolve)
        try:
            return self._open_in(
                pid, base, parent, flags=flags, mode=mode, resolve=resolve, depth=depth
            )
        finally:
            parent.close()

    def _open_in(
        self,
        pid: int,
        base: int,
        parent: _Parent,
        *,
        flags: int,
        mode: int,
        resolve: int,
        depth: int,
    ) -> int:
        creating = bool(flags & O_CREAT)
        name = parent.name
        if not flags & O_PATH and (
            creating or flags & (os.O_ACCMODE | os.O_TRUNC | _O_TMPFILE_BIT)
        ):
            self._writes(parent)
        if parent.special():
            if creating:
                raise _err(errno.EISDIR)
            tmp_mode = self._tmpfile_mode(pid, flags, mode)  # O_TMPFILE in "." or ".."
            return self.openat2(parent.fd, name or b".", flags | O_CLOEXEC, tmp_mode, resolve)
        if parent.trailing:
            if creating:
                raise _err(errno.EISDIR)
            name += b"/"
        if parent.in_proc:
            # Nothing can be created in procfs. Below /proc/<target> the magic links
            # are the target's own, so the kernel may follow them; the symlinks of
            # /proc itself (self, mounts, net) point at the reader, so they are
            # followed below, by text, and land in the target's entry again.
            if creating and flags & O_EXCL and _exists(parent.fd, name):
                raise _err(errno.EEXIST)  # a magic link is a name that exists
            # (with O_TMPFILE, O_EXCL means "never linkable": it stays)
            flags &= ~(O_CREAT if flags & _O_TMPFILE_BIT else O_CREAT | O_EXCL)
            tmp_mode = self._tmpfile_mode(pid, flags, mode)  # a magic link's directory
            if parent.abs != "/proc":
                if resolve & (RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS):
                    flags |= O_NOFOLLOW
                elif (
                    not flags & (os.O_NONBLOCK | O_PATH | O_NOFOLLOW)
                    and flags & os.O_ACCMODE != os.O_RDWR
                ):
                    # A magic link to a FIFO (an O_PATH fd of one) waits like the FIFO.
                    # The target's fd table is not trapped (a thread may dup2 a FIFO
                    # onto it at any time): pin what it names now and open only that.
                    # With O_NOFOLLOW the open below fails on the link (ELOOP), as it would.
                    pin = self.openat2(parent.fd, name, O_PATH | O_CLOEXEC, 0, 0)
                    return self._open_pinned(pin, flags, tmp_mode, creating=creating)
                fd = self.openat2(parent.fd, name, flags | O_CLOEXEC, tmp_mode, 0)
                if creating and stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.close(fd)
                    raise _err(errno.EISDIR)  # O_CREAT on a directory, as in the kernel
                return fd
            creating = False
        if creating:
            self._check(parent.path(), parent_fd=parent.fd)
        if flags & _O_TMPFILE_BIT:
            _no_set_id(mode)
        if creating or flags & _O_TMPFILE_BIT:
            os.umask(self._umask(pid))
        else:
            mode = 0
        if creating and flags & O_EXCL:
            _no_set_id(mode)
            return self.openat2(parent.fd, name, flags | O_CLOEXEC, mode, 0)  # never follows
        follow = not (flags & O_NOFOLLOW or resolve & RESOLVE_NO_SYMLINKS)
        plain = (flags & ~O_CREAT) | O_NOFOLLOW | O_CLOEXEC
        plain_mode = mode if flags & _O_TMPFILE_BIT else 0
        waits = not flags & (os.O_NONBLOCK | O_PATH | _O_TMPFILE_BIT) and (
            flags & os.O_ACCMODE != os.O_RDWR
        )
        for _attempt in range(8):
            if waits:
                self._no_fifo(parent.fd, name)
            try:
                fd = self.openat2(parent.fd, name, plain, plain_mode, 0)
            except OSError as exc:
                if exc.errno == errno.ENOENT and creating:
                    _no_set_id(mode)
                    try:
                        return self.openat2(parent.fd, name, flags | O_EXCL | O_CLOEXEC, mode, 0)
                    except FileExistsError:
                        continue  # it appeared meanwhile: open it instead
                if not (follow and exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR)):
                    raise
                link = self._readlink(parent.fd, parent.name)
                if link is None:
                    raise
            else:
                kind = os.fstat(fd).st_mode
                if creating and stat.S_ISDIR(kind):  # O_CREAT on a directory, any access
                    os.close(fd)
                    raise _err(errno.EISDIR)
                if not (flags & O_PATH and follow and stat.S_ISLNK(kind)):
                    return fd
                os.close(fd)
                link = self._readlink(parent.fd, parent.name)
                if link is None:
                    continue  # no longer a symlink: open what is there now
            return self._follow(
                pid, base, parent, link, flags=flags, mode=mode, resolve=resolve, depth=depth
            )
        raise _err(errno.EAGAIN)

    def _tmpfile_mode(self, pid: int, flags: int, mode: int) -> int:
        """The mode to open with: O_TMPFILE's is the caller's, under the caller's umask
        (set here); any other open of an existing name takes none."""
        if not flags & _O_TMPFILE_BIT:
            return 0
        _no_set_id(mode)
        os.umask(self._umask(pid))
        return mode

    @staticmethod
    def _open_pinned(pin: int, flags: int, mode: int, *, creating: bool) -> int:
        """Open what the O_PATH fd ``pin`` names with ``flags`` (no O_CREAT) and ``mode``
        (O_TMPFILE's); a FIFO goes to a worker (``_Fifo``, which then owns ``pin``)."""
        try:
            kind = os.fstat(pin).st_mode
        except BaseException:
            os.close(pin)
            raise
        if stat.S_ISFIFO(kind):
            raise _Fifo(pin)
        try:
            fd = os.open(procfs.own_fd(pin), flags | O_CLOEXEC, mode)
        finally:
            os.close(pin)
        if creating and stat.S_ISDIR(kind):
            os.close(fd)
            raise _err(errno.EISDIR)  # O_CREAT on a directory, as in the kernel
        return fd

    @staticmethod
    def _no_fifo(dirfd: int, name: bytes) -> None:
        """Raise ``_Fifo`` with a pinned fd if ``name`` is a FIFO (an open of it waits)."""
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except OSError:
            return  # the open says what is (not) there
        if stat.S_ISFIFO(st.st_mode):
            pin = os.open(name, O_PATH | O_NOFOLLOW | O_CLOEXEC, dir_fd=dirfd)
            if stat.S_ISFIFO(os.fstat(pin).st_mode):
                raise _Fifo(pin)
            os.close(pin)

    def _open_fifo_later(self, listener: int, nid: int, pin: int, flags: int) -> None:
        """Open the pinned FIFO in a thread that answers the call once the other end is
        there: waiting here would hold up every other call of the sandbox, and the
        other end may need one first (``mkfifo p; echo hi > p & wc -c > out < p``)."""
        import threading

        # its own copy: the caller may close ``listener`` (a front passes one per call)
        listener = os.dup(listener)

        def work() -> None:
            try:
                try:
                    # the pin is the FIFO itself: O_NOFOLLOW would refuse the magic link
                    reopen = flags & ~(O_CREAT | O_EXCL | O_NOFOLLOW)
                    fd = os.open(procfs.own_fd(pin), reopen | O_CLOEXEC)
                except OSError as exc:
                    self._reply(listener, nid, 0, exc.errno or errno.EIO)
                    return
                finally:
                    os.close(pin)
                try:
                    self._reply_fd(listener, nid, fd, flags)
                except OSError as exc:
                    self._reply(listener, nid, 0, exc.errno or errno.EIO)
            finally:
                os.close(listener)

        threading.Thread(target=work, name="sandhold-fifo", daemon=True).start()

    @staticmethod
    def _readlink(dirfd: int, name: bytes) -> bytes | None:
        try:
            return os.readlink(name, dir_fd=dirfd)
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOENT):
                return None  # not a symlink (any more)
            raise

    def _follow(
        self,
        pid: int,
        base: int,
        parent: _Parent,
        link: bytes,
        *,
        flags: int,
        mode: int,
        resolve: int,
        depth: int,
    ) -> int:
        """Open what the symlink ``link`` (found in ``parent``) points to, checked anew."""
        if depth >= MAX_SYMLINKS:
            raise _err(errno.ELOOP)
        if link.startswith(b"/"):
            if resolve & notify.RESOLVE_BENEATH:
                raise _err(errno.EXDEV)
            start = base if resolve & notify.RESOLVE_IN_ROOT else self.root
        else:
            start = parent.fd  # relative to the directory holding the link
        return self._open_path(
            pid, start, link, flags=flags, mode=mode, resolve=resolve, depth=depth + 1
        )

    def _reply_fd(self, listener: int, nid: int, fd: int, flags: int) -> None:
        try:
            notify.addfd_send(listener, nid, fd, bool(flags & O_CLOEXEC))
        finally:
            os.close(fd)

    def _emulate_open(
        self,
        listener: int,
        nid: int,
        pid: int,
        dirfd: int,
        path_addr: int,
        *,
        flags: int,
        mode: int,
        resolve: int = 0,
    ) -> None:
        path = self.mem.cstring(pid, path_addr)
        base = self._base(pid, dirfd, path, resolve)
        try:
            self._valid(listener, nid)
            fd = self._open_path(pid, base, path, flags=flags, mode=mode, resolve=resolve)
        except _Fifo as fifo:
            self._open_fifo_later(listener, nid, fifo.pin, flags)
            return
        finally:
            self._close_base(base)
        self._reply_fd(listener, nid, fd, flags)

    def _legacy_flags(self, flags: int, mode: int) -> tuple[int, int]:
        """open(2)/openat(2) semantics mapped onto openat2's stricter ones."""
        flags &= self.valid_open
        if flags & O_PATH:
            flags &= _O_PATH_FLAGS  # open(2) ignores the rest, O_CREAT included
        else:
            _check_create_flags(flags)
        if not flags & (O_CREAT | _O_TMPFILE_BIT):
            mode = 0
        return flags, mode & 0o7777

    def _path_only(self, lfd: int, nid: int, flags: int) -> bool:
        """open/openat with O_PATH: the kernel drops O_CREAT, so the call makes no name
        whatever the path says; its flags are a register. Let it run (an O_PATH fd cannot
        be passed back with NOTIF_ADDFD at all)."""
        if not flags & self.valid_open & O_PATH:
            return False
        notify.send_continue(lfd, nid)
        return True

    def _open(self, lfd: int, nid: int, pid: int, a: Args) -> None:
        a0, a1, a2 = a[:3]
        if self._path_only(lfd, nid, a1):
            return
        flags, mode = self._legacy_flags(a1, a2)
        self._emulate_open(lfd, nid, pid, AT_FDCWD, a0, flags=flags, mode=mode)

    def _openat(self, lfd: int, nid: int, pid: int, a: Args) -> None:
        a0, a1, a2, a3 = a[:4]
        if self._path_only(lfd, nid, a2):
            return
        flags, mode = self._legacy_flags(a2, a3)
        self._emulate_open(lfd, nid, pid, a0, a1, flags=flags, mode=mode)

    def _creat(self, lfd: int, nid: int, pid: int, a: Args) -> None:
        a0, a1 = a[:2]
        flags, mode = self._legacy_flags(O_CREAT | os.O_WRONLY | os.O_TRUNC, a1)
        self._emulate_open(lfd, nid, pid, AT_FDCWD, a0, flags=flags, mode=mode)

    def _openat2(self, lfd: int, nid: int, pid: int, a: Args) -> None:
        a0, a1, a2, a3 = a[:4]
        size = a3
        if size < notify.OPEN_HOW_SIZE_VER0:
            raise _err(errno.EINVAL)
        if size > notify.PAGE:
            raise _err(errno.E2BIG)
        raw = self.mem.read(pid, a2, size)
        if len(raw) < size:
            raise _err(errno.EFAULT)
        if raw[notify.OPEN_HOW_SIZE_VER0 :].strip(b"\0"):
            raise _err(errno.E2BIG)  # a newer struct with fields we do not know
        flags, mode, resolve = notify.OPEN_HOW.unpack_from(raw)
        if flags >> 32 or mode >> 32 or resolve & ~notify.RESOLVE_ALL:
            raise _err(errno.EINVAL)
        if resolve & RESOLVE_SCOPED == RESOLVE_SCOPED or (
            flags & O_PATH and flags & ~_O_PATH_FLAGS
        ):
            raise _err(errno.EINVAL)  # as the kernel: openat2 refuses what open(2) drops
        _check_create_flags(flags)
        if (mode and not flags & (O_CREAT | _O_TMPFILE_BIT)) or mode & ~0o7777:
            raise _err(errno.EINVAL)  # openat2 refuses a mode it would not use, or no mode
        if flags & O_PATH:
            # NOTIF_ADDFD cannot pass an O_PATH fd back, and CONTINUE would let the kernel
            # re-read open_how (a racing thread could swap O_PATH for O_CREAT): refused as
            # unsupported, so callers fall back to openat(O_PATH), which is not trapped
            raise _err(errno.ENOSYS)
        if resolve & RESOLVE_CACHED and flags & (O_CREAT | os.O_TRUNC | _O_TMPFILE_BIT):
            raise _err(errno.EAGAIN)  # as the kernel: these never resolve from the cache
        self._emulate_open(lfd, nid, pid, a0, a1, flags=flags, mode=mode, resolve=resolve)

    # -- other creating calls ------------------------------------------------------------

    def _new_name(
        self, listener: int, nid: int, pid: int, dirfd: int, path_addr: int
    ) -> tuple[int, _Parent]:
        """Read and resolve the new name of a mkdir/mknod/symlink; returns (base, parent)."""
        path = self.mem.cstring(pid, path_addr)
        base = self._base(pid, dirfd, path)
        try:
            self._valid(listener, nid)
            parent = self._parent(pid, base, path)
        except BaseException:
            self._close_base(base)
            raise
        return base, parent

    def _mkdirat(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        a0, a1, a2 = a[:3]
        base, parent = self._new_name(lfd, nid, pid, a0, a1)
        try:
            name = parent.name
            self._writes(parent)
            if not parent.special() and not parent.in_proc:
                self._check(parent.path(), directory=True, parent_fd=parent.fd)
                os.umask(self._umask(pid))
            if parent.trailing:
                name += b"/"
            os.mkdir(name or b"/", a2 & 0o7777, dir_fd=parent.fd)
            self._note_fresh(parent, parent.name)
        finally:
            parent.close()
            self._close_base(base)
        return 0

    def _mkdir(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        a0, a1 = a[:2]
        return self._mkdirat(lfd, nid, pid, (AT_FDCWD, a0, a1, 0, 0, 0))

    def _mknodat(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        a0, a1, a2, a3 = a[:4]
        base, parent = self._new_name(lfd, nid, pid, a0, a1)
        try:
            self._writes(parent)
            if parent.special() or parent.trailing:
                raise _err(errno.EEXIST if parent.special() else errno.ENOENT)
            self._check(parent.path(), parent_fd=parent.fd)
            os.umask(self._umask(pid))
            mode = a2 & 0xFFFF
            _no_set_id(mode)
            if not mode & 0o170000:  # S_IFMT: no type means a regular file
                mode |= stat.S_IFREG
            os.mknod(parent.name, mode, a3 & 0xFFFF_FFFF, dir_fd=parent.fd)
        finally:
            parent.close()
            self._close_base(base)
        return 0

    def _mknod(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        a0, a1, a2 = a[:3]
        return self._mknodat(lfd, nid, pid, (AT_FDCWD, a0, a1, a2, 0, 0))

    def _symlinkat(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        a0, a1, a2 = a[:3]
        target = self.mem.cstring(pid, a0)
        base, parent = self._new_name(lfd, nid, pid, a1, a2)
        try:
            self._writes(parent)
            if not target:
                raise _err(errno.ENOENT)  # before any check, as the kernel
            if not parent.special():
                self._check(parent.path(), parent_fd=parent.fd, link_to=target, git_own=False)
            name = parent.name + (b"/" if parent.trailing else b"")
            os.symlink(target, name or b"/", dir_fd=parent.fd)
        finally:
            parent.close()
            self._close_base(base)
        return 0

    def _symlink(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        a0, a1 = a[:2]
        return self._symlinkat(lfd, nid, pid, (a0, AT_FDCWD, a1, 0, 0, 0))

    # -- link ---------------------------------------------------------------------------------

    def _linkat(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        a0, a1, a2, a3, a4 = a[:5]
        flags = a4 & 0xFFFF_FFFF
        if flags & ~(AT_SYMLINK_FOLLOW | AT_EMPTY_PATH):
            raise _err(errno.EINVAL)
        old = self.mem.cstring(pid, a1)
        new = self.mem.cstring(pid, a3)
        empty = not old and flags & AT_EMPTY_PATH
        old_base = self.root
        if empty:
            dirfd = a0 & 0xFFFF_FFFF
            proc = procfs.cwd_path(pid) if dirfd == AT_FDCWD else procfs.fd_path(pid, dirfd)
            try:
                src = os.open(proc, O_PATH | O_CLOEXEC)  # follows the magic link: that file
            except FileNotFoundError:
                raise _err(errno.EBADF) from None
        else:
            old_base = self._base(pid, a0, old)
            src = -1
        new_base = -1
        try:
            new_base = self._base(pid, a2, new)
            self._valid(lfd, nid)
            if not empty:
                src = self._link_source(pid, old_base, old, bool(flags & AT_SYMLINK_FOLLOW))
            if src >= 0:
                st = os.fstat(src)
                if st.st_nlink == 0:  # an O_TMPFILE: naming it makes a file
                    _no_set_id(st.st_mode)
            src_path = procfs.fd_link(src) if src >= 0 else ""
            # an O_PATH fd of a symlink (O_NOFOLLOW, then AT_EMPTY_PATH) links the symlink
            src_link = _symlink_at(src, "") if src >= 0 else None
            parent = self._parent(pid, new_base, new)
            try:
                if not parent.special():
                    if src_path.startswith("/") and not src_path.endswith(" (deleted)"):
                        self._check(src_path)  # a second name for a protected file
                    self._check(parent.path(), parent_fd=parent.fd, link_to=src_link, git_own=False)
                name = parent.name + (b"/" if parent.trailing else b"")
                self._writes(parent)
                if src >= 0:
                    os.link(
                        procfs.own_fd(src),
                        name,
                        dst_dir_fd=parent.fd,
                        follow_symlinks=True,
                    )
                else:
                    self._link_nofollow(pid, old_base, old, parent, name)
            finally:
                parent.close()
        finally:
            if src >= 0:
                os.close(src)
            if new_base >= 0:
                self._close_base(new_base)
            self._close_base(old_base)
        return 0

    def _link_source(self, pid: int, base: int, old: bytes, follow: bool) -> int:
        """An O_PATH fd of what linkat's old path names, or -1 to link by name (see below)."""
        if not follow:
            return -1
        return self._open_path(pid, base, old, flags=O_PATH, mode=0, resolve=0)

    def _link_nofollow(
        self, pid: int, base: int, old: bytes, new_parent: _Parent, new: bytes
    ) -> None:
        """link(2) without following: by name from the resolved old parent."""
        parent = self._parent(pid, base, old)
        try:
            if not parent.special() and not parent.in_proc:
                self._check(parent.path())  # a second name for a protected file
            name = parent.name + (b"/" if parent.trailing else b"")
            link = _symlink_at(parent.fd, name) if name else None
            if link is not None and not new_parent.special():
                self._check(new_parent.path(), link_to=link)  # a second symlink
            os.link(
                name or b".",
                new,
                src_dir_fd=parent.fd,
                dst_dir_fd=new_parent.fd,
                follow_symlinks=False,
            )
        finally:
            parent.close()

    def _link(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        a0, a1 = a[:2]
        return self._linkat(lfd, nid, pid, (AT_FDCWD, a0, AT_FDCWD, a1, 0, 0))

    # -- rename ---------------------------------------------------------------------------

    def _renameat2(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        a0, a1, a2, a3, a4 = a[:5]
        flags = a4 & 0xFFFF_FFFF
        # before anything else, as the kernel: and a flag not known here is never passed
        # on to do what no check of this file's looked at
        if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) or (
            flags & RENAME_EXCHANGE and flags & (RENAME_NOREPLACE | RENAME_WHITEOUT)
        ):
            raise _err(errno.EINVAL)
        old = self.mem.cstring(pid, a1)
        new = self.mem.cstring(pid, a3)
        old_base = self._base(pid, a0, old)
        new_base = -1
        po: _Parent | None = None
        pn: _Parent | None = None
        try:
            new_base = self._base(pid, a2, new)
            self._valid(lfd, nid)
            po = self._parent(pid, old_base, old)
            pn = self._parent(pid, new_base, new)
            if po.in_proc or pn.in_proc:
                raise _err(errno.EXDEV)  # nothing in procfs can be renamed
            if not (po.special() or pn.special()):
                self._check_rename(po, pn, exchange=bool(flags & RENAME_EXCHANGE))
            self._writes(pn)
            notify.renameat2(
                po.fd,
                po.name + (b"/" if po.trailing else b"") or b".",
                pn.fd,
                pn.name + (b"/" if pn.trailing else b"") or b".",
                flags,
            )
        finally:
            if po is not None:
                po.close()
            if pn is not None:
                pn.close()
            if new_base >= 0:
                self._close_base(new_base)
            self._close_base(old_base)
        return 0

    def _check_rename(self, po: _Parent, pn: _Parent, *, exchange: bool) -> None:
        old_path, new_path = po.path(), pn.path()
        old_dir = self._is_dir(po)
        old_link = None if old_dir else _symlink_at(po.fd, po.name)
        self._check(
            old_path, directory=bool(old_dir), parent_fd=po.fd
        )  # moving a protected name away
        self._check(new_path, directory=bool(old_dir), parent_fd=pn.fd, link_to=old_link)
        if old_dir:
            self._check_subtree(po, new_path)
        if exchange:
            new_dir = self._is_dir(pn)
            new_link = None if new_dir else _symlink_at(pn.fd, pn.name)
            self._check(new_path, directory=bool(new_dir), parent_fd=pn.fd)
            self._check(old_path, directory=bool(new_dir), parent_fd=po.fd, link_to=new_link)
            if new_dir:
                self._check_subtree(pn, old_path)

    @staticmethod
    def _is_dir(parent: _Parent) -> bool | None:
        try:
            st = os.stat(parent.name, dir_fd=parent.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None  # the rename itself will say ENOENT
        return stat.S_ISDIR(st.st_mode)

    def _check_subtree(self, parent: _Parent, new_root: str) -> None:
        """A directory moved to ``new_root``: every name inside it gets a new path."""
        if self.decider.exempt(new_root):
            return
        # Depth first, one open directory per level: a directory with more
        # subdirectories than RLIMIT_NOFILE (node_modules) must not run out of fds.
        # A directory this user cannot list fails the rename (EACCES): unchecked names
        # must not move.
        stack: list[tuple[int, list[tuple[str, bool, bool]], str]] = []
        try:
            stack.append((*_open_listed(parent.name, parent.fd), new_root))
            while stack:
                fd, pending, where = stack[-1]
                if not pending:
                    os.close(stack.pop()[0])
                    continue
                name, is_dir, is_link = pending.pop()
                path = f"{where}/{name}"
                link = _symlink_at(fd, name) if is_link else None
                self._check(path, directory=is_dir, parent_fd=fd, link_to=link, moved=True)
                if is_dir:
                    stack.append((*_open_listed(name, fd), path))
        finally:
            for fd, _, _ in stack:
                os.close(fd)

    def _renameat(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        a0, a1, a2, a3 = a[:4]
        return self._renameat2(lfd, nid, pid, (a0, a1, a2, a3, 0, 0))

    def _rename(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        a0, a1 = a[:2]
        return self._renameat2(lfd, nid, pid, (AT_FDCWD, a0, AT_FDCWD, a1, 0, 0))

    # -- bind ---------------------------------------------------------------------------------

    def _socket_and_address(self, pid: int, a: Args) -> tuple[int, bytes]:
        """Our copy of the caller's socket (``pidfd_getfd``) and of its address, read once."""
        a1, a2 = a[1], a[2]
        pidfd = notify.pidfd_open(pid)
        try:
            sock = notify.pidfd_getfd(pidfd, a[0] & 0xFFFF_FFFF)  # EBADF first, as the kernel
        finally:
            os.close(pidfd)
        try:
            size = a2 & 0xFFFF_FFFF
            if size > SOCKADDR_MAX:
                raise _err(errno.EINVAL)
            addr = self.mem.read(pid, a1, size) if size else b""
            if len(addr) < size:
                raise _err(errno.EFAULT)
        except BaseException:
            os.close(sock)
            raise
        return sock, addr

    def _bind(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        sock, addr = self._socket_and_address(pid, a)
        try:
            # as the kernel: a non-socket (ENOTSOCK) or another family's socket
            # (EINVAL/EAFNOSUPPORT) fails whatever name the address holds
            domain = int.from_bytes(notify.getsockopt(sock, SOL_SOCKET, SO_DOMAIN, 4), "little")
            path = _unix_path(addr) if domain == AF_UNIX else b""
            if not path:  # not a filesystem name: abstract, autobind or another family
                self._valid(lfd, nid)
                notify.bind(sock, addr)
                return 0
            if len(addr) > SUN_LEN_MAX:
                raise _err(errno.EINVAL)
            base = self._base(pid, AT_FDCWD, path)
            try:
                self._valid(lfd, nid)
                parent = self._parent(pid, base, path)
                try:
                    self._writes(parent)
                    if not parent.special():
                        self._check(parent.path(), parent_fd=parent.fd, git_own=False)
                    os.umask(self._umask(pid))
                    # no bindat(2): bind relative to our (thread-private) cwd
                    os.fchdir(parent.fd)
                    name = parent.name + (b"/" if parent.trailing else b"")
                    notify.bind(sock, addr[:2] + name)  # the kernel ends sun_path itself
                finally:
                    parent.close()
            finally:
                self._close_base(base)
        finally:
            os.close(sock)
        return 0

    # -- connect (F-NET-5) ---------------------------------------------------------------

    def _connect(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        """Every connect is performed here, on a copy of the caller's socket with a copy
        of its address: letting the kernel go on would re-read both (a racing thread
        could swap the address, or dup2 a unix socket onto the fd, after the check)."""
        sock, addr = self._socket_and_address(pid, a)
        try:
            domain = int.from_bytes(notify.getsockopt(sock, SOL_SOCKET, SO_DOMAIN, 4), "little")
            path = _unix_path(addr) if domain == AF_UNIX else b""
            if not path:  # another family, an abstract name (this netns only), or invalid
                self._valid(lfd, nid)
                notify.connect(sock, addr)
                return 0
            target = self._socket_inode(lfd, nid, pid, path)
            try:
                where = procfs.fd_link(target)
                reason = creation.unix_socket_denied(self.policy, where)
                if reason is not None:
                    raise Denied(where, reason, creation.UNIX_ACTION)
                # the pinned inode itself, never a name that could be swapped meanwhile
                notify.connect(sock, addr[:2] + procfs.own_fd(target).encode() + b"\0")
            finally:
                os.close(target)
        finally:
            os.close(sock)
        return 0

    def _socket_inode(self, lfd: int, nid: int, pid: int, path: bytes) -> int:
        """An ``O_PATH`` fd of what ``path`` names for the caller, symlinks followed here."""
        base = self._base(pid, AT_FDCWD, path)
        try:
            self._valid(lfd, nid)
            parent = self._parent(pid, base, path)
            for _ in range(MAX_SYMLINKS):
                try:
                    if parent.special() or parent.trailing:
                        raise _err(errno.ECONNREFUSED)
                    fd = self.openat2(parent.fd, parent.name, O_PATH | O_NOFOLLOW | O_CLOEXEC, 0, 0)
                    mode = os.fstat(fd).st_mode
                    if not stat.S_ISLNK(mode):
                        if not stat.S_ISSOCK(mode):
                            os.close(fd)
                            raise _err(errno.ECONNREFUSED)
                        return fd
                    os.close(fd)
                    link = self._readlink(parent.fd, parent.name)
                    if not link:
                        raise _err(errno.ENOENT)
                    nxt = self._parent(pid, parent.fd, link)
                    if nxt.fd == parent.fd:  # a bare name: the same directory, one owner
                        nxt.owned, parent.owned = parent.owned, False
                finally:
                    parent.close()
                parent = nxt
            parent.close()
            raise _err(errno.ELOOP)
        finally:
            self._close_base(base)
