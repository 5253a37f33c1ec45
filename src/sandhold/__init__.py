"""sandhold: OS-level filesystem and network sandboxing for AI agents and their tools.

The public surface is listed in ``__all__``; everything else is internal. Names
are loaded on first use so that ``import sandhold`` (and so the CLI) stays cheap.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailable",
    "ConfigError",
    "LaunchError",
    "SandholdError",
    "SettingsError",
    "UnenforceablePolicy",
    "UsageError",
    "__version__",
]

_LAZY = {
    "BackendUnavailable": "sandhold.errors",
    "ConfigError": "sandhold.errors",
    "LaunchError": "sandhold.errors",
    "SandholdError": "sandhold.errors",
    "SettingsError": "sandhold.errors",
    "UnenforceablePolicy": "sandhold.errors",
    "UsageError": "sandhold.errors",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sandhold' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
