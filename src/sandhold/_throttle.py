"""Say a repeated thing at most once per interval, counting the times it was held back.

A sandbox can make the host repeat a log line as fast as it likes (a refused
connection, a full fd table, an agent's ``LOG`` frame); one line per interval,
with the count of those held back, says as much without flooding the log.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


class Throttle:
    """``take()`` lets one through at most once per ``interval`` seconds and counts the rest."""

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self.next = float("-inf")
        self.held = 0

    def take(self) -> int | None:
        """None: stay quiet; else say it now, and this many were held back since last time."""
        now = self.clock()
        if now < self.next:
            self.held += 1
            return None
        self.next = now + self.interval
        held, self.held = self.held, 0
        return held
