"""The HTTP proxy's optional per-request filter hook: what a filter sees and what it may answer.

Rules:
- A filter runs after the domain policy allowed the target and before anything
  is resolved or dialled: a request it refuses leaves no DNS query and no
  connection behind.
- It answers ``FilterAllow`` (forward, after removing and setting headers) or
  ``FilterDeny`` (answer the client with ``status``, ``X-Deny-Reason: code``
  and ``reason`` as the body, then close). A filter that raises refuses the
  request (500, ``filter_failed``): a bug never lets a request through.
- Header edits apply to a forwarded ``http://`` request's head only; a CONNECT
  has no head to edit, so an allow with edits for a CONNECT is refused.
- The body is read only if the filter asks (``BodyReader.read``), at most
  ``limit`` decoded bytes within the reader's deadline; what was read is
  forwarded unchanged after an allow, followed by the rest of the stream.
"""

from __future__ import annotations

from sandhold._record import record

TYPE_CHECKING = False  # typing costs start-up time; mypy honours this name
if TYPE_CHECKING:
    from typing import Protocol

    from sandhold.net.httphead import ProxyRequest
    from sandhold.policy.domains import Decision

    class BodyReader(Protocol):
        """The request body, read on demand (``http_proxy`` provides it)."""

        @property
        def has_body(self) -> bool:
            """Whether the head announces a body (a non-zero length, or chunked)."""

        @property
        def length(self) -> int | None:
            """The announced ``Content-Length``, or ``None`` (chunked, or no body)."""

        async def read(self, limit: int) -> tuple[bytes, bool]:
            """Up to ``limit`` decoded body bytes, and whether the body was longer.

            Raises:
                BadRequest: the body is malformed or too slow (the proxy answers it).
            """

    class RequestFilter(Protocol):
        """Decides one request the domain policy allowed (module rules)."""

        async def check(self, request: FilterInput, body: BodyReader) -> FilterAllow | FilterDeny:
            """The filter's answer for ``request``."""


DENY_HEADER = "X-Deny-Reason"


@record
class FilterInput:
    """One request as the filter sees it.

    ``decision`` is the domain policy's allowance (``decision.host`` is the
    canonical host); ``target`` is the request target as the client spelled it
    (the path and query for ``http://``, ``host:port`` for CONNECT); ``headers``
    are the client's headers, in order, names as sent.
    """

    request: ProxyRequest
    decision: Decision
    target: str
    headers: tuple[tuple[str, str], ...]


@record
class FilterAllow:
    """Forward the request; headers are removed, then set (names fold case, ``-_.``)."""

    remove_headers: tuple[str, ...] = ()
    set_headers: tuple[tuple[str, str], ...] = ()


@record
class FilterDeny:
    """Refuse the request with ``status``, ``X-Deny-Reason: code`` and ``reason``."""

    status: int
    code: str
    reason: str
