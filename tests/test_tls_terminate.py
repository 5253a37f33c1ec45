"""The terminating proxy's own rules, in process, with curl and raw sockets (F-CRED-3).

Bounded tunnels, the handshake deadline, bodies (compressed, chunked, longer than the
buffer, with ``Expect: 100-continue``) and the CONNECT target deciding, not ``Host``.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandhold.net.ca import CertificateAuthority, trust_bundle, upstream_context
from sandhold.net.injection import Injector
from sandhold.net.tls_terminate import Terminator
from sandhold.policy.domains import DomainPolicy
from sandhold.policy.placeholders import Injection
from test_credentials_tls import upstreams
from test_net_support import Proxy

__all__ = ["upstreams"]  # a fixture, imported for pytest

PLACEHOLDER = "sandhold_placeholder_00112233445566778899aabbccddeeff"
REAL = "the-real-secret-value"
POLICY = DomainPolicy.for_cli(["127.0.0.1", "127.0.0.2"])


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.load_or_create(str(tmp_path / "ca"))


def _terminator(ca: CertificateAuthority, extra: str, **kw: object) -> Terminator:
    injector = Injector([Injection(PLACEHOLDER, REAL, ("127.0.0.1",), "test")])
    return Terminator(ca, injector, upstream_context=upstream_context([extra]), **kw)  # type: ignore[arg-type]


@pytest.fixture
def bundle(ca: CertificateAuthority, tmp_path: Path, upstreams: dict[str, object]) -> Iterator[str]:
    data, _ = trust_bundle(ca, [str(upstreams["ca"])])
    path = tmp_path / "bundle.pem"
    path.write_bytes(data)
    yield str(path)


def _curl(px: Proxy, bundle: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [
        "curl",
        "-sS",
        "-m",
        "10",
        "--noproxy",
        "",
        "-x",
        px.http_url,
        "--cacert",
        bundle,
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def _connect(px: Proxy, port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", px.http_port), timeout=5)
    s.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return s


def _head(s: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def _tunnel(px: Proxy, port: int, bundle: str) -> ssl.SSLSocket:
    """A CONNECT answered 200, then TLS with the proxy's leaf."""
    s = _connect(px, port)
    assert _head(s).startswith(b"HTTP/1.1 200")
    return ssl.create_default_context(cafile=bundle).wrap_socket(s, server_hostname="127.0.0.1")


def test_tunnels_are_bounded_and_slots_come_back(
    ca: CertificateAuthority, upstreams: dict[str, object], bundle: str
) -> None:
    port = upstreams["ports"]["tls1"]  # type: ignore[index]
    term = _terminator(ca, str(upstreams["ca"]), max_tunnels=1)
    with Proxy(POLICY, terminator=term) as px:
        tls = _tunnel(px, port, bundle)  # holds the only slot
        second = _connect(px, port)
        head = _head(second)
        assert head.startswith(b"HTTP/1.1 503") and b"too-many-tunnels" in head
        second.close()
        tls.close()
        for _ in range(50):  # the slot is freed when the tunnel ends
            if term.active == 0:
                break
            time.sleep(0.05)
        r = _curl(px, bundle, f"https://127.0.0.1:{port}/again")
        assert r.stdout == "ok\n", r.stderr


def test_a_client_that_never_handshakes_is_cut(
    ca: CertificateAuthority, upstreams: dict[str, object]
) -> None:
    port = upstreams["ports"]["tls1"]  # type: ignore[index]
    term = _terminator(ca, str(upstreams["ca"]), handshake_timeout=0.3)
    with Proxy(POLICY, terminator=term) as px:
        s = _connect(px, port)
        assert _head(s).startswith(b"HTTP/1.1 200")
        s.settimeout(5)
        started = time.monotonic()
        assert s.recv(100) == b""  # closed by the proxy, not by our timeout
        assert time.monotonic() - started < 3
        s.close()
        for _ in range(50):
            if term.active == 0:
                break
            time.sleep(0.05)
        assert term.active == 0


@pytest.mark.parametrize(
    ("args", "framing", "injected"),
    [
        (["--data-binary", f"k={PLACEHOLDER}"], "length", True),
        (["-H", "Content-Encoding: gzip", "--data-binary", f"k={PLACEHOLDER}"], "length", False),
        (
            ["-H", "Transfer-Encoding: chunked", "--data-binary", f"k={PLACEHOLDER}"],
            "chunked",
            True,
        ),
        (["-H", "Expect: 100-continue", "--data-binary", f"k={PLACEHOLDER}"], "length", True),
        (["--data-binary", f"k={PLACEHOLDER}&{'x' * 200}"], "chunked", True),  # > buffer_limit
    ],
)
def test_bodies(  # noqa: PLR0917 (fixtures and the case)
    ca: CertificateAuthority,
    upstreams: dict[str, object],
    bundle: str,
    args: list[str],
    framing: str,
    injected: bool,
) -> None:
    port = upstreams["ports"]["tls1"]  # type: ignore[index]
    seen = upstreams["seen"]
    assert isinstance(seen, list)
    term = _terminator(ca, str(upstreams["ca"]), buffer_limit=100)
    with Proxy(POLICY, terminator=term) as px:
        mark = len(seen)
        r = _curl(px, bundle, *args, f"https://127.0.0.1:{port}/body")
        assert r.stdout == "ok\n", r.stderr
    (got,) = seen[mark:]
    body = str(got["body"])
    assert body.startswith(f"k={REAL}" if injected else f"k={PLACEHOLDER}")
    assert got["framing"] == framing


def test_the_connect_target_decides_not_the_host_header(
    ca: CertificateAuthority, upstreams: dict[str, object], bundle: str
) -> None:
    ports = upstreams["ports"]
    seen = upstreams["seen"]
    assert isinstance(ports, dict) and isinstance(seen, list)
    term = _terminator(ca, str(upstreams["ca"]))
    with Proxy(POLICY, terminator=term) as px:
        mark = len(seen)
        r = _curl(
            px,
            bundle,
            "-H", f"Host: 127.0.0.1:{ports['tls1']}",
            "-H", f"Authorization: Bearer {PLACEHOLDER}",
            f"https://127.0.0.2:{ports['tls2']}/elsewhere",
        )  # fmt: skip
        assert r.stdout == "ok\n", r.stderr
    (got,) = seen[mark:]
    assert got["auth"] == f"Bearer {PLACEHOLDER}"


def test_a_request_h11_cannot_read_gets_400_and_nothing_upstream(
    ca: CertificateAuthority, upstreams: dict[str, object], bundle: str
) -> None:
    port = upstreams["ports"]["tls1"]  # type: ignore[index]
    seen = upstreams["seen"]
    assert isinstance(seen, list)
    with Proxy(POLICY, terminator=_terminator(ca, str(upstreams["ca"]))) as px:
        mark = len(seen)
        tls = _tunnel(px, port, bundle)
        tls.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
        answer = _head(tls)
        tls.close()
        tls = _tunnel(px, port, bundle)  # both framings: h11 reads one, an upstream the other
        tls.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        )
        both = _head(tls)
        tls.close()
    assert answer.startswith(b"HTTP/1.1 400") and b"bad-request" in answer
    assert both.startswith(b"HTTP/1.1 400") and b"Transfer-Encoding and Content-Length" in both
    assert seen[mark:] == []


def test_http_1_0_either_side_and_bodyless_keep_alive(
    ca: CertificateAuthority, upstreams: dict[str, object], bundle: str
) -> None:
    """An HTTP/1.0 request, an HTTP/1.0 answer, and two bodyless GETs on one tunnel:
    the events h11 parsed are passed on as they are only where h11 can send them."""
    from tlsupstreams import CERTS

    port = upstreams["ports"]["tls1"]  # type: ignore[index]
    seen = upstreams["seen"]
    assert isinstance(seen, list)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(CERTS / "leaf.pem"))
    old = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def serve_once() -> None:
        conn, _ = old.accept()
        with ctx.wrap_socket(conn, server_side=True) as tls:
            got.append(_head(tls))
            tls.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nold")

    threading.Thread(target=serve_once, daemon=True).start()
    auth = f"Authorization: Bearer {PLACEHOLDER}"
    term = _terminator(ca, str(upstreams["ca"]))
    with Proxy(POLICY, terminator=term) as px:
        mark = len(seen)
        r = _curl(px, bundle, "--http1.0", "-H", auth, f"https://127.0.0.1:{port}/ten")
        assert r.stdout == "ok\n", r.stderr
        r = _curl(px, bundle, "-H", auth, *(f"https://127.0.0.1:{port}/k{i}" for i in (1, 2)))
        assert r.stdout == "ok\nok\n", r.stderr
        r = _curl(px, bundle, "-H", auth, f"https://127.0.0.1:{old.getsockname()[1]}/old")
        assert r.stdout == "old", r.stderr
    old.close()
    assert [g["auth"] for g in seen[mark:]] == [f"Bearer {REAL}"] * 3
    assert term.resumed >= 1  # the second tunnel to tls1 resumed the first one's session
    assert f"Authorization: Bearer {REAL}\r\n".encode() in got[0]  # as the client spelt it


def test_an_upstream_that_sends_past_its_answer_and_a_value_that_breaks_a_line(
    ca: CertificateAuthority, upstreams: dict[str, object], bundle: str
) -> None:
    """Bytes after a response's end never reach the client (the tunnel closes), and a
    real value holding CR LF is refused, not sent as a header of its own."""
    from tlsupstreams import CERTS

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(CERTS / "leaf.pem"))
    server = socket.create_server(("127.0.0.1", 0))
    heads: list[bytes] = []

    def serve() -> None:
        for _ in range(2):
            conn, _ = server.accept()
            with ctx.wrap_socket(conn, server_side=True) as tls:
                heads.append(_head(tls))
                tls.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none"
                    b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled"
                )
                with contextlib.suppress(OSError):
                    heads.append(_head(tls))

    threading.Thread(target=serve, daemon=True).start()
    port = server.getsockname()[1]
    with Proxy(POLICY, terminator=_terminator(ca, str(upstreams["ca"]))) as px:
        r = _curl(px, bundle, f"https://127.0.0.1:{port}/a", f"https://127.0.0.1:{port}/b")
        assert r.stdout == "oneone", r.stdout + r.stderr  # two tunnels, no "smuggled"
        evil = Injector([Injection(PLACEHOLDER, "x\r\nX-Evil: 1", ("127.0.0.1",), "t")])
        term = Terminator(ca, evil, upstream_context=upstream_context([str(upstreams["ca"])]))
        with Proxy(POLICY, terminator=term) as px2:
            r = _curl(
                px2, bundle, "-i", "-H", f"Authorization: {PLACEHOLDER}",
                f"https://127.0.0.1:{upstreams['ports']['tls1']}/evil",  # type: ignore[index]
            )  # fmt: skip
    server.close()
    assert "\nHTTP/1.1 502 " in r.stdout and "cannot go in a header" in r.stdout
    assert not any(b"X-Evil" in h for h in heads)


def test_a_client_silent_after_its_handshake_is_cut(
    ca: CertificateAuthority, upstreams: dict[str, object], bundle: str
) -> None:
    port = upstreams["ports"]["tls1"]  # type: ignore[index]
    term = _terminator(ca, str(upstreams["ca"]), handshake_timeout=0.3)
    with Proxy(POLICY, terminator=term) as px:
        tls = _tunnel(px, port, bundle)
        tls.settimeout(5)
        started = time.monotonic()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            assert tls.recv(100) == b""  # closed by the proxy's first-request deadline
        assert time.monotonic() - started < 3
        tls.close()
