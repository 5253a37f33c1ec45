"""Which backend runs a sandbox: one chooser for the CLI and the port.

Rules (F-BE-1, F-BE-6, F-BE-7):
- An explicit backend is used exactly, or the launch fails with
  ``BackendUnavailable``; ``microvm`` always fails (sandhold has no microVM
  backend) and never falls back to a weaker one. ``none`` is always there.
- An unspecified backend follows the caller's ``sandbox`` switch: ``"require"``
  (the CLI's, and the port's default) means native or ``BackendUnavailable``;
  ``"on"`` means native when the host offers it, else ``none``; ``"off"`` means
  ``none``. Every fallback comes with a line to log, and every refusal says how to
  run without isolation on purpose (``unisolated``: the caller's spelling of it).
- Pure: the host's answer comes in as a ``Probe`` value, and whether ``/dev/kvm``
  exists as a fact.
"""

from __future__ import annotations

from sandhold._record import record
from sandhold.errors import BackendUnavailable, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandhold.probe import Probe

BACKENDS = ("native", "none", "microvm")
SWITCHES = ("require", "on", "off")


@record
class BackendChoice:
    """The backend to use, the bubblewrap to run it with, and what to log about it."""

    backend: str  # "native" or "none"
    bwrap: str | None = None
    log_level: str = ""  # "", "info" or "warning"
    log_line: str = ""


def choose_backend(
    requested: str | None,
    probe: Probe,
    *,
    switch: str = "require",
    unisolated: str = "pass --backend none",
    kvm: bool | None = None,
) -> BackendChoice:
    """Decide the backend (see module rules).

    Args:
        requested: an exact backend name, or None for ``switch``.
        probe: what the host offers (``probe.quick_probe``).
        switch: ``"require"``, ``"on"`` or ``"off"``.
        unisolated: how the caller asks for no isolation, for the refusal's hint.
        kvm: whether ``/dev/kvm`` exists (said when ``microvm`` is refused).

    Raises:
        UsageError: an unknown backend or switch name.
        BackendUnavailable: the backend asked for (or, with ``require``, native) is
            not available here; nothing was started.
    """
    if requested is not None and requested not in BACKENDS:
        raise UsageError(f"unknown backend {requested!r}: choose native or none")
    if switch not in SWITCHES:
        raise UsageError(f"sandbox must be 'require', 'on' or 'off', not {switch!r}")
    if requested == "microvm":
        where = "" if kvm is None else f" (/dev/kvm {'present' if kvm else 'absent'})"
        raise BackendUnavailable(
            "microvm",
            f"sandhold has no microVM backend yet{where}; nothing was started and there "
            "is no fallback to a weaker backend",
        )
    if requested == "none":
        return BackendChoice("none")
    missing = f"{probe.note}; {probe.hint or probe.note}"
    refusal = f"{missing}; or {unisolated} to run without isolation"
    if requested == "native":
        if not probe.available:
            raise BackendUnavailable("native", refusal)
        return BackendChoice("native", probe.bwrap)
    if switch == "off":
        return BackendChoice(
            "none",
            None,
            "warning",
            "agent sandbox DISABLED by sandbox=off: backend none (no isolation)",
        )
    if probe.available:
        return BackendChoice(
            "native",
            probe.bwrap,
            "info",
            f"no microVM backend on this host: using native ({probe.note})",
        )
    if switch == "on":
        return BackendChoice(
            "none",
            None,
            "warning",
            f"no OS-native agent sandbox on this host ({missing}): backend none",
        )
    raise BackendUnavailable("native", refusal)
