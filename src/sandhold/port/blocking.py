"""``BlockingSandboxPort``: ``SandboxPort`` for scripts, on a private event loop."""

from __future__ import annotations

import asyncio

from sandhold.port.api import SandboxPort
from sandhold.port.execution import ExecResult
from sandhold.spec import (
    SandboxHandle,
    SandboxSpec,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Awaitable, Mapping, Sequence


class BlockingSandboxPort:
    """``SandboxPort`` for scripts: the same calls, blocking, on a private event loop.

    The loop runs in a thread of its own that lives until ``close``: sandboxes die
    with the thread that started them (``--die-with-parent``). A context manager.
    """

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


if TYPE_CHECKING:
    from typing import TypeVar

    _T = TypeVar("_T")


async def _await(aw: Awaitable[_T]) -> _T:
    return await aw


async def _make_port(options: dict[str, object]) -> SandboxPort:
    return SandboxPort(**options)  # type: ignore[arg-type]
