"""The ``none`` backend: no isolation, but still a scrubbed environment (F-BE-3)."""

from __future__ import annotations

from sandhold.backends.process import run_supervised
from sandhold.errors import LaunchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandhold.policy.cliplan import LaunchPlan


def run_none(plan: LaunchPlan, executable: str) -> int:
    """Run the plan's command directly on the host; returns its exit status.

    Raises:
        LaunchError: the command could not be started.
    """
    import os

    try:
        os.chdir(plan.cwd)
        return run_supervised(executable, plan.command, dict(plan.environment))
    except OSError as exc:
        raise LaunchError("none", "exec", f"{plan.command[0]}: {exc.strerror}") from exc
