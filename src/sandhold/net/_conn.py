"""Socket plumbing shared by the two proxies: limits, reading with a deadline, closing politely.

Rules:
- Every wait on a client is bounded by a deadline from ``Limits``, and every
  read by ``RECV_SIZE``, so a slow or hostile client costs bounded time and
  memory.
- An answer is sent, our side shut down, and what the client still sends is
  read and dropped (bounded) before closing: closing a socket with unread input
  sends RST, which can destroy the answer before the client has read it.
"""

from __future__ import annotations

import asyncio
import socket

from sandhold._record import record

RECV_SIZE = 16 * 1024
_DRAIN_LIMIT = 256 * 1024


@record
class Limits:
    """Deadlines and sizes for one session's proxies (seconds, bytes)."""

    head_timeout: float = 10.0  # whole request head / SOCKS handshake (slowloris)
    answer_timeout: float = 2.0  # sending an error answer and draining before close
    max_head_bytes: int = 64 * 1024
    body_timeout: float = 60.0  # a request body a filter asked to see (request_filter)


def peer_of(conn: socket.socket) -> tuple[str, int]:
    """The client's address (host, port), or ("", 0) if the socket is already gone."""
    try:
        peer = conn.getpeername()
    except OSError:
        return ("", 0)
    return (str(peer[0]), int(peer[1]))


async def answer_and_close(conn: socket.socket, answer: bytes, timeout: float) -> None:
    """Send ``answer`` (may be empty), shut down our side, drain the client a little, close.

    Never raises for the client's behaviour: a client that does not read or
    keeps sending is cut off at ``timeout`` seconds or after 256 KiB.

    Cancellation: the socket is closed and ``CancelledError`` re-raised.
    """
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            if answer:
                await loop.sock_sendall(conn, answer)
            conn.shutdown(socket.SHUT_WR)
            drained = 0
            while drained < _DRAIN_LIMIT:
                data = await loop.sock_recv(conn, RECV_SIZE)
                if not data:
                    break
                drained += len(data)
    except (TimeoutError, OSError):
        pass  # the client is gone or unresponsive; the answer was best effort
    finally:
        conn.close()
