"""``BlockingSandboxPort``: ``SandboxPort`` for scripts, on a private event loop.

Rules:
- Every call is the ``SandboxPort`` call of the same name, run on the port's own
  loop thread and waited for: same arguments, results and errors.
- ``exec`` gives a ``BlockingExecution``, whose iteration and calls block the
  same way; read or ``wait()`` each one you keep, as for ``Execution``.
"""

from __future__ import annotations

import asyncio

from sandhold.port.api import SandboxPort
from sandhold.port.execution import PIPE, ExecResult
from sandhold.spec import (
    SandboxHandle,
    SandboxSpec,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Awaitable, Iterator, Mapping, Sequence

    from sandhold.port.execution import Execution, _Pipe
    from sandhold.spec import ExitEvent, SandboxEvent


class BlockingSandboxPort:
    """``SandboxPort`` for scripts: the same calls, blocking, on a private event loop.

    The loop runs in a thread of its own that lives until ``close``: sandboxes die
    with the thread that started them (``--die-with-parent``). A context manager.
    """

    PIPE = PIPE

    def __init__(self, **port_options: object) -> None:
        import threading

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="sandhold-port", daemon=True
        )
        self._thread.start()
        self._port: SandboxPort = self._call(_make_port(port_options))
        self._closed = False

    def _call(self, coro: Awaitable[_T]) -> _T:
        future = asyncio.run_coroutine_threadsafe(_await(coro), self._loop)
        return future.result()

    def launch(self, spec: SandboxSpec, **options: object) -> SandboxHandle:
        return self._call(self._port.launch(spec, **options))  # type: ignore[arg-type]

    def run(
        self,
        handle: SandboxHandle | str,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        """Run a command to completion and return its output and status."""
        return self._call(
            self._port.run(handle, command, cwd=cwd, env=env, stdin=stdin, timeout=timeout)
        )

    def exec(
        self,
        handle: SandboxHandle | str,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | _Pipe | None = None,
        timeout: float | None = None,
    ) -> BlockingExecution:
        """Start a command and return at once with its ``BlockingExecution`` (as
        ``SandboxPort.exec``; ``stdin=BlockingSandboxPort.PIPE`` to write to it)."""
        execution = self._call(
            self._port.exec(handle, command, cwd=cwd, env=env, stdin=stdin, timeout=timeout)
        )
        return BlockingExecution(self, execution)

    def explain(self, spec: SandboxSpec) -> str:
        """What a native launch of ``spec`` would mount, and why (``SandboxPort.explain``)."""
        return self._port.explain(spec)

    def handle(self, handle: SandboxHandle | str) -> SandboxHandle:
        return self._port.handle(handle)

    def suspend(self, handle: SandboxHandle | str) -> SandboxHandle:
        return self._call(self._port.suspend(handle))

    def resume(self, handle: SandboxHandle | str) -> SandboxHandle:
        return self._call(self._port.resume(handle))

    def destroy(self, handle: SandboxHandle | str) -> SandboxHandle:
        return self._call(self._port.destroy(handle))

    def close(self) -> None:
        """Destroy every sandbox and stop the loop. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._port.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> BlockingSandboxPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlockingExecution:
    """One command of a ``BlockingSandboxPort``: ``Execution``'s calls, blocking.

    ``for event in execution`` yields its events up to its ``exit``.
    """

    def __init__(self, port: BlockingSandboxPort, execution: Execution) -> None:
        self._port = port
        self._execution = execution
        self.exec_id = execution.exec_id
        self.session_id = execution.session_id
        self.backend = execution.backend

    def __iter__(self) -> Iterator[SandboxEvent]:
        events = aiter(self._execution)
        while True:
            try:
                yield self._port._call(anext(events))
            except StopAsyncIteration:
                return

    def wait(self) -> ExitEvent:
        return self._port._call(self._execution.wait())

    def output(self) -> ExecResult:
        return self._port._call(self._execution.output())

    def write(self, data: bytes) -> None:
        self._port._call(self._execution.write(data))

    def close_stdin(self) -> None:
        self._port._call(self._execution.close_stdin())

    def kill(self) -> None:
        self._port._call(self._execution.kill())

    def signal(self, signo: int, *, group: bool = True) -> None:
        self._port._call(self._execution.signal(signo, group=group))


if TYPE_CHECKING:
    from typing import TypeVar

    _T = TypeVar("_T")


async def _await(aw: Awaitable[_T]) -> _T:
    return await aw


async def _make_port(options: dict[str, object]) -> SandboxPort:
    return SandboxPort(**options)  # type: ignore[arg-type]
