"""One command in a sandbox (``Execution``), its result, and the checks of ``exec``'s arguments."""

from __future__ import annotations

import asyncio
import weakref

from sandhold._record import record
from sandhold.agent import protocol as P
from sandhold.errors import InvalidTransition
from sandhold.port.flow import Subscriber
from sandhold.spec import ExitEvent, KilledEvent, KillReason, StderrEvent, StdoutEvent

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import AsyncIterable, AsyncIterator

    from sandhold.port.sandbox import ExecState, Sandbox
    from sandhold.spec import SandboxEvent


STDIN_WINDOW = 1 << 20
STDIN_CHUNK = 256 << 10


class _Pipe:
    """The type of ``PIPE``: a sentinel, so that no str or bytes stdin is taken for it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PIPE"

    def __reduce__(self) -> str:
        return "PIPE"


PIPE = _Pipe()  # exec(stdin=PIPE): write to the command's stdin with Execution.write
if TYPE_CHECKING:
    StdinArg = bytes | str | AsyncIterable[bytes] | _Pipe | None


@record
class ExecResult:
    """A finished command: its status and everything it wrote."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    signal: int = 0
    killed: KillReason | None = None
    error: str = ""


class Execution:
    """One command running in a sandbox: its events, stdin, and how to stop it.

    ``async for event in execution`` yields this command's events, ending after
    its ``exit``; ``wait`` and ``output`` read the rest for you.
    """

    def __init__(self, sandbox: Sandbox, state: ExecState, sub: Subscriber) -> None:
        self._sandbox = sandbox
        self._state = state
        self._sub = sub
        self.exec_id = state.exec_id
        self.session_id = sandbox.spec.session_id
        self.backend = sandbox.backend
        weakref.finalize(self, sandbox.unsubscribe, sub)

    def __aiter__(self) -> AsyncIterator[SandboxEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[SandboxEvent]:
        while True:
            event = await self._sub.get()
            self._sandbox.maybe_resume_reading()
            if event is None:
                return
            yield event

    async def wait(self) -> ExitEvent:
        """Wait for the exit (discarding unread output); returns the ``exit`` event.

        Cancellation: the command keeps running; call ``kill`` to stop it.
        """
        async for _event in self:
            pass
        return await asyncio.shield(self._state.result)

    async def output(self) -> ExecResult:
        """Read everything to the exit: stdout, stderr, status and why it was killed."""
        out: list[bytes] = []
        err: list[bytes] = []
        killed: KillReason | None = None
        async for event in self:
            if isinstance(event, StdoutEvent):
                out.append(event.data)
            elif isinstance(event, StderrEvent):
                err.append(event.data)
            elif isinstance(event, KilledEvent):
                killed = event.reason
        exit_event = await asyncio.shield(self._state.result)
        return ExecResult(
            exit_event.exit_code,
            b"".join(out),
            b"".join(err),
            exit_event.signal,
            killed,
            exit_event.error,
        )

    async def write(self, data: bytes) -> None:
        """Send ``data`` to the command's stdin (``stdin=PIPE``); waits for window.

        Raises:
            BrokenPipeError: the command closed its stdin or exited.
            ValueError: the exec was not started with ``stdin=PIPE``, or stdin is closed.
        """
        st = self._state
        if not st.stdin_open:
            raise ValueError("stdin is not open (start the exec with stdin=PIPE)")
        view = memoryview(data)
        for start in range(0, len(view), STDIN_CHUNK):
            chunk = view[start : start + STDIN_CHUNK]
            while st.unacked + len(chunk) > STDIN_WINDOW and not st.stdin_broken:
                st.window.clear()
                await st.window.wait()
            if st.stdin_broken:
                raise BrokenPipeError(f"exec {self.exec_id} no longer reads its stdin")
            self._sandbox.send(P.STDIN, self.exec_id, bytes(chunk))
            st.unacked += len(chunk)

    async def close_stdin(self) -> None:
        """Close the command's stdin (EOF); safe to call twice."""
        st = self._state
        if st.stdin_open:
            st.stdin_open = False
            if not st.stdin_broken:
                self._sandbox.send(P.STDIN, self.exec_id, b"")

    async def kill(self) -> None:
        """SIGKILL the command's whole tree; a ``killed`` (manual) event precedes its exit."""
        await self._sandbox.port.kill(self._sandbox.snapshot(), self.exec_id)

    async def signal(self, signo: int, *, group: bool = True) -> None:
        """Deliver ``signo`` to the command (its whole process group by default)."""
        await self._sandbox.port.signal(self._sandbox.snapshot(), self.exec_id, signo, group=group)


async def pump(execution: Execution, stdin: bytes | str | AsyncIterable[bytes]) -> None:
    try:
        if isinstance(stdin, str):
            await execution.write(stdin.encode())
        elif isinstance(stdin, bytes | bytearray | memoryview):
            await execution.write(bytes(stdin))
        else:
            async for chunk in stdin:
                await execution.write(chunk)
        await execution.close_stdin()
    except (BrokenPipeError, InvalidTransition):
        pass  # the command stopped reading or the sandbox went away: nothing to deliver to


def check_exec_args(
    argv: list[str],
    cwd: object,
    env: object,
    stdin: object,
    timeout: object,
) -> None:
    """Refuse ``exec`` arguments of the wrong type or range before the command starts:
    afterwards a bad ``timeout`` or ``stdin`` would leave it running unwatched."""
    from collections.abc import Mapping as AnyMapping

    if not all(isinstance(a, str) for a in argv):
        raise TypeError("command: every argument must be a str")
    if cwd is not None and not isinstance(cwd, str):
        raise TypeError("cwd must be a str or None")
    if env is not None and not (
        isinstance(env, AnyMapping)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise TypeError("env must map str to str")
    check_timeout(timeout)
    if not (
        stdin is None
        or stdin is PIPE
        or isinstance(stdin, (bytes, str))
        or hasattr(stdin, "__aiter__")
    ):
        raise TypeError("stdin must be None, bytes, str, an async iterable of bytes or PIPE")


def check_timeout(timeout: object) -> None:
    """Refuse a timeout that is not None or a positive, finite number of seconds."""
    import math

    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError("timeout must be seconds (a number) or None")
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError("timeout must be a positive, finite number of seconds")
