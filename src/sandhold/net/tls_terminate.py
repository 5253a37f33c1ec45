"""TLS termination for the hosts that get injected credentials, and only those.

Rules (F-CRED-3):
- ``Terminator.wants`` picks a CONNECT for termination when its target (the
  CONNECT's host, canonical, never a ``Host`` header) has placeholders to put
  back and is not in ``excludeDomains``. Every other CONNECT stays an opaque
  tunnel, untouched.
- At most ``max_tunnels`` terminated tunnels at once (a slot is held from the
  CONNECT to the tunnel's end); past it the CONNECT is answered 503 with
  ``X-Proxy-Error: too-many-tunnels``. The client's TLS handshake must end
  within ``handshake_timeout`` seconds; a connection idle between requests for
  ``idle_timeout`` is closed.
- Client side: a leaf for the CONNECT host signed by the session's CA
  (``net.ca``), ALPN ``http/1.1`` only. Upstream side: a separate TLS
  connection verified against the system roots plus ``extraCaCertPaths``, with
  the hostname checked (a later tunnel to the same host resumes that verified
  session, ``MAX_SESSIONS`` hosts at most); a failure answers the request 502 with
  ``X-Proxy-Error: upstream-tls-failed`` and the reason, and nothing is sent.
- Each side's TLS is an ``SSLObject`` on memory BIOs over the socket
  (``_TlsSocket``), not asyncio's transport and stream layers, which cost more
  than the crypto for small requests.
- Inside, HTTP/1.1 with keep-alive on both sides. What the client sends is
  parsed by h11 (the sandbox is not trusted); towards the verified upstream
  ``upstream_http`` renders the request and frames the response, which goes to
  the client as the upstream sent it (a fresh h11 parser then reads the next
  request). Bytes after a response's end close the tunnel. Each request's
  header values get their placeholders replaced (``net.injection``; a real
  value with CR, LF or NUL is refused 502, never sent); its body too unless it
  has a ``Content-Encoding``. A body with a ``Content-Length`` of
  at most ``buffer_limit`` is read whole, replaced and sent with its new length
  (an ``Expect: 100-continue`` is then answered by the proxy); a longer or
  chunked one streams re-framed as chunked. A request without a body is
  relayed without the streaming tasks a body needs.
- A request signed with a masked AWS pair's placeholder key id (``sigv4``) is
  read whole (at most ``sigv4_body_limit``, else 413), re-signed over the bytes
  forwarded, or refused 403 as its ``credentials.sigv4`` policy says.
- A request h11 cannot read, or one with both Transfer-Encoding and
  Content-Length, is answered 400; an upgrade or CONNECT inside the tunnel is
  refused 501. The real values are never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl

import h11

from sandhold.net.httphead import render_answer
from sandhold.net.injection import StreamSubstituter, substitute, substitute_headers
from sandhold.net.upstream_http import RequestWriter, ResponseReader, UpstreamError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandhold.net.ca import CertificateAuthority
    from sandhold.net.injection import Injector
    from sandhold.net.sigv4 import Verdict
    from sandhold.policy.credentials import Sigv4Policy, TlsTerminate
    from sandhold.policy.placeholders import AwsKeys, Injection

log = logging.getLogger("sandhold.net")

READ_SIZE = 64 * 1024
TOO_MANY = "too-many-tunnels"
MAX_SESSIONS = 256  # upstream TLS sessions kept for resumption (one per host)


class _Refuse(Exception):
    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.code, self.reason = status, code, reason


class Terminator:
    """The terminating half of one session's HTTP proxy (module rules)."""

    def __init__(
        self,
        ca: CertificateAuthority,
        injector: Injector,
        *,
        exclude_domains: Sequence[str] = (),
        upstream_context: ssl.SSLContext,
        max_tunnels: int = 256,
        handshake_timeout: float = 10.0,
        idle_timeout: float = 30.0,
        body_timeout: float = 60.0,
        buffer_limit: int = 1 << 20,
        max_head_bytes: int = 64 * 1024,
        aws_keys: Sequence[AwsKeys] = (),
        sigv4_policy: Sigv4Policy | None = None,
        sigv4_body_limit: int = 64 << 20,
    ) -> None:
        self.ca = ca
        self.injector = injector
        self.exclude_domains = tuple(exclude_domains)
        self.upstream_context = upstream_context
        self.max_tunnels = max_tunnels
        self.handshake_timeout = handshake_timeout
        self.idle_timeout = idle_timeout
        self.body_timeout = body_timeout
        self.buffer_limit = buffer_limit
        self.max_head_bytes = max_head_bytes
        self.aws_keys = tuple(aws_keys)
        self.sigv4_policy = sigv4_policy
        self.sigv4_body_limit = sigv4_body_limit
        self.active = 0
        self._sessions: dict[tuple[str, int], ssl.SSLSession] = {}  # oldest first
        self.resumed = 0  # upstream handshakes that resumed a session

    def _keep_session(self, where: tuple[str, int], session: ssl.SSLSession) -> None:
        """Remember the TLS session with ``(host, port)``: the next tunnel there resumes
        it (the certificate was verified when it was made)."""
        self._sessions.pop(where, None)
        self._sessions[where] = session
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.pop(next(iter(self._sessions)))

    def aws_keys_for(self, host: str) -> tuple[AwsKeys, ...]:
        from sandhold.net.injection import _host_matches

        return tuple(k for k in self.aws_keys if _host_matches(k.hosts, host))

    def wants(self, host: str) -> bool:
        from sandhold.net.injection import _host_matches

        return self.injector.wants(host) and not _host_matches(self.exclude_domains, host)

    def acquire(self) -> bool:
        if self.active >= self.max_tunnels:
            return False
        self.active += 1
        return True

    @staticmethod
    def too_many_answer() -> bytes:
        return render_answer(
            503,
            "sandhold: too many TLS-terminated tunnels are open (network.tlsTerminate.maxTunnels)",
            [("X-Proxy-Error", TOO_MANY)],
        )

    async def serve(
        self, conn: socket.socket, upstream: socket.socket, host: str, trailing: bytes
    ) -> None:
        """Terminate one tunnel whose slot was acquired; owns both sockets, frees the slot.

        Never raises for what the client or the upstream does.

        Cancellation: both sides are closed and ``CancelledError`` re-raised.
        """
        client: _TlsSocket | None = None
        up: _TlsSocket | None = None
        where = (host, 0)  # the upstream's (host, port): its TLS session's key
        try:
            if trailing:
                return  # a ClientHello sent before our 200: not a client we can speak to
            for sock in (conn, upstream):
                # a request is several small TLS records: Nagle would hold each
                # behind the peer's delayed ACK (40 ms a request)
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client = _TlsSocket(conn, self.ca.server_context(host), server_hostname=None)
            try:
                async with asyncio.timeout(self.handshake_timeout):
                    await client.handshake()
            except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
                log.debug("tls terminate %s: client handshake failed: %s", host, exc)
                return
            refusal: _Refuse | None = None
            where = (host, upstream.getpeername()[1])
            up = _TlsSocket(
                upstream,
                self.upstream_context,
                server_hostname=host,
                session=self._sessions.get(where),
            )
            try:
                async with asyncio.timeout(self.handshake_timeout):
                    await up.handshake()
                self.resumed += up.resumed
            except ssl.SSLCertVerificationError as exc:
                why = exc.verify_message or exc.reason or "unknown reason"
                refusal = _Refuse(
                    502, "upstream-tls-failed", f"{host}: certificate verify failed: {why}"
                )
            except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
                refusal = _Refuse(502, "upstream-tls-failed", f"{host}: {type(exc).__name__}")
            if refusal is not None:
                await self._answer_first(client, client, refusal)
                return
            await _Tunnel(self, host, client, client, up, up).run()
        except Exception as exc:
            # fails closed: whatever went wrong (a peer no rule foresaw, a bug), this
            # tunnel ends here and nothing more is sent; only the type is logged, never
            # a message that could quote a header
            log.warning("tls terminate %s: tunnel closed on %s", host, type(exc).__name__)
        finally:
            self.active -= 1
            if up is not None and up.session is not None:
                self._keep_session(where, up.session)
            for side in (client, up):
                if side is not None:
                    side.close()
            if client is None:
                conn.close()
            if up is None:
                upstream.close()

    async def _answer_first(self, reader: _TlsSocket, writer: _TlsSocket, refusal: _Refuse) -> None:
        """Read the client's first request head (bounded), then answer it ``refusal``."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.max_head_bytes)
        with contextlib.suppress(Exception):  # the client may be gone: best effort
            async with asyncio.timeout(self.idle_timeout):
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await reader.read(READ_SIZE)
                        conn.receive_data(data)
                        if not data:
                            break
                        continue
                    break
        writer.write(_refusal_bytes(refusal))
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                await writer.drain()


def credential_hooks(
    injections: Sequence[Injection],
    *,
    ca: CertificateAuthority | None,
    tls: TlsTerminate | None,
    plaintext: bool,
    aws_keys: Sequence[AwsKeys] = (),
    sigv4: Sigv4Policy | None = None,
) -> dict[str, Terminator | Injector]:
    """The ``EgressSession`` arguments that put ``injections`` back: ``terminator`` (with
    a CA and ``tlsTerminate``) and ``plaintext_injector`` (``allowPlaintextInject``);
    empty without injections. The CLI's runner and the port's sessions both use it."""
    if not injections:
        return {}
    from sandhold.net.ca import upstream_context
    from sandhold.net.injection import Injector

    injector = Injector(injections)
    hooks: dict[str, Terminator | Injector] = {}
    if plaintext:
        hooks["plaintext_injector"] = injector
    if ca is not None and tls is not None:
        hooks["terminator"] = Terminator(
            ca,
            injector,
            exclude_domains=tls.exclude_domains,
            upstream_context=upstream_context(tls.extra_ca_cert_paths),
            max_tunnels=tls.max_tunnels,
            handshake_timeout=tls.handshake_timeout_ms / 1000,
            aws_keys=aws_keys,
            sigv4_policy=sigv4,
        )
    return hooks


class _TlsSocket:
    """One side's TLS over its socket: an ``ssl.SSLObject`` on memory BIOs, driven by
    the loop's ``sock_recv``/``sock_sendall`` (the reader and the writer of the
    tunnel in one; no transport, protocol or stream layers in between: each request
    costs several of their calls per direction).

    ``write`` encrypts and sends at once what the socket takes; the rest waits for
    ``drain``. ``read`` gives b"" at the end (close_notify, or the peer closing the
    connection without one: the HTTP framing then says whether that was early).
    """

    def __init__(
        self,
        sock: socket.socket,
        context: ssl.SSLContext,
        *,
        server_hostname: str | None,
        session: ssl.SSLSession | None = None,
    ) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._loop = asyncio.get_running_loop()
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = context.wrap_bio(
            self._in,
            self._out,
            server_side=server_hostname is None,
            server_hostname=server_hostname,
            session=session,
        )
        self._pending = bytearray()  # ciphertext the socket did not take yet
        self._eof = False
        self._waiter: asyncio.Future[None] | None = None  # a read waiting for the socket
        self._watching = False  # the socket is registered with the loop for reading
        self._idle = 0  # readiness reports in a row with no read waiting

    @property
    def resumed(self) -> bool:
        return self._tls.session_reused

    @property
    def session(self) -> ssl.SSLSession | None:
        """The session to resume with, once the peer sent a ticket for it."""
        found = self._tls.session
        return found if found is not None and found.has_ticket else None

    async def _more(self, deadline: float | None = None) -> bool:
        """Feed the TLS object what the socket has; False at the connection's end.

        Raises:
            TimeoutError: nothing came by ``deadline`` (the loop's clock).
        """
        self._send_now()  # what the handshake (or a key update) wants sent first
        await self.drain()
        while True:
            try:
                data = self.sock.recv(READ_SIZE)
                break
            except (BlockingIOError, InterruptedError):
                await self._readable(deadline)
        if not data:
            self._in.write_eof()
            return False
        self._in.write(data)
        return True

    async def handshake(self) -> None:
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if not await self._more():
                    raise ConnectionError("the peer closed during the TLS handshake") from None
        self._send_now()
        await self.drain()

    async def _readable(self, deadline: float | None) -> None:
        # one future and one timer per wait (asyncio.timeout around sock_recv cost
        # several of each, twice a request), and the socket stays registered from
        # one wait to the next: adding and removing it cost two epoll_ctl calls a wait
        loop = self._loop
        waiter = loop.create_future()
        self._waiter = waiter
        self._idle = 0
        if not self._watching:
            loop.add_reader(self.sock.fileno(), self._on_readable)
            self._watching = True
        timer = None if deadline is None else loop.call_at(deadline, _expire, waiter)
        try:
            await waiter
        finally:
            if self._waiter is waiter:
                self._waiter = None
            if timer is not None:
                timer.cancel()

    def _on_readable(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is None:
            # readable with no one waiting. Once is the loop's own echo (it reports a
            # socket again before the woken read has drained it); twice is data past
            # what was asked, or the peer's end: unregistered, or the loop would be
            # woken for it again and again
            self._idle += 1
            if self._idle > 1:
                self._unwatch()
            return
        self._idle = 0
        if not waiter.done():
            waiter.set_result(None)

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            self._loop.remove_reader(self.sock.fileno())

    async def read(self, n: int = READ_SIZE, timeout: float | None = None) -> bytes:
        """Up to ``n`` bytes (b"" at the end).

        Raises:
            TimeoutError: no data within ``timeout`` seconds.
        """
        deadline = None if timeout is None else self._loop.time() + timeout
        while not self._eof:
            if not self._buffered():
                if not await self._more(deadline):
                    self._eof = self._in.eof
                continue
            try:
                data = self._tls.read(n)
            except ssl.SSLWantReadError:
                if self._in.eof or not await self._more(deadline):
                    # what was decrypted is out; a cut record is no more data
                    self._eof = self._in.eof
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self._eof = True
                break
            self._send_now()
            return self._rest(data, n)
        return b""

    def _buffered(self) -> bool:
        """Whether the TLS object may have something to give without the socket
        (asking it when it has nothing costs an exception)."""
        return bool(self._in.pending or self._tls.pending() or self._in.eof)

    def _rest(self, data: bytes, n: int) -> bytes:
        """``data`` (one record's) and what else is decrypted already, up to ``n`` bytes:
        one piece for the parser instead of one per 16 KiB record."""
        parts = [data]
        size = len(data)
        while size < n and (self._in.pending or self._tls.pending()):
            try:
                more = self._tls.read(n - size)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break  # the next read says it again, or waits
            if not more:
                break
            parts.append(more)
            size += len(more)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read_nowait(self, n: int = READ_SIZE) -> bytes | None:
        """What can be read without waiting (b"" at the end), or None."""
        if self._eof:
            return b""
        if self._buffered():
            try:
                return self._rest(self._tls.read(n), n)
            except ssl.SSLWantReadError:
                if self._in.eof:
                    self._eof = True
                    return b""
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self._eof = True
                return b""
        try:
            data = self.sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return None
        if not data:
            self._in.write_eof()
        else:
            self._in.write(data)
        try:
            return self._rest(self._tls.read(n), n)
        except ssl.SSLWantReadError:
            return None  # a record cut in two: read() waits for the rest
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            self._eof = True
            return b""

    def write(self, data: bytes) -> None:
        self._tls.write(data)
        self._send_now()

    def _send_now(self) -> None:
        out = self._out.read()
        if out:
            self._pending += out
        if self._pending:
            try:
                sent = self.sock.send(self._pending)
            except (BlockingIOError, InterruptedError):
                return
            del self._pending[:sent]

    async def drain(self) -> None:
        while self._pending:
            data = bytes(self._pending)
            self._pending.clear()
            await self._loop.sock_sendall(self.sock, data)

    def close(self) -> None:
        self._unwatch()
        with contextlib.suppress(ssl.SSLError, OSError, ValueError):
            self._tls.unwrap()  # our close_notify, sent if the socket takes it now
        with contextlib.suppress(OSError):
            self._send_now()
        self.sock.close()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def _refusal_bytes(refusal: _Refuse) -> bytes:
    return render_answer(
        refusal.status,
        f"sandhold: {refusal.reason}",
        [("X-Proxy-Error", f"{refusal.code}; reason={refusal.reason}")],
    )


def _header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


class _Tunnel:
    """One terminated tunnel: requests in turn, each relayed with its response."""

    def __init__(  # noqa: PLR0917 (private; one call site)
        self,
        owner: Terminator,
        host: str,
        client_r: _TlsSocket,
        client_w: _TlsSocket,
        upstream_r: _TlsSocket,
        upstream_w: _TlsSocket,
    ) -> None:
        self.o = owner
        self.pairs = owner.injector.pairs_for(host)
        self.aws_keys = owner.aws_keys_for(host)
        self.client_r, self.client_w = client_r, client_w
        self.upstream_r, self.upstream_w = upstream_r, upstream_w
        self.cli = h11.Connection(h11.SERVER, max_incomplete_event_size=owner.max_head_bytes)
        self.writer = RequestWriter(host.encode())
        self.answered = False  # a byte of this request's response went to the client
        self.keep = False  # the upstream's last response left its connection reusable

    async def run(self) -> None:
        first = True
        while True:
            try:
                request = await self._next_request(first)
            except _Refuse as refusal:
                self.client_w.write(_refusal_bytes(refusal))
                await self.client_w.drain()
                return
            if request is None:
                return
            first = False
            self.answered = self.keep = False
            try:
                await self._exchange(request)
            except _Refuse as refusal:
                if not self.answered:
                    self.client_w.write(_refusal_bytes(refusal))
                    with contextlib.suppress(Exception):
                        await self.client_w.drain()
                return
            except (h11.ProtocolError, OSError, ConnectionError, TimeoutError) as exc:
                log.debug("tls terminate: exchange cut: %s", type(exc).__name__)
                return
            if not (self.keep and self.cli.their_state is h11.DONE):
                return  # either side said close, or the request was answered early
            # the response went out as the upstream sent it, not through h11: the next
            # request gets a fresh parser, fed what the client sent after this one
            rest, _closed = self.cli.trailing_data
            self.cli = h11.Connection(h11.SERVER, max_incomplete_event_size=self.o.max_head_bytes)
            if rest:
                self.cli.receive_data(rest)

    async def _client_event(self, timeout: float) -> object:
        while True:
            try:
                event = self.cli.next_event()
            except h11.RemoteProtocolError as exc:
                raise _Refuse(exc.error_status_hint, "bad-request", str(exc)) from None
            if event is not h11.NEED_DATA:
                return event
            data = await self.client_r.read(READ_SIZE, timeout)
            self.cli.receive_data(data)

    async def _next_request(self, first: bool) -> h11.Request | None:
        timeout = self.o.handshake_timeout if first else self.o.idle_timeout
        try:
            event = await self._client_event(timeout)
        except TimeoutError:
            return None
        if isinstance(event, h11.ConnectionClosed):
            return None
        if not isinstance(event, h11.Request):
            return None
        if event.method == b"CONNECT" or _header(event.headers.raw_items(), b"upgrade"):
            raise _Refuse(501, "bad-request", "upgrades and CONNECT inside a terminated tunnel")
        return event

    async def _exchange(self, request: h11.Request) -> None:
        pairs = self.pairs
        if self.aws_keys:
            from sandhold.net.sigv4 import classify
            from sandhold.policy.credentials import Sigv4Policy

            verdict = classify(
                request.method,
                request.target,
                request.headers,
                self.aws_keys,
                self.o.sigv4_policy or Sigv4Policy(),
            )
            if verdict.action == "deny":
                raise _Refuse(403, verdict.code, verdict.reason)
            if verdict.action == "resign":
                await self._resigned(request, verdict)
                return
        raw = request.headers.raw_items()  # a list: iterating h11's Headers is slow
        headers = substitute_headers(raw, pairs)
        named: dict[bytes, bytes] = {}  # the first value of each name: one pass
        for k, v in headers:
            named.setdefault(k.lower(), v)
        length = named.get(b"content-length")
        substituting = bool(pairs) and b"content-encoding" not in named
        buffered: bytes | None = None
        chunked = b"transfer-encoding" in named
        if chunked and length is not None:
            # h11 reads the body as chunked; an upstream that took the length would
            # end the request elsewhere (the smuggling trick): refused, nothing sent
            raise _Refuse(400, "bad-request", "both Transfer-Encoding and Content-Length")
        if length is None and not chunked:
            # no body (RFC 9112 6.3): h11 holds its end already; nothing to stream,
            # so no pump and relay tasks for the common GET
            buffered = await self._read_body()
        elif substituting and length is not None and int(length) <= self.o.buffer_limit:
            if named.get(b"expect", b"").lower() == b"100-continue":
                self._to_client(h11.InformationalResponse(status_code=100, headers=[]))
                headers = [(k, v) for k, v in headers if k.lower() != b"expect"]
            buffered = substitute(await self._read_body(), pairs)
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(buffered)).encode()))
        elif substituting:
            # the length changes as it streams: re-framed as chunked
            headers = [
                (k, v)
                for k, v in headers
                if k.lower() not in (b"content-length", b"transfer-encoding")
            ]
            headers.append((b"transfer-encoding", b"chunked"))
        self._send_head(request, headers)
        if buffered is not None:
            if buffered:
                self.upstream_w.write(self.writer.data(buffered))
            self._send(self.writer.end())
            await self.upstream_w.drain()
            await self._relay_response(request)
            return
        sending = asyncio.ensure_future(
            self._pump_body(StreamSubstituter(pairs if substituting else {}))
        )
        relaying = asyncio.ensure_future(self._relay_response(request))
        try:
            await asyncio.wait({sending, relaying}, return_when=asyncio.FIRST_COMPLETED)
            if sending.done() and sending.exception() is not None:
                relaying.cancel()
                raise sending.exception()  # type: ignore[misc]
            await relaying
            if not sending.done():
                sending.cancel()  # answered before the body's end: the tunnel closes
                with contextlib.suppress(asyncio.CancelledError):
                    await sending
        finally:
            sending.cancel()
            relaying.cancel()

    async def _resigned(self, request: h11.Request, verdict: Verdict) -> None:
        """Read the body whole, put the placeholders back, re-sign, forward."""
        from sandhold.net.sigv4 import resign

        headers = request.headers.raw_items()
        if (_header(headers, b"expect") or b"").lower() == b"100-continue":
            self._to_client(h11.InformationalResponse(status_code=100, headers=[]))
            headers = [(k, v) for k, v in headers if k.lower() != b"expect"]
        body = await self._read_body(self.o.sigv4_body_limit)
        if _header(headers, b"content-encoding") is None:
            body = substitute(body, self.pairs)
        # the placeholders of the other headers (never the signature's own fields)
        auth = _header(headers, b"authorization")
        headers = [
            (k, v) if k.lower() == b"authorization" else (k, substitute(v, self.pairs))
            for k, v in headers
            if k.lower() not in (b"content-length", b"transfer-encoding")
        ]
        headers.append((b"content-length", str(len(body)).encode()))
        assert auth is not None
        try:
            signed = resign(request.method, request.target, headers, body, verdict)
        except ImportError:
            raise _Refuse(
                403,
                "sigv4-unavailable",
                "re-signing a masked AWS request needs the 'botocore' package on the host",
            ) from None
        self._send_head(request, signed)
        if body:
            self._send(self.writer.data(body))
        self._send(self.writer.end())
        await self.upstream_w.drain()
        await self._relay_response(request)

    async def _read_body(self, limit: int | None = None) -> bytes:
        limit = self.o.buffer_limit if limit is None else limit
        parts: list[bytes] = []
        size = 0
        while True:
            event = await self._client_event(self.o.body_timeout)
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > limit:
                    raise _Refuse(
                        413, "bad-request", "the request body is too long to re-sign or buffer"
                    )
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            else:
                raise _Refuse(400, "bad-request", "the request body ended early")

    async def _pump_body(self, sub: StreamSubstituter) -> None:
        while True:
            event = await self._client_event(self.o.body_timeout)
            if isinstance(event, h11.Data):
                data = sub.feed(bytes(event.data))
                if data:
                    self._send(self.writer.data(data))
            elif isinstance(event, h11.EndOfMessage):
                rest = sub.flush()
                if rest:
                    self._send(self.writer.data(rest))
                self._send(self.writer.end(event.headers.raw_items()))
                await self.upstream_w.drain()
                return
            else:
                raise _Refuse(400, "bad-request", "the request body ended early")
            await self.upstream_w.drain()

    async def _relay_response(self, request: h11.Request) -> None:
        """Forward the upstream's response as it sent it, to its end (``upstream_http``)."""
        reader = ResponseReader(
            request.method,
            forward_100=self.cli.they_are_waiting_for_100_continue,
            forward_interim=request.http_version == b"1.1",
        )
        pending: list[bytes] = []  # one write per upstream read: fewer TLS records
        held = 0

        async def flush() -> None:
            nonlocal held
            if pending:
                self.answered = True
                self.client_w.write(b"".join(pending))
                pending.clear()
                held = 0
                await self.client_w.drain()

        while not reader.done:
            # what has arrived already joins this write (a head and its body sent
            # apart go out as one record), up to READ_SIZE held; the client gets what
            # we hold before we wait for more
            data = self.upstream_r.read_nowait(READ_SIZE) if held < READ_SIZE else None
            if data is None:
                if not (reader.short_rest and held < READ_SIZE):
                    await flush()
                data = await self.upstream_r.read(READ_SIZE, self.o.body_timeout)
            try:
                out = reader.feed(data)
            except UpstreamError as exc:
                raise _Refuse(502, "upstream-bad-response", str(exc)) from None
            if out:
                pending.append(out)
                held += len(out)
        await flush()
        # bytes after the response's end were never asked for: not kept alive
        self.keep = reader.keep_alive and not reader.trailing

    def _to_client(self, event: h11.Event) -> None:
        data = self.cli.send(event)
        if data:
            self.client_w.write(data)

    def _send_head(self, request: h11.Request, headers: list[tuple[bytes, bytes]]) -> None:
        try:
            head = self.writer.head(request.method, request.target, headers)
        except ValueError:
            raise _Refuse(
                502, "bad-request", "a credential's real value cannot go in a header (CR, LF, NUL)"
            ) from None
        self._send(head)

    def _send(self, data: bytes) -> None:
        if data:
            self.upstream_w.write(data)
