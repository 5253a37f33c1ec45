"""sandhold: OS-level filesystem and network sandboxing for AI agents and their tools.

The public surface is listed in ``__all__``; everything else is internal. Names
are loaded on first use so that ``import sandhold`` (and so the CLI) stays cheap:
the errors from ``sandhold.errors``, the launch contract's types from
``sandhold.spec``, and the lifecycle API (``SandboxPort`` and friends) from
``sandhold.port`` (``SandboxManager`` aside, the only part that loads asyncio).
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailable",
    "BlockingSandboxPort",
    "ConfigError",
    "ExecResult",
    "Execution",
    "ExitEvent",
    "InvalidTransition",
    "KillReason",
    "KilledEvent",
    "LaunchError",
    "LaunchFailed",
    "LiveSandbox",
    "ReadyEvent",
    "ResourceLimits",
    "SandboxBackend",
    "SandboxBindMount",
    "SandboxHandle",
    "SandboxManager",
    "SandboxMode",
    "SandboxPort",
    "SandboxSpec",
    "SandboxState",
    "SandboxViolation",
    "SandholdError",
    "SettingsError",
    "SpecError",
    "StartingEvent",
    "StderrEvent",
    "StdoutEvent",
    "UnenforceablePolicy",
    "UsageError",
    "ViolationEvent",
    "__version__",
    "event_from_json",
    "event_to_json",
]

_LAZY = {
    "__version__": "sandhold._version",
    "BackendUnavailable": "sandhold.errors",
    "BlockingSandboxPort": "sandhold.port.blocking",
    "LiveSandbox": "sandhold.port.live",
    "ConfigError": "sandhold.errors",
    "ExecResult": "sandhold.port.execution",
    "Execution": "sandhold.port.execution",
    "ExitEvent": "sandhold.spec",
    "InvalidTransition": "sandhold.errors",
    "KillReason": "sandhold.spec",
    "KilledEvent": "sandhold.spec",
    "LaunchError": "sandhold.errors",
    "LaunchFailed": "sandhold.errors",
    "ReadyEvent": "sandhold.spec",
    "ResourceLimits": "sandhold.spec",
    "SandboxBackend": "sandhold.spec",
    "SandboxBindMount": "sandhold.spec",
    "SandboxHandle": "sandhold.spec",
    "SandboxManager": "sandhold.port.manager",
    "SandboxMode": "sandhold.spec",
    "SandboxPort": "sandhold.port.api",
    "SandboxSpec": "sandhold.spec",
    "SandboxState": "sandhold.spec",
    "SandboxViolation": "sandhold.spec",
    "SandholdError": "sandhold.errors",
    "SettingsError": "sandhold.errors",
    "SpecError": "sandhold.errors",
    "StartingEvent": "sandhold.spec",
    "StderrEvent": "sandhold.spec",
    "StdoutEvent": "sandhold.spec",
    "UnenforceablePolicy": "sandhold.errors",
    "UsageError": "sandhold.errors",
    "ViolationEvent": "sandhold.spec",
    "event_from_json": "sandhold.spec",
    "event_to_json": "sandhold.spec",
}

TYPE_CHECKING = False
if TYPE_CHECKING:  # what type checkers see; at run time, __getattr__ below
    from sandhold._version import __version__ as __version__
    from sandhold.errors import (
        BackendUnavailable as BackendUnavailable,
    )
    from sandhold.errors import (
        ConfigError as ConfigError,
    )
    from sandhold.errors import (
        InvalidTransition as InvalidTransition,
    )
    from sandhold.errors import (
        LaunchError as LaunchError,
    )
    from sandhold.errors import (
        LaunchFailed as LaunchFailed,
    )
    from sandhold.errors import (
        SandholdError as SandholdError,
    )
    from sandhold.errors import (
        SettingsError as SettingsError,
    )
    from sandhold.errors import (
        SpecError as SpecError,
    )
    from sandhold.errors import (
        UnenforceablePolicy as UnenforceablePolicy,
    )
    from sandhold.errors import (
        UsageError as UsageError,
    )
    from sandhold.port.api import (
        SandboxPort as SandboxPort,
    )
    from sandhold.port.blocking import (
        BlockingSandboxPort as BlockingSandboxPort,
    )
    from sandhold.port.execution import (
        ExecResult as ExecResult,
    )
    from sandhold.port.execution import (
        Execution as Execution,
    )
    from sandhold.port.live import (
        LiveSandbox as LiveSandbox,
    )
    from sandhold.port.manager import (
        SandboxManager as SandboxManager,
    )
    from sandhold.spec import (
        ExitEvent as ExitEvent,
    )
    from sandhold.spec import (
        KilledEvent as KilledEvent,
    )
    from sandhold.spec import (
        KillReason as KillReason,
    )
    from sandhold.spec import (
        ReadyEvent as ReadyEvent,
    )
    from sandhold.spec import (
        ResourceLimits as ResourceLimits,
    )
    from sandhold.spec import (
        SandboxBackend as SandboxBackend,
    )
    from sandhold.spec import (
        SandboxBindMount as SandboxBindMount,
    )
    from sandhold.spec import (
        SandboxHandle as SandboxHandle,
    )
    from sandhold.spec import (
        SandboxMode as SandboxMode,
    )
    from sandhold.spec import (
        SandboxSpec as SandboxSpec,
    )
    from sandhold.spec import (
        SandboxState as SandboxState,
    )
    from sandhold.spec import (
        SandboxViolation as SandboxViolation,
    )
    from sandhold.spec import (
        StartingEvent as StartingEvent,
    )
    from sandhold.spec import (
        StderrEvent as StderrEvent,
    )
    from sandhold.spec import (
        StdoutEvent as StdoutEvent,
    )
    from sandhold.spec import (
        ViolationEvent as ViolationEvent,
    )
    from sandhold.spec import (
        event_from_json as event_from_json,
    )
    from sandhold.spec import (
        event_to_json as event_to_json,
    )


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sandhold' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
