"""The byte-exact relay: order, half-close, closing after the flush, resets, backpressure, cancel.

Each test runs on both paths: ``splice`` (Linux, through pipes) and ``copy``
(one shared buffer, as on macOS). The peers are real TCP sockets on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import socket
import struct
import tracemalloc

import pytest

from sandhold.net.relay import SPLICE_AVAILABLE, Relayer, RelayResult
from test_net_support import fd_count

PATHS = [
    pytest.param(
        True, id="splice", marks=pytest.mark.skipif(not SPLICE_AVAILABLE, reason="no splice")
    ),
    pytest.param(False, id="copy"),
]


async def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two connected, non-blocking TCP sockets on loopback."""
    loop = asyncio.get_running_loop()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        client = socket.socket()
        client.setblocking(False)
        accept = loop.create_task(loop.sock_accept(listener))
        await loop.sock_connect(client, listener.getsockname())
        server, _ = await accept
    server.setblocking(False)
    return client, server


async def relayed() -> tuple[socket.socket, socket.socket, socket.socket, socket.socket]:
    """``(client, a, b, upstream)``: relay a<->b to join client and upstream."""
    client, a = await tcp_pair()
    b, upstream = await tcp_pair()
    return client, a, b, upstream


async def send_all_then_eof(sock: socket.socket, data: bytes, pieces: int = 1) -> None:
    loop = asyncio.get_running_loop()
    rng = random.Random(len(data))
    cuts = sorted(rng.randrange(len(data) + 1) for _ in range(pieces - 1))
    start = 0
    for end in [*cuts, len(data)]:
        await loop.sock_sendall(sock, data[start:end])
        start = end
    sock.shutdown(socket.SHUT_WR)


async def read_to_eof(sock: socket.socket, delay_every: int = 0) -> bytes:
    loop = asyncio.get_running_loop()
    out = bytearray()
    reads = 0
    while True:
        data = await loop.sock_recv(sock, 1 << 16)
        if not data:
            return bytes(out)
        out += data
        reads += 1
        if delay_every and reads % delay_every == 0:
            await asyncio.sleep(0.001)  # a slow reader: the relay must wait, not drop


@pytest.mark.parametrize("splice", PATHS)
def test_both_directions_at_once_arrive_whole_and_in_order(splice: bool) -> None:
    async def scenario() -> RelayResult:
        client, a, b, upstream = await relayed()
        relayer = Relayer(splice=splice)
        down, up = os.urandom(24 << 20), os.urandom(9 << 20)
        task = asyncio.create_task(relayer.relay(a, b))
        got_up, got_down, *_ = await asyncio.gather(
            read_to_eof(upstream),
            read_to_eof(client, delay_every=50),
            send_all_then_eof(client, up, pieces=40),
            send_all_then_eof(upstream, down, pieces=40),
        )
        assert hashlib.sha256(got_up).digest() == hashlib.sha256(up).digest()
        assert hashlib.sha256(got_down).digest() == hashlib.sha256(down).digest()
        result = await task
        client.close()
        upstream.close()
        relayer.close()
        return result

    result = asyncio.run(scenario())
    assert result == RelayResult(9 << 20, 24 << 20, None)


async def send_then_close(upstream: socket.socket, blob: bytes) -> None:
    await asyncio.get_running_loop().sock_sendall(upstream, blob)
    upstream.close()  # FIN right after the last byte, the tail still in flight


async def read_late(client: socket.socket) -> bytes:
    await asyncio.sleep(0.01)  # the client starts reading after the upstream
    return await read_to_eof(client, delay_every=20)


@pytest.mark.parametrize("splice", PATHS)
def test_the_tail_arrives_when_the_upstream_closes_right_after_sending(splice: bool) -> None:
    """The reference system's bug: upstream closes first, the slow client loses the tail."""

    async def scenario() -> None:
        relayer = Relayer(splice=splice)
        for _ in range(5):
            client, a, b, upstream = await relayed()
            blob = os.urandom(8 << 20)
            task = asyncio.create_task(relayer.relay(a, b))

            # Concurrently: 8 MiB need not fit in the socket buffers, so a sender that
            # had to finish before the client reads could wait for ever.
            _, got = await asyncio.gather(send_then_close(upstream, blob), read_late(client))
            assert len(got) == len(blob) and got == blob
            client.close()  # the client's EOF lets the relay finish
            result = await task
            assert result.error is None and result.b_to_a == len(blob)
        relayer.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("splice", PATHS)
def test_half_close_one_way_while_the_other_keeps_going(splice: bool) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        client, a, b, upstream = await relayed()
        relayer = Relayer(splice=splice)
        task = asyncio.create_task(relayer.relay(a, b))
        await loop.sock_sendall(client, b"request")
        client.shutdown(socket.SHUT_WR)
        assert await read_to_eof(upstream) == b"request"  # the EOF came through
        for i in range(100):  # and the other way still works
            await loop.sock_sendall(upstream, b"%d," % i)
        upstream.shutdown(socket.SHUT_WR)
        assert await read_to_eof(client) == b"".join(b"%d," % i for i in range(100))
        assert (await task).error is None
        assert a.fileno() == -1 and b.fileno() == -1
        client.close()
        upstream.close()
        relayer.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("splice", PATHS)
def test_first_bytes_go_before_anything_else(splice: bool) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        client, a, b, upstream = await relayed()
        relayer = Relayer(splice=splice)
        task = asyncio.create_task(
            relayer.relay(a, b, first_a_to_b=b"HEAD" * 100000, first_b_to_a=b"HELLO")
        )
        await loop.sock_sendall(client, b"body")
        client.shutdown(socket.SHUT_WR)
        upstream.shutdown(socket.SHUT_WR)
        assert await read_to_eof(upstream) == b"HEAD" * 100000 + b"body"
        assert await read_to_eof(client) == b"HELLO"
        await task
        client.close()
        upstream.close()
        relayer.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("splice", PATHS)
def test_a_reset_upstream_is_passed_on_as_a_reset(splice: bool) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        client, a, b, upstream = await relayed()
        relayer = Relayer(splice=splice)
        task = asyncio.create_task(relayer.relay(a, b))
        await loop.sock_sendall(client, b"x")
        assert await loop.sock_recv(upstream, 1) == b"x"
        upstream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        upstream.close()  # RST
        result = await task
        assert isinstance(result.error, OSError)
        with pytest.raises(ConnectionResetError):  # never a clean end for the client
            await read_to_eof(client)
        client.close()
        relayer.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("splice", PATHS)
def test_a_client_that_does_not_read_holds_back_the_sender(splice: bool) -> None:
    """Backpressure: the relay takes at most a chunk more than the socket buffers hold."""

    async def scenario() -> None:
        client, a, b, upstream = await relayed()
        relayer = Relayer(splice=splice)
        tracemalloc.start()
        task = asyncio.create_task(relayer.relay(a, b))
        chunk = b"z" * (1 << 20)
        sent = 0
        for _ in range(256):  # try to push 256 MiB at a client that never reads
            try:
                sent += upstream.send(chunk)
            except BlockingIOError:
                await asyncio.sleep(0.02)
                try:
                    sent += upstream.send(chunk)
                except BlockingIOError:
                    break
        await asyncio.sleep(0.1)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert sent < 64 << 20, sent  # kernel buffers on two hops, plus one chunk
        assert peak < 4 << 20, peak  # the relay itself held at most a chunk or so
        upstream.shutdown(socket.SHUT_WR)
        got = await read_to_eof(client)
        assert len(got) == sent
        client.close()
        await task
        upstream.close()
        relayer.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("splice", PATHS)
def test_cancelling_a_relay_resets_both_peers_and_leaks_nothing(splice: bool) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        client, a, b, upstream = await relayed()
        relayer = Relayer(splice=splice)
        task = asyncio.create_task(relayer.relay(a, b))
        await loop.sock_sendall(upstream, b"y" * (4 << 20))  # some of it is in flight
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for peer in (client, upstream):
            with pytest.raises(ConnectionResetError):
                await read_to_eof(peer)
            peer.close()
        relayer.close()

    before = fd_count()
    asyncio.run(scenario())
    assert fd_count() == before


@pytest.mark.parametrize("splice", PATHS)
def test_many_small_writes_keep_their_order(splice: bool) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        client, a, b, upstream = await relayed()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        relayer = Relayer(splice=splice)
        task = asyncio.create_task(relayer.relay(a, b))
        expected = b"".join(struct.pack(">I", i) for i in range(20000))
        for i in range(0, len(expected), 4 * 97):
            await loop.sock_sendall(client, expected[i : i + 4 * 97])
        client.shutdown(socket.SHUT_WR)
        assert await read_to_eof(upstream) == expected
        upstream.close()
        await read_to_eof(client)
        client.close()
        await task
        relayer.close()

    asyncio.run(scenario())


def test_splice_refused_where_missing() -> None:
    if SPLICE_AVAILABLE:
        assert Relayer().splice is True
    else:
        with pytest.raises(ValueError):
            Relayer(splice=True)


@pytest.mark.parametrize("splice", PATHS)
def test_a_half_closed_tunnel_whose_other_side_is_silent_is_cut(splice: bool) -> None:
    """The client has gone (EOF) and the upstream never answers nor closes: the relay
    does not hold its two fds for ever, and neither peer sees a clean end."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        client, a, b, upstream = await relayed()
        relayer = Relayer(splice=splice, half_closed_timeout=0.3)
        task = asyncio.create_task(relayer.relay(a, b))
        client.shutdown(socket.SHUT_WR)
        assert await read_to_eof(upstream) == b""  # the EOF came through; then silence
        started = loop.time()
        result = await asyncio.wait_for(task, 5)
        assert 0.25 < loop.time() - started < 2
        assert isinstance(result.error, TimeoutError)
        assert a.fileno() == -1 and b.fileno() == -1
        with pytest.raises(ConnectionResetError):
            await read_to_eof(client)
        client.close()
        upstream.close()
        relayer.close()

    before = fd_count()
    asyncio.run(scenario())
    assert fd_count() == before


@pytest.mark.parametrize("splice", PATHS)
def test_a_half_closed_tunnel_that_keeps_moving_is_not_cut(splice: bool) -> None:
    """Only idleness ends a half-closed tunnel: a slow answer after the client's EOF
    (``nc -N``, a request then the response) carries on past the timeout."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        client, a, b, upstream = await relayed()
        relayer = Relayer(splice=splice, half_closed_timeout=0.3)
        task = asyncio.create_task(relayer.relay(a, b))
        client.shutdown(socket.SHUT_WR)
        assert await read_to_eof(upstream) == b""
        for i in range(8):  # 1.2 s in all, never 0.3 s quiet
            await loop.sock_sendall(upstream, b"%d," % i)
            await asyncio.sleep(0.15)
        upstream.shutdown(socket.SHUT_WR)
        assert await read_to_eof(client) == b"".join(b"%d," % i for i in range(8))
        assert (await task).error is None
        client.close()
        upstream.close()
        relayer.close()

    asyncio.run(scenario())
