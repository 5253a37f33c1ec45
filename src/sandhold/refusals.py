"""Refusals as data: the one line format of every record of decisions and refusals, and
the one bounded writer of such records.

A line is one JSON object: ``time``, ``action`` (what was tried: ``network-outbound``,
``file-write-create``, ...), ``target``, ``allowed``, ``rule`` (the refusal text: which
rule decided, the same words the user meets on stderr, in a 403 body or in a
``SandboxViolation.rule``), ``kind`` (which kind of rule decided, the field code
branches on: ``policy.domains.RULE_KINDS`` for a connection, ``policy.refusal.KINDS``
for the supervisor's refusals, ``DROPPED`` for the line that ends a record) and, per
action, ``reason``, ``proxy``, ``syscall``.

Rules:
- A record is bounded, in lines and (optionally) in bytes: a sandbox can make
  refusals as fast as it likes, and a record is the user's disk (``--violations``)
  or the host's memory (the supervisor's report memfd). The line past the bound
  says so (``violations-dropped``), and nothing follows it.
- Lines are built here and nowhere else (``line``, ``dropped_line``).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

DROPPED = "violations-dropped"


def line(
    action: str,
    target: str,
    rule: str,
    now: float,
    *,
    kind: str,
    allowed: bool = False,
    **extra: object,
) -> dict[str, object]:
    """One decision or refusal as a record's line (see the module doc)."""
    return {
        "time": round(now, 3),
        "action": action,
        "target": target,
        "allowed": allowed,
        "rule": rule,
        "kind": kind,
        **extra,
    }


def dropped_line(limit: int, what: str, now: float) -> dict[str, object]:
    """The one line that ends a record that reached its bound of ``limit`` ``what``."""
    return line(
        DROPPED,
        "",
        f"sandhold: more than {limit} {what} in this run; the rest are not written",
        now,
        kind=DROPPED,
    )


class BoundedRecord:
    """Writes lines through ``write`` until ``max_lines`` (or ``max_bytes``) is reached,
    then one ``dropped_line`` and nothing more.

    Args:
        write: takes one encoded line (``bytes``, newline included).
        max_lines: lines written before the bound.
        what: what the lines are, for the dropped line ("refusals", "decisions").
        max_bytes: the lines' bytes before the bound, or None for no byte bound.
    """

    def __init__(
        self,
        write: Callable[[bytes], object],
        max_lines: int,
        what: str,
        max_bytes: int | None = None,
    ) -> None:
        self._write = write
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.what = what
        self.lines = 0
        self.bytes = 0
        self.full = False

    def add(self, entry: dict[str, object], now: float) -> bool:
        """Write ``entry``; False once the record is full (nothing more is written)."""
        if self.full:
            return False
        import json

        data = (json.dumps(entry) + "\n").encode()
        self.lines += 1
        over_bytes = self.max_bytes is not None and self.bytes + len(data) > self.max_bytes
        if self.lines > self.max_lines or over_bytes:
            self.full = True
            if self.lines > self.max_lines:
                end = dropped_line(self.max_lines, self.what, now)
            else:
                end = dropped_line(self.max_bytes or 0, f"bytes of {self.what}", now)
            data = (json.dumps(end) + "\n").encode()
        self.bytes += len(data)
        self._write(data)
        return not self.full
