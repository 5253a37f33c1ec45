"""Errors of the egress proxies: whose fault it was, and what the client is told.

    ProxyError               never escapes a connection handler; rendered there, once
     ├── BadRequest          the client's HTTP request head is unusable (``status``)
     ├── SocksError          the client's SOCKS5 bytes are unusable (``code``, ``reply``)
     ├── Refused             the domain policy refused the target (``decision``)
     └── DialFailed          the target was allowed but could not be reached

Rules: the sans-I/O parsers raise only ``BadRequest`` and ``SocksError``, and
only where the client's bytes come in; ``outbound`` raises only ``Refused`` and
``DialFailed``. The proxies turn each into one answer (HTTP 400/403/502...,
SOCKS5 reply codes) and close the connection. Any other exception escaping a
handler is a bug in sandhold: the handler logs it and closes the connection, so a
bug costs that connection and never opens a way around the policy.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs start-up time; mypy honours this name
if TYPE_CHECKING:
    from sandhold.policy.domains import Decision


class ProxyError(Exception):
    """Base of the proxies' own errors; ``reason`` is a sentence for people."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class BadRequest(ProxyError):
    """The client sent an HTTP request head the proxy cannot serve.

    ``status`` is the HTTP status to answer with: 400 (malformed, not a proxy
    request), 408 (head not complete in time), 431 (head too large), 501
    (unsupported transfer coding) or 505 (HTTP version).
    """

    def __init__(self, status: int, reason: str) -> None:
        self.status = status
        super().__init__(reason)


class SocksError(ProxyError):
    """The client sent SOCKS5 bytes the proxy cannot serve.

    ``code`` is the SOCKS5 reply code (``0xFF`` while choosing a method: no
    acceptable method); ``reply`` is what to send before closing, already encoded
    for the stage the exchange was in.
    """

    def __init__(self, code: int, reason: str, reply: bytes) -> None:
        self.code = code
        self.reply = reply
        super().__init__(reason)


class Refused(ProxyError):
    """The domain policy refused the connection; ``decision`` says which rule (F-NET-4)."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        super().__init__(decision.reason)


class DialFailed(ProxyError):
    """An allowed target could not be reached: it did not resolve, refused, or timed out.

    ``target`` is ``host:port``; ``kind`` is ``"resolve"``, ``"refused"``,
    ``"unreachable"``, ``"network"`` or ``"timeout"``; the OS error, if any, is
    ``__cause__``.
    """

    def __init__(self, target: str, kind: str, reason: str) -> None:
        self.target = target
        self.kind = kind
        super().__init__(reason)
