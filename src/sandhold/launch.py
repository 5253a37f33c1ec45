"""From settings and a command to a launch plan: every decision, none of the doing.

Rules: the plan is a value. It names the backend, the command, the working
directory, the exact environment (and what was dropped), the filesystem plan,
the syscall rules and the network mode, each with where it came from, plus the
warnings the user must see. Backends carry a plan out without deciding
anything; ``--explain`` prints it. Host facts arrive through ``HostView``.
"""

from __future__ import annotations

from sandhold._record import record
from sandhold.policy.env import EnvDecision, filter_environment
from sandhold.policy.fsplan import FsPlan, FsRequest, plan_filesystem

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from sandhold.policy.fsplan import HostView
    from sandhold.policy.syscalls import Rule
    from sandhold.settings import Settings

BACKENDS = ("native", "none")


@record
class LaunchRequest:
    """What the caller asked for, with the host facts the decision needs."""

    command: tuple[str, ...]
    cwd: str
    home: str
    environ: tuple[tuple[str, str], ...]
    settings: Settings
    backend: str
    tmpdir: str  # the session's private TMPDIR
    private_root: str  # where all sessions' private data lives
    inherit_env: bool = False


@record
class LaunchPlan:
    backend: str
    command: tuple[str, ...]
    cwd: str
    env: EnvDecision
    environment: tuple[tuple[str, str], ...]  # exactly what the child gets
    fs: FsPlan | None  # None: no isolation (backend none)
    syscalls: tuple[Rule, ...]
    network: str
    settings_source: str
    warnings: tuple[str, ...]
    notes: tuple[str, ...]


def _session_env(req: LaunchRequest, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    if req.backend == "native":
        for name in ("TMPDIR", "TMP", "TEMP"):
            env[name] = req.tmpdir
    env["PWD"] = req.cwd
    safe = req.settings.git_safe_directories
    if safe:
        count = int(env.get("GIT_CONFIG_COUNT", "0") or "0")
        for i, d in enumerate(safe, start=count):
            env[f"GIT_CONFIG_KEY_{i}"] = "safe.directory"
            env[f"GIT_CONFIG_VALUE_{i}"] = d
        env["GIT_CONFIG_COUNT"] = str(count + len(safe))
    return env


def plan_launch(req: LaunchRequest, host: HostView) -> LaunchPlan:
    """Decide everything about running ``req.command`` (see module rules).

    Raises:
        UnenforceablePolicy: a rule cannot be enforced on the chosen backend.
    """
    s = req.settings
    warnings = list(s.warnings)
    notes = list(s.notes)
    environ: Mapping[str, str] = dict(req.environ)
    env = filter_environment(
        environ, passthrough=s.env_passthrough, withheld=s.env_deny, inherit=req.inherit_env
    )
    if req.inherit_env:
        leaked = ", ".join(env.inherited_credentials) or "none found"
        warnings.append(
            "--inherit-env: the sandbox gets the whole environment; "
            f"credential-looking variables passed: {leaked}"
        )
    fs: FsPlan | None = None
    syscalls: tuple[Rule, ...] = ()
    network = "host network (no isolation)"
    if req.backend == "native":
        from sandhold.policy.syscalls import syscall_rules

        fs = plan_filesystem(
            FsRequest(
                cwd=req.cwd,
                home=req.home,
                tmpdir=req.tmpdir,
                private_root=req.private_root,
                deny_read=s.filesystem.deny_read,
                allow_read=s.filesystem.allow_read,
                allow_write=s.filesystem.allow_write,
                deny_write=s.filesystem.deny_write,
            ),
            host,
        )
        notes.extend(fs.notes)
        if fs.unpinned:
            warnings.append(
                "names created during the run are not protected yet (creation-time "
                "enforcement is not implemented); only what exists now is: "
                + ", ".join(fs.unpinned)
            )
        syscalls = syscall_rules(allow_unix_sockets=s.network.allow_all_unix_sockets)
        network = "off: own network namespace, loopback only"
        net = s.network
        if net.allowed_domains or net.allow_all_domains:
            warnings.append(
                "network.allowedDomains/allowAllDomains ask for egress, but sandhold's "
                "egress proxies are not available yet: the network stays off"
            )
        if net.allow_unix_sockets and not net.allow_all_unix_sockets:
            warnings.append(
                "network.allowUnixSockets: per-path unix sockets are not available yet: "
                "every unix socket stays refused"
            )
    else:
        notes.append("backend none: no filesystem or network isolation; environment scrubbed")
    return LaunchPlan(
        backend=req.backend,
        command=req.command,
        cwd=req.cwd,
        env=env,
        environment=tuple(sorted(_session_env(req, env.as_mapping()).items())),
        fs=fs,
        syscalls=syscalls,
        network=network,
        settings_source=s.source,
        warnings=tuple(warnings),
        notes=tuple(notes),
    )
