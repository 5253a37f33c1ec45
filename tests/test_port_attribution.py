"""Attributing refusals off the event loop: one bounded scan at a time per sandbox,
refusals batched, a flood reported without being looked for, every refusal reported.

The sandbox and its process are fakes: ``socket_holders`` here blocks until the test
lets it go, as a scan of a sandbox full of fds would (the real scan is exercised by
``test_port_egress.py``).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from sandhold.net.outbound import EgressDecision
from sandhold.port import attribution as port_module
from sandhold.spec import SandboxState

Conn = tuple[tuple[str, int], tuple[str, int]]


class _Proc:
    def __init__(self, holders: dict[Conn, tuple[int, ...]], gave_up: bool = False) -> None:
        self.holders = holders
        self.gave_up = gave_up
        self.go = threading.Event()
        self.calls: list[list[Conn]] = []

    def socket_holders(self, connections: list[Conn], max_fds: int) -> Any:
        self.calls.append(list(connections))
        assert self.go.wait(10)
        return {c: self.holders[c] for c in connections if c in self.holders}, self.gave_up


class _Sandbox:
    """What ``_Attribution`` uses of a ``_Sandbox``."""

    def __init__(self, proc: _Proc, pool: ThreadPoolExecutor) -> None:
        self.proc = proc
        self.state = SandboxState.ACTIVE
        self.port = self
        self.pool = pool
        self.spec = self
        self.session_id = "s"
        self.reported: list[tuple[str, int, str]] = []

    def _attribution_threads(self) -> ThreadPoolExecutor:
        return self.pool

    def publish_refusal(self, decision: EgressDecision, exec_id: int, why: str) -> None:
        self.reported.append((decision.target, exec_id, why))

    def exec_of(self, chain: tuple[int, ...]) -> tuple[int, str]:
        return (7, "exec 7") if 70 in chain else (0, "unknown: not a running exec's tree")


def _decision(i: int) -> EgressDecision:
    return EgressDecision("network-outbound", f"h{i}:80", False, "r", "why", "http", ("", i))


def _conn(i: int) -> Conn:
    return (("127.0.0.1", 40000 + i), ("127.0.0.1", 3128))


def test_refusals_wait_for_one_scan_at_a_time_and_a_flood_is_reported_unlooked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(port_module, "ATTRIBUTION_WAITING", 2)

    async def scenario() -> tuple[_Sandbox, _Proc, list[bool]]:
        proc = _Proc({_conn(0): (71, 70), _conn(1): (5,), _conn(2): (70,)})
        with ThreadPoolExecutor(1) as pool:
            sb = _Sandbox(proc, pool)
            attribution = port_module.Attribution(sb)  # type: ignore[arg-type]
            first = attribution.submit(_decision(0), _conn(0))
            await asyncio.sleep(0.05)  # the first scan is running (and blocked)
            later = [attribution.submit(_decision(i), _conn(i)) for i in range(1, 6)]
            await asyncio.sleep(0.05)  # the loop is free meanwhile
            done_early = [f.done() for f in (first, *later)]
            proc.go.set()
            await asyncio.wait_for(asyncio.gather(first, *later), 5)
            assert attribution.task is None
        return sb, proc, done_early

    sb, proc, done_early = asyncio.run(scenario())
    # two waited (the rest were not looked for, and said so at once)
    assert done_early == [False, False, False, True, True, True]
    assert proc.calls == [[_conn(0)], [_conn(1), _conn(2)]]  # one scan, then one batch
    by_target = {target: (exec_id, why) for target, exec_id, why in sb.reported}
    assert len(sb.reported) == 6
    assert by_target["h0:80"] == (7, "exec 7")
    assert by_target["h1:80"] == (0, "unknown: not a running exec's tree")
    assert by_target["h2:80"] == (7, "exec 7")
    for i in (3, 4, 5):
        exec_id, why = by_target[f"h{i}:80"]
        assert exec_id == 0 and why.startswith("unknown: not looked for, 2 refusals"), why


@pytest.mark.parametrize(
    ("gave_up", "expected"),
    [
        (True, f"unknown: gave up after looking at {port_module.ATTRIBUTION_FDS} fds"),
        (False, "unknown: no process of the sandbox holds the connection any more"),
    ],
)
def test_a_holder_not_found_is_unknown_and_says_why(gave_up: bool, expected: str) -> None:
    async def scenario() -> list[tuple[str, int, str]]:
        proc = _Proc({}, gave_up=gave_up)
        proc.go.set()
        with ThreadPoolExecutor(1) as pool:
            sb = _Sandbox(proc, pool)
            attribution = port_module.Attribution(sb)  # type: ignore[arg-type]
            await asyncio.wait_for(attribution.submit(_decision(0), _conn(0)), 5)
            unknown = attribution.submit(_decision(1), None)
            assert unknown.done()
        return sb.reported

    reported = asyncio.run(scenario())
    assert reported == [
        ("h0:80", 0, expected),
        ("h1:80", 0, "unknown: the proxy did not say which connection it was"),
    ]
