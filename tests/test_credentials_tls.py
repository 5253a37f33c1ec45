"""Masked credentials put back by the terminating proxy, with real clients in real sandboxes.

Upstreams run on the host at 127.0.0.1 and 127.0.0.2 with certificates of their own
CA (given to sandhold as ``extraCaCertPaths``); they record what they receive and
answer without echoing it. ``API_KEY`` is injected at 127.0.0.1 only. Every test runs
as root and as an unprivileged user (F-CRED-3).
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import os
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from conftest import World

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


class _Recorder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict[str, object]]

    def log_message(self, *args: object) -> None:
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
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


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, object]]:
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
    yield {"ports": ports, "seen": seen, "ca": str(CERTS / "ca.pem")}
    for s in servers:
        s.shutdown()


def _settings(upstreams: dict[str, object], **creds: object) -> dict[str, object]:
    return {
        "network": {
            "allowedDomains": ["127.0.0.1", "127.0.0.2"],
            "tlsTerminate": {"extraCaCertPaths": [upstreams["ca"]]},
        },
        "credentials": {
            "envVars": [{"name": "API_KEY", "mode": "mask", "injectHosts": ["127.0.0.1"]}],
            **creds,
        },
    }


def _run(world: World, settings: dict[str, object], *command: str, extra: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    s = world.settings(settings)
    # the upstreams are on loopback, which the sandbox's NO_PROXY sends direct
    argv = ("env", "NO_PROXY=", "no_proxy=", *command)
    return world.sandhold(*extra, "-s", str(s), "--", *argv, env=world.env(API_KEY=REAL))


def _seen_since(upstreams: dict[str, object], mark: int) -> list[dict[str, object]]:
    seen = upstreams["seen"]
    assert isinstance(seen, list)
    return seen[mark:]


def _mark(upstreams: dict[str, object]) -> int:
    seen = upstreams["seen"]
    assert isinstance(seen, list)
    return len(seen)


def test_curl_gets_the_real_key_to_its_host_only(
    world: World, upstreams: dict[str, object]
) -> None:
    ports = upstreams["ports"]
    assert isinstance(ports, dict)
    mark = _mark(upstreams)
    script = (
        'echo "$API_KEY"; '
        f'curl -sS -m 10 -H "Authorization: Bearer $API_KEY" --data "key=$API_KEY" '
        f"https://127.0.0.1:{ports['tls1']}/one https://127.0.0.1:{ports['tls1']}/two && "
        f'curl -sS -m 10 -H "Authorization: Bearer $API_KEY" https://127.0.0.2:{ports["tls2"]}/other'
    )
    r = _run(world, _settings(upstreams), "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    placeholder, *answers = r.stdout.splitlines()
    assert placeholder.startswith("sandhold_placeholder_") and answers == ["ok", "ok", "ok"]
    assert REAL not in r.stdout + r.stderr
    got = _seen_since(upstreams, mark)
    by_path = {g["path"]: g for g in got}
    assert by_path["/one"]["auth"] == f"Bearer {REAL}" and by_path["/one"]["body"] == f"key={REAL}"
    assert by_path["/two"]["auth"] == f"Bearer {REAL}"  # the same tunnel, kept alive
    assert by_path["/other"]["auth"] == f"Bearer {placeholder}"  # not its host: unchanged


def test_python_urllib_in_the_sandbox(world: World, upstreams: dict[str, object]) -> None:
    ports = upstreams["ports"]
    assert isinstance(ports, dict)
    mark = _mark(upstreams)
    code = (
        "import os, urllib.request\n"
        f"req = urllib.request.Request('https://127.0.0.1:{ports['tls1']}/py', "
        "data=('{\"k\": \"%s\"}' % os.environ['API_KEY']).encode(), "
        "headers={'X-Api-Key': os.environ['API_KEY'], 'Content-Type': 'application/json'})\n"
        "print(urllib.request.urlopen(req, timeout=10).read().decode().strip())\n"
    )
    r = _run(world, _settings(upstreams), "python3", "-c", code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    (got,) = _seen_since(upstreams, mark)
    assert got["x_key"] == REAL and json.loads(str(got["body"])) == {"k": REAL}


def test_a_bad_upstream_certificate_fails_the_request(
    world: World, upstreams: dict[str, object]
) -> None:
    ports = upstreams["ports"]
    assert isinstance(ports, dict)
    mark = _mark(upstreams)
    script = (
        f'curl -sS -m 10 -i -H "Authorization: Bearer $API_KEY" https://127.0.0.1:{ports["bad"]}/x'
    )
    r = _run(world, _settings(upstreams), "sh", "-c", script)
    assert "\nHTTP/1.1 502 " in r.stdout, r.stdout + r.stderr  # after the CONNECT's 200
    assert "upstream-tls-failed" in r.stdout and "certificate verify failed" in r.stdout
    assert _seen_since(upstreams, mark) == []  # nothing was sent to the impostor


def test_plain_http_is_injected_only_with_the_opt_in(
    world: World, upstreams: dict[str, object]
) -> None:
    ports = upstreams["ports"]
    assert isinstance(ports, dict)
    script = f'curl -sS -m 10 -H "Authorization: Bearer $API_KEY" http://127.0.0.1:{ports["plain"]}/plain'
    mark = _mark(upstreams)
    r = _run(world, _settings(upstreams), "sh", "-c", script)
    assert r.stdout.strip() == "ok", r.stderr
    (got,) = _seen_since(upstreams, mark)
    assert str(got["auth"]).startswith("Bearer sandhold_placeholder_")
    mark = _mark(upstreams)
    r = _run(world, _settings(upstreams, allowPlaintextInject=True), "sh", "-c", script)
    assert r.stdout.strip() == "ok", r.stderr
    (got,) = _seen_since(upstreams, mark)
    assert got["auth"] == f"Bearer {REAL}"


def test_no_log_or_record_has_the_real_value(world: World, upstreams: dict[str, object]) -> None:
    ports = upstreams["ports"]
    assert isinstance(ports, dict)
    violations = world.root / "violations.jsonl"
    script = (
        'curl -sS -m 10 -H "Authorization: Bearer $API_KEY" '
        f"https://127.0.0.1:{ports['tls1']}/log; "
        f"curl -sS -m 10 https://127.0.0.3:{ports['tls1']}/refused; true"
    )
    r = _run(
        world,
        _settings(upstreams),
        "sh",
        "-c",
        script,
        extra=("--debug", "--violations", str(violations)),
    )
    assert r.returncode == 0, r.stderr
    recorded = violations.read_text()
    assert "127.0.0.3" in recorded  # the file was written
    for text in (r.stdout, r.stderr, recorded):
        assert REAL not in text
    # the sandbox could not read sandhold's CA key either
    r = _run(world, _settings(upstreams), "sh", "-c", "cat ~/.local/state/sandhold/ca/ca-key.pem")
    assert r.returncode != 0 and "PRIVATE KEY" not in r.stdout
    assert (world.home / ".local/state/sandhold/ca/ca-key.pem").stat().st_mode & 0o077 == 0


NODE_CONNECT = r"""
const http = require('http'), tls = require('tls');
const proxy = new URL(process.env.HTTPS_PROXY);
const [host, port] = [process.argv[2], Number(process.argv[3])];
const req = http.request(
  {host: proxy.hostname, port: proxy.port, method: 'CONNECT', path: `${host}:${port}`});
req.on('connect', (res, socket) => {
  // trusts the proxy's CA through NODE_EXTRA_CA_CERTS, as node does by default
  const s = tls.connect({socket, servername: host, host}, () => {
    const auth = `Authorization: Bearer ${process.env.API_KEY}`;
    s.write(`GET /node HTTP/1.1\r\nHost: ${host}\r\n${auth}\r\nConnection: close\r\n\r\n`);
  });
  let out = '';
  s.on('data', d => out += d);
  s.on('end', () => { console.log(out.split('\r\n')[0]); });
  s.on('error', e => { console.log('error ' + e.message); process.exit(1); });
});
req.end();
"""


def test_node_and_git_get_the_real_key(world: World, upstreams: dict[str, object]) -> None:
    ports = upstreams["ports"]
    assert isinstance(ports, dict)
    script = world.mkfile("work/connect.js", NODE_CONNECT)
    mark = _mark(upstreams)
    r = _run(world, _settings(upstreams), "node", str(script), "127.0.0.1", str(ports["tls1"]))
    assert r.stdout.strip() == "HTTP/1.1 200 OK", r.stdout + r.stderr
    (got,) = _seen_since(upstreams, mark)
    assert got["auth"] == f"Bearer {REAL}"
    mark = _mark(upstreams)
    git = (
        'git -c http.extraHeader="Authorization: Bearer $API_KEY" '
        f"ls-remote https://127.0.0.1:{ports['tls1']}/repo.git; true"
    )
    r = _run(world, _settings(upstreams), "sh", "-c", git)
    got_git = _seen_since(upstreams, mark)
    assert got_git, r.stderr  # git reached the upstream through the terminating proxy
    assert all(g["auth"] == f"Bearer {REAL}" for g in got_git)
    assert REAL not in r.stdout + r.stderr


def test_control_fd_changes_which_hosts_are_terminated(
    world: World, upstreams: dict[str, object]
) -> None:
    import contextlib
    import subprocess

    ports = upstreams["ports"]
    assert isinstance(ports, dict)
    settings = _settings(upstreams)
    del settings["credentials"]["envVars"][0]["injectHosts"]  # type: ignore[index]
    s = world.settings(settings)
    url = f"https://127.0.0.1:{ports['tls1']}/live"
    curl = f'curl -sS -m 10 -H "Authorization: Bearer $API_KEY" {url}'
    r_fd, w_fd = os.pipe()
    proc = world.popen(
        "-s", str(s), "--control-fd", str(r_fd), "--",
        "env", "NO_PROXY=", "no_proxy=", "sh", "-c", f"{curl}; read go; {curl}",
        env=world.env(API_KEY=REAL),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(r_fd,),
    )  # fmt: skip
    os.close(r_fd)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        mark = _mark(upstreams)
        assert proc.stdout.readline() == b"ok\n"
        (first,) = _seen_since(upstreams, mark)
        assert first["auth"] == f"Bearer {REAL}"
        live = json.loads(json.dumps(settings))
        live["network"]["tlsTerminate"]["excludeDomains"] = ["127.0.0.1"]
        os.write(w_fd, json.dumps(live).encode() + b"\n")
        time.sleep(0.5)  # the line is read by the proxies' thread
        mark = _mark(upstreams)
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"ok\n"
        (second,) = _seen_since(upstreams, mark)
        assert str(second["auth"]).startswith("Bearer sandhold_placeholder_")  # tunnelled now
    finally:
        os.close(w_fd)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
    assert proc.returncode == 0
