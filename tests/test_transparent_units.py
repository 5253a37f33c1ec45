"""The pure parts of transparent egress (issue 20): synthetic names, the DNS wire format,
the first-bytes sniffers, the NFLOG reader; tables, byte-by-byte cuts and a fuzz run."""

from __future__ import annotations

import socket
import ssl
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandhold.net import dns
from sandhold.net.transparent import (
    http_host,
    http_target_host,
    refused_datagrams,
    tls_hello_whole,
    tls_record_complete,
    tls_server_name,
)
from sandhold.policy.domains import DomainPolicy
from sandhold.policy.transparent import (
    SYNTHETIC_V4,
    SYNTHETIC_V6,
    SyntheticNames,
    is_synthetic,
    name_decision,
    nft_ruleset,
)

POLICY = DomainPolicy.for_cli(
    ["api.example.com", "*.corp.test", "db.internal.test:5432", "140.82.112.3"],
    ["bad.corp.test"],
)


@pytest.mark.parametrize(
    ("name", "answered", "rule"),
    [
        ("api.example.com", True, "allowedDomains: api.example.com"),
        ("API.Example.COM", True, "allowedDomains: api.example.com"),
        ("x.corp.test", True, "allowedDomains: *.corp.test"),
        ("db.internal.test", True, "allowedDomains: db.internal.test:5432"),  # its own port
        ("bad.corp.test", False, "deniedDomains: bad.corp.test"),
        ("example.com", False, "not in allowedDomains"),
        # a long random label under the allowed name's sibling: no answer, no tunnel
        ("q" * 63 + ".example.com", False, "not in allowedDomains"),
        ("metadata.google.internal", False, "baseline deny: cloud metadata"),
        ("140.82.112.3", False, "dns: address literal"),  # an IP is not a name
        ("corp.test", False, "not in allowedDomains"),
    ],
)
def test_name_decision_table(name: str, answered: bool, rule: str) -> None:
    decision = name_decision(POLICY, name)
    assert (decision.allowed, decision.rule) == (answered, rule)


def test_synthetic_names_are_one_to_one_and_bounded() -> None:
    names = SyntheticNames(max_names=3)
    a4, a6 = names.address("a.test", 4), names.address("a.test", 6)
    assert a4 == "198.18.0.1" and a6 == "fd53:616e:6468::1"
    assert names.address("a.test", 4) == a4  # stable
    assert names.address("b.test", 4) == "198.18.0.2"
    assert names.name_of(a4) == names.name_of(a6) == "a.test"
    assert names.name_of("198.18.0.9") is None  # never handed out
    assert names.name_of("198.18.0.0") is None  # the network address is never used
    assert names.name_of("10.0.0.1") is None and names.name_of("nonsense") is None
    assert names.address("c.test", 4) is not None
    assert names.address("d.test", 4) is None  # full: refused, old names kept
    assert names.name_of("198.18.0.3") == "c.test"
    assert is_synthetic("198.19.255.254") and is_synthetic(str(SYNTHETIC_V6[5]))
    assert not is_synthetic("198.20.0.1") and not is_synthetic("fd00::1")
    assert SYNTHETIC_V4.num_addresses > 65_536


def test_ruleset_diverts_tcp_and_dns_and_drops_the_rest() -> None:
    text = nft_ruleset(3129, 53, 20)
    lines = [line.strip() for line in text.splitlines()]
    divert = lines.index("chain divert {")
    guard = lines.index("chain guard {")
    # DNS first (loopback resolvers too), then loopback stays, then every other TCP
    assert lines[divert + 2] == "meta l4proto { tcp, udp } th dport 53 redirect to :53"
    assert lines[divert + 3 : divert + 5] == ["ip daddr 127.0.0.0/8 accept", "ip6 daddr ::1 accept"]
    assert lines[divert + 5] == "meta l4proto tcp redirect to :3129"
    assert "policy drop;" in lines[guard + 1]
    assert lines[guard + 4] == "log group 20 drop"


# -- DNS ---------------------------------------------------------------------------------


def _query(name: str, qtype: int = dns.A, *, qid: int = 0x1234, edns: int | None = None) -> bytes:
    out = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 1 if edns is not None else 0)
    out += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".") if p) + b"\0"
    out += struct.pack("!HH", qtype, dns.IN)
    if edns is not None:
        out += b"\0" + struct.pack("!HHIH", dns.OPT, 4096, edns << 16, 0)
    return out


def _read_answer(reply: bytes) -> tuple[int, int, list[str], bool]:
    """(id, rcode, addresses, has OPT): an independent reader of our answers."""
    qid, flags, qd, an, _ns, ar = struct.unpack_from("!HHHHHH", reply)
    assert flags & 0x8000
    pos = 12
    for _ in range(qd):
        while reply[pos]:
            pos += reply[pos] + 1
        pos += 5
    addresses = []
    for _ in range(an):
        assert reply[pos : pos + 2] == b"\xc0\x0c"
        rtype, _cls, _ttl, size = struct.unpack_from("!HHIH", reply, pos + 2)
        data = reply[pos + 12 : pos + 12 + size]
        addresses.append(
            socket.inet_ntop(socket.AF_INET if rtype == dns.A else socket.AF_INET6, data)
        )
        pos += 12 + size
    opt = False
    for _ in range(ar):
        assert reply[pos] == 0 and struct.unpack_from("!H", reply, pos + 1)[0] == dns.OPT
        opt = True
        pos += 11
    assert pos == len(reply)
    rcode = (flags & 0xF) | ((reply[-6] << 4) if opt else 0)
    return qid, rcode, addresses, opt


def _stub() -> tuple[dns.DnsStub, list[str]]:
    refused: list[str] = []
    return dns.DnsStub(lambda: POLICY, SyntheticNames(), lambda d: refused.append(d.rule)), refused


@pytest.mark.parametrize(
    ("query", "rcode", "addresses", "opt"),
    [
        (_query("api.example.com"), dns.NOERROR, ["198.18.0.1"], False),
        (_query("api.example.com", dns.AAAA, edns=0), dns.NOERROR, ["fd53:616e:6468::1"], True),
        (
            _query("api.example.com", dns.ANY),
            dns.NOERROR,
            ["198.18.0.1", "fd53:616e:6468::1"],
            False,
        ),
        (_query("api.example.com", 15), dns.NOERROR, [], False),  # MX: no data, not an error
        (_query("api.example.com", edns=1), dns.BADVERS, [], True),
        (_query("evil.example"), dns.NXDOMAIN, [], False),
        (_query("bad.corp.test", edns=0), dns.NXDOMAIN, [], True),
        (_query(""), dns.REFUSED, [], False),
        (_query("api.example.com")[:-2] + b"\x00\x03", dns.REFUSED, [], False),  # class CH
        (_query("api.example.com")[:2] + b"\x28\x00" + _query("x")[4:], dns.NOTIMP, [], False),
        (_query("api.example.com")[:4] + b"\x00\x02" + _query("x")[6:], dns.FORMERR, [], False),
        (_query("api.example.com")[:-3], dns.FORMERR, [], False),  # truncated question
    ],
)
def test_stub_answers(query: bytes, rcode: int, addresses: list[str], opt: bool) -> None:
    stub, _ = _stub()
    reply = stub.respond(query)
    assert reply is not None
    qid, got_rcode, got, got_opt = _read_answer(reply)
    assert (qid, got_rcode, got, got_opt) == (0x1234, rcode, addresses, opt)


def test_refused_names_are_reported_and_answers_not_answered() -> None:
    stub, refused = _stub()
    assert _read_answer(stub.respond(_query("bad.corp.test")) or b"")[1] == dns.NXDOMAIN
    assert refused == ["deniedDomains: bad.corp.test"]
    as_answer = bytearray(_query("api.example.com"))
    as_answer[2] |= 0x80  # QR: a response; answering it could make two stubs talk forever
    assert stub.respond(bytes(as_answer)) is None
    assert stub.respond(b"\x12\x34") is None


def test_pointers_must_point_backwards() -> None:
    # a pointer to itself and a forward pointer, in an additional record's name
    base = bytearray(_query("api.example.com"))
    base[11] = 1
    looping = bytes(base) + b"\xc0" + bytes([len(base)]) + b"\x00" * 10
    with pytest.raises(dns.DnsError) as err:
        dns.parse_query(looping)
    assert err.value.rcode == dns.FORMERR
    forward = bytes(base) + b"\xc0\xff" + b"\x00" * 10
    with pytest.raises(dns.DnsError):
        dns.parse_query(forward)
    compressed_question = _query("x")[:12] + b"\xc0\x0c" + b"\x00\x01\x00\x01"
    with pytest.raises(dns.DnsError):
        dns.parse_query(compressed_question)


def test_a_label_with_a_dot_is_not_a_name() -> None:
    one_label = _query("x")[:12] + bytes([15]) + b"api.example.com" + b"\0\x00\x01\x00\x01"
    stub, _ = _stub()
    assert _read_answer(stub.respond(one_label) or b"")[1] == dns.FORMERR


def test_every_cut_of_a_query_is_answered_or_ignored_never_raises() -> None:
    stub, _ = _stub()
    whole = _query("x.corp.test", dns.AAAA, edns=0)
    for i in range(len(whole) + 1):
        stub.respond(whole[:i])
    assert stub.respond(whole) is not None


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_fuzz_random_bytes(data: bytes) -> None:
    stub, _ = _stub()
    try:
        dns.parse_query(data)
    except (dns.DnsError, dns.NoReply):
        pass
    reply = stub.respond(data)
    assert reply is None or len(reply) <= 12 + len(data) + 2 * 28 + 11


_SEEDS = [
    _query("api.example.com", dns.A, edns=0),
    _query("x.corp.test", dns.AAAA),
    _query("bad.corp.test", dns.ANY, edns=0),
]


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(_SEEDS),
    st.lists(st.tuples(st.integers(0, 80), st.integers(0, 255)), max_size=6),
    st.binary(max_size=40),
)
def test_fuzz_mutated_queries(seed: bytes, flips: list[tuple[int, int]], tail: bytes) -> None:
    data = bytearray(seed + tail)
    for pos, value in flips:
        if pos < len(data):
            data[pos] = value
    stub, _ = _stub()
    start = time.perf_counter()
    reply = stub.respond(bytes(data))
    assert time.perf_counter() - start < 0.5  # a hang, not a slow machine
    if reply is not None:
        assert reply[:2] == bytes(data[:2])  # the id is always echoed
        assert reply[2] & 0x80  # and it is an answer


# -- the first bytes of a diverted connection ---------------------------------------------


def _client_hello(server_name: str | None) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize("name", ["web.t20.test", "a" * 60 + ".example", None])
def test_sni_against_the_ssl_module(name: str | None) -> None:
    hello = _client_hello(name)
    assert tls_record_complete(hello) and tls_hello_whole(hello)
    assert tls_server_name(hello) == name
    for i in range(len(hello)):  # every cut: no crash, and never a wrong name
        assert tls_server_name(hello[:i]) in (None, name)
        assert not tls_record_complete(hello[:i]) or i >= len(hello)
        assert not tls_hello_whole(hello[:i])
    # the same hello split over two records: not whole, whatever the first holds
    body = hello[5:]
    split = hello[:3] + struct.pack("!H", 40) + body[:40]
    split += hello[:3] + struct.pack("!H", len(body) - 40) + body[40:]
    assert tls_record_complete(split) and not tls_hello_whole(split)


@pytest.mark.parametrize(
    ("head", "host"),
    [
        (b"GET / HTTP/1.1\r\nHost: web.t20.test:8080\r\n\r\n", "web.t20.test"),
        (b"GET / HTTP/1.1\r\nhost:  WEB.t20.test \r\n\r\n", "WEB.t20.test"),
        (b"GET / HTTP/1.1\r\nHost: [fd00::1]:80\r\n\r\n", "fd00::1"),
        (b"GET / HTTP/1.1\r\nAccept: */*\r\n\r\n", None),
        (b"GET / HTTP/1.1\r\n\r\nHost: late.test\r\n", None),  # in the body: not a header
    ],
)
def test_http_host(head: bytes, host: str | None) -> None:
    assert http_host(head) == host


@pytest.mark.parametrize(
    ("head", "host"),
    [
        (b"GET / HTTP/1.1\r\n", None),
        (b"GET http://evil.test:81/x HTTP/1.1\r\n", "evil.test"),
        (b"GET HTTPS://u:p@evil.test/x HTTP/1.1\r\n", "evil.test"),
        (b"CONNECT evil.test:443 HTTP/1.1\r\n", "evil.test"),
        (b"CONNECT [fd00::1]:443 HTTP/1.1\r\n", "fd00::1"),
        (b"OPTIONS * HTTP/1.1\r\n", None),
    ],
)
def test_http_target_host(head: bytes, host: str | None) -> None:
    assert http_target_host(head) == host


def test_nflog_reader() -> None:
    ip = bytes([0x45, 0, 0, 33, 0, 0, 0, 0, 64, 17, 0, 0]) + socket.inet_aton("127.0.0.1")
    ip += socket.inet_aton("192.0.2.7") + struct.pack("!HHHH", 40000, 443, 13, 0) + b"x"
    attr = struct.pack("=HH", 4 + len(ip), 9) + ip
    attr += b"\0" * ((4 - len(attr) % 4) % 4)
    body = struct.pack("=BBH", 2, 0, 0) + attr
    message = struct.pack("=IHHII", 16 + len(body), 4 << 8, 0, 0, 0) + body
    assert refused_datagrams(message) == [("127.0.0.1", 40000, "192.0.2.7", 443)]
    assert refused_datagrams(message * 2) == [("127.0.0.1", 40000, "192.0.2.7", 443)] * 2
    for i in range(len(message)):
        refused_datagrams(message[:i])  # cut anywhere: no crash


# -- differential: dnspython (when installed) reads our answers and writes our queries --


@pytest.mark.parametrize(
    ("name", "rdtype", "want_edns"),
    [
        ("api.example.com", "A", False),
        ("x.corp.test", "AAAA", True),
        ("x.corp.test", "MX", True),
        ("bad.corp.test", "A", True),
        ("nope.example", "AAAA", False),
    ],
)
def test_against_dnspython(name: str, rdtype: str, want_edns: bool) -> None:
    message = pytest.importorskip("dns.message")
    rcode_mod = pytest.importorskip("dns.rcode")
    query = message.make_query(name, rdtype, use_edns=0 if want_edns else False)
    stub, _ = _stub()
    reply = stub.respond(query.to_wire())
    assert reply is not None
    parsed = message.from_wire(reply)
    assert parsed.id == query.id and query.is_response(parsed)
    assert (parsed.edns >= 0) == want_edns
    allowed = name_decision(POLICY, name).allowed
    assert parsed.rcode() == (rcode_mod.NOERROR if allowed else rcode_mod.NXDOMAIN)
    got = [item.to_text() for rrset in parsed.answer for item in rrset]
    if allowed and rdtype in ("A", "AAAA"):
        expected = stub.names.address(name, 4 if rdtype == "A" else 6)
        assert got == [expected]
    else:
        assert got == []
    # and our parser reads what dnspython writes, flags and all
    ours = dns.parse_query(query.to_wire())
    assert (ours.name, ours.qtype, ours.edns) == (name, query.question[0].rdtype, want_edns)
