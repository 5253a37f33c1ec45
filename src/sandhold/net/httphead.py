"""Parse the head of one HTTP proxy request, sans-I/O: bytes in, one ``ProxyRequest`` out.

h11 parses HTTP/1.x (request line, header syntax, Content-Length and
Transfer-Encoding rules); this module adds what a forward proxy needs on top of
it, and writes the proxy's own answers.

Rules:
- Two kinds of request are served: ``CONNECT host:port`` (a tunnel) and an
  absolute-form ``http://host[:port]/path`` request of any other method
  (forwarded). Everything else raises ``BadRequest`` carrying the status to
  answer with: 400 for a malformed head, an origin-form or ``*`` target,
  ``https://`` in absolute form (use CONNECT), user info in the URL, a missing or
  bad port, both Transfer-Encoding and Content-Length, Content-Length twice (or
  a list), a folded header line (obs-fold), or a bare LF or CR anywhere in the
  head (the smuggling tricks: the proxy and the origin must never disagree on
  where a request ends); 431 for a head longer
  than ``max_head_bytes``; 501 for a transfer coding other than chunked; 505 for
  an HTTP version other than 1.0 and 1.1.
- Bounded: before the head is complete the parser holds at most
  ``max_head_bytes`` plus the last chunk fed to it, then raises 431. The caller
  bounds the chunk (``http_proxy`` reads 16 KiB at a time).
- The host comes back as the client wrote it (brackets removed). Canonicalising
  and deciding are the domain policy's job, done in ``outbound``.
- A forwarded request is rewritten (RFC 9110 §7.6.1, RFC 9112 §3.2.2): the
  request line in origin form with the client's HTTP version; ``Host`` replaced
  by the target's authority; hop-by-hop headers dropped (``Connection`` and every
  header it names, ``Keep-Alive``, ``Proxy-Connection``, ``Proxy-Authorization``,
  ``Proxy-Authenticate``, ``TE``, ``Upgrade``); the framing headers
  (``Content-Length``, ``Transfer-Encoding``) kept exactly; ``Connection: close``
  added.
- The body is framed here, never relayed blind: after the head, ``next_body``
  hands out the body's bytes as h11 decodes them (Content-Length counted exactly,
  chunked decoded; the proxy re-frames them, ``frame_body``), then its end, and
  ``trailing_data`` is what the client sent after it: the next request, parsed
  and decided on its own by a new parser. Nothing after the body's end ever
  reaches the origin of this request.
- After a ``BadRequest`` the parser stays failed: every later call raises it again.
"""

from __future__ import annotations

import re

import h11

from sandhold._record import record
from sandhold.net.errors import BadRequest
from sandhold.policy.domains import split_port

TYPE_CHECKING = False  # typing costs start-up time; mypy honours this name
if TYPE_CHECKING:
    from collections.abc import Iterable

MAX_HEAD_BYTES = 64 * 1024

CONNECT_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"

# Dropped from a forwarded request: they describe the client's hop to the
# proxy, not the request (RFC 9110 §7.6.1). Host is rebuilt from the target.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"upgrade",
        b"host",
    }
)
# Never dropped, even when ``Connection`` names them: the origin frames the body
# from these, and a body relayed without its framing would desynchronise it.
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})

REASONS: dict[int, str] = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    421: "Misdirected Request",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}
_MAX_HEADER_VALUE = 512


@record
class ProxyRequest:
    """One parsed proxy request head.

    ``method`` is upper-case ASCII as sent; ``host`` is the target host as the
    client wrote it, without IPv6 brackets (non-UTF-8 bytes survive as surrogate
    escapes, which the domain policy refuses); ``port`` is the target port (80
    when an ``http://`` URL names none). ``forward_head`` is the rewritten head to
    send to the origin (empty for CONNECT).
    """

    method: str
    host: str
    port: int
    http_version: str
    forward_head: bytes = b""

    @property
    def is_connect(self) -> bool:
        return self.method == "CONNECT"


class RequestHeadParser:
    """Feed bytes with ``receive_data``; ``next_event`` returns the request once complete.

    >>> p = RequestHeadParser()
    >>> p.receive_data(b"CONNECT example.com:443 HTTP/1.1\\r\\nHost: example.com\\r\\n\\r\\n\\x16")
    >>> request = p.next_event()
    >>> request.method, request.host, request.port, request.forward_head
    ('CONNECT', 'example.com', 443, b'')
    >>> p.trailing_data
    b'\\x16'
    """

    def __init__(self, max_head_bytes: int = MAX_HEAD_BYTES) -> None:
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self._max = max_head_bytes
        self._received = 0  # until the head is parsed h11 consumes nothing, so this is its buffer
        self._prefix = bytearray()  # the first max_head_bytes + 3: where the head must end
        self._eof = False
        self._request: ProxyRequest | None = None
        self._event: h11.Request | None = None
        self._error: BadRequest | None = None
        self._chunked = False
        self._ended = False

    @property
    def chunked(self) -> bool:
        """Whether the body is chunked (else it is Content-Length framed, or empty)."""
        return self._chunked

    @property
    def client_keeps_alive(self) -> bool:
        """Once the body has ended: whether the client lets the connection carry another
        request (HTTP/1.1 without ``Connection: close``, as h11 reads it)."""
        return self._ended and self._h11.their_state is h11.DONE

    def receive_body(self, data: bytes) -> None:
        """Add body bytes from the client (after the head); ``b""`` means it closed."""
        if self._request is None:
            raise RuntimeError("the request head is not parsed yet")
        if not self._ended:
            self._h11.receive_data(data)
        elif data:
            self._h11.receive_data(data)  # the next request's bytes: trailing_data

    def next_body(self) -> bytes | tuple[tuple[bytes, bytes], ...] | None:
        """The next piece of the body: bytes, or at its end the trailers (a tuple,
        usually empty); ``None``: feed more with ``receive_body``.

        After the end, every call returns ``()`` again.

        Raises:
            BadRequest: the body is malformed, or the client closed before its end
                (400). It is the only exception expected here.
        """
        if self._request is None:
            raise RuntimeError("the request head is not parsed yet")
        if self._ended:
            return ()
        try:
            event = self._h11.next_event()
        except h11.RemoteProtocolError as exc:
            raise self._fail(400, f"the request body is malformed: {exc}") from None
        if isinstance(event, h11.Data):
            return bytes(event.data)
        if isinstance(event, h11.EndOfMessage):
            self._ended = True
            return tuple((bytes(n), bytes(v)) for n, v in event.headers.raw_items())
        if event is h11.NEED_DATA:
            return None
        raise self._fail(400, "the client closed before the request body was complete")

    @property
    def buffered(self) -> int:
        """Bytes held while waiting for the rest of the head (0 once it is parsed)."""
        return 0 if self._request is not None else self._received

    @property
    def raw_target(self) -> bytes:
        """The request target as the client spelled it (``b""`` until the head is parsed)."""
        return bytes(self._event.target) if self._event is not None else b""

    @property
    def raw_headers(self) -> tuple[tuple[bytes, bytes], ...]:
        """The client's headers in order, names as sent (``()`` until the head is parsed)."""
        if self._event is None:
            return ()
        return tuple((bytes(n), bytes(v)) for n, v in self._event.headers.raw_items())

    @property
    def trailing_data(self) -> bytes:
        """What the client sent after the head (a body, or a tunnel's first bytes).

        Only meaningful once ``next_event`` has returned the request.
        """
        return bytes(self._h11.trailing_data[0]) if self._request is not None else b""

    @property
    def trailing_closed(self) -> bool:
        """Whether the client closed its side after what ``trailing_data`` holds."""
        return self._request is not None and self._h11.trailing_data[1]

    def receive_data(self, data: bytes) -> None:
        """Add bytes from the client; ``b""`` means the client closed its side.

        Raises:
            BadRequest: the parser already failed (the same error again).
            RuntimeError: called after the head was returned (a bug in the caller).
        """
        if self._error is not None:
            raise self._error
        if self._request is not None:
            raise RuntimeError("the request head is already parsed; relay the rest")
        if not data:
            self._eof = True
        self._received += len(data)
        room = self._max + 3 - len(self._prefix)
        if room > 0:
            self._prefix += data[:room]
        self._h11.receive_data(data)

    def next_event(self) -> ProxyRequest | None:
        """The request once its head is complete, else ``None`` (feed more bytes).

        Returns the same request on every later call.

        Raises:
            BadRequest: the head is unusable; ``status`` says how to answer. It is
                the only exception expected here; any other is a bug.
        """
        if self._error is not None:
            raise self._error
        if self._request is not None:
            return self._request
        if self._received > self._max and not self._ends_in_time():
            raise self._fail(431, f"request head longer than {self._max} bytes")
        try:
            event = self._h11.next_event()
        except h11.RemoteProtocolError as exc:
            raise self._fail(exc.error_status_hint, f"malformed request head: {exc}") from None
        if event is h11.NEED_DATA:
            if self._eof:
                raise self._fail(400, "the client closed before the request head was complete")
            return None
        if not isinstance(event, h11.Request):
            # ConnectionClosed: EOF with nothing sent; the caller saw that already
            raise self._fail(400, "no request head received")
        head_bytes = self._received - len(self._h11.trailing_data[0])
        if head_bytes > self._max:
            raise self._fail(431, f"request head longer than {self._max} bytes")
        try:
            _check_raw_head(bytes(self._prefix[:head_bytes]))
            self._request = _proxy_request(event)
            self._chunked = any(
                n.lower() == b"transfer-encoding" for n, _ in event.headers.raw_items()
            )
            self._event = event
        except BadRequest as exc:
            self._error = exc
            raise
        return self._request

    def _ends_in_time(self) -> bool:
        """Whether the head ends (a blank line, as h11 reads it) within ``max_head_bytes``.

        Runs at most once per parser: either it raises 431 or h11 finds the head.
        """
        ends = [i + len(m) for m in (b"\n\n", b"\n\r\n") if (i := self._prefix.find(m)) >= 0]
        return bool(ends) and min(ends) <= self._max

    def _fail(self, status: int, reason: str) -> BadRequest:
        self._error = BadRequest(status, reason)
        return self._error


def _check_raw_head(head: bytes) -> None:
    """Refuse what h11 reads leniently and an origin might read otherwise (smuggling)."""
    if re.search(rb"(?<!\r)\n|\r(?!\n)", head):
        raise BadRequest(400, "a bare LF or CR in the request head (only CRLF ends a line)")
    lines = head.split(b"\r\n")
    if any(line[:1] in (b" ", b"\t") for line in lines[1:] if line):
        raise BadRequest(400, "a folded header line (obs-fold) in the request head")
    lengths = [
        line.partition(b":")[2] for line in lines[1:] if line[:15].lower() == b"content-length:"
    ]
    if len(lengths) > 1 or any(b"," in value for value in lengths):
        raise BadRequest(400, "Content-Length is given more than once")


def frame_body(piece: bytes | tuple[tuple[bytes, bytes], ...], chunked: bool) -> bytes:
    """The bytes to send the origin for one ``next_body`` piece, framed by the proxy.

    A Content-Length body goes as it came; a chunked one as one chunk per piece,
    its end as ``0`` and the trailers h11 parsed (chunk extensions are dropped).

    >>> frame_body(b"abc", True), frame_body((), True), frame_body(b"abc", False)
    (b'3\\r\\nabc\\r\\n', b'0\\r\\n\\r\\n', b'abc')
    """
    if isinstance(piece, bytes):
        if not chunked or not piece:
            return piece
        return b"%x\r\n" % len(piece) + piece + b"\r\n"
    if not chunked:
        return b""
    return b"0\r\n" + b"".join(n + b": " + v + b"\r\n" for n, v in piece) + b"\r\n"


def _proxy_request(event: h11.Request) -> ProxyRequest:
    version = event.http_version.decode("ascii")
    if version not in ("1.0", "1.1"):
        raise BadRequest(505, f"HTTP/{version} is not supported; use HTTP/1.1")
    method = event.method.decode("ascii")  # h11 checked it is a token
    target = bytes(event.target)
    if method == "CONNECT":
        host, port = _authority(target, default_port=None)
        return ProxyRequest(method, host, port, version)
    if target[:7].lower() != b"http://":
        if target[:8].lower() == b"https://":
            raise BadRequest(400, "an https:// URL cannot be forwarded; use CONNECT")
        raise BadRequest(
            400, "not a proxy request: the target must be an absolute http:// URL or host:port"
        )
    rest = target[7:]
    end = min((i for i in (rest.find(c) for c in (b"/", b"?", b"#")) if i >= 0), default=len(rest))
    authority, path = rest[:end], rest[end:].partition(b"#")[0]
    host, port = _authority(authority, default_port=80)
    if not path.startswith(b"/"):
        path = b"/" + path
    names = [name.lower() for name, _ in event.headers.raw_items()]
    if b"transfer-encoding" in names and b"content-length" in names:
        raise BadRequest(400, "both Transfer-Encoding and Content-Length are present")
    head = _forward_head(event, method, path, authority, version)
    return ProxyRequest(method, host, port, version, head)


def _authority(raw: bytes, default_port: int | None) -> tuple[str, int]:
    if not raw:
        raise BadRequest(400, "the target names no host")
    if b"@" in raw:
        raise BadRequest(400, "user info in the target is not supported")
    if b"/" in raw:
        raise BadRequest(400, "the CONNECT target must be host:port")
    text = raw.decode("utf-8", "surrogateescape")
    try:
        host, port = split_port(text)
    except ValueError as exc:
        raise BadRequest(400, f"bad target {_printable(text)!r}: {exc}") from None
    if not host:
        raise BadRequest(400, "the target names no host")
    if port is None:
        if default_port is None:
            raise BadRequest(400, "the CONNECT target must be host:port")
        port = default_port
    return host, port


def _forward_head(
    event: h11.Request, method: str, path: bytes, authority: bytes, version: str
) -> bytes:
    raw = event.headers.raw_items()
    named: set[bytes] = set()
    for name, value in raw:
        if name.lower() == b"connection":
            named.update(token.strip().lower() for token in value.split(b","))
    drop = _HOP_BY_HOP | (named - _FRAMING)
    lines = [
        method.encode("ascii") + b" " + path + b" HTTP/" + version.encode("ascii"),
        b"Host: " + authority,
    ]
    lines += [name + b": " + value for name, value in raw if name.lower() not in drop]
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


_FRAMING_NAMES = frozenset({"host", "content-length", "transfer-encoding", "connection"})


def _fold(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def edit_head(head: bytes, remove: Iterable[str], set_headers: Iterable[tuple[str, str]]) -> bytes:
    """A forwarded head with headers removed, then set (replacing every spelling).

    Names match case-insensitively with ``-``, ``_`` and ``.`` as one character.
    New headers go before the closing ``Connection: close``.

    >>> edit_head(b"GET / HTTP/1.1\\r\\nHost: a\\r\\nX_Key: 1\\r\\nConnection: close\\r\\n\\r\\n",
    ...           ["x-key"], [("x-tenant", "t")])
    b'GET / HTTP/1.1\\r\\nHost: a\\r\\nx-tenant: t\\r\\nConnection: close\\r\\n\\r\\n'

    Raises:
        ValueError: an edit names a framing header (Host, Content-Length,
            Transfer-Encoding, Connection) or a value holds CR, LF or NUL.
    """
    sets = list(set_headers)
    drop = {_fold(n) for n in remove} | {_fold(n) for n, _ in sets}
    if drop & _FRAMING_NAMES:
        raise ValueError(f"a filter may not edit {sorted(drop & _FRAMING_NAMES)}")
    if any(c in v for _, v in sets for c in "\r\n\0"):
        raise ValueError("a header value holds CR, LF or NUL")
    lines = head[:-4].split(b"\r\n")
    kept = [lines[0]]
    for line in lines[1:]:
        name = line.split(b":", 1)[0].decode("latin-1")
        if _fold(name) not in drop and _fold(name) != "connection":
            kept.append(line)
    kept += [n.encode("ascii") + b": " + v.encode("utf-8") for n, v in sets]
    kept.append(b"Connection: close")
    return b"\r\n".join(kept) + b"\r\n\r\n"


def render_answer(status: int, text: str, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """A complete ``Connection: close`` response with a plain-text body, from the proxy itself.

    Header values are made safe (printable ASCII, at most 512 characters), since
    they may carry a host or a rule the client chose.

    >>> render_answer(403, "no", [("X-Proxy-Error", "a\\r\\nb")]).split(b"\\r\\n")[:2]
    [b'HTTP/1.1 403 Forbidden', b'Content-Type: text/plain; charset=utf-8']
    """
    body = text.encode("utf-8", "backslashreplace") + b"\n"
    lines = [
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    lines += [f"{name}: {_printable(value)[:_MAX_HEADER_VALUE]}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body


def _printable(text: str) -> str:
    return "".join(c if " " <= c <= "~" else "?" for c in text)
