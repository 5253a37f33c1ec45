"""The upstream half of a terminated tunnel, sans-I/O: requests out as bytes, where a response ends.

h11 parses what the sandbox sends (``tls_terminate``); towards the upstream,
which is a certificate-verified real host, the proxy needs less than a whole
HTTP state machine per request, and h11's was most of a small request's cost:

- ``RequestWriter`` renders a request h11 parsed from the client (its header
  names and values checked by h11 already) with placeholders replaced: a
  replaced value holding CR, LF or NUL raises ``ValueError`` (it would be a
  header of its own). A request without ``Host`` gets the tunnel's host. The
  body goes as it comes (Content-Length) or one chunk per piece (chunked).
- ``ResponseReader`` finds where one response ends in the upstream's bytes
  (RFC 9112 §6.3) and hands out, as it is fed, the bytes to forward to the
  client unchanged: interim 1xx responses (a 100 only when the client waits for
  one, others only to an HTTP/1.1 client; a 101 is an error: no upgrade was
  asked for), then the final one: no
  body after HEAD, 204 or 304; a chunked body (``chunked`` the only coding) to
  its last chunk and trailers; a Content-Length body (one value, repeats
  equal) counted exactly; else to the connection's end. Bytes after the end
  are ``trailing``, never forwarded. ``keep_alive``: HTTP/1.1 without
  ``Connection: close``, and not to the end of the connection.
- Stricter than h11 where it costs nothing: lines end with CRLF, no obs-fold,
  no Content-Length beside Transfer-Encoding, heads and chunk lines bounded.
  Anything else is ``UpstreamError`` (the proxy answers 502). A reader that
  failed stays failed.

``tests/test_upstream_http.py`` checks both against h11, whole and byte by byte.
"""

from __future__ import annotations

import re

MAX_HEAD = 64 * 1024
MAX_CHUNK_LINE = 4096
HOLD = 16 * 1024  # a Content-Length body this short goes out with its head

_STATUS = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: [^\r\n\x00]*)?")
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_CHUNK = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n\x00]*)?")
_BAD_VALUE = re.compile(rb"[\r\n\x00]")


class UpstreamError(Exception):
    """The upstream's response cannot be framed; the reason names what was wrong."""


def _bad(value: bytes) -> bool:
    return _BAD_VALUE.search(value) is not None


class RequestWriter:
    """One request at a time towards the upstream (module rules)."""

    def __init__(self, host: bytes) -> None:
        self._host = host
        self.chunked = False

    def head(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
        """The request line and headers (HTTP/1.1).

        Raises:
            ValueError: a header value holds CR, LF or NUL.
        """
        lines = [method, b" ", target, b" HTTP/1.1\r\n"]
        has_host = False
        self.chunked = False
        for name, value in headers:
            if _bad(value):
                raise ValueError("a header value holds CR, LF or NUL")
            low = name.lower()
            if low == b"host":
                has_host = True
            elif low == b"transfer-encoding":
                self.chunked = True
            lines += [name, b": ", value, b"\r\n"]
        if not has_host:
            lines += [b"Host: ", self._host, b"\r\n"]
        lines.append(b"\r\n")
        return b"".join(lines)

    def data(self, piece: bytes) -> bytes:
        if not self.chunked or not piece:
            return piece
        return b"%x\r\n" % len(piece) + piece + b"\r\n"

    def end(self, trailers: list[tuple[bytes, bytes]] | tuple[()] = ()) -> bytes:
        if not self.chunked:
            return b""
        return b"0\r\n" + b"".join(n + b": " + v + b"\r\n" for n, v in trailers) + b"\r\n"


_HEAD, _LENGTH, _SIZE, _DATA, _CRLF, _TRAILERS, _CLOSE, _DONE, _FAILED = range(9)


class ResponseReader:
    """Where one response to a ``method`` request ends (module rules)."""

    def __init__(
        self,
        method: bytes,
        *,
        forward_100: bool,
        forward_interim: bool = True,
        max_head: int = MAX_HEAD,
    ) -> None:
        self._head_only = method == b"HEAD"
        self._forward_100 = forward_100
        self._forward_interim = forward_interim
        self._max_head = max_head
        self._state = _HEAD
        self._buf = b""
        self._left = 0
        self.status = 0
        self.keep_alive = False
        self.started = False  # a byte of the final response was handed out
        self.trailing = b""
        self._error = ""

    @property
    def done(self) -> bool:
        return self._state == _DONE

    @property
    def short_rest(self) -> bool:
        """The final response's head is in and what is left is a Content-Length body of
        at most ``HOLD`` bytes: the upstream has it and sends it at once, so holding
        the head for it costs no latency and saves the client a wake-up."""
        return self._state == _LENGTH and self._left <= HOLD

    def feed(self, data: bytes) -> bytes:
        """Feed what the upstream sent (b"": it closed); return the bytes to forward.

        Raises:
            UpstreamError: the response cannot be framed, or ended early.
        """
        if self._state == _FAILED:
            raise UpstreamError(self._error)
        if self._state == _DONE:
            self.trailing += data
            return b""
        try:
            return self._feed(data)
        except UpstreamError as exc:
            self._state, self._error = _FAILED, str(exc)
            raise

    def _feed(self, data: bytes) -> bytes:
        closed = not data
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        while buf and self._state != _DONE:
            state = self._state
            if state in (_LENGTH, _DATA):  # counted bytes: the body, or one chunk's
                take = buf[: self._left]
                out.append(take)
                self._left -= len(take)
                buf = buf[len(take) :]
                if not self._left:
                    self._state = _DONE if state == _LENGTH else _CRLF
            elif state == _CLOSE:
                out.append(buf)
                buf = b""
            elif state == _CRLF:
                if len(buf) < 2:
                    break
                if buf[:2] != b"\r\n":
                    raise UpstreamError("a chunk does not end with CRLF")
                out.append(buf[:2])
                buf = buf[2:]
                self._state = _SIZE
            elif state == _SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > MAX_CHUNK_LINE:
                        raise UpstreamError("a chunk size line is too long")
                    break
                m = _CHUNK.fullmatch(buf[:end])
                if m is None:
                    raise UpstreamError("a bad chunk size line")
                size = int(m.group(1), 16)
                out.append(buf[: end + 2])
                buf = buf[end + 2 :]
                self._left = size
                self._state = _DATA if size else _TRAILERS
            elif state == _TRAILERS:
                if buf[:2] == b"\r\n":
                    out.append(buf[:2])
                    buf = buf[2:]
                    self._state = _DONE
                    continue
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > self._max_head:
                        raise UpstreamError("the trailers are too long")
                    break
                _fields(buf[:end].split(b"\r\n"))
                out.append(buf[: end + 4])
                buf = buf[end + 4 :]
                self._state = _DONE
            else:  # _HEAD
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > self._max_head:
                        raise UpstreamError("the response head is too long")
                    break
                head = buf[: end + 4]
                buf = buf[end + 4 :]
                if self._start(head):
                    out.append(head)
        self._buf = b"" if self._state in (_DONE, _CLOSE) else buf
        if self._state == _DONE:
            self.trailing = buf
        if closed and self._state != _DONE:
            if self._state == _CLOSE:
                self._state = _DONE
            elif self._state == _HEAD and not self.started and not self._buf:
                raise UpstreamError("the upstream closed before answering")
            else:
                raise UpstreamError("the upstream closed in the middle of its response")
        return b"".join(out)

    def _start(self, head: bytes) -> bool:
        """Read one response head; whether it is forwarded."""
        lines = head[:-4].split(b"\r\n")
        m = _STATUS.fullmatch(lines[0])
        if m is None:
            raise UpstreamError("a bad status line")
        minor, status = m.group(1), int(m.group(2))
        fields = _fields(lines[1:])
        if 100 <= status < 200:
            if status == 101:
                raise UpstreamError("101 Switching Protocols, and no upgrade was asked for")
            # the final response follows; an HTTP/1.0 client is sent no interim one
            return self._forward_100 if status == 100 else self._forward_interim
        self.status = status
        self.started = True
        te: list[bytes] = []
        cl: list[bytes] = []
        connection: list[bytes] = []
        framing = {b"transfer-encoding": te, b"content-length": cl, b"connection": connection}
        for name, value in fields:
            found = framing.get(name)
            if found is not None:
                found.append(value)
        conn = b",".join(connection).lower()
        self.keep_alive = minor == b"1" and b"close" not in {t.strip() for t in conn.split(b",")}
        if self._head_only or status in (204, 304):
            self._state = _DONE
        elif te:
            if cl:
                raise UpstreamError("both Transfer-Encoding and Content-Length")
            if [t.strip().lower() for t in b",".join(te).split(b",")] != [b"chunked"]:
                raise UpstreamError("a transfer coding other than chunked")
            self._state = _SIZE
        elif cl:
            values = {v.strip() for v in b",".join(cl).split(b",")}
            value = values.pop()
            if values or not value.isdigit() or len(value) > 18:
                raise UpstreamError("a bad Content-Length")
            self._left = int(value)
            self._state = _LENGTH if self._left else _DONE
        else:
            self._state = _CLOSE
            self.keep_alive = False
        return True


def _fields(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    out = []
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or _TOKEN.fullmatch(name) is None:
            raise UpstreamError("a bad header line (or a folded one)")
        value = value.strip(b" \t")
        if b"\x00" in value or b"\r" in value or b"\n" in value:
            raise UpstreamError("a bad header value")
        out.append((name.lower(), value))
    return out
