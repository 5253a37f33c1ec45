"""Local upstreams for egress tests: test names in the host's /etc/hosts, an echo server.

``mapped_names(names, mark)`` maps each name to 127.0.0.1 in /etc/hosts (only
lines carrying ``mark``, removed again after), which the proxies' resolver
reads; ``echo_server()`` is a threaded HTTP server on 127.0.0.1 that answers
``hello from <Host>`` (``/slow`` after 20 s), and records each Host in
``EchoHandler.hits``; ``banner_server(handler)`` is an sshd-like TCP service
(``BannerHandler``: a banner, then the client's first bytes recorded and echoed).
Names that resolve to loopback pass the resolved-address guard only where
``127.0.0.1`` is itself allowed.
"""

from __future__ import annotations

import contextlib
import http.server
import socketserver
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import ClassVar

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


@contextlib.contextmanager
def mapped_names(names: Iterable[str], mark: str) -> Iterator[None]:
    hosts = Path("/etc/hosts")

    def without_ours() -> str:
        text = "".join(line for line in hosts.read_text().splitlines(True) if mark not in line)
        return text if text.endswith("\n") else text + "\n"

    hosts.write_text(without_ours() + "".join(f"127.0.0.1 {n} {mark}\n" for n in names))
    try:
        yield
    finally:
        hosts.write_text(without_ours())


class EchoHandler(http.server.BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []  # the Host of every request served, in order

    def do_GET(self) -> None:
        EchoHandler.hits.append(self.headers.get("Host", "?"))
        if self.path == "/slow":
            time.sleep(20)  # a request still in flight when its sandbox is destroyed
        body = f"hello from {self.headers.get('Host', '?')}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _serving(server: socketserver.TCPServer) -> Iterator[int]:
    """Serve on a thread; yield the port; shut down after."""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def echo_server() -> contextlib.AbstractContextManager[int]:
    return _serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), EchoHandler))


class BannerHandler(socketserver.BaseRequestHandler):
    """An sshd-like TCP service: a banner, then the client's first bytes, recorded
    (``record``; by default in ``firsts``) and echoed."""

    banner: ClassVar[bytes] = b"SSH-2.0-sandholdtest\r\n"
    firsts: ClassVar[list[str]] = []  # the first 40 bytes of every connection, in order

    def record(self, first: str) -> None:
        BannerHandler.firsts.append(first)

    def handle(self) -> None:
        self.request.settimeout(5)
        self.request.sendall(self.banner)
        try:
            data = self.request.recv(4096)
        except OSError:
            data = b""
        self.record(data[:40].decode("latin-1"))
        if data:
            with contextlib.suppress(OSError):  # a client that gave up (ssh on our banner)
                self.request.sendall(data)


def banner_server(
    handler: Callable[..., socketserver.BaseRequestHandler] = BannerHandler,
) -> contextlib.AbstractContextManager[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    return _serving(server)
