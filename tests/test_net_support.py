"""Shared pieces of the egress proxy tests: a proxy on its own loop, upstream servers, raw clients.

Everything is real: sockets on 127.0.0.1, servers in threads, clients that speak
the protocols byte by byte. Test names reach the upstreams through the proxy's
injected resolver (``Proxy.names``), never through the host's DNS. This module
holds no tests itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandhold.net.egress import EgressSession
from sandhold.net.outbound import EgressDecision
from sandhold.policy.domains import DomainPolicy

TEST_NAMES = ("allowed.test", "www.allowed.test", "other.test", "rebind.test")


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


# --- the proxy under test -------------------------------------------------------------


class Proxy:
    """An ``EgressSession`` on a private event loop in a thread; the test thread is the client.

    ``policy`` may be reassigned at any time (it is read per connection);
    ``names`` maps test host names to addresses for the resolver; ``resolved``
    lists every name the resolver was asked for; ``decisions`` every record.
    """

    def __init__(
        self,
        policy: DomainPolicy,
        names: dict[str, list[str]] | None = None,
        *,
        discover: bool = False,
        **session_kwargs: Any,
    ) -> None:
        self.policy = policy
        self.names = dict(names or {})
        self.resolved: list[str] = []
        self.decisions: list[EgressDecision] = []
        self.kwargs = {"resolver": self._resolve, **session_kwargs}
        if not discover:  # the host's own addresses are found by the session itself
            self.kwargs.setdefault("host_addresses", ())
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.http_listener = socket.create_server(("127.0.0.1", 0))
        self.socks_listener = socket.create_server(("127.0.0.1", 0))
        self.http_port = self.http_listener.getsockname()[1]
        self.socks_port = self.socks_listener.getsockname()[1]
        self.session: EgressSession | None = None

    def __enter__(self) -> Proxy:
        self.thread.start()
        self.session = EgressSession(
            http_listener=self.http_listener,
            socks_listener=self.socks_listener,
            policy=lambda: self.policy,
            on_decision=self.decisions.append,
            **self.kwargs,
        )
        self.call(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.session is not None:
            self.call(self.session.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _start(self) -> None:
        assert self.session is not None
        self.session.start()

    def call(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _resolve(self, host: str, port: int) -> list[str]:
        self.resolved.append(host)
        if host in self.names:
            return list(self.names[host])
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


# --- upstream servers -----------------------------------------------------------------


class EchoHandler(http.server.BaseHTTPRequestHandler):
    """Answers every request with JSON describing what it received."""

    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        info = {
            "method": self.command,
            "path": self.path,
            "version": self.request_version,
            "headers": [[k, v] for k, v in self.headers.items()],
            "body": body.decode("latin-1"),
        }
        data = json.dumps(info).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_HEAD = _answer

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def http_upstream(tls: ssl.SSLContext | None = None) -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EchoHandler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


class TcpUpstream:
    """A raw TCP server: each connection is handed to ``handler(conn)`` in a thread."""

    def __init__(self, handler: Callable[[socket.socket], None]) -> None:
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> TcpUpstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._thread.join(5)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        with conn:
            try:
                self.handler(conn)
            except OSError:
                pass


def echo_then_bye(conn: socket.socket) -> None:
    """Echo until the client's EOF, then send ``bye`` and close (checks half-close)."""
    while data := conn.recv(65536):
        conn.sendall(data)
    conn.sendall(b"bye")
    conn.shutdown(socket.SHUT_WR)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for the test names, made with the openssl CLI."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    san = ",".join(f"DNS:{n}" for n in TEST_NAMES)
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "2", "-subj", "/CN=allowed.test", "-addext",
            f"subjectAltName={san}", "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def server_context(tls_files: tuple[Path, Path]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*tls_files)
    return ctx


def client_context(tls_files: tuple[Path, Path]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(tls_files[0]))


# --- raw clients ----------------------------------------------------------------------


def recv_all(sock: socket.socket, limit: int = 1 << 24) -> bytes:
    out = bytearray()
    while len(out) < limit:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        out += data
    return bytes(out)


def split_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/") else 0
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def http_exchange(port: int, raw: bytes, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """Send ``raw`` to the HTTP proxy and read the whole answer (the proxy closes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(raw)
        return split_response(recv_all(s))


def read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(1)
        if not chunk:
            break
        data += chunk
    return data


def http_connect(port: int, target: str, timeout: float = 10) -> tuple[socket.socket, int, bytes]:
    """CONNECT through the HTTP proxy; returns the socket (after the head), status and head."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    host = target.encode("utf-8", "surrogateescape")
    s.sendall(b"CONNECT " + host + b" HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
    head = read_head(s)
    status, _, _ = split_response(head)
    return s, status, head


def socks_connect(
    port: int, host: str | bytes, dport: int, atyp: int | None = None, timeout: float = 10
) -> tuple[socket.socket, int]:
    """A SOCKS5 CONNECT by hand; returns the socket (after the reply) and the reply code."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(b"\x05\x01\x00")
    assert s.recv(2) == b"\x05\x00"
    if atyp is None:
        atyp = 3
    if atyp == 1:
        addr = socket.inet_pton(socket.AF_INET, str(host))
    elif atyp == 4:
        addr = socket.inet_pton(socket.AF_INET6, str(host))
    else:
        name = host if isinstance(host, bytes) else host.encode("utf-8")
        addr = bytes([len(name)]) + name
    s.sendall(bytes([5, 1, 0, atyp]) + addr + dport.to_bytes(2, "big"))
    reply = b""
    while len(reply) < 10:
        chunk = s.recv(10 - len(reply))
        if not chunk:
            break
        reply += chunk
    code = reply[1] if len(reply) >= 2 else -1
    return s, code


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
