"""What makes a directory a git directory: a leaf of names and tests that the plan
(``fsplan``) and the creation rules (``creation``) share, so neither imports the other
for them.

Rules: decided on names alone, and never looser than git's own test (setup.c
``is_git_directory``).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Collection


GIT_DIR_CONFIG: tuple[str, ...] = ("config", "config.worktree", "hooks", "commondir")
"""The names in a git directory that git reads as config or runs: its ``config`` (and,
with ``extensions.worktreeConfig``, ``config.worktree``), its ``hooks``, and
``commondir``, which names the directory whose config, hooks, objects and refs it uses."""

GIT_DIR_NAMES: tuple[str, ...] = ("HEAD", "refs", *GIT_DIR_CONFIG)
"""The names whose making may leave a directory a git directory, or give one a config
(``bare_repository_denied``): only when one of them is made does the supervisor look at
the other names of its directory (rule 3)."""


def git_directory(names: Collection[str]) -> bool:
    """git may take a directory holding ``names`` for a git directory (a repository).

    git's test (setup.c ``is_git_directory``): a valid ``HEAD`` in the directory, and
    ``objects`` and ``refs`` that ``access(X_OK)`` passes in its common directory: the
    one its ``commondir`` file names, else the directory itself. Decided on names alone,
    so never looser than git:

    - any kind of entry counts (git follows symlinks, a ``HEAD`` is valid or not by
      what it holds, and a ``chmod``, which nothing watches, makes a file pass
      ``access(X_OK)``);
    - ``HEAD`` and ``commondir`` are enough: what ``commondir`` names may be any
      directory, and get ``objects``, ``refs`` and a ``config`` at any time;
    - ``objects`` is not needed: ``GIT_OBJECT_DIRECTORY`` in the environment of the
      git that runs there stands in for it.
    """
    return "HEAD" in names and ("refs" in names or "commondir" in names)
