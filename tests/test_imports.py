"""Import hygiene: policy stays pure, the CLI stays cheap, the public surface is pinned.

STYLE §5.1: policy modules import nothing that touches the OS. STYLE §5.10: a
run of the CLI loads no asyncio, ssl, typing, dataclasses, argparse or
subprocess. The modules loaded are read from ``python -X importtime``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import sandhold

PURE = [
    "sandhold.settings",
    "sandhold.launch",
    "sandhold.policy.paths",
    "sandhold.policy.fsplan",
    "sandhold.policy.env",
    "sandhold.policy.mandatory",
    "sandhold.policy.domains",
    "sandhold.policy.syscalls",
    "sandhold.policy.creation",
    "sandhold.policy.specplan",
    "sandhold.control",
    "sandhold.spec",
    "sandhold.agent.protocol",
]
OS_MODULES = {"subprocess", "socket", "asyncio", "ctypes", "fcntl", "shutil", "select"}
HEAVY = {"asyncio", "ssl", "typing", "dataclasses", "argparse", "subprocess", "inspect", "ctypes"}


def _imported(code: str, *args: str, env_extra: dict[str, str] | None = None) -> set[str]:
    env = {**os.environ, **(env_extra or {})}
    out = subprocess.run(
        [sys.executable, "-X", "importtime", *args]
        if not code
        else [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    names = set()
    for line in out.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def test_policy_modules_import_nothing_that_touches_the_os() -> None:
    loaded = _imported("import " + ", ".join(PURE))
    assert loaded & OS_MODULES == set(), loaded & OS_MODULES


def test_a_cli_run_loads_no_heavy_module(tmp_path: object) -> None:
    loaded = _imported("", "-m", "sandhold", "--", "true", env_extra={"HOME": "/nonexistent"})
    assert "sandhold.backends.linux.native" in loaded  # it really ran a sandbox
    assert loaded & HEAVY == set(), loaded & HEAVY


def test_explain_and_settings_errors_load_no_heavy_module(tmp_path: object) -> None:
    loaded = _imported("", "-m", "sandhold", "--explain", "--", "true")
    assert loaded & HEAVY == set(), loaded & HEAVY


def test_public_surface_is_pinned() -> None:
    assert sorted(sandhold.__all__) == sorted(
        [
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
            "event_from_json",
            "event_to_json",
            "__version__",
        ]
    )
    for name in sandhold.__all__:
        assert getattr(sandhold, name) is not None
