"""Each request on a client connection is framed and decided on its own (issue 21).

The origins run on 127.0.0.1, ignore ``Connection: close``, answer every request
they parse (pipelined or not) and record what they saw: the verdicts are on what
the origin got. The egress proxy runs in-process (as in ``test_net_egress``);
``sandhold proxy`` runs as a real process with a real decider, as root and as the
unprivileged user (the ``world`` fixture). Every client payload is fed whole and
one byte per write.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import h11
import pytest

from conftest import World
from sandhold.net.httphead import RequestHeadParser, frame_body
from sandhold.policy.domains import DomainPolicy
from test_net_support import Proxy, split_response
from test_proxy_mode import Proxy as ModeProxy

LOOP = ["127.0.0.1"]
NAMES = {"allowed.test": LOOP, "www.allowed.test": LOOP, "other.test": LOOP}
POLICY = DomainPolicy.for_cli(["allowed.test", "www.allowed.test", "127.0.0.1"])
FEEDS = ["whole", "bytewise"]


class Origin:
    """Answers every request it parses with ``200 ok`` and keeps the connection open."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.raw = bytearray()  # every byte it was sent, all connections
        self.requests: list[tuple[bytes, bytes, bytes, bytes]] = []  # method, target, host, body
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        parser = h11.Connection(h11.SERVER)
        method = target = host = b""
        body = bytearray()
        with conn, contextlib.suppress(OSError, h11.RemoteProtocolError):
            conn.settimeout(10)
            while data := conn.recv(65536):
                self.raw += data
                parser.receive_data(data)
                while (event := parser.next_event()) is not h11.NEED_DATA:
                    if isinstance(event, h11.Request):
                        method, target = event.method, event.target
                        host = dict(event.headers).get(b"host", b"")
                        body = bytearray()
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        self.requests.append((method, target, host, bytes(body)))
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        rest = parser.trailing_data[0]  # ignore Connection: close: go on
                        parser = h11.Connection(h11.SERVER)
                        parser.receive_data(rest)
                    else:
                        break

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def origins() -> Iterator[tuple[Origin, Origin]]:
    a, b = Origin(), Origin()
    yield a, b
    a.close()
    b.close()


def exchange(port: int, data: bytes, feed: str, answers: int) -> list[bytes]:
    """Send ``data``, then half-close; read until the proxy closes, split into answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if feed == "whole":
            s.sendall(data)
        else:
            for i in range(len(data)):
                s.sendall(data[i : i + 1])
        s.shutdown(socket.SHUT_WR)
        got = bytearray()
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                got += chunk
    out = []
    for _ in range(answers + 1):
        if not got:
            break
        decoder = h11.Connection(h11.CLIENT)
        decoder.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        decoder.receive_data(bytes(got))
        decoder.receive_data(b"")
        while not isinstance(decoder.next_event(), h11.EndOfMessage):
            pass
        size = len(got) - len(decoder.trailing_data[0])
        out.append(bytes(got[:size]))
        del got[:size]
    assert not got, got
    return out


def get(host: str, port: int, path: str = "/") -> bytes:
    return f"GET http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def post(host: str, port: int, body: bytes) -> bytes:
    head = f"POST http://{host}:{port}/p HTTP/1.1\r\nHost: h\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


CHUNKED_HEAD = "POST http://{}:{}/c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"


# --- the egress proxy (a sandbox's HTTP proxy) ------------------------------------


@pytest.mark.parametrize("feed", FEEDS)
def test_a_pipelined_request_to_a_denied_host_is_refused_and_its_origin_sees_nothing(
    origins: tuple[Origin, Origin], feed: str
) -> None:
    a, b = origins
    with Proxy(POLICY, NAMES) as px:
        data = get("allowed.test", a.port, "/one") + get("other.test", b.port, "/two")
        first, second = exchange(px.http_port, data, feed, 2)
    assert split_response(first)[0] == 200 and first.endswith(b"ok")
    status, headers, _ = split_response(second)
    assert status == 403, second
    denied = [d for d in px.decisions if not d.allowed]
    assert len(denied) == 1 and denied[0].target == f"other.test:{b.port}"
    assert headers["x-proxy-error"] == (
        f"blocked-by-sandbox-policy; host=other.test:{b.port}; rule={denied[0].rule}"
    )
    assert [r[:3] for r in a.requests] == [(b"GET", b"/one", f"allowed.test:{a.port}".encode())]
    assert b.connections == 0 and not b.raw


@pytest.mark.parametrize("feed", FEEDS)
def test_a_keep_alive_request_for_another_allowed_host_is_dialled_on_its_own(
    origins: tuple[Origin, Origin], feed: str
) -> None:
    a, b = origins
    with Proxy(POLICY, NAMES) as px:
        data = get("allowed.test", a.port, "/one") + get("www.allowed.test", b.port, "/two")
        answers = exchange(px.http_port, data, feed, 2)
    assert [split_response(r)[0] for r in answers] == [200, 200]
    assert [d.target for d in px.decisions] == [
        f"allowed.test:{a.port}",
        f"www.allowed.test:{b.port}",
    ]
    assert [r[1] for r in a.requests] == [b"/one"] and a.connections == 1
    assert [r[1:3] for r in b.requests] == [(b"/two", f"www.allowed.test:{b.port}".encode())]
    assert b.connections == 1


@pytest.mark.parametrize("feed", FEEDS)
def test_a_request_inside_a_body_arrives_as_body_only(
    origins: tuple[Origin, Origin], feed: str
) -> None:
    a, b = origins
    hidden = get("other.test", b.port, "/hidden")
    with Proxy(POLICY, NAMES) as px:
        answers = exchange(px.http_port, post("allowed.test", a.port, hidden), feed, 1)
    assert [split_response(r)[0] for r in answers] == [200]
    assert a.requests == [(b"POST", b"/p", f"allowed.test:{a.port}".encode(), hidden)]
    assert a.raw.endswith(b"\r\n\r\n" + hidden) and a.raw.count(b"POST") == 1
    assert b.connections == 0 and len(px.decisions) == 1


@pytest.mark.parametrize("feed", FEEDS)
def test_a_request_after_the_last_chunk_is_decided_on_its_own(
    origins: tuple[Origin, Origin], feed: str
) -> None:
    a, b = origins
    body = b"5;ext=x\r\nhello\r\n0\r\n\r\n"
    data = CHUNKED_HEAD.format("allowed.test", a.port).encode() + body
    with Proxy(POLICY, NAMES) as px:
        first, second = exchange(px.http_port, data + get("other.test", b.port), feed, 2)
    assert split_response(first)[0] == 200 and split_response(second)[0] == 403
    assert [r[3] for r in a.requests] == [b"hello"]
    # re-framed by the proxy: its own chunks (their sizes follow what arrived when, fed
    # byte by byte), no extension, the body whole, and nothing after the last chunk
    _, _, chunks = bytes(a.raw).partition(b"\r\n\r\n")
    assert b";ext" not in chunks and chunks.endswith(b"\r\n0\r\n\r\n"), a.raw
    assert _dechunk(chunks) == b"hello", a.raw
    assert b.connections == 0


SMUGGLING = {
    "cl and te": "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
    "two content-lengths": "Content-Length: 4\r\nContent-Length: 4\r\n",
    "a content-length list": "Content-Length: 4, 4\r\n",
    "obs-fold": "Content-Length: 4\r\nX-A: 1\r\n Transfer-Encoding: chunked\r\n",
    "bare lf": "Content-Length: 4\nTransfer-Encoding: chunked\r\n",
    "te not chunked": "Transfer-Encoding: gzip, chunked\r\n",
}


@pytest.mark.parametrize("feed", FEEDS)
@pytest.mark.parametrize("case", SMUGGLING)
def test_smuggling_heads_are_refused_and_reach_nobody(
    origins: tuple[Origin, Origin], case: str, feed: str
) -> None:
    a, _ = origins
    head = f"POST http://allowed.test:{a.port}/p HTTP/1.1\r\nHost: h\r\n{SMUGGLING[case]}\r\n"
    with Proxy(POLICY, NAMES) as px:
        answers = exchange(px.http_port, head.encode() + b"0\r\n\r\n", feed, 1)
    status, headers, _ = split_response(answers[0])
    assert status in (400, 501), answers
    assert headers["x-proxy-error"].startswith("bad-request; reason="), headers
    assert a.connections == 0 and not px.decisions


def test_a_body_shorter_than_its_length_is_refused_and_no_request_completes(
    origins: tuple[Origin, Origin],
) -> None:
    a, _ = origins
    with Proxy(POLICY, NAMES) as px:
        data = post("allowed.test", a.port, b"x" * 10)[:-7]  # 3 of 10 bytes, then EOF
        answers = exchange(px.http_port, data, "whole", 1)
    assert split_response(answers[0])[0] == 400, answers
    time.sleep(0.1)
    assert a.requests == [] and len(px.decisions) == 1


# --- sandhold proxy, with its external decider -------------------------------------


@pytest.fixture
def mode(world: World, origins: tuple[Origin, Origin]) -> Iterator[ModeProxy]:
    p = ModeProxy(world, origins[0].port, denied=[], timeout="5")
    yield p
    p.stop()


@pytest.mark.parametrize("feed", FEEDS)
def test_proxy_mode_asks_the_decider_for_every_pipelined_request(
    mode: ModeProxy, origins: tuple[Origin, Origin], feed: str
) -> None:
    a, b = origins
    host = "127.0.0.1"
    data = get(host, a.port, "/one") + get(host, a.port, "/deny") + get(host, a.port, "/three")
    answers = exchange(mode.port, data, feed, 3)
    assert [split_response(r)[0] for r in answers] == [200, 451]  # closed after the deny
    assert [m["path"] for m in mode.asked() if m.get("t") == "req"] == ["/one", "/deny"]
    assert [r[1] for r in a.requests] == [b"/one"]
    # another origin on the same connection: refused by the hello's lists, unasked
    answers = exchange(mode.port, get(host, a.port, "/x") + get(host, b.port, "/y"), feed, 2)
    assert [split_response(r)[0] for r in answers] == [200, 403]
    assert b.connections == 0


@pytest.mark.parametrize("feed", FEEDS)
def test_proxy_mode_body_and_chunk_smuggling_reach_no_origin_undecided(
    mode: ModeProxy, origins: tuple[Origin, Origin], feed: str
) -> None:
    a, _ = origins
    hidden = get("127.0.0.1", a.port, "/deny")
    answers = exchange(mode.port, post("127.0.0.1", a.port, hidden), feed, 1)
    assert [split_response(r)[0] for r in answers] == [200]
    assert a.requests == [(b"POST", b"/p", f"127.0.0.1:{a.port}".encode(), hidden)]
    chunked = CHUNKED_HEAD.format("127.0.0.1", a.port).encode() + b"2\r\nhi\r\n0\r\n\r\n"
    answers = exchange(mode.port, chunked + hidden, feed, 2)
    assert [split_response(r)[0] for r in answers] == [200, 451]
    assert [r[1] for r in a.requests] == [b"/p", b"/c"]
    paths = [m["path"] for m in mode.asked() if m.get("t") == "req"]
    assert paths == ["/p", "/c", "/deny"]
    head = f"POST http://127.0.0.1:{a.port}/p HTTP/1.1\r\nHost: h\r\n"
    for case in SMUGGLING.values():
        answers = exchange(mode.port, (head + case + "\r\n0\r\n\r\n").encode(), feed, 1)
        assert split_response(answers[0])[0] in (400, 501), (case, answers)
    assert len(a.requests) == 2


# --- the parser alone, whole and byte by byte -------------------------------------

PARSER_CASES = [
    # (bytes after the head, body pieces joined, what is left for the next request)
    (b"Content-Length: 5\r\n\r\nhelloGET", b"hello", b"GET"),
    (b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET", b"abc", b"GET"),
    (b"\r\nGET", b"", b"GET"),
]


@pytest.mark.parametrize(("rest", "body", "left"), PARSER_CASES)
@pytest.mark.parametrize("feed", FEEDS)
def test_the_parser_frames_the_body_exactly(
    rest: bytes, body: bytes, left: bytes, feed: str
) -> None:
    data = b"POST http://a.test/ HTTP/1.1\r\nHost: a\r\n" + rest
    parser = RequestHeadParser()
    pieces = [data] if feed == "whole" else [data[i : i + 1] for i in range(len(data))]
    got, framed, ended = bytearray(), bytearray(), False
    for piece in pieces:
        if parser.next_event() is None:
            parser.receive_data(piece)
            continue
        parser.receive_body(piece)
    assert parser.next_event() is not None
    while (item := parser.next_body()) is not None:
        framed += frame_body(item, parser.chunked)
        if isinstance(item, tuple):
            ended = True
            break
        got += item
    assert ended and bytes(got) == body and parser.trailing_data == left


@pytest.mark.parametrize("feed", FEEDS)
def test_proxy_mode_a_body_the_decider_read_ends_where_its_framing_says(
    mode: ModeProxy, origins: tuple[Origin, Origin], feed: str
) -> None:
    """need_body reads the body on the request's own parser: what follows it (in the
    same write) is the next request, asked about on its own."""
    a, _ = origins
    head = f"POST http://127.0.0.1:{a.port}/body HTTP/1.1\r\nHost: h\r\n"
    sized = (head + "Content-Length: 4\r\n\r\nokay").encode()
    chunked = (head + "Transfer-Encoding: chunked\r\n\r\n4\r\nokay\r\n0\r\n\r\n").encode()
    for first in (sized, chunked):
        answers = exchange(mode.port, first + get("127.0.0.1", a.port, "/deny"), feed, 2)
        assert [split_response(r)[0] for r in answers] == [200, 451]
    assert [r[1::2] for r in a.requests] == [(b"/body", b"okay")] * 2
    paths = [m["path"] for m in mode.asked() if m.get("t") == "req"]
    assert paths == ["/body", "/deny"] * 2


def _dechunk(data: bytes) -> bytes:
    """The body of a chunked message body; fails on anything after the last chunk."""
    out = b""
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert data == b"\r\n", data
            return out
        out, data = out + data[:size], data[size:]
        assert data.startswith(b"\r\n")
        data = data[2:]
