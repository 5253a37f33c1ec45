"""HTTP/1.1 for the server's client: h11 over asyncio streams, with a keep-alive pool.

Not httpx: with 50 requests in flight its connection pool walks every connection
on each request's change of state (``_assign_requests_to_connections``), and a
request cost ~6 ms of the client's CPU (bench/server.py, 50 concurrent execs:
~300 ms of client CPU a round, on the same two cores as the server and the
sandboxes). h11 is the protocol; what is left is a pool and a timeout.

Rules:
- ``http`` over TCP or a unix socket only: the server listens on loopback or a
  unix socket, and a URL of another scheme is refused, not downgraded.
- One exchange per connection at a time. A connection goes back to the pool
  (last in, first out) only when both sides are done with the exchange and
  neither asked to close; one idle for more than ``IDLE_MAX`` (below the server's
  keep-alive timeout, 5 s) is closed instead of reused.
- A reused connection the server closed meanwhile fails before any byte of the
  answer: the request is sent again, once, on a fresh connection, if its method
  is idempotent. A POST is not sent twice (the server may have done it): it
  raises ``ClientError``.
- ``timeout`` bounds a whole exchange, connect to last byte (for a stream: up to
  its head). An answer's body is capped at ``max_body`` bytes.
- Every transport failure, malformed answer or timeout is a ``ClientError``; the
  connection it happened on is closed, never pooled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import h11

from sandhold.errors import ClientError

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
IDLE_MAX = 2.0  # seconds; uvicorn closes an idle keep-alive connection after 5
READ_SIZE = 1 << 16
Headers = Sequence[tuple[bytes, bytes]]


class Response:
    """An answer: ``status``, ``headers`` (lower-case names) and the whole ``body``."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


class _Stale(Exception):
    """The connection failed before any byte of the answer arrived."""


class _Conn:
    __slots__ = ("h11", "idle_since", "reader", "received", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0
        self.received = 0  # bytes of the current answer

    async def send(self, events: list[h11.Event]) -> None:
        data = b"".join(self.h11.send(e) or b"" for e in events)
        self.writer.write(data)
        await self.writer.drain()

    async def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await self.reader.read(READ_SIZE)
            self.received += len(data)
            self.h11.receive_data(data)  # b"": the end of the stream

    def reusable(self) -> bool:
        return self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE

    def close(self) -> None:
        self.writer.close()


class Transport:
    """A pool of connections to one server; see the module doc."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 7317,
        unix: str | None = None,
        headers: Headers = (),
        timeout: float | None = 60.0,
        max_body: int = 64 << 20,
    ) -> None:
        self.host, self.port, self.unix = host, port, unix
        authority = "localhost" if unix is not None else _authority(host, port)
        self._headers = [(b"host", authority.encode()), *headers]
        self.timeout, self.max_body = timeout, max_body
        self._idle: list[_Conn] = []

    async def request(
        self, method: str, target: str, body: bytes | None = None, headers: Headers = ()
    ) -> Response:
        """One exchange; the answer whatever its status (a status is not an error here)."""
        for attempt in (0, 1):
            conn = self._take() if attempt == 0 else None
            reused = conn is not None
            try:
                async with asyncio.timeout(self.timeout):
                    if conn is None:
                        conn = await self._connect()
                    response = await self._exchange(conn, method, target, body, headers)
            except _Stale as exc:
                assert conn is not None
                conn.close()
                if reused and method in IDEMPOTENT:
                    continue
                raise self._failure(method, target, exc) from exc
            except TimeoutError as exc:
                if conn is not None:
                    conn.close()
                raise self._failure(method, target, exc) from None
            except BaseException:
                if conn is not None:
                    conn.close()
                raise
            self._release(conn)
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    @asynccontextmanager
    async def stream(
        self, method: str, target: str, headers: Headers = ()
    ) -> AsyncIterator[tuple[Response, AsyncIterator[bytes]]]:
        """An exchange whose body is read as it comes (server-sent events): the head
        (``body`` empty) and the chunks. Its connection is closed at the end."""
        conn: _Conn | None = None
        try:
            try:
                async with asyncio.timeout(self.timeout):
                    conn = await self._connect()
                    head = await self._head(conn, method, target, None, headers)
            except TimeoutError as exc:
                raise self._failure(method, target, exc) from None
            except _Stale as exc:
                raise self._failure(method, target, exc) from exc
            yield head, self._chunks(conn)
        finally:
            if conn is not None:
                conn.close()

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()

    # -- inside ---------------------------------------------------------------------------

    def _failure(self, method: str, target: str, exc: TimeoutError | _Stale) -> ClientError:
        if isinstance(exc, TimeoutError):
            return ClientError(f"{method} {target}: no answer within {self.timeout} s")
        return ClientError(f"{method} {target}: the connection failed: {exc}")

    def _take(self) -> _Conn | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < IDLE_MAX and not conn.reader.at_eof():
                return conn
            conn.close()
        return None

    def _release(self, conn: _Conn) -> None:
        if not conn.reusable():
            conn.close()
            return
        try:
            conn.h11.start_next_cycle()
        except h11.LocalProtocolError:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    async def _connect(self) -> _Conn:
        try:
            if self.unix is not None:
                reader, writer = await asyncio.open_unix_connection(self.unix)
            else:
                reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            where = self.unix or _authority(self.host, self.port)
            raise ClientError(f"cannot connect to {where}: {exc.strerror or exc}") from exc
        return _Conn(reader, writer)

    async def _head(
        self, conn: _Conn, method: str, target: str, body: bytes | None, headers: Headers
    ) -> Response:
        all_headers = [*self._headers, *headers]
        if body is not None:
            all_headers.append((b"content-length", b"%d" % len(body)))
        events: list[h11.Event] = [h11.Request(method=method, target=target, headers=all_headers)]
        if body:
            events.append(h11.Data(data=body))
        events.append(h11.EndOfMessage())
        conn.received = 0
        try:
            await conn.send(events)
            while True:
                event = await conn.next_event()
                if isinstance(event, h11.Response):
                    return Response(event.status_code, list(event.headers), b"")
                if not isinstance(event, h11.InformationalResponse):
                    raise h11.RemoteProtocolError(f"unexpected {type(event).__name__}")
        except (OSError, h11.ProtocolError) as exc:
            if conn.received == 0:
                raise _Stale(str(exc) or type(exc).__name__) from exc
            raise ClientError(f"{method} {target}: a malformed answer: {exc}") from exc

    async def _exchange(
        self, conn: _Conn, method: str, target: str, body: bytes | None, headers: Headers
    ) -> Response:
        response = await self._head(conn, method, target, body, headers)
        chunks = []
        size = 0
        async for chunk in self._chunks(conn):
            size += len(chunk)
            if size > self.max_body:
                raise ClientError(f"{method} {target}: the answer is over {self.max_body} bytes")
            chunks.append(chunk)
        response.body = b"".join(chunks)
        return response

    async def _chunks(self, conn: _Conn) -> AsyncIterator[bytes]:
        try:
            while True:
                event = await conn.next_event()
                if isinstance(event, h11.Data):
                    yield bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    return
                else:
                    raise h11.RemoteProtocolError(f"unexpected {type(event).__name__}")
        except (OSError, h11.ProtocolError) as exc:
            raise ClientError(f"the answer broke off: {exc}") from exc


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
