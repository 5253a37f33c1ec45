"""The HTTP proxy: serve one client connection, as a CONNECT tunnel or one forwarded request.

Rules:
- Per connection: read the request head (``httphead``) within ``head_timeout``;
  ask the ``Dialer`` for the target (policy, resolution, address guard, dial);
  then relay bytes both ways (``relay``) until both sides are done.
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
  bytes, unchanged. One request per client connection.
- With a ``request_filter`` (``request_filter`` module; proxy mode): after the
  policy allows the target and before anything is resolved or dialled, the
  filter decides the request; its refusal is answered with its status and
  ``X-Deny-Reason``, its header edits are applied to the forwarded head, and
  any body it read is forwarded first. Every refusal the proxy answers itself
  then also carries ``X-Deny-Reason``: ``host_not_allowed`` (the policy),
  ``address_not_allowed`` (the resolved-address guard) or ``bad_request``.
  Without a filter nothing changes.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import h11

from sandhold.net._conn import RECV_SIZE, answer_and_close, peer_of
from sandhold.net.errors import BadRequest, DialFailed, Refused
from sandhold.net.httphead import (
    CONNECT_ESTABLISHED,
    RequestHeadParser,
    edit_head,
    render_answer,
)
from sandhold.net.outbound import target_text
from sandhold.net.relay import abort
from sandhold.net.request_filter import DENY_HEADER, FilterDeny, FilterInput
from sandhold.policy.domains import Decision

TYPE_CHECKING = False  # typing costs start-up time; mypy honours this name
if TYPE_CHECKING:
    from sandhold.net._conn import Limits
    from sandhold.net.httphead import ProxyRequest
    from sandhold.net.outbound import Dialer
    from sandhold.net.relay import Relayer
    from sandhold.net.request_filter import FilterAllow, RequestFilter

log = logging.getLogger("sandhold.net")


async def serve_http_client(
    conn: socket.socket,
    dialer: Dialer,
    relayer: Relayer,
    limits: Limits,
    *,
    request_filter: RequestFilter | None = None,
) -> None:
    """Serve one accepted client connection to its end (module rules); owns ``conn``.

    Never raises for anything the client, the target or the filter does.

    Cancellation: the client socket and any upstream socket are aborted (RST)
    or closed, and ``CancelledError`` is re-raised.
    """
    loop = asyncio.get_running_loop()
    client: socket.socket | None = conn
    peer = peer_of(conn)
    upstream: socket.socket | None = None
    try:
        parser = RequestHeadParser(limits.max_head_bytes)
        filtered = request_filter is not None
        try:
            request = await _read_head(loop, conn, parser, limits.head_timeout)
        except BadRequest as exc:
            client = None
            answer = _bad_request_answer(exc, filtered)
            await answer_and_close(conn, answer, limits.answer_timeout)
            return
        if request is None:
            return  # closed (or reset) before sending a byte
        head, after_head = request.forward_head, parser.trailing_data
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
                client = None
                await answer_and_close(conn, answer, limits.answer_timeout)
                return
            head, after_head = outcome
        try:
            upstream = await dialer.dial(request.host, request.port, "http", client=peer)
        except Refused as exc:
            client = None
            answer = _refused_answer(exc.decision, filtered)
            await answer_and_close(conn, answer, limits.answer_timeout)
            return
        except DialFailed as exc:
            client = None
            await answer_and_close(conn, _unreachable_answer(exc), limits.answer_timeout)
            return
        if request.is_connect:
            try:
                await loop.sock_sendall(conn, CONNECT_ESTABLISHED)
            except OSError:
                return  # the client left; both sockets are closed below
            to_upstream = after_head
        else:
            to_upstream = head + after_head
        client, pair = None, upstream
        upstream = None
        result = await relayer.relay(conn, pair, first_a_to_b=to_upstream)
        if result.error is not None:
            log.debug(
                "http proxy: %s %s:%s cut: %s",
                request.method,
                request.host,
                request.port,
                result.error,
            )
    finally:
        if upstream is not None:
            abort(upstream)
        if client is not None:
            abort(client)


async def _read_head(
    loop: asyncio.AbstractEventLoop,
    conn: socket.socket,
    parser: RequestHeadParser,
    timeout: float,
) -> ProxyRequest | None:
    """The request head, or ``None`` if the client left without sending a byte.

    Raises:
        BadRequest: from the parser, or 408 when ``timeout`` passes first.
    """
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
) -> FilterDeny | tuple[bytes, bytes]:
    """The filter's refusal, or the head and the bytes after it to forward.

    Raises:
        Refused: the policy refused the target (reported by the dialer).
        BadRequest: the client's body is malformed or too slow.
    """
    decision = dialer.check(request.host, request.port, "http", client=peer)
    headers = tuple(
        (n.decode("latin-1"), v.decode("utf-8", "surrogateescape")) for n, v in parser.raw_headers
    )
    body = _Body(conn, request, headers, parser.trailing_data, limits.body_timeout)
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
            False, decision.host, decision.port, f"request filter: {outcome.code}", outcome.reason
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
    return head, body.consumed


class _Body:
    """The ``BodyReader`` of one forwarded request: decodes with h11, keeps the raw bytes.

    A chunked body read whole is forwarded as the filter saw it: one chunk of the
    decoded bytes. Chunk extensions (``5;x=...``) would otherwise reach the origin
    unseen; trailers, which the filter cannot see either, are refused (400).
    """

    def __init__(
        self,
        conn: socket.socket,
        request: ProxyRequest,
        headers: tuple[tuple[str, str], ...],
        first: bytes,
        timeout: float,
    ) -> None:
        self._conn = conn
        self._request = request
        self._timeout = timeout
        self._raw = bytearray(first)
        names = {n.lower(): v for n, v in headers}
        length = names.get("content-length")
        chunked = "transfer-encoding" in names
        self.length: int | None = None
        if not request.is_connect and length is not None and length.strip().isdigit():
            self.length = int(length.strip())
        self.has_body = not request.is_connect and (chunked or bool(self.length))
        self._chunked = chunked
        self._continue = names.get("expect", "").strip().lower() == "100-continue"
        self._read = False
        self._forward: bytes | None = None  # set when the body was read whole

    @property
    def consumed(self) -> bytes:
        """The bytes to forward after the head: as the client sent them, or a chunked
        body read whole re-encoded as the filter saw it (then what followed it)."""
        return bytes(self._raw) if self._forward is None else self._forward

    async def read(self, limit: int) -> tuple[bytes, bool]:
        if not self.has_body:
            return b"", False
        if self._read:
            raise RuntimeError("the body was read already")
        self._read = True
        loop = asyncio.get_running_loop()
        if self._continue and not self._raw:
            # the client waits for a 100 before it sends the body the decider asked
            # to see; the origin's own 100, if it sends one later, is one more 1xx
            await loop.sock_sendall(self._conn, b"HTTP/1.1 100 Continue\r\n\r\n")
        decoder = h11.Connection(h11.SERVER)
        decoder.receive_data(self._request.forward_head)
        decoder.next_event()  # the Request itself
        if self._raw:  # h11 reads receive_data(b"") as the peer's end of stream
            decoder.receive_data(bytes(self._raw))
        data = bytearray()
        cap = 2 * limit + RECV_SIZE * 4  # raw bytes (chunk framing included) held at most
        try:
            async with asyncio.timeout(self._timeout):
                while True:
                    event = decoder.next_event()
                    if isinstance(event, h11.Data):
                        data += event.data
                        if len(data) > limit:
                            return bytes(data[:limit]), True
                    elif isinstance(event, h11.EndOfMessage):
                        if event.headers:
                            raise BadRequest(
                                400, "request trailers are not forwarded once the body is read"
                            )
                        if self._chunked:
                            size = b"%x\r\n" % len(data) + bytes(data) + b"\r\n" if data else b""
                            self._forward = size + b"0\r\n\r\n" + decoder.trailing_data[0]
                        return bytes(data), False
                    elif event is h11.NEED_DATA:
                        if len(self._raw) > cap:  # framing, not body: no honest "cut"
                            raise BadRequest(400, "the chunked body's framing is too large")
                        chunk = await loop.sock_recv(self._conn, RECV_SIZE)
                        self._raw += chunk
                        decoder.receive_data(chunk)
                    else:
                        raise BadRequest(400, "the request body is malformed")
        except h11.RemoteProtocolError as exc:
            raise BadRequest(400, f"the request body is malformed: {exc}") from None
        except TimeoutError:
            raise BadRequest(
                408, f"the request body did not arrive within {self._timeout:g} s"
            ) from None
        except OSError:
            raise BadRequest(400, "the client left while sending the body") from None


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
        guarded = decision.rule.startswith("resolved address guard")
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
