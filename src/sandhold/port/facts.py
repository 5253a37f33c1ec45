"""Host facts a launch reads at its edge (home, kernel mounts, what the kernel offers),
the egress wiring of a native sandbox, and launch-failure descriptions."""

from __future__ import annotations

import os

from sandhold.errors import LaunchError, SandholdError, SpecError
from sandhold.spec import SandboxSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from typing import Any

    from sandhold.backends.linux.launcher import (
        AgentBoot,
        EgressNetwork,
        SandboxProcess,
    )
    from sandhold.net.outbound import Asker
    from sandhold.policy.domains import Decision, DomainPolicy
    from sandhold.port.sandbox import Sandbox


def egress_policy(spec: SandboxSpec) -> DomainPolicy:
    """The session's allowlist (F-NET-3): baseline + GitHub + ``egress_allowlist``.

    Raises:
        SpecError: an ``egress_allowlist`` entry is not a valid domain pattern.
    """
    from sandhold.policy.domains import DomainPolicy

    try:
        return DomainPolicy.for_spec(spec.egress_allowlist, spec.network_enabled)
    except ValueError as exc:
        raise SpecError("egress_allowlist", str(exc)) from None


def code_paths() -> tuple[str, ...]:
    from sandhold.backends.linux.native import own_code_paths

    return own_code_paths()


_CONFINEMENT: dict[str, Any] = {}


def launch_facts(boot: AgentBoot) -> dict[str, Any]:
    """The ``SpecHost`` facts read at each launch (mounts come and go): the harness's
    environment (``$XDG_CONFIG_HOME``, ``$JJ_CONFIG`` and ``$PATH`` too, for the rules)
    and git config files, the host's kernel file system mounts, the homes of the
    password database, and where the agent's interpreter and ssh ProxyCommand are."""
    from sandhold.backends.linux.hostfs import home_facts, kernel_mounts
    from sandhold.policy.gitconfig import host_files

    return {
        "xdg_config_home": os.environ.get("XDG_CONFIG_HOME", ""),
        "jj_config": os.environ.get("JJ_CONFIG", ""),
        "path_env": os.environ.get("PATH", ""),
        "git_configs": host_files(host_home(), os.environ),
        "kernel_mounts": kernel_mounts(),
        "environ": tuple(os.environ.items()),
        "agent_python": boot.python,
        "sshproxy": sshproxy_path(boot),
        **home_facts(),  # the account's home and every home of the password database
    }


def sshproxy_path(boot: AgentBoot) -> str:
    """Where the sandbox finds ``agent/sshproxy.py`` (the package is bound at its path)."""
    return os.path.join(boot.package_dir, "agent", "sshproxy.py")


def confinement_facts() -> dict[str, Any]:
    """What the kernel offers the creation-time supervisor and Landlock (probed once)."""
    if not _CONFINEMENT:
        from sandhold.backends.linux.hostprobe import supervisor_blocker
        from sandhold.backends.linux.supervisor.landlock import landlock_abi

        blocker = supervisor_blocker()
        _CONFINEMENT["supervisor"] = blocker is None
        if blocker is not None:
            _CONFINEMENT["supervisor_blocker"] = blocker
        _CONFINEMENT["landlock"] = landlock_abi() > 0
    return dict(_CONFINEMENT)


def egress_network(
    sb: Sandbox,
    policy: DomainPolicy,
    boot: AgentBoot,
    ask: Callable[[str, int], Awaitable[bool]] | None = None,
) -> EgressNetwork:
    """The sandbox's own proxies, reporting refusals into its event stream."""
    from sandhold.backends.linux.launcher import EgressNetwork

    asker: Asker | None = None
    if ask is not None:
        chosen = ask

        async def asker(decision: Decision) -> bool:
            return await chosen(decision.host, decision.port)

    return EgressNetwork(
        policy,
        python=boot.python,
        sshproxy=sshproxy_path(boot),
        on_decision=sb.on_egress,
        budget=sb.port._connections.session(),
        label=f"sandbox {sb.spec.session_id}",
        resolver=sb.port._lookup_threads().resolver(),
        ask=asker,
    )


def host_home() -> str:
    home = os.environ.get("HOME", "")
    if home.startswith("/"):
        return home.rstrip("/") or "/"
    import pwd

    return pwd.getpwuid(os.getuid()).pw_dir


def diag_tail(proc: SandboxProcess) -> str:
    text = proc.diag.decode("utf-8", "replace").strip()
    return f": {text[-1000:]}" if text else ""


def describe(exc: BaseException, sb: Sandbox) -> str:
    proc = sb.proc
    if proc is not None:
        proc.read_diag()
        tail = diag_tail(proc)
    else:
        tail = ""
    if isinstance(exc, LaunchError):
        text = exc.detail or exc.step
    elif isinstance(exc, SandholdError):
        text = exc.render()
    else:
        text = str(exc)
    return text + tail
