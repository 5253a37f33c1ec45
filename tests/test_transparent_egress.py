"""Transparent egress through the real CLI: programs that ignore proxy variables (issue 20).

Every client below runs with no proxy variable at all (``env -i``). The
upstreams run on the host at 127.0.0.1 and the test names map to it in the
host's /etc/hosts, which the egress resolver reads (as in
``test_egress_sandbox.py``); ``127.0.0.1`` is allowed as an IP entry, since the
resolved-address guard refuses loopback otherwise. The sandbox must not read
those /etc/hosts lines itself (it would dial its own loopback), so the
settings deny it /etc/hosts: its resolver then asks DNS, and whatever
nameserver it asks, the DNS stub answers. Every test runs as root and as an
unprivileged user (``ident``).
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import World
from localnet import BannerHandler, banner_server

MARK = "# sandhold-i20-transparent"
NAMES = ("web.t20.test", "echo.t20.test", "denied.t20.test", "other.t20.test")
ALLOW = {
    "network": {
        "allowedDomains": ["web.t20.test", "echo.t20.test", "127.0.0.1"],
        "deniedDomains": ["denied.t20.test"],
    },
    "filesystem": {"denyRead": ["/etc/hosts"]},
}
CLEAN = ("env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp")


@pytest.fixture(scope="session")
def t20_names() -> Iterator[None]:
    hosts = Path("/etc/hosts")

    def without_ours() -> str:
        text = "".join(line for line in hosts.read_text().splitlines(True) if MARK not in line)
        return text if text.endswith("\n") else text + "\n"

    hosts.write_text(without_ours() + "".join(f"127.0.0.1 {n} {MARK}\n" for n in NAMES))
    yield
    hosts.write_text(without_ours())


class Seen:
    """What the upstreams saw: one entry per connection or request."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[str] = []

    def add(self, item: str) -> None:
        with self.lock:
            self.items.append(item)

    def count(self, prefix: str) -> int:
        with self.lock:
            return sum(1 for i in self.items if i.startswith(prefix))


class Upstreams:
    def __init__(self, http_port: int, https_port: int, echo_port: int, cert: str) -> None:
        self.http, self.https, self.echo, self.cert = http_port, https_port, echo_port, cert
        self.seen = Seen()


@pytest.fixture(scope="session")
def upstreams(tmp_path_factory: pytest.TempPathFactory, t20_names: None) -> Iterator[Upstreams]:
    root = tmp_path_factory.mktemp("t20")
    os.chmod(root, 0o755)
    (root / "hello.txt").write_text("hello through the stub\n")
    work = root / "src"
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    (work / "README").write_text("t20\n")
    subprocess.run(["git", "-C", str(work), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(work), "commit", "-qm", "init"], check=True, env=env)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(root / "repo.git")], check=True)
    subprocess.run(["git", "-C", str(root / "repo.git"), "update-server-info"], check=True)
    certdir = Path("/var/tmp/sandhold-i20-tls")  # the unprivileged user must read it
    certdir.mkdir(exist_ok=True)
    os.chmod(certdir, 0o755)
    cert, key = certdir / "cert.pem", certdir / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=web.t20.test", "-addext", "subjectAltName=DNS:web.t20.test",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    os.chmod(cert, 0o644)
    holder: list[Upstreams] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: object) -> None:
            super().__init__(*a, directory=str(root))  # type: ignore[arg-type]

        def do_GET(self) -> None:
            holder[0].seen.add(f"http {self.headers.get('Host', '')} {self.path}")
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass

    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    tls = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    tls.socket = ctx.wrap_socket(tls.socket, server_side=True)

    class Echo(BannerHandler):
        banner = b"SSH-2.0-t20echo\r\n"

        def record(self, first: str) -> None:
            holder[0].seen.add("echo " + first)

    for server in (plain, tls):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    with banner_server(Echo) as echo:
        holder.append(Upstreams(plain.server_address[1], tls.server_address[1], echo, str(cert)))
        yield holder[0]
    for server in (plain, tls):
        server.shutdown()
        server.server_close()


def _run(
    world: World, *command: str, settings: object = ALLOW, timeout: float = 60
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, object]]]:
    s = world.settings(settings)
    record = world.root / "violations.jsonl"
    if record.exists():
        record.unlink()
    r = world.sandhold("--violations", str(record), "-s", str(s), "--", *command, timeout=timeout)
    lines = record.read_text().splitlines() if record.exists() else []
    return r, [json.loads(line) for line in lines]


PY_QUERY = r"""
import socket, struct, sys, random
def query(name, server='8.8.8.8', qtype=1, tcp=False):
    family = socket.AF_INET6 if ':' in server else socket.AF_INET
    qid = random.randrange(65536)
    q = struct.pack('!HHHHHH', qid, 0x0100, 1, 0, 0, 0)
    q += b''.join(bytes([len(l)]) + l.encode() for l in name.split('.')) + b'\0'
    q += struct.pack('!HH', qtype, 1)
    if tcp:
        s = socket.create_connection((server, 53), timeout=5)
        s.sendall(struct.pack('!H', len(q)) + q)
        n = struct.unpack('!H', s.recv(2))[0]
        r = s.recv(n)
    else:
        s = socket.socket(family, socket.SOCK_DGRAM); s.settimeout(5)
        s.sendto(q, (server, 53)); r = s.recv(4096)
    assert r[:2] == q[:2]
    rcode = r[3] & 15
    an = struct.unpack('!H', r[6:8])[0]
    size, family = (4, socket.AF_INET) if qtype == 1 else (16, socket.AF_INET6)
    addr = socket.inet_ntop(family, r[-size:]) if an else ''
    return rcode, addr
"""


def test_curl_without_proxy_reaches_an_allowed_name(world: World, upstreams: Upstreams) -> None:
    before = upstreams.seen.count("http web.t20.test")
    r, events = _run(
        world, *CLEAN, "curl", "-sS", "-m", "10", f"http://web.t20.test:{upstreams.http}/hello.txt"
    )
    assert r.returncode == 0 and r.stdout == "hello through the stub\n", r.stderr
    assert upstreams.seen.count("http web.t20.test") == before + 1
    decided = [e for e in events if e["proxy"] == "transparent"]
    assert [(e["target"], e["allowed"]) for e in decided] == [
        (f"web.t20.test:{upstreams.http}", True)
    ]


def test_https_and_git_ls_remote_without_proxy(world: World, upstreams: Upstreams) -> None:
    url = f"https://web.t20.test:{upstreams.https}"
    script = (
        f"curl -sS -m 10 --cacert {upstreams.cert} {url}/hello.txt && "
        f"git -c http.sslCAInfo={upstreams.cert} ls-remote {url}/repo.git"
    )
    r, _ = _run(world, *CLEAN, "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("hello through the stub\n")
    assert "refs/heads/main" in r.stdout


def test_raw_socket_node_fetch_and_ssh_reach_allowed_names(
    world: World, upstreams: Upstreams
) -> None:
    py = (
        "import socket\n"
        f"c = socket.create_connection(('echo.t20.test', {upstreams.echo}), timeout=5)\n"
        "print(c.recv(100).decode().strip())\n"
        "c.sendall(b'raw hello')\n"
        "print(c.recv(100).decode())\n"
    )
    node = (
        f"fetch('http://web.t20.test:{upstreams.http}/hello.txt')"
        ".then(r => r.text()).then(t => process.stdout.write('node: ' + t))"
        ".catch(e => { console.error(e); process.exit(3) })"
    )
    before = upstreams.seen.count("echo SSH-2.0-OpenSSH")
    script = (
        f'python3 -c "{py}" && node -e "{node}" && '
        f"(ssh -o BatchMode=yes -o StrictHostKeyChecking=no -o ConnectTimeout=5 "
        f"-p {upstreams.echo} echo.t20.test true 2>&1; true)"
    )
    r, events = _run(world, *CLEAN, "sh", "-c", script)
    assert r.returncode == 0, (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert lines[:3] == ["SSH-2.0-t20echo", "raw hello", "node: hello through the stub"], lines
    # ssh's own banner reached the upstream (it then gives up on our fake server)
    assert upstreams.seen.count("echo SSH-2.0-OpenSSH") == before + 1
    assert all(e["allowed"] for e in events if e["proxy"] == "transparent")


def test_without_workarounds_git_ssh_node_and_curl_noproxy_go_transparent(
    world: World, upstreams: Upstreams
) -> None:
    """The sandbox's own environment (proxy variables set) has no GIT_SSH_COMMAND, JVM
    properties or NODE_USE_ENV_PROXY: git runs plain ssh, Node's fetch and
    ``curl --noproxy '*'`` ignore the proxies, and transparent egress takes each
    connection to an allowed name (a denied one does not resolve)."""
    before = upstreams.seen.count("echo SSH-2.0-OpenSSH")
    hello = f"http://web.t20.test:{upstreams.http}/hello.txt"
    script = (
        'echo "${GIT_SSH_COMMAND-unset} ${JAVA_TOOL_OPTIONS-unset} ${NODE_USE_ENV_PROXY-unset}"; '
        f"curl -sS -m 10 --noproxy '*' {hello}; "
        f"node -e \"fetch('{hello}').then(r => r.text()).then(t => process.stdout.write(t))\"; "
        "export HOME=/tmp; for name in echo denied; do "
        "git -c core.sshCommand='ssh -o BatchMode=yes -o ConnectTimeout=5' ls-remote "
        f"ssh://git@$name.t20.test:{upstreams.echo}/r.git; done; true"
    )
    r, events = _run(world, "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:3] == ["unset unset unset", *["hello through the stub"] * 2], r.stdout
    assert upstreams.seen.count("echo SSH-2.0-OpenSSH") == before + 1  # the allowed name only
    assert "Could not resolve hostname denied.t20.test" in r.stderr, r.stderr
    decided = [(e["target"], e["allowed"]) for e in events if e["proxy"] == "transparent"]
    assert decided == [
        (f"web.t20.test:{upstreams.http}", True),
        (f"web.t20.test:{upstreams.http}", True),
        (f"echo.t20.test:{upstreams.echo}", True),
    ]
    assert not [e for e in events if e["proxy"] in ("http", "socks5")]  # none took a proxy


def test_denied_name_gets_nxdomain_and_no_connection(world: World, upstreams: Upstreams) -> None:
    before = len(upstreams.seen.items)
    script = PY_QUERY + (
        "print(query('denied.t20.test'))\n"
        "print(query('other.t20.test', server='127.0.0.53'))\n"
        "print(query('x' * 60 + '.' + 'y' * 60 + '.t20.test', tcp=True))\n"
        "try:\n"
        f"    socket.create_connection(('denied.t20.test', {upstreams.http}), timeout=5)\n"
        "    print('connected')\n"
        "except socket.gaierror:\n"
        "    print('no such name')\n"
    )
    r, events = _run(world, *CLEAN, "python3", "-c", script)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["(3, '')", "(3, '')", "(3, '')", "no such name"]
    assert len(upstreams.seen.items) == before
    refused = {(e["target"], e["proxy"]) for e in events if not e["allowed"]}
    assert ("denied.t20.test:53", "dns") in refused
    assert all(e["proxy"] == "dns" for e in events)


def test_hard_coded_resolvers_are_answered_by_the_stub(world: World, upstreams: Upstreams) -> None:
    script = PY_QUERY + (
        "print(query('web.t20.test'))\n"
        "print(query('web.t20.test', server='192.0.2.53', tcp=True))\n"
        "print(query('web.t20.test', qtype=28))\n"
        "print(query('web.t20.test', server='2001:4860:4860::8888'))\n"
    )
    r, _ = _run(world, *CLEAN, "python3", "-c", script)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == lines[1] and lines[0].startswith("(0, '198.18.")
    assert lines[2].startswith("(0, 'fd53:616e:6468::")
    assert lines[3] == lines[0]  # an IPv6 resolver: the same stub, the same address
    if shutil.which("dig"):
        r, _ = _run(world, *CLEAN, "dig", "+short", "@8.8.8.8", "web.t20.test")
        assert r.stdout.strip().startswith("198.18."), (r.stdout, r.stderr)
        r, _ = _run(world, *CLEAN, "dig", "+tcp", "+short", "@1.1.1.1", "web.t20.test", "AAAA")
        assert r.stdout.strip().startswith("fd53:616e:6468::"), (r.stdout, r.stderr)


def test_sni_or_host_that_differs_from_the_name_is_refused(
    world: World, upstreams: Upstreams
) -> None:
    before = len(upstreams.seen.items)
    script = (
        "import socket, ssl\n"
        "ctx = ssl.create_default_context()\n"
        "ctx.check_hostname = False\n"
        "ctx.verify_mode = ssl.CERT_NONE\n"
        f"raw = socket.create_connection(('web.t20.test', {upstreams.https}), timeout=5)\n"
        "try:\n"
        "    ctx.wrap_socket(raw, server_hostname='evil.example')\n"
        "    print('handshake done')\n"
        "except ssl.SSLError as e:\n"
        "    print('tls refused', 'ACCESS_DENIED' in str(e).upper())\n"
    )
    r, events = _run(
        world,
        *CLEAN,
        "sh",
        "-c",
        f'python3 -c "{script}"; curl -sS -i -m 10 -H "Host: evil.example" '
        f"http://web.t20.test:{upstreams.http}/hello.txt | head -1; "
        # an absolute URI naming another host, sent to the allowed name's address
        f"printf 'GET http://evil.example/ HTTP/1.1\\r\\nHost: web.t20.test\\r\\n\\r\\n' | "
        f"curl -sS -m 10 telnet://web.t20.test:{upstreams.http} | head -1",
    )
    assert r.stdout.splitlines() == ["tls refused True"] + ["HTTP/1.1 403 Forbidden"] * 2, (
        r.stdout,
        r.stderr,
    )
    assert len(upstreams.seen.items) == before
    refused = [e for e in events if not e["allowed"]]
    assert [e["rule"] for e in refused] == ["transparent: SNI/Host differs"] * 3


def test_udp_fails_with_eperm_and_a_violation(world: World) -> None:
    script = (
        "import socket, errno\n"
        "for family, target in ((socket.AF_INET, ('192.0.2.7', 443)),"
        " (socket.AF_INET6, ('2001:db8::7', 443, 0, 0))):\n"
        "    s = socket.socket(family, socket.SOCK_DGRAM)\n"
        "    try:\n"
        "        s.sendto(b'quic?', target)\n"
        "        print('sent')\n"
        "    except OSError as e:\n"
        "        print(errno.errorcode[e.errno])\n"
    )
    r, events = _run(world, *CLEAN, "python3", "-c", script)
    assert r.stdout.splitlines() == ["EPERM", "EPERM"], r.stderr
    udp = sorted((e["target"], e["allowed"]) for e in events if e["proxy"] == "udp")
    assert udp == [("192.0.2.7:443", False), ("[2001:db8::7]:443", False)]


def test_ip_literals_are_decided_by_ip_entries(world: World, upstreams: Upstreams) -> None:
    settings = {"network": {"allowAllDomains": True}, "filesystem": {"denyRead": ["/etc/hosts"]}}
    script = "; ".join(
        f"curl -sS -g -i -m 10 http://{host}/ | head -1"
        for host in (
            "[::ffff:169.254.169.254]",
            "[::ffff:a9fe:a9fe]",
            "[fd00:ec2::254]",
            "169.254.169.254",
        )
    )
    r, events = _run(world, *CLEAN, "sh", "-c", script, settings=settings)
    assert r.stdout.splitlines() == ["HTTP/1.1 403 Forbidden"] * 4, (r.stdout, r.stderr)
    refused = [e for e in events if not e["allowed"]]
    assert len(refused) == 4
    assert all(e["rule"] == "baseline deny: cloud metadata" for e in refused), refused
    # a v6 literal with no IP entry: refused too (a reset; nothing is dialled)
    r, events = _run(
        world,
        *CLEAN,
        "python3",
        "-c",
        "import socket\ntry:\n socket.create_connection(('2001:db8::99', 80), timeout=5).recv(1)"
        "\n print('open')\nexcept OSError as e:\n print(type(e).__name__)",
    )
    assert r.stdout.strip() in ("ConnectionResetError", "ConnectionAbortedError"), r.stdout
    assert [(e["target"], e["allowed"]) for e in events] == [("[2001:db8::99]:80", False)]


def test_explicit_proxies_still_work_and_are_counted_once(
    world: World, upstreams: Upstreams
) -> None:
    r, events = _run(world, "curl", "-sS", "-m", "10", f"http://web.t20.test:{upstreams.http}/")
    assert r.returncode == 0, r.stderr
    assert [e["proxy"] for e in events] == ["http"]


def test_the_sandbox_cannot_change_its_ruleset(world: World) -> None:
    r, _ = _run(
        world,
        "sh",
        "-c",
        "nft flush ruleset 2>/dev/null; echo nft=$?; ip route del default 2>/dev/null; echo ip=$?",
    )
    assert "nft=0" not in r.stdout and "ip=0" not in r.stdout, r.stdout


def test_a_direct_connection_to_the_listener_is_not_a_diverted_one(world: World) -> None:
    # its conntrack entry names the listener itself: never taken for a target (with
    # 127.0.0.1 allowed, that would dial the host's own port 3129)
    script = (
        "import socket\n"
        "c = socket.create_connection(('127.0.0.1', 3129), timeout=5)\n"
        "c.sendall(b'GET / HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n')\n"
        "print(repr(c.recv(100)))\n"
    )
    r, events = _run(world, *CLEAN, "python3", "-c", script)
    assert events == [], events
    assert r.stdout.strip() in ("b''", "") or "Reset" in r.stderr, (r.stdout, r.stderr)


def test_a_ruleset_that_does_not_load_fails_the_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fail closed and loud: the program never runs without its ruleset
    import sandhold.policy.transparent as plan
    from sandhold.backends.linux.netns import spawn_in_netns

    monkeypatch.setattr(plan, "nft_ruleset", lambda *a, **k: "table inet sandhold { nonsense }\n")
    marker = tmp_path / "ran"
    got: list[object] = []
    with pytest.raises(OSError, match="nftables refused the sandbox's ruleset"):
        spawn_in_netns("/usr/bin/touch", ["touch", str(marker)], {}, [], transparent=got)
    assert not marker.exists() and got == []


def test_a_client_hello_split_over_records_is_refused(world: World, upstreams: Upstreams) -> None:
    # a ClientHello split over two TLS records could hide its SNI from a check of the
    # first one: not whole, refused, nothing dialled
    before = len(upstreams.seen.items)
    script = (
        "import socket, ssl, struct\n"
        "ctx = ssl.create_default_context()\n"
        "i, o = ssl.MemoryBIO(), ssl.MemoryBIO()\n"
        "obj = ctx.wrap_bio(i, o, server_hostname='web.t20.test')\n"
        "try:\n"
        "    obj.do_handshake()\n"
        "except ssl.SSLWantReadError:\n"
        "    pass\n"
        "hello = o.read()\n"
        "body = hello[5:]\n"
        "split = hello[:3] + struct.pack('!H', 40) + body[:40]\n"
        "split += hello[:3] + struct.pack('!H', len(body) - 40) + body[40:]\n"
        f"c = socket.create_connection(('web.t20.test', {upstreams.https}), timeout=5)\n"
        "c.sendall(split)\n"
        "print(c.recv(100).hex())\n"
    )
    r, events = _run(world, *CLEAN, "python3", "-c", script)
    assert r.stdout.strip() == "15030300020231", (r.stdout, r.stderr)  # access_denied
    assert len(upstreams.seen.items) == before
    assert [(e["rule"], e["allowed"]) for e in events] == [
        ("transparent: ClientHello not whole", False)
    ]


def test_a_namespace_without_ipv6_gets_the_ipv4_half(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandhold.backends.linux import netns

    monkeypatch.setattr(netns, "_has_ipv6_loopback", lambda: False)
    got: list[netns.TransparentSockets] = []
    pid, http, socks = netns.spawn_in_netns("/bin/true", ["true"], {}, [], transparent=got)
    try:
        assert os.waitpid(pid, 0)[1] == 0
        (sockets,) = got
        assert [s.getsockname()[:2] for s in sockets.tcp] == [("127.0.0.1", 3129)]
        assert [s.getsockname()[:2] for s in sockets.dns_udp] == [("127.0.0.1", 53)]
        assert [s.type for s in sockets.dns_tcp] == [socket.SOCK_STREAM]
        assert sockets.nflog.family == socket.AF_NETLINK
    finally:
        for sock in (http, socks, *(got[0].all() if got else ())):
            sock.close()


def test_a_datagram_flood_is_refused_and_its_reports_bounded(world: World) -> None:
    script = (
        "import socket, errno\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "refused = 0\n"
        "for i in range(3000):\n"
        "    try:\n"
        "        s.sendto(b'x', ('192.0.2.1', 1000 + i))\n"
        "    except PermissionError:\n"
        "        refused += 1\n"
        "print(refused)\n"
    )
    r, events = _run(world, *CLEAN, "python3", "-c", script)
    assert r.stdout.strip() == "3000", (r.stdout, r.stderr)
    udp = [e for e in events if e["proxy"] == "udp"]
    # every one refused; reported up to the per-second bound (the run takes well under 30 s)
    assert 100 <= len(udp) <= 100 * 30, len(udp)
    assert len(udp) < 3000
