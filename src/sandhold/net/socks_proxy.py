"""The SOCKS5 proxy: serve one client connection, a CONNECT handshake and then a tunnel.

Rules:
- Per connection: the handshake (``socks5``) must complete within
  ``head_timeout``; the ``Dialer`` opens the target (policy, resolution, address
  guard, dial); the reply is sent; then bytes are relayed both ways until both
  sides are done.
- Answers (F-NET-4), each followed by closing the connection: refused by the
  policy → reply 0x02 ("connection not allowed by ruleset"); did not resolve or
  host unreachable → 0x04; connection refused → 0x05; network unreachable →
  0x03; timed out → 0x04; a bad greeting → ``05 FF``; a bad request → its code
  (0x01, 0x07, 0x08); a handshake past its deadline → the same as a bad one.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from sandhold.net import socks5
from sandhold.net._conn import RECV_SIZE, answer_and_close, peer_of
from sandhold.net.errors import DialFailed, Refused, SocksError
from sandhold.net.relay import abort

TYPE_CHECKING = False  # typing costs start-up time; mypy honours this name
if TYPE_CHECKING:
    from sandhold.net._conn import Limits
    from sandhold.net.outbound import Dialer
    from sandhold.net.relay import Relayer

log = logging.getLogger("sandhold.net")

_DIAL_REPLY = {
    "resolve": socks5.HOST_UNREACHABLE,
    "unreachable": socks5.HOST_UNREACHABLE,
    "timeout": socks5.HOST_UNREACHABLE,
    "refused": socks5.CONNECTION_REFUSED,
    "network": socks5.NETWORK_UNREACHABLE,
}


async def serve_socks_client(
    conn: socket.socket, dialer: Dialer, relayer: Relayer, limits: Limits
) -> None:
    """Serve one accepted client connection to its end (module rules); owns ``conn``.

    Never raises for anything the client or the target does.

    Cancellation: the client socket and any upstream socket are aborted (RST)
    or closed, and ``CancelledError`` is re-raised.
    """
    loop = asyncio.get_running_loop()
    machine = socks5.Socks5Server()
    client: socket.socket | None = conn
    peer = peer_of(conn)
    upstream: socket.socket | None = None
    try:
        try:
            request = await _handshake(loop, conn, machine, limits.head_timeout)
        except SocksError as exc:
            client = None
            await answer_and_close(conn, exc.reply, limits.answer_timeout)
            return
        if request is None:
            return  # closed (or reset) before sending a byte
        try:
            upstream = await dialer.dial(request.host, request.port, "socks5", client=peer)
        except Refused:
            client = None
            reply = machine.reply(socks5.NOT_ALLOWED)
            await answer_and_close(conn, reply, limits.answer_timeout)
            return
        except DialFailed as exc:
            client = None
            reply = machine.reply(_DIAL_REPLY.get(exc.kind, socks5.GENERAL_FAILURE))
            await answer_and_close(conn, reply, limits.answer_timeout)
            return
        try:
            await loop.sock_sendall(conn, machine.reply(socks5.SUCCEEDED))
        except OSError:
            return  # the client left; both sockets are closed below
        client, pair = None, upstream
        upstream = None
        result = await relayer.relay(conn, pair, first_a_to_b=machine.trailing_data)
        if result.error is not None:
            log.debug("socks5 proxy: %s:%s cut: %s", request.host, request.port, result.error)
    finally:
        if upstream is not None:
            abort(upstream)
        if client is not None:
            abort(client)


async def _handshake(
    loop: asyncio.AbstractEventLoop,
    conn: socket.socket,
    machine: socks5.Socks5Server,
    timeout: float,
) -> socks5.ConnectRequest | None:
    """The client's CONNECT request, or ``None`` if it left without sending a byte.

    Raises:
        SocksError: from the machine, or when ``timeout`` passes first.
    """
    received = 0
    try:
        async with asyncio.timeout(timeout):
            while True:
                event = machine.next_event()
                if isinstance(event, socks5.Greeting):
                    await loop.sock_sendall(conn, socks5.METHOD_NO_AUTH)
                    continue
                if isinstance(event, socks5.ConnectRequest):
                    return event
                data = await loop.sock_recv(conn, RECV_SIZE)
                if not data and received == 0:
                    return None
                received += len(data)
                machine.receive_data(data)
    except TimeoutError:
        raise machine.fail(f"the SOCKS5 handshake did not complete within {timeout:g} s") from None
    except ConnectionError:
        return None  # reset by the client: nobody to answer
