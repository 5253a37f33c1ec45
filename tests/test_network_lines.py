"""Network refusals said by default, and the network off failing fast (issue 15),
through the real CLI as root and unprivileged."""

from __future__ import annotations

import shutil
import time

import pytest

from conftest import World


def _lines(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if x.startswith("sandhold:")]


CURL = ("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}\\n")


def test_a_refused_host_is_named_on_one_line(world: World) -> None:
    s = world.settings({"network": {"allowedDomains": ["allowed.example.com"]}})
    curl = "curl -s -o /dev/null -w '%{http_code}\\n'"
    script = f"{curl} http://evil.example.net/; {curl} http://evil.example.net/x"
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script)
    assert r.returncode == 0 and r.stdout == "403\n403\n", r.stderr
    assert _lines(r.stderr) == [
        "sandhold: network: refused evil.example.net:80 (not in allowedDomains); to allow it: "
        '"network": {"allowedDomains": ["evil.example.net"]} (-d lists every refusal)'
    ], r.stderr
    r = world.sandhold("-q", "-s", str(s), "--", *CURL, "http://evil.example.net/")
    assert r.stdout == "403\n" and r.stderr == "", r.stderr


def test_a_deny_listed_host_says_which_list(world: World) -> None:
    s = world.settings(
        {"network": {"allowedDomains": ["*.example.net"], "deniedDomains": ["evil.example.net"]}}
    )
    r = world.sandhold("-s", str(s), "--", *CURL, "http://evil.example.net/")
    (line,) = _lines(r.stderr)
    assert line.startswith("sandhold: network: refused evil.example.net:80 (deniedDomains: ")
    assert "network.deniedDomains entry refuses it" in line
    r = world.sandhold("-s", str(s), "--", *CURL, "http://169.254.169.254/")
    assert _lines(r.stderr) == [
        "sandhold: network: refused 169.254.169.254:80 (baseline deny: cloud metadata) "
        "(-d lists every refusal)"
    ]


def test_no_line_when_nothing_was_refused(world: World) -> None:
    s = world.settings({"network": {"allowedDomains": ["allowed.example.com"]}})
    r = world.sandhold("-s", str(s), "--", "true")
    assert r.returncode == 0 and r.stderr == ""


@pytest.mark.skipif(shutil.which("npx") is None, reason="npx is not installed")
def test_npx_with_the_network_off_fails_fast_and_says_why(world: World) -> None:
    """npm retried a failed fetch for about 70 s; with the network off it runs offline."""
    start = time.monotonic()
    r = world.sandhold("--", "npx", "-y", "some-mcp-server-not-cached", timeout=60)
    took = time.monotonic() - start
    assert r.returncode != 0
    assert took < 20, took
    assert "ENOTCACHED" in r.stderr, r.stderr


def test_explain_says_the_network_is_off_and_what_runs_offline(world: World) -> None:
    r = world.sandhold("--explain", "--", "true")
    assert r.returncode == 0
    assert "npm_config_offline=true" in r.stdout and "UV_OFFLINE=1" in r.stdout


# a query whose label holds a terminal escape (glibc would not send it), raw
RAW_QUERY = (
    "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5); "
    r's.sendto(b"\x12\x34\x01\x00\x00\x01" + bytes(6) + b"\x07bad\x1b[2J\x03com\x00"'
    r' + b"\x00\x01\x00\x01", ("127.0.0.1", 53)); print(s.recv(512)[3] & 15)'
)


def test_a_lookup_with_the_network_off_fails_at_once_and_is_named(world: World) -> None:
    """The resolver asks 127.0.0.1:53 in the sandbox's namespace, where sandhold
    answers REFUSED from the host side: glibc (getent), Python and dig fail at once,
    and one line names the hosts, the rule and the key to add; ``-q`` silences it."""
    lookups = (
        "getent hosts first.example.com; echo getent=$?; "
        "python3 -c 'import socket; socket.getaddrinfo(\"second.example.com\", 443)' "
        "2>/dev/null; echo python=$?; "
        "dig +tries=1 +time=5 third.example.com 2>/dev/null | grep -o 'status: [A-Z]*'; "
        f"python3 -c '{RAW_QUERY}'"
    )
    start = time.monotonic()
    r = world.sandhold("--", "sh", "-c", lookups)
    took = time.monotonic() - start
    assert took < 5, took
    assert r.stdout == "getent=2\npython=1\nstatus: REFUSED\n5\n", r.stdout + r.stderr
    (line,) = [x for x in _lines(r.stderr) if "DNS" in x]
    assert line == (
        "sandhold: network: refused DNS lookup of first.example.com, second.example.com, "
        "third.example.com and 1 more (the network is off: no network.allowedDomains); "
        'to allow it: "network": {"allowedDomains": ["first.example.com"]}'
    ), r.stderr
    assert "\033" not in r.stderr  # the sandbox's bytes reach the terminal escaped
    r = world.sandhold("-q", "--", "getent", "hosts", "first.example.com")
    assert r.returncode == 2 and r.stderr == "", r.stderr
    # nothing else answers there: the namespace still has no way out
    r = world.sandhold("--", *CURL, "--max-time", "5", "http://127.0.0.1:53/")
    assert r.stdout == "000\n" and "DNS" not in r.stderr


def test_the_lookup_server_answers_refused_names_and_ends_when_stopped() -> None:
    """``OfflineDns`` on a socket of the test's own (the sans-I/O reader is
    ``net/dns.py``'s, tested there): each query gets REFUSED with its id, a name is
    kept once and escaped, a broken message gets FORMERR or nothing, and ``stop``
    ends the thread, which closes the socket."""
    import _socket
    import socket
    import struct

    from sandhold.backends.linux.offline import OfflineDns

    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    server = OfflineDns(sock)
    server.start()

    def query(qid: int, *labels: bytes) -> bytes:
        name = b"".join(bytes([len(x)]) + x for x in labels) + b"\0"
        return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + name + b"\0\1\0\1"

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.settimeout(5)
        for qid, msg in enumerate(
            [
                query(1, b"A", b"example", b"com"),
                query(2, b"a", b"example", b"com"),
                query(3, b"bad\x1b[2J", b"com"),
                query(4, b"a.b", b"com"),  # a label with a dot: FORMERR
            ],
            start=1,
        ):
            client.sendto(msg, sock.getsockname())
            reply = client.recv(512)
            assert struct.unpack("!H", reply[:2])[0] == qid
            assert reply[3] & 0xF == (1 if qid == 4 else 5), (qid, reply)
        client.sendto(b"\x00\x01", sock.getsockname())  # too short: no answer at all
        with pytest.raises(TimeoutError):
            client.settimeout(0.2)
            client.recv(512)
    assert server.stop() == ["a.example.com", "bad\\x1b[2j.com"]  # lower case, as dns reads
    deadline = time.monotonic() + 5
    while sock.fileno() != -1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sock.fileno() == -1
