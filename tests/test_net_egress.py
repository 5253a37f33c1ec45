"""The session's HTTP and SOCKS5 proxies with real clients and real upstreams (F-NET-1...4, §9).

Clients are curl, urllib with a ProxyHandler, and raw HTTP/SOCKS5 by hand;
upstreams are plain HTTP, HTTPS with a self-signed certificate and raw TCP, all
on 127.0.0.1. Test names resolve through the session's injected resolver. The
policy allows ``127.0.0.1`` as an IP entry wherever a test name must reach a
loopback upstream, since the address guard refuses loopback otherwise; the
rebinding tests leave it out on purpose.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from conftest import World
from sandhold.net.budget import BudgetPlan, ConnectionBudget, plan_budget
from sandhold.net.egress import EgressSession
from sandhold.policy.domains import DomainPolicy
from test_net_support import (
    Proxy,
    TcpUpstream,
    client_context,
    closed_port,
    echo_then_bye,
    fd_count,
    http_connect,
    http_exchange,
    http_upstream,
    recv_all,
    server_context,
    socks_connect,
    split_response,
    tls_files,
)

__all__ = ["tls_files"]  # a fixture, imported for pytest

LOOP = ["127.0.0.1"]
NAMES = {"allowed.test": LOOP, "www.allowed.test": LOOP, "other.test": LOOP}
ALLOWED = DomainPolicy.for_cli(["allowed.test", "*.allowed.test", "127.0.0.1"])
CURL = ["curl", "-sS", "--max-time", "10", "--noproxy", ""]


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CURL, *args], capture_output=True, text=True, timeout=30, check=False)


# --- allowed traffic passes, with every client ------------------------------------------


def test_plain_http_is_forwarded_in_origin_form_without_proxy_headers() -> None:  # F-NET-1
    with http_upstream() as port, Proxy(ALLOWED, NAMES) as px:
        r = curl(
            "-x", px.http_url, "--proxy-user", "u:secret",
            "-H", "Connection: X-Hop", "-H", "X-Hop: 1", "-H", "X-Kept: 2",
            f"http://Allowed.Test:{port}/path?q=1",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        seen = json.loads(r.stdout)
        names = {k.lower(): v for k, v in seen["headers"]}
        assert seen["path"] == "/path?q=1"  # origin form
        assert names["host"] == f"Allowed.Test:{port}"
        assert names["connection"] == "close"
        assert names["x-kept"] == "2"
        for hop in ("proxy-authorization", "proxy-connection", "x-hop", "keep-alive"):
            assert hop not in names, seen
        assert [d.allowed for d in px.decisions] == [True]


def test_post_body_reaches_the_origin_unchanged() -> None:
    with http_upstream() as port, Proxy(ALLOWED, NAMES) as px:
        r = curl("-x", px.http_url, "--data-binary", "a=1&b=\u00e9", f"http://allowed.test:{port}/")
        assert r.returncode == 0, r.stderr
        seen = json.loads(r.stdout)
        assert seen["method"] == "POST"
        assert seen["body"].encode("latin-1").decode() == "a=1&b=\u00e9"


def test_https_through_connect_with_curl(tls_files: tuple[Path, Path]) -> None:  # F-NET-1
    with http_upstream(server_context(tls_files)) as port, Proxy(ALLOWED, NAMES) as px:
        r = curl("--cacert", str(tls_files[0]), "-x", px.http_url,
                 f"https://www.allowed.test:{port}/tls")  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["path"] == "/tls"
        assert px.decisions[0].target == f"www.allowed.test:{port}"


def test_plain_http_through_a_connect_tunnel_with_curl() -> None:
    with http_upstream() as port, Proxy(ALLOWED, NAMES) as px:
        r = curl("--proxytunnel", "-x", px.http_url, f"http://allowed.test:{port}/tunnelled")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["path"] == "/tunnelled"


def test_socks5_hostname_with_curl(tls_files: tuple[Path, Path]) -> None:
    with (
        http_upstream() as port,
        http_upstream(server_context(tls_files)) as tls_port,
        Proxy(ALLOWED, NAMES) as px,
    ):
        proxy = f"127.0.0.1:{px.socks_port}"
        r = curl("--socks5-hostname", proxy, f"http://allowed.test:{port}/socks")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["path"] == "/socks"
        r = curl("--socks5-hostname", proxy, "--cacert", str(tls_files[0]),
                 f"https://allowed.test:{tls_port}/socks-tls")  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert [d.proxy for d in px.decisions] == ["socks5", "socks5"]


def test_urllib_with_a_proxy_handler(tls_files: tuple[Path, Path]) -> None:
    with (
        http_upstream() as port,
        http_upstream(server_context(tls_files)) as tls_port,
        Proxy(ALLOWED, NAMES) as px,
    ):
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({"http": px.http_url, "https": px.http_url}),
            urllib.request.HTTPSHandler(context=client_context(tls_files)),
        )
        with opener.open(f"http://allowed.test:{port}/urllib", timeout=10) as resp:
            assert json.loads(resp.read())["path"] == "/urllib"
        with opener.open(f"https://allowed.test:{tls_port}/urllib-tls", timeout=10) as resp:
            assert json.loads(resp.read())["path"] == "/urllib-tls"
        with pytest.raises(urllib.error.HTTPError) as refused:
            opener.open(f"http://denied.test:{port}/", timeout=10)
        assert refused.value.code == 403
        assert "denied.test" in refused.value.headers["X-Proxy-Error"]


@pytest.mark.parametrize("via", ["connect", "socks5"])
def test_half_close_passes_through_the_tunnel(via: str) -> None:
    with TcpUpstream(echo_then_bye) as up, Proxy(ALLOWED, NAMES) as px:
        if via == "connect":
            s, status, _ = http_connect(px.http_port, f"allowed.test:{up.port}")
            assert status == 200
        else:
            s, code = socks_connect(px.socks_port, "allowed.test", up.port)
            assert code == 0
        with s:
            s.sendall(b"ping " * 1000)
            s.shutdown(socket.SHUT_WR)  # our EOF must reach the upstream...
            assert recv_all(s) == b"ping " * 1000 + b"bye"  # ...and its answer come back


def test_bytes_sent_with_the_connect_head_reach_the_upstream() -> None:
    with TcpUpstream(echo_then_bye) as up, Proxy(ALLOWED, NAMES) as px:
        with socket.create_connection(("127.0.0.1", px.http_port), timeout=10) as s:
            target = f"allowed.test:{up.port}".encode()
            s.sendall(b"CONNECT " + target + b" HTTP/1.1\r\nHost: x\r\n\r\nearly bytes")
            s.shutdown(socket.SHUT_WR)
            status, _, rest = split_response(recv_all(s))
        assert status == 200 and rest == b"early bytes" + b"bye"


# --- refusals: the documented answers (F-NET-4) ------------------------------------------


def test_refused_plain_http_gets_403_naming_host_and_rule() -> None:
    with http_upstream() as port, Proxy(ALLOWED, NAMES) as px:
        status, headers, body = http_exchange(
            px.http_port, f"GET http://other.test:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        )
        assert status == 403
        assert headers["x-proxy-error"] == (
            f"blocked-by-sandbox-policy; host=other.test:{port}; rule=not in allowedDomains"
        )
        assert b"other.test" in body and b"not in allowedDomains" in body
        assert px.resolved == []  # refused before any resolution


def test_refused_connect_gets_403_and_curl_fails() -> None:
    with Proxy(ALLOWED, NAMES) as px:
        s, status, head = http_connect(px.http_port, "other.test:443")
        s.close()
        assert status == 403 and b"X-Proxy-Error: blocked-by-sandbox-policy" in head
        r = curl("-x", px.http_url, "https://other.test/")
        assert r.returncode != 0 and "403" in r.stderr


def test_refused_socks5_gets_reply_0x02() -> None:
    with Proxy(ALLOWED, NAMES) as px:
        s, code = socks_connect(px.socks_port, "other.test", 443)
        assert code == 0x02 and s.recv(1) == b""
        s.close()
        r = curl("--socks5-hostname", f"127.0.0.1:{px.socks_port}", "http://other.test/")
        assert r.returncode == 97  # curl: proxy handshake error
        assert [(d.allowed, d.proxy) for d in px.decisions] == [(False, "socks5")] * 2


METADATA_SPELLINGS = [
    "169.254.169.254",
    "2852039166",
    "0xA9FEA9FE",
    "0xa9.0xfe.0xa9.0xfe",
    "0251.0376.0251.0376",
    "169.254.43518",
    "169.16689662",
    "[::ffff:169.254.169.254]",
    "[::ffff:a9fe:a9fe]",
    "[64:ff9b::a9fe:a9fe]",
    "169.254.169.254.",
    "METADATA.GOOGLE.INTERNAL",
    "metadata.google.internal.",
    "\uff4d\uff45\uff54\uff41\uff44\uff41\uff54\uff41.google.internal",  # fullwidth
    "metadata\u3002google\u3002internal",  # ideographic full stops
]


def _authority(host: str, port: int) -> str:
    return f"{host}:{port}"


@pytest.mark.parametrize("spelling", METADATA_SPELLINGS)
def test_every_spelling_of_the_metadata_endpoint_is_refused(spelling: str) -> None:
    """Even with allowAllDomains, through the HTTP proxy (both forms) and SOCKS5.

    HTTP request lines are ASCII: a Unicode spelling there is a malformed head
    (400) before it is a host; SOCKS5 carries it as UTF-8 to the policy (0x02).
    """
    expected = 403 if spelling.isascii() else 400
    open_policy = DomainPolicy.for_cli([], allow_all=True)
    with Proxy(open_policy, {}) as px:
        target = _authority(spelling, 80)
        s, status, head = http_connect(px.http_port, target)
        s.close()
        assert status == expected, head
        raw = f"GET http://{target}/latest/meta-data/ HTTP/1.1\r\nHost: x\r\n\r\n"
        status, headers, _ = http_exchange(px.http_port, raw.encode("utf-8"))
        assert status == expected
        if expected == 403:
            assert "baseline deny: cloud metadata" in headers["x-proxy-error"]
        s, code = socks_connect(px.socks_port, spelling.strip("[]"), 80)
        s.close()
        assert code == 0x02
        assert px.resolved == []
        assert all(not d.allowed and d.rule.startswith("baseline deny") for d in px.decisions)
        assert len(px.decisions) == (3 if expected == 403 else 1)


@pytest.mark.parametrize(
    ("spelling", "atyp"),
    [("169.254.169.254", 1), ("::ffff:169.254.169.254", 4), ("fd00:ec2::254", 4)],
)
def test_socks5_address_types_cannot_reach_metadata(spelling: str, atyp: int) -> None:
    with Proxy(DomainPolicy.for_cli([], allow_all=True), {}) as px:
        s, code = socks_connect(px.socks_port, spelling, 80, atyp=atyp)
        s.close()
        assert code == 0x02


@pytest.mark.parametrize(
    "spelling",
    [
        "evil.example.com",
        "EVIL.Example.COM.",
        "sub.evil.example.com",
        "b\u00fccher.example.com",
        "XN--BCHER-KVA.example.com",
        "B\u00dcCHER.example.com",
    ],
)
def test_every_spelling_of_a_denied_name_is_refused(spelling: str) -> None:
    policy = DomainPolicy.for_cli(
        ["*.example.com"], ["evil.example.com", "*.evil.example.com", "b\u00fccher.example.com"]
    )
    with Proxy(policy, {}) as px:
        s, status, _ = http_connect(px.http_port, f"{spelling}:443")
        s.close()
        assert status == (403 if spelling.isascii() else 400)  # request lines are ASCII
        s, code = socks_connect(px.socks_port, spelling, 443)
        s.close()
        assert code == 0x02
        assert all(d.rule.startswith("deniedDomains") for d in px.decisions), px.decisions


def test_ip_literals_match_only_ip_entries() -> None:  # F-NET-2
    with TcpUpstream(echo_then_bye) as up:
        names_only = DomainPolicy.for_cli(["allowed.test"])
        with Proxy(names_only, NAMES) as px:
            s, status, _ = http_connect(px.http_port, f"127.0.0.1:{up.port}")
            s.close()
            assert status == 403  # allowed.test resolves there, but a literal needs an IP entry
        ip_only = DomainPolicy.for_cli(["127.0.0.1"])
        with Proxy(ip_only, {"localhost.test": LOOP}) as px:
            s, status, _ = http_connect(px.http_port, f"localhost.test:{up.port}")
            s.close()
            assert status == 403  # a name is not an IP entry's business
            for spelling in ("127.0.0.1", "2130706433", "0x7f.1", "127.1", "[::ffff:127.0.0.1]"):
                s, status, _ = http_connect(px.http_port, f"{spelling}:{up.port}")
                with s:
                    assert status == 200, spelling
                    s.shutdown(socket.SHUT_WR)
                    assert recv_all(s) == b"bye"
            assert px.resolved == []  # literals are dialled, never resolved
            assert {d.target for d in px.decisions if d.allowed} == {f"127.0.0.1:{up.port}"}


@pytest.mark.parametrize(
    ("addresses", "rule"),
    [
        (["127.0.0.1"], "resolved address guard: loopback"),
        (["127.0.0.53"], "resolved address guard: loopback"),
        (["::1"], "resolved address guard: loopback"),
        (["169.254.169.254"], "baseline deny: cloud metadata"),
        (["::ffff:169.254.169.254"], "baseline deny: cloud metadata"),
        (["169.254.1.1"], "resolved address guard: link-local"),
        (["10.9.9.9"], "resolved address guard: host's own address"),
        (["198.51.100.7", "127.0.0.1"], "resolved address guard: loopback"),
        (["0.0.0.0"], "resolved address guard: unspecified"),
        (["not-an-address"], "resolved address guard: unreadable address"),
    ],
)
def test_rebinding_an_allowed_name_is_refused(addresses: list[str], rule: str) -> None:
    with TcpUpstream(echo_then_bye) as up:
        policy = DomainPolicy.for_cli(["rebind.test"])
        with Proxy(policy, {"rebind.test": addresses}, host_addresses=["10.9.9.9"]) as px:
            s, status, head = http_connect(px.http_port, f"rebind.test:{up.port}")
            s.close()
            assert status == 403 and f"rule={rule}".encode() in head, head
            s, code = socks_connect(px.socks_port, "rebind.test", up.port)
            s.close()
            assert code == 0x02
            assert [d.rule for d in px.decisions] == [rule, rule]
        assert up.accepted == 0  # nothing was dialled


def test_host_addresses_are_discovered_when_not_given() -> None:
    own = [a for a in _own_addresses() if not a.startswith(("127.", "::1", "fe80"))]
    if not own:
        pytest.skip("this host has no non-loopback address")
    with Proxy(
        DomainPolicy.for_cli(["rebind.test"]), {"rebind.test": own[:1]}, discover=True
    ) as px:
        s, status, head = http_connect(px.http_port, "rebind.test:80")
        s.close()
        assert status == 403 and b"host's own address" in head


@pytest.mark.skipif(os.geteuid() != 0, reason="adding an address to lo needs root (CI is root)")
def test_an_address_the_host_gains_during_a_session_is_guarded() -> None:
    """A VPN, a container bridge or a new lease adds an address while a session runs:
    the guard reads the host's addresses at each connection, not once at start."""
    late = "198.51.100.77"
    # a leftover from an interrupted run would make the first connection refused
    subprocess.run(
        ["ip", "addr", "del", f"{late}/32", "dev", "lo"], check=False, capture_output=True
    )
    with Proxy(DomainPolicy.for_cli(["late.test"]), {"late.test": [late]}, discover=True) as px:
        s, status, head = http_connect(px.http_port, "late.test:9")
        s.close()
        assert status in (200, 502), head  # allowed (whether anything answers or not)
        subprocess.run(["ip", "addr", "add", f"{late}/32", "dev", "lo"], check=True)
        try:
            s, status, head = http_connect(px.http_port, "late.test:9")
            s.close()
        finally:
            subprocess.run(["ip", "addr", "del", f"{late}/32", "dev", "lo"], check=True)
        assert status == 403 and b"host's own address" in head, head


def _own_addresses() -> list[str]:
    from sandhold.net.outbound import discover_host_addresses

    return list(discover_host_addresses())


# --- failures after an allowed decision ----------------------------------------------------


def test_dial_failure_gets_502_and_socks_connection_refused() -> None:
    port = closed_port()
    with Proxy(ALLOWED, NAMES) as px:
        s, status, head = http_connect(px.http_port, f"allowed.test:{port}")
        s.close()
        assert status == 502 and b"X-Proxy-Error: upstream-unreachable" in head
        status, _, _ = http_exchange(
            px.http_port, f"GET http://allowed.test:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        )
        assert status == 502
        s, code = socks_connect(px.socks_port, "allowed.test", port)
        s.close()
        assert code == 0x05
        assert all(d.allowed for d in px.decisions)  # allowed, then failed to connect


def test_names_that_do_not_resolve_get_502_and_socks_host_unreachable() -> None:
    policy = DomainPolicy.for_cli(["*.allowed.test"])
    with Proxy(policy, {}) as px:
        s, status, head = http_connect(px.http_port, "nowhere.allowed.test:443")
        s.close()
        assert status == 502 and b"cannot resolve" in head
        s, code = socks_connect(px.socks_port, "nowhere.allowed.test", 443)
        s.close()
        assert code == 0x04


def test_a_resolver_that_hangs_is_cut_by_its_deadline() -> None:
    async def never(host: str, port: int) -> list[str]:
        await asyncio.sleep(3600)
        return []

    with Proxy(ALLOWED, resolver=never, resolve_timeout=0.2) as px:
        started = time.monotonic()
        s, status, _ = http_connect(px.http_port, "allowed.test:443")
        s.close()
        assert status == 502 and time.monotonic() - started < 2


# --- live policy, decisions ---------------------------------------------------------------


def test_a_new_policy_applies_from_the_next_connection() -> None:  # F-CTL-1 effect
    with http_upstream() as port, Proxy(DomainPolicy.for_cli(["127.0.0.1"]), NAMES) as px:
        url = f"http://allowed.test:{port}/flip"
        r = curl("-o", "/dev/null", "-w", "%{http_code}", "-x", px.http_url, url)
        assert r.stdout == "403"
        s, status, _ = http_connect(px.http_port, f"allowed.test:{port}")  # held open
        assert status == 403
        s.close()
        px.policy = ALLOWED
        r = curl("-o", "/dev/null", "-w", "%{http_code}", "-x", px.http_url, url)
        assert r.stdout == "200"
        px.policy = DomainPolicy.for_cli([])
        r = curl("-o", "/dev/null", "-w", "%{http_code}", "-x", px.http_url, url)
        assert r.stdout == "403"


def test_a_policy_callable_that_raises_refuses() -> None:
    with Proxy(ALLOWED, NAMES) as px:
        px.session._dialer._policy = lambda: 1 / 0  # type: ignore[union-attr]
        s, status, head = http_connect(px.http_port, "allowed.test:443")
        s.close()
        assert status == 403 and b"rule=policy unavailable" in head


def test_every_decision_is_reported_once() -> None:
    with TcpUpstream(echo_then_bye) as up, Proxy(ALLOWED, NAMES) as px:
        for target in (f"allowed.test:{up.port}", "other.test:443", "[2001:db8::1]:443"):
            s, _, _ = http_connect(px.http_port, target)
            s.close()
        s, _ = socks_connect(px.socks_port, "www.allowed.test", up.port)
        s.close()
        s, _ = socks_connect(px.socks_port, "0x7f000001", up.port)
        s.close()
        http_exchange(px.http_port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # no target: no decision
        deadline = time.monotonic() + 5
        while len(px.decisions) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert {d.action for d in px.decisions} == {"network-outbound"}
        got = [(d.target, d.allowed, d.rule, d.proxy) for d in px.decisions]
        p = up.port
        assert got == [
            (f"allowed.test:{p}", True, "allowedDomains: allowed.test", "http"),
            ("other.test:443", False, "not in allowedDomains", "http"),
            ("[2001:db8::1]:443", False, "not in allowedDomains", "http"),
            (f"www.allowed.test:{p}", True, "allowedDomains: *.allowed.test", "socks5"),
            (f"127.0.0.1:{p}", True, "allowedDomains: 127.0.0.1", "socks5"),
        ]
        assert all(d.reason for d in px.decisions)


def test_a_failing_decision_callback_does_not_change_the_outcome() -> None:
    with TcpUpstream(echo_then_bye) as up, Proxy(ALLOWED, NAMES) as px:

        def explode(_record: object) -> None:
            raise RuntimeError("logger down")

        px.session._dialer._on_decision = explode  # type: ignore[union-attr]
        s, status, _ = http_connect(px.http_port, f"allowed.test:{up.port}")
        s.close()
        assert status == 200
        s, status, _ = http_connect(px.http_port, "other.test:443")
        s.close()
        assert status == 403


# --- malformed input costs bounded memory and time ------------------------------------------


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", 400),  # origin form: not a proxy request
        (b"GET https://allowed.test/ HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"CONNECT allowed.test HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
        (b"GET http://allowed.test/ HTTP/1.1\r\nTransfer-Encoding: gzip\r\nHost: a\r\n\r\n", 501),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(200) + b"\r\n\r\n", 400),
        (b"\x05\x01\x00\r\n\r\n", 400),
        (b"GET http://a b/ HTTP/1.1\r\n\r\n", 400),
    ],
)
def test_malformed_heads_get_an_error_status(raw: bytes, status: int) -> None:
    with Proxy(ALLOWED, NAMES) as px:
        got, headers, _ = http_exchange(px.http_port, raw)
        assert got == status and headers["x-proxy-error"].startswith("bad-request")
        assert px.decisions == [] and px.resolved == []


def test_a_huge_head_gets_431_without_being_read_to_the_end() -> None:
    with (
        Proxy(ALLOWED, NAMES, max_head_bytes=8192) as px,
        socket.create_connection(("127.0.0.1", px.http_port), timeout=10) as s,
    ):
        s.sendall(b"GET http://allowed.test/ HTTP/1.1\r\nX-Big: ")
        sent = 0
        s.settimeout(2)
        try:
            while sent < 64 * 1024 * 1024:  # the proxy stops reading long before this
                s.sendall(b"a" * 65536)
                sent += 65536
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            pass
        assert sent < 16 * 1024 * 1024
        s.settimeout(10)
        status, _, _ = split_response(recv_all(s))
        assert status in (431, 0)  # 0: the answer was lost to our own unread data


def test_a_huge_head_sent_in_one_go_gets_431() -> None:
    with Proxy(ALLOWED, NAMES, max_head_bytes=8192) as px:
        raw = b"GET http://allowed.test/ HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
        status, _, _ = http_exchange(px.http_port, raw)
        assert status == 431


def test_slowloris_is_cut_at_the_head_deadline() -> None:
    with Proxy(ALLOWED, NAMES, head_timeout=0.5) as px:
        with socket.create_connection(("127.0.0.1", px.http_port), timeout=10) as s:
            started = time.monotonic()
            s.sendall(b"GET http://allowed.test/ HTTP/1.1\r\n")
            answer = b""
            for _ in range(40):
                try:
                    s.sendall(b"X: y\r\n")
                except OSError:
                    break
                s.settimeout(0.1)
                try:
                    answer = s.recv(4096)
                    break
                except TimeoutError:
                    continue
            elapsed = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert 0.4 < elapsed < 2.0


def test_socks_slowloris_is_cut_at_the_deadline() -> None:
    with (
        Proxy(ALLOWED, NAMES, head_timeout=0.3) as px,
        socket.create_connection(("127.0.0.1", px.socks_port), timeout=5) as s,
    ):
        s.sendall(b"\x05\x01\x00")
        assert s.recv(2) == b"\x05\x00"
        s.sendall(b"\x05\x01")  # and then nothing
        started = time.monotonic()
        assert s.recv(10) == b"\x05\x01\x00\x01" + bytes(6)  # general failure
        assert s.recv(1) == b""
        assert time.monotonic() - started < 2


@pytest.mark.parametrize(
    ("raw", "answer"),
    [
        (b"\x04\x01\x00\x50\x7f\x00\x00\x01\x00", b"\x00\x5b"),  # SOCKS4: rejected in SOCKS4
        (b"\x05\x00", b"\x05\xff"),  # no methods
        (b"\x05\x01\x02", b"\x05\xff"),  # user/password only
        (b"GET / HTTP/1.1\r\n\r\n", b"\x05\xff"),
        (b"\x05\x01\x00\x05\x02\x00\x01\x7f\x00\x00\x01\x00\x50", b"\x05\x00\x05\x07"),  # BIND
        (b"\x05\x01\x00\x05\x03\x00\x01\x7f\x00\x00\x01\x00\x50", b"\x05\x00\x05\x07"),  # UDP
        (b"\x05\x01\x00\x05\x01\x00\x05", b"\x05\x00\x05\x08"),  # address type 5
        (b"\x05\x01\x00\x05\x01\x00\x03\x00", b"\x05\x00\x05\x01"),  # empty name
        (b"\x05\x01\x00\x04\x01\x00\x01", b"\x05\x00\x05\x01"),  # bad request version
    ],
)
def test_bad_socks_input_gets_an_error_and_a_close(raw: bytes, answer: bytes) -> None:
    with Proxy(ALLOWED, NAMES) as px:
        with socket.create_connection(("127.0.0.1", px.socks_port), timeout=5) as s:
            s.sendall(raw)
            got = recv_all(s)
        assert got.startswith(answer), got
        assert px.decisions == []


def test_random_bytes_are_answered_and_closed() -> None:
    import random

    rng = random.Random(7)
    with Proxy(ALLOWED, NAMES, head_timeout=0.5) as px:
        for _ in range(20):
            junk = rng.randbytes(rng.randrange(1, 5000))
            for port in (px.http_port, px.socks_port):
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(junk)
                    s.shutdown(socket.SHUT_WR)
                    recv_all(s)  # returns: the proxy answered and closed
        assert px.session is not None and not px.session.closed
        assert px.decisions == []


def test_connections_beyond_the_cap_wait_in_the_backlog() -> None:
    with TcpUpstream(echo_then_bye) as up, Proxy(ALLOWED, NAMES, max_connections=2) as px:
        idle = [socket.create_connection(("127.0.0.1", px.http_port)) for _ in range(2)]
        time.sleep(0.2)
        third = socket.create_connection(("127.0.0.1", px.http_port), timeout=10)
        third.sendall(f"CONNECT allowed.test:{up.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        third.settimeout(0.3)
        with pytest.raises(TimeoutError):
            third.recv(1)
        idle[0].close()  # a slot frees up
        third.settimeout(10)
        assert third.recv(12) == b"HTTP/1.1 200"
        third.close()
        idle[1].close()


def _reset_at_once(port: int) -> bool:
    """Whether the proxy resets a new connection instead of serving it (on loopback
    the reset may even beat ``connect`` back to the caller)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"CONNECT allowed.test:1 HTTP/1.1\r\nHost: x\r\n\r\n")
            return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def test_a_session_over_its_budget_has_its_own_connections_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two sessions share one process's slots (``net.budget``): one holding its whole
    share is refused at once (a reset, not a hang), once in the log however often;
    the other is served up to its fair share (half the slots here), an idle
    connection of the first reclaimed for it, then refused while every slot is taken."""
    budget = ConnectionBudget(BudgetPlan(limit=100, reserve=86, slots=4, per_session=3))
    threads = threading.active_count()
    with (
        TcpUpstream(echo_then_bye) as up,
        Proxy(ALLOWED, NAMES, budget=budget.session(), label="sandbox a") as a,
        Proxy(ALLOWED, NAMES, budget=budget.session(), label="sandbox b") as b,
    ):
        held = [socket.create_connection(("127.0.0.1", a.http_port)) for _ in range(3)]
        time.sleep(0.2)
        assert all(_reset_at_once(a.http_port) for _ in range(5))
        assert _reset_at_once(a.socks_port)
        s, status, _ = http_connect(b.http_port, f"allowed.test:{up.port}")  # b: served
        assert status == 200
        # b is under its fair share (2 of 4): one of a's idle connections is reclaimed
        s2, status, _ = http_connect(b.http_port, f"allowed.test:{up.port}")
        assert status == 200
        for h in held:
            h.settimeout(0.5)
        assert sum(_closed_by_proxy(h) for h in held) == 1
        assert _reset_at_once(b.http_port)  # b holds its fair share, and every slot is taken
        s.close()
        s2.close()
        time.sleep(0.2)
        s, status, _ = http_connect(a.http_port, f"allowed.test:{up.port}")
        assert status == 200
        s.close()
        for h in held:
            h.close()
    deadline = time.monotonic() + 5  # the upstream's threads close their ends: let them
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.01)
    lines = [r.getMessage() for r in caplog.records if "refusing new connections" in r.message]
    assert len(lines) == 2, lines  # one per session, not one per refusal
    assert lines[0].startswith("egress (sandbox a): refusing new connections: this sandbox")
    assert "all taken" in lines[1] and lines[1].startswith("egress (sandbox b)")
    assert budget.used == 0


def _closed_by_proxy(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


class _OutOfFds(socket.socket):
    """A listener whose ``accept`` always fails as a process out of fds does."""

    calls = 0

    def accept(self) -> tuple[socket.socket, object]:
        self.calls += 1
        raise OSError(errno.EMFILE, "Too many open files")


def test_accepting_without_fds_neither_spins_nor_floods_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    px = Proxy(ALLOWED, NAMES)
    px.http_listener = _OutOfFds(fileno=px.http_listener.detach())
    with px, socket.create_connection(("127.0.0.1", px.http_port)):  # waits in the backlog
        time.sleep(1.0)
        calls = px.http_listener.calls
    assert 3 <= calls <= 15, calls  # a try every 100 ms, no busy loop
    lines = [r for r in caplog.records if "cannot accept" in r.message]
    assert len(lines) == 1, [r.message for r in lines]


def test_the_budget_splits_the_fd_limit() -> None:
    """A quarter of the limit (at least 128) is never spent on connections; a session
    holds at most a quarter of the slots, 8 to 4096 of them, never more than exist."""
    rows = [
        # limit, reserve, slots, per_session
        # (six fds a connection: two sockets, and a pipe pair each way)
        (1 << 20, 1 << 18, 131072, 4096),
        (20000, 5000, 2500, 625),
        (1024, 256, 128, 32),
        (512, 128, 64, 16),
        (200, 128, 12, 8),
        (160, 128, 5, 5),
        (100, 100, 0, 0),
    ]
    for limit, reserve, slots, per_session in rows:
        assert plan_budget(limit) == BudgetPlan(limit, reserve, slots, per_session), limit
    account = ConnectionBudget(plan_budget(160)).session()
    assert [account.take() for _ in range(5)] == [None] * 5
    assert "holds 5 proxy connections" in str(account.take())
    account.give()
    assert account.take() is None


# --- lifecycle: closing cuts the network, and leaves nothing behind ----------------------------


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_closing_the_session_closes_both_listeners_even_with_a_copy_elsewhere() -> None:
    px = Proxy(ALLOWED, NAMES)
    copy = px.http_listener.dup()  # like the helper process that created it in the netns
    with px:
        pass
    assert _refused(px.http_port) and _refused(px.socks_port)
    assert px.session is not None and px.session.closed and px.session.failure is None
    copy.close()


def test_a_failing_accept_loop_cuts_the_network_and_ends_the_session() -> None:
    with Proxy(ALLOWED, NAMES) as px:
        assert px.session is not None
        copy = px.socks_listener.dup()
        copy.shutdown(socket.SHUT_RDWR)  # the listener breaks under the session
        copy.close()
        px.call(asyncio.wait_for(px.session.wait_closed(), 5))
        assert isinstance(px.session.failure, OSError)
        assert _refused(px.http_port) and _refused(px.socks_port)


def test_tunnels_are_aborted_when_the_session_closes() -> None:
    with TcpUpstream(echo_then_bye) as up:
        px = Proxy(ALLOWED, NAMES)
        with px:
            s, status, _ = http_connect(px.http_port, f"allowed.test:{up.port}")
            assert status == 200
            s.sendall(b"x")
            assert s.recv(1) == b"x"
        # the session is gone: the client sees a reset, never a clean end
        with pytest.raises(ConnectionResetError):
            s.recv(1)
        s.close()


@pytest.mark.parametrize("phase", ["idle", "head", "resolving", "relaying", "answering"])
def test_cancelling_the_session_task_leaves_no_fd_behind(phase: str) -> None:
    """Cancel the task running ``async with session`` while a connection is in ``phase``."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        release = asyncio.Event()

        async def resolver(host: str, port: int) -> list[str]:
            if host == "slow.allowed.test":
                await release.wait()
            return ["127.0.0.1"]

        up = socket.create_server(("127.0.0.1", 0))
        up.setblocking(False)
        http_l = socket.create_server(("127.0.0.1", 0))
        socks_l = socket.create_server(("127.0.0.1", 0))
        http_port = http_l.getsockname()[1]
        ready = asyncio.Event()

        async def run_session() -> None:
            async with EgressSession(
                http_listener=http_l,
                socks_listener=socks_l,
                policy=lambda: ALLOWED,
                resolver=resolver,
                host_addresses=(),
            ):
                ready.set()
                await asyncio.sleep(3600)

        task = loop.create_task(run_session())
        await ready.wait()
        client = socket.socket()
        client.setblocking(False)
        await loop.sock_connect(client, ("127.0.0.1", http_port))
        up_conn = None
        if phase == "head":
            await loop.sock_sendall(client, b"CONNECT allowed.test:1 HTTP/1.1\r\n")
        elif phase == "resolving":
            await loop.sock_sendall(
                client, b"CONNECT slow.allowed.test:1 HTTP/1.1\r\nHost: x\r\n\r\n"
            )
        elif phase == "relaying":
            port = up.getsockname()[1]
            await loop.sock_sendall(
                client, f"CONNECT allowed.test:{port} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            )
            up_conn, _ = await loop.sock_accept(up)
            assert (await loop.sock_recv(client, 100)).startswith(b"HTTP/1.1 200")
        elif phase == "answering":
            await loop.sock_sendall(client, b"CONNECT other.test:1 HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await loop.sock_recv(client, 100)).startswith(b"HTTP/1.1 403")
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for s in (client, up, up_conn):
            if s is not None:
                s.close()

    before = fd_count()
    asyncio.run(scenario())
    assert fd_count() == before


def test_aclose_is_idempotent_and_concurrent_closes_wait() -> None:
    async def scenario() -> None:
        session = EgressSession(
            http_listener=socket.create_server(("127.0.0.1", 0)),
            socks_listener=socket.create_server(("127.0.0.1", 0)),
            policy=lambda: ALLOWED,
            host_addresses=(),
        )
        session.start()
        await asyncio.gather(session.aclose(), session.aclose())
        await session.aclose()
        assert session.closed
        with pytest.raises(RuntimeError):
            session.start()

    asyncio.run(scenario())


def test_a_session_closed_before_it_started_closes_its_listeners() -> None:
    http_l = socket.create_server(("127.0.0.1", 0))
    port = http_l.getsockname()[1]
    session = EgressSession(
        http_listener=http_l,
        socks_listener=socket.create_server(("127.0.0.1", 0)),
        policy=lambda: ALLOWED,
    )
    asyncio.run(session.aclose())
    assert _refused(port) and http_l.fileno() == -1


def test_listeners_must_be_listening_stream_sockets() -> None:
    bound = socket.socket()
    bound.bind(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    good = socket.create_server(("127.0.0.1", 0))
    for bad in (bound, udp):
        with pytest.raises(ValueError, match="listener"):
            EgressSession(http_listener=bad, socks_listener=good, policy=lambda: ALLOWED)
    for s in (bound, udp, good):
        s.close()


def test_the_public_names_of_egress_are_pinned() -> None:
    from sandhold.net import egress

    assert sorted(egress.__all__) == [
        "EgressDecision",
        "EgressSession",
        "discover_host_addresses",
        "system_resolver",
    ]


def test_an_address_once_seen_stays_guarded_when_a_later_read_fails() -> None:
    """Reading the host's addresses can fail (out of fds) or miss one: what was seen
    before stays guarded."""
    from sandhold.net.errors import Refused
    from sandhold.net.outbound import Dialer

    reads = [("10.9.9.9",), ()]  # then the read finds nothing

    async def resolver(host: str, port: int) -> list[str]:
        return ["10.9.9.9"]

    dialer = Dialer(
        lambda: DomainPolicy.for_cli(["rebind.test"]),
        resolver,
        lambda: reads.pop(0) if reads else (),
        None,
        resolve_timeout=1,
        connect_timeout=1,
    )

    async def attempt() -> str:
        try:
            await dialer.dial("rebind.test", 80, "http")
        except Refused as exc:
            return exc.decision.rule
        return "dialled"

    assert asyncio.run(attempt()) == "resolved address guard: host's own address"
    assert asyncio.run(attempt()) == "resolved address guard: host's own address"


@pytest.mark.parametrize("answer_after", [0.1, None])
def test_a_refusal_is_answered_once_the_sink_has_looked_and_never_waits_long(
    answer_after: float | None,
) -> None:
    """``on_decision`` may return an awaitable (the port looks, off the loop, at who
    holds the connection): the refusal waits for it, at most ``report_wait``, and a
    client that gave up waiting does not cancel it."""
    from sandhold.net.errors import Refused
    from sandhold.net.outbound import Dialer

    async def scenario() -> tuple[float, bool]:
        loop = asyncio.get_running_loop()
        looked: asyncio.Future[None] = loop.create_future()
        if answer_after is not None:
            loop.call_later(answer_after, looked.set_result, None)

        async def no_resolver(host: str, port: int) -> list[str]:
            raise AssertionError("a refusal is never resolved")

        dialer = Dialer(
            lambda: ALLOWED,
            no_resolver,
            (),
            lambda decision: looked,
            resolve_timeout=1,
            connect_timeout=1,
            report_wait=0.5,
        )
        start = loop.time()
        with pytest.raises(Refused):
            await dialer.dial("other.test", 80, "http")
        return loop.time() - start, looked.cancelled()

    waited, cancelled = asyncio.run(scenario())
    low, high = (0.08, 0.4) if answer_after is not None else (0.45, 1.0)
    assert low < waited < high, waited
    assert not cancelled


def _stuck_dns(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """getaddrinfo for ``stuck*`` names blocks like a DNS server that never answers,
    until the event is set (then fails); other names resolve as ever."""
    release = threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
        if host.startswith("stuck"):
            release.wait(10)
            raise socket.gaierror(socket.EAI_AGAIN, "no answer")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return release


def test_a_sessions_lookups_that_gave_up_keep_their_turn_until_their_thread_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two lookups that never answer use up session A's turns, even after their
    callers gave up (their threads are still blocked); A's next lookup waits, and
    B's, with turns of its own in the same threads, answers at once."""
    from sandhold.net.outbound import LookupThreads

    release = _stuck_dns(monkeypatch)

    async def scenario() -> dict[str, object]:
        threads = LookupThreads(threads=4, per_session=2)
        a, b = threads.resolver(), threads.resolver()
        out: dict[str, object] = {}
        for name in ("stuck1", "stuck2"):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(a(name, 80), 0.1)
        with pytest.raises(TimeoutError):  # no turn left for A, though its callers left
            await asyncio.wait_for(a("localhost", 80), 0.3)
        out["b"] = list(await asyncio.wait_for(b("localhost", 80), 2))
        release.set()
        out["a_after"] = list(await asyncio.wait_for(a("localhost", 80), 2))
        threads.close()
        return out

    out = asyncio.run(scenario())
    assert "127.0.0.1" in out["b"] and "127.0.0.1" in out["a_after"]  # type: ignore[operator]
    with pytest.raises(ValueError):
        LookupThreads(threads=4, per_session=4)


def test_many_sessions_with_stuck_lookups_leave_threads_for_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the port's defaults, twenty sandboxes each holding their every turn with
    names whose DNS never answers still leave threads for the next one's lookup."""
    from sandhold.net.outbound import LookupThreads

    release = _stuck_dns(monkeypatch)

    async def scenario() -> list[str]:
        threads = LookupThreads()
        stuck = []
        for _ in range(20):
            resolve = threads.resolver()
            for i in range(threads.per_session):
                stuck.append(asyncio.ensure_future(resolve(f"stuck{i}", 80)))
        await asyncio.sleep(0.2)  # every stuck lookup holds a thread
        try:
            return list(await asyncio.wait_for(threads.resolver()("localhost", 80), 2))
        finally:
            release.set()
            for task in stuck:
                task.cancel()
            threads.close()

    assert "127.0.0.1" in asyncio.run(scenario())


RESOLVE = """
import asyncio, json, sys
from sandhold.net.outbound import system_resolver
out = {}
for name in sys.argv[1:]:
    try:
        r = asyncio.run(system_resolver(name, 80))
        out[name] = [list(r), r.canonical]
    except OSError as e:
        out[name] = str(e)
print(json.dumps(out))
"""

# A DNS server for the test's own namespace: A records from argv (name=address), and
# NXDOMAIN for every other name; enough for glibc's stub resolver.
DNS = """
import socket, struct, sys
records = dict(a.split("=") for a in sys.argv[1:])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 53))
print("up", flush=True)
while True:
    q, peer = s.recvfrom(512)
    ident, flags = struct.unpack(">HH", q[:4])
    labels, i = [], 12
    while q[i]:
        labels.append(q[i + 1 : i + 1 + q[i]].decode().lower())
        i += 1 + q[i]
    qtype = struct.unpack(">H", q[i + 1 : i + 3])[0]
    question = q[12 : i + 5]
    address = records.get(".".join(labels))
    answer = b""
    if address and qtype == 1:
        answer = b"\\xc0\\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(address)
    rcode = 0 if address else 3
    head = struct.pack(">HHHHHH", ident, 0x8180 | rcode, 1, 1 if answer else 0, 0, 0)
    s.sendto(head + question + answer, peer)
"""


def test_the_system_resolver_answers_only_for_the_name_itself(world: World) -> None:
    """The policy decides a name. When the resolver's search list turns ``secret`` into
    ``secret.corp.example`` (a deniedDomains entry), the name is asked again as absolute,
    and refused if only the search list knows it; an answer for another name (an
    /etc/hosts alias here, a CNAME alike) names it, for the deny rules. In a user,
    mount and network namespace of the test's own, with a DNS server on 127.0.0.1."""
    hosts = world.mkfile(
        "hosts", "10.1.2.4 aliased.corp.example foo\n10.1.2.5 plain.example\n127.0.0.1 localhost\n"
    )
    resolv = world.mkfile("resolv.conf", "nameserver 127.0.0.1\nsearch corp.example\n")
    dns = world.mkfile("dns.py", DNS)
    records = ["secret.corp.example=10.1.2.3", "a.b=10.9.9.9", "a.b.corp.example=10.1.2.9"]
    up = world.root / "dns-up"
    script = (
        'mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf && '
        'ip link set lo up || exit 1; "$3" "$4" $6 > "$7" & dns=$!; '
        'for _ in $(seq 500); do grep -q up "$7" && break; sleep 0.01; done; '
        '"$3" -c "$5" secret a.b foo plain.example localhost; rc=$?; kill $dns; exit $rc'
    )
    r = world.ident.run(
        ["unshare", "--user", "--map-root-user", "--mount", "--net", "sh", "-c", script, "sh",
         str(hosts), str(resolv), world.ident.python, str(dns), RESOLVE, " ".join(records),
         str(up)],
        cwd=world.work,
        env=world.env(),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["secret"] == (
        "secret resolves only as secret.corp.example, through the resolver's search list"
    )
    assert out["a.b"] == [["10.9.9.9"], "a.b"]  # the absolute name, not a.b.corp.example
    assert out["foo"] == [["10.1.2.4"], "aliased.corp.example"]
    assert out["plain.example"] == [["10.1.2.5"], "plain.example"]
    assert out["localhost"] == [["127.0.0.1"], "localhost"]


def test_a_name_answered_as_a_denied_one_is_refused() -> None:
    """The resolver answered for another name (a CNAME, an alias): a deny rule on that
    name refuses the connection, and it is reported as the refusal it is."""
    from sandhold.net.errors import Refused
    from sandhold.net.outbound import Dialer, Resolved

    async def resolver(host: str, port: int) -> Resolved:
        out = Resolved(["10.1.2.3"])
        out.canonical = {"evil.test": "secret.corp.example"}.get(host, host)
        return out

    seen: list[object] = []
    policy = DomainPolicy.for_cli(["evil.test", "fine.test"], ["*.corp.example"])
    dialer = Dialer(
        lambda: policy, resolver, (), seen.append, resolve_timeout=1, connect_timeout=0.2
    )

    async def attempt(host: str) -> str:
        try:
            (await dialer.dial(host, 9, "http")).close()
        except Refused as exc:
            return exc.decision.rule
        except Exception as exc:
            return type(exc).__name__
        return "dialled"

    assert asyncio.run(attempt("evil.test")) == "deniedDomains: *.corp.example"
    assert asyncio.run(attempt("fine.test")) in ("dialled", "DialFailed")  # allowed
    record = seen[0]
    assert record.allowed is False and "secret.corp.example" in record.reason  # type: ignore[attr-defined]


def test_a_local_route_wider_than_one_address_is_the_hosts_own(world: World) -> None:
    """An address with a prefix on lo makes its whole subnet local (AnyIP): every address
    in it reaches the host's own listeners, so all of it is guarded, IPv4 and IPv6. A
    policy-routing table's wide local route (a transparent proxy's) is not the host's:
    marked packets alone take it. In a network namespace of the test's own."""
    code = (
        "import json; from sandhold.net.outbound import discover_host_addresses as d; "
        "print(json.dumps(d()))"
    )
    routes = [
        "ip link set lo up",
        "ip addr add 10.60.0.1/24 dev lo",
        "ip -6 route add local 2001:db8:60::/64 dev lo",
        "ip route add local 0.0.0.0/0 dev lo table 100",
        "ip -6 route add local ::/0 dev lo table 100",
        "ip -6 route add local 2001:db8:61::/48 dev lo table 300000",
        "ip -6 route add local 2001:db8:62::7 dev lo table 100",
    ]
    script = " && ".join(routes) + f" && exec \"$0\" -c '{code}'"
    r = world.ident.run(
        ["unshare", "--user", "--map-root-user", "--net", "sh", "-c", script, world.ident.python],
        cwd=world.work,
        env=world.env(),
    )
    assert r.returncode == 0, r.stderr
    own = json.loads(r.stdout)
    for present in ("10.60.0.0/24", "10.60.0.1", "2001:db8:60::/64", "2001:db8:62::7"):
        assert present in own, own
    for absent in ("0.0.0.0/0", "::/0", "2001:db8:61::/48"):
        assert absent not in own, own
    from sandhold.policy.domains import guard_addresses

    policy = DomainPolicy.for_cli(["lan.test"])
    for inside in ("10.60.0.77", "2001:db8:60::77"):
        refusal = guard_addresses(policy, "lan.test", 80, [inside], own)
        assert refusal is not None, inside
        assert refusal.rule == "resolved address guard: host's own address"
    assert guard_addresses(policy, "lan.test", 80, ["2001:db8:61::1"], own) is None


def _route(
    family: int,
    dst: str | None,
    prefix: int,
    *,
    kind: int = 2,
    table: int = 254,
    full_table: int | None = None,
) -> bytes:
    """One RTM_NEWROUTE message as the kernel sends it (rtmsg, then attributes)."""
    import ipaddress
    import struct

    attrs = b""
    if dst is not None:
        packed = ipaddress.ip_address(dst).packed
        attrs += struct.pack("=HH", 4 + len(packed), 1) + packed
    if full_table is not None:
        attrs += struct.pack("=HHI", 8, 15, full_table)
    body = struct.pack("=BBBBBBBBI", family, prefix, 0, 0, table, 2, 0, kind, 0) + attrs
    return struct.pack("=IHHII", 16 + len(body), 24, 2, 1, 0) + body


DONE = struct.pack("=IHHIIi", 20, 3, 2, 1, 0, 0)


def test_local_routes_follow_the_rules_for_both_families() -> None:
    """A one-address local route counts from any table, a wider one from main and local
    only (the full table id is the RTA_TABLE attribute: rtm_table holds 8 bits);
    routes that are not local do not count; the dump ends at NLMSG_DONE."""
    from sandhold.net.local_routes import parse_dump

    v4, v6 = socket.AF_INET, socket.AF_INET6
    dump = b"".join(
        [
            _route(v4, "10.61.0.0", 24, table=255),
            _route(v4, "10.61.0.1", 32, table=255),
            _route(v4, "10.62.0.0", 16, table=254),
            _route(v4, None, 0, table=100),  # local 0.0.0.0/0 table 100
            _route(v4, "10.70.0.5", 32, table=100),
            _route(v4, "192.0.2.0", 24, kind=1),  # unicast
            _route(v6, "2001:db8:60::", 64, table=255),
            _route(v6, None, 0, table=100),  # local ::/0 table 100
            _route(v6, "2001:db8:61::", 48, table=252, full_table=300000),
            _route(v6, "2001:db8:63::", 48, table=252, full_table=254),
            _route(v6, "2001:db8:62::7", 128, table=252, full_table=300000),
            _route(v6, "fd00::", 64, kind=1),
        ]
    )
    assert parse_dump(dump) == (
        [
            "10.61.0.0/24",
            "10.61.0.1",
            "10.62.0.0/16",
            "10.70.0.5",
            "2001:db8:60::/64",
            "2001:db8:63::/48",
            "2001:db8:62::7",
        ],
        False,
    )
    assert parse_dump(_route(v6, "::1", 128) + DONE + _route(v4, "10.9.9.9", 32)) == (["::1"], True)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(_route(socket.AF_INET, "10.0.0.1", 32)[:-2], id="message cut short"),
        pytest.param(b"\x10\x00", id="header cut short"),
        pytest.param(struct.pack("=IHHII", 8, 24, 0, 0, 0), id="length below the header"),
        pytest.param(_route(socket.AF_INET, "10.0.0.1", 33), id="prefix wider than the family"),
        pytest.param(
            struct.pack("=IHHII", 20, 24, 0, 0, 0) + struct.pack("=BBBB", 2, 32, 0, 0),
            id="rtmsg cut short",
        ),
    ],
)
def test_a_malformed_route_dump_is_an_error(data: bytes) -> None:
    from sandhold.net.local_routes import parse_dump

    with pytest.raises(ValueError):
        parse_dump(data)


def test_a_refused_route_dump_is_an_os_error() -> None:
    from sandhold.net.local_routes import parse_dump

    error = struct.pack("=IHHIIi", 20, 2, 0, 1, 0, -errno.EPERM)
    with pytest.raises(OSError) as caught:
        parse_dump(error)
    assert caught.value.errno == errno.EPERM


def test_a_resolver_configuration_that_cannot_be_read_is_an_error(tmp_path: Path) -> None:
    """Without the search list the resolver's answer cannot be told from one for the
    name asked: an unreadable resolv.conf refuses (the dialer fails closed), a missing
    one means no search list, as for glibc."""
    from sandhold.net.outbound import search_domains

    conf = tmp_path / "resolv.conf"
    assert search_domains(str(conf)) == ()
    conf.mkdir()  # exists, cannot be read as a file
    with pytest.raises(OSError):
        search_domains(str(conf))
    conf.rmdir()
    conf.write_text("search Corp.Example. other.test\nnameserver 10.0.0.1\n")
    assert search_domains(str(conf)) == ("corp.example", "other.test")
