"""The sans-I/O parsers of the proxies: HTTP request heads (``httphead``) and SOCKS5 (``socks5``).

Every case in the tables runs whole, one byte at a time, and with trailing bytes
(which must come back as the tunnel's first payload, untouched). The property
tests feed arbitrary bytes both ways and check that the only exception is the
typed one, that both ways agree, and that nothing is buffered without bound.
"""

from __future__ import annotations

import doctest
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sandhold.net import httphead, socks5
from sandhold.net.errors import BadRequest, SocksError
from sandhold.net.httphead import ProxyRequest, RequestHeadParser, render_answer
from sandhold.net.socks5 import ConnectRequest, Greeting, Socks5Server

# --- HTTP request heads -----------------------------------------------------------------

Outcome = tuple[str, object]


def parse_head(chunks: list[bytes], max_head: int = 65536) -> tuple[Outcome, bytes]:
    """Feed chunks until a request or an error; returns the outcome and the trailing data."""
    p = RequestHeadParser(max_head)
    try:
        for i, chunk in enumerate(chunks):
            p.receive_data(chunk)
            request = p.next_event()
            if request is not None:  # the rest is not fed: the caller relays it
                return ("request", request), p.trailing_data + b"".join(chunks[i + 1 :])
        p.receive_data(b"")
        p.next_event()
    except BadRequest as exc:
        return ("error", exc.status), b""
    raise AssertionError("EOF produced neither a request nor an error")


def whole(data: bytes) -> list[bytes]:
    return [data]


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


H = b"Host: h\r\n"
CLOSE = b"Connection: close\r\n\r\n"
HEAD_OK = [
    (
        b"CONNECT example.com:443 HTTP/1.1\r\n" + H + b"\r\n",
        ProxyRequest("CONNECT", "example.com", 443, "1.1"),
    ),
    (
        b"CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n" + H + b"\r\n",
        ProxyRequest("CONNECT", "2001:db8::1", 8443, "1.1"),
    ),
    (b"CONNECT 10.0.0.1:22 HTTP/1.0\r\n\r\n", ProxyRequest("CONNECT", "10.0.0.1", 22, "1.0")),
    (
        b"GET http://A.test:8080 HTTP/1.0\r\n\r\n",
        ProxyRequest("GET", "A.test", 8080, "1.0", b"GET / HTTP/1.0\r\nHost: A.test:8080\r\n"
                     + CLOSE),
    ),
    (
        b"GET HTTP://a.test?q=1#frag HTTP/1.1\r\n" + H + b"\r\n",
        ProxyRequest("GET", "a.test", 80, "1.1", b"GET /?q=1 HTTP/1.1\r\nHost: a.test\r\n" + CLOSE),
    ),
    (
        b"POST http://[::1]:81/p HTTP/1.1\r\nHost: wrong\r\nContent-Length: 3\r\n"
        b"Proxy-Authorization: Basic eA==\r\nProxy-Connection: keep-alive\r\nKeep-Alive: 5\r\n"
        b"Connection: keep-alive, X-Hop, Content-Length\r\nX-Hop: 1\r\nTE: trailers\r\n"
        b"Upgrade: h2c\r\nX-Kept: a\r\n\r\n",
        ProxyRequest(
            "POST", "::1", 81, "1.1",
            b"POST /p HTTP/1.1\r\nHost: [::1]:81\r\nContent-Length: 3\r\nX-Kept: a\r\n"
            b"Connection: close\r\n\r\n",
        ),
    ),
    (
        b"PUT http://a.test/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
        ProxyRequest("PUT", "a.test", 80, "1.1",
                     b"PUT / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n"
                     b"Connection: close\r\n\r\n"),
    ),
]  # fmt: skip

HEAD_ERRORS = [
    (b"GET / HTTP/1.1\r\n" + H + b"\r\n", 400),  # origin form
    (b"OPTIONS * HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"GET https://a.test/ HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"GET ftp://a.test/ HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"GET http://u:p@a.test/ HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"GET http:///x HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"GET http://a.test:0/ HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"GET http://a.test:99999/ HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"GET http://[::1/ HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"CONNECT a.test HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"CONNECT a.test:443/x HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"CONNECT :443 HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"CONNECT a.test:443 HTTP/1.1\r\n\r\n", 400),  # no Host in 1.1 (h11)
    (b"CONNECT a.test:443 HTTP/2.0\r\n" + H + b"\r\n", 505),
    (b"GET http://a.test/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    (b"GET http://a.test/ HTTP/1.1\r\n" + H + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\n",
     400),
    (b"GET http://a.test/ HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n"
     b"Content-Length: 2\r\n\r\n", 400),
    (b"GET http://a.test/ HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip\r\n\r\n", 501),
    (b"GET http://a.test/ HTTP/1.1\r\nBad Header: x\r\n\r\n", 400),
    (b"\r\n\r\nGET http://a.test/ HTTP/1.1\r\n\r\n", 400),
    (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n", 400),  # TLS on the proxy port
    (b"\x05\x01\x00\r\n\r\n", 400),  # SOCKS on the proxy port
    (b"GET http://a.test/ HTTP/1.1\r\n" + H, 400),  # EOF mid-head
    (b"GET http://a.test/ HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", 431),
    # smuggling tricks (issue 21): never a head the origin could frame otherwise
    (b"GET http://a.test/x HTTP/1.1\nHost: h\n\n", 400),  # bare LF line ends
    (b"GET http://a.test/ HTTP/1.1\r\n" + H + b"X: 1\nContent-Length: 2\r\n\r\n", 400),
    (b"GET http://a.test/ HTTP/1.1\r\n" + H + b"X: 1\rContent-Length: 2\r\n\r\n", 400),
    (b"GET http://a.test/ HTTP/1.1\r\n" + H + b"X: 1\r\n Content-Length: 2\r\n\r\n", 400),
    (b"GET http://a.test/ HTTP/1.1\r\n" + H + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n",
     400),
    (b"GET http://a.test/ HTTP/1.1\r\n" + H + b"Content-Length: 2, 2\r\n\r\n", 400),
]  # fmt: skip


@pytest.mark.parametrize("feed", [whole, bytewise], ids=["whole", "bytewise"])
@pytest.mark.parametrize(("data", "expected"), HEAD_OK, ids=[repr(c[0][:40]) for c in HEAD_OK])
def test_request_heads(
    data: bytes, expected: ProxyRequest, feed: Callable[[bytes], list[bytes]]
) -> None:
    junk = b"\x16\x03\x01 and more \r\n\r\n bytes"
    outcome, trailing = parse_head(feed(data + junk))
    assert outcome == ("request", expected)
    assert trailing == junk


@pytest.mark.parametrize("feed", [whole, bytewise], ids=["whole", "bytewise"])
@pytest.mark.parametrize(
    ("data", "status"), HEAD_ERRORS, ids=[repr(c[0][:40]) for c in HEAD_ERRORS]
)
def test_bad_request_heads(data: bytes, status: int, feed: Callable[[bytes], list[bytes]]) -> None:
    outcome, _ = parse_head(feed(data))
    assert outcome == ("error", status)


def test_a_failed_parser_stays_failed() -> None:
    p = RequestHeadParser()
    p.receive_data(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    with pytest.raises(BadRequest) as first:
        p.next_event()
    with pytest.raises(BadRequest) as again:
        p.next_event()
    with pytest.raises(BadRequest):
        p.receive_data(b"more")
    assert again.value is first.value


def test_the_parsed_request_is_returned_again_and_no_more_bytes_are_taken() -> None:
    p = RequestHeadParser()
    p.receive_data(b"CONNECT a.test:1 HTTP/1.0\r\n\r\n")
    request = p.next_event()
    assert request is not None and p.next_event() is request
    with pytest.raises(RuntimeError):
        p.receive_data(b"x")


def test_head_size_limit_counts_the_head_not_the_body() -> None:
    head = b"POST http://a.test/ HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n"
    outcome, trailing = parse_head([head + b"b" * 100000], max_head=1024)
    assert outcome[0] == "request" and len(trailing) == 100000
    big = b"GET http://a.test/ HTTP/1.1\r\nX: " + b"a" * 2000 + b"\r\n\r\n"
    assert parse_head([big], max_head=1024)[0] == ("error", 431)


def test_answers_are_safe_to_put_on_the_wire() -> None:
    raw = render_answer(
        403, "refused \u00e9\n", [("X-Proxy-Error", "host=a\r\nSet-Cookie: x\x00" + "y" * 900)]
    )
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 403 Forbidden"
    header = next(line for line in lines if line.startswith(b"X-Proxy-Error"))
    assert b"\r" not in header and b"\n" not in header and b"\x00" not in header
    assert len(header) <= len("X-Proxy-Error: ") + 512
    assert int(
        next(line for line in lines if line.startswith(b"Content-Length")).split()[1]
    ) == len(body)
    assert body == "refused \u00e9\n\n".encode()


# --- SOCKS5 -------------------------------------------------------------------------------

GREET = b"\x05\x01\x00"


def req(atyp: int, addr: bytes, port: int = 443, cmd: int = 1) -> bytes:
    return bytes([5, cmd, 0, atyp]) + addr + port.to_bytes(2, "big")


def parse_socks(chunks: list[bytes]) -> tuple[list[object], object, bytes]:
    """Feed chunks; returns the events, the error code (or None) and the trailing data."""
    s = Socks5Server()
    events: list[object] = []
    try:
        for i, chunk in enumerate(chunks):
            s.receive_data(chunk)
            while (event := s.next_event()) is not None:
                events.append(event)
            if s.state == socks5.REPLYING:  # the rest is not fed: the caller relays it
                return events, None, s.trailing_data + b"".join(chunks[i + 1 :])
        s.receive_data(b"")
        s.next_event()
    except SocksError as exc:
        return events, (exc.code, exc.reply), b""
    return events, None, s.trailing_data


SOCKS_OK = [
    (req(1, bytes([93, 184, 216, 34])), ConnectRequest("93.184.216.34", 443, "ipv4")),
    (req(4, bytes(15) + b"\x01", 80), ConnectRequest("::1", 80, "ipv6")),
    (req(3, b"\x0bexample.com"), ConnectRequest("example.com", 443, "domain")),
    (req(3, b"\x01a", 1), ConnectRequest("a", 1, "domain")),
    (req(3, b"\x02\xc3\xa9"), ConnectRequest("\u00e9", 443, "domain")),
    (req(3, b"\x02\xff\xfe"), ConnectRequest("\udcff\udcfe", 443, "domain")),  # surrogate escapes
    (req(3, b"\xff" + b"a" * 255, 65535), ConnectRequest("a" * 255, 65535, "domain")),
    (req(1, bytes(4), 0), ConnectRequest("0.0.0.0", 0, "ipv4")),  # the policy refuses port 0
]  # fmt: skip

NO_METHOD = (socks5.METHOD_REFUSED, b"\x05\xff")


def failure(code: int) -> tuple[int, bytes]:
    return (code, socks5.reply_bytes(code))


SOCKS4_REJECTED = (socks5.GENERAL_FAILURE, b"\x00\x5b" + bytes(6))

SOCKS_ERRORS = [
    (b"\x04\x01\x00\x50", [], SOCKS4_REJECTED),  # a SOCKS4 client: rejected in SOCKS4
    (b"\x04", [], SOCKS4_REJECTED),
    (b"\x05\x00", [], NO_METHOD),
    (b"\x05\x02\x01\x02", [], NO_METHOD),
    (b"GET / HTTP/1.1\r\n", [], NO_METHOD),
    (b"\x05\x02\x00", [], NO_METHOD),  # EOF mid-greeting
    (GREET + req(1, bytes(4), cmd=2), [Greeting((0,))], failure(socks5.COMMAND_NOT_SUPPORTED)),
    (GREET + req(1, bytes(4), cmd=3), [Greeting((0,))], failure(socks5.COMMAND_NOT_SUPPORTED)),
    (GREET + req(1, bytes(4), cmd=9), [Greeting((0,))], failure(socks5.COMMAND_NOT_SUPPORTED)),
    (GREET + b"\x05\x01\x00\x02", [Greeting((0,))], failure(socks5.ADDRESS_TYPE_NOT_SUPPORTED)),
    (GREET + b"\x04\x01\x00\x01", [Greeting((0,))], failure(socks5.GENERAL_FAILURE)),
    (GREET + b"\x05\x01\x01\x01", [Greeting((0,))], failure(socks5.GENERAL_FAILURE)),
    (GREET + b"\x05\x01\x00\x03\x00\x01\xbb", [Greeting((0,))], failure(socks5.GENERAL_FAILURE)),
    (GREET + b"\x05\x01\x00\x03\x05abc", [Greeting((0,))], failure(socks5.GENERAL_FAILURE)),
]  # fmt: skip


@pytest.mark.parametrize("feed", [whole, bytewise], ids=["whole", "bytewise"])
@pytest.mark.parametrize(("data", "expected"), SOCKS_OK, ids=[repr(c[0][:24]) for c in SOCKS_OK])
def test_socks_requests(
    data: bytes, expected: ConnectRequest, feed: Callable[[bytes], list[bytes]]
) -> None:
    junk = b"\x16\x03\x01 first payload"
    events, error, trailing = parse_socks(feed(GREET + data + junk))
    assert error is None
    assert events == [Greeting((0,)), expected]
    assert trailing == junk


def test_socks_greeting_keeps_every_offered_method() -> None:
    events, error, _ = parse_socks([b"\x05\x03\x02\x00\x80" + req(1, bytes(4))])
    assert error is None and events[0] == Greeting((2, 0, 128))


@pytest.mark.parametrize("feed", [whole, bytewise], ids=["whole", "bytewise"])
@pytest.mark.parametrize(
    ("data", "events", "error"), SOCKS_ERRORS, ids=[repr(c[0][:24]) for c in SOCKS_ERRORS]
)
def test_bad_socks_input(
    data: bytes, events: list[object], error: object, feed: Callable[[bytes], list[bytes]]
) -> None:
    got_events, got_error, _ = parse_socks(feed(data))
    assert (got_events, got_error) == (events, error)


def test_socks_reply_moves_and_illegal_moves() -> None:
    s = Socks5Server()
    with pytest.raises(RuntimeError):
        s.reply(socks5.SUCCEEDED)  # no request yet
    assert s.state == socks5.GREETING  # a refused move changes nothing
    s.receive_data(GREET + req(3, b"\x01a"))
    assert s.next_event() == Greeting((0,))
    assert s.next_event() == ConnectRequest("a", 443, "domain")
    assert s.reply(socks5.NOT_ALLOWED) == b"\x05\x02\x00\x01" + bytes(6)
    assert s.state == socks5.CLOSED
    with pytest.raises(RuntimeError):
        s.reply(socks5.SUCCEEDED)
    assert s.state == socks5.CLOSED


@pytest.mark.parametrize("state", [socks5.GREETING, socks5.REQUEST, socks5.REPLYING,
                                   socks5.TUNNEL, socks5.CLOSED, socks5.ERROR])  # fmt: skip
@pytest.mark.parametrize("move", ["greeting", "request", "reply-success", "reply-failure"])
def test_every_state_and_move_pair_follows_the_table(state: str, move: str) -> None:
    s = Socks5Server()
    s.state = state
    expected = socks5._NEXT.get((state, move))
    if expected is None:
        with pytest.raises(RuntimeError):
            s._move(move)
        assert s.state == state
    else:
        s._move(move)
        assert s.state == expected


def test_fail_replies_suit_the_stage() -> None:
    s = Socks5Server()
    assert s.fail("late").reply == b"\x05\xff"
    s = Socks5Server()
    s.receive_data(GREET)
    s.next_event()
    err = s.fail("late")
    assert err.reply == socks5.reply_bytes(socks5.GENERAL_FAILURE) and s.state == socks5.ERROR
    with pytest.raises(SocksError):
        s.next_event()


def test_socks_buffer_is_bounded() -> None:
    s = Socks5Server()
    s.receive_data(GREET + req(3, b"\x01a"))
    s.next_event()
    s.next_event()
    with pytest.raises(SocksError):
        s.receive_data(b"x" * (socks5.MAX_BUFFERED + 1))
    assert s.buffered == 0


# --- properties: arbitrary bytes ------------------------------------------------------------


def _head_outcome(chunks: list[bytes], max_head: int) -> tuple[tuple[object, ...], int]:
    """Outcome and the most the parser ever held while waiting, minus the chunk just fed."""
    p = RequestHeadParser(max_head)
    most = 0
    fed = 0
    try:
        for chunk in chunks:
            p.receive_data(chunk)
            fed += len(chunk)
            request = p.next_event()
            if request is not None:
                # what came after the head: held by the parser, or not fed yet
                return ("request", request, p.trailing_data, fed), most
            most = max(most, p.buffered - len(chunk))
        p.receive_data(b"")
        p.next_event()
    except BadRequest as exc:
        assert 400 <= exc.status <= 599
        return ("error",), most
    raise AssertionError("no outcome at EOF")


request_like = st.one_of(
    st.binary(max_size=600),
    st.builds(
        lambda m, t, v, hs, tail: b"%s %s HTTP/%s\r\n%s\r\n%s" % (m, t, v, b"".join(hs), tail),
        st.sampled_from([b"GET", b"CONNECT", b"POST", b"get", b"C\x00"]),
        st.one_of(
            st.binary(max_size=40),
            st.builds(lambda h: b"http://" + h + b"/", st.binary(max_size=30)),
            st.builds(lambda h, p: h + b":" + p, st.binary(max_size=20), st.binary(max_size=6)),
        ),
        st.sampled_from([b"1.1", b"1.0", b"2.0", b"1.x"]),
        st.lists(
            st.builds(
                lambda k, v: k + b": " + v + b"\r\n", st.binary(max_size=12), st.binary(max_size=30)
            ),
            max_size=6,
        ),
        st.binary(max_size=50),
    ),
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(request_like)
@example(b"CONNECT !:1 HTTP/1.0\n\n\x00")  # a head that ends before the last byte
def test_head_parser_agrees_whole_and_bytewise_and_stays_bounded(data: bytes) -> None:
    max_head = 256
    one, held_one = _head_outcome([data], max_head)
    many, held_many = _head_outcome(bytewise(data), max_head)
    assert one[0] == many[0]
    if one[0] == "request":
        # the same request; the bytes after the head are all there, whichever the
        # chunking, either held as trailing data or not yet fed
        assert one[1] == many[1]
        fed_many = many[3]
        assert isinstance(fed_many, int)
        assert one[2] == many[2] + data[fed_many:]
    assert held_one <= max_head and held_many <= max_head


socks_like = st.one_of(
    st.binary(max_size=300),
    st.builds(
        lambda greet, body: greet + body,
        st.sampled_from([GREET, b"\x05\x02\x00\x02", b"\x05\x01\x02", b""]),
        st.one_of(
            st.binary(max_size=300),
            st.builds(
                lambda cmd, atyp, rest: bytes([5, cmd, 0, atyp]) + rest,
                st.integers(0, 4), st.integers(0, 5), st.binary(max_size=270),
            ),
        ),
    ),
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(socks_like)
def test_socks_parser_agrees_whole_and_bytewise_and_stays_bounded(data: bytes) -> None:
    one = parse_socks([data])
    many = parse_socks(bytewise(data))
    assert one == many
    s = Socks5Server()
    for i in range(len(data)):
        try:
            s.receive_data(data[i : i + 1])
            while s.next_event() is not None:
                pass
        except SocksError:
            break
        if s.state in (socks5.GREETING, socks5.REQUEST):
            assert s.buffered <= 262  # never more than one message waits


def test_doc_examples_run() -> None:
    for module in (httphead, socks5):
        failures, tried = doctest.testmod(module)
        assert tried > 0 and failures == 0, module.__name__


def test_the_parsers_import_nothing_that_touches_the_os() -> None:
    """Sans-I/O (STYLE 5.5): the parsers load no socket, selector or event loop."""
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-c",
            "import sandhold.net.httphead, sandhold.net.socks5",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    loaded = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert "sandhold.net.socks5" in loaded
    assert loaded & {"socket", "asyncio", "select", "selectors", "ssl", "subprocess"} == set()
