"""What this Linux kernel lets the creation-time supervisor do: host facts, read once asked.

Rules:
- Facts only, no decisions: ``supervisor_blocker`` says why the supervisor cannot
  run here, and the plans (``policy.cliplan``, ``policy.specplan``) decide what a
  launch that needs it does then (it is refused, saying so: F-BE-5).
- A fact that cannot be read is taken on the strict side: no user notification,
  or the strictest Yama scope, never a permission the kernel may not give.
- Cheap: ``os`` only, so the CLI's start can ask.
"""

from __future__ import annotations

SECCOMP_ACTIONS = "/proc/sys/kernel/seccomp/actions_avail"
YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"


def seccomp_actions() -> list[bytes]:
    """The seccomp filter return actions this kernel offers ([] without seccomp)."""
    try:
        with open(SECCOMP_ACTIONS, "rb") as f:
            return f.read().split()
    except OSError:
        return []


def user_notification() -> bool:
    """The kernel offers seccomp user notification (the creation-time supervisor needs it)."""
    return b"user_notif" in seccomp_actions()


def yama_ptrace_scope() -> int:
    """Yama's ``kernel.yama.ptrace_scope`` (0 without Yama). From 1 on only an ancestor
    of a process may read its memory (``process_vm_readv``) or take its fds
    (``pidfd_getfd``), as the supervisor does; from 2 on, no ordinary process may."""
    try:
        with open(YAMA_SCOPE, "rb") as f:
            return int(f.read().strip())
    except OSError:
        return 0  # no Yama
    except ValueError:
        return 3  # unreadable: assume the strictest


def supervisor_blocker() -> str | None:
    """Why the creation-time supervisor cannot run on this host, or None when it can."""
    if not user_notification():
        from sandhold.policy.creation import SUPERVISOR_MISSING

        return SUPERVISOR_MISSING
    scope = yama_ptrace_scope()
    if scope >= 2:
        return (
            f"it reads each trapped call's arguments from the caller's memory, which "
            f"Yama forbids here (kernel.yama.ptrace_scope = {scope}; 0 or 1 allow it)"
        )
    return None
