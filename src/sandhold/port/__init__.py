"""Sandboxes as a library: launch from a spec, exec many commands, stream events, freeze, destroy.

The package, by job (each module states its own rules):

- ``api``: ``SandboxPort``, the async lifecycle API (launch, exec, events, suspend,
  destroy), and its module rules
  (backends, network, limits, destroy, cancellation).
- ``sandbox``: the port's live record of one sandbox: state, execs, and the
  dispatch of the agent's frames.
- ``flow``: output flow control, each reader's queue and its budget.
- ``attribution``: which exec a refused connection belongs to.
- ``execution``: one command (``Execution``, ``ExecResult``, ``PIPE``).
- ``facts``: host facts read at the launch's edge, and the egress wiring.
- ``live``: ``LiveSandbox``, one sandbox as an object (``port.sandbox(spec)``).
- ``blocking``: ``BlockingSandboxPort``, the same calls for scripts.
- ``manager``: ``SandboxManager``, the CLI's one-shot wrap (no asyncio).

Names are loaded on first use, so ``from sandhold.port import SandboxManager``
does not load asyncio.
"""

from __future__ import annotations

__all__ = [
    "PIPE",
    "BlockingExecution",
    "BlockingSandboxPort",
    "ExecResult",
    "Execution",
    "LaunchFailed",
    "LiveSandbox",
    "SandboxManager",
    "SandboxPort",
]

_LAZY = {
    "PIPE": "sandhold.port.execution",
    "BlockingExecution": "sandhold.port.blocking",
    "BlockingSandboxPort": "sandhold.port.blocking",
    "ExecResult": "sandhold.port.execution",
    "Execution": "sandhold.port.execution",
    "LaunchFailed": "sandhold.errors",
    "LiveSandbox": "sandhold.port.live",
    "SandboxManager": "sandhold.port.manager",
    "SandboxPort": "sandhold.port.api",
}

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandhold.errors import LaunchFailed as LaunchFailed
    from sandhold.port.api import SandboxPort as SandboxPort
    from sandhold.port.blocking import BlockingExecution as BlockingExecution
    from sandhold.port.blocking import BlockingSandboxPort as BlockingSandboxPort
    from sandhold.port.execution import PIPE as PIPE
    from sandhold.port.execution import ExecResult as ExecResult
    from sandhold.port.execution import Execution as Execution
    from sandhold.port.live import LiveSandbox as LiveSandbox
    from sandhold.port.manager import SandboxManager as SandboxManager


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sandhold.port' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
