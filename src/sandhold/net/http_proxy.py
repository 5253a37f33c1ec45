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
"""

from __future__ import annotations

import asyncio
import logging
import socket

from sandhold.net._conn import RECV_SIZE, answer_and_close
from sandhold.net.errors import BadRequest, DialFailed, Refused
from sandhold.net.httphead import CONNECT_ESTABLISHED, RequestHeadParser, render_answer
from sandhold.net.outbound import target_text
from sandhold.net.relay import abort

TYPE_CHECKING = False  # typing costs start-up time; mypy honours this name
if TYPE_CHECKING:
    from sandhold.net._conn import Limits
    from sandhold.net.httphead import ProxyRequest
    from sandhold.net.outbound import Dialer
    from sandhold.net.relay import Relayer
    from sandhold.policy.domains import Decision

log = logging.getLogger("sandhold.net")


async def serve_http_client(
    conn: socket.socket, dialer: Dialer, relayer: Relayer, limits: Limits
) -> None:
    """Serve one accepted client connection to its end (module rules); owns ``conn``.

    Never raises for anything the client or the target does.

    Cancellation: the client socket and any upstream socket are aborted (RST)
    or closed, and ``CancelledError`` is re-raised.
    """
    loop = asyncio.get_running_loop()
    client: socket.socket | None = conn
    upstream: socket.socket | None = None
    try:
        parser = RequestHeadParser(limits.max_head_bytes)
        try:
            request = await _read_head(loop, conn, parser, limits.head_timeout)
        except BadRequest as exc:
            client = None
            await answer_and_close(conn, _bad_request_answer(exc), limits.answer_timeout)
            return
        if request is None:
            return  # closed (or reset) before sending a byte
        try:
            upstream = await dialer.dial(request.host, request.port, "http")
        except Refused as exc:
            client = None
            await answer_and_close(conn, _refused_answer(exc.decision), limits.answer_timeout)
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
            to_upstream = parser.trailing_data
        else:
            to_upstream = request.forward_head + parser.trailing_data
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


def _refused_answer(decision: Decision) -> bytes:
    target = target_text(decision.host, decision.port)
    body = (
        f"sandhold: the sandbox network policy refused the connection to {target}.\n"
        f"rule: {decision.rule}\nreason: {decision.reason}"
    )
    header = f"blocked-by-sandbox-policy; host={target}; rule={decision.rule}"
    return render_answer(403, body, [("X-Proxy-Error", header)])


def _unreachable_answer(exc: DialFailed) -> bytes:
    body = f"sandhold: {exc.target} is allowed but could not be reached ({exc.kind}).\n{exc.reason}"
    header = f"upstream-unreachable; host={exc.target}; reason={exc.reason}"
    return render_answer(502, body, [("X-Proxy-Error", header)])


def _bad_request_answer(exc: BadRequest) -> bytes:
    body = f"sandhold: the proxy cannot serve this request: {exc.reason}"
    return render_answer(exc.status, body, [("X-Proxy-Error", f"bad-request; reason={exc.reason}")])
