"""The agent protocol's codec, sans I/O: frames and field maps, whole and byte by byte.

Every case is fed whole, one byte at a time, and with the next frame's bytes
behind it (STYLE §1, §5.5); malformed input must raise ``ProtocolError``.
"""

from __future__ import annotations

import struct

import pytest

from sandhold.agent import protocol as P

FRAMES = [
    (P.HELLO, 0, P.encode_fields({"version": 1, "pid": 2})),
    (P.STDOUT, 7, b"hello\n"),
    (P.STDERR, 7, b""),
    (P.EXIT, 7, P.encode_fields({"code": 3, "signal": 0, "error": ""})),
    (P.STDOUT, 2**32 - 1, bytes(range(256)) * 10),
]


def stream() -> bytes:
    return b"".join(P.frame(*f) for f in FRAMES)


@pytest.mark.parametrize("step", [None, 1, 7, 9, 10, 4096])
def test_decoder_any_split(step: int | None) -> None:
    data = stream()
    dec = P.FrameDecoder()
    got = []
    if step is None:
        got = dec.feed(data)
    else:
        for i in range(0, len(data), step):
            got += dec.feed(data[i : i + step])
    assert got == FRAMES
    assert dec.pending == 0


@pytest.mark.parametrize("limit", [1, 2, len(FRAMES) - 1, len(FRAMES), 100])
@pytest.mark.parametrize("step", [None, 1, 10])
def test_decoder_limit_returns_at_most_that_many_and_keeps_the_rest(
    limit: int, step: int | None
) -> None:
    data = stream()
    dec = P.FrameDecoder()
    got: list[tuple[int, int, bytes]] = []
    for i in range(0, len(data), step or len(data)):
        batch = dec.feed(data[i : i + (step or len(data))], limit)
        assert len(batch) <= limit
        got += batch
    while batch := dec.feed(b"", limit):
        assert len(batch) <= limit
        got += batch
    assert got == FRAMES
    assert dec.pending == 0


def test_header_layout() -> None:
    assert P.frame(P.EXEC, 258, b"ab") == b"\x00\x00\x00\x02\x01\x00\x00\x01\x02ab"
    assert P.HEADER_SIZE == 9


def test_decoder_limits_and_kinds() -> None:
    with pytest.raises(P.ProtocolError, match="exceeds"):
        P.FrameDecoder(max_payload=10).feed(P.HEADER.pack(11, P.STDOUT, 1))
    with pytest.raises(P.ProtocolError, match="unexpected frame kind"):
        P.FrameDecoder(kinds=P.AGENT_KINDS).feed(P.frame(P.EXEC, 1, b""))
    assert P.FrameDecoder(kinds=P.HOST_KINDS).feed(P.frame(P.EXEC, 1, b"")) == [(P.EXEC, 1, b"")]


FIELD_CASES = [
    {},
    {"n": None},
    {"i": 0, "neg": -5, "big": 2**62, "flag": True},
    {"s": "text ü", "b": b"\x00\xff"},
    {"argv": ["sh", "-c", "echo"], "empty": []},
    {"env": [b"A=1", "B=\udcff"]},  # undecodable bytes survive as surrogates
]


@pytest.mark.parametrize("fields", FIELD_CASES)
def test_field_maps_round_trip(fields: dict[str, object]) -> None:
    decoded = P.decode_fields(P.encode_fields(fields))  # type: ignore[arg-type]
    assert list(decoded) == list(fields)
    for key, value in fields.items():
        got = decoded[key]
        if isinstance(value, bool):
            assert got == int(value)
        elif isinstance(value, str):
            assert P.text(got) == value
        elif isinstance(value, list):
            assert got == [
                v.encode("utf-8", "surrogateescape") if isinstance(v, str) else v for v in value
            ]
        else:
            assert got == value


def _map(*parts: bytes, count: int = 1) -> bytes:
    return struct.pack(">H", count) + b"".join(parts)


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"", "empty"),
        (b"\x00", "short count"),
        (_map(b"\x01a"), "no tag"),
        (_map(b"\x01ax"), "unknown tag"),
        (_map(b"\x01ai\x00\x00"), "short int"),
        (_map(b"\x01as\x00\x00\x00\x09abc"), "string past end"),
        (_map(b"\x01al\xff\xff\xff\xff"), "list longer than frame"),
        (_map(b"\x01an", b"\x01an", count=2), "duplicate"),
        (_map(b"\x01an") + b"junk", "trailing"),
        (_map(b"\x02\xff\xfen"), "non-ascii key"),
    ],
)
def test_malformed_field_maps(payload: bytes, why: str) -> None:
    with pytest.raises(P.ProtocolError):
        P.decode_fields(payload)


def test_kind_tables_are_disjoint_and_named() -> None:
    assert P.HOST_KINDS.isdisjoint(P.AGENT_KINDS)
    assert set(P.KIND_NAMES) == P.HOST_KINDS | P.AGENT_KINDS
    assert all(k < 0x80 for k in P.HOST_KINDS) and all(k >= 0x80 for k in P.AGENT_KINDS)
