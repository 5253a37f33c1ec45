"""The decider protocol, sans-I/O: framing, strict validation, and the per-request machine.

Every input is fed whole and one byte at a time; arbitrary bytes never crash the
decoder or make it buffer more than one frame.
"""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandhold.net.decider import (
    MAX_FRAME,
    READING_BODY,
    SHOWN,
    WAITING,
    Allow,
    DeciderDead,
    DeciderLink,
    Deny,
    FrameDecoder,
    Hello,
    NeedBody,
    encode_body_frame,
    encode_frame,
    is_egress_entry,
    parse_strict_json,
    path_ambiguity,
    req_fields,
    validate_hello,
    validate_verdict,
)

HELLO = {"t": "hello", "proto": 1, "allowedDomains": ["a.example"], "deniedDomains": []}
REQ = {"method": "GET", "host": "a.example", "port": 80, "path": "/"}


def frame_raw(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack(">I", len(data)) + data


def feed(link: DeciderLink, data: bytes, *, bytewise: bool) -> list[object]:
    events: list[object] = []
    chunks = [data[i : i + 1] for i in range(len(data))] if bytewise else [data]
    for chunk in chunks:
        link.receive_data(chunk)
        while (event := link.next_event()) is not None:
            events.append(event)
    return events


def ready_link() -> DeciderLink:
    link = DeciderLink()
    assert link.start() == frame_raw('{"t":"hello","proto":1}')
    assert feed(link, encode_frame(HELLO), bytewise=False) == [Hello(("a.example",), ())]
    return link


# --- framing --------------------------------------------------------------------------


@pytest.mark.parametrize("bytewise", [False, True])
def test_frames_split_whole_and_byte_by_byte(bytewise: bool) -> None:
    frames = [b"{}", b'{"a":1}', b"x" * 300]
    stream = b"".join(frame_raw(f) for f in frames)
    decoder = FrameDecoder()
    out = []
    for chunk in [stream[i : i + 1] for i in range(len(stream))] if bytewise else [stream]:
        decoder.receive_data(chunk)
        while (f := decoder.next_frame()) is not None:
            out.append(f)
    assert out == frames
    assert decoder.buffered == 0


def test_oversized_frame_dies_on_its_length_alone() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(struct.pack(">I", MAX_FRAME + 1))
    with pytest.raises(DeciderDead, match="oversized"):
        decoder.next_frame()
    with pytest.raises(DeciderDead, match="oversized"):  # and stays dead
        decoder.receive_data(b"{}")
    assert decoder.buffered == 0


def test_frame_of_exactly_the_limit_is_read() -> None:
    body = b'"' + b"x" * (MAX_FRAME - 2) + b'"'
    decoder = FrameDecoder()
    decoder.receive_data(frame_raw(body))
    assert decoder.next_frame() == body


def test_eof_inside_a_frame_and_between_frames_is_death() -> None:
    for tail in (b"", b"\x00\x00", frame_raw(b"{}")[:-1]):
        decoder = FrameDecoder()
        decoder.receive_data(tail)
        decoder.receive_data(b"")
        with pytest.raises(DeciderDead, match="closed the stream"):
            decoder.next_frame()


def test_encoders_match_the_reference_byte_for_byte() -> None:
    assert encode_frame({"t": "hello", "proto": 1}) == frame_raw('{"t":"hello","proto":1}')
    assert encode_body_frame(7, b"hi", False) == frame_raw('{"t":"body","id":7,"data":"aGk="}')
    assert encode_body_frame(7, b"", True) == frame_raw('{"t":"body","id":7,"data":"","cut":true}')
    assert encode_frame({"t": "req", "host": "é"}) == frame_raw('{"t":"req","host":"é"}')


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=20))
def test_arbitrary_bytes_never_crash_or_buffer_unboundedly(chunks: list[bytes]) -> None:
    link = DeciderLink(max_frame=256)
    link.start()
    for chunk in chunks:
        try:
            link.receive_data(chunk)
            while link.next_event() is not None:
                pass
        except DeciderDead:
            assert link.dead is not None
            return
        assert link.buffered <= 4 + 256 + 64


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
        max_leaves=8,
    )
)
def test_arbitrary_json_after_hello_is_an_event_or_death(value: object) -> None:
    link = ready_link()
    link.request(REQ)
    try:
        events = feed(
            link,
            encode_frame({"v": value}) if not isinstance(value, dict) else encode_frame(value),
            bytewise=False,
        )
    except DeciderDead:
        return
    assert all(isinstance(e, (Allow, Deny, NeedBody)) for e in events)


# --- strict JSON --------------------------------------------------------------------------

BAD_JSON = [
    (b"\xff{}", "not UTF-8"),
    (b"[]", "one JSON object"),
    (b'"x"', "one JSON object"),
    (b"{", "valid JSON"),
    (b'{"a":null}', "null"),
    (b'{"a":[1,null]}', "null"),
    (b'{"a":1,"a":2}', "duplicate key"),
    (b'{"a":{"b":1,"b":1}}', "duplicate key"),
    (b'{"a":"\\ud800"}', "lone surrogate"),
    (b'{"a":NaN}', "NaN"),
    (b'{"a":Infinity}', "Infinity"),
    (b"{} {}", "valid JSON"),
    (b'{"a":1}\x00', "valid JSON"),
]


@pytest.mark.parametrize(("raw", "why"), BAD_JSON)
def test_strict_json_refuses(raw: bytes, why: str) -> None:
    with pytest.raises(DeciderDead, match=why):
        parse_strict_json(raw)


def test_strict_json_accepts_a_bom_and_pairs() -> None:
    assert parse_strict_json('\ufeff{"a":"\\ud83d\\ude00"}'.encode()) == {"a": "😀"}


# --- message validation -------------------------------------------------------------------

GOOD_VERDICTS = [
    ({"t": "verdict", "id": 1, "action": "allow"}, Allow(1)),
    ({"t": "verdict", "id": 1.0, "action": "allow"}, Allow(1)),
    (
        {
            "t": "verdict",
            "id": 2,
            "action": "allow",
            "setHeaders": {"x-a": ["1", "2"], "x-b": []},
            "removeHeaders": ["x-c"],
            "cred": "api",
            "credential": "tok-1",
        },
        Allow(2, (("x-a", ("1", "2")), ("x-b", ())), ("x-c",), "api", "tok-1"),
    ),
    ({"t": "verdict", "id": 3, "action": "deny", "status": 451}, Deny(3, 451)),
    (
        {"t": "verdict", "id": 3, "action": "deny", "status": 599, "reason": "a\tb"},
        Deny(3, 599, "a\tb"),
    ),
    ({"t": "verdict", "id": 4, "action": "need_body", "max": 32 << 20}, NeedBody(4, 32 << 20)),
]

BAD_VERDICTS = [
    {"t": "verdict", "id": 0, "action": "allow"},
    {"t": "verdict", "id": 2**53, "action": "allow"},
    {"t": "verdict", "id": 1.5, "action": "allow"},
    {"t": "verdict", "id": True, "action": "allow"},
    {"t": "verdict", "id": "1", "action": "allow"},
    {"t": "verdict", "action": "allow"},
    {"t": "verdict", "id": 1, "action": "maybe"},
    {"t": "verdict", "id": 1, "action": "allow", "extra": 1},
    {"t": "verdict", "id": 1, "action": "allow", "setHeaders": {}},
    {"t": "verdict", "id": 1, "action": "allow", "removeHeaders": []},
    {"t": "verdict", "id": 1, "action": "allow", "cred": ""},
    {"t": "verdict", "id": 1, "action": "allow", "cred": "a"},
    {"t": "verdict", "id": 1, "action": "allow", "cred": "a", "credential": "has space"},
    {"t": "verdict", "id": 1, "action": "allow", "cred": "a", "credential": "x" * 8193},
    {"t": "verdict", "id": 1, "action": "allow", "setHeaders": {"X-Up": ["1"]}},
    {"t": "verdict", "id": 1, "action": "allow", "setHeaders": {"x": ["a\nb"]}},
    {"t": "verdict", "id": 1, "action": "allow", "setHeaders": {"x": ["a\x85b"]}},
    {"t": "verdict", "id": 1, "action": "allow", "setHeaders": {"authorization": ["x"]}},
    {"t": "verdict", "id": 1, "action": "allow", "setHeaders": {"content_length": ["1"]}},
    {"t": "verdict", "id": 1, "action": "allow", "setHeaders": {"x": "1"}},
    {"t": "verdict", "id": 1, "action": "allow", "setHeaders": {f"x{i}": [] for i in range(191)}},
    {"t": "verdict", "id": 1, "action": "allow", "removeHeaders": ["host"]},
    {"t": "verdict", "id": 1, "action": "allow", "removeHeaders": ["x", "x"]},
    {"t": "verdict", "id": 1, "action": "allow", "removeHeaders": ["bad name"]},
    {"t": "verdict", "id": 1, "action": "deny"},
    {"t": "verdict", "id": 1, "action": "deny", "status": 399},
    {"t": "verdict", "id": 1, "action": "deny", "status": 600},
    {"t": "verdict", "id": 1, "action": "deny", "status": 403, "reason": ""},
    {"t": "verdict", "id": 1, "action": "deny", "status": 403, "reason": "a\rb"},
    {"t": "verdict", "id": 1, "action": "deny", "status": 403, "reason": "x" * 1025},
    {"t": "verdict", "id": 1, "action": "need_body", "max": 0},
    {"t": "verdict", "id": 1, "action": "need_body", "max": (32 << 20) + 1},
    {"t": "verdict", "id": 1, "action": "need_body"},
    {"t": "req", "id": 1, "action": "allow"},
    {"id": 1, "action": "allow"},
]


@pytest.mark.parametrize(("msg", "expected"), GOOD_VERDICTS)
def test_good_verdicts(msg: dict[str, object], expected: object) -> None:
    assert validate_verdict(msg) == expected


@pytest.mark.parametrize("msg", BAD_VERDICTS, ids=lambda m: json.dumps(m)[:60])
def test_bad_verdicts_break_the_link(msg: dict[str, object]) -> None:
    with pytest.raises(DeciderDead, match="bad verdict"):
        validate_verdict(msg)
    link = ready_link()
    link.request(REQ)
    with pytest.raises(DeciderDead):
        feed(link, encode_frame(msg), bytewise=True)
    assert link.dead is not None
    with pytest.raises(DeciderDead):  # dead for good
        link.request(REQ)


BAD_HELLOS = [
    {"t": "hello", "proto": 2, "allowedDomains": [], "deniedDomains": []},
    {"t": "hello", "proto": 1, "allowedDomains": []},
    {"t": "hello", "proto": 1, "allowedDomains": [], "deniedDomains": [], "x": 1},
    {"t": "hello", "proto": 1, "allowedDomains": ["a.example", "a.example"], "deniedDomains": []},
    {"t": "hello", "proto": 1, "allowedDomains": ["A.example"], "deniedDomains": []},
    {"t": "hello", "proto": 1, "allowedDomains": ["*.com"], "deniedDomains": []},
    {"t": "hello", "proto": 1, "allowedDomains": ["http://a.example"], "deniedDomains": []},
    {"t": "hello", "proto": 1, "allowedDomains": [1], "deniedDomains": []},
    {"t": "verdict", "id": 1, "action": "allow"},
]


@pytest.mark.parametrize("msg", BAD_HELLOS, ids=lambda m: json.dumps(m)[:60])
def test_bad_hellos(msg: dict[str, object]) -> None:
    with pytest.raises(DeciderDead, match="bad hello"):
        validate_hello(msg)


@pytest.mark.parametrize(
    ("entry", "ok"),
    [
        ("a.example", True),
        ("*.example.org", True),
        ("a.example:443", True),
        ("127.0.0.1", True),
        ("127.0.0.1:8080", True),
        ("::1", True),
        ("[::1]:80", True),
        ("[::1]", True),
        ("*.com", False),
        ("a.example:0", False),
        ("a.example:65536", False),
        ("a..example", False),
        ("-a.example", False),
        ("a.123", False),
        ("127.1", False),
        ("a.example/x", False),
        ("[127.0.0.1]:80", False),
        ("", False),
    ],
)
def test_egress_entries(entry: str, ok: bool) -> None:
    assert is_egress_entry(entry) is ok


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/v1/messages", None),
        ("/", None),
        ("/a/b/", None),
        ("*", None),
        ("/a%20b/%E2%82%AC", None),  # escapes of other characters mean what they say
        ("/%25%3F%23", None),
        ("//private/x", "empty segment"),
        ("/a//b", "empty segment"),
        ("/./x", "'.' or '..'"),
        ("/x/..", "'.' or '..'"),
        ("/%2e%2E/x", "unreserved"),
        ("/%70rivate", "character (%70)"),
        ("/a%2Fb", "separator"),
        ("/a%5cb", "separator"),
        ("/a\\b", "'\\\\'"),
        ("/a;b/c", "';'"),
        ("/a%2", "malformed"),
        ("/a%00b", "NUL"),
        ("/a%3bb", "separator"),  # an escaped ';'
        ("/%252e%252e/x", "escaped escape"),  # decoded twice by some origins or proxies
        ("/100%25/x", None),  # a literal '%' is fine
        ("/%c0%ae%c0%ae/x", "not UTF-8"),  # overlong '.'
        ("/private./x", "ending in '.'"),
        ("/private%20/x", "a space"),
        ("/caf%C3%A9/x", None),  # UTF-8 escapes of other characters are fine
        ("/a%g0", "malformed"),
        ("x", "does not start"),
    ],
)
def test_paths_that_mean_one_path_only(path: str, why: str | None) -> None:
    """The decider judges the text the origin gets: it must name one path only."""
    got = path_ambiguity(path)
    if why is None:
        assert got is None
        assert isinstance(
            req_fields(method="GET", host="a", port=80, target=path, headers=[]), dict
        )
    else:
        assert got is not None and why in got, got
        assert req_fields(method="GET", host="a", port=80, target=path, headers=[]) == got


def test_req_fields_left_out_when_empty_and_limits() -> None:
    fields = req_fields(method="GET", host="a.example", port=80, target="/p", headers=[])
    assert fields == {"method": "GET", "host": "a.example", "port": 80, "path": "/p"}
    fields = req_fields(
        method="GET",
        host="a.example",
        port=80,
        target="/p?q=1",
        headers=[("Host", "a.example"), ("X-A", "1"), ("x-a", "2")],
    )
    assert fields == {
        "method": "GET",
        "host": "a.example",
        "port": 80,
        "hostHeader": "a.example",
        "path": "/p",
        "query": "q=1",
        "headers": {"x-a": ["1", "2"]},
    }
    bad = [
        [("Host", "a"), ("Host", "b")],
        [("x", "a\x01")],
        [(f"x{i}", "v") for i in range(191)],
    ]
    for headers in bad:
        assert isinstance(
            req_fields(method="GET", host="a", port=80, target="/", headers=headers), str
        )
    assert isinstance(
        req_fields(method="GET", host="a", port=80, target="/" + "x" * 9000, headers=[]), str
    )


# --- the per-request machine --------------------------------------------------------------


def verdict(ident: int, action: str = "allow", **extra: object) -> bytes:
    return encode_frame({"t": "verdict", "id": ident, "action": action, **extra})


@pytest.mark.parametrize("bytewise", [False, True])
def test_a_request_through_need_body(bytewise: bool) -> None:
    link = ready_link()
    ident, frame = link.request(REQ)
    assert ident == 1
    assert json.loads(frame[4:]) == {"t": "req", "id": 1, **REQ}
    assert link.state(1) == WAITING
    assert feed(link, verdict(1, "need_body", max=5), bytewise=bytewise) == [NeedBody(1, 5)]
    assert link.state(1) == READING_BODY
    link.body(1, b"hello", False)
    assert link.state(1) == SHOWN
    assert feed(link, verdict(1), bytewise=bytewise) == [Allow(1)]
    assert link.state(1) is None
    assert link.request(REQ)[0] == 2  # ids strictly increase


@pytest.mark.parametrize(
    ("setup", "frame", "why"),
    [
        ("waiting", verdict(2), "nothing waits"),
        ("ended", verdict(1), "nothing waits"),
        ("reading", verdict(1), "while it is reading_body"),
        ("reading", verdict(1, "need_body", max=1), "while it is reading_body"),
        ("shown", verdict(1, "need_body", max=1), "while it is shown"),
        ("late_shown", verdict(1, "need_body", max=1), "need_body where none may come"),
        ("waiting", encode_frame(HELLO), "bad verdict"),
    ],
)
def test_violations_kill_the_link(setup: str, frame: bytes, why: str) -> None:
    link = ready_link()
    link.request(REQ)
    if setup == "ended":
        feed(link, verdict(1), bytewise=False)
    if setup in ("reading", "shown", "late_shown"):
        feed(link, verdict(1, "need_body", max=1), bytewise=False)
    if setup == "shown":
        link.body(1, b"x", False)
    if setup == "late_shown":
        link.give_up(1)
    with pytest.raises(DeciderDead, match=why):
        feed(link, frame, bytewise=False)
    state_before = link.dead
    with pytest.raises(DeciderDead):
        link.next_event()
    assert link.dead is state_before


def test_late_verdicts_are_dropped() -> None:
    link = ready_link()
    link.request(REQ)
    link.give_up(1)  # timed out waiting
    assert (
        feed(link, verdict(1, "need_body", max=1) + verdict(1, "deny", status=403), bytewise=True)
        == []
    )
    with pytest.raises(DeciderDead, match="nothing waits"):  # forgotten once it ended
        feed(link, verdict(1), bytewise=False)


def test_deny_while_reading_the_body_ends_the_request() -> None:
    link = ready_link()
    link.request(REQ)
    feed(link, verdict(1, "need_body", max=9), bytewise=False)
    assert feed(link, verdict(1, "deny", status=413), bytewise=False) == [Deny(1, 413)]
    with pytest.raises(RuntimeError):  # caller's mistake: no state change
        link.body(1, b"", False)
    assert link.dead is None


def test_ids_far_below_the_newest_are_forgotten() -> None:
    link = ready_link()
    for _ in range(4100):
        ident, _ = link.request(REQ)
        link.give_up(ident)
    assert feed(link, verdict(2), bytewise=False) == []  # dropped, outside the window


def test_frames_before_hello_must_be_the_hello() -> None:
    link = DeciderLink()
    link.start()
    with pytest.raises(DeciderDead, match="bad hello"):
        feed(link, verdict(1), bytewise=False)
    link = DeciderLink()
    with pytest.raises(DeciderDead, match="not ready"):
        link.request(REQ)


def test_a_request_too_large_is_refused_without_changing_state() -> None:
    link = ready_link()
    with pytest.raises(ValueError, match="too large"):
        link.request({**REQ, "path": "/" + "x" * MAX_FRAME})
    assert link.request(REQ)[0] == 1
