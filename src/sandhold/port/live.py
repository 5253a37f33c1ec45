"""``LiveSandbox``: one sandbox as an object, beside the port-centred calls.

Rules:
- It adds no behaviour: each method is the ``SandboxPort`` call of the same name
  on this sandbox, with the same arguments, errors and cancellation.
- ``port.launch`` still returns a ``SandboxHandle``; ``port.sandbox(spec)`` gives
  a ``LiveSandbox``, launched by ``await`` (then destroyed by you) or by
  ``async with`` (destroyed on exit, whatever happened). ``handle`` is the
  current snapshot, for any code that takes a ``SandboxHandle`` (or pass
  ``session_id`` to the port's own calls).
- It launches once: awaiting or entering it again raises ``SandholdError``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Generator, Mapping, Sequence
    from types import TracebackType

    from sandhold.port.api import SandboxPort
    from sandhold.port.execution import ExecResult, Execution, StdinArg
    from sandhold.spec import (
        KillReason,
        ResourceLimits,
        SandboxBackend,
        SandboxEvent,
        SandboxHandle,
        SandboxSpec,
        SandboxState,
    )


class LiveSandbox:
    """One sandbox of a port: ``sandbox = await port.sandbox(spec)``, then
    ``await sandbox.run("make test")``, ``await sandbox.destroy()``; or
    ``async with port.sandbox(spec) as sandbox: ...``, destroyed on exit.

    Cancellation: as the port's calls (launch cancelled: destroyed; ``destroy``
    and the exit of ``async with`` are shielded and finish).
    """

    def __init__(
        self,
        port: SandboxPort,
        spec: SandboxSpec,
        *,
        backend: SandboxBackend | None = None,
        limits: ResourceLimits | None = None,
    ) -> None:
        self.port = port
        self.spec = spec
        self.session_id = spec.session_id
        self._backend = backend
        self._limits = limits
        self._launched = False

    # -- launching -----------------------------------------------------------------

    async def _launch(self) -> LiveSandbox:
        if self._launched:
            from sandhold.errors import SandholdError

            raise SandholdError(
                f"sandbox {self.session_id!r} was launched by this LiveSandbox already: "
                "make another with port.sandbox(spec)"
            )
        self._launched = True
        handle = await self.port.launch(self.spec, backend=self._backend, limits=self._limits)
        self.session_id = handle.session_id
        return self

    def __await__(self) -> Generator[object, None, LiveSandbox]:
        return self._launch().__await__()

    async def __aenter__(self) -> LiveSandbox:
        return await self._launch()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        from sandhold.errors import SpecError
        from sandhold.spec import SandboxState

        try:
            state = self.port.handle(self.session_id).state
        except SpecError:  # the port forgot it: only destroyed sandboxes are forgotten
            return
        if state is not SandboxState.DESTROYED:
            await self.port.destroy(self.session_id)

    # -- the sandbox now -----------------------------------------------------------

    @property
    def handle(self) -> SandboxHandle:
        """The current snapshot (``port.handle``): state, backend, error, details."""
        return self.port.handle(self.session_id)

    @property
    def state(self) -> SandboxState:
        return self.handle.state

    def detail(self, name: str, default: str = "") -> str:
        return self.handle.detail(name, default)

    # -- the port's calls, on this sandbox -------------------------------------------

    async def exec(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: StdinArg = None,
        timeout: float | None = None,
    ) -> Execution:
        """``port.exec`` on this sandbox: starts ``command``, returns its ``Execution``."""
        return await self.port.exec(
            self.session_id, command, cwd=cwd, env=env, stdin=stdin, timeout=timeout
        )

    async def run(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: StdinArg = None,
        timeout: float | None = None,
    ) -> ExecResult:
        """``port.run`` on this sandbox: the finished command's status and output."""
        execution = await self.exec(command, cwd=cwd, env=env, stdin=stdin, timeout=timeout)
        return await execution.output()

    def events(self) -> AsyncIterator[SandboxEvent]:
        return self.port.events(self.session_id)

    async def kill(self, exec_id: int, reason: KillReason | None = None) -> None:
        from sandhold.spec import KillReason

        await self.port.kill(self.session_id, exec_id, reason or KillReason.MANUAL)

    async def ping(self, *, timeout: float | None = 10.0) -> float:
        return await self.port.ping(self.session_id, timeout=timeout)

    async def suspend(self) -> SandboxHandle:
        return await self.port.suspend(self.session_id)

    async def resume(self) -> SandboxHandle:
        return await self.port.resume(self.session_id)

    async def destroy(self) -> SandboxHandle:
        """``port.destroy``: returns once no process of it is left (shielded)."""
        return await self.port.destroy(self.session_id)

    def __repr__(self) -> str:
        return f"LiveSandbox({self.session_id!r}, launched={self._launched})"
