"""The policy check of an emulated call: the creation rules, the repository rules, reports.

Part of the emulator (``emulate.Emulator``). The decisions are pure
(``policy.creation``, ``policy.repository``, ``policy.symlinks``); this module looks up
the facts they need in the sandbox's view (the names a directory holds, which
``.git``/``.hg``/``.jj`` the run made, where a symlink leads now).

Rules:
- A refusal raises ``Denied`` (answered ``EACCES`` and reported as a ``Violation``
  by ``Emulator.handle``), before anything is made.
- A symlink is judged by every place it leads through (``policy.symlinks``) and
  by where it points as written and as resolved (creation rule 4), never by its
  text's spelling alone.
- The creation lock (``emulate.take_lock``) keeps the names looked up here as they
  are until the call is done.
"""

from __future__ import annotations

import os
import posixpath
import stat

from sandhold.backends.linux.supervisor.resolve import Parent, Resolver, exists
from sandhold.backends.linux.supervisor.violation import Violation
from sandhold.policy import creation, repository, symlinks
from sandhold.policy.refusal import Refusal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


class Denied(Exception):
    """The policy refuses ``path`` (a creation, or a unix socket connect); EACCES, reported."""

    def __init__(self, path: str, refusal: Refusal, action: str = creation.ACTION) -> None:
        super().__init__(path, refusal.rule)
        self.path = path
        self.refusal = refusal
        self.action = action


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


class Checks(Resolver):
    """The policy check of each call (module rules); state on ``emulate.Emulator``."""

    policy: creation.CreationPolicy
    decider: creation.Decider
    on_violation: Callable[[Violation], None] | None
    tag: object
    _pid: int
    _call: str
    _where: str | None
    fresh: set[tuple[int, int]]
    fresh_hg: set[tuple[int, int]]
    fresh_jj: set[tuple[int, int]]

    def _writes(self, parent: Parent) -> None:
        """The call is about to write at ``parent``'s name: if the kernel refuses it for
        want of write access there, that is a write to a read-only path, reported."""
        self._where = parent.abs if parent.special() else parent.path()

    def _report(self, denied: Denied) -> None:
        if self.on_violation is None:
            return
        self.on_violation(
            Violation(
                denied.action,
                denied.path,
                denied.refusal.rule,
                self._call,
                self._pid,
                denied.refusal.kind,
                self.tag,
            )
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
        leaving: bool = False,
    ) -> None:
        """Refuse making ``path`` (a directory; a symlink whose target is ``link_to``).

        ``parent_fd`` is the directory that would hold it: its other names decide the
        bare repository rule, and whether it is a ``.git`` made during the run (not for
        ``git_own`` False: a link or a socket is never one of git's own files there).
        ``moved``: ``path`` comes with a directory moved there, ``parent_fd`` the
        directory that brings it along. ``leaving``: ``path`` is the source of a
        rename, moved away (an existing repository's metadata may not leave).
        """
        reason: Refusal | None = None
        targets = None
        if link_to is not None and not self.decider.exempt(path):
            text = os.fsdecode(link_to)
            reason = creation.link_text_denied(text) or symlinks.kernel_tree_denied(
                symlinks.steps(posixpath.dirname(path), text, _readlink_text)
            )
            targets = _link_targets(path, link_to)
        if reason is None:
            # the environment trees' markers (creation rule 3) are looked up in this view
            reason = self.decider.denied(
                path, directory=directory, link_to=targets, exists=os.path.lexists
            )
            if reason is not None and self.fresh and git_own and parent_fd >= 0:
                # maybe git's own files in a repository made during this run (creation
                # rule 3): ``fresh`` lifts that rule only, so asking again with it changes
                # no other reason
                st = os.fstat(parent_fd)
                if (st.st_dev, st.st_ino) in self.fresh:
                    reason = self.decider.denied(
                        path,
                        directory=directory,
                        link_to=targets,
                        fresh=True,
                        exists=os.path.lexists,
                    )
        if reason is None and targets is not None:
            reason = self._repository_link(path, targets)
        if reason is None and repository.makes_repository(path, directory=directory):
            reason = self._nested_repository(path, leaving=leaving)
        if reason is None and parent_fd >= 0 and self.decider.git_dir_name(path):
            reason = self._bare_repository(path, parent_fd, moved)
        if reason is not None:
            raise Denied(path, reason)

    def _bare_repository(self, path: str, parent_fd: int, moved: bool) -> Refusal | None:
        """Why making ``path`` (a name of ``creation.GIT_DIR_NAMES``) in the directory
        ``parent_fd`` may not go ahead: it would leave a git directory there, or give
        one a config (``creation.bare_repository_denied``, over the names it holds now),
        inside the work tree of a repository that existed before the run, where git run
        on the host would take it for a repository (a bare one) and use its config. The
        creation lock keeps those names as they are until the call is done."""
        names = [n for n in creation.GIT_DIR_NAMES if exists(parent_fd, n.encode())]
        if not creation.bare_repository_denied(posixpath.basename(path), names, moved=moved):
            return None
        parent = posixpath.dirname(path)
        work = self._work_tree(parent)
        if work is not None:
            return repository.bare_repository_reason(work)
        below = repository.above_work_tree(parent, self.policy.work_trees)
        return (
            None if below is None else repository.above_work_tree_reason(parent, below, bare=True)
        )

    def _nested_repository(self, path: str, *, leaving: bool = False) -> Refusal | None:
        """Why a new repository at ``path`` (its ``.git``, ``.hg`` or ``.jj``) may not be
        made: it lies in the work tree of a git, hg or jj repository that existed before
        the run, where the host runs git, hg or jj (a shell prompt's ``git status``) and
        would use the new one instead: a new git one's config, which the sandbox wrote.
        A new ``.hg`` or ``.jj`` gets no config (creation rule 3), but hg or jj on the
        host would still take it for your repository there (``hg commit`` into it; ``jj
        git push`` runs git in the git repository a new ``.jj`` keeps, with its
        hooks).

        A work tree found at launch (``policy.work_trees``) stays one when its
        metadata is gone (moved away, removed): a new one there is refused, and so is
        moving it away (``leaving``). The name as it is now (a ``mkdir`` of it that
        will fail ``EEXIST``, a rename onto it) is no new repository in its own
        directory: that directory counts only as it would without it."""
        if self.decider.exempt(path):
            return None
        parent = posixpath.dirname(path)
        here = not leaving and os.path.lexists(path)
        work = self._work_tree(parent, skip=path, own=parent if here else "")
        if work is not None:
            return repository.nested_repository_reason(work)
        # above one: the host's git would walk up to it (repository rules)
        below = repository.above_work_tree(parent, self.policy.work_trees)
        return None if below is None else repository.above_work_tree_reason(parent, below)

    def _repository_link(self, path: str, targets: tuple[str, ...]) -> Refusal | None:
        """Why a symlink at ``path`` may not lead to ``targets``: inside the work tree of
        a repository that existed before the run, one that leads out of it to where the
        sandbox may make names would let git on the host, following it, find a
        repository the sandbox made there (the same as making one inside)."""
        work = self._work_tree(posixpath.dirname(path))
        if work is None:
            return None
        return repository.repository_link_denied(work, targets, self.decider.may_make)

    def _work_tree(self, start: str, skip: str = "", own: str = "") -> str | None:
        """The nearest of ``start`` and its ancestors holding a ``.git`` (a directory or a
        gitfile), a ``.hg`` or a ``.jj`` that the supervisor did not make during this run
        (one moved away and back is no fresh one). Looked up in the sandbox's view;
        existing ``.git`` names are rename guarded, a ``.hg`` or ``.jj`` only when it
        holds a protected name (a ``.jj`` of jj's git backend always does, its
        ``git_target``): moved away, it leaves a directory hg or jj no longer takes for
        a repository, and no ``.hg`` or ``.jj`` made in its place gets a config. The
        repositories the host saw at launch count too (``policy.work_trees``: a
        ``denyRead`` may hide them from this view, and their metadata may be gone),
        but ``own``, the directory of the name ``skip`` that is asked about."""
        made = {".git": self.fresh, ".hg": self.fresh_hg, ".jj": self.fresh_jj}

        def holds_repository(at: str) -> bool:
            for name in repository.REPOSITORY_DIRS:
                repo = posixpath.join(at, name)
                try:
                    st = os.lstat(repo)
                except OSError:
                    continue
                if repo != skip and (st.st_dev, st.st_ino) not in made[name]:
                    return True
            return False

        known = [w for w in self.policy.work_trees if w != own]
        return repository.work_tree(start, known, holds_repository)

    def _note_fresh(self, parent: Parent, name: bytes) -> None:
        """After a mkdir: remember a new ``.git``, ``.hg`` or ``.jj``, and the ``hooks``
        made inside a new ``.git``."""
        try:
            in_fresh_git = False
            if name == b"hooks" and self.fresh:
                st = os.fstat(parent.fd)
                in_fresh_git = (st.st_dev, st.st_ino) in self.fresh
            kind = repository.fresh_kind(os.fsdecode(name), in_fresh_git=in_fresh_git)
            if kind is None:
                return
            st = os.stat(name, dir_fd=parent.fd, follow_symlinks=False)
        except OSError:
            return
        if stat.S_ISDIR(st.st_mode):
            made = {".hg": self.fresh_hg, ".jj": self.fresh_jj}.get(kind, self.fresh)
            made.add((st.st_dev, st.st_ino))
