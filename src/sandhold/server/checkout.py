"""A run's own checkout, and the host-side checks of a registered one (I/O).

Rules:
- A registered repository is checked on the host without following symlinks:
  each component of its path is a real directory (``lstat``), and ``.git`` in
  it is a directory (a ``.git`` file, a worktree's or a submodule's, points at
  metadata elsewhere that the run could not be kept away from).
- A run's checkout is ``git clone --shared`` of the registered one: its objects
  are borrowed read-only (the registered ``.git`` is bound read-only and
  protected in the sandbox), everything else — refs, config, hooks, index, work
  tree — is the run's own. The clone runs with hooks and fsmonitor off and no
  system or global config, so nothing from outside the registered repository
  runs on the host.
- A checkout is removed without following the symlinks the run left in it.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable


class CheckoutError(Exception):
    pass


def registered_repo_problem(path: str) -> str | None:
    """Why ``path`` (already in its plain spelling) is not a checkout to register, or None."""
    current = ""
    for part in path[1:].split("/"):
        current = f"{current}/{part}"
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return f"does not exist ({current} is missing)"
        except OSError as exc:
            return f"cannot be read ({current}: {exc.strerror})"
        if stat.S_ISLNK(st.st_mode):
            return f"passes through a symlink ({current}); register the real path"
        if not stat.S_ISDIR(st.st_mode):
            return f"is not a directory ({current})"
    try:
        st = os.lstat(os.path.join(path, ".git"))
    except FileNotFoundError:
        return "is not the top of a git work tree (no .git in it)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return (
            "has a .git that is not a directory (a worktree or submodule pointer): "
            "register the main checkout"
        )
    return None


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", GIT_TERMINAL_PROMPT="0")
    return env


def make_checkout(repo: str, dest: str, branch: str) -> None:
    """Clone ``repo`` into ``dest`` (which must not exist) on a new ``branch``.

    Raises:
        CheckoutError: git failed; its message says why. ``dest`` is removed.
    """
    argv = [
        "git",
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "core.fsmonitor=false",
        "clone",
        "--shared",
        "--quiet",
        repo,
        dest,
    ]
    try:
        done = subprocess.run(
            argv, env=_git_env(), capture_output=True, text=True, timeout=300, check=False
        )
        if done.returncode == 0:
            done = subprocess.run(
                [
                    "git",
                    "-c",
                    "core.hooksPath=/dev/null",
                    "-C",
                    dest,
                    "checkout",
                    "-q",
                    "-b",
                    branch,
                ],
                env=_git_env(),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        remove_checkout(dest)
        raise CheckoutError(f"git clone of {repo} failed: {exc}") from None
    if done.returncode != 0:
        remove_checkout(dest)
        raise CheckoutError(f"git clone of {repo} failed: {done.stderr.strip()[-500:]}")


def remove_checkout(path: str) -> None:
    """Remove a run's checkout; symlinks in it are removed, never followed
    (``shutil.rmtree`` works through directory fds on Linux)."""
    if not os.path.lexists(path):
        return

    def retry(func: Callable[[str], object], p: str, _exc: object) -> None:
        # a run may leave a directory without write or search permission
        try:
            os.chmod(os.path.dirname(p), 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)
