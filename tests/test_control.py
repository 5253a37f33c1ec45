"""The --control-fd line protocol as a pure function (F-CTL-1), whole and byte by byte."""

from __future__ import annotations

import json

import pytest

from sandhold.net.control import MAX_LINE, Applied, ControlChannel, Rejected
from sandhold.settings import FilesystemSettings

FS = FilesystemSettings(allow_write=(".",))
GOOD = (
    json.dumps(
        {
            "network": {"allowedDomains": ["example.com"], "deniedDomains": []},
            "filesystem": {"allowWrite": ["."]},
        }
    ).encode()
    + b"\n"
)


def feed_all(data: bytes, *, bytewise: bool) -> list[Applied | Rejected]:
    ch = ControlChannel(FS)
    if not bytewise:
        return ch.feed(data)
    out: list[Applied | Rejected] = []
    for i in range(len(data)):
        out += ch.feed(data[i : i + 1])
    return out


@pytest.mark.parametrize("bytewise", [False, True])
def test_a_whole_config_applies_its_network_lists(bytewise: bool) -> None:
    (event,) = feed_all(GOOD, bytewise=bytewise)
    assert isinstance(event, Applied)
    assert event.network.allowed_domains == ("example.com",)
    assert event.note == ""


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        (b"not json\n", "not valid JSON"),
        (b'{"network": {"allowedDomains": ["*"]}}\n', "network.allowedDomains[0]"),
        (b'{"netwrok": {}}\n', "unknown key"),
        (b"\xff\xfe\n", "not UTF-8"),
        (b"[]\n", "expected an object"),
        # parse failures that are not json.JSONDecodeError must not stop the stream
        (b'{"network": {"httpProxyPort": ' + b"1" * 5000 + b"}}\n", "not valid JSON"),
        (b"[" * 200_000 + b"\n", "nested too deeply"),
        (b'{"network": {"allowedDomains": []}, "network": {}}\n', "appears twice"),
    ],
)
@pytest.mark.parametrize("bytewise", [False, True])
def test_an_invalid_line_is_rejected_with_a_reason(
    line: bytes, needle: str, bytewise: bool
) -> None:
    events = feed_all(line + GOOD, bytewise=bytewise)
    assert isinstance(events[0], Rejected) and needle in events[0].reason
    assert isinstance(events[1], Applied)  # the stream goes on


def test_changed_filesystem_rules_are_noted_not_applied() -> None:
    line = (
        json.dumps(
            {"network": {"allowedDomains": ["a.example.com"]}, "filesystem": {"allowWrite": ["/"]}}
        ).encode()
        + b"\n"
    )
    (event,) = ControlChannel(FS).feed(line)
    assert isinstance(event, Applied) and "fixed at launch" in event.note


def test_blank_lines_are_ignored_and_partial_line_at_eof_rejected() -> None:
    ch = ControlChannel(FS)
    assert ch.feed(b"\n  \n") == []
    assert ch.feed(b'{"network": ') == []
    (event,) = ch.feed(b"")
    assert isinstance(event, Rejected) and "middle of a line" in event.reason


def test_overlong_line_is_rejected_once_and_memory_stays_bounded() -> None:
    ch = ControlChannel(FS)
    events = ch.feed(b"x" * (MAX_LINE + 10))
    assert len(events) == 1 and isinstance(events[0], Rejected)
    assert ch.feed(b"y" * (MAX_LINE + 10)) == []  # still the same line: no second error
    assert len(ch._buffer) <= MAX_LINE
    (event,) = ch.feed(b"\n" + GOOD)
    assert isinstance(event, Applied)


def test_changed_socket_rules_are_noted_not_applied() -> None:
    from sandhold.settings import NetworkSettings

    launch = NetworkSettings(allow_unix_sockets=("/run/x.sock",))
    line = b'{"network": {"allowedDomains": []}, "filesystem": {"allowWrite": ["."]}}\n'
    (event,) = ControlChannel(FS, launch).feed(line)
    assert isinstance(event, Applied) and "unix socket and local binding rules" in event.note
    same = (
        b'{"network": {"allowUnixSockets": ["/run/x.sock"]}, "filesystem": {"allowWrite": ["."]}}\n'
    )
    (event,) = ControlChannel(FS, launch).feed(same)
    assert isinstance(event, Applied) and event.note == ""
