"""``net.upstream_http`` against h11: requests rendered as h11 renders them, responses framed as
h11 frames them, each case fed whole and byte by byte (the differential test of a
hand-written piece). Rows marked stricter are refused here and read by h11."""

from __future__ import annotations

import h11
import pytest

from sandhold.net.upstream_http import RequestWriter, ResponseReader, UpstreamError

OK = b"HTTP/1.1 200 OK\r\n"

# (request method, the upstream's bytes, what follows them (never forwarded))
RESPONSES = [
    (b"GET", OK + b"Content-Length: 3\r\n\r\nok\n", b""),
    (b"GET", OK + b"Content-Length: 3\r\n\r\nok\n", b"HTTP/1.1 200 OK\r\n\r\nsmuggled"),
    (b"GET", OK + b"content-length: 0\r\nServer: x\r\n\r\n", b"junk"),
    (b"GET", OK + b"Content-Length: 5, 5\r\n\r\nhello", b""),
    (b"GET", OK + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", b"next"),
    (b"GET", OK + b"Transfer-Encoding: Chunked\r\n\r\n3;x=y\r\nabc\r\nA\r\n0123456789\r\n"
     b"0\r\nT: v\r\n\r\n", b""),
    (b"HEAD", OK + b"Content-Length: 1000\r\n\r\n", b""),
    (b"GET", b"HTTP/1.1 204 No Content\r\n\r\n", b""),
    (b"GET", b"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n", b""),
    (b"GET", OK + b"Connection: close\r\nContent-Length: 2\r\n\r\nhi", b""),
    (b"GET", OK + b"Connection: keep-alive, Close\r\nContent-Length: 2\r\n\r\nhi", b""),
    (b"GET", b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi", b""),
    (b"GET", b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nhi", b""),  # no reason phrase
    (b"POST", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 1\r\n\r\nx",
     b""),
    (b"GET", b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK + b"Content-Length: 1\r\n\r\nx",
     b""),
    (b"GET", OK + b"X: a\r\nX: b\r\nContent-Length: 1\r\n\r\nx", b""),
]  # fmt: skip

CLOSE_DELIMITED = OK + b"Server: old\r\n\r\nuntil the end"

# (method, bytes, refused by both, or only here (stricter))
BAD = [
    (b"GET", b"HTTP/2 200 OK\r\n\r\n", "both"),
    (b"GET", b"HTTP/1.1 2000 OK\r\n\r\n", "both"),
    (b"GET", OK + b"Content-Length: 1, 2\r\n\r\n", "both"),
    (b"GET", OK + b"Content-Length: -1\r\n\r\n", "both"),
    (b"GET", OK + b"Transfer-Encoding: gzip\r\n\r\n", "both"),
    (b"GET", OK + b"Bad Header\r\n\r\n", "both"),
    (b"GET", OK + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", "both"),
    (b"GET", OK + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n", "both"),
    (b"GET", b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "stricter"),
    (b"GET", OK + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", "stricter"),
    (b"GET", OK + b"X: a\r\n b\r\nContent-Length: 0\r\n\r\n", "stricter"),  # obs-fold
]


def _h11(method: bytes, data: bytes, whole: bool) -> tuple[bytes, bool, bytes]:
    """What h11 forwards (its events re-sent by a server connection), whether it keeps
    the connection, and what it leaves unread."""
    c = h11.Connection(h11.CLIENT)
    c.send(h11.Request(method=method, target=b"/", headers=[(b"host", b"u")]))
    c.send(h11.EndOfMessage())
    server = h11.Connection(h11.SERVER)
    server.receive_data(b"%s / HTTP/1.1\r\nHost: u\r\n\r\n" % method)
    server.next_event()
    server.next_event()
    out = []
    pieces = [data] if whole else [data[i : i + 1] for i in range(len(data))]
    pieces.append(b"")
    while True:
        event = c.next_event()
        if event is h11.NEED_DATA:
            c.receive_data(pieces.pop(0))
            continue
        assert not isinstance(event, h11.ConnectionClosed)
        if isinstance(event, h11.InformationalResponse):
            continue  # compared apart: h11 re-renders the reason phrase
        if isinstance(event, h11.Response):
            continue
        if isinstance(event, h11.Data):
            out.append(bytes(event.data))
        if isinstance(event, h11.EndOfMessage):
            break
    return b"".join(out), c.their_state is h11.DONE, c.trailing_data[0]


def _ours(method: bytes, data: bytes, whole: bool) -> tuple[bytes, ResponseReader]:
    r = ResponseReader(method, forward_100=True)
    pieces = [data] if whole else [data[i : i + 1] for i in range(len(data))]
    out = []
    for piece in [*pieces, b""]:
        out.append(r.feed(piece))
        if r.done and piece:
            continue
    return b"".join(out), r


def _body(raw: bytes, method: bytes) -> bytes:
    """The body h11 would hand out, decoded, from the raw bytes we forward."""
    c = h11.Connection(h11.CLIENT)
    c.send(h11.Request(method=method, target=b"/", headers=[(b"host", b"u")]))
    c.send(h11.EndOfMessage())
    c.receive_data(raw)
    c.receive_data(b"")
    out = []
    while True:
        event = c.next_event()
        if isinstance(event, h11.Data):
            out.append(bytes(event.data))
        if isinstance(event, h11.EndOfMessage | h11.ConnectionClosed) or event is h11.NEED_DATA:
            return b"".join(out)


@pytest.mark.parametrize("whole", [True, False])
@pytest.mark.parametrize(("method", "response", "after"), RESPONSES)
def test_responses_end_where_h11_ends_them(
    method: bytes, response: bytes, after: bytes, whole: bool
) -> None:
    data = response + after
    body, keep, rest = _h11(method, data, whole)
    forwarded, reader = _ours(method, data, whole)
    assert reader.done and forwarded == response  # unchanged, and nothing past its end
    assert reader.trailing == after
    if whole:  # byte by byte, h11 is fed only up to its end
        assert rest == after
    assert reader.keep_alive is keep
    assert _body(forwarded, method) == body


def test_an_unwaited_100_is_dropped_and_a_close_delimited_body_runs_to_the_end() -> None:
    final = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"
    r = ResponseReader(b"POST", forward_100=False)
    assert r.feed(b"HTTP/1.1 100 Continue\r\n\r\n" + final) == final and r.done
    r = ResponseReader(b"GET", forward_100=True)
    assert r.feed(CLOSE_DELIMITED) == CLOSE_DELIMITED and not r.done
    assert r.feed(b"") == b"" and r.done and not r.keep_alive
    body, _keep, _ = _h11(b"GET", CLOSE_DELIMITED, True)
    assert body == b"until the end"


@pytest.mark.parametrize(("method", "response", "who"), BAD)
def test_bad_responses_are_refused(method: bytes, response: bytes, who: str) -> None:
    for whole in (True, False):
        with pytest.raises(UpstreamError):
            _ours(method, response, whole)
        r = ResponseReader(method, forward_100=True)
        with pytest.raises(UpstreamError):
            r.feed(response)
            r.feed(b"")
        with pytest.raises(UpstreamError):
            r.feed(b"more")  # it stays failed
    if who == "both":
        with pytest.raises(h11.RemoteProtocolError):
            _h11(method, response, True)


def test_a_cut_response_is_an_error_and_bounds_hold() -> None:
    for cut in (b"", OK[:5], OK + b"Content-Length: 3\r\n\r\nok"):
        r = ResponseReader(b"GET", forward_100=True)
        with pytest.raises(UpstreamError):
            r.feed(cut)
            r.feed(b"")
    r = ResponseReader(b"GET", forward_100=True, max_head=100)
    with pytest.raises(UpstreamError):
        r.feed(OK + b"X: " + b"a" * 200)


REQUESTS = [
    (b"GET", b"/a?b=c", [(b"Host", b"h"), (b"Authorization", b"Bearer real")], [], []),
    (b"POST", b"/", [(b"host", b"h"), (b"Content-Length", b"3")], [b"abc"], []),
    (b"POST", b"/", [(b"Host", b"h"), (b"Transfer-Encoding", b"chunked")], [b"ab", b"c"], []),
    (b"PUT", b"/", [(b"Host", b"h"), (b"transfer-encoding", b"chunked")], [b"x"], [(b"T", b"v")]),
]


@pytest.mark.parametrize(("method", "target", "headers", "body", "trailers"), REQUESTS)
def test_requests_render_as_h11_renders_them(
    method: bytes,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    body: list[bytes],
    trailers: list[tuple[bytes, bytes]],
) -> None:
    c = h11.Connection(h11.CLIENT)
    theirs = c.send(h11.Request(method=method, target=target, headers=headers)) or b""
    for piece in body:
        theirs += c.send(h11.Data(data=piece)) or b""
    theirs += c.send(h11.EndOfMessage(headers=trailers)) or b""
    w = RequestWriter(b"h")
    ours = w.head(method, target, headers) + b"".join(w.data(p) for p in body) + w.end(trailers)
    assert ours == theirs


def test_a_request_gets_a_host_and_no_value_may_break_a_line() -> None:
    w = RequestWriter(b"api.test")
    assert w.head(b"GET", b"/", [(b"Accept", b"*/*")]) == (
        b"GET / HTTP/1.1\r\nAccept: */*\r\nHost: api.test\r\n\r\n"
    )
    for value in (b"a\r\nX-Evil: 1", b"a\nb", b"a\x00"):
        with pytest.raises(ValueError, match="CR, LF or NUL"):
            w.head(b"GET", b"/", [(b"Host", b"h"), (b"Authorization", value)])
