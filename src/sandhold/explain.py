"""Render a plan for people: one renderer for the CLI's ``--explain`` (``LaunchPlan``)
and ``SandboxPort.explain`` (``SpecPlan``).

Rules: both plans print the same sections in the same order, each mount and rule
with where it came from: header, filesystem (base mounts, then the plan's in the
order bubblewrap applies them), the creation-time supervisor's refusals, Landlock,
writable roots, refused system calls, environment, warnings, notes. Pure: a plan
in, text out.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandhold.policy.cliplan import LaunchPlan
    from sandhold.policy.creation import CreationPolicy
    from sandhold.policy.fsplan import FsPlan
    from sandhold.policy.specplan import SpecPlan
    from sandhold.policy.syscalls import Rule

# The mounts each backend makes before the plan's own.
CLI_BASE = (
    ("ro-bind", "/", "base: the whole host, read-only"),
    ("dev", "/dev", "base: private minimal /dev (null, zero, random, tty, pts, shm)"),
    ("proc", "/proc", "base: private /proc of the sandbox's own PID namespace"),
)
SPEC_BASE = (
    ("tmpfs", "/", "base: empty root"),
    ("dev", "/dev", "base: private minimal /dev"),
    ("proc", "/proc", "base: private /proc of the sandbox's own PID namespace"),
)
ISOLATION = (
    "user, PID, network, IPC, UTS and cgroup namespaces; "
    "no capabilities; no_new_privs; dies with sandhold"
)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def _confinement(
    fs: FsPlan,
    base: tuple[tuple[str, str, str], ...],
    creation: CreationPolicy | None,
    landlock: tuple[str, ...] | None,
    writer: str,
) -> list[str]:
    out = ["", "filesystem, applied in this order:"]
    rows = list(base)
    rows += [(m.op + (f" {m.perms}" if m.perms else ""), m.path, m.reason) for m in fs.mounts]
    width = max(len(r[0]) for r in rows)
    out.extend(f"  {op:<{width}}  {path}    <- {why}" for op, path, why in rows)
    if creation is not None:
        from sandhold.policy.creation import describe

        out.append("")
        out.extend(describe(creation))
    if landlock is not None:
        out.append("")
        out.append(
            f"landlock (where the kernel has it): {writer} writes only below "
            + ", ".join(landlock)
            + " and the usual devices, and (ABI 6) signals no process outside it"
        )
    if fs.writable_roots:
        out.append("")
        out.append("writable roots: " + ", ".join(fs.writable_roots))
    return out


def _tail(
    syscalls: tuple[Rule, ...],
    environment: tuple[tuple[str, str], ...],
    dropped: tuple[tuple[str, str], ...],
    warnings: tuple[str, ...],
    notes: tuple[str, ...],
) -> list[str]:
    out = []
    if syscalls:
        out.append("")
        out.append("refused system calls:")
        out.extend(f"  {r.describe()}" for r in syscalls)
    out.append("")
    passed = [name for name, _ in environment]
    out.append(f"environment ({len(passed)} variables passed): {' '.join(passed)}")
    if dropped:
        out.append("environment dropped:")
        out.extend(f"  {name}: {why}" for name, why in dropped)
    for title, items in (("warnings", warnings), ("notes", notes)):
        if items:
            out.append("")
            out.append(f"{title}:")
            out.extend(f"  {item}" for item in items)
    return out


def render_plan(plan: LaunchPlan) -> str:
    """The CLI's whole effective policy (``--explain``)."""
    out = [
        "sandhold: effective policy",
        f"  settings:    {plan.settings_source}",
        f"  backend:     {plan.backend}",
        f"  command:     {' '.join(_quote(a) for a in plan.command)}",
        f"  cwd:         {plan.cwd}",
        f"  network:     {plan.network}",
    ]
    if plan.egress is not None and plan.egress.transparent:
        from sandhold.policy.transparent import EXPLAIN

        out.append(f"  transparent: {EXPLAIN}")
    if plan.fs is not None:
        out.append(f"  isolation:   {ISOLATION}")
        out += _confinement(plan.fs, CLI_BASE, plan.creation, plan.landlock, "the command")
    for path in plan.config_copies:
        out.append(
            f"  git config:  {path} is the run's private copy; after the run the host "
            "applies the changes git.allowConfig allows (one line each)"
        )
    if plan.limits is not None:
        out.append("  limits:")
        out.extend(f"    {line}" for line in plan.limits.describe())
    out += _tail(plan.syscalls, plan.environment, plan.env.dropped, plan.warnings, plan.notes)
    return "\n".join(out) + "\n"


def render_spec_plan(plan: SpecPlan) -> str:
    """What a native launch of a spec would do (``SandboxPort.explain``)."""
    out = [
        "sandhold: spec plan",
        "  backend: native",
        f"  workdir: {plan.workdir}",
        f"  network: {plan.network}",
        f"  transparent: {_transparent_line()}",
        f"  isolation: {ISOLATION}",
    ]
    out += _confinement(plan.fs, SPEC_BASE, plan.creation, plan.landlock, "every exec")
    out += _tail(plan.syscalls, plan.environment, plan.dropped_env, plan.warnings, plan.notes)
    return "\n".join(out) + "\n"


def _transparent_line() -> str:
    from sandhold.policy.transparent import EXPLAIN

    return EXPLAIN


def render_dropped_env(plan: LaunchPlan) -> str:
    if not plan.env.dropped:
        return "sandhold: environment: nothing dropped\n"
    names = ", ".join(f"{n} ({why})" for n, why in plan.env.dropped)
    return f"sandhold: environment: dropped {names}\n"
