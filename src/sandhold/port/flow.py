"""Output flow control: each reader's queue of a sandbox's events, and its budget.

Rules:
- When a subscriber's unread output takes more than ``HIGH_WATER`` bytes (its
  data, plus ``EVENT_COST`` per event: many tiny writes cost memory too), the
  port stops reading that sandbox's channel (its commands block on write) until
  every subscriber is under ``LOW_WATER`` (``Sandbox.publish`` and
  ``Sandbox.maybe_resume_reading``).
- A ``Listener`` (a callback) queues nothing and never pauses the channel: its
  owner keeps its own bounded copy (the server's history and captures).
- Refusals cannot wait for a slow reader: past ``MAX_QUEUED_VIOLATIONS`` (or
  ``MAX_QUEUED_VIOLATION_BYTES`` of their text) they are counted in one
  ``violations-dropped`` event.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from sandhold.refusals import DROPPED
from sandhold.spec import (
    SandboxViolation,
    StderrEvent,
    StdoutEvent,
    ViolationEvent,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from sandhold.port.sandbox import Sandbox
    from sandhold.spec import SandboxEvent


log = logging.getLogger("sandhold")

MAX_QUEUED_VIOLATIONS = 10_000  # per reader; more are counted in one DROPPED event
MAX_QUEUED_VIOLATION_BYTES = 4 << 20  # per reader, of the violations' text
HIGH_WATER = 8 << 20  # bytes of memory a reader's queued output may take before reading stops
LOW_WATER = 2 << 20  # ... and below which every reader must be before it starts again
# What one queued output event costs besides its data: the event record, its bytes
# object's header, its exec id and the queue's slot (~134 bytes measured on CPython
# 3.11, x86-64). A sandbox writing one byte at a time would otherwise queue ~130
# times the budget before reading stopped.
EVENT_COST = 136


class Subscriber:
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


class Listener(Subscriber):
    """A reader called with each event as it is read (``SandboxPort.on_events``): it
    queues nothing, so it never holds the channel back, and the event reaches it
    without a turn of the loop. ``None`` once, at the end."""

    def __init__(self, callback: Callable[[SandboxEvent | None], None]) -> None:
        super().__init__(None)
        self.callback = callback

    def put(self, event: SandboxEvent | None) -> None:
        if self.closed:
            return
        if event is None:
            self.closed = True
        try:
            self.callback(event)
        except Exception:  # the port's reading must go on: this listener stops here
            log.exception("an event listener failed; it gets no more events")
            self.closed = True


def _violation_size(event: ViolationEvent) -> int:
    v = event.violation
    return len(v.action) + len(v.target) + len(v.raw) + len(v.rule)


async def stream(sb: Sandbox, sub: Subscriber) -> AsyncIterator[SandboxEvent]:
    try:
        while True:
            event = await sub.get()
            sb.maybe_resume_reading()
            if event is None:
                return
            yield event
    finally:
        sb.unsubscribe(sub)
