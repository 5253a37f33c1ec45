"""Render a launch plan for people (``--explain``, ``--debug``)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandhold.policy.cliplan import LaunchPlan

_BASE = (
    ("ro-bind", "/", "base: the whole host, read-only"),
    ("dev", "/dev", "base: private minimal /dev (null, zero, random, tty, pts, shm)"),
    ("proc", "/proc", "base: private /proc of the sandbox's own PID namespace"),
)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def render_plan(plan: LaunchPlan) -> str:
    """The whole effective policy, every mount and rule with where it came from."""
    out = [
        "sandhold: effective policy",
        f"  settings:    {plan.settings_source}",
        f"  backend:     {plan.backend}",
        f"  command:     {' '.join(_quote(a) for a in plan.command)}",
        f"  cwd:         {plan.cwd}",
        f"  network:     {plan.network}",
    ]
    if plan.fs is not None:
        out.append(
            "  isolation:   user, PID, network, IPC, UTS and cgroup namespaces; "
            "no capabilities; no_new_privs; dies with sandhold"
        )
        out.append("")
        out.append("filesystem, applied in this order:")
        rows = [(op, path, why) for op, path, why in _BASE]
        for m in plan.fs.mounts:
            op = m.op + (f" {m.perms}" if m.perms else "")
            rows.append((op, m.path, m.reason))
        width = max(len(r[0]) for r in rows)
        out.extend(f"  {op:<{width}}  {path}    <- {why}" for op, path, why in rows)
        if plan.creation is not None:
            out.append("")
            from sandhold.policy.creation import describe

            out.extend(describe(plan.creation))
        if plan.landlock is not None:
            out.append("")
            out.append(
                "landlock (where the kernel has it): the command writes only below "
                + ", ".join(plan.landlock)
                + " and the usual devices, and (ABI 6) signals no process outside it"
            )
        if plan.fs.writable_roots:
            out.append("")
            out.append("writable roots: " + ", ".join(plan.fs.writable_roots))
    if plan.syscalls:
        out.append("")
        out.append("refused system calls:")
        out.extend(f"  {r.describe()}" for r in plan.syscalls)
    out.append("")
    passed = [name for name, _ in plan.environment]
    out.append(f"environment ({len(passed)} variables passed): {' '.join(passed)}")
    if plan.env.dropped:
        out.append("environment dropped:")
        out.extend(f"  {name}: {why}" for name, why in plan.env.dropped)
    for title, items in (("warnings", plan.warnings), ("notes", plan.notes)):
        if items:
            out.append("")
            out.append(f"{title}:")
            out.extend(f"  {item}" for item in items)
    return "\n".join(out) + "\n"


def render_dropped_env(plan: LaunchPlan) -> str:
    if not plan.env.dropped:
        return "sandhold: environment: nothing dropped\n"
    names = ", ".join(f"{n} ({why})" for n, why in plan.env.dropped)
    return f"sandhold: environment: dropped {names}\n"
