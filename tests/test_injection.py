"""The injection stream substituter and host gating, sans I/O (F-CRED-3)."""

from __future__ import annotations

import random

import pytest

from sandhold.net.injection import Injector, StreamSubstituter, substitute
from sandhold.policy.placeholders import Injection

PAIRS = {b"sandhold_placeholder_aaaa": b"REAL-A", b"AKIAXXXXXXXXXXXXXXXX": b"AKIAREALREALREALREAL"}
STREAMS = [
    b"",
    b"no placeholder here",
    b"sandhold_placeholder_aaaa",
    b"x=sandhold_placeholder_aaaa&y=AKIAXXXXXXXXXXXXXXXX&z=sandhold_placeholder_aaa",
    b"sandhold_placeholder_aaaasandhold_placeholder_aaaa",
    b"sandhold_placeholder_aaa" * 3 + b"a",
]


@pytest.mark.parametrize("stream", STREAMS)
def test_pieces_give_what_the_whole_gives(stream: bytes) -> None:
    expected = substitute(stream, PAIRS)
    for cuts in ("whole", "bytes", "random"):
        sub = StreamSubstituter(PAIRS)
        if cuts == "whole":
            pieces = [stream]
        elif cuts == "bytes":
            pieces = [stream[i : i + 1] for i in range(len(stream))]
        else:
            rng = random.Random(len(stream))
            pieces, i = [], 0
            while i < len(stream):
                n = rng.randint(1, 9)
                pieces.append(stream[i : i + n])
                i += n
        out = b"".join(sub.feed(p) for p in pieces) + sub.flush()
        assert out == expected, cuts


def test_injector_matches_the_destination_host_only() -> None:
    rows = [
        Injection("ph-one-0123456789", "real-one", ("*.example.com",), "one"),
        Injection("ph-two-0123456789", "real-two", ("api.other.org",), "two"),
    ]
    inj = Injector(rows)
    assert inj.pairs_for("api.example.com") == {b"ph-one-0123456789": b"real-one"}
    assert inj.pairs_for("API.OTHER.ORG.") == {b"ph-two-0123456789": b"real-two"}
    assert inj.pairs_for("example.com") == {} and not inj.wants("evil.test")
    assert "real-one" not in repr(rows)
