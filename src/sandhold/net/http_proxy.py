"""The HTTP proxy: serve one client connection, as a CONNECT tunnel or one forwarded request.

Rules:
- Per request: read the request head (``httphead``) within ``head_timeout``;
  ask the ``Dialer`` for the target (policy, resolution, address guard, dial).
  A CONNECT then relays bytes both ways (``relay``) until both sides are done.
- A forwarded request goes on a fresh upstream connection as its rewritten head
  and exactly its body as h11 frames it (Content-Length counted, chunked decoded
  and re-framed); the client is not read past the body's end until the response
  is done. The response is relayed as bytes up to its end as h11 frames it;
  anything the origin sends after that is dropped, and the upstream closed.
  Then the next request on the client connection (HTTP/1.1 keep-alive,
  pipelined or not) is parsed, decided and dialled on its own, as if it came on
  a new connection; it never goes down an earlier request's upstream. The
  client connection is closed instead when either side asked to close, the
  response is framed by the close, the origin answered before the whole body,
  or the response cannot be parsed (then it is relayed to the origin's EOF).
- A body that breaks its framing (malformed chunks, EOF before its end, stalled
  ``body_timeout``) aborts the upstream (RST: the origin has no complete
  request to act on) and is answered 400 (408), unless part of a response has
  already reached the client (then the client is aborted too).
- Answers (F-NET-4), each followed by closing the connection:
  refused by the policy → 403 with a text body naming the target, the rule and
  the reason, and ``X-Proxy-Error: blocked-by-sandbox-policy; host=H:P; rule=R``;
  allowed but unreachable → 502 with
  ``X-Proxy-Error: upstream-unreachable; host=H:P; reason=R``;
  a bad head → its status (400, 408, 431, 501, 505) with
  ``X-Proxy-Error: bad-request; reason=R``.
- A CONNECT that succeeds gets ``200 Connection established``, and the tunnel's
  bytes pass untouched (TLS stays end to end). A forwarded ``http://`` request
  reaches the origin with the rewritten head (see ``httphead``: origin form, no
  hop-by-hop headers, ``Connection: close``), and the response comes back as
  bytes, unchanged.
- With a ``request_filter`` (``request_filter`` module; proxy mode): after the
  policy allows the target and before anything is resolved or dialled, the
  filter decides the request; its refusal is answered with its status and
  ``X-Deny-Reason``, its header edits are applied to the forwarded head, and
  any body it read is forwarded first. Every refusal the proxy answers itself
  then also carries ``X-Deny-Reason``: ``host_not_allowed`` (the policy),
  ``address_not_allowed`` (the resolved-address guard) or ``bad_request``.
  Without a filter nothing changes.
- With a ``terminator`` (``tls_terminate``; masked credentials): a CONNECT to a
  host it wants is TLS-terminated there instead of relayed (503 when its tunnels
  are all taken); with ``plaintext`` (``allowPlaintextInject``) the header lines
  of a forwarded ``http://`` request get the placeholders of its host replaced.
  Without them nothing changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import h11

from sandhold.net._conn import RECV_SIZE, answer_and_close, peer_of
from sandhold.net.budget import set_idle
from sandhold.net.errors import BadRequest, DialFailed, Refused
from sandhold.net.httphead import (
    CONNECT_ESTABLISHED,
    RequestHeadParser,
    edit_head,
    frame_body,
    render_answer,
)
from sandhold.net.outbound import target_text
from sandhold.net.relay import abort
from sandhold.net.request_filter import DENY_HEADER, FilterDeny, FilterInput
from sandhold.policy.domains import FILTER, GUARD, Decision

TYPE_CHECKING = False  # typing costs start-up time; mypy honours this name
if TYPE_CHECKING:
    from sandhold.net._conn import Limits
    from sandhold.net.httphead import ProxyRequest
    from sandhold.net.injection import Injector
    from sandhold.net.outbound import Dialer
    from sandhold.net.relay import Relayer
    from sandhold.net.request_filter import FilterAllow, RequestFilter
    from sandhold.net.tls_terminate import Terminator

log = logging.getLogger("sandhold.net")


async def serve_http_client(
    conn: socket.socket,
    dialer: Dialer,
    relayer: Relayer,
    limits: Limits,
    *,
    request_filter: RequestFilter | None = None,
    terminator: Terminator | None = None,
    plaintext: Injector | None = None,
) -> None:
    """Serve one accepted client connection to its end (module rules); owns ``conn``.

    Never raises for anything the client, the target or the filter does.

    Cancellation: the client socket and any upstream socket are aborted (RST)
    or closed, and ``CancelledError`` is re-raised.
    """
    client: socket.socket | None = conn
    try:
        leftover, eof, first = b"", False, True
        while client is not None:
            step = await _serve_one(
                conn,
                dialer,
                relayer,
                limits,
                request_filter,
                leftover,
                eof,
                first,
                (terminator, plaintext),
            )
            if step is None:
                client = None  # answered and closed, or handed to a tunnel
                return
            leftover, eof = step
            first = False
    finally:
        if client is not None:
            abort(client)


async def _serve_one(  # noqa: PLR0917 (private; the one request's story)
    conn: socket.socket,
    dialer: Dialer,
    relayer: Relayer,
    limits: Limits,
    request_filter: RequestFilter | None,
    leftover: bytes,
    eof: bool,
    first: bool,
    credentials: tuple[Terminator | None, Injector | None] = (None, None),
) -> tuple[bytes, bool] | None:
    """Serve one request of the connection: ``None`` once ``conn`` is closed or handed
    on, else what the client sent after it (and whether it closed) for the next one.

    The caller aborts ``conn`` if this raises (cancellation only).
    """
    loop = asyncio.get_running_loop()
    peer = peer_of(conn)
    upstream: socket.socket | None = None
    try:
        parser = RequestHeadParser(limits.max_head_bytes)
        filtered = request_filter is not None
        set_idle(conn, True)  # waiting for a head: the first reclaimed when slots run short
        try:
            request = await _read_head(loop, conn, parser, limits.head_timeout, leftover, eof)
        except BadRequest as exc:
            if not first and exc.status == 408 and parser.buffered == 0:
                await answer_and_close(conn, b"", limits.answer_timeout)  # idle keep-alive
                return None
            await answer_and_close(conn, _bad_request_answer(exc, filtered), limits.answer_timeout)
            return None
        if request is None:
            await answer_and_close(conn, b"", limits.answer_timeout)
            return None  # closed (or reset) before sending a byte of a request
        set_idle(conn, False)
        head = request.forward_head
        body: _Body | None = None
        if request_filter is not None:
            try:
                outcome = await _filter(conn, dialer, parser, request, request_filter, limits, peer)
            except Refused as exc:
                answer = _refused_answer(exc.decision, filtered)
                outcome = None
            except BadRequest as exc:
                answer = _bad_request_answer(exc, filtered)
                outcome = None
            if isinstance(outcome, FilterDeny):
                answer = _filter_answer(outcome)
            if outcome is None or isinstance(outcome, FilterDeny):
                await answer_and_close(conn, answer, limits.answer_timeout)
                return None
            head, body = outcome
        try:
            upstream = await dialer.dial(request.host, request.port, "http", client=peer)
        except Refused as exc:
            answer = _refused_answer(exc.decision, filtered)
            await answer_and_close(conn, answer, limits.answer_timeout)
            return None
        except DialFailed as exc:
            await answer_and_close(conn, _unreachable_answer(exc), limits.answer_timeout)
            return None
        terminator, plaintext = credentials
        if request.is_connect:
            host = _canonical(request.host)
            terminate = terminator is not None and host is not None and terminator.wants(host)
            if terminate and terminator is not None and not terminator.acquire():
                abort(upstream)
                upstream = None
                await answer_and_close(conn, terminator.too_many_answer(), limits.answer_timeout)
                return None
            try:
                await loop.sock_sendall(conn, CONNECT_ESTABLISHED)
            except OSError:
                if terminate and terminator is not None:
                    terminator.active -= 1
                abort(conn)
                return None
            pair, upstream = upstream, None
            if terminate and terminator is not None and host is not None:
                await terminator.serve(conn, pair, host, parser.trailing_data)
                return None
            result = await relayer.relay(conn, pair, first_a_to_b=parser.trailing_data)
            if result.error is not None:
                log.debug(
                    "http proxy: CONNECT %s:%s cut: %s", request.host, request.port, result.error
                )
            return None
        if plaintext is not None:
            head = _inject_head(head, plaintext, request.host)
        exchange = _Exchange(conn, upstream, parser, request, head, body, limits)
        keep = await exchange.run()
        upstream.close()
        upstream = None
        if keep is None:
            return None  # the exchange closed the client
        if not keep:
            await answer_and_close(conn, b"", limits.answer_timeout)
            return None
        return parser.trailing_data, parser.trailing_closed
    except BaseException:
        if upstream is not None:
            abort(upstream)
        raise


class _Exchange:
    """One forwarded request and its response, on a fresh upstream connection.

    The request goes as its head and exactly its framed body (``httphead``); the
    client is not read past the body's end. The response comes back as bytes,
    unchanged, up to its end as h11 frames it; nothing the origin sends after that
    reaches the client. ``run`` says whether the client connection can carry
    another request: True, False (close it politely), or None (already closed).
    """

    def __init__(  # noqa: PLR0917 (private; one call site)
        self,
        conn: socket.socket,
        upstream: socket.socket,
        parser: RequestHeadParser,
        request: ProxyRequest,
        head: bytes,
        body: _Body | None,
        limits: Limits,
    ) -> None:
        self._conn, self._upstream = conn, upstream
        self._parser, self._request, self._head = parser, request, head
        self._body, self._limits = body, limits
        self._answered = False  # bytes of the response reached the client

    async def run(self) -> bool | None:
        sending = asyncio.ensure_future(self._send_request())
        relaying = asyncio.ensure_future(self._relay_response())
        try:
            await asyncio.wait({sending, relaying}, return_when=asyncio.FIRST_COMPLETED)
            if sending.done() and isinstance(sending.exception(), BadRequest):
                relaying.cancel()  # the origin waits for a body that will not come
                with contextlib.suppress(asyncio.CancelledError):
                    await relaying
                error = sending.exception()
                assert isinstance(error, BadRequest)
                return await self._refuse_body(error)
            keep = await relaying
        except BaseException:
            sending.cancel()
            relaying.cancel()
            raise
        if not sending.done():
            sending.cancel()  # answered before the whole body: the body's end is unknown
            abort(self._upstream)
            return False
        error = sending.exception()
        if isinstance(error, BadRequest):
            return await self._refuse_body(error)
        if error is not None:
            return False  # the upstream went away while the body went; the answer came
        return keep and self._parser.client_keeps_alive

    async def _refuse_body(self, error: BadRequest) -> bool | None:
        # the origin saw part of a body at most, then a reset: nothing it can act on
        abort(self._upstream)
        if self._answered:
            abort(self._conn)
        else:
            answer = _bad_request_answer(error, filtered=False)
            await answer_and_close(self._conn, answer, self._limits.answer_timeout)
        return None

    async def _send_request(self) -> None:
        """Head, then the body exactly as framed; raises BadRequest for a bad body."""
        loop = asyncio.get_running_loop()
        parser, chunked = self._parser, self._parser.chunked
        out = bytearray(self._head)
        body = self._body
        if body is not None and body.pulled:
            out += frame_body(bytes(body.pulled), chunked)
        if body is not None and body.trailers is not None:
            out += frame_body(body.trailers, chunked)
            await loop.sock_sendall(self._upstream, bytes(out))
            return
        timeout = self._limits.body_timeout
        while True:
            piece = parser.next_body()
            if piece is None:
                if out:
                    await loop.sock_sendall(self._upstream, bytes(out))
                    out.clear()
                try:
                    async with asyncio.timeout(timeout):
                        data = await loop.sock_recv(self._conn, RECV_SIZE)
                except TimeoutError:
                    raise BadRequest(408, f"the request body stalled for {timeout:g} s") from None
                except OSError:
                    data = b""
                parser.receive_body(data)
                continue
            out += frame_body(piece, chunked)
            if isinstance(piece, tuple):
                await loop.sock_sendall(self._upstream, bytes(out))
                return

    async def _relay_response(self) -> bool:
        """Relay the response to its end; whether it leaves the connection usable."""
        loop = asyncio.get_running_loop()
        decoder = h11.Connection(h11.CLIENT)
        method = self._request.method.encode("ascii")
        decoder.send(h11.Request(method=method, target=b"/", headers=[(b"Host", b"x")]))
        framed = True
        while True:
            try:
                data = await loop.sock_recv(self._upstream, RECV_SIZE)
            except OSError:
                data = b""
            if framed:
                decoder.receive_data(data)
                try:
                    done = self._response_done(decoder)
                except h11.RemoteProtocolError:
                    framed, done = False, False  # unreadable: relay to EOF, then close
            else:
                done = not data
            if done and framed:
                extra = len(decoder.trailing_data[0])
                data = data[: max(0, len(data) - extra)]
            if data:
                try:
                    await loop.sock_sendall(self._conn, data)
                except OSError:
                    return False
                self._answered = True
            if done or not data:
                return framed and done and decoder.their_state is h11.DONE

    @staticmethod
    def _response_done(decoder: h11.Connection) -> bool:
        while True:
            event = decoder.next_event()
            if isinstance(event, h11.EndOfMessage):
                return True
            if event is h11.NEED_DATA:
                return False
            if isinstance(event, h11.ConnectionClosed):
                raise h11.RemoteProtocolError("the upstream closed before the response")


async def _read_head(  # noqa: PLR0917 (private)
    loop: asyncio.AbstractEventLoop,
    conn: socket.socket,
    parser: RequestHeadParser,
    timeout: float,
    leftover: bytes = b"",
    eof: bool = False,
) -> ProxyRequest | None:
    """The request head, or ``None`` if the client left without sending a byte of it.

    ``leftover`` (what followed the previous request) is parsed first.

    Raises:
        BadRequest: from the parser, or 408 when ``timeout`` passes first.
    """
    if leftover:
        parser.receive_data(leftover)
        request = parser.next_event()
        if request is not None:
            return request
    if eof:
        if parser.buffered == 0:
            return None
        parser.receive_data(b"")
        return parser.next_event()
    try:
        async with asyncio.timeout(timeout):
            while True:
                data = await loop.sock_recv(conn, RECV_SIZE)
                if not data and parser.buffered == 0:
                    return None
                parser.receive_data(data)
                request = parser.next_event()
                if request is not None:
                    return request
    except TimeoutError:
        raise BadRequest(408, f"the request head did not arrive within {timeout:g} s") from None
    except ConnectionError:
        return None  # reset by the client: nobody to answer


async def _filter(  # noqa: PLR0917 (private; one call site)
    conn: socket.socket,
    dialer: Dialer,
    parser: RequestHeadParser,
    request: ProxyRequest,
    request_filter: RequestFilter,
    limits: Limits,
    peer: tuple[str, int],
) -> FilterDeny | tuple[bytes, _Body]:
    """The filter's refusal, or the head to forward and the body as far as it was read.

    Raises:
        Refused: the policy refused the target (reported by the dialer).
        BadRequest: the client's body is malformed or too slow.
    """
    decision = await dialer.check(request.host, request.port, "http", client=peer)
    headers = tuple(
        (n.decode("latin-1"), v.decode("utf-8", "surrogateescape")) for n, v in parser.raw_headers
    )
    body = _Body(conn, parser, request, headers, limits.body_timeout)
    target = parser.raw_target.decode("utf-8", "surrogateescape")
    if not request.is_connect:
        # the path and query as spelled (absolute form minus scheme and authority)
        rest = target[7:]
        cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
        target = rest[cut:].partition("#")[0]
        target = target if target.startswith("/") else "/" + target
    try:
        outcome: FilterAllow | FilterDeny = await request_filter.check(
            FilterInput(request, decision, target, headers), body
        )
    except BadRequest:
        raise
    except Exception:  # a bug in the filter refuses the request, never passes it
        log.exception("http proxy: the request filter failed; refusing the request")
        outcome = FilterDeny(500, "filter_failed", "the request filter failed")
    if isinstance(outcome, FilterDeny):
        refusal = Decision(
            False,
            decision.host,
            decision.port,
            f"request filter: {outcome.code}",
            outcome.reason,
            FILTER,
        )
        dialer.report(refusal, "http", client=peer)
        return outcome
    head = request.forward_head
    if outcome.remove_headers or outcome.set_headers:
        if request.is_connect:
            return FilterDeny(403, "filter_failed", "a CONNECT has no headers to edit")
        try:
            head = edit_head(head, outcome.remove_headers, outcome.set_headers)
        except ValueError as exc:
            log.error("http proxy: the request filter's header edits are unusable: %s", exc)
            return FilterDeny(500, "filter_failed", "the request filter failed")
    return head, body


class _Body:
    """The ``BodyReader`` of one forwarded request, on the request's own parser.

    What it decodes stays in ``pulled`` (and the end's trailers in ``trailers``),
    and is forwarded after an allow, then the rest of the body as framed
    (``_Exchange``); nothing after the body's end is read as body. Trailers of a
    body read whole, which the filter cannot see, are refused (400).
    """

    def __init__(
        self,
        conn: socket.socket,
        parser: RequestHeadParser,
        request: ProxyRequest,
        headers: tuple[tuple[str, str], ...],
        timeout: float,
    ) -> None:
        self._conn = conn
        self._parser = parser
        self._timeout = timeout
        names = {n.lower(): v for n, v in headers}
        length = names.get("content-length")
        chunked = parser.chunked
        self.length: int | None = None
        if not request.is_connect and length is not None and length.strip().isdigit():
            self.length = int(length.strip())
        self.has_body = not request.is_connect and (chunked or bool(self.length))
        self._continue = names.get("expect", "").strip().lower() == "100-continue"
        self._read = False
        self.pulled = bytearray()  # decoded body bytes taken from the client so far
        self.trailers: tuple[tuple[bytes, bytes], ...] | None = None  # set at the end

    async def read(self, limit: int) -> tuple[bytes, bool]:
        if not self.has_body:
            return b"", False
        if self._read:
            raise RuntimeError("the body was read already")
        self._read = True
        loop = asyncio.get_running_loop()
        parser = self._parser
        if self._continue and not parser.trailing_data:
            # the client waits for a 100 before it sends the body the decider asked
            # to see; the origin's own 100, if it sends one later, is one more 1xx
            await loop.sock_sendall(self._conn, b"HTTP/1.1 100 Continue\r\n\r\n")
        data = self.pulled
        raw = len(parser.trailing_data)  # what came with the head counts too
        cap = 2 * limit + RECV_SIZE * 4  # raw bytes (chunk framing included) held at most
        try:
            async with asyncio.timeout(self._timeout):
                while True:
                    piece = parser.next_body()
                    if isinstance(piece, bytes):
                        data += piece
                        if len(data) > limit:
                            return bytes(data[:limit]), True
                    elif piece is not None:
                        if piece:
                            raise BadRequest(
                                400, "request trailers are not forwarded once the body is read"
                            )
                        self.trailers = piece
                        return bytes(data), False
                    else:
                        if raw > cap:  # framing, not body: no honest "cut"
                            raise BadRequest(400, "the chunked body's framing is too large")
                        chunk = await loop.sock_recv(self._conn, RECV_SIZE)
                        raw += len(chunk)
                        parser.receive_body(chunk)
        except TimeoutError:
            raise BadRequest(
                408, f"the request body did not arrive within {self._timeout:g} s"
            ) from None
        except OSError:
            raise BadRequest(400, "the client left while sending the body") from None


def _canonical(host: str) -> str | None:
    from sandhold.policy.domains import canonical_host

    try:
        return canonical_host(host)
    except ValueError:
        return None  # the dialer refused it already; nothing to inject at


def _inject_head(head: bytes, injector: Injector, host: str) -> bytes:
    """The header lines with the placeholders of ``host`` replaced (not the request line)."""
    from sandhold.net.injection import substitute

    canonical = _canonical(host)
    pairs = injector.pairs_for(canonical) if canonical is not None else {}
    if not pairs:
        return head
    line, sep, rest = head.partition(b"\r\n")
    return line + sep + substitute(rest, pairs)


def _filter_answer(deny: FilterDeny) -> bytes:
    return render_answer(deny.status, f"sandhold: {deny.reason}", [(DENY_HEADER, deny.code)])


def _refused_answer(decision: Decision, filtered: bool = False) -> bytes:
    target = target_text(decision.host, decision.port)
    body = (
        f"sandhold: the sandbox network policy refused the connection to {target}.\n"
        f"rule: {decision.rule}\nreason: {decision.reason}"
    )
    header = f"blocked-by-sandbox-policy; host={target}; rule={decision.rule}"
    headers = [("X-Proxy-Error", header)]
    if filtered:
        guarded = decision.kind == GUARD
        headers.append((DENY_HEADER, "address_not_allowed" if guarded else "host_not_allowed"))
    return render_answer(403, body, headers)


def _unreachable_answer(exc: DialFailed) -> bytes:
    body = f"sandhold: {exc.target} is allowed but could not be reached ({exc.kind}).\n{exc.reason}"
    header = f"upstream-unreachable; host={exc.target}; reason={exc.reason}"
    return render_answer(502, body, [("X-Proxy-Error", header)])


def _bad_request_answer(exc: BadRequest, filtered: bool = False) -> bytes:
    body = f"sandhold: the proxy cannot serve this request: {exc.reason}"
    headers = [("X-Proxy-Error", f"bad-request; reason={exc.reason}")]
    if filtered:
        headers.append((DENY_HEADER, "bad_request"))
    return render_answer(exc.status, body, headers)
