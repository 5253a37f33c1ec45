"""Domain policy of the egress proxies: which host and port a sandbox may reach, and why.

Rules (F-NET-2, F-NET-3, F-SET-4):
- A pattern is a host name, an IP literal (IPv6 in brackets when a port follows),
  ``*.example.com`` (any subdomain at any depth, not ``example.com`` itself), or
  a name with one middle ``*`` standing for exactly one label
  (``bedrock.*.amazonaws.com``). At most one ``*``, always a whole label. An
  optional ``:port`` (1-65535) limits the entry to that port. No schemes, paths,
  empty labels, or wildcards that cover a whole TLD (``*``, ``*.com``).
  ``deniedDomains`` also takes a bare ``*`` and ``*:port``. IPv4 entries are
  written as four decimal numbers; other spellings are refused, not guessed.
- What a client asks for is canonicalised before matching (``canonical_host``):
  case folded, one trailing dot dropped, Unicode names turned into IDNA A-labels
  (UTS #46 non-transitional, as curl and browsers spell them; a label that
  IDNA 2003 spells differently, such as one with ß, ς or Cherokee letters, is
  refused as naming two hosts), IPv6 unbracketed and compressed,
  zone ids refused. A name
  whose last label is a number is an IPv4 address, read the way inet_aton, curl
  and the WHATWG URL parser read it (``2852039166``, ``0xA9FEA9FE``, octal
  ``0251.0376.0251.0376``, ``127.1``); IPv4-mapped IPv6 is the IPv4 address.
  The proxies dial ``Decision.host``, never the text the client sent.
- Names match only name entries and IP addresses only IP entries. Matching is
  case-insensitive; an entry with a port matches only that port.
- Order: ``BASELINE_DENIED`` beats everything, then ``deniedDomains``, then
  ``allowedDomains`` (``allowAllDomains`` allows whatever is not denied), else
  refused. An empty allow list and no ``allowAllDomains`` mean no network.
  Deny entries also catch an IPv4 address embedded in IPv6 (mapped, compatible,
  NAT64 ``64:ff9b::/96``, 6to4). ``allowAllDomains`` does not cover loopback,
  link-local, unspecified, multicast or broadcast literals: those need an IP entry.
- After resolving an allowed name, the proxy asks ``guard_addresses``: an address
  that is denied, or loopback, link-local, unspecified, multicast, broadcast or
  one of the host's own, refuses the connection unless an IP entry of the allow
  list names it (DNS rebinding defence).
- ``decide`` and ``guard_addresses`` never raise: bad input is refused with a
  reason. Nothing here resolves names or touches sockets or files; resolved
  addresses and the host's own addresses come in as arguments.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from sandhold._record import record

TYPE_CHECKING = False  # typing costs start-up time; mypy honours this name
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import TypeAlias

    _IP: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
    _Net: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

# --- the rule tables -------------------------------------------------------------

# Curated hosts every spec-launched sandbox may reach (F-NET-3). Kept short on
# purpose: each entry is a place a prompt-injected agent could send data to.
BASELINE_ALLOWED: tuple[str, ...] = (
    # LLM providers
    "api.anthropic.com",
    "api.openai.com",
    "generativelanguage.googleapis.com",
    # Bedrock by region, not "bedrock.*.amazonaws.com": S3 serves buckets at
    # <bucket>.s3.amazonaws.com and .s3-<region>.amazonaws.com, so that wildcard also
    # allowed buckets named "bedrock" of whoever owns them (a way out for an agent).
    # A region not listed yet is refused: add it to the allowlist.
    *(
        f"{service}.{region}.amazonaws.com"
        for service in ("bedrock", "bedrock-runtime")
        for region in (
            *("us-east-1", "us-east-2", "us-west-1", "us-west-2"),
            *("us-gov-east-1", "us-gov-west-1", "ca-central-1", "ca-west-1"),
            *("mx-central-1", "sa-east-1", "af-south-1", "il-central-1"),
            *("me-south-1", "me-central-1", "eu-central-1", "eu-central-2"),
            *("eu-west-1", "eu-west-2", "eu-west-3", "eu-south-1", "eu-south-2"),
            *("eu-north-1", "ap-east-1", "ap-east-2", "ap-south-1", "ap-south-2"),
            *("ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-southeast-1"),
            *("ap-southeast-2", "ap-southeast-3", "ap-southeast-4", "ap-southeast-5"),
            *("ap-southeast-6", "ap-southeast-7"),
        )
    ),
    "api.mistral.ai",
    # git hosting (GitHub is GITHUB_DOMAINS)
    "gitlab.com",
    "bitbucket.org",
    # package registries
    "registry.npmjs.org",
    "registry.yarnpkg.com",
    "pypi.org",
    "files.pythonhosted.org",
    "crates.io",
    "static.crates.io",
    "index.crates.io",
    "proxy.golang.org",
    "sum.golang.org",
    "repo.maven.apache.org",
    "repo1.maven.org",
    "rubygems.org",
    "index.rubygems.org",
    "deb.debian.org",
    "security.debian.org",
    "archive.ubuntu.com",
    "security.ubuntu.com",
)

# What git, gh, release downloads and GitHub's package registries need (F-NET-3).
GITHUB_DOMAINS: tuple[str, ...] = (
    "github.com",
    "api.github.com",
    "codeload.github.com",
    "uploads.github.com",
    "*.githubusercontent.com",  # raw, objects, media (LFS), release assets, avatars
    "ghcr.io",
    "*.pkg.github.com",  # npm.pkg.github.com, maven.pkg.github.com, ...
)

# Cloud metadata endpoints hand out the host's cloud credentials to anyone who
# can reach them. Names that only exist through a search domain (GCP's bare
# ``metadata``, AWS's ``instance-data``) are caught by the address guard.
_METADATA_DENIED: tuple[str, ...] = (
    "169.254.169.254",  # AWS, GCP, Azure, OCI, DigitalOcean, OpenStack, Hetzner...
    "fd00:ec2::254",  # AWS IMDS over IPv6 (Nitro)
    "169.254.170.2",  # AWS ECS task metadata and role credentials
    "169.254.170.23",  # AWS EKS Pod Identity agent
    "fd00:ec2::23",  # AWS EKS Pod Identity agent, IPv6
    "100.100.100.200",  # Alibaba Cloud
    "192.0.0.192",  # Oracle Cloud (legacy metadata address)
    "169.254.0.23",  # Tencent Cloud
    "168.63.129.16",  # Azure WireServer (extension settings, certificates)
    "metadata.google.internal",
    "metadata.goog",
    "instance-data.ec2.internal",  # AWS, us-east-1
    "instance-data.*.compute.internal",  # AWS, other regions
    "metadata.tencentyun.com",
)

# Telemetry and error-report sinks that accept writes from anyone holding a
# public key (a Sentry DSN, a Statsig client key): an exfiltration channel
# hidden in traffic that looks routine. No setting can allow them.
_TELEMETRY_DENIED: tuple[str, ...] = (
    "sentry.io",
    "*.sentry.io",
    "statsig.com",
    "*.statsig.com",
    "statsig.anthropic.com",
)

BASELINE_DENIED: tuple[str, ...] = _METADATA_DENIED + _TELEMETRY_DENIED

_BASELINE_CATEGORIES: tuple[tuple[tuple[str, ...], str], ...] = (
    (_METADATA_DENIED, "cloud metadata"),
    (_TELEMETRY_DENIED, "telemetry"),
)

# Address classes that an allowed name must not resolve to, and that
# allowAllDomains does not open, unless an IP entry of the allow list names the
# address: the proxy runs on the host, so these reach the host itself.
_GUARDED_NETWORKS: tuple[tuple[str, str], ...] = (
    ("127.0.0.0/8", "loopback"),
    ("::1/128", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("fe80::/10", "link-local"),
    ("0.0.0.0/8", "unspecified"),
    ("::/128", "unspecified"),
    ("224.0.0.0/4", "multicast"),
    ("ff00::/8", "multicast"),
    ("255.255.255.255/32", "broadcast"),
)

_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")
_HEX_DIGITS = frozenset("0123456789abcdef")
_OCT_DIGITS = frozenset("01234567")
_DEC_DIGITS = frozenset("0123456789")
_UNICODE_DOTS = {0x3002: ".", 0xFF0E: ".", 0xFF61: "."}  # IDNA's other full stops
_URL_CHARS = "@/\\?#"
_MAX_HOST = 253
_MAX_LABEL = 63
_MAX_INPUT = 1024  # bounds the work spent on hostile input
_MAX_REASON = 320  # a refusal's reason, which may quote the host as sent


# --- records ----------------------------------------------------------------------


@record
class DomainPattern:
    """One parsed ``allowedDomains``/``deniedDomains`` entry.

    ``kind`` is ``"name"``, ``"ip"`` or ``"any"`` (a bare ``*``). ``host`` is the
    canonical spelling: lower-case A-labels with the ``*`` kept
    (``*.xn--bcher-kva.de``), a dotted-quad or compressed IPv6 address, or
    ``"*"``. ``port`` is ``None`` when the entry matches every port.
    """

    entry: str
    kind: str
    host: str
    port: int | None = None


# What kind of rule decided a connection (``Decision.kind``). Code branches on these,
# never on the words of ``rule``, which are for people.
ALLOWED = "allowed"  # an allowedDomains entry
ALLOW_ALL = "allow-all"  # allowAllDomains
BASELINE = "baseline"  # the baseline denylist (cloud metadata, telemetry)
DENIED = "denied"  # a deniedDomains entry
UNLISTED = "unlisted"  # in no allowedDomains entry
LOCAL = "local"  # allowAllDomains does not reach local addresses
INVALID = "invalid"  # a host or port that cannot be read
GUARD = "guard"  # the resolved address guard
FILTER = "filter"  # the HTTP proxy's request filter
UNAVAILABLE = "unavailable"  # the policy could not be read
RULE_KINDS = (
    ALLOWED, ALLOW_ALL, BASELINE, DENIED, UNLISTED, LOCAL, INVALID, GUARD, FILTER, UNAVAILABLE
)  # fmt: skip


@record
class Decision:
    """The answer to one connection attempt, ready to render (F-NET-4).

    ``host`` is the canonical host (what the proxy dials), or an ASCII-escaped
    copy of the input when it could not be canonicalised. ``rule`` names what
    decided: ``"allowedDomains: api.github.com"``, ``"deniedDomains: *.evil.com"``,
    ``"baseline deny: cloud metadata"``, ``"baseline deny: telemetry"``,
    ``"allowAllDomains"``, ``"not in allowedDomains"``, ``"invalid host"``,
    ``"invalid port"``, ``"allowAllDomains excludes local addresses"`` or
    ``"resolved address guard: <class>"``. ``reason`` is a sentence for people.
    """

    allowed: bool
    host: str
    port: int
    rule: str
    reason: str
    kind: str  # which kind of rule decided (``RULE_KINDS``): what code branches on

    @property
    def deny_listed(self) -> bool:
        """A deny list decided (the baseline or ``deniedDomains``), not a missing allow."""
        return self.kind in (BASELINE, DENIED)


@record
class DomainPolicy:
    """The network lists of one session; the baseline denylist always applies on top.

    Build it with ``for_cli`` or ``for_spec``, which validate every entry. A
    policy built directly with a bad entry still fails closed: a bad allow entry
    allows nothing and a bad deny entry refuses everything.
    """

    allowed: tuple[str, ...]
    denied: tuple[str, ...] = ()
    allow_all: bool = False

    @classmethod
    def for_cli(
        cls,
        allowed_domains: Iterable[str],
        denied_domains: Iterable[str] = (),
        allow_all: bool = False,
    ) -> DomainPolicy:
        """The settings file's lists only (F-SET-4): empty ``allowed_domains`` is no network.

        Raises:
            ValueError: an entry is not a valid pattern; the message names it.
        """
        allowed = _checked(allowed_domains, "allowedDomains", allow_bare_star=False)
        denied = _checked(denied_domains, "deniedDomains", allow_bare_star=True)
        return cls(allowed=allowed, denied=denied, allow_all=bool(allow_all))

    @classmethod
    def for_spec(
        cls,
        egress_allowlist: Iterable[str] = (),
        network_enabled: bool = True,
        *,
        baseline: bool = True,
        denylist: Iterable[str] = (),
    ) -> DomainPolicy:
        """A ``SandboxSpec`` session (F-NET-3): baseline + GitHub + ``egress_allowlist``.

        With ``network_enabled`` false the allow list is empty and every
        connection is refused (the proxies still run). ``baseline`` false leaves
        the baseline and GitHub out (a spec made from a settings file:
        ``egress_allowlist`` alone, as the CLI reads ``allowedDomains``);
        ``denylist`` entries beat every allow, as ``deniedDomains`` do.

        Raises:
            ValueError: an ``egress_allowlist`` or ``egress_denylist`` entry is not
                a valid pattern.
        """
        extra = _checked(egress_allowlist, "egress_allowlist", allow_bare_star=False)
        denied = _checked(denylist, "egress_denylist", allow_bare_star=True)
        if not network_enabled:
            return cls(allowed=(), denied=denied)
        base = BASELINE_ALLOWED + GITHUB_DOMAINS if baseline else ()
        return cls(allowed=tuple(dict.fromkeys(base + extra)), denied=denied)


def _checked(entries: Iterable[str], key: str, *, allow_bare_star: bool) -> tuple[str, ...]:
    out: list[str] = []
    for entry in entries:
        try:
            validate_pattern(entry, allow_bare_star=allow_bare_star)
        except ValueError as exc:
            raise ValueError(f"{key} entry {entry!r}: {exc}") from None
        out.append(entry)
    return tuple(dict.fromkeys(out))


# --- pattern grammar ----------------------------------------------------------------


def split_port(entry: str) -> tuple[str, int | None]:
    """Split ``host[:port]``; IPv6 literals must be bracketed to carry a port.

    An unbracketed text with two or more colons is an IPv6 address with no port.

    Raises:
        ValueError: unclosed bracket, text after ``]``, or a bad port.
    """
    if entry.startswith("["):
        end = entry.find("]")
        if end < 0:
            raise ValueError("unclosed '[' in IPv6 literal")
        host, rest = entry[1:end], entry[end + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise ValueError("unexpected text after ']'")
        return host, _port(rest[1:])
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, _port(port)
    return entry, None


def _port(text: str) -> int:
    # isascii: str.isdigit() also accepts other scripts' digits, which int() reads
    if not (text.isascii() and text.isdigit() and len(text) <= 5 and 1 <= int(text) <= 65535):
        raise ValueError(f"port must be a number from 1 to 65535, got {text!r}")
    return int(text)


def validate_pattern(entry: str, *, allow_bare_star: bool) -> None:
    """Raise ``ValueError`` with a reason if ``entry`` is not a usable domain pattern.

    ``allow_bare_star`` admits ``*`` and ``*:port`` (``deniedDomains`` only).
    """
    parse_pattern(entry, allow_bare_star=allow_bare_star)


def parse_pattern(entry: str, *, allow_bare_star: bool = False) -> DomainPattern:
    """Parse one list entry into its canonical ``DomainPattern`` (grammar in the module doc).

    >>> parse_pattern("*.Bücher.DE:443")
    DomainPattern(entry='*.Bücher.DE:443', kind='name', host='*.xn--bcher-kva.de', port=443)
    >>> parse_pattern("[::ffff:169.254.169.254]").host
    '169.254.169.254'

    Raises:
        ValueError: the entry is not a valid pattern; the message says why.
    """
    if not isinstance(entry, str) or not entry:
        raise ValueError("domain pattern is empty")
    if entry != entry.strip():
        raise ValueError("domain pattern has surrounding spaces")
    if "://" in entry or "/" in entry:
        raise ValueError("a domain pattern has no scheme or path (write 'example.com')")
    host, port = split_port(entry)
    if host == "*":
        if allow_bare_star:
            return DomainPattern(entry, "any", "*", port)
        raise ValueError("'*' would allow every host; list the domains instead")
    if "*" not in host:
        canonical, ip = _canonical(host)
        if ip is None:
            if entry.startswith("["):
                raise ValueError("brackets are only for IPv6 addresses")
            if "." not in canonical and canonical != "localhost":
                raise ValueError("a single-label name is not a domain (write 'example.com')")
            return DomainPattern(entry, "name", canonical, port)
        if entry.startswith("[") and ":" not in host:
            raise ValueError("brackets are only for IPv6 addresses")
        if ip.version == 4 and ":" not in host and host.removesuffix(".") != canonical:
            raise ValueError(f"write this IPv4 address as {canonical!r}")
        return DomainPattern(entry, "ip", canonical, port)
    if ":" in host or entry.startswith("["):
        raise ValueError("'*' cannot be used in an IP address")
    return DomainPattern(entry, "name", _wildcard_name(entry, host), port)


def _wildcard_name(entry: str, host: str) -> str:
    if host.count("*") > 1:
        raise ValueError("at most one '*' per pattern")
    _check_text(host)
    raw = _split_labels(host)
    star_at = next(i for i, label in enumerate(raw) if "*" in label)
    if raw[star_at] != "*":
        raise ValueError("'*' must be a whole label ('*.example.com')")
    labels = [label if label == "*" else _ascii_label(label) for label in raw]
    if star_at == len(labels) - 1:
        raise ValueError("'*' cannot be the last label")
    if star_at == 0 and len(labels) < 3:
        raise ValueError(f"{entry!r} is too broad: name at least two labels after '*.'")
    if _ends_in_number(labels[-1]):
        raise ValueError("'*' cannot be used in an IP address")
    name = ".".join(labels)
    if len(name) > _MAX_HOST:
        raise ValueError(f"host name longer than {_MAX_HOST} characters")
    return name


# --- host canonicalisation ------------------------------------------------------------


def canonical_host(text: str) -> str:
    """The canonical spelling of a host a client asked for (rules in the module doc).

    >>> canonical_host("METADATA.Google.Internal.")
    'metadata.google.internal'
    >>> canonical_host("0xA9FEA9FE"), canonical_host("169.254.43518")
    ('169.254.169.254', '169.254.169.254')
    >>> canonical_host("[::FFFF:169.254.169.254]"), canonical_host("[2001:DB8:0::1]")
    ('169.254.169.254', '2001:db8::1')
    >>> canonical_host("bücher.de")
    'xn--bcher-kva.de'

    Raises:
        ValueError: ``text`` is not a host name or IP address (empty, spaces or
            control characters, URL syntax, a zone id, a bad label, a number
            that is not an IPv4 address, too long).
    """
    return _canonical(text)[0]


def is_ip(host: str) -> bool:
    """Whether ``host`` (any spelling ``canonical_host`` takes) is an IP address.

    Raises:
        ValueError: as ``canonical_host``.
    """
    return _canonical(host)[1] is not None


def _check_text(text: str) -> None:
    if not text.isprintable() or any(c.isspace() for c in text):
        raise ValueError(f"host {text!a} contains spaces or control characters")
    if "%" in text:
        raise ValueError(f"host {text!a}: zone ids and percent-escapes are refused")
    bad = next((c for c in _URL_CHARS if c in text), None)
    if bad is not None:
        raise ValueError(f"host {text!a} contains {bad!r}: give a host, not a URL")


def _canonical(text: str) -> tuple[str, _IP | None]:
    if not isinstance(text, str):
        raise ValueError("host must be a string")
    if not text:
        raise ValueError("host is empty")
    if len(text) > _MAX_INPUT:
        raise ValueError(f"host is longer than {_MAX_INPUT} characters")
    _check_text(text)
    if text.startswith("[") or text.endswith("]"):
        if not (text.startswith("[") and text.endswith("]")):
            raise ValueError(f"host {text!a} has an unmatched bracket")
        return _ipv6(text[1:-1], text)
    if ":" in text:
        return _ipv6(text, text)
    labels = [_ascii_label(label) for label in _split_labels(text)]
    if _ends_in_number(labels[-1]):
        v4 = _inet_aton(labels, text)
        return str(v4), v4
    name = ".".join(labels)
    if len(name) > _MAX_HOST:
        raise ValueError(f"host name longer than {_MAX_HOST} characters")
    return name, None


def _ipv6(inner: str, text: str) -> tuple[str, _IP]:
    try:
        v6 = ipaddress.IPv6Address(inner)
    except ValueError:
        raise ValueError(
            f"host {text!a} is not an IPv6 address (a port is given separately)"
        ) from None
    mapped = v6.ipv4_mapped
    if mapped is not None:
        return str(mapped), mapped
    return v6.compressed, v6


def _split_labels(text: str) -> list[str]:
    if not text.isascii():
        text = text.translate(_UNICODE_DOTS)
    labels = text.split(".")
    if len(labels) > 1 and not labels[-1]:
        labels.pop()  # exactly one trailing dot is ignored
    if not all(labels):
        raise ValueError("empty label (a leading dot, or two dots in a row)")
    return labels


# IDNA 2003 (the stdlib's codec) maps these away (sharp s to "ss", final sigma to
# sigma, the joiners dropped); IDNA 2008, which curl and browsers use, keeps them:
# "faß.de" is then a different registered name from "fass.de". A label with one of
# them names two hosts.
_IDNA_DEVIATIONS = frozenset("\u00df\u1e9e\u03c2\u200c\u200d")


def _ascii_label(label: str) -> str:
    out = label.lower() if label.isascii() else _unicode_label(label)
    if len(out) > _MAX_LABEL:
        raise ValueError(f"label {label!a} is longer than {_MAX_LABEL} characters")
    bad = sorted(set(out) - _LABEL_CHARS)
    if bad:
        raise ValueError(f"character {bad[0]!r} is not allowed in a host name")
    return out


def _unicode_label(label: str) -> str:
    """A Unicode label's A-label as curl and browsers spell it (UTS #46, non-transitional),
    refused when IDNA 2003 (older clients, Python's own codec) spells it otherwise: the
    label then names two hosts, and a rule for one would miss the other."""
    from encodings import idna as idna2003

    import idna  # only for Unicode names: its tables cost an import

    try:
        new = idna.encode(label, uts46=True, transitional=False).decode("ascii")
    except idna.IDNAError as exc:
        raise ValueError(f"label {label!a} is not a valid IDNA label: {exc}") from None
    try:
        old = idna2003.ToASCII(label).decode("ascii").lower()
    except UnicodeError:
        old = new  # IDNA 2003 has no spelling for it: only one host is named
    if old != new or not _IDNA_DEVIATIONS.isdisjoint(label):
        raise ValueError(
            f"label {label!a} names two hosts: {old!r} under IDNA 2003 and {new!r} "
            "under UTS #46 (curl, browsers); write the one you mean"
        )
    return new


def _ends_in_number(label: str) -> bool:
    # WHATWG's "ends in a number": such a host is an IPv4 address or invalid
    if label.startswith("0x"):
        return set(label[2:]) <= _HEX_DIGITS
    return set(label) <= _DEC_DIGITS


def _inet_aton(parts: list[str], text: str) -> ipaddress.IPv4Address:
    if len(parts) > 4:
        raise ValueError(f"host {text!a} ends in a number but is not an IPv4 address")
    numbers = [_ipv4_part(part, text) for part in parts]
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(numbers)):
        raise ValueError(f"host {text!a} is an IPv4 address out of range")
    value = last
    for i, n in enumerate(head):
        value |= n << (24 - 8 * i)
    return ipaddress.IPv4Address(value)


def _ipv4_part(part: str, text: str) -> int:
    if part.startswith("0x"):
        digits, base, allowed = part[2:], 16, _HEX_DIGITS
    elif len(part) > 1 and part.startswith("0"):
        digits, base, allowed = part[1:], 8, _OCT_DIGITS
    else:
        digits, base, allowed = part, 10, _DEC_DIGITS
    if not set(digits) <= allowed:
        raise ValueError(f"host {text!a} ends in a number but is not an IPv4 address")
    return int(digits, base) if digits else 0


# --- matching ---------------------------------------------------------------------------


def matches(entry: str, host: str, port: int | None = None) -> bool:
    """Whether list entry ``entry`` covers ``host`` on ``port`` (deny entries use more).

    ``port=None`` matches only entries without a port. Embedded-IPv4 aliases are
    not considered here; ``decide`` adds them for deny entries.

    >>> matches("*.example.com", "a.b.example.com"), matches("*.example.com", "example.com")
    (True, False)
    >>> matches("bedrock.*.amazonaws.com", "bedrock.evil.attacker.amazonaws.com")
    False

    Raises:
        ValueError: ``entry`` is not a pattern (``*`` is accepted) or ``host``
            is not a host.
    """
    pattern = parse_pattern(entry, allow_bare_star=True)
    canonical, ip = _canonical(host)
    return _matches(pattern, canonical, ip is not None, port, ())


def _matches(
    pattern: DomainPattern, host: str, host_is_ip: bool, port: int | None, aliases: Sequence[str]
) -> bool:
    if pattern.port is not None and pattern.port != port:
        return False
    if pattern.kind == "any":
        return True
    if pattern.kind == "ip":
        return host_is_ip and (pattern.host == host or pattern.host in aliases)
    return not host_is_ip and _name_matches(pattern.host, host)


def _name_matches(pattern: str, host: str) -> bool:
    before, star, after = pattern.partition("*")
    if not star:
        return pattern == host
    if not before:  # leading "*.example.com": any depth, not example.com itself
        return host.endswith(after)
    if len(host) <= len(before) + len(after):
        return False
    if not (host.startswith(before) and host.endswith(after)):
        return False
    return "." not in host[len(before) : len(host) - len(after)]  # exactly one label


@lru_cache(maxsize=2048)
def _pattern_or_error(entry: str, allow_bare_star: bool) -> DomainPattern | str:
    try:
        return parse_pattern(entry, allow_bare_star=allow_bare_star)
    except ValueError as exc:
        return str(exc)


def _pattern(entry: object, allow_bare_star: bool) -> DomainPattern | str:
    if not isinstance(entry, str):
        return "entry is not a string"
    return _pattern_or_error(entry, allow_bare_star)


@lru_cache(maxsize=1)
def _baseline() -> tuple[tuple[DomainPattern, str], ...]:
    # the table is tested to parse; a failure here is a bug and must be loud
    return tuple(
        (parse_pattern(entry), category)
        for entries, category in _BASELINE_CATEGORIES
        for entry in entries
    )


@lru_cache(maxsize=1)
def _guarded_networks() -> tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...]:
    return tuple((ipaddress.ip_network(net), name) for net, name in _GUARDED_NETWORKS)


@lru_cache(maxsize=1)
def _nat64() -> ipaddress.IPv6Network:
    return ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052 well-known prefix


def _embedded_ipv4(ip: _IP) -> tuple[ipaddress.IPv4Address, ...]:
    """IPv4 addresses an IPv6 address carries (for deny matching only)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return ()
    value = int(ip)
    found: list[ipaddress.IPv4Address] = []
    if value >> 32 == 0 and value > 1:  # IPv4-compatible ::a.b.c.d (deprecated)
        found.append(ipaddress.IPv4Address(value))
    if ip in _nat64():
        found.append(ipaddress.IPv4Address(value & 0xFFFFFFFF))
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    return tuple(found)


def _aliases(ip: _IP | None) -> tuple[str, ...]:
    return () if ip is None else tuple(str(a) for a in _embedded_ipv4(ip))


def _address_class(ip: _IP, own: frozenset[str], own_networks: Sequence[_Net] = ()) -> str | None:
    for candidate in (ip, *_embedded_ipv4(ip)):
        for network, name in _guarded_networks():
            if candidate.version == network.version and candidate in network:
                return name
        if str(candidate) in own or any(
            candidate.version == n.version and candidate in n for n in own_networks
        ):
            return "host's own address"
    return None


def _own_networks(texts: Sequence[str]) -> list[_Net]:
    """The ``ADDRESS/PREFIX`` entries of the host's own addresses: a local route wider
    than one address (an address with a prefix on ``lo``, AnyIP) delivers every address
    in it to the host itself. Entries that do not parse are skipped (the single
    addresses are guarded whatever happens here)."""
    out: list[_Net] = []
    for text in texts:
        if isinstance(text, str) and "/" in text:
            try:
                out.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                continue
    return out


def _cut(reason: str) -> str:
    """A reason that quotes the client's text, bounded: each refusal is a log and
    ``--violations`` line, and a client can send hosts as long as the proxy reads."""
    return reason if len(reason) <= _MAX_REASON else reason[: _MAX_REASON - 3] + "..."


def _safe(text: object) -> str:
    """An ASCII, header-safe copy of input that could not be canonicalised."""
    if not isinstance(text, str):
        return "<not a string>"
    return ascii(text)[1:-1][:_MAX_HOST]


# --- decisions ----------------------------------------------------------------------------


def decide(policy: DomainPolicy, host: str, port: int) -> Decision:
    """Whether a connection to ``host:port`` may go out, and which rule said so.

    Order: ``BASELINE_DENIED``, ``policy.denied``, ``policy.allowed`` (or
    ``policy.allow_all``), else refused. The proxy then dials ``Decision.host``
    and checks the resolved addresses with ``guard_addresses``.

    Returns:
        A ``Decision``. Never raises: a host that cannot be canonicalised or a
        port outside 1-65535 is refused with a reason.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return Decision(
            False, _safe(host), 0, "invalid port", f"port {port!r} is not 1-65535", INVALID
        )
    try:
        canonical, ip = _canonical(host)
    except ValueError as exc:
        return Decision(False, _safe(host), port, "invalid host", _cut(str(exc)), INVALID)
    is_ip = ip is not None
    aliases = _aliases(ip)

    def refuse(rule: str, reason: str, kind: str) -> Decision:
        return Decision(False, canonical, port, rule, reason, kind)

    for pattern, category in _baseline():
        if _matches(pattern, canonical, is_ip, port, aliases):
            return refuse(
                f"baseline deny: {category}",
                f"{canonical} matches {pattern.entry!r} ({category}); no setting can allow it",
                BASELINE,
            )
    for entry in policy.denied:
        denied = _pattern(entry, True)
        if isinstance(denied, str):  # an unreadable deny rule refuses everything
            return refuse(f"deniedDomains: {entry}", f"invalid deny entry ({denied})", DENIED)
        if _matches(denied, canonical, is_ip, port, aliases):
            return refuse(f"deniedDomains: {entry}", f"{canonical}:{port} is denied", DENIED)
    for entry in policy.allowed:
        allowed = _pattern(entry, False)
        # an unreadable allow rule allows nothing, which cannot weaken the policy
        if not isinstance(allowed, str) and _matches(allowed, canonical, is_ip, port, ()):
            return Decision(
                True,
                canonical,
                port,
                f"allowedDomains: {entry}",
                f"{canonical} is allowed",
                ALLOWED,
            )
    if policy.allow_all:
        local = None if ip is None else _address_class(ip, frozenset())
        if local is not None:
            return refuse(
                "allowAllDomains excludes local addresses",
                f"{canonical} is a {local} address; list it in allowedDomains to reach it",
                LOCAL,
            )
        return Decision(
            True, canonical, port, "allowAllDomains", "every host not denied", ALLOW_ALL
        )
    if not policy.allowed:
        return refuse("not in allowedDomains", "allowedDomains is empty: no network", UNLISTED)
    return refuse("not in allowedDomains", f"{canonical} matches no allowedDomains entry", UNLISTED)


def guard_addresses(
    policy: DomainPolicy,
    host: str,
    port: int,
    addresses: Sequence[str],
    host_own_addresses: Sequence[str],
) -> Decision | None:
    """Refuse an allowed name whose resolved addresses reach somewhere it must not.

    Call it with every address the proxy may dial for ``host`` (for an IP
    literal, the literal), after ``decide`` allowed it. An address refuses the
    connection when it is denied (baseline or ``policy.denied``), or is
    loopback, link-local, unspecified, multicast, broadcast or in
    ``host_own_addresses`` (addresses, or ``ADDRESS/PREFIX`` for a local route
    wider than one address), unless an IP entry of ``policy.allowed`` names it.
    Zone ids on resolved addresses are dropped (they are facts, not input).

    Returns:
        ``None`` when every address is fine, else the refusal for the first bad
        one. Never raises: an address that does not parse is refused.
    """
    try:
        canonical = _canonical(host)[0]
    except ValueError as exc:
        return Decision(False, _safe(host), 0, "invalid host", str(exc), INVALID)
    own = frozenset(a for a in (_address_or_none(t) for t in host_own_addresses) if a)
    own_networks = _own_networks(host_own_addresses)
    explicit = DomainPolicy(allowed=policy.allowed, denied=policy.denied)
    for text in addresses:
        address = _address_or_none(text)
        if address is None:
            return Decision(
                False,
                canonical,
                port,
                "resolved address guard: unreadable address",
                f"{canonical} resolved to {_safe(text)!r}, which is not an IP address",
                GUARD,
            )
        # the address as a literal, by the lists alone: deny entries refuse it,
        # and only an IP entry of the allow list can allow it
        probe = decide(explicit, address, port)
        if not probe.allowed and probe.deny_listed:
            return Decision(
                False,
                canonical,
                port,
                probe.rule,
                f"{canonical} resolved to {address}: {probe.reason}",
                probe.kind,
            )
        ip = ipaddress.ip_address(address)
        category = _address_class(ip, own, own_networks)
        if category is not None and not probe.allowed:
            return Decision(
                False,
                canonical,
                port,
                f"resolved address guard: {category}",
                f"{canonical} resolved to {address} ({category}); only an IP entry in "
                "allowedDomains can allow that address",
                GUARD,
            )
    return None


def guard_canonical_name(
    policy: DomainPolicy, host: str, port: int, canonical: str
) -> Decision | None:
    """Refuse an allowed name whose resolver answered for a denied one.

    ``canonical`` is the name the resolver's answer is for (a CNAME's target, an
    ``/etc/hosts`` alias's first name). A deny rule (baseline or ``policy.denied``)
    on it refuses ``host`` too; allow rules are not asked again (a CDN's CNAME
    names a host no allow list lists).

    Returns:
        ``None`` when ``canonical`` is empty, ``host`` itself or denied by nothing;
        else the refusal. Never raises.
    """
    if not canonical or canonical == host:
        return None
    probe = decide(DomainPolicy(allowed=(), denied=policy.denied), canonical, port)
    if probe.allowed or not probe.deny_listed:
        return None
    return Decision(
        False,
        host,
        port,
        probe.rule,
        f"{host} resolved as {probe.host}: {probe.reason}",
        probe.kind,
    )


def _address_or_none(text: object) -> str | None:
    """Canonical spelling of an address from the resolver or the host, or None."""
    if not isinstance(text, str):
        return None
    text = text.strip("[]").partition("%")[0]
    try:
        ip: _IP = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def offline_lookup_line(names: Sequence[str], limit: int = 3) -> str:
    """The one line of a run with the network off whose DNS lookups were refused
    (printed by default; ``-q`` silences it): the names, the rule, and what to add.

    >>> offline_lookup_line(["a.example", "b.example"]).split(" (")[0]
    'network: refused DNS lookup of a.example, b.example'
    """
    shown = ", ".join(names[:limit])
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return (
        f"network: refused DNS lookup of {shown}{more} (the network is off: no "
        f'network.allowedDomains); to allow it: "network": {{"allowedDomains": ["{names[0]}"]}}'
    )
