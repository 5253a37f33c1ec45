"""Domain policy of the egress proxies: grammar, canonical hosts, decisions (F-NET-2/3, F-SET-4).

Every table row names the requirement it checks in its test id. The property
tests at the end push on what the tables cannot list: arbitrary text, every
IPv4 spelling libc accepts, and deny entries against any allow list.
"""

from __future__ import annotations

import ast
import doctest
import ipaddress
import socket
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sandhold.policy import domains
from sandhold.policy.domains import (
    BASELINE_ALLOWED,
    BASELINE_DENIED,
    GITHUB_DOMAINS,
    Decision,
    DomainPattern,
    DomainPolicy,
    canonical_host,
    decide,
    guard_addresses,
    is_ip,
    matches,
    parse_pattern,
    split_port,
    validate_pattern,
)

META = "169.254.169.254"
META_INT = int(ipaddress.IPv4Address(META))  # 2852039166
ALIBABA_INT = int(ipaddress.IPv4Address("100.100.100.200"))
ECS_HEX = hex(int(ipaddress.IPv4Address("169.254.170.2")))
IDEO_DOT = "\u3002"  # IDEOGRAPHIC FULL STOP, one of IDNA's label separators


def wide(text: str) -> str:
    """The fullwidth twin of printable ASCII (``a`` -> U+FF41, ``.`` -> U+FF0E)."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def rows(fid: str, *cases: tuple[object, ...]) -> list[object]:
    """Parametrize rows whose id starts with the requirement they check."""
    return [pytest.param(*case, id=f"{fid}:{case[0]!r}") for case in cases]


# --- split_port ---------------------------------------------------------------------

SPLIT_OK = rows(
    "F-NET-2",
    ("example.com", ("example.com", None)),
    ("example.com:443", ("example.com", 443)),
    ("example.com:65535", ("example.com", 65535)),
    ("[::1]", ("::1", None)),
    ("[::1]:8080", ("::1", 8080)),
    ("fd00:ec2::254", ("fd00:ec2::254", None)),
    ("*:443", ("*", 443)),
)

SPLIT_BAD = rows(
    "F-NET-2",
    ("example.com:",),
    ("example.com:0",),
    ("example.com:65536",),
    ("example.com:http",),
    ("example.com:-1",),
    ("example.com:+80",),
    ("example.com:\u0663",),  # ARABIC-INDIC DIGIT THREE: isdigit() and int() accept it
    ("example.com:000443",),
    ("[::1",),
    ("[::1]x",),
    ("[::1]:",),
)


@pytest.mark.parametrize(("entry", "expected"), SPLIT_OK)
def test_split_port(entry: str, expected: tuple[str, int | None]) -> None:
    assert split_port(entry) == expected


@pytest.mark.parametrize("entry", SPLIT_BAD)
def test_split_port_rejects(entry: str) -> None:
    with pytest.raises(ValueError):
        split_port(entry)


# --- pattern grammar ------------------------------------------------------------------

PATTERN_OK = rows(
    "F-NET-2",
    ("example.com", False, "name", "example.com", None),
    ("Example.COM.", False, "name", "example.com", None),
    ("*.example.com", False, "name", "*.example.com", None),
    ("*.EXAMPLE.com.", False, "name", "*.example.com", None),
    ("bedrock.*.amazonaws.com", False, "name", "bedrock.*.amazonaws.com", None),
    ("api.example.com:8443", False, "name", "api.example.com", 8443),
    ("*.example.com:443", False, "name", "*.example.com", 443),
    ("localhost", False, "name", "localhost", None),
    ("_acme-challenge.example.com", False, "name", "_acme-challenge.example.com", None),
    ("*.co.uk", False, "name", "*.co.uk", None),  # no public-suffix list: data, not I/O
    ("bücher.de", False, "name", "xn--bcher-kva.de", None),
    ("*.Bücher.de", False, "name", "*.xn--bcher-kva.de", None),
    (wide("example") + IDEO_DOT + "com", False, "name", "example.com", None),
    ("169.254.169.254", False, "ip", META, None),
    ("169.254.169.254:80", False, "ip", META, 80),
    ("fd00:ec2::254", False, "ip", "fd00:ec2::254", None),
    ("[fd00:ec2::254]", False, "ip", "fd00:ec2::254", None),
    ("[FD00:EC2:0::254]:80", False, "ip", "fd00:ec2::254", 80),
    ("[::ffff:169.254.169.254]", False, "ip", META, None),
    ("*", True, "any", "*", None),
    ("*:443", True, "any", "*", 443),
)

PATTERN_BAD = rows(
    "F-NET-2",
    ("", False, "empty"),
    (" example.com", False, "spaces"),
    ("example.com ", False, "spaces"),
    ("https://example.com", False, "scheme"),
    ("example.com/path", False, "path"),
    ("*", False, "every host"),
    ("*:443", False, "every host"),
    ("*.com", False, "too broad"),
    ("*.com", True, "too broad"),
    ("*.*.example.com", False, "at most one"),
    ("bedrock.*.*.com", False, "at most one"),
    ("foo*.example.com", False, "whole label"),
    ("example.*", False, "last label"),
    ("a..example.com", False, "empty label"),
    (".example.com", False, "empty label"),
    ("example.com..", False, "empty label"),
    ("example", False, "single-label"),
    ("exa mple.com", False, "spaces"),
    ("ex@mple.com", False, "'@'"),
    ("exa!mple.com", False, "'!'"),
    ("a" * 64 + ".com", False, "longer than 63"),
    ("example.com:0", False, "port"),
    ("example.com:99999", False, "port"),
    ("*:", True, "port"),
    ("2852039166", False, "'169.254.169.254'"),
    ("0xa9fea9fe", False, "'169.254.169.254'"),
    ("127.1", False, "'127.0.0.1'"),
    ("010.0.0.1", False, "'8.0.0.1'"),
    ("1.2.3.4.5", False, "not an IPv4"),
    ("256.1.1.1", False, "out of range"),
    ("example.123", False, "not an IPv4"),
    ("*.1.2.3", False, "IP address"),
    ("[*::1]", False, "IP address"),
    ("[example.com]", False, "brackets"),
    ("[1.2.3.4]:80", False, "brackets"),
    ("fe80::1%eth0", False, "zone"),
    ("[fe80::1%25eth0]:80", False, "zone"),
    ("1:2:3:4:5:6:7:8:9", False, "IPv6"),
    # IDNA 2003 and 2008 disagree: a deny entry would miss what curl sends, an allow
    # entry would open a name the user never wrote
    ("faß.de", False, "'fass' under IDNA 2003 and 'xn--fa-hia' under UTS #46"),
    ("*.straße.de", False, "two hosts"),
    ("βόλος.gr", False, "two hosts"),
)


@pytest.mark.parametrize(("entry", "bare", "kind", "host", "port"), PATTERN_OK)
def test_pattern_accepted(entry: str, bare: bool, kind: str, host: str, port: int | None) -> None:
    assert parse_pattern(entry, allow_bare_star=bare) == DomainPattern(entry, kind, host, port)
    validate_pattern(entry, allow_bare_star=bare)  # the settings.py contract: no raise


@pytest.mark.parametrize(("entry", "bare", "why"), PATTERN_BAD)
def test_pattern_rejected_with_reason(entry: str, bare: bool, why: str) -> None:
    with pytest.raises(ValueError) as info:
        validate_pattern(entry, allow_bare_star=bare)
    assert why in str(info.value)


# --- host canonicalisation -------------------------------------------------------------

CANONICAL = rows(
    "F-NET-2",
    ("example.com", "example.com"),
    ("EXAMPLE.Com.", "example.com"),
    ("bücher.de", "xn--bcher-kva.de"),
    ("BÜCHER.de", "xn--bcher-kva.de"),
    ("xn--bcher-kva.de", "xn--bcher-kva.de"),
    (wide("example.com").replace(wide("."), IDEO_DOT), "example.com"),
    ("localhost", "localhost"),
    ("example.0x1g", "example.0x1g"),  # not a number: 'g' is not hex
    (META, META),
    (str(META_INT), META),
    ("0xa9fea9fe", META),
    ("0XA9FEA9FE", META),
    ("0251.0376.0251.0376", META),
    ("0xa9.0xfe.0xa9.0xfe", META),
    ("169.254.43518", META),
    ("169.16689662", META),
    ("169.254.169.254.", META),
    (wide(META), META),
    ("127.1", "127.0.0.1"),
    ("0x7f.1", "127.0.0.1"),
    ("0" * 60 + "177.1", "127.0.0.1"),
    ("0", "0.0.0.0"),
    ("0x", "0.0.0.0"),
    ("[::1]", "::1"),
    ("::1", "::1"),
    ("[2001:DB8:0:0::1]", "2001:db8::1"),
    ("[::ffff:169.254.169.254]", META),
    ("[::ffff:a9fe:a9fe]", META),
    ("0:0:0:0:0:ffff:a9fe:a9fe", META),
    ("[64:ff9b::a9fe:a9fe]", "64:ff9b::a9fe:a9fe"),
)

CANONICAL_BAD = rows(
    "F-NET-2",
    ("", "empty"),
    (" ", "spaces"),
    ("a b.com", "spaces"),
    ("example.com\n", "control"),
    ("exa\tmple.com", "spaces"),
    ("\x00", "control"),
    ("example.com\r\nX-Evil: 1", "control"),
    ("meta\u00addata.google.internal", "control"),  # soft hyphen: invisible, refused
    ("\u200bexample.com", "control"),
    ("\ud800.com", "control"),
    ("user@example.com", "'@'"),
    ("example.com/x", "'/'"),
    ("ex\\ample.com", "'\\\\'"),
    ("example.com?x", "'?'"),
    ("example.com#x", "'#'"),
    ("exa%6dple.com", "percent"),
    ("example.com:443", "IPv6"),
    ("[::1]:443", "bracket"),
    ("[fe80::1%eth0]", "zone"),
    ("fe80::1%25eth0", "zone"),
    ("[1.2.3.4]", "IPv6"),
    ("[]", "IPv6"),
    ("a..b", "empty label"),
    (".a", "empty label"),
    ("a.b..", "empty label"),
    (".", "empty label"),
    ("*.example.com", "'*'"),
    ("256.0.0.1", "out of range"),
    ("1.2.3.4.5", "not an IPv4"),
    ("1.2.3.0x100", "out of range"),
    ("4294967296", "out of range"),
    ("0x100000000", "out of range"),
    ("08.0.0.1", "not an IPv4"),
    ("example.123", "not an IPv4"),
    ("a" * 64 + ".com", "longer than 63"),
    (".".join(["a" * 63] * 4) + ".com", "longer than 253"),
    ("a" * 2000, "longer than 1024"),
    ("faß.de", "two hosts"),
    ("FAẞ.de", "two hosts"),
    ("βόλος.gr", "two hosts"),
    ("ᏣᎳᎩ.corp.example", "'xn--f9dt7l' under UTS #46"),  # Cherokee: case folds apart
)


@pytest.mark.parametrize(("text", "expected"), CANONICAL)
def test_canonical_host(text: str, expected: str) -> None:
    assert canonical_host(text) == expected
    assert canonical_host(expected) == expected


@pytest.mark.parametrize(("text", "why"), CANONICAL_BAD)
def test_canonical_host_refuses(text: str, why: str) -> None:
    with pytest.raises(ValueError) as info:
        canonical_host(text)
    assert why in str(info.value)
    assert str(info.value).isascii()  # safe to echo into a 403 header


def test_is_ip() -> None:
    assert is_ip("2852039166") and is_ip("[::1]") and not is_ip("1.2.3.4.nip.io")


# --- matching --------------------------------------------------------------------------

MATCHES = rows(
    "F-NET-2",
    ("*.example.com", "a.example.com", 443, True),
    ("*.example.com", "a.b.example.com", 443, True),
    ("*.example.com", "A.B.EXAMPLE.COM.", 443, True),
    ("*.example.com", "example.com", 443, False),
    ("*.example.com", "badexample.com", 443, False),
    ("*.example.com", "example.com.evil.net", 443, False),
    ("bedrock.*.amazonaws.com", "bedrock.us-east-1.amazonaws.com", 443, True),
    ("bedrock.*.amazonaws.com", "BEDROCK.US-EAST-1.AMAZONAWS.COM.", 443, True),
    ("bedrock.*.amazonaws.com", "bedrock.evil.attacker.amazonaws.com", 443, False),
    ("bedrock.*.amazonaws.com", "bedrock.amazonaws.com", 443, False),
    ("bedrock.*.amazonaws.com", "xbedrock.us-east-1.amazonaws.com", 443, False),
    ("bedrock.*.amazonaws.com", "bedrock.us-east-1.amazonaws.com.evil.net", 443, False),
    ("example.com", "EXAMPLE.com.", 443, True),
    ("example.com", "www.example.com", 443, False),
    ("bücher.de", "xn--bcher-kva.de", 443, True),
    ("xn--bcher-kva.de", "BÜCHER.DE", 443, True),
    # IP literals match only IP entries, names only name entries
    ("127.0.0.1", "localhost", 80, False),
    ("localhost", "127.0.0.1", 80, False),
    ("1.2.3.4", "1.2.3.4.nip.io", 80, False),
    ("*.nip.io", "1.2.3.4", 80, False),
    ("169.254.169.254", str(META_INT), 80, True),
    ("[fd00:ec2::254]", "FD00:EC2:0:0::254", 80, True),
    ("fd00:ec2::254", "[fd00:ec2::254]", 80, True),
    # ports
    ("example.com:443", "example.com", 443, True),
    ("example.com:443", "example.com", 80, False),
    ("example.com:443", "example.com", None, False),
    ("example.com", "example.com", 8080, True),
    ("[::1]:22", "::1", 22, True),
    ("[::1]:22", "::1", 23, False),
    ("*:443", "anything.test", 443, True),
    ("*:443", "1.2.3.4", 80, False),
    ("*", "1.2.3.4", 1, True),
)


@pytest.mark.parametrize(("entry", "host", "port", "expected"), MATCHES)
def test_matches(entry: str, host: str, port: int | None, expected: bool) -> None:
    assert matches(entry, host, port) is expected


# --- decisions -------------------------------------------------------------------------

EMPTY = DomainPolicy(())
ALL = DomainPolicy((), allow_all=True)
SPEC = DomainPolicy.for_spec()

DECIDE = rows(
    "F-NET-3",
    # the baseline denylist beats every allow
    (DomainPolicy((META,)), META, 80, False, "baseline deny: cloud metadata"),
    (
        DomainPolicy(("metadata.google.internal",)),
        "metadata.google.internal",
        80,
        False,
        "baseline deny: cloud metadata",
    ),
    (
        DomainPolicy(("*.google.internal",), allow_all=True),
        "metadata.google.internal",
        80,
        False,
        "baseline deny: cloud metadata",
    ),
    (ALL, "o1.ingest.sentry.io", 443, False, "baseline deny: telemetry"),
    (DomainPolicy(("sentry.io",)), "sentry.io", 443, False, "baseline deny: telemetry"),
    (SPEC, "api.anthropic.com", 443, True, "allowedDomains: api.anthropic.com"),
    (SPEC, "raw.githubusercontent.com", 443, True, "allowedDomains: *.githubusercontent.com"),
    (SPEC, "github.com", 22, True, "allowedDomains: github.com"),
    (
        SPEC,
        "bedrock-runtime.us-west-2.amazonaws.com",
        443,
        True,
        "allowedDomains: bedrock-runtime.us-west-2.amazonaws.com",
    ),
    # S3 names buckets in the place a region would stand: a bucket named "bedrock"
    # is not Bedrock
    (SPEC, "bedrock.s3.amazonaws.com", 443, False, "not in allowedDomains"),
    (SPEC, "bedrock-runtime.s3-us-west-2.amazonaws.com", 443, False, "not in allowedDomains"),
    (SPEC, "bedrock.s3-accelerate.amazonaws.com", 443, False, "not in allowedDomains"),
    (SPEC, "example.com", 443, False, "not in allowedDomains"),
    (
        DomainPolicy.for_spec(network_enabled=False),
        "api.anthropic.com",
        443,
        False,
        "not in allowedDomains",
    ),
    (
        DomainPolicy.for_spec(["*.example.com"]),
        "x.example.com",
        443,
        True,
        "allowedDomains: *.example.com",
    ),
) + rows(
    "F-SET-4",
    # deniedDomains beats allowedDomains; an empty allowedDomains is no network
    (
        DomainPolicy(("example.com",), ("example.com",)),
        "example.com",
        443,
        False,
        "deniedDomains: example.com",
    ),
    (
        DomainPolicy(("*.example.com",), ("bad.example.com",)),
        "bad.example.com",
        443,
        False,
        "deniedDomains: bad.example.com",
    ),
    (
        DomainPolicy(("*.example.com",), ("bad.example.com",)),
        "good.example.com",
        443,
        True,
        "allowedDomains: *.example.com",
    ),
    (DomainPolicy(("example.com",), ("*:25",)), "example.com", 25, False, "deniedDomains: *:25"),
    (
        DomainPolicy(("example.com",), ("*:25",)),
        "example.com",
        443,
        True,
        "allowedDomains: example.com",
    ),
    (DomainPolicy((), ("*",), allow_all=True), "example.com", 443, False, "deniedDomains: *"),
    (DomainPolicy(("example.com:443",)), "example.com", 80, False, "not in allowedDomains"),
    (EMPTY, "example.com", 443, False, "not in allowedDomains"),
    (ALL, "example.com", 443, True, "allowAllDomains"),
    (ALL, "8.8.8.8", 53, True, "allowAllDomains"),
    (ALL, "127.0.0.1", 80, False, "allowAllDomains excludes local addresses"),
    (ALL, "[::1]", 80, False, "allowAllDomains excludes local addresses"),
    (ALL, "0", 80, False, "allowAllDomains excludes local addresses"),
    (DomainPolicy(("127.0.0.1",), allow_all=True), "127.1", 80, True, "allowedDomains: 127.0.0.1"),
    (DomainPolicy(("localhost",)), "127.0.0.1", 80, False, "not in allowedDomains"),
    (
        DomainPolicy(("10.0.0.5",), ("10.0.0.5",)),
        "[::ffff:10.0.0.5]",
        80,
        False,
        "deniedDomains: 10.0.0.5",
    ),
    # bad input and bad entries fail closed and never raise
    (SPEC, "a b", 443, False, "invalid host"),
    (SPEC, "github.com", 0, False, "invalid port"),
    (SPEC, "github.com", 70000, False, "invalid port"),
    (SPEC, "github.com", True, False, "invalid port"),
    (
        DomainPolicy(("example.com",), ("not a pattern",)),
        "example.com",
        443,
        False,
        "deniedDomains: not a pattern",
    ),
    (DomainPolicy(("*", "example.com")), "example.com", 443, True, "allowedDomains: example.com"),
    (DomainPolicy(("*", "example.com")), "other.com", 443, False, "not in allowedDomains"),
)


@pytest.mark.parametrize(("policy", "host", "port", "allowed", "rule"), DECIDE)
def test_decide(policy: DomainPolicy, host: str, port: int, allowed: bool, rule: str) -> None:
    decision = decide(policy, host, port)
    assert (decision.allowed, decision.rule) == (allowed, rule)
    assert decision.reason


def test_decision_names_canonical_host_and_port() -> None:
    decision = decide(SPEC, "API.Anthropic.COM.", 443)
    assert decision == Decision(
        True,
        "api.anthropic.com",
        443,
        "allowedDomains: api.anthropic.com",
        "api.anthropic.com is allowed",
        "allowed",
    )
    with pytest.raises(AttributeError):
        decision.allowed = False  # type: ignore[misc]


def test_empty_allow_list_says_no_network() -> None:
    assert "no network" in decide(EMPTY, "example.com", 443).reason


@pytest.mark.parametrize("host", ["a\r\nb", "é\x00", "\ud800", 12, None, b"example.com"])
def test_refused_host_is_echoed_safely(host: object) -> None:
    decision = decide(SPEC, host, 443)  # type: ignore[arg-type]
    assert not decision.allowed and decision.rule == "invalid host"
    assert decision.host.isascii() and decision.host.isprintable()


@pytest.mark.parametrize(
    "host", ["a b" * 340, "x" * 1000 + "\x00", "\udcff" * 255, "[" + "1" * 1000 + "]"]
)
def test_a_refusal_quotes_a_long_host_only_in_part(host: str) -> None:
    """Each refusal is a log and --violations line: its size may not grow with the
    client's text."""
    decision = decide(SPEC, host, 443)
    assert not decision.allowed and decision.rule == "invalid host"
    assert len(decision.reason) <= 320 and len(decision.host) <= 253


# Every odd spelling of a baseline-denied host, against allow lists that name it.
DENIED_SPELLINGS = rows(
    "F-NET-3",
    (META, "cloud metadata"),
    (str(META_INT), "cloud metadata"),
    ("0xa9fea9fe", "cloud metadata"),
    ("0XA9FEA9FE", "cloud metadata"),
    ("0251.0376.0251.0376", "cloud metadata"),
    ("0xa9.0xfe.0xa9.0xfe", "cloud metadata"),
    ("169.254.43518", "cloud metadata"),
    ("169.16689662", "cloud metadata"),
    ("169.254.169.254.", "cloud metadata"),
    (wide(META), "cloud metadata"),
    ("[::ffff:169.254.169.254]", "cloud metadata"),
    ("::ffff:a9fe:a9fe", "cloud metadata"),
    ("[::a9fe:a9fe]", "cloud metadata"),  # IPv4-compatible
    ("[64:ff9b::a9fe:a9fe]", "cloud metadata"),  # NAT64
    ("[2002:a9fe:a9fe::1]", "cloud metadata"),  # 6to4
    ("metadata.google.internal", "cloud metadata"),
    ("METADATA.GOOGLE.INTERNAL.", "cloud metadata"),
    ("Metadata.Google.Internal", "cloud metadata"),
    (wide("metadata.google.internal"), "cloud metadata"),
    (wide("METADATA") + ".google.internal", "cloud metadata"),
    (IDEO_DOT.join(["metadata", "google", "internal"]), "cloud metadata"),
    ("METADATA.GOOG", "cloud metadata"),
    ("[fd00:ec2::254]", "cloud metadata"),
    ("FD00:EC2:0:0:0:0:0:254", "cloud metadata"),
    ("instance-data.us-west-2.compute.internal", "cloud metadata"),
    ("100.100.100.200", "cloud metadata"),
    (str(ALIBABA_INT), "cloud metadata"),
    (ECS_HEX, "cloud metadata"),
    ("SENTRY.IO.", "telemetry"),
    ("o4505.ingest.us.sentry.io", "telemetry"),
    ("statsig.anthropic.com", "telemetry"),
    ("api.statsig.com", "telemetry"),
)

LIFTING_POLICIES = [
    pytest.param(ALL, id="allowAll"),
    pytest.param(SPEC, id="spec"),
    pytest.param(
        DomainPolicy.for_cli(
            [
                META,
                "169.254.170.2",
                "100.100.100.200",
                "[fd00:ec2::254]",
                "[::a9fe:a9fe]",
                "[64:ff9b::a9fe:a9fe]",
                "[2002:a9fe:a9fe::1]",
                "*.google.internal",
                "metadata.google.internal",
                "metadata.goog",
                "*.compute.internal",
                "sentry.io",
                "*.sentry.io",
                "*.statsig.com",
                "*.anthropic.com",
            ],
            [],
            allow_all=True,
        ),
        id="named",
    ),
]


@pytest.mark.parametrize("policy", LIFTING_POLICIES)
@pytest.mark.parametrize(("host", "category"), DENIED_SPELLINGS)
def test_baseline_deny_holds_for_every_spelling(
    policy: DomainPolicy, host: str, category: str
) -> None:
    decision = decide(policy, host, 80)
    assert not decision.allowed
    assert decision.rule == f"baseline deny: {category}"


# --- policy constructors and list constants ---------------------------------------------


def test_for_cli_validates_and_names_the_entry() -> None:
    with pytest.raises(ValueError, match=r"allowedDomains entry '\*\.com'"):
        DomainPolicy.for_cli(["*.com"], [])
    with pytest.raises(ValueError, match=r"allowedDomains entry '\*'"):
        DomainPolicy.for_cli(["*"], [])
    with pytest.raises(ValueError, match=r"deniedDomains entry 'https://x\.com'"):
        DomainPolicy.for_cli([], ["https://x.com"])
    with pytest.raises(ValueError, match="egress_allowlist entry"):
        DomainPolicy.for_spec(["example.com/path"])


def test_for_cli_keeps_settings_lists_only() -> None:
    policy = DomainPolicy.for_cli(["a.example.com", "a.example.com"], ["*"], True)
    assert policy == DomainPolicy(("a.example.com",), ("*",), True)
    assert DomainPolicy.for_cli([], []) == DomainPolicy(())  # F-SET-2/4: no network


def test_for_spec_is_baseline_plus_github_plus_extras() -> None:
    policy = DomainPolicy.for_spec(["*.example.com", "github.com"])
    assert policy.allowed == (*BASELINE_ALLOWED, *GITHUB_DOMAINS, "*.example.com")
    assert policy.denied == () and not policy.allow_all
    assert DomainPolicy.for_spec(["*.example.com"], network_enabled=False) == DomainPolicy(())


ALL_LIST_ENTRIES = [
    pytest.param(entry, id=f"F-NET-3:{name}:{entry}")
    for name, table in (
        ("allowed", BASELINE_ALLOWED),
        ("github", GITHUB_DOMAINS),
        ("denied", BASELINE_DENIED),
    )
    for entry in table
]


@pytest.mark.parametrize("entry", ALL_LIST_ENTRIES)
def test_list_entries_are_canonical_patterns(entry: str) -> None:
    pattern = parse_pattern(entry)
    assert pattern.host == split_port(entry)[0].strip("[]")  # written canonically
    assert pattern.port is None


@pytest.mark.parametrize("table", [BASELINE_ALLOWED, GITHUB_DOMAINS, BASELINE_DENIED])
def test_lists_are_tuples_without_duplicates(table: tuple[str, ...]) -> None:
    assert isinstance(table, tuple) and len(set(table)) == len(table)


REQUIRED_ALLOWED = rows(
    "F-NET-3",
    *[
        (h,)
        for h in (
            "api.anthropic.com",
            "api.openai.com",
            "generativelanguage.googleapis.com",
            "bedrock-runtime.us-east-1.amazonaws.com",
            "github.com",
            "api.github.com",
            "codeload.github.com",
            "raw.githubusercontent.com",
            "objects.githubusercontent.com",
            "ghcr.io",
            "gitlab.com",
            "bitbucket.org",
            "registry.npmjs.org",
            "pypi.org",
            "files.pythonhosted.org",
            "crates.io",
            "static.crates.io",
            "index.crates.io",
            "proxy.golang.org",
            "sum.golang.org",
            "repo.maven.apache.org",
            "rubygems.org",
            "deb.debian.org",
        )
    ],
)


@pytest.mark.parametrize("host", REQUIRED_ALLOWED)
def test_spec_baseline_reaches_providers_git_and_registries(host: str) -> None:
    assert decide(SPEC, host, 443).allowed


def test_baseline_denylist_names_the_spec_examples() -> None:
    assert META in BASELINE_DENIED and "metadata.google.internal" in BASELINE_DENIED


@pytest.mark.parametrize("entry", [e for e in BASELINE_ALLOWED + GITHUB_DOMAINS if "*" not in e])
def test_no_baseline_allow_is_swallowed_by_the_baseline_deny(entry: str) -> None:
    assert decide(SPEC, entry, 443).allowed


# --- the resolved-address guard ----------------------------------------------------------

LOCAL = DomainPolicy(("localhost", "127.0.0.1:8080", "internal.example.com"))

GUARD = rows(
    "F-NET-3",
    (SPEC, "github.com", ["140.82.112.3"], [], None),
    (SPEC, "github.com", [], [], None),
    (SPEC, "github.com", ["192.168.1.10"], ["10.0.0.1"], None),  # private but not ours
    (SPEC, "github.com", ["127.0.0.1"], [], "resolved address guard: loopback"),
    (SPEC, "github.com", ["127.0.0.53"], [], "resolved address guard: loopback"),
    (SPEC, "github.com", ["::1"], [], "resolved address guard: loopback"),
    (SPEC, "github.com", ["::ffff:127.0.0.1"], [], "resolved address guard: loopback"),
    (SPEC, "github.com", ["140.82.112.3", "127.0.0.1"], [], "resolved address guard: loopback"),
    (SPEC, "github.com", [META], [], "baseline deny: cloud metadata"),
    (SPEC, "github.com", ["::ffff:169.254.169.254"], [], "baseline deny: cloud metadata"),
    (SPEC, "github.com", ["64:ff9b::a9fe:a9fe"], [], "baseline deny: cloud metadata"),
    (SPEC, "github.com", ["fd00:ec2::254"], [], "baseline deny: cloud metadata"),
    (SPEC, "github.com", ["169.254.1.1"], [], "resolved address guard: link-local"),
    (SPEC, "github.com", ["fe80::1%eth0"], [], "resolved address guard: link-local"),
    (SPEC, "github.com", ["0.0.0.0"], [], "resolved address guard: unspecified"),
    (SPEC, "github.com", ["::"], [], "resolved address guard: unspecified"),
    (SPEC, "github.com", ["224.0.0.1"], [], "resolved address guard: multicast"),
    (SPEC, "github.com", ["ff02::1"], [], "resolved address guard: multicast"),
    (SPEC, "github.com", ["255.255.255.255"], [], "resolved address guard: broadcast"),
    (
        SPEC,
        "github.com",
        ["192.168.1.10"],
        ["192.168.1.10"],
        "resolved address guard: host's own address",
    ),
    (
        SPEC,
        "github.com",
        ["2001:db8::5"],
        ["[2001:db8::5]"],
        "resolved address guard: host's own address",
    ),
    # a local route wider than one address (an address with a prefix on lo, AnyIP)
    (
        SPEC,
        "github.com",
        ["10.60.0.77"],
        ["10.60.0.0/24", "10.60.0.1"],
        "resolved address guard: host's own address",
    ),
    (
        SPEC,
        "github.com",
        ["::ffff:10.60.0.77"],
        ["10.60.0.0/24"],
        "resolved address guard: host's own address",
    ),
    (SPEC, "github.com", ["10.61.0.1"], ["10.60.0.0/24"], None),
    (SPEC, "github.com", ["10.60.0.77"], ["10.60.0.0/nonsense"], None),  # skipped, no raise
    (SPEC, "github.com", ["not-an-ip"], [], "resolved address guard: unreadable address"),
    (SPEC, "github.com", ["2852039166"], [], "resolved address guard: unreadable address"),
    (SPEC, "a b", ["140.82.112.3"], [], "invalid host"),
    # only an IP entry of the allow list lifts the guard, and only on its port
    (LOCAL, "localhost", ["127.0.0.1"], [], "resolved address guard: loopback"),
    (DomainPolicy(("localhost", "127.0.0.1")), "localhost", ["127.0.0.1"], [], None),
    (ALL, "example.com", ["127.0.0.1"], [], "resolved address guard: loopback"),
    (
        DomainPolicy(("internal.example.com", "10.0.0.7")),
        "internal.example.com",
        ["10.0.0.7"],
        ["10.0.0.7"],
        None,
    ),
    # a deny rule on an address holds for names that resolve to it
    (
        DomainPolicy((META, "evil.example"), (), True),
        "evil.example",
        [META],
        [],
        "baseline deny: cloud metadata",
    ),
    (
        DomainPolicy(("evil.example",), ("10.0.0.5",)),
        "evil.example",
        ["10.0.0.5"],
        [],
        "deniedDomains: 10.0.0.5",
    ),
)


@pytest.mark.parametrize(("policy", "host", "addresses", "own", "rule"), GUARD)
def test_guard_addresses(
    policy: DomainPolicy, host: str, addresses: list[str], own: list[str], rule: str | None
) -> None:
    refusal = guard_addresses(policy, host, 443, addresses, own)
    if rule is None:
        assert refusal is None
    else:
        assert refusal is not None and not refusal.allowed
        assert refusal.rule == rule and refusal.reason


def test_guard_respects_ip_entry_port() -> None:
    assert guard_addresses(LOCAL, "localhost", 8080, ["127.0.0.1"], []) is None
    refusal = guard_addresses(LOCAL, "localhost", 443, ["127.0.0.1"], [])
    assert refusal is not None and refusal.host == "localhost" and refusal.port == 443
    assert "127.0.0.1" in refusal.reason


# --- purity and documentation ----------------------------------------------------------------

ALLOWED_IMPORTS = {
    "__future__",
    "ipaddress",
    "functools",
    "idna",
    "sandhold._record",
    "collections.abc",
    "typing",
    "encodings",
}


def test_module_does_no_io() -> None:
    tree = ast.parse(Path(domains.__file__).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in {"open", "eval", "input", "print"}, node.func.id
    assert imported <= ALLOWED_IMPORTS, imported - ALLOWED_IMPORTS


def test_docstring_examples_run() -> None:
    result = doctest.testmod(domains)
    assert result.attempted >= 5 and result.failed == 0


# --- properties -------------------------------------------------------------------------------

LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
TLD = st.from_regex(r"[a-z]{2,6}", fullmatch=True)
NAME = st.builds(lambda ls, tld: ".".join([*ls, tld]), st.lists(LABEL, min_size=1, max_size=4), TLD)
PORT = st.integers(1, 65535)
ANY_TEXT = st.one_of(
    st.text(max_size=60),
    st.text(st.characters() | st.characters(categories=["Cs"]), max_size=20),  # surrogates
    st.text(alphabet="0123456789abcdefxX.:[]%", max_size=30),
    NAME,
    NAME.map(lambda n: n.upper() + "."),
    st.ip_addresses().map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a.exploded}]"),
)


def _vary(name: str, how: int) -> str:
    """A spelling of ``name`` that means the same host."""
    return (name, name.upper(), name + ".", name.title() + ".")[how]


@given(ANY_TEXT)
@example(wide("metadata.google.internal"))
@example("0251.0376.0251.0376")
def test_canonicalisation_is_idempotent(text: str) -> None:
    try:
        once = canonical_host(text)
    except ValueError:
        return
    assert canonical_host(once) == once
    assert once.isascii() and once == once.lower() and not once.endswith(".")


@given(st.integers(0, 2**32 - 1), st.integers(0, 7))
def test_every_numeric_ipv4_spelling_is_one_address(value: int, form: int) -> None:
    b = ipaddress.IPv4Address(value).packed
    spelling = (
        str(value),
        hex(value),
        "0" + oct(value)[2:],
        ".".join(hex(x) for x in b),
        ".".join("0" + oct(x)[2:] for x in b),
        f"{b[0]}.{b[1]}.{int.from_bytes(b[2:], 'big')}",
        f"{b[0]}.{int.from_bytes(b[1:], 'big')}",
        f"[::ffff:{ipaddress.IPv4Address(value)}]",
    )[form]
    assert canonical_host(spelling) == str(ipaddress.IPv4Address(value))


@given(st.text(alphabet="0123456789abcdefxX.", min_size=1, max_size=24))
@example("0x7f.1")
@example("017700000001")
def test_agrees_with_libc_inet_aton(text: str) -> None:
    # the oracle is the host's own resolver front door; the policy module never calls it
    try:
        libc = socket.inet_ntoa(socket.inet_aton(text))
    except OSError:
        return
    assert canonical_host(text) == libc


POLICIES = st.builds(
    DomainPolicy,
    st.lists(
        st.one_of(NAME, NAME.map("*.".__add__), st.just("*"), st.text(max_size=8)), max_size=4
    ).map(tuple),
    st.lists(st.one_of(NAME, st.just("*:443"), st.text(max_size=8)), max_size=3).map(tuple),
    st.booleans(),
)


@settings(max_examples=300)
@given(POLICIES, ANY_TEXT, st.one_of(PORT, st.integers(), st.none()))
def test_decide_never_raises(policy: DomainPolicy, host: str, port: int) -> None:
    decision = decide(policy, host, port)
    assert isinstance(decision, Decision) and decision.rule and decision.reason
    if decision.allowed:
        assert decision.host == canonical_host(decision.host)


@given(POLICIES, ANY_TEXT, st.lists(ANY_TEXT, max_size=3), st.lists(ANY_TEXT, max_size=2))
def test_guard_never_raises(
    policy: DomainPolicy, host: str, addresses: list[str], own: list[str]
) -> None:
    refusal = guard_addresses(policy, host, 443, addresses, own)
    assert refusal is None or not refusal.allowed


@given(
    st.tuples(NAME, st.lists(LABEL, max_size=2)),
    PORT,
    st.tuples(st.integers(0, 3), st.integers(0, 2)),
    st.lists(NAME, max_size=3),
    st.booleans(),
)
def test_denied_name_is_never_allowed(
    name: tuple[str, list[str]],
    port: int,
    forms: tuple[int, int],
    others: list[str],
    allow_all: bool,
) -> None:
    (base, sub), (how, deny_form) = name, forms
    host = ".".join([*sub, base])
    denied = (host, f"{host}:{port}", f"*.{base}" if sub else host)[deny_form]
    allowed = [host, f"{host}:{port}", f"*.{base}", *others]
    policy = DomainPolicy.for_cli(allowed, [denied], allow_all)
    assert not decide(policy, _vary(host, how), port).allowed


@given(st.ip_addresses(), PORT, st.booleans(), st.booleans())
def test_denied_address_is_never_allowed(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
    port: int,
    odd: bool,
    allow_all: bool,
) -> None:
    entry = str(address) if address.version == 4 else f"[{address}]"
    policy = DomainPolicy.for_cli([entry, f"{entry}:{port}"], [entry], allow_all)
    if address.version == 4:
        asked = str(int(address)) if odd else f"[::ffff:{address}]"
    else:
        asked = f"[{address.exploded.upper()}]" if odd else str(address)
    assert not decide(policy, asked, port).allowed


BASELINE_HOSTS = [e.replace("*", "x1") for e in BASELINE_DENIED]


@given(st.sampled_from(BASELINE_HOSTS), PORT, st.lists(NAME, max_size=3), st.booleans())
def test_baseline_denied_is_never_allowed(
    host: str, port: int, others: list[str], allow_all: bool
) -> None:
    entry = f"[{host}]" if ":" in host else host
    policy = DomainPolicy.for_cli([entry, f"{entry}:{port}", *others], [], allow_all)
    decision = decide(policy, host, port)
    assert not decision.allowed and decision.rule.startswith("baseline deny: ")


@given(NAME, st.lists(LABEL, min_size=1, max_size=3), st.integers(0, 3))
def test_leading_star_covers_any_depth_but_not_the_domain(
    base: str, sub: list[str], how: int
) -> None:
    assert matches(f"*.{base}", _vary(".".join([*sub, base]), how))
    assert not matches(f"*.{base}", _vary(base, how))


@given(LABEL, LABEL, NAME, st.lists(LABEL, min_size=2, max_size=3))
def test_middle_star_is_exactly_one_label(head: str, one: str, tail: str, many: list[str]) -> None:
    pattern = f"{head}.*.{tail}"
    assert matches(pattern, f"{head}.{one}.{tail}")
    assert not matches(pattern, ".".join([head, *many, tail]))
    assert not matches(pattern, f"{head}.{tail}")


@given(st.one_of(NAME, NAME.map("*.x.".__add__), st.ip_addresses().map(str)), st.none() | PORT)
def test_parsed_pattern_round_trips(host: str, port: int | None) -> None:
    written = f"[{host}]" if ":" in host else host
    entry = written if port is None else f"{written}:{port}"
    pattern = parse_pattern(entry)
    again = f"[{pattern.host}]" if ":" in pattern.host else pattern.host
    if port is not None:
        again = f"{again}:{port}"
    assert parse_pattern(again) == DomainPattern(again, pattern.kind, pattern.host, port)


@pytest.mark.parametrize(
    ("host", "port", "kind"),
    [
        ("api.anthropic.com", 443, "allowed"),
        ("169.254.169.254", 80, "baseline"),
        ("evil.example.com", 443, "denied"),
        ("other.example.org", 443, "unlisted"),
        ("bad host", 443, "invalid"),
        ("api.anthropic.com", 0, "invalid"),
    ],
)
def test_every_decision_says_its_kind_of_rule(host: str, port: int, kind: str) -> None:
    """Code branches on ``Decision.kind`` (a table), never on the words of ``rule``."""
    from sandhold.policy.domains import RULE_KINDS

    policy = DomainPolicy.for_cli(["api.anthropic.com"], ["evil.example.com"])
    decision = decide(policy, host, port)
    assert decision.kind == kind and decision.kind in RULE_KINDS
    assert decision.deny_listed == (kind in ("baseline", "denied"))


def test_the_address_guard_keeps_the_deny_lists_kind() -> None:
    policy = DomainPolicy.for_cli(["app.test"], ["10.9.8.7"])
    refused = guard_addresses(policy, "app.test", 443, ["10.9.8.7"], [])
    assert refused is not None and refused.kind == "denied" and refused.deny_listed
    local = guard_addresses(policy, "app.test", 443, ["127.0.0.1"], [])
    assert local is not None and local.kind == "guard" and not local.deny_listed
