"""The calls that make names other than by opening: mkdir, mknod, symlink, link, rename.

Part of the emulator (``emulate.Emulator``).

Rules:
- None of them follows its last component; each runs relative to the resolved
  parent's fd with that component only.
- A rename or link is checked at both ends: moving a protected name away is
  making it anew elsewhere, a second name for a protected file is refused, and a
  moved symlink is judged where it lands.
- A directory rename checks every name of the subtree it moves first, under the
  creation lock, one open directory per level; a directory this user cannot list
  fails the rename (EACCES): unchecked names must not move.
- New files are never set-user-ID or set-group-ID (``resolve.no_set_id``).
- git's rename of ``config.lock`` over a config the run writes as its private copy
  (``CreationPolicy.config_copies``, ``git.allowConfig``) is carried out as a copy
  into the file bound there (a mount point cannot be renamed over), then the lock is
  removed: git sees its rename succeed and reads its change back; the real config,
  under the bind, is never written.
"""

from __future__ import annotations

import errno
import os
import stat

from sandhold.backends.linux import procfs
from sandhold.backends.linux.supervisor import notify
from sandhold.backends.linux.supervisor.opens import Opens
from sandhold.backends.linux.supervisor.resolve import (
    AT_FDCWD,
    O_CLOEXEC,
    O_DIRECTORY,
    O_NOFOLLOW,
    O_PATH,
    Parent,
    err,
    no_set_id,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandhold.backends.linux.supervisor.resolve import Args


AT_SYMLINK_FOLLOW = 0x400
AT_EMPTY_PATH = 0x1000
RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT = 1 << 0, 1 << 1, 1 << 2
_DIR_READ = os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC


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


def _symlink_at(dirfd: int, name: bytes | str) -> bytes | None:
    """The target of the symlink ``name`` in ``dirfd``, or None when it is none."""
    try:
        return os.readlink(os.fsencode(name), dir_fd=dirfd)
    except OSError:
        return None


class Names(Opens):
    """mkdir, mknod, symlink, link, rename (module rules)."""

    def _new_name(
        self, listener: int, nid: int, pid: int, dirfd: int, path_addr: int
    ) -> tuple[int, Parent]:
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
                raise err(errno.EEXIST if parent.special() else errno.ENOENT)
            self._check(parent.path(), parent_fd=parent.fd)
            os.umask(self._umask(pid))
            mode = a2 & 0xFFFF
            no_set_id(mode)
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
                raise err(errno.ENOENT)  # before any check, as the kernel
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

    def _linkat(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        a0, a1, a2, a3, a4 = a[:5]
        flags = a4 & 0xFFFF_FFFF
        if flags & ~(AT_SYMLINK_FOLLOW | AT_EMPTY_PATH):
            raise err(errno.EINVAL)
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
                raise err(errno.EBADF) from None
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
                    no_set_id(st.st_mode)
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
        self, pid: int, base: int, old: bytes, new_parent: Parent, new: bytes
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

    def _renameat2(self, lfd: int, nid: int, pid: int, a: Args) -> int:
        a0, a1, a2, a3, a4 = a[:5]
        flags = a4 & 0xFFFF_FFFF
        # before anything else, as the kernel: and a flag not known here is never passed
        # on to do what no check of this file's looked at
        if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) or (
            flags & RENAME_EXCHANGE and flags & (RENAME_NOREPLACE | RENAME_WHITEOUT)
        ):
            raise err(errno.EINVAL)
        old = self.mem.cstring(pid, a1)
        new = self.mem.cstring(pid, a3)
        old_base = self._base(pid, a0, old)
        new_base = -1
        po: Parent | None = None
        pn: Parent | None = None
        try:
            new_base = self._base(pid, a2, new)
            self._valid(lfd, nid)
            po = self._parent(pid, old_base, old)
            pn = self._parent(pid, new_base, new)
            if po.in_proc or pn.in_proc:
                raise err(errno.EXDEV)  # nothing in procfs can be renamed
            self._writes(pn)
            if flags == 0 and self._config_copy(po, pn):
                return 0
            if not (po.special() or pn.special()):
                self._check_rename(po, pn, exchange=bool(flags & RENAME_EXCHANGE))
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

    def _config_copy(self, po: Parent, pn: Parent) -> bool:
        """``config.lock`` renamed over a config copy: copied into it (module rules).
        False: not that rename, decided as any other."""
        copies = self.policy.config_copies
        if not copies or po.special() or pn.special() or po.trailing or pn.trailing:
            return False
        new = pn.path()
        if new not in copies or po.path() != f"{new}.lock":
            return False
        from sandhold.policy.gitconfig import MAX_BYTES

        src = os.open(po.name, os.O_RDONLY | O_NOFOLLOW | O_CLOEXEC, dir_fd=po.fd)
        try:
            if not stat.S_ISREG(os.fstat(src).st_mode):
                raise err(errno.EINVAL)
            data = b""
            while chunk := os.read(src, 1 << 16):
                data += chunk
                if len(data) > MAX_BYTES:
                    raise err(errno.EFBIG)
        finally:
            os.close(src)
        dst = os.open(pn.name, os.O_WRONLY | os.O_TRUNC | O_NOFOLLOW | O_CLOEXEC, dir_fd=pn.fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(dst, view) :]
        finally:
            os.close(dst)
        os.unlink(po.name, dir_fd=po.fd)
        return True

    def _check_rename(self, po: Parent, pn: Parent, *, exchange: bool) -> None:
        old_path, new_path = po.path(), pn.path()
        old_dir = self._is_dir(po)
        old_link = None if old_dir else _symlink_at(po.fd, po.name)
        # moving a protected name away (a repository's metadata: ``leaving``)
        self._check(old_path, directory=bool(old_dir), parent_fd=po.fd, leaving=True)
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
    def _is_dir(parent: Parent) -> bool | None:
        try:
            st = os.stat(parent.name, dir_fd=parent.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None  # the rename itself will say ENOENT
        return stat.S_ISDIR(st.st_mode)

    def _check_subtree(self, parent: Parent, new_root: str) -> None:
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
