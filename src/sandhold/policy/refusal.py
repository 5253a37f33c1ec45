"""A refusal of the creation-time supervisor as data: which kind of rule, and its words.

Rules:
- Code branches on ``Refusal.kind`` (one of ``KINDS``), never on the words of
  ``Refusal.rule``: those are for people (stderr, the ``--violations`` file, a
  ``SandboxViolation.rule``), as ``domains.Decision.kind`` is for a connection.
- A leaf: ``creation``, ``repository`` and ``symlinks`` make refusals, the
  supervisor hands them on, and none of them imports another for this.
"""

from __future__ import annotations

from sandhold._record import record

# Which rule refused (``Refusal.kind``); the numbers are ``policy.creation``'s rules.
DENY_PATH = "deny-path"  # rule 2: a denyWrite entry, an allowed socket's name, a protected path
MANDATORY = "mandatory"  # rule 3: a name git, hg, jj, mise, an agent or the host runs or trusts
CREDENTIAL = "credential"  # rule 3: a credential name (lifted by allowCredentialWrite)
HOME_DOT = "home-dot"  # rule 3: a new dot name directly in a writable home
REPOSITORY = "repository"  # rule 3, the supervisor's part: ``policy.repository``'s rules
SYMLINK = "symlink"  # rule 4: where a new symlink leads, or how its text climbs
UNIX_SOCKET = "unix-socket"  # F-NET-5: a connect to a socket allowUnixSockets does not list
READ_ONLY = "read-only"  # the kernel refused a write where the sandbox may not write
KINDS = (
    DENY_PATH, MANDATORY, CREDENTIAL, HOME_DOT, REPOSITORY, SYMLINK, UNIX_SOCKET, READ_ONLY
)  # fmt: skip


@record
class Refusal:
    """Why a name may not be made (or a socket reached): ``kind`` is what decided
    (``KINDS``), ``rule`` the one-line text that names the rule and, where one
    exists, the setting that lifts it."""

    kind: str
    rule: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown refusal kind {self.kind!r}")
