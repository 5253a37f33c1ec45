"""Local TLS upstreams for credential tests: their own CA, recording what they receive.

``serve_upstreams()`` (a test module's fixture holds it open) serves HTTPS on
127.0.0.1 and 127.0.0.2 with a leaf of its own CA (``ca``: give it to sandhold as
``extraCaCertPaths``), an impostor with a self-signed certificate (``bad``) and plain
HTTP (``plain``); each records the path, ``Authorization``, ``X-Api-Key``, body and
framing of every request in ``seen`` and answers ``ok`` without echoing anything.
``mark``/``seen_since`` take what arrived after a point.
"""

from __future__ import annotations

import contextlib
import datetime
import http.server
import ipaddress
import os
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

REAL = "real-api-key-5f1c0a9e7b3d4c2a"
CERTS = Path("/var/tmp/sandhold-test-cred-tls")


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
    ips: list[str],
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    signer_name, signer_key = issuer if issuer is not None else (subject, key)
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(signer_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
    )
    if ips:
        b = b.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(i)) for i in ips]),
            critical=False,
        )
    else:
        b = b.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    return b.sign(signer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive, no log lines, a ``seen`` list and the request's body."""

    protocol_version = "HTTP/1.1"
    seen: list[dict[str, object]]

    def log_message(self, *args: object) -> None:
        pass

    def length_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""


class _Recorder(QuietHandler):
    def _handle(self) -> None:
        body = self.length_body()
        if (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
            parts = []
            for _ in range(100_000):  # bounded: a test body
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            body = b"".join(parts)
        self.seen.append(
            {
                "server": self.server.server_address,  # type: ignore[attr-defined]
                "path": self.path,
                "auth": self.headers.get("Authorization"),
                "x_key": self.headers.get("X-Api-Key"),
                "body": body.decode("latin-1"),
                "framing": "chunked" if "Transfer-Encoding" in self.headers else "length",
            }
        )
        out = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _handle


@contextlib.contextmanager
def serve_upstreams() -> Iterator[dict[str, object]]:
    CERTS.mkdir(exist_ok=True)
    os.chmod(CERTS, 0o755)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("sandhold test upstream CA", ca_key, None, [])
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = _cert(
        "upstream", leaf_key, ("sandhold test upstream CA", ca_key), ["127.0.0.1", "127.0.0.2"]
    )
    bad_key = ec.generate_private_key(ec.SECP256R1())
    bad = _cert("impostor", bad_key, None, ["127.0.0.1"])  # self-signed: trusted by no one
    (CERTS / "ca.pem").write_bytes(_pem(ca))
    os.chmod(CERTS / "ca.pem", 0o644)
    (CERTS / "leaf.pem").write_bytes(_pem(leaf) + _key_pem(leaf_key))
    (CERTS / "bad.pem").write_bytes(_pem(bad) + _key_pem(bad_key))
    seen: list[dict[str, object]] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    servers = []

    def serve(addr: str, chain: str | None) -> int:
        server = http.server.ThreadingHTTPServer((addr, 0), handler)
        if chain is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(CERTS / chain))
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return int(server.server_address[1])

    ports = {
        "tls1": serve("127.0.0.1", "leaf.pem"),
        "tls2": serve("127.0.0.2", "leaf.pem"),
        "bad": serve("127.0.0.1", "bad.pem"),
        "plain": serve("127.0.0.1", None),
    }
    try:
        yield {"ports": ports, "seen": seen, "ca": str(CERTS / "ca.pem")}
    finally:
        for s in servers:
            s.shutdown()


def seen_since(upstreams: dict[str, object], mark: int) -> list[dict[str, object]]:
    seen = upstreams["seen"]
    assert isinstance(seen, list)
    return seen[mark:]


def mark(upstreams: dict[str, object]) -> int:
    seen = upstreams["seen"]
    assert isinstance(seen, list)
    return len(seen)
