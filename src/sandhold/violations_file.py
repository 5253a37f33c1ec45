"""The ``--violations`` file's lines: one JSON object per decision or refusal.

Each line has ``time``, ``action``, ``target``, ``allowed``, ``rule`` and more per
kind. A run writes a bounded number of them (a sandbox can make refusals as fast as
it likes, and the file is the user's disk, the report memfd the host's memory); the
line past the bound says so, and nothing follows it.
"""

from __future__ import annotations

DROPPED = "violations-dropped"


def dropped_line(limit: int, what: str, now: float) -> dict[str, object]:
    """The one line that ends a record that reached its bound of ``limit`` ``what``."""
    return {
        "time": round(now, 3),
        "action": DROPPED,
        "target": "",
        "allowed": False,
        "rule": f"sandhold: more than {limit} {what} in this run; the rest are not written",
    }
