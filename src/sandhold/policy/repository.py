"""What makes a directory a repository's work tree, and the rules that protect one (no I/O).

The creation rules' part that needs the disk (creation rule 3, the supervisor's part):
which directory is the work tree of a repository that existed before the run. The
supervisor looks the names up in the sandbox's view and hands them in; the rules
and their reasons live here.

Rules (F-BE-5):
- A directory is the work tree of a repository when it holds a ``.git`` (a directory
  or a gitfile), a ``.hg`` or a ``.jj`` (``REPOSITORY_DIRS``). One the supervisor made
  during the run is no repository of the user's (``fresh``): the work tree of a
  repository is the nearest of a path and its ancestors that holds one that is not
  fresh, or that the host saw at launch (``CreationPolicy.work_trees``: a ``denyRead``
  may hide it from the sandbox's view).
- Nested repository: a new ``.git``, ``.hg`` or ``.jj`` directory inside such a work
  tree is refused (git, hg or jj run there on the host would use the new one).
- Bare repository: inside such a work tree, a name whose making leaves its directory a
  git directory, or gives one a config (``creation.bare_repository_denied``), is
  refused.
- Repository link: inside such a work tree, a symlink that leads out of it to where
  the sandbox may make names is refused (git on the host, following it, would find a
  repository made there).
- Above a work tree (issue 16): git, hg and jj look for a repository in each
  ancestor of the directory they start in, until they find one that is valid; a
  sandbox that damages one (garbage in ``.git/HEAD``, its ``.hg`` moved away for a
  while) would have the host's next ``git status`` there walk on up. So below a
  writable root, in a directory that holds the work tree of a repository that
  existed before the run (``above_work_tree``; ``FsPlan.work_trees``, found at
  launch, so one whose metadata is moved away still counts), no new repository is
  made (a ``.git``, ``.hg`` or ``.jj`` directory), nor a bare one.
- Remembered as fresh (``fresh_kind``): a ``.git``, ``.hg`` or ``.jj`` directory made
  during the run, and the ``hooks`` directory made inside a fresh ``.git``.
"""

from __future__ import annotations

import posixpath

from sandhold.policy import paths
from sandhold.policy.refusal import REPOSITORY, Refusal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection

REPOSITORY_DIRS: tuple[str, ...] = (".git", ".hg", ".jj")
"""The names that make the directory holding them a work tree (git, hg, jj)."""


def makes_repository(path: str, *, directory: bool) -> bool:
    """Making ``path`` (a directory or not) makes a new repository there."""
    return directory and posixpath.basename(path) in REPOSITORY_DIRS


def work_tree(
    start: str, known: Collection[str], holds_repository: Callable[[str], bool]
) -> str | None:
    """The nearest of ``start`` and its ancestors that is the work tree of a repository
    that existed before the run (module rules), or None.

    Args:
        start: absolute and normalised.
        known: the work trees the host saw at launch (``CreationPolicy.work_trees``).
        holds_repository: ``holds_repository(directory)`` is whether ``directory``
            holds a name of ``REPOSITORY_DIRS`` now that was not made during the run
            (the caller's host fact).
    """
    at = start
    while True:
        if at in known or holds_repository(at):
            return at
        if at == "/":
            return None
        at = posixpath.dirname(at)


def above_work_tree(directory: str, known: Collection[str]) -> str | None:
    """A work tree of ``known`` that ``directory`` holds (strictly below it), or None:
    git, hg or jj started there would walk up to ``directory`` once its own
    repository is damaged (module rules). The first in sorted order, for a stable
    reason."""
    for work in sorted(known):
        if work != directory and paths.is_within(work, directory):
            return work
    return None


def above_work_tree_reason(directory: str, work: str, *, bare: bool = False) -> Refusal:
    """Why a repository (``bare``: a bare one) may not be made in ``directory``."""
    what = "a git directory (HEAD with refs or commondir)" if bare else "a repository"
    return Refusal(
        REPOSITORY,
        f"mandatory: {what} in {directory}, above the work tree of {work} (git, hg or "
        "jj run there on the host would walk up to it once that repository is damaged)",
    )


def nested_repository_reason(work: str) -> Refusal:
    """Why a new repository may not be made inside the work tree ``work``."""
    return Refusal(
        REPOSITORY,
        f"mandatory: a repository inside the work tree of {work} (git, hg or jj run "
        "there on the host would use it)",
    )


def bare_repository_reason(work: str) -> Refusal:
    """Why a name that leaves a git directory may not be made inside ``work``."""
    return Refusal(
        REPOSITORY,
        f"mandatory: a git directory (HEAD with refs or commondir) inside the work tree "
        f"of {work} (git run there on the host would take it for a repository)",
    )


def repository_link_denied(
    work: str, targets: Collection[str], may_make: Callable[[str], bool]
) -> Refusal | None:
    """Why a symlink inside the work tree ``work`` may not lead to ``targets`` (absolute,
    normalised), or None; ``may_make(path)``: the sandbox may make names there
    (``creation.Decider.may_make``)."""
    for target in targets:
        if not paths.is_within(target, work) and may_make(target):
            return Refusal(
                REPOSITORY,
                f"mandatory: a symlink inside the work tree of {work} to {target}, "
                "where a repository could be made (git on the host would use it)",
            )
    return None


def fresh_kind(name: str, *, in_fresh_git: bool) -> str | None:
    """Which of the run's own repositories a directory ``name`` just made counts among:
    ``".git"``, ``".hg"``, ``".jj"``, ``"hooks"`` (counted with the ``.git`` ones,
    made directly inside a fresh ``.git``: ``in_fresh_git``), or None."""
    if name in REPOSITORY_DIRS:
        return name
    if name == "hooks" and in_fresh_git:
        return "hooks"
    return None
