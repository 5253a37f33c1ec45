"""Import hygiene: policy stays pure, the CLI stays cheap, the public surface is pinned.

STYLE §5.1: policy modules import nothing that touches the OS. STYLE §5.10: a
run of the CLI loads no asyncio, ssl, typing, dataclasses, argparse or
subprocess. The modules loaded are read from ``python -X importtime``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import sandhold

PURE = [
    "sandhold.settings",
    "sandhold.policy.cliplan",
    "sandhold.policy.paths",
    "sandhold.policy.fsplan",
    "sandhold.policy.env",
    "sandhold.policy.mandatory",
    "sandhold.policy.domains",
    "sandhold.policy.syscalls",
    "sandhold.policy.creation",
    "sandhold.policy.gitconfig",
    "sandhold.policy.git",
    "sandhold.policy.backend",
    "sandhold.policy.confinement",
    "sandhold.policy.specplan",
    "sandhold.policy.symlinks",
    "sandhold.policy.repository",
    "sandhold.net.control",
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
    loaded = _imported("", "-P", "-m", "sandhold", "--", "true", env_extra={"HOME": "/nonexistent"})
    assert "sandhold.backends.linux.native" in loaded  # it really ran a sandbox
    assert loaded & HEAVY == set(), loaded & HEAVY


def test_a_cli_run_with_settings_loads_neither_re_nor_enum(tmp_path: Path) -> None:
    """``re`` and ``enum`` cost ~6 ms: only a glob to match, or the supervisor, needs them."""
    settings = tmp_path / "s.json"
    settings.write_text('{"filesystem": {"denyRead": ["~/.ssh"]}, "network": {}}')
    for args in ((), ("-s", str(settings))):
        loaded = _imported(
            "", "-P", "-m", "sandhold", *args, "--", "true", env_extra={"HOME": "/nonexistent"}
        )
        assert "sandhold.backends.linux.native" in loaded
        assert loaded & {"re", "enum", "json", "signal"} == set(), args
    script = Path(sys.executable).parent / "sandhold"  # what the README's set-up installs
    assert "import re" not in script.read_text()


def test_the_supervisor_runner_starts_light(tmp_path: Path) -> None:
    """The runner in front of every supervised CLI command loads its emulation (and
    ``re``) at the first trapped call only."""
    from sandhold.backends.linux import native
    from sandhold.policy.creation import creation_policy

    policy = creation_policy(writable_roots=[str(tmp_path)], cwd=str(tmp_path), home="/")
    fd = native._runner_setup(native.supervisor_setup(policy, policy.writable_roots))
    try:
        python, parent = native.runner_paths()
        for command, emulated in ((["true"], False), (["touch", str(tmp_path / "x")], True)):
            out = subprocess.run(
                [python, "-X", "importtime", "-I", "-S", "-B", "-c", native.RUNNER_BOOT, parent,
                 "--setup-fd", str(fd), "--", *command],
                capture_output=True, text=True, pass_fds=(fd,), check=True, cwd=tmp_path,
            )  # fmt: skip
            loaded = {ln.rsplit("|", 1)[1].strip() for ln in out.stderr.splitlines() if "|" in ln}
            assert ("sandhold.backends.linux.supervisor.emulate" in loaded) is emulated, command
            if not emulated:
                assert loaded & {"re", "enum", "logging", "sandhold.policy.syscalls"} == set()
    finally:
        os.close(fd)
    assert (tmp_path / "x").exists()


def test_explain_and_settings_errors_load_no_heavy_module(tmp_path: object) -> None:
    loaded = _imported("", "-P", "-m", "sandhold", "--explain", "--", "true")
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
            "event_from_json",
            "event_to_json",
            "__version__",
        ]
    )
    for name in sandhold.__all__:
        assert getattr(sandhold, name) is not None


def test_every_public_error_is_in_the_one_tree() -> None:
    """errors.py draws the whole tree: every error a caller can catch by a public name
    (the package's, and the server client's ``ApiError``) is defined there."""
    import sandhold.client
    from sandhold.errors import SandholdError

    public = [getattr(sandhold, n) for n in sandhold.__all__ if n != "__version__"]
    public.append(sandhold.client.ApiError)
    errors = [c for c in public if isinstance(c, type) and issubclass(c, BaseException)]
    assert len(errors) >= 10
    for cls in errors:
        assert issubclass(cls, SandholdError) and cls.__module__ == "sandhold.errors", cls


def test_sandbox_manager_loads_no_asyncio() -> None:
    """The one-shot wrap drives the CLI: importing it must not cost the event loop."""
    code = (
        "import sys; from sandhold.port import SandboxManager; "
        "print(SandboxManager.__module__,"
        " sorted({'asyncio', 'sandhold.port.api'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["sandhold.port.manager", "[]"], out.stdout
