"""``SandboxManager``: the CLI's one-shot "wrap this command", for libraries.

It needs no asyncio (``arun`` imports it when called), so importing it is cheap.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence


class SandboxManager:
    """The CLI's one-shot "wrap this command", for libraries (srt's ``SandboxManager``).

    It drives the ``sandhold`` CLI itself, so a wrapped command gets exactly the
    CLI's policy (settings file, network, explain) and stdio passes through.

    Args:
        settings: a settings file (default: the CLI's default lookup).
        backend: ``"native"``, ``"none"`` or None (the CLI's choice).
        python: the interpreter that runs the CLI (default: this one).
    """

    def __init__(
        self,
        *,
        settings: str | None = None,
        backend: str | None = None,
        python: str | None = None,
    ) -> None:
        import sys

        self.settings = settings
        self.backend = backend
        self.python = python or sys.executable

    def wrap(self, command: Sequence[str] | str) -> list[str]:
        """The argv that runs ``command`` sandboxed (a string is a shell command line)."""
        # -P: -m would put the working directory first on sys.path, where the sandbox
        # may have planted a sandhold package that then runs here, unconfined
        argv = [self.python, "-P", "-m", "sandhold"]
        if self.settings:
            argv += ["--settings", self.settings]
        if self.backend:
            argv += ["--backend", self.backend]
        if isinstance(command, str):
            return [*argv, "-c", command]
        return [*argv, "--", *command]

    def run(self, command: Sequence[str] | str, *, cwd: str | None = None) -> int:
        """Run ``command`` sandboxed with inherited stdio; returns its exit status
        (2: bad settings or unenforceable policy, 125: the sandbox failed)."""
        import subprocess

        return subprocess.run(self.wrap(command), cwd=cwd, check=False).returncode

    async def arun(self, command: Sequence[str] | str, *, cwd: str | None = None) -> int:
        """``run`` for async callers.

        Cancellation: the CLI gets SIGTERM (which it passes into the sandbox),
        then is waited for.
        """
        import asyncio

        proc = await asyncio.create_subprocess_exec(*self.wrap(command), cwd=cwd)
        try:
            return await proc.wait()
        except asyncio.CancelledError:
            proc.terminate()
            await asyncio.shield(proc.wait())
            raise
