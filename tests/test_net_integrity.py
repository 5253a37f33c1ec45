"""End to end, byte for byte: 100 downloads of 32 MiB through CONNECT, plain HTTP and SOCKS5.

The upstreams close right after the last byte, the situation in which the
reference proxy loses the tail of a download. Three processes, as in
production: the upstream servers, the proxy (an ``EgressSession`` accepting on
listeners this test creates and hands over as file descriptors, the way the
sandbox's namespace helper does; run as root and as an unprivileged user) and
the clients (this test, in threads). Every download's length and sha256 must match.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import Identity

# eight times the relay's largest pipe: every download spans many relay rounds
BLOB_SIZE = 8 * 1024 * 1024
DOWNLOADS = 100
BATCH = 8

UPSTREAM_MAIN = r"""
import hashlib, os, socket, sys, threading
size = int(sys.argv[1])
blob = memoryview(os.urandom(size))
raw = socket.create_server(("127.0.0.1", 0), backlog=128)
http = socket.create_server(("127.0.0.1", 0), backlog=128)
head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size

def send_blob(conn):
    with conn:
        conn.sendall(blob)  # and close at once: FIN right after the last byte

def serve_http(conn):
    with conn:
        seen = b""
        while b"\r\n\r\n" not in seen:
            data = conn.recv(65536)
            if not data:
                return
            seen += data
        conn.sendall(head)
        conn.sendall(blob)

def loop(listener, handler):
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handler, args=(conn,), daemon=True).start()

threading.Thread(target=loop, args=(raw, send_blob), daemon=True).start()
threading.Thread(target=loop, args=(http, serve_http), daemon=True).start()
print(raw.getsockname()[1], http.getsockname()[1], hashlib.sha256(blob).hexdigest(), flush=True)
sys.stdin.read()
"""

PROXY_MAIN = r"""
import asyncio, os, socket, sys
from sandhold.net.egress import EgressSession
from sandhold.policy.domains import DomainPolicy

http_fd, socks_fd = int(sys.argv[1]), int(sys.argv[2])

async def resolver(host, port):
    if host == "blob.test":
        return ["127.0.0.1"]
    raise socket.gaierror(socket.EAI_NONAME, "unknown")

async def main():
    policy = DomainPolicy.for_cli(["blob.test", "127.0.0.1"])
    session = EgressSession(
        http_listener=socket.socket(fileno=http_fd),
        socks_listener=socket.socket(fileno=socks_fd),
        policy=lambda: policy,
        resolver=resolver,
        host_addresses=(),
    )
    async with session:
        print("ready", os.getuid(), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[int, int, str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", UPSTREAM_MAIN, str(BLOB_SIZE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    raw, http, digest = proc.stdout.readline().split()
    yield int(raw), int(http), digest
    proc.stdin.close()
    proc.wait(10)


@pytest.fixture(scope="module", params=["root", "user"])
def proxy(
    request: pytest.FixtureRequest, identities: dict[str, Identity]
) -> Iterator[tuple[int, int]]:
    """The proxy process, run as root and as an unprivileged user (pipe sizes are capped then)."""
    if os.geteuid() != 0:
        pytest.fail("run the proxy tests as root (they also run the proxy as a user)")
    ident = identities[request.param]
    http_l = socket.create_server(("127.0.0.1", 0), backlog=128)
    socks_l = socket.create_server(("127.0.0.1", 0), backlog=128)
    ports = http_l.getsockname()[1], socks_l.getsockname()[1]
    as_user = {} if ident.is_root else {"user": ident.uid, "group": ident.gid, "extra_groups": []}
    proc = subprocess.Popen(  # type: ignore[call-overload]
        [ident.python, "-c", PROXY_MAIN, str(http_l.fileno()), str(socks_l.fileno())],
        pass_fds=(http_l.fileno(), socks_l.fileno()),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={"PYTHONPATH": ident.pythonpath, "PATH": "/usr/bin:/bin"},
        cwd="/",
        text=True,
        **as_user,
    )
    http_l.close()  # the proxy process owns them now
    socks_l.close()
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().split() == ["ready", str(ident.uid)]
    yield ports
    proc.stdin.close()
    assert proc.wait(30) == 0


def _read_body(sock: socket.socket, first: bytes) -> tuple[int, str]:
    digest = hashlib.sha256(first)
    total = len(first)
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    while n := sock.recv_into(view):
        digest.update(view[:n])
        total += n
    return total, digest.hexdigest()


def _head_and_rest(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def via_connect(proxy_port: int, raw_port: int) -> tuple[int, str]:
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=60) as s:
        s.sendall(b"CONNECT blob.test:%d HTTP/1.1\r\nHost: blob.test\r\n\r\n" % raw_port)
        head, rest = _head_and_rest(s)
        assert head.startswith(b"HTTP/1.1 200"), head
        return _read_body(s, rest)


def via_http(proxy_port: int, http_port: int) -> tuple[int, str]:
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=60) as s:
        s.sendall(b"GET http://blob.test:%d/blob HTTP/1.1\r\nHost: blob.test\r\n\r\n" % http_port)
        head, rest = _head_and_rest(s)
        assert head.startswith(b"HTTP/1.1 200") and b"Content-Length: %d" % BLOB_SIZE in head
        return _read_body(s, rest)


def via_socks(proxy_port: int, raw_port: int) -> tuple[int, str]:
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=60) as s:
        s.sendall(b"\x05\x01\x00\x05\x01\x00\x03\x09blob.test" + raw_port.to_bytes(2, "big"))
        reply = b""
        while len(reply) < 12:
            reply += s.recv(12 - len(reply))
        assert reply[:4] == b"\x05\x00\x05\x00", reply
        return _read_body(s, b"")


@pytest.mark.parametrize("kind", ["connect", "http", "socks5"])
def test_hundred_large_downloads_arrive_whole(
    kind: str, upstream: tuple[int, int, str], proxy: tuple[int, int]
) -> None:
    raw_port, http_port, digest = upstream
    http_proxy, socks_proxy = proxy
    download: Callable[[], tuple[int, str]] = {
        "connect": lambda: via_connect(http_proxy, raw_port),
        "http": lambda: via_http(http_proxy, http_port),
        "socks5": lambda: via_socks(socks_proxy, raw_port),
    }[kind]
    started = time.monotonic()
    with ThreadPoolExecutor(BATCH) as pool:
        results = list(pool.map(lambda _: download(), range(DOWNLOADS)))
    short = [size for size, got in results if (size, got) != (BLOB_SIZE, digest)]
    assert short == [], f"{len(short)} of {DOWNLOADS} downloads were wrong: sizes {short[:10]}"
    assert time.monotonic() - started < 40
