"""The record of one refused trapped call, as the supervisor reports it.

Rules:
- A leaf: it imports nothing of the supervisor, so ``emulate`` (which makes these)
  and ``supervisor`` (which hands them on) import it and not each other's values.
- ``action`` is ``creation.ACTION``, ``creation.READ_ONLY_ACTION`` or
  ``creation.UNIX_ACTION``; ``rule`` names the rule that refused in words (F-BE-5),
  ``kind`` which one it is (``policy.refusal.KINDS``): code branches on ``kind``.
"""

from __future__ import annotations

from sandhold._record import record


@record
class Violation:
    """A refused creation: ``action`` is ``file-write-create``, ``target`` the path."""

    action: str
    target: str
    rule: str
    syscall: str
    pid: int
    kind: str  # policy.refusal.KINDS
    tag: object = None  # what ``Supervisor.add_listener`` was given for the caller's listener
