"""The host's side of ``git.allowConfig``: after a run, the changes it made to its
private copy of a repository's config, applied where ``policy.gitchanges`` allows.

Rules:
- Only the host's own git reads and writes here, with no config of the sandbox's in
  play: no system or user config, no repository found from the working directory
  (``--git-dir`` names one that does not exist), an environment of its own. Reading
  the copy (``git config --file <copy> --list -z``) follows no include and runs
  nothing; writing is ``git config --file <real config>``, one key at a time.
- What the run started from is the snapshot taken at launch (``<copy>.orig``), so a
  change the host made to the real config meanwhile stays, but for a key the run
  changed too.
- One line per change, applied or refused (the refusal names the rule and the
  setting); a copy git cannot read, larger than ``gitconfig.MAX_BYTES`` or with more
  than ``MAX_CHANGES`` changed keys applies nothing, said.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Sequence

    from sandhold.policy.gitchanges import Change


MAX_CHANGES = 200
"""The most keys one run's copy may change: past that nothing is applied (a run that
writes thousands is no ``git remote add``, and each would be a line)."""


def copy_name(session_dir: str, index: int) -> str:
    """Where the run's copy of its ``index``-th repository config lies."""
    return f"{session_dir}/gitconfig-{index}"


def _git(session_dir: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    import shutil
    import subprocess

    git = shutil.which("git") or "git"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": session_dir,
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    return subprocess.run(
        [git, f"--git-dir={session_dir}/no-repository", "config", *args],
        cwd=session_dir,
        env=env,
        capture_output=True,
        timeout=30,
        check=False,
    )


def _listing(session_dir: str, path: str) -> list[tuple[str, str]] | None:
    from sandhold.policy.gitchanges import listed
    from sandhold.policy.gitconfig import MAX_BYTES

    try:
        if os.path.getsize(path) > MAX_BYTES:
            return None
    except OSError:
        return None
    r = _git(session_dir, "--no-includes", "--file", path, "--list", "-z")
    return listed(r.stdout) if r.returncode == 0 else None


def _apply(session_dir: str, path: str, change: Change) -> str | None:
    """Write one change into ``path``; what git said if it failed, else None."""
    r = _git(session_dir, "--file", path, "--unset-all", change.key)
    if r.returncode not in (0, 5):  # 5: the key was not set
        return r.stderr.decode(errors="replace").strip()
    for value in change.values:
        r = _git(session_dir, "--file", path, "--add", change.key, value)
        if r.returncode != 0:
            return r.stderr.decode(errors="replace").strip()
    return None


def apply_changes(
    configs: Sequence[str],
    session_dir: str,
    patterns: Sequence[str],
    say: Callable[[str], None],
) -> None:
    """Apply what each run's copy changed and ``patterns`` (``git.allowConfig``) allow
    to the real config, in ``configs`` order; ``say`` gets one line per change."""
    from sandhold.policy.gitchanges import changes, decide, describe

    for i, path in enumerate(configs):
        copy = copy_name(session_dir, i)
        if not os.path.exists(f"{copy}.orig"):
            continue  # the launch failed before the copies were made: nothing ran
        before = _listing(session_dir, f"{copy}.orig")
        after = _listing(session_dir, copy)
        if before is None or after is None:
            say(f"git config of {path}: the run left a config git cannot read: nothing applied")
            continue
        made = changes(before, after)
        if len(made) > MAX_CHANGES:
            say(
                f"git config of {path}: the run changed {len(made)} keys, more than "
                f"{MAX_CHANGES}: nothing applied"
            )
            continue
        for change in made:
            decision = decide(change, patterns)
            what = describe(change)
            if not decision.applied:
                say(f"git config of {path}: refused {what}: {decision.reason}")
                continue
            failed = _apply(session_dir, path, change)
            if failed is None:
                say(f"git config of {path}: applied {what}")
            else:
                say(f"git config of {path}: could not apply {what}: {failed}")
