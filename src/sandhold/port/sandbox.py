"""The port's live record of one sandbox: its state, its execs, and the agent's frames.

Rules:
- A sandbox moves only through ``spec.TRANSITIONS``.
- Everything the agent says is untrusted: a malformed or impossible frame puts
  the sandbox in ``error`` and kills it. Each violation field and ``LOG``
  message is cut to ``MAX_AGENT_TEXT`` characters; ``LOG`` lines are logged at
  most once a second.
- A timeout or kill is delivered by the agent (SIGKILL to the command's whole
  tree); if the agent does not report the exit within ``kill_grace`` the
  sandbox goes to ``error`` and is killed whole. Time suspended does not count.
- Teardown cuts the network first, then kills the tree, then ends every stream.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sandhold._throttle import Throttle
from sandhold.agent import protocol as P
from sandhold.errors import InvalidTransition, LaunchError
from sandhold.port import flow
from sandhold.port.attribution import Attribution
from sandhold.port.flow import Subscriber
from sandhold.spec import (
    RUNNING_STATES,
    Action,
    ExitEvent,
    KilledEvent,
    KillReason,
    ReadyEvent,
    SandboxBackend,
    SandboxHandle,
    SandboxSpec,
    SandboxState,
    SandboxViolation,
    StartingEvent,
    StderrEvent,
    StdoutEvent,
    ViolationEvent,
    transition,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Awaitable

    from sandhold.backends.linux.launcher import (
        NetworkSetup,
        SandboxProcess,
    )
    from sandhold.net.egress import EgressDecision
    from sandhold.port.api import SandboxPort
    from sandhold.spec import SandboxEvent


log = logging.getLogger("sandhold")


MAX_AGENT_TEXT = 8192  # characters kept of each violation field and LOG line from the agent
DECODE_BATCH = 1024  # frames decoded from the channel between looks at flow control
PING_TOKENS = 1 << 31  # ping ids count from here: apart from exec ids, within the u32 id
SIGKILL = 9


def agent_text(value: P.FieldOut | None, default: str = "") -> str:
    """A text field from the agent, cut to ``MAX_AGENT_TEXT`` characters."""
    text = P.text(value, default)
    if len(text) <= MAX_AGENT_TEXT:
        return text
    return text[:MAX_AGENT_TEXT] + f"... [{len(text) - MAX_AGENT_TEXT} more characters cut]"


class ExecState:
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


class Channel(asyncio.Protocol):
    """The agent's frames in, ``DECODE_BATCH`` at a time: reading stops soon after a
    reader's budget is taken even inside one read (which holds up to 256 KiB: some
    26,000 tiny frames, ~3.5 MiB once queued). Frames not yet decoded wait in the
    decoder, as bytes and in order, until the readers catch up."""

    def __init__(self, sandbox: Sandbox) -> None:
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


class Sandbox:
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
        self.channel: Channel | None = None
        self.subscribers: list[Subscriber] = []
        self.lifecycle: list[SandboxEvent] = []
        self.execs: dict[int, ExecState] = {}
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
        self.attribution = Attribution(self)

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
            details=dict(self.details),
        )

    # -- events --------------------------------------------------------------------

    def publish(self, event: SandboxEvent) -> None:
        if isinstance(event, StartingEvent | ReadyEvent):
            self.lifecycle.append(event)
        for sub in list(self.subscribers):
            if sub.exec_id is None or sub.exec_id == event.exec_id:
                sub.put(event)
                if sub.pending > flow.HIGH_WATER and not self.paused and self.transport is not None:
                    self.transport.pause_reading()
                    self.paused = True

    def subscribe(self, exec_id: int | None, sub: Subscriber | None = None) -> Subscriber:
        """A new reader (``sub``, when given, reads every event), after a replay of
        the lifecycle events, and the end if the sandbox has ended."""
        sub = Subscriber(exec_id) if sub is None else sub
        if sub.exec_id is None:
            for event in self.lifecycle:
                sub.put(event)
            if self.state in (SandboxState.DESTROYED, SandboxState.ERROR):
                sub.put(None)
        self.subscribers.append(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        if sub in self.subscribers:
            self.subscribers.remove(sub)
        self.maybe_resume_reading()

    def maybe_resume_reading(self) -> None:
        if self.paused and all(s.pending < flow.LOW_WATER for s in self.subscribers):
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
                action=agent_text(fields.get("action"), "unknown"),
                target=agent_text(fields.get("target")),
                raw=agent_text(fields.get("raw")),
                rule=agent_text(fields.get("rule")),
            )
            self.publish(ViolationEvent(self.spec.session_id, self.backend, ident, violation))
        elif kind == P.LOG:
            held = self.agent_log.take()
            if held is not None:
                log.warning(
                    "sandbox %s agent: %s%s",
                    self.spec.session_id,
                    agent_text(fields.get("message")),
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

    def request_kill(self, ex: ExecState, reason: KillReason) -> None:
        if ex.kill_reason is None:
            ex.kill_reason = reason
        self.send(P.SIGNAL, ex.exec_id, P.encode_fields({"signo": SIGKILL, "group": 1, "tree": 1}))
        if ex.backstop is None and self.state is not SandboxState.SUSPENDED:
            self.arm_backstop(ex)

    def arm_backstop(self, ex: ExecState) -> None:
        loop = asyncio.get_running_loop()
        ex.backstop = loop.call_later(
            self.port.kill_grace,
            self.fail,
            f"the agent did not confirm the kill of exec {ex.exec_id} "
            f"within {self.port.kill_grace:g} s",
        )

    def on_timeout(self, ex: ExecState) -> None:
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
