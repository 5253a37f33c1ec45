"""Measure the TLS-terminating proxy: HTTPS request rate and throughput, and a leaf's first use.

Three paths are measured side by side in one run, rounds interleaved: direct HTTPS to
the upstream (the floor), sandhold's proxy tunnelling the TLS untouched (a host with no
injection), and sandhold's proxy terminating TLS and putting a placeholder back (a host
with an injection). Three kinds of process never share a CPU account: the upstream
(this script with ``--serve-upstream``), the proxy (``--serve-proxy``) and the load
generator (this process).

- Request rate: keep-alive GETs with an ``Authorization`` header (the placeholder) on one
  connection, per path; median requests/s and the ratio to the tunnel's in the same
  round. Budget: terminating >= 50% of tunnelling.
- Throughput: a download of ``--size-mib`` MiB per path; median MB/s.
- First request on a new host: CONNECT, handshake, one request on a host name the proxy
  has not minted a leaf for yet, against the same on a host it has, through a plain
  tunnel and direct; each split into phases. The client's trust store is loaded once per
  path, outside the timing (its cost is reported apart). Budget: p50 <= 20 ms.

Rules:
- The run is a report: it exits 0 even when a budget is missed, 1 when a request fails,
  2 when the bench cannot run here (no venv, no ``cryptography``).
- Upstream and proxy run on 127.0.0.1; host names ``*.bench.test`` reach it through the
  proxy's own resolver (no /etc/hosts). Nothing outside ``bench/.scratch/`` and
  ``bench/results/`` is written.

Usage: .venv/bin/python bench/credentials.py [--rounds N] [--requests N] [--size-mib N] [--hosts N]
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import itertools
import json
import os
import platform
import socket
import ssl
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SCRATCH = BENCH / ".scratch" / "credentials"
RESULTS = BENCH / "results"
PLACEHOLDER = "sandhold_placeholder_0123456789abcdef0123456789abcdef"
REAL = "bench-real-secret"
RATE_BUDGET = 0.5
FIRST_BUDGET_MS = 20.0


def _certs() -> None:
    """An upstream CA and a leaf for 127.0.0.1 and *.bench.test, in SCRATCH."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench upstream CA")])
    ca = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("*.bench.test")]
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "upstream")]))
        .issuer_name(name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    (SCRATCH / "upstream-ca.pem").write_bytes(ca.public_bytes(pem))
    (SCRATCH / "upstream.pem").write_bytes(
        leaf.public_bytes(pem)
        + key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def serve_upstream(port_file: str) -> None:
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # head and body go in two writes

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.startswith("/big/"):
                size = int(self.path.rsplit("/", 1)[1])
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                block = b"x" * 65536
                while size > 0:
                    self.wfile.write(block[: min(size, len(block))])
                    size -= len(block)
                return
            ok = self.headers.get("Authorization") in (f"Bearer {REAL}", f"Bearer {PLACEHOLDER}")
            out = b"ok\n" if ok else b"no\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # inherited by accepted sockets: the TLS handshake's flights go out at once
    server.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(SCRATCH / "upstream.pem"))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    Path(port_file).write_text(str(server.server_address[1]))
    server.serve_forever()


def serve_proxy(port_file: str) -> None:
    import asyncio

    sys.path.insert(0, str(REPO / "src"))
    from sandhold.net.ca import CertificateAuthority, trust_bundle, upstream_context
    from sandhold.net.egress import EgressSession
    from sandhold.net.injection import Injector
    from sandhold.net.tls_terminate import Terminator
    from sandhold.policy.domains import DomainPolicy
    from sandhold.policy.placeholders import Injection

    ca = CertificateAuthority.load_or_create(str(SCRATCH / "ca"))
    bundle, _ = trust_bundle(ca, [str(SCRATCH / "upstream-ca.pem")])
    (SCRATCH / "bundle.pem").write_bytes(bundle)
    injector = Injector([Injection(PLACEHOLDER, REAL, ("*.bench.test",), "bench")])
    extra = [str(SCRATCH / "upstream-ca.pem")]
    terminator = Terminator(ca, injector, upstream_context=upstream_context(extra))
    policy = DomainPolicy.for_cli(["*.bench.test", "127.0.0.1"])

    async def resolve(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    async def main() -> None:
        http_l = socket.create_server(("127.0.0.1", 0))
        session = EgressSession(
            http_listener=http_l,
            socks_listener=None,
            policy=lambda: policy,
            resolver=resolve,  # type: ignore[arg-type]
            host_addresses=(),
            terminator=terminator,
        )
        async with session:
            Path(port_file).write_text(str(http_l.getsockname()[1]))
            await asyncio.Event().wait()

    asyncio.run(main())


def _spawn(flag: str, name: str) -> tuple[subprocess.Popen[bytes], int]:
    port_file = SCRATCH / f"{name}.port"
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, __file__, flag, str(port_file)])
    for _ in range(200):
        if port_file.exists() and port_file.read_text():
            return proc, int(port_file.read_text())
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"{name} did not start")


_CONTEXTS: dict[str, ssl.SSLContext] = {}


def _context(path: str) -> ssl.SSLContext:
    """The client's trust store, loaded once per path (as a client that keeps one does):
    the proxy's bundle holds the system roots, and parsing it (~200 KiB of PEM) costs
    tens of ms, which is the client's, not the proxy's (``client_context_ms``)."""
    name = "upstream-ca.pem" if path == "direct" else "bundle.pem"
    if name not in _CONTEXTS:
        _CONTEXTS[name] = ssl.create_default_context(cafile=str(SCRATCH / name))
    return _CONTEXTS[name]


def _connection(path: str, proxy: int, upstream: int, host: str) -> http.client.HTTPSConnection:
    if path == "direct":
        return http.client.HTTPSConnection(
            "127.0.0.1", upstream, context=_context(path), timeout=30
        )
    conn = http.client.HTTPSConnection("127.0.0.1", proxy, context=_context(path), timeout=30)
    conn.set_tunnel(host, upstream)
    return conn


# tunnel: an IP literal (no injection there, so untouched); terminate: a bench.test name
TARGET = {"direct": "127.0.0.1", "tunnel": "127.0.0.1", "terminate": "api.bench.test"}


def _rate(path: str, proxy: int, upstream: int, n: int) -> float:
    conn = _connection(path, proxy, upstream, TARGET[path])
    headers = {"Authorization": f"Bearer {PLACEHOLDER}"}
    conn.request("GET", "/", headers=headers)
    conn.getresponse().read()  # set-up out of the timing
    start = time.perf_counter()
    for _ in range(n):
        conn.request("GET", "/", headers=headers)
        r = conn.getresponse()
        if r.read() != b"ok\n":
            raise SystemExit(f"{path}: a request failed")
    took = time.perf_counter() - start
    conn.close()
    return n / took


def _throughput(path: str, proxy: int, upstream: int, size: int) -> float:
    conn = _connection(path, proxy, upstream, TARGET[path])
    start = time.perf_counter()
    conn.request("GET", f"/big/{size}")
    r = conn.getresponse()
    got = 0
    while chunk := r.read(1 << 20):
        got += len(chunk)
    took = time.perf_counter() - start
    conn.close()
    if got != size:
        raise SystemExit(f"{path}: short download ({got} of {size})")
    return size / took / 1e6


PHASES = ("connect", "answer", "tls", "request")


def _first(proxy: int, upstream: int, host: str, path: str = "terminate") -> list[float]:
    """One new connection's first request, in ms per phase: TCP connect; the CONNECT's
    answer (the proxy's decision and its dial of the upstream; 0 direct); the client's
    TLS handshake (through a tunnel: with the upstream; terminated: with the proxy,
    whose leaf for a new host is minted here); the request and its answer (terminated:
    the proxy's own TLS handshake with the upstream is in it)."""
    marks = [time.perf_counter()]
    direct = path == "direct"
    sock = socket.create_connection(("127.0.0.1", upstream if direct else proxy), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    marks.append(time.perf_counter())
    if not direct:
        sock.sendall(
            f"CONNECT {host}:{upstream} HTTP/1.1\r\nHost: {host}:{upstream}\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(4096)
            if not data:
                raise SystemExit("the proxy closed the CONNECT")
            head += data
        if not head.startswith(b"HTTP/1.1 200"):
            raise SystemExit(f"CONNECT refused: {head[:60]!r}")
    marks.append(time.perf_counter())
    tls = _context(path).wrap_socket(sock, server_hostname=host)
    marks.append(time.perf_counter())
    tls.sendall(
        f"GET / HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {PLACEHOLDER}\r\n"
        "Connection: close\r\n\r\n".encode()
    )
    answer = b""
    while data := tls.recv(65536):
        answer += data
    if not answer.endswith(b"ok\n"):
        raise SystemExit(f"{path} first request failed")
    marks.append(time.perf_counter())
    tls.close()
    return [(b - a) * 1000 for a, b in itertools.pairwise(marks)]


def _phases(rows: list[list[float]]) -> str:
    med = statistics.median
    return ", ".join(
        f"{name} {med(col):.1f}" for name, col in zip(PHASES, zip(*rows, strict=True), strict=True)
    )


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] in ("--serve-upstream", "--serve-proxy"):
        (serve_upstream if sys.argv[1] == "--serve-upstream" else serve_proxy)(sys.argv[2])
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--size-mib", type=int, default=64)
    p.add_argument("--hosts", type=int, default=50)
    args = p.parse_args()
    try:
        import cryptography  # noqa: F401
    except ImportError:
        print("bench/credentials.py needs the cryptography package", file=sys.stderr)
        return 2
    SCRATCH.mkdir(parents=True, exist_ok=True)
    _certs()
    upstream_proc, upstream = _spawn("--serve-upstream", "upstream")
    proxy_proc, proxy = _spawn("--serve-proxy", "proxy")
    paths = ("direct", "tunnel", "terminate")
    rates: dict[str, list[float]] = {k: [] for k in paths}
    ratios: list[float] = []
    mbps: dict[str, list[float]] = {k: [] for k in paths}
    try:
        for i in range(args.rounds):
            order = paths[i % 3 :] + paths[: i % 3]
            got = {k: _rate(k, proxy, upstream, args.requests) for k in order}
            for k, v in got.items():
                rates[k].append(v)
            ratios.append(got["terminate"] / got["tunnel"])
            for k in order:
                mbps[k].append(_throughput(k, proxy, upstream, args.size_mib << 20))
        started = time.perf_counter()
        ssl.create_default_context(cafile=str(SCRATCH / "bundle.pem"))
        client_context_ms = (time.perf_counter() - started) * 1000
        direct_rows = [_first(0, upstream, "127.0.0.1", "direct") for _ in range(args.hosts)]
        tunnel_rows = [_first(proxy, upstream, "127.0.0.1", "tunnel") for _ in range(args.hosts)]
        warm_rows = [_first(proxy, upstream, "api.bench.test") for _ in range(args.hosts)]
        fresh_rows = [_first(proxy, upstream, f"h{i}.bench.test") for i in range(args.hosts)]
        direct_first, tunnel_first, warm, fresh = (
            [sum(r) for r in rows] for rows in (direct_rows, tunnel_rows, warm_rows, fresh_rows)
        )
    finally:
        proxy_proc.kill()
        upstream_proc.kill()
    med = statistics.median
    ratio = med(ratios)
    first_p50 = med(fresh)
    lines = [
        "# TLS-terminating proxy (bench/credentials.py)",
        "",
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} CPUs, {args.rounds} rounds of {args.requests} requests, "
        f"{args.size_mib} MiB downloads, load average {os.getloadavg()[0]:.1f} at the end",
        "",
        "| path | requests/s (median) | MB/s (median) |",
        "|---|---:|---:|",
        *(f"| {k} | {med(rates[k]):.0f} | {med(mbps[k]):.0f} |" for k in paths),
        "",
        f"- terminating / tunnelling request rate, median of per-round ratios: {ratio:.0%} "
        f"(budget >= {RATE_BUDGET:.0%}): {'PASS' if ratio >= RATE_BUDGET else 'FAIL'}",
        f"- first request on a new host (leaf minted): p50 {first_p50:.1f} ms, "
        f"p90 {sorted(fresh)[int(len(fresh) * 0.9)]:.1f} ms; on a known host p50 "
        f"{med(warm):.1f} ms, tunnelled p50 {med(tunnel_first):.1f} ms, direct p50 "
        f"{med(direct_first):.1f} ms "
        f"(budget p50 <= {FIRST_BUDGET_MS:.0f} ms): "
        f"{'PASS' if first_p50 <= FIRST_BUDGET_MS else 'FAIL'}",
        "",
        "First request, p50 ms by phase (connect: TCP to the proxy; answer: the CONNECT's "
        "200, i.e. the decision and the upstream dial; tls: the client's handshake; "
        "request: the exchange, with the proxy's own upstream handshake when terminating):",
        "",
        f"- new host (leaf minted): {_phases(fresh_rows)}",
        f"- known host: {_phases(warm_rows)}",
        f"- tunnelled: {_phases(tunnel_rows)}",
        f"- direct: {_phases(direct_rows)}",
        f"- not counted: the client's own trust store (the bundle with the system roots) "
        f"takes {client_context_ms:.0f} ms to load; each client here loads it once",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "credentials.md").write_text(report)
    raw = {
        "rates": rates,
        "ratios": ratios,
        "mbps": mbps,
        "first_new_ms": fresh,
        "first_known_ms": warm,
        "first_tunnel_ms": tunnel_first,
        "first_direct_ms": direct_first,
        "first_phases_ms": {
            "new": fresh_rows,
            "known": warm_rows,
            "tunnel": tunnel_rows,
            "direct": direct_rows,
        },
        "client_context_ms": client_context_ms,
        "loadavg": os.getloadavg(),
    }
    (RESULTS / "credentials.json").write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
