"""bubblewrap's command line for a plan: a pure function, golden-tested.

Rules: namespaces are all unshared (user, pid, net, ipc, uts, cgroup), nested
user namespaces are disabled, every capability is dropped, the sandbox dies
with sandhold, and the host is bound read-only before the plan's own mounts are
applied in order. bwrap sets ``no_new_privs`` itself before it execs.
"""

from __future__ import annotations

from sandhold._record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandhold.policy.fsplan import FsPlan


@record
class BwrapFds:
    """File descriptors bwrap reads or writes, numbered as the child sees them."""

    seccomp: int
    status: int
    hidden_file: str  # host path of an empty mode-000 file that hides denied files


def bwrap_argv(
    bwrap: str,
    plan: FsPlan,
    fds: BwrapFds,
    cwd: str,
    command: Sequence[str],
    *,
    share_net: bool = False,
) -> list[str]:
    """The full bwrap argv that runs ``command`` under ``plan``."""
    argv = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--json-status-fd",
        str(fds.status),
        "--seccomp",
        str(fds.seccomp),
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
    ]
    if share_net:
        argv.insert(2, "--share-net")
    for m in plan.mounts:
        if m.op == "bind":
            argv += ["--bind", m.path, m.path]
        elif m.op == "ro-bind":
            argv += ["--ro-bind", m.path, m.path]
        elif m.op == "hide-file":
            argv += ["--ro-bind", fds.hidden_file, m.path]
        elif m.op == "hide-dir":
            argv += ["--perms", m.perms or "0000", "--tmpfs", m.path]
        elif m.op == "remount-ro":
            argv += ["--remount-ro", m.path]
        else:  # pragma: no cover - the plan only produces the ops above
            raise ValueError(f"unknown mount op {m.op!r}")
    argv += ["--chdir", cwd, "--", *command]
    return argv
