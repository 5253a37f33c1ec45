"""The DNS stub's wire format: read one query, write its answer (sans-I/O).

Rules (issue 20):
- Input is hostile and bounded: a message is at most ``MAX_MESSAGE`` bytes, a
  name at most 255 bytes on the wire (no label holds a dot), at most
  ``MAX_RECORDS`` extra records are read, and a compression pointer must point
  backwards (so no loop); the work is linear in the input. Anything else is
  ``DnsError``, never another exception.
- A query is one question (``QDCOUNT`` 1, no answer or authority records,
  opcode QUERY); an ``OPT`` record in the additional section is EDNS (its
  version must be 0, else ``BADVERS``). Other opcodes are ``NOTIMP``, other
  shapes ``FORMERR``; a message too short for a header, or that is itself an
  answer (QR set), gets no reply at all (answering answers would let two stubs
  talk forever).
- ``answer`` echoes the question as sent, copies RD, sets AA and RA, and adds an
  ``OPT`` record when the query had one (``UDP_PAYLOAD``). It writes only A and
  AAAA records: the stub has no upstream, so a name's answer is never a CNAME.
- Nothing here decides which names are answered: ``DnsStub.respond`` asks
  ``policy.transparent.name_decision``.
"""

from __future__ import annotations

import ipaddress
import struct

from sandhold._record import record

TYPE_CHECKING = False  # typing costs start-up time; mypy honours this name
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from sandhold.policy.domains import Decision, DomainPolicy
    from sandhold.policy.transparent import SyntheticNames

MAX_MESSAGE = 65535
MAX_RECORDS = 8
MAX_NAME = 255
UDP_PAYLOAD = 1232  # the EDNS payload size we announce (the DNS flag day's value)
TTL = 60

NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED, BADVERS = 0, 1, 2, 3, 4, 5, 16
A, NS, CNAME, SOA, AAAA, OPT, ANY = 1, 2, 5, 6, 28, 41, 255
IN = 1
_HEADER = struct.Struct("!HHHHHH")


class DnsError(Exception):
    """A message that cannot be answered normally: ``rcode`` is what to answer.

    ``query_id`` is the message's id and ``flags`` its flags (for the reply);
    ``question`` the question's bytes if it was read, else ``b""``.
    """

    def __init__(
        self, rcode: int, why: str, query_id: int = 0, flags: int = 0, question: bytes = b""
    ) -> None:
        super().__init__(why)
        self.rcode = rcode
        self.query_id = query_id
        self.flags = flags
        self.question = question


class NoReply(Exception):
    """A message that gets no answer at all (too short, or itself an answer)."""


@record
class Query:
    """One parsed question: the name (lower case, no trailing dot, "" for the root)."""

    query_id: int
    flags: int
    name: str
    qtype: int
    qclass: int
    question: bytes  # the question section as sent, echoed in the answer
    edns: bool


def _read_name(data: bytes, offset: int) -> tuple[str, int]:
    """The name at ``offset`` and the offset after it (pointers followed backwards only)."""
    labels: list[str] = []
    wire = 0
    end = -1
    pos = offset
    while True:
        if pos >= len(data):
            raise ValueError("name runs past the message")
        length = data[pos]
        if length & 0xC0 == 0xC0:
            if pos + 1 >= len(data):
                raise ValueError("truncated pointer")
            target = ((length & 0x3F) << 8) | data[pos + 1]
            if target >= pos:
                raise ValueError("compression pointer does not point backwards")
            if end < 0:
                end = pos + 2
            pos = target
            continue
        if length & 0xC0:
            raise ValueError("unknown label type")
        pos += 1
        wire += length + 1
        if wire > MAX_NAME:
            raise ValueError("name longer than 255 bytes")
        if length == 0:
            break
        if pos + length > len(data):
            raise ValueError("label runs past the message")
        label = data[pos : pos + length]
        if b"." in label:
            # one label that reads as two ("evil.com" in one) must not pass for a name
            raise ValueError("a label with a dot in it")
        labels.append(label.decode("latin-1").lower())
        pos += length
    return ".".join(labels), (end if end >= 0 else pos)


def parse_query(data: bytes) -> Query:
    """Read one query message (module rules).

    Raises:
        NoReply: not worth an answer (shorter than a header, or an answer itself).
        DnsError: answer with ``rcode`` (FORMERR, NOTIMP, BADVERS).
    """
    if len(data) < _HEADER.size or len(data) > MAX_MESSAGE:
        raise NoReply("not a DNS message")
    query_id, flags, qdcount, ancount, nscount, arcount = _HEADER.unpack_from(data)
    if flags & 0x8000:
        raise NoReply("a response, not a query")
    if (flags >> 11) & 0xF != 0:
        raise DnsError(NOTIMP, "only standard queries", query_id, flags)
    if qdcount != 1 or ancount or nscount:
        raise DnsError(FORMERR, "one question and no answers expected", query_id, flags)
    try:
        name, pos = _read_name(data, _HEADER.size)
        if pos + 4 > len(data):
            raise ValueError("question truncated")
        qtype, qclass = struct.unpack_from("!HH", data, pos)
        question = data[_HEADER.size : pos + 4]
        pos += 4
    except ValueError as exc:
        raise DnsError(FORMERR, str(exc), query_id, flags) from None
    if b"\xc0" in question[:-4] and _has_pointer(question):
        # echoing a question with a pointer would point into our own answer's bytes
        raise DnsError(FORMERR, "compressed question", query_id, flags)
    edns = False
    if arcount > MAX_RECORDS:
        raise DnsError(FORMERR, "too many additional records", query_id, flags, question)
    try:
        for _ in range(arcount):
            rname, pos = _read_name(data, pos)
            if pos + 10 > len(data):
                raise ValueError("record truncated")
            rtype, _rclass, ttl, rdlength = struct.unpack_from("!HHIH", data, pos)
            pos += 10 + rdlength
            if pos > len(data):
                raise ValueError("record data runs past the message")
            if rtype == OPT:
                if rname or edns:
                    raise ValueError("misplaced or repeated OPT record")
                edns = True
                if (ttl >> 16) & 0xFF:
                    raise DnsError(BADVERS, "EDNS version", query_id, flags, question)
    except ValueError as exc:
        raise DnsError(FORMERR, str(exc), query_id, flags, question) from None
    return Query(query_id, flags, name, qtype, qclass, question, edns)


def _has_pointer(question: bytes) -> bool:
    pos = 0
    while pos < len(question) - 4:
        length = question[pos]
        if length & 0xC0:
            return True
        if length == 0:
            return False
        pos += length + 1
    return False


def _opt(rcode: int) -> bytes:
    return b"\x00" + struct.pack("!HHIH", OPT, UDP_PAYLOAD, (rcode >> 4) << 24, 0)


def answer(query: Query, rcode: int, addresses: Sequence[str] = (), ttl: int = TTL) -> bytes:
    """The reply to ``query``: ``rcode`` and one A/AAAA record per address."""
    records = []
    for text in addresses:
        ip = ipaddress.ip_address(text)
        rtype = A if ip.version == 4 else AAAA
        # 0xC00C: the name of the question, right after the header
        records.append(struct.pack("!HHHIH", 0xC00C, rtype, IN, ttl, len(ip.packed)) + ip.packed)
    flags = 0x8000 | 0x0400 | (query.flags & 0x0100) | 0x0080 | (rcode & 0xF)
    header = _HEADER.pack(query.query_id, flags, 1, len(records), 0, 1 if query.edns else 0)
    return header + query.question + b"".join(records) + (_opt(rcode) if query.edns else b"")


def error_answer(exc: DnsError) -> bytes:
    """The reply to a query that failed with ``exc``."""
    flags = 0x8000 | (exc.flags & 0x7900) | 0x0080 | (exc.rcode & 0xF)
    qd = 1 if exc.question else 0
    extra = _opt(exc.rcode) if exc.rcode > 0xF else b""
    header = _HEADER.pack(exc.query_id, flags, qd, 0, 0, 1 if extra else 0)
    return header + exc.question + extra


class DnsStub:
    """Answers queries from one session's policy and synthetic names (module rules).

    Args:
        policy: called once per query for the session's current ``DomainPolicy``.
        names: the session's ``SyntheticNames``.
        on_refusal: called with the ``Decision`` of every name refused (a
            violation); it must not block.
    """

    def __init__(
        self,
        policy: Callable[[], DomainPolicy],
        names: SyntheticNames,
        on_refusal: Callable[[Decision], object] | None = None,
    ) -> None:
        self._policy = policy
        self.names = names
        self._on_refusal = on_refusal

    def respond(self, data: bytes) -> bytes | None:
        """The answer to one message, or None for none. Never raises for the input."""
        from sandhold.policy.transparent import name_decision

        try:
            query = parse_query(data)
        except NoReply:
            return None
        except DnsError as exc:
            return error_answer(exc)
        if query.qclass != IN:
            return answer(query, REFUSED)
        if not query.name:
            return answer(query, REFUSED)  # the root: nothing to say about it
        try:
            decision = name_decision(self._policy(), query.name)
        except Exception:  # the policy could not be read: refuse (fail closed)
            return answer(query, SERVFAIL)
        if not decision.allowed:
            if self._on_refusal is not None:
                try:
                    self._on_refusal(decision)
                except Exception:  # reporting cannot change the answer
                    pass
            return answer(query, NXDOMAIN)
        versions = {A: (4,), AAAA: (6,), ANY: (4, 6)}.get(query.qtype, ())
        addresses = []
        for version in versions:
            address = self.names.address(decision.host, version)
            if address is None:
                return answer(query, REFUSED)  # the session's names are used up
            addresses.append(address)
        return answer(query, NOERROR, addresses)
