"""Which exec a refused connection belongs to, found from the host with bounded work."""

from __future__ import annotations

import asyncio
import logging

from sandhold.spec import (
    RUNNING_STATES,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandhold.net.egress import EgressDecision
    from sandhold.port.sandbox import Sandbox

    _Connection = tuple[tuple[str, int], tuple[str, int]]


log = logging.getLogger("sandhold")


ATTRIBUTION_FDS = 20_000  # fds one attribution scan may look at
ATTRIBUTION_WAITING = 256  # refusals of one sandbox waiting for a scan; more are not looked for
ATTRIBUTION_THREADS = 2  # shared by every sandbox of a port


class Attribution:
    """Names the exec behind each refused connection of one sandbox, off the event loop.

    The sandbox decides how many processes and fds there are to look through,
    and how many refusals to make; so the work is bounded. One scan at a time
    per sandbox, on the port's attribution threads, takes every refusal waiting
    at its start (``SandboxProcess.socket_holders``: the first holder of each
    socket, at most ``ATTRIBUTION_FDS`` fds looked at). Past
    ``ATTRIBUTION_WAITING`` waiting refusals, a new one is reported at once as
    unknown, saying it was not looked for. Every refusal is reported.
    """

    def __init__(self, sb: Sandbox) -> None:
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
