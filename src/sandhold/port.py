"""Sandboxes as a library: launch from a spec, exec many commands, stream events, freeze, destroy.

``SandboxPort`` is the async API of SPEC §1/§4 (``BlockingSandboxPort`` wraps it
for scripts); ``SandboxManager`` keeps the CLI's one-shot "wrap this command".

Rules:
- A sandbox moves only through ``spec.TRANSITIONS``; an illegal call raises
  ``InvalidTransition`` and changes nothing.
- Backend choice (F-BE-1, F-BE-6, F-BE-7): an explicit backend is used exactly
  or the launch fails (``microvm`` always fails here: sandhold has no microVM
  backend, and never falls back). An unspecified backend follows the port's
  ``sandbox`` policy: ``"require"`` (default) means native or
  ``BackendUnavailable``; ``"on"`` means native when the host offers it, else
  ``none``; ``"off"`` means ``none``. Every fallback is logged, and the handle
  and every event carry the backend in use.
- Everything the sandbox says is untrusted: a malformed or impossible frame from
  the agent puts the sandbox in ``error`` and kills it. Its text is bounded: each
  violation field and ``LOG`` message is cut to ``MAX_AGENT_TEXT`` characters,
  ``LOG`` lines are logged at most once a second, and a reader's queued
  violations are bounded by count and by bytes.
- Timeouts, kills, freezing and destroying are done by the host. A timeout or
  kill is delivered by the agent (SIGKILL to the command's process group); if the
  agent does not report the exit within ``kill_grace`` the sandbox goes to
  ``error`` and is killed whole. Time spent suspended does not count.
- ``ping`` is a liveness check that waits ``timeout`` at most; each ping has a
  token of its own, and pings still waiting when the sandbox is torn down (or
  its agent dies) fail with ``InvalidTransition``: nothing waits for ever.
- ``destroy`` returns only when no process of the sandbox is left (checked from
  the host); commands still running get ``killed`` (destroyed) and ``exit``.
- Resource limits use cgroup v2 only where delegated; a limit that cannot be
  enforced fails the launch (``UnenforceablePolicy``), never runs unlimited.
- Network (F-NET-1, F-NET-3): every native sandbox gets its own HTTP and SOCKS5
  proxy (``EgressNetwork``), its only way out; the allowlist is
  ``DomainPolicy.for_spec(egress_allowlist, network_enabled)``, so
  ``network_enabled=False`` keeps the proxies and refuses everything. Each
  refusal becomes a ``violation`` event, attributed to the exec whose process
  holds the refused connection (read from the host, off the event loop, with
  bounded work: ``_Attribution``); when that cannot be known for sure it is
  attributed to exec 0 (unknown, saying why), never guessed. Teardown cuts the
  network first.
- One process serves every sandbox of a port: the port raises its soft
  ``RLIMIT_NOFILE`` to the hard limit, and each sandbox's proxies get a share of
  its fds (``net.budget``); a sandbox beyond its share has its own new
  connections refused, and the reserve keeps launches working. Name lookups run
  on threads of their own, a few per sandbox at most (``LookupThreads``).
- Flow control: when a subscriber's unread output takes more than ``HIGH_WATER``
  bytes (its data, plus ``EVENT_COST`` per event: many tiny writes cost memory
  too), the port stops reading that sandbox's channel (its commands block on
  write) until every subscriber is under ``LOW_WATER``. Read or ``wait()`` each
  ``Execution``, and read each ``events()`` stream, you keep; one dropped unread
  (even one never started) is unsubscribed when collected.

Cancellation: cancelling ``launch`` kills what it started and leaves the handle
``destroyed``; ``destroy`` and ``aclose`` are shielded and finish even when
cancelled; cancelling ``Execution.wait`` leaves the command running.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
import weakref

from sandhold._record import record
from sandhold._throttle import Throttle
from sandhold.agent import protocol as P
from sandhold.errors import BackendUnavailable, LaunchError, SandholdError, UnenforceablePolicy
from sandhold.spec import (
    RUNNING_STATES,
    Action,
    ExitEvent,
    InvalidTransition,
    KilledEvent,
    KillReason,
    ReadyEvent,
    SandboxBackend,
    SandboxHandle,
    SandboxSpec,
    SandboxState,
    SandboxViolation,
    SpecError,
    StartingEvent,
    StderrEvent,
    StdoutEvent,
    ViolationEvent,
    transition,
)
from sandhold.violations_file import DROPPED

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
    from concurrent.futures import ThreadPoolExecutor
    from types import TracebackType
    from typing import Any

    from sandhold.backends.linux.launcher import (
        AgentBoot,
        EgressNetwork,
        NetworkSetup,
        SandboxProcess,
    )
    from sandhold.backends.linux.session import Session
    from sandhold.net.egress import EgressDecision
    from sandhold.net.outbound import LookupThreads
    from sandhold.policy.domains import DomainPolicy
    from sandhold.policy.specplan import SpecPlan
    from sandhold.spec import ResourceLimits, SandboxEvent

    _Connection = tuple[tuple[str, int], tuple[str, int]]

log = logging.getLogger("sandhold")


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
KEEP_DESTROYED = 64  # destroyed sandboxes whose final handle a port still answers for
MAX_QUEUED_VIOLATIONS = 10_000  # per reader; more are counted in one DROPPED event
MAX_QUEUED_VIOLATION_BYTES = 4 << 20  # per reader, of the violations' text
ATTRIBUTION_FDS = 20_000  # fds one attribution scan may look at
ATTRIBUTION_WAITING = 256  # refusals of one sandbox waiting for a scan; more are not looked for
ATTRIBUTION_THREADS = 2  # shared by every sandbox of a port
MAX_AGENT_TEXT = 8192  # characters kept of each violation field and LOG line from the agent
HIGH_WATER = 8 << 20  # bytes of memory a reader's queued output may take before reading stops
LOW_WATER = 2 << 20  # ... and below which every reader must be before it starts again
# What one queued output event costs besides its data: the event record, its bytes
# object's header, its exec id and the queue's slot (~134 bytes measured on CPython
# 3.11, x86-64). A sandbox writing one byte at a time would otherwise queue ~130
# times the budget before reading stopped.
EVENT_COST = 136
DECODE_BATCH = 1024  # frames decoded from the channel between looks at flow control
STDIN_WINDOW = 1 << 20
STDIN_CHUNK = 256 << 10
PING_TIMEOUT = 10.0  # seconds ping waits for the agent's answer by default
PING_TOKENS = 1 << 31  # ping ids count from here: apart from exec ids, within the u32 id
SIGKILL = 9


class LaunchFailed(LaunchError):
    """The sandbox could not be started; ``handle`` is its ``error`` snapshot."""

    def __init__(self, backend: str, step: str, detail: str, handle: SandboxHandle) -> None:
        super().__init__(backend, step, detail)
        self.handle = handle


@record
class ExecResult:
    """A finished command: its status and everything it wrote."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    signal: int = 0
    killed: KillReason | None = None
    error: str = ""


class _Subscriber:
    """One reader of a sandbox's events (all of them, or one exec's)."""

    def __init__(self, exec_id: int | None) -> None:
        self.exec_id = exec_id
        self.queue: collections.deque[SandboxEvent | None] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.pending = 0  # memory its queued output takes: data plus EVENT_COST each
        self.violations = 0  # queued, not read
        self.violation_bytes = 0  # their text, queued, not read
        self.closed = False

    def put(self, event: SandboxEvent | None) -> None:
        if self.closed:
            return
        if isinstance(event, ViolationEvent):
            # Output waits for a slow reader (flow control); refusals cannot, and a
            # sandbox can make them as fast as it likes: past a bound they are counted
            size = _violation_size(event)
            if (
                self.violations >= MAX_QUEUED_VIOLATIONS
                or self.violation_bytes + size > MAX_QUEUED_VIOLATION_BYTES
            ):
                self._dropped(event)
                return
            self.violations += 1
            self.violation_bytes += size
        self.queue.append(event)
        if event is None:
            self.closed = True
        elif isinstance(event, StdoutEvent | StderrEvent):
            self.pending += len(event.data) + EVENT_COST
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def get(self) -> SandboxEvent | None:
        """The next event, or None at the end (and every time after it)."""
        while not self.queue:
            if self.closed:
                return None
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        event = self.queue.popleft()
        if isinstance(event, StdoutEvent | StderrEvent):
            self.pending -= len(event.data) + EVENT_COST
        elif isinstance(event, ViolationEvent) and event.violation.action != DROPPED:
            self.violations -= 1
            self.violation_bytes -= _violation_size(event)
        return event

    def _dropped(self, event: ViolationEvent) -> None:
        """Count a refusal not queued: one ``violations-dropped`` event stands for a run
        of them (its ``target`` is how many), merged while nothing else is queued."""
        last = self.queue[-1] if self.queue else None
        count = 1
        if isinstance(last, ViolationEvent) and last.violation.action == DROPPED:
            count += int(last.violation.target)
            self.queue.pop()
        note = SandboxViolation(
            DROPPED, str(count), rule="sandhold: the reader fell behind; these were not kept"
        )
        self.queue.append(ViolationEvent(event.session_id, event.backend, event.exec_id, note))
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


def _violation_size(event: ViolationEvent) -> int:
    v = event.violation
    return len(v.action) + len(v.target) + len(v.raw) + len(v.rule)


def _agent_text(value: P.FieldOut | None, default: str = "") -> str:
    """A text field from the agent, cut to ``MAX_AGENT_TEXT`` characters."""
    text = P.text(value, default)
    if len(text) <= MAX_AGENT_TEXT:
        return text
    return text[:MAX_AGENT_TEXT] + f"... [{len(text) - MAX_AGENT_TEXT} more characters cut]"


class _ExecState:
    def __init__(self, exec_id: int, timeout: float | None) -> None:
        self.exec_id = exec_id
        self.timeout = timeout
        self.deadline: float | None = None  # monotonic, while running
        self.remaining: float | None = None  # seconds left, while suspended
        self.timer: asyncio.TimerHandle | None = None
        self.backstop: asyncio.TimerHandle | None = None
        self.kill_reason: KillReason | None = None
        self.unacked = 0
        self.stdin_open = False
        self.stdin_broken = False
        self.window = asyncio.Event()
        self.pid = 0
        self.result: asyncio.Future[ExitEvent] = asyncio.get_running_loop().create_future()


class _Channel(asyncio.Protocol):
    """The agent's frames in, ``DECODE_BATCH`` at a time: reading stops soon after a
    reader's budget is taken even inside one read (which holds up to 256 KiB: some
    26,000 tiny frames, ~3.5 MiB once queued). Frames not yet decoded wait in the
    decoder, as bytes and in order, until the readers catch up."""

    def __init__(self, sandbox: _Sandbox) -> None:
        self.sandbox = sandbox
        self.decoder = P.FrameDecoder(kinds=P.AGENT_KINDS)
        sandbox.channel = self

    def data_received(self, data: bytes) -> None:
        self.process(data)

    def process(self, data: bytes = b"") -> None:
        """Decode and handle frames until none is complete or reading is paused."""
        sb = self.sandbox
        try:
            frames = self.decoder.feed(data, DECODE_BATCH)
            while True:
                for kind, ident, payload in frames:
                    sb.on_frame(kind, ident, payload)
                if len(frames) < DECODE_BATCH or sb.paused:
                    return
                frames = self.decoder.feed(b"", DECODE_BATCH)
        except P.ProtocolError as exc:
            sb.fail(f"the agent broke the protocol: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.sandbox.on_channel_lost()


class _Sandbox:
    """The port's live record of one sandbox."""

    def __init__(self, port: SandboxPort, spec: SandboxSpec, backend: SandboxBackend) -> None:
        self.port = port
        self.spec = spec
        self.backend = backend
        self.state = SandboxState.CREATED
        self.error: str | None = None
        self.details: dict[str, str] = {}
        self.proc: SandboxProcess | None = None
        self.network: NetworkSetup | None = None
        self.transport: asyncio.Transport | None = None
        self.channel: _Channel | None = None
        self.subscribers: list[_Subscriber] = []
        self.lifecycle: list[SandboxEvent] = []
        self.execs: dict[int, _ExecState] = {}
        self.next_id = 1
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.workdir = "/"
        self.base_env: dict[str, str] = {}
        self.paused = False
        self.teardown: asyncio.Task[None] | None = None
        self.oom_kills = 0
        self.pings: dict[int, asyncio.Future[None]] = {}  # token -> waiting ping
        self.ping_count = 0
        self.settling: asyncio.Task[None] | None = None  # the cgroup move, behind ready
        self.agent_log = Throttle(1.0)  # the agent's LOG frames: one line a second at most
        self.attribution = _Attribution(self)

    async def settled(self) -> None:
        """Wait until the tree is in its cgroup (or known not to be)."""
        if self.settling is not None and not self.settling.done():
            await asyncio.shield(self.settling)

    # -- state -------------------------------------------------------------------

    def apply(self, action: Action) -> None:
        self.state = transition(self.state, action)

    def check(self, action: Action) -> None:
        transition(self.state, action)  # raises InvalidTransition, changes nothing

    def snapshot(self) -> SandboxHandle:
        return SandboxHandle(
            session_id=self.spec.session_id,
            backend=self.backend,
            state=self.state,
            error=self.error,
            details=tuple(sorted(self.details.items())),
        )

    # -- events --------------------------------------------------------------------

    def publish(self, event: SandboxEvent) -> None:
        if isinstance(event, StartingEvent | ReadyEvent):
            self.lifecycle.append(event)
        for sub in list(self.subscribers):
            if sub.exec_id is None or sub.exec_id == event.exec_id:
                sub.put(event)
                if sub.pending > HIGH_WATER and not self.paused and self.transport is not None:
                    self.transport.pause_reading()
                    self.paused = True

    def subscribe(self, exec_id: int | None) -> _Subscriber:
        sub = _Subscriber(exec_id)
        if exec_id is None:
            for event in self.lifecycle:
                sub.put(event)
            if self.state in (SandboxState.DESTROYED, SandboxState.ERROR):
                sub.put(None)
        self.subscribers.append(sub)
        return sub

    def unsubscribe(self, sub: _Subscriber) -> None:
        if sub in self.subscribers:
            self.subscribers.remove(sub)
        self.maybe_resume_reading()

    def maybe_resume_reading(self) -> None:
        if self.paused and all(s.pending < LOW_WATER for s in self.subscribers):
            self.paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()
                if self.channel is not None and self.channel.decoder.pending:
                    # soon, not here: a reader (or a finalizer) called this, and what
                    # is held may publish, fail the sandbox or pause again
                    self.ready.get_loop().call_soon(self.channel.process)

    def end_streams(self) -> None:
        for sub in self.subscribers:
            sub.put(None)
        self.subscribers.clear()

    # -- the channel ---------------------------------------------------------------

    def gone(self) -> InvalidTransition:
        """What a call on this sandbox raises once it is being destroyed or has failed."""
        if self.state is SandboxState.ERROR:
            return InvalidTransition(SandboxState.ERROR, Action.EXEC)
        return InvalidTransition(SandboxState.DESTROYED, Action.EXEC)

    def new_ping(self) -> tuple[int, asyncio.Future[None]]:
        """A token of its own and the future its ``PONG`` resolves.

        Raises:
            InvalidTransition: the sandbox is being destroyed, or has failed.
        """
        if self.teardown is not None or self.state in (SandboxState.DESTROYED, SandboxState.ERROR):
            raise self.gone()  # nothing would fail the future: release has run
        self.ping_count += 1
        token = PING_TOKENS + self.ping_count % PING_TOKENS
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pings[token] = fut
        return token, fut

    def fail_pings(self) -> None:
        """The agent is going away: no answer is coming to any ping waiting for one."""
        pings, self.pings = self.pings, {}
        for fut in pings.values():
            if not fut.done():
                fut.set_exception(self.gone())

    def send(self, kind: int, ident: int, payload: bytes = b"") -> None:
        if self.transport is None or self.transport.is_closing():
            raise InvalidTransition(self.state, Action.EXEC)
        self.transport.write(P.frame(kind, ident, payload))

    def on_frame(self, kind: int, ident: int, payload: bytes) -> None:
        if self.state in (SandboxState.DESTROYED, SandboxState.ERROR):
            return
        if kind not in (P.HELLO, P.LOG, P.PONG, P.VIOLATION) and not 0 < ident < self.next_id:
            raise P.ProtocolError(f"frame 0x{kind:02x} for exec {ident}, which was never started")
        if kind in (P.STDOUT, P.STDERR):
            cls = StdoutEvent if kind == P.STDOUT else StderrEvent
            self.publish(cls(self.spec.session_id, self.backend, ident, payload))
            return
        fields = P.decode_fields(payload)
        if kind == P.HELLO:
            if self.ready.done():
                raise P.ProtocolError("second HELLO")
            version = P.integer(fields.get("version"))
            if version != P.VERSION:
                raise P.ProtocolError(f"agent speaks version {version}, not {P.VERSION}")
            self.details["agent_pid_in_sandbox"] = str(P.integer(fields.get("pid")))
            self.ready.set_result(None)
        elif kind == P.STARTED:
            ex = self.execs.get(ident)
            if ex is not None:
                ex.pid = P.integer(fields.get("pid"))
        elif kind == P.EXIT:
            self.on_exit(ident, fields)
        elif kind == P.STDIN_ACK:
            ex = self.execs.get(ident)
            if ex is not None:
                ex.unacked = max(0, ex.unacked - P.integer(fields.get("n")))
                if fields.get("closed"):
                    ex.stdin_broken = True
                ex.window.set()
        elif kind == P.PONG:
            fut = self.pings.pop(ident, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        elif kind == P.VIOLATION:
            if ident >= self.next_id:
                raise P.ProtocolError(f"violation for exec {ident}, which was never started")
            violation = SandboxViolation(
                action=_agent_text(fields.get("action"), "unknown"),
                target=_agent_text(fields.get("target")),
                raw=_agent_text(fields.get("raw")),
                rule=_agent_text(fields.get("rule")),
            )
            self.publish(ViolationEvent(self.spec.session_id, self.backend, ident, violation))
        elif kind == P.LOG:
            held = self.agent_log.take()
            if held is not None:
                log.warning(
                    "sandbox %s agent: %s%s",
                    self.spec.session_id,
                    _agent_text(fields.get("message")),
                    f" ({held} more such lines not logged)" if held else "",
                )

    def on_egress(
        self,
        decision: EgressDecision,
        connection: tuple[tuple[str, int], tuple[str, int]] | None,
    ) -> asyncio.Future[None] | None:
        """A proxy decided on a connection; a refusal becomes an attributed ``violation``.

        Returns what the proxy waits for before it answers the refusal (the
        attribution, done off the loop), or None.
        """
        if decision.allowed or self.state not in RUNNING_STATES:
            return None
        return self.attribution.submit(decision, connection)

    def publish_refusal(self, decision: EgressDecision, exec_id: int, attribution: str) -> None:
        if self.state not in RUNNING_STATES:
            return
        import json

        raw = json.dumps(
            {
                "proxy": decision.proxy,
                "target": decision.target,
                "rule": decision.rule,
                "reason": decision.reason,
                "attribution": attribution,
            }
        )
        violation = SandboxViolation(decision.action, decision.target, raw, decision.rule)
        self.publish(ViolationEvent(self.spec.session_id, self.backend, exec_id, violation))

    def exec_of(self, chain: tuple[int, ...]) -> tuple[int, str]:
        """The running exec whose tree ``chain`` (a holder and its ancestors) is in."""
        leaders = {ex.pid: ex.exec_id for ex in self.execs.values() if ex.pid}
        exec_id = next((leaders[pid] for pid in chain if pid in leaders), 0)
        holder = chain[0] if chain else "?"
        if exec_id:
            return exec_id, f"exec {exec_id}: held by sandbox pid {holder}, of its process tree"
        return 0, f"unknown: held by sandbox pid {holder}, not of a running exec's process tree"

    def on_exit(self, ident: int, fields: dict[str, P.FieldOut]) -> None:
        ex = self.execs.pop(ident, None)
        if ex is None:
            raise P.ProtocolError(f"EXIT for exec {ident}, which is not running")
        for timer in (ex.timer, ex.backstop):
            if timer is not None:
                timer.cancel()
        ex.stdin_broken = True
        ex.window.set()
        code = P.integer(fields.get("code"))
        sig = P.integer(fields.get("signal"))
        sid, backend = self.spec.session_id, self.backend
        reason = ex.kill_reason if sig == SIGKILL else None
        if reason is None and sig == SIGKILL and self.proc is not None and self.proc.cgroup:
            kills = self.proc.cgroup.oom_kills()
            if kills > self.oom_kills:
                self.oom_kills = kills
                reason = KillReason.OOM
        if reason is not None:
            detail = f"after {ex.timeout:g} s" if reason is KillReason.TIMEOUT else ""
            self.publish(KilledEvent(sid, backend, ident, reason, detail))
        exit_event = ExitEvent(sid, backend, ident, code, sig, P.text(fields.get("error")))
        self.publish(exit_event)
        self.finish_exec_streams(ident)
        if not ex.result.done():
            ex.result.set_result(exit_event)
        if self.state is SandboxState.ACTIVE and not self.execs:
            self.apply(Action.IDLE)
        else:
            self.apply(Action.EXEC_EXIT)

    def finish_exec_streams(self, ident: int) -> None:
        for sub in list(self.subscribers):
            if sub.exec_id == ident:
                sub.put(None)
                self.subscribers.remove(sub)

    def on_channel_lost(self) -> None:
        self.transport = None
        if not self.ready.done():
            self.ready.set_exception(LaunchError(self.backend.value, "agent", "channel closed"))
            self.ready.exception()  # read by launch if it waits; never worth a warning
        if self.state in RUNNING_STATES and self.teardown is None:
            self.fail("the sandbox's agent went away (the sandbox died)")

    # -- kills and timers ---------------------------------------------------------------

    def request_kill(self, ex: _ExecState, reason: KillReason) -> None:
        if ex.kill_reason is None:
            ex.kill_reason = reason
        self.send(P.SIGNAL, ex.exec_id, P.encode_fields({"signo": SIGKILL, "group": 1}))
        if ex.backstop is None and self.state is not SandboxState.SUSPENDED:
            self.arm_backstop(ex)

    def arm_backstop(self, ex: _ExecState) -> None:
        loop = asyncio.get_running_loop()
        ex.backstop = loop.call_later(
            self.port.kill_grace,
            self.fail,
            f"the agent did not confirm the kill of exec {ex.exec_id} "
            f"within {self.port.kill_grace:g} s",
        )

    def on_timeout(self, ex: _ExecState) -> None:
        ex.timer = None
        if ex.exec_id in self.execs:
            self.request_kill(ex, KillReason.TIMEOUT)

    def pause_timers(self) -> None:
        now = time.monotonic()
        for ex in self.execs.values():
            if ex.timer is not None and ex.deadline is not None:
                ex.timer.cancel()
                ex.timer = None
                ex.remaining = max(0.0, ex.deadline - now)
            if ex.backstop is not None:
                ex.backstop.cancel()
                ex.backstop = None

    def resume_timers(self) -> None:
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        for ex in self.execs.values():
            if ex.remaining is not None:
                ex.deadline = now + ex.remaining
                ex.timer = loop.call_later(ex.remaining, self.on_timeout, ex)
                ex.remaining = None
            elif ex.kill_reason is not None:
                self.arm_backstop(ex)

    # -- failure and teardown ---------------------------------------------------------

    def fail(self, reason: str) -> None:
        """Put the sandbox in ``error`` and kill it (idempotent)."""
        if self.state not in RUNNING_STATES and self.state is not SandboxState.CREATED:
            return
        log.error("sandbox %s failed: %s", self.spec.session_id, reason)
        self.error = reason
        self.apply(Action.FAIL)
        if not self.ready.done():
            self.ready.set_exception(LaunchError(self.backend.value, "agent", reason))
            self.ready.exception()
        self.release(KillReason.ERROR)

    def cut_network(self) -> Awaitable[None] | None:
        """Take the sandbox's network away now (idempotent); returns what finishes it."""
        return self.network.close() if self.network is not None else None

    def release(self, reason: KillReason) -> asyncio.Task[None]:
        """Start (once) killing everything and freeing what the sandbox holds.

        The network is cut before this returns.
        """
        if self.teardown is None:
            self.cut_network()
            self.teardown = asyncio.get_running_loop().create_task(self._release(reason))
            self.fail_pings()
        return self.teardown

    async def _release(self, reason: KillReason) -> None:
        network_rest = self.cut_network()  # cut already: this is what finishes it
        if self.settling is not None and not self.settling.done():
            self.settling.cancel()
        for ex in self.execs.values():
            for timer in (ex.timer, ex.backstop):
                if timer is not None:
                    timer.cancel()
        proc = self.proc
        try:
            if proc is not None:
                await asyncio.to_thread(proc.kill)
        finally:
            if self.transport is not None:
                self.transport.abort()
                self.transport = None
            if proc is not None:
                self._unwatch(proc)
                proc.close()
            if network_rest is not None:
                await asyncio.shield(network_rest)
            sid, backend = self.spec.session_id, self.backend
            for ident, ex in list(self.execs.items()):
                self.publish(KilledEvent(sid, backend, ident, reason))
                event = ExitEvent(sid, backend, ident, 128 + SIGKILL, SIGKILL)
                self.publish(event)
                if not ex.result.done():
                    ex.result.set_result(event)
                ex.stdin_broken = True
                ex.window.set()
            self.execs.clear()
            if not self.ready.done():
                self.ready.set_exception(LaunchError(backend.value, "agent", "destroyed"))
                self.ready.exception()
            self.end_streams()

    def _unwatch(self, proc: SandboxProcess) -> None:
        loop = asyncio.get_running_loop()
        for fd in (proc.pidfd, proc.diag_fd, proc.status_fd):
            if fd is not None and fd >= 0:
                loop.remove_reader(fd)


class _Attribution:
    """Names the exec behind each refused connection of one sandbox, off the event loop.

    The sandbox decides how many processes and fds there are to look through,
    and how many refusals to make; so the work is bounded. One scan at a time
    per sandbox, on the port's attribution threads, takes every refusal waiting
    at its start (``SandboxProcess.socket_holders``: the first holder of each
    socket, at most ``ATTRIBUTION_FDS`` fds looked at). Past
    ``ATTRIBUTION_WAITING`` waiting refusals, a new one is reported at once as
    unknown, saying it was not looked for. Every refusal is reported.
    """

    def __init__(self, sb: _Sandbox) -> None:
        self.sb = sb
        self.waiting: list[tuple[EgressDecision, _Connection, asyncio.Future[None]]] = []
        self.waiting_batch: list[tuple[EgressDecision, _Connection, asyncio.Future[None]]] = []
        self.task: asyncio.Task[None] | None = None

    def submit(
        self, decision: EgressDecision, connection: _Connection | None
    ) -> asyncio.Future[None]:
        """Attribute and report ``decision``; the future is done once it is reported."""
        sb = self.sb
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        if connection is None or sb.proc is None:
            why = "unknown: the proxy did not say which connection it was"
        elif len(self.waiting) >= ATTRIBUTION_WAITING:
            why = (
                f"unknown: not looked for, {len(self.waiting)} refusals of this sandbox "
                "were waiting for attribution already"
            )
        else:
            self.waiting.append((decision, connection, done))
            if self.task is None:
                self.task = loop.create_task(self._run())
            return done
        sb.publish_refusal(decision, 0, why)
        done.set_result(None)
        return done

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.waiting and self.sb.proc is not None and self.sb.state in RUNNING_STATES:
                batch, self.waiting = self.waiting, []
                self.waiting_batch = batch
                connections = [conn for _, conn, _ in batch]
                try:
                    found, gave_up = await loop.run_in_executor(
                        self.sb.port._attribution_threads(),
                        self.sb.proc.socket_holders,
                        connections,
                        ATTRIBUTION_FDS,
                    )
                except Exception:  # /proc changed under us, or a bug: unknown, never a guess
                    log.exception("sandbox %s: attribution failed", self.sb.spec.session_id)
                    found, gave_up = {}, False
                for decision, conn, done in batch:
                    chain = found.get(conn)
                    if chain is not None:
                        exec_id, why = self.sb.exec_of(chain)
                    elif gave_up:
                        exec_id = 0
                        why = f"unknown: gave up after looking at {ATTRIBUTION_FDS} fds"
                    else:
                        exec_id = 0
                        why = "unknown: no process of the sandbox holds the connection any more"
                    self.sb.publish_refusal(decision, exec_id, why)
                    if not done.done():
                        done.set_result(None)
        finally:
            self.task = None
            left, self.waiting, self.waiting_batch = [*self.waiting_batch, *self.waiting], [], []
            for decision, _, done in left:  # not looked for after all: said anyway
                if not done.done():
                    self.sb.publish_refusal(decision, 0, "unknown: the sandbox was going away")
                    done.set_result(None)


class Execution:
    """One command running in a sandbox: its events, stdin, and how to stop it.

    ``async for event in execution`` yields this command's events, ending after
    its ``exit``; ``wait`` and ``output`` read the rest for you.
    """

    def __init__(self, sandbox: _Sandbox, state: _ExecState, sub: _Subscriber) -> None:
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
        """SIGKILL the command's process group; a ``killed`` (manual) event precedes its exit."""
        await self._sandbox.port.kill(self._sandbox.snapshot(), self.exec_id)

    async def signal(self, signo: int, *, group: bool = True) -> None:
        """Deliver ``signo`` to the command (its whole process group by default)."""
        await self._sandbox.port.signal(self._sandbox.snapshot(), self.exec_id, signo, group=group)


class SandboxPort:
    """Launch and drive sandboxes (see the module rules). An async context manager.

    Args:
        sandbox: what an unspecified backend means: ``"require"`` (native or
            fail), ``"on"`` (native when offered, else none, logged) or ``"off"``
            (none, logged).
        bwrap: the bubblewrap executable (default: found on PATH).
        python: the interpreter that runs the agent (default: this one).
        launch_timeout: seconds to wait for the agent's hello.
        kill_grace: seconds the agent has to confirm a kill before the sandbox
            is declared broken and killed whole.
    """

    PIPE = PIPE

    def __init__(
        self,
        *,
        sandbox: str = "require",
        bwrap: str | None = None,
        python: str | None = None,
        launch_timeout: float = 10.0,
        kill_grace: float = 5.0,
    ) -> None:
        if sandbox not in ("require", "on", "off"):
            raise ValueError(f"sandbox must be 'require', 'on' or 'off', not {sandbox!r}")
        self.sandbox_policy = sandbox
        self.bwrap = bwrap
        self.python = python
        self.launch_timeout = launch_timeout
        self.kill_grace = kill_grace
        self._sandboxes: dict[str, _Sandbox] = {}
        self._closed = False
        from sandhold.net.budget import ConnectionBudget, plan_budget, raise_fd_limit

        # Every sandbox's proxies share this process's fd table: raise the limit, and
        # give each sandbox a share of it, so one cannot starve the others or a launch.
        self._connections = ConnectionBudget(plan_budget(raise_fd_limit()))
        self._warned = False
        # The egress seam: a factory the integrator sets, called per native launch
        # with the spec, returning a ``NetworkSetup`` (see backends/linux/launcher.py).
        self._network_factory: Callable[[SandboxSpec], NetworkSetup | None] | None = None
        self._attribution_pool: ThreadPoolExecutor | None = None
        self._lookups: LookupThreads | None = None

    def _lookup_threads(self) -> LookupThreads:
        """The threads every sandbox's proxies resolve names on, a few each at most."""
        if self._lookups is None:
            from sandhold.net.outbound import LookupThreads

            self._lookups = LookupThreads()
        return self._lookups

    def _attribution_threads(self) -> ThreadPoolExecutor:
        """The threads attribution scans run on (``_Attribution``), made at first use."""
        if self._attribution_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._attribution_pool = ThreadPoolExecutor(
                ATTRIBUTION_THREADS, thread_name_prefix="sandhold-attribution"
            )
        return self._attribution_pool

    async def __aenter__(self) -> SandboxPort:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Destroy every sandbox this port launched. Safe to call twice.

        Every sandbox's network is cut before the first ``await``.

        Cancellation: shielded; the sandboxes are gone when it returns or raises.
        """
        self._closed = True
        live = [sb for sb in self._sandboxes.values() if sb.state is not SandboxState.DESTROYED]
        for sb in live:
            sb.cut_network()
        if live:
            await asyncio.shield(asyncio.gather(*(self._destroy(sb) for sb in live)))
        if self._attribution_pool is not None:
            self._attribution_pool.shutdown(wait=False, cancel_futures=True)
            self._attribution_pool = None
        if self._lookups is not None:
            self._lookups.close()
            self._lookups = None

    def _forget_old_destroyed(self) -> None:
        """Keep the last ``KEEP_DESTROYED`` destroyed sandboxes' final handles; a
        long-lived port must not grow with every session it ever ran."""
        gone = [sid for sid, sb in self._sandboxes.items() if sb.state is SandboxState.DESTROYED]
        for sid in gone[: max(0, len(gone) - KEEP_DESTROYED)]:
            del self._sandboxes[sid]

    # -- lookups -------------------------------------------------------------------

    def _get(self, handle: SandboxHandle | str) -> _Sandbox:
        sid = handle if isinstance(handle, str) else handle.session_id
        sb = self._sandboxes.get(sid)
        if sb is None:
            raise SpecError("session_id", f"no sandbox {sid!r} in this port")
        return sb

    def handle(self, handle: SandboxHandle | str) -> SandboxHandle:
        """The current snapshot of a sandbox (by handle or session id)."""
        return self._get(handle).snapshot()

    def handles(self) -> list[SandboxHandle]:
        return [sb.snapshot() for sb in self._sandboxes.values()]

    def explain(self, spec: SandboxSpec) -> str:
        """What a native launch of ``spec`` would mount, and why, without launching it.

        Raises:
            SpecError, UnenforceablePolicy: as ``launch`` would.
        """
        from sandhold.backends.linux.hostfs import OsHostView
        from sandhold.backends.linux.launcher import agent_boot
        from sandhold.backends.linux.session import private_base
        from sandhold.policy.specplan import SpecHost, plan_spec, render_spec_plan

        spec = spec.validate()
        _egress_policy(spec)
        base = private_base()
        facts = SpecHost(
            _home(),
            f"{base}/<session>/tmp",
            base,
            agent_boot(self.python).paths,
            _code_paths(),
            **_confinement_facts(),
            **_launch_facts(),
        )
        plan = plan_spec(spec, facts, OsHostView())
        return render_spec_plan(plan)

    # -- backend choice ------------------------------------------------------------

    def select_backend(self, requested: SandboxBackend | None) -> SandboxBackend:
        """The backend a launch will use (see module rules).

        Raises:
            BackendUnavailable: an explicit backend (or, with ``sandbox="require"``,
                native) is not available here. Nothing was started.
        """
        from sandhold.probe import quick_probe

        if requested is SandboxBackend.MICROVM:
            kvm = "present" if os.path.exists("/dev/kvm") else "absent"
            raise BackendUnavailable(
                "microvm",
                f"sandhold has no microVM backend yet (/dev/kvm {kvm}); nothing was "
                "started and there is no fallback to a weaker backend",
            )
        if requested is SandboxBackend.NONE:
            return SandboxBackend.NONE
        probe = quick_probe(self.bwrap)
        if requested is SandboxBackend.NATIVE:
            if not probe.available:
                raise BackendUnavailable("native", f"{probe.note}; {probe.hint}")
            return SandboxBackend.NATIVE
        if self.sandbox_policy == "off":
            log.warning("agent sandbox DISABLED by sandbox=off: backend none (no isolation)")
            return SandboxBackend.NONE
        if probe.available:
            log.info("no microVM backend on this host: using native (%s)", probe.note)
            return SandboxBackend.NATIVE
        if self.sandbox_policy == "on":
            log.warning(
                "no OS-native agent sandbox on this host (%s; %s): backend none",
                probe.note,
                probe.hint,
            )
            return SandboxBackend.NONE
        raise BackendUnavailable(
            "native",
            f"{probe.note}; {probe.hint}; or launch with backend=SandboxBackend.NONE "
            "to run without isolation",
        )

    # -- launch --------------------------------------------------------------------

    async def launch(
        self,
        spec: SandboxSpec,
        *,
        backend: SandboxBackend | None = None,
        limits: ResourceLimits | None = None,
    ) -> SandboxHandle:
        """Start a sandbox for ``spec`` and wait until it is ready for ``exec``.

        Args:
            spec: what to launch; validated here.
            backend: an exact backend, or None for the port's ``sandbox`` policy.
            limits: memory/pids/CPU limits (cgroup v2, where delegated).

        Returns:
            The handle, in state ``warm``.

        Raises:
            SpecError: the spec is malformed, or its session id is already live.
            BackendUnavailable: the backend cannot be used (nothing started).
            UnenforceablePolicy: the spec or limits cannot be enforced here.
            LaunchFailed: starting failed; ``exc.handle`` is in state ``error``.

        Cancellation: what was started is killed; the handle ends ``destroyed``.
        """
        if self._closed:
            raise SandholdError("this SandboxPort is closed")
        spec = spec.validate()
        old = self._sandboxes.get(spec.session_id)
        if old is not None and old.state is not SandboxState.DESTROYED:
            raise SpecError("session_id", f"{spec.session_id!r} already has a live sandbox")
        chosen = self.select_backend(backend)
        if limits is not None and limits.controllers:
            from sandhold.backends.linux import cgroups

            why = cgroups.probe().limits_reason(limits.controllers)
            if why is not None:
                raise UnenforceablePolicy("resource limits", chosen.value, why)
        from sandhold.backends.linux.launcher import agent_boot

        boot = agent_boot(self.python)
        session: Session | None = None
        plan: SpecPlan | None = None
        policy = _egress_policy(spec)  # checked whatever the backend: the spec is bad or not
        egress: EgressNetwork | None = None
        if chosen is SandboxBackend.NATIVE:
            session, plan = self._plan_native(spec, boot.paths)
        sb = _Sandbox(self, spec, chosen)
        self._sandboxes[spec.session_id] = sb
        self._forget_old_destroyed()
        sb.publish(StartingEvent(spec.session_id, chosen))
        started = time.monotonic()
        step = "start"
        try:
            from sandhold.backends.linux import launcher
            from sandhold.policy.env import filter_environment

            passed = filter_environment(os.environ).as_mapping()
            if plan is not None and session is not None:
                from sandhold.probe import quick_probe

                bwrap = quick_probe(self.bwrap).bwrap or "bwrap"
                factory = self._network_factory
                if factory is not None:
                    sb.network = factory(spec)
                    sb.details["network"] = "set up by port._network_factory"
                else:
                    sb.network = egress = _egress_network(sb, policy, boot)
                    sb.details["network"] = plan.network
                sb.workdir = plan.workdir
                home = passed.get("HOME", "")
                passed.update(TMPDIR="/tmp", TMP="/tmp", TEMP="/tmp")
                passed["HOME"] = home if plan.home_visible and home else "/tmp"
                if sb.network is not None:
                    passed.update(sb.network.environment())
                sb.details["workdir"] = plan.workdir
                for warning in plan.warnings:
                    # once per port at WARNING (the CLI says it on every run; a
                    # server would say it on every launch), then at INFO
                    level = logging.INFO if self._warned else logging.WARNING
                    log.log(level, "sandbox %s: %s", spec.session_id, warning)
                    self._warned = True
                sb.details["confinement"] = (
                    ", ".join(
                        (
                            *(("creation-time supervisor",) if plan.creation is not None else ()),
                            *(("landlock",) if plan.landlock is not None else ()),
                        )
                    )
                    or "mounts only"
                )
                step = "spawn bwrap"
                sb.proc = launcher.spawn_native(
                    plan, bwrap=bwrap, session=session, boot=boot, network=sb.network
                )
                session = None  # the process owns it now
                if egress is not None and egress.netns:
                    sb.details["network_namespace"] = str(egress.netns)
            else:
                sb.workdir = spec.guest_workdir or (
                    spec.bind_mounts[0].host_path if spec.bind_mounts else os.getcwd()
                )
                log.warning(
                    "sandbox %s: backend none: commands run on the host without isolation "
                    "(environment scrubbed)",
                    spec.session_id,
                )
                sb.details.update(workdir=sb.workdir, network="host network (no isolation)")
                step = "start agent"
                sb.proc = launcher.spawn_host(sb.workdir, boot=boot)
            sb.base_env = dict(passed)
            step = "agent hello"
            await self._start(sb, limits)
            sb.details["launch_ms"] = f"{(time.monotonic() - started) * 1000:.1f}"
            sb.apply(Action.READY)
            sb.publish(ReadyEvent(spec.session_id, chosen))
            return sb.snapshot()
        except asyncio.CancelledError:
            if session is not None:
                session.close()
            await asyncio.shield(sb.release(KillReason.DESTROYED))
            sb.state = transition(sb.state, Action.DESTROY)
            raise
        except Exception as exc:  # whatever broke, nothing started may stay behind
            if session is not None:
                session.close()
            detail = _describe(exc, sb)
            if sb.state is SandboxState.CREATED:
                sb.error = f"{step}: {detail}"
                sb.apply(Action.FAIL)
            await asyncio.shield(sb.release(KillReason.DESTROYED))
            raise LaunchFailed(chosen.value, step, detail, sb.snapshot()) from exc

    def _plan_native(
        self, spec: SandboxSpec, agent_paths: tuple[str, ...]
    ) -> tuple[Session, SpecPlan]:
        from sandhold.backends.linux.hostfs import OsHostView
        from sandhold.backends.linux.session import open_session
        from sandhold.policy.specplan import SpecHost, plan_spec

        session = open_session()
        try:
            plan = plan_spec(
                spec,
                SpecHost(
                    home=_home(),
                    tmpdir=session.tmpdir,
                    private_root=session.base,
                    agent_paths=agent_paths,
                    code_paths=_code_paths(),
                    **_confinement_facts(),
                    **_launch_facts(),
                ),
                OsHostView(),
            )
        except BaseException:
            session.close()
            raise
        return session, plan

    async def _start(self, sb: _Sandbox, limits: ResourceLimits | None) -> None:
        """Wait for the agent's hello while its tree is put in its cgroup (overlapped)."""
        proc = sb.proc
        assert proc is not None
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_unix_connection(lambda: _Channel(sb), sock=proc.channel)
        sb.transport = transport
        known: asyncio.Future[None] = loop.create_future()

        def on_diag() -> None:
            if not proc.read_diag():
                loop.remove_reader(proc.diag_fd)

        def on_status() -> None:
            more = proc.read_status()
            if proc.init_pid and not known.done():
                known.set_result(None)
            if not more:
                assert proc.status_fd is not None
                loop.remove_reader(proc.status_fd)
                if not known.done():
                    known.set_exception(
                        LaunchError("native", "bwrap status", "bwrap ended before the sandbox ran")
                    )

        def exited() -> None:
            if proc.reap() is None:
                return
            loop.remove_reader(proc.pidfd)
            if sb.teardown is None:
                proc.read_diag()
                status = proc.exit_status or 0
                sb.fail(f"the sandbox exited (status {status:#x}){_diag_tail(proc)}")

        loop.add_reader(proc.diag_fd, on_diag)
        if proc.status_fd is not None:
            loop.add_reader(proc.status_fd, on_status)
        else:
            known.set_result(None)
        loop.add_reader(proc.pidfd, exited)
        want_limits = limits is not None and bool(limits.controllers)

        async def identify_then_adopt() -> None:
            await self._identify(sb, known)
            # Moving the tree into its cgroup starts as soon as bwrap has named the
            # sandbox's init, while the agent's interpreter starts. The first move
            # costs the kernel an RCU grace period (~15 ms here). The agent forks
            # nothing before its first exec, and exec and suspend wait for the move,
            # so without limits it may finish behind ``ready``; limits must hold
            # before anything runs, so then ``ready`` waits for it.
            adopt = self._adopt(sb, limits) if want_limits else self._adopt_quietly(sb)
            sb.settling = loop.create_task(adopt)

        tree = loop.create_task(identify_then_adopt())
        hello = asyncio.ensure_future(asyncio.shield(sb.ready))
        try:
            async with asyncio.timeout(self.launch_timeout):
                await asyncio.gather(hello, tree)
                if want_limits and sb.settling is not None:
                    await sb.settling
        except TimeoutError:
            raise LaunchError(
                sb.backend.value, "agent hello", f"not ready within {self.launch_timeout:g} s"
            ) from None
        finally:
            for task in (tree, hello):
                if not task.done():
                    task.cancel()
            await asyncio.gather(tree, hello, return_exceptions=True)
            if not known.done():
                known.cancel()
            elif not known.cancelled():
                known.exception()  # retrieved: a failure here is reported by ``tree``

    async def _identify(self, sb: _Sandbox, known: asyncio.Future[None]) -> None:
        """Pin the sandbox's init once bwrap has named it (native), and record the pids."""
        proc = sb.proc
        assert proc is not None
        await known
        if proc.backend == "native":
            proc.pin_init()
            sb.details.update(
                pid=str(proc.pid),
                init_pid=str(proc.init_pid),
                pid_namespace=str(proc.pid_namespace),
            )
        else:
            sb.details["pid"] = str(proc.pid)

    async def _adopt(self, sb: _Sandbox, limits: ResourceLimits | None) -> None:
        """Put the tree in a cgroup of its own (freezer, limits), or settle for SIGSTOP.

        Raises:
            UnenforceablePolicy: limits were asked for and the cgroup cannot carry them.
        """
        from sandhold.backends.linux import cgroups

        proc = sb.proc
        assert proc is not None
        info = cgroups.probe()
        want_limits = limits is not None and bool(limits.controllers)
        if want_limits and limits is not None:
            sb.details["limits"] = ", ".join(limits.controllers)
        else:
            why = info.limits_reason(cgroups.LIMIT_CONTROLLERS)
            sb.details["limits"] = f"unavailable: {why}" if why else "available (none set)"
        sb.details["cgroup"] = ""
        sb.details["freezer"] = "sigstop"
        if not (info.freezer or want_limits):
            return
        try:
            cgroup = cgroups.SandboxCgroup.create(
                info, f"sandhold-{os.getpid()}-{os.urandom(4).hex()}"
            )
            proc.cgroup = cgroup  # from here on, closing the sandbox removes it
            sb.details.update(cgroup=cgroup.path, freezer="cgroup" if info.freezer else "sigstop")
            if limits is not None and want_limits:
                cgroup.set_limits(limits)
            await asyncio.to_thread(proc.adopt, cgroup, self.launch_timeout)
        except (OSError, LaunchError) as exc:
            # Part of the tree may be inside: the cgroup stays for close() to kill and
            # remove, but the freezer is not used on a partial tree.
            proc.cgroup_complete = False
            sb.details["freezer"] = "sigstop"
            if want_limits:
                raise UnenforceablePolicy("resource limits", sb.backend.value, str(exc)) from exc
            # No cgroup after all: suspend falls back to SIGSTOP, which needs none.
            if sb.teardown is None:
                log.info(
                    "sandbox %s: no cgroup (%s); suspend uses SIGSTOP", sb.spec.session_id, exc
                )

    async def _adopt_quietly(self, sb: _Sandbox) -> None:
        try:
            await self._adopt(sb, None)
        except Exception:  # _adopt only raises for limits, which are never set here
            log.exception("sandbox %s: cgroup set-up failed", sb.spec.session_id)

    # -- exec ------------------------------------------------------------------------

    async def exec(
        self,
        handle: SandboxHandle | str,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: StdinArg = None,
        timeout: float | None = None,
    ) -> Execution:
        """Start ``command`` in the sandbox; returns at once with its ``Execution``.

        Args:
            command: an argv list, or a string run by ``/bin/sh -c``.
            cwd: working directory (relative: to the spec's workdir; default: it).
            env: variables set on top of the sandbox's scrubbed environment.
            stdin: None (``/dev/null``), bytes/str (sent, then closed), an async
                iterable of bytes (streamed, then closed), or ``PIPE`` (use
                ``Execution.write``/``close_stdin``).
            timeout: seconds of running time after which the command's process
                group is killed (``killed`` timeout, then ``exit``).

        Raises:
            InvalidTransition: the sandbox is not warm or active.
            ValueError: an empty command, a NUL in an argument or variable, or a
                timeout that is not a positive finite number.
            TypeError: an argument of the wrong type. Nothing has run then.

        Cancellation: the request is sent at the first await, or after the
        sandbox's cgroup move if that is still going on (right after ``launch``);
        cancelled before that, nothing ran. A cancelled caller after it leaves the
        command running (find it with ``handle``/``events``).
        """
        sb = self._get(handle)
        sb.check(Action.EXEC)
        if sb.settling is not None and not sb.settling.done():
            await sb.settled()
            sb.check(Action.EXEC)
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        if not argv or not argv[0]:
            raise ValueError("empty command")
        _check_exec_args(argv, cwd, env, stdin, timeout)  # before anything runs
        workdir = sb.workdir
        path = cwd if cwd is None or cwd.startswith("/") else f"{workdir.rstrip('/')}/{cwd}"
        run_env = dict(sb.base_env)
        if sb.network is not None:
            run_env.update(sb.network.exec_environment(sb.next_id))
        if env:
            run_env.update(env)
        run_env["PWD"] = path or workdir
        items = [*argv, *(f"{k}={v}" for k, v in run_env.items())]
        if any("\0" in s for s in items) or any("=" in k or not k for k in run_env):
            raise ValueError("arguments and variables may not contain NUL; names not '=' or empty")
        ex = _ExecState(sb.next_id, timeout)
        sb.next_id += 1
        sub = sb.subscribe(ex.exec_id)
        request = P.encode_fields(
            {
                "argv": argv,
                "env": [f"{k}={v}" for k, v in run_env.items()],
                "cwd": path or workdir,
                "stdin": 0 if stdin is None else 1,
            }
        )
        sb.send(P.EXEC, ex.exec_id, request)
        sb.execs[ex.exec_id] = ex
        sb.apply(Action.EXEC)
        ex.stdin_open = stdin is not None
        if timeout is not None:
            ex.deadline = time.monotonic() + timeout
            ex.timer = asyncio.get_running_loop().call_later(timeout, sb.on_timeout, ex)
        execution = Execution(sb, ex, sub)
        if stdin is not None and not isinstance(stdin, _Pipe):
            asyncio.get_running_loop().create_task(_pump(execution, stdin))
        return execution

    async def run(
        self,
        handle: SandboxHandle | str,
        command: Sequence[str] | str,
        **kwargs: object,
    ) -> ExecResult:
        """``exec`` then ``output``: the finished command's status and output."""
        execution = await self.exec(handle, command, **kwargs)  # type: ignore[arg-type]
        return await execution.output()

    async def kill(
        self, handle: SandboxHandle | str, exec_id: int, reason: KillReason = KillReason.MANUAL
    ) -> None:
        """SIGKILL one command's process group; ``killed`` (reason) then ``exit`` follow.

        A command that already ended is left alone. While the sandbox is
        suspended the kill is delivered when it resumes.
        """
        sb = self._get(handle)
        ex = sb.execs.get(exec_id)
        if ex is not None:
            sb.request_kill(ex, reason)

    async def signal(
        self, handle: SandboxHandle | str, exec_id: int, signo: int, *, group: bool = True
    ) -> None:
        """Deliver ``signo`` to one command (its process group by default)."""
        sb = self._get(handle)
        if exec_id in sb.execs or group:
            fields = P.encode_fields({"signo": int(signo), "group": int(group)})
            sb.send(P.SIGNAL, exec_id, fields)

    async def ping(
        self, handle: SandboxHandle | str, *, timeout: float | None = PING_TIMEOUT
    ) -> float:
        """One round trip to the agent, in seconds (a liveness check).

        Args:
            timeout: seconds to wait for the answer, or None to wait as long as
                the sandbox lives. A suspended sandbox's agent is frozen too: it
                answers once resumed, and the time frozen counts.

        Raises:
            TimeoutError: no answer within ``timeout``; the sandbox is left as it
                is (its agent may be stopped or stuck).
            InvalidTransition: the sandbox is destroyed or failed, or is destroyed
                or fails while the ping waits.
            TypeError, ValueError: ``timeout`` is not None or a positive, finite
                number of seconds. Nothing was sent.

        Cancellation: the answer, if it comes, is dropped.
        """
        _check_timeout(timeout)
        sb = self._get(handle)
        token, fut = sb.new_ping()
        try:
            start = time.perf_counter()
            sb.send(P.PING, token, P.encode_fields({}))
            async with asyncio.timeout(timeout):
                await fut
            return time.perf_counter() - start
        except TimeoutError:
            raise TimeoutError(
                f"sandbox {sb.spec.session_id}: the agent did not answer within {timeout:g} s"
            ) from None
        finally:
            sb.pings.pop(token, None)

    def report_violation(
        self, handle: SandboxHandle | str, violation: SandboxViolation, exec_id: int = 0
    ) -> None:
        """Emit a ``violation`` into the sandbox's stream, attributed to ``exec_id``.

        For backends and proxies running in this process (the agent's own
        reports arrive as protocol frames). Ignored once the sandbox is gone.
        """
        sb = self._get(handle)
        if sb.state in RUNNING_STATES:
            sb.publish(ViolationEvent(sb.spec.session_id, sb.backend, exec_id, violation))

    # -- events ------------------------------------------------------------------------

    def events(self, handle: SandboxHandle | str) -> AsyncIterator[SandboxEvent]:
        """Every event of the sandbox from now on, after a replay of its ``starting``
        and ``ready``; ends when the sandbox is destroyed or fails.

        Output of commands started before the call is only partly seen; take
        their ``Execution`` for all of it. The stream counts for flow control from
        this call on: read it, or drop it (it is unsubscribed when collected).
        """
        sb = self._get(handle)
        sub = sb.subscribe(None)
        stream = _stream(sb, sub)
        # as for an Execution: a stream dropped unread (or never started, so its
        # ``finally`` never runs) must not hold the sandbox's output back for ever
        weakref.finalize(stream, sb.unsubscribe, sub)
        return stream

    # -- suspend / resume / destroy ---------------------------------------------------

    async def suspend(self, handle: SandboxHandle | str) -> SandboxHandle:
        """Freeze the whole process tree (cgroup freezer, else SIGSTOP of every process).

        Raises:
            InvalidTransition: not warm or active.
            LaunchError: the tree would not stop (the sandbox is then failed).
        """
        sb = self._get(handle)
        sb.check(Action.SUSPEND)
        await sb.settled()
        sb.check(Action.SUSPEND)
        proc = sb.proc
        assert proc is not None
        sb.pause_timers()
        try:
            how = await asyncio.to_thread(proc.freeze)
        except LaunchError:
            sb.fail("the sandbox could not be frozen")
            raise
        sb.details["frozen_by"] = how
        sb.apply(Action.SUSPEND)
        return sb.snapshot()

    async def resume(self, handle: SandboxHandle | str) -> SandboxHandle:
        """Thaw a suspended sandbox; it returns to ``active`` if commands were running."""
        sb = self._get(handle)
        action = Action.RESUME_BUSY if sb.execs else Action.RESUME
        sb.check(action)
        proc = sb.proc
        assert proc is not None
        try:
            await asyncio.to_thread(proc.thaw)
        except LaunchError:
            sb.fail("the sandbox could not be thawed")
            raise
        sb.details.pop("frozen_by", None)
        sb.apply(action)
        sb.resume_timers()
        return sb.snapshot()

    async def destroy(self, handle: SandboxHandle | str) -> SandboxHandle:
        """Kill everything in the sandbox and free what it holds; the handle is then invalid.

        The network goes first: the proxies' listeners are shut down before the
        first ``await``, then the tree is killed and the open connections aborted.

        Raises:
            InvalidTransition: already destroyed.
            LaunchError: a process survived SIGKILL (named in the message).

        Cancellation: shielded; the teardown completes.
        """
        sb = self._get(handle)
        sb.check(Action.DESTROY)
        sb.cut_network()
        return await asyncio.shield(self._destroy(sb))

    async def _destroy(self, sb: _Sandbox) -> SandboxHandle:
        await sb.release(KillReason.DESTROYED)
        if sb.state is not SandboxState.DESTROYED:
            sb.apply(Action.DESTROY)
        return sb.snapshot()


async def _stream(sb: _Sandbox, sub: _Subscriber) -> AsyncIterator[SandboxEvent]:
    try:
        while True:
            event = await sub.get()
            sb.maybe_resume_reading()
            if event is None:
                return
            yield event
    finally:
        sb.unsubscribe(sub)


async def _pump(execution: Execution, stdin: bytes | str | AsyncIterable[bytes]) -> None:
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


def _egress_policy(spec: SandboxSpec) -> DomainPolicy:
    """The session's allowlist (F-NET-3): baseline + GitHub + ``egress_allowlist``.

    Raises:
        SpecError: an ``egress_allowlist`` entry is not a valid domain pattern.
    """
    from sandhold.policy.domains import DomainPolicy

    try:
        return DomainPolicy.for_spec(spec.egress_allowlist, spec.network_enabled)
    except ValueError as exc:
        raise SpecError("egress_allowlist", str(exc)) from None


def _code_paths() -> tuple[str, ...]:
    from sandhold.backends.linux.native import own_code_paths

    return own_code_paths()


_CONFINEMENT: dict[str, Any] = {}


def _launch_facts() -> dict[str, Any]:
    """The ``SpecHost`` facts read at each launch (mounts come and go): the harness's
    ``$XDG_CONFIG_HOME``, ``$JJ_CONFIG``, ``$PATH`` and git config files, and the
    host's kernel file system mounts."""
    from sandhold.backends.linux.hostfs import kernel_mounts
    from sandhold.policy.gitconfig import host_files

    return {
        "xdg_config_home": os.environ.get("XDG_CONFIG_HOME", ""),
        "jj_config": os.environ.get("JJ_CONFIG", ""),
        "path_env": os.environ.get("PATH", ""),
        "git_configs": host_files(_home(), os.environ),
        "kernel_mounts": kernel_mounts(),
    }


def _confinement_facts() -> dict[str, Any]:
    """What the kernel offers the creation-time supervisor and Landlock (probed once)."""
    if not _CONFINEMENT:
        from sandhold.backends.linux.seccomp import supervisor_blocker
        from sandhold.backends.linux.supervisor.landlock import landlock_abi

        blocker = supervisor_blocker()
        _CONFINEMENT["supervisor"] = blocker is None
        if blocker is not None:
            _CONFINEMENT["supervisor_blocker"] = blocker
        _CONFINEMENT["landlock"] = landlock_abi() > 0
    return dict(_CONFINEMENT)


def _egress_network(sb: _Sandbox, policy: DomainPolicy, boot: AgentBoot) -> EgressNetwork:
    """The sandbox's own proxies, reporting refusals into its event stream."""
    from sandhold.backends.linux.launcher import EgressNetwork

    return EgressNetwork(
        policy,
        python=boot.python,
        sshproxy=os.path.join(boot.package_dir, "agent", "sshproxy.py"),
        on_decision=sb.on_egress,
        budget=sb.port._connections.session(),
        label=f"sandbox {sb.spec.session_id}",
        resolver=sb.port._lookup_threads().resolver(),
    )


def _home() -> str:
    home = os.environ.get("HOME", "")
    if home.startswith("/"):
        return home.rstrip("/") or "/"
    import pwd

    return pwd.getpwuid(os.getuid()).pw_dir


def _diag_tail(proc: SandboxProcess) -> str:
    text = proc.diag.decode("utf-8", "replace").strip()
    return f": {text[-1000:]}" if text else ""


def _describe(exc: BaseException, sb: _Sandbox) -> str:
    proc = sb.proc
    if proc is not None:
        proc.read_diag()
        tail = _diag_tail(proc)
    else:
        tail = ""
    if isinstance(exc, LaunchError):
        text = exc.detail or exc.step
    elif isinstance(exc, SandholdError):
        text = exc.render()
    else:
        text = str(exc)
    return text + tail


# --- the synchronous facade ------------------------------------------------------------


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


# --- one-shot wrapping ------------------------------------------------------------------


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
        proc = await asyncio.create_subprocess_exec(*self.wrap(command), cwd=cwd)
        try:
            return await proc.wait()
        except asyncio.CancelledError:
            proc.terminate()
            await asyncio.shield(proc.wait())
            raise


def _check_exec_args(
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
    _check_timeout(timeout)
    if not (
        stdin is None
        or stdin is PIPE
        or isinstance(stdin, (bytes, str))
        or hasattr(stdin, "__aiter__")
    ):
        raise TypeError("stdin must be None, bytes, str, an async iterable of bytes or PIPE")


def _check_timeout(timeout: object) -> None:
    """Refuse a timeout that is not None or a positive, finite number of seconds."""
    import math

    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError("timeout must be seconds (a number) or None")
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError("timeout must be a positive, finite number of seconds")
