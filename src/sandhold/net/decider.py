"""The external decider's protocol (version 1, srt's), sans-I/O: bytes in, typed events out.

Wire format: a frame is a 4-byte big-endian length, then that many bytes of one
UTF-8 JSON object whose ``t`` names the message. The proxy speaks first::

    proxy   → decider  {"t":"hello","proto":1}
    decider → proxy    {"t":"hello","proto":1,"allowedDomains":[...],"deniedDomains":[...]}
    proxy   → decider  {"t":"req","id":N,"method","host","port","hostHeader"?,"sni"?,
                        "path","query"?,"headers"?:{name:[values]}}
    decider → proxy    {"t":"verdict","id":N,"action":"allow","setHeaders"?,
                        "removeHeaders"?,"cred"?,"credential"?}
                     | {"t":"verdict","id":N,"action":"deny","status":400..599,"reason"?}
                     | {"t":"verdict","id":N,"action":"need_body","max":1..32 MiB}
    proxy   → decider  {"t":"body","id":N,"data":"<base64>","cut"?:true}

Rules (all of them the reference's, so an existing decider works unchanged):
- Frames from the decider are at most 1 MiB (``MAX_FRAME``); a larger length
  prefix breaks the link as soon as its 4 bytes are in. The decoder holds at
  most one partial frame (4 + 1 MiB bytes) plus the last chunk fed to it.
- Frames are read strictly (``parse_strict_json``): UTF-8 only, exactly one
  JSON object, no ``null``, no duplicate key, no lone surrogate, no NaN or
  Infinity. Messages are checked against their schema exactly: no unknown
  field; an optional field is left out, never sent empty (``false``, ``""``,
  ``{}``, ``[]``); header names are lower-case tokens; header values and reasons
  carry no control character (tab aside, C1 included); the limits of
  ``headers_fit`` and the deny reason's 1 KiB apply.
- The first frame from the decider is its hello; after it, only verdicts.
- Request ids start at 1 and strictly increase. A request waits for verdicts
  until an allow or a deny ends it; a ``need_body`` asks for the body once. While
  the proxy reads the body only a deny may come. A verdict for an id nothing
  waits on breaks the link, except for ids the proxy gave up on (timed out or
  refused itself), whose late verdicts are dropped, and ids more than 4096
  below the newest, which are forgotten.
- Any violation puts the machine in ``DEAD`` for good: every later call raises
  the same ``DeciderDead`` (h11's rule: a broken link cannot be reused by
  accident). ``DeciderDead`` is the only exception the receiving side raises;
  any other is a bug. A caller's own mistake (sending for an id it does not
  own) raises ``RuntimeError`` and leaves the state unchanged.

The machine never reads a clock or a socket: the I/O side (``decider_client``)
owns the timer and calls ``give_up`` when a verdict is late.
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct

from sandhold._record import record

TYPE_CHECKING = False  # typing costs start-up time; mypy honours this name
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import TypeAlias

    Verdict: TypeAlias = "Allow | Deny | NeedBody"

PROTO = 1
MAX_FRAME = 1 << 20  # bytes of one frame from the decider, and of one req frame
MAX_BODY = 32 << 20  # largest need_body ``max``
MAX_ID = 2**53 - 1
ID_WINDOW = 4096
MAX_HEADER_ENTRIES = 190
MAX_HEADER_BYTES = 64 << 10
MAX_REMOVE_NAMES = 190
MAX_REMOVE_BYTES = 64 << 10
MAX_HOST_PATH = 8 << 10
MAX_REASON_BYTES = 1 << 10

_LEN = struct.Struct(">I")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CREDENTIAL_VALUE = re.compile(r"[\x21-\x7e]{1,8192}")
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_PORT = re.compile(r"[1-9][0-9]{0,4}")

# Headers a credential travels in: removed, in any spelling, before one is placed.
CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie", "x-api-key")
_FRAMING = (
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
)


def fold_header_name(name: str) -> str:
    """A header name as verdicts match it: case-insensitive, ``-``, ``_`` and ``.`` alike."""
    return name.lower().replace("_", "-").replace(".", "-")


_NEVER_SET = frozenset(fold_header_name(n) for n in (*CREDENTIAL_HEADERS, *_FRAMING))
_NEVER_REMOVED = frozenset(fold_header_name(n) for n in _FRAMING)


class DeciderDead(Exception):
    """The link to the decider is broken for good; ``reason`` says why (EOF or a violation)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


# --- messages ---------------------------------------------------------------------


@record
class Hello:
    """The decider's hello: the egress lists the proxy holds requests to."""

    allowed_domains: tuple[str, ...]
    denied_domains: tuple[str, ...]


@record
class Allow:
    """Forward the request after the header edits; ``cred``/``credential`` come together."""

    id: int
    set_headers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    remove_headers: tuple[str, ...] = ()
    cred: str | None = None
    credential: str | None = None


@record
class Deny:
    """Answer the client with ``status`` (400-599) and ``reason``; nothing is dialled."""

    id: int
    status: int
    reason: str | None = None


@record
class NeedBody:
    """Send up to ``max`` bytes of the request body, then wait for the final verdict."""

    id: int
    max: int


# --- strict JSON ------------------------------------------------------------------


class _Bad(Exception):
    pass


def _pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _Bad("duplicate key in frame")
        out[key] = value
    return out


def _no_constant(name: str) -> object:
    raise _Bad(f"{name} in frame")


def _well_formed(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_values(value: object) -> None:
    if value is None:
        raise _Bad("null in frame")
    if isinstance(value, str):
        if not _well_formed(value):
            raise _Bad("lone surrogate in frame")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not _well_formed(key):
                raise _Bad("lone surrogate in frame")
            _check_values(item)
    elif isinstance(value, list):
        for item in value:
            _check_values(item)


def parse_strict_json(frame: bytes) -> dict[str, object]:
    """One JSON object from a frame, refusing what a lenient parser lets through.

    Raises:
        DeciderDead: not UTF-8, not one object, a null, a duplicate key, a lone
            surrogate, NaN or Infinity.
    """
    try:
        text = frame.decode("utf-8")
    except UnicodeDecodeError:
        raise DeciderDead("frame is not UTF-8") from None
    if text.startswith("\ufeff"):  # the reference's decoder drops one BOM
        text = text[1:]
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant)
        if not isinstance(value, dict):
            raise _Bad("frame is not one JSON object")
        _check_values(value)
    except _Bad as exc:
        raise DeciderDead(str(exc)) from None
    except (ValueError, RecursionError):
        raise DeciderDead("frame is not valid JSON") from None
    return value


# --- validation -------------------------------------------------------------------


def _has_control(text: str) -> bool:
    return any((c < " " and c != "\t") or "\x7f" <= c <= "\x9f" for c in text)


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _int(value: object, low: int, high: int) -> int | None:
    """A JSON number that is an integer in [low, high] (``7.0`` counts, as in JavaScript)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return None
        value = int(value)
    if isinstance(value, int) and low <= value <= high:
        return value
    return None


def _lower_name(name: object) -> bool:
    return isinstance(name, str) and bool(_TOKEN.fullmatch(name)) and name == name.lower()


def _unique_strings(value: object) -> list[str] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return value if len(set(value)) == len(value) else None


def headers_fit(headers: Mapping[str, Sequence[str]]) -> bool:
    """Whether headers are within the protocol's caps.

    At most 190 values (a name with no value counts as one) and 64 KiB of names
    and values, in UTF-8 bytes.
    """
    entries = 0
    size = 0
    for name, values in headers.items():
        entries += max(1, len(values))
        size += _utf8_len(name) + sum(_utf8_len(v) for v in values)
        if entries > MAX_HEADER_ENTRIES or size > MAX_HEADER_BYTES:
            return False
    return True


def is_egress_entry(entry: str) -> bool:
    """Whether ``entry`` may stand in a hello's list (the reference's ``isEgressEntry``).

    A lower-case DNS name, the same after ``*.`` (two labels or more), or an IP
    literal, then an optional ``:port`` (after ``[...]`` for IPv6).

    >>> [is_egress_entry(e) for e in ("a.example", "*.example.org:443", "*.com", "A.b")]
    [True, True, False, False]
    """
    import ipaddress

    def ip_version(text: str) -> int:
        try:
            return ipaddress.ip_address(text).version
        except ValueError:
            return 0

    if "%" not in entry and ip_version(entry):
        return True
    if entry.startswith("["):
        end = entry.find("]")
        if end < 0:
            return False
        rest = entry[end + 1 :]
        if rest and (not rest.startswith(":") or not _PORT.fullmatch(rest[1:])):
            return False
        if rest and int(rest[1:]) > 65535:
            return False
        inner = entry[1:end]
        return "%" not in inner and ip_version(inner) == 6
    host = entry
    if ":" in entry:
        host, _, port = entry.rpartition(":")
        if not _PORT.fullmatch(port) or int(port) > 65535:
            return False
    if ip_version(host):
        return ip_version(host) == 4
    wild = host.startswith("*.")
    base = host[2:] if wild else host
    labels = base.split(".")
    if not base or len(base) > 253 or (wild and len(labels) < 2):
        return False
    if not all(_LABEL.fullmatch(label) for label in labels):
        return False
    return "a" <= labels[-1][0] <= "z"


def _check_fields(
    msg: Mapping[str, object], required: frozenset[str], optional: frozenset[str]
) -> bool:
    keys = set(msg)
    return required <= keys <= required | optional


_HELLO_KEYS = frozenset({"t", "proto", "allowedDomains", "deniedDomains"})
_VERDICT_KEYS = frozenset({"t", "id", "action"})
_ALLOW_OPT = frozenset({"setHeaders", "removeHeaders", "cred", "credential"})


def validate_hello(msg: Mapping[str, object]) -> Hello:
    """The decider's hello.

    Raises:
        DeciderDead: ``"bad hello"``.
    """
    if msg.get("t") != "hello" or not _check_fields(msg, _HELLO_KEYS, frozenset()):
        raise DeciderDead("bad hello")
    if _int(msg["proto"], PROTO, PROTO) is None:
        raise DeciderDead("bad hello")
    lists = [_unique_strings(msg[k]) for k in ("allowedDomains", "deniedDomains")]
    allowed, denied = lists
    if allowed is None or denied is None:
        raise DeciderDead("bad hello")
    if not all(is_egress_entry(e) for e in (*allowed, *denied)):
        raise DeciderDead("bad hello")
    return Hello(tuple(allowed), tuple(denied))


def validate_verdict(msg: Mapping[str, object]) -> Verdict:
    """A verdict message, checked against its schema exactly.

    Raises:
        DeciderDead: ``"bad verdict frame"``.
    """
    bad = DeciderDead("bad verdict frame")
    if msg.get("t") != "verdict":
        raise bad
    ident = _int(msg.get("id"), 1, MAX_ID)
    if ident is None:
        raise bad
    action = msg.get("action")
    if action == "deny":
        if not _check_fields(msg, _VERDICT_KEYS | {"status"}, frozenset({"reason"})):
            raise bad
        status = _int(msg["status"], 400, 599)
        reason = msg.get("reason")
        if status is None:
            raise bad
        if reason is not None and not (
            isinstance(reason, str)
            and reason
            and _utf8_len(reason) <= MAX_REASON_BYTES
            and not _has_control(reason)
        ):
            raise bad
        return Deny(ident, status, reason)
    if action == "need_body":
        if not _check_fields(msg, _VERDICT_KEYS | {"max"}, frozenset()):
            raise bad
        limit = _int(msg["max"], 1, MAX_BODY)
        if limit is None:
            raise bad
        return NeedBody(ident, limit)
    if action == "allow":
        if not _check_fields(msg, _VERDICT_KEYS, _ALLOW_OPT):
            raise bad
        return _allow(ident, msg, bad)
    raise bad


def _allow(ident: int, msg: Mapping[str, object], bad: DeciderDead) -> Allow:
    sets: list[tuple[str, tuple[str, ...]]] = []
    if "setHeaders" in msg:
        raw = msg["setHeaders"]
        if not isinstance(raw, dict) or not raw:
            raise bad
        for name, values in raw.items():
            if not _lower_name(name) or fold_header_name(name) in _NEVER_SET:
                raise bad
            if not isinstance(values, list) or not all(
                isinstance(v, str) and not _has_control(v) for v in values
            ):
                raise bad
            sets.append((name, tuple(values)))
        if not headers_fit(dict(sets)):
            raise bad
    removes: list[str] = []
    if "removeHeaders" in msg:
        names = _unique_strings(msg["removeHeaders"])
        if not names or len(names) > MAX_REMOVE_NAMES:
            raise bad
        if sum(_utf8_len(n) for n in names) > MAX_REMOVE_BYTES:
            raise bad
        if not all(_lower_name(n) and fold_header_name(n) not in _NEVER_REMOVED for n in names):
            raise bad
        removes = names
    cred = msg.get("cred")
    credential = msg.get("credential")
    if ("cred" in msg) != ("credential" in msg):
        raise bad
    if cred is not None and not (isinstance(cred, str) and cred):
        raise bad
    if credential is not None and not (
        isinstance(credential, str) and _CREDENTIAL_VALUE.fullmatch(credential)
    ):
        raise bad
    return Allow(ident, tuple(sets), tuple(removes), cred, credential)


# --- framing ----------------------------------------------------------------------


def encode_frame(msg: Mapping[str, object]) -> bytes:
    """One frame: the 4-byte big-endian length, then compact JSON (as ``JSON.stringify``)."""
    body = json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return _LEN.pack(len(body)) + body


def encode_body_frame(ident: int, data: bytes, cut: bool) -> bytes:
    """The ``body`` frame for ``data``; ``cut`` when the body was longer than shown."""
    head = b'{"t":"body","id":%d,"data":"' % ident
    tail = b'","cut":true}' if cut else b'"}'
    payload = head + base64.b64encode(data) + tail
    return _LEN.pack(len(payload)) + payload


class FrameDecoder:
    """Split a byte stream into frames of at most ``max_frame`` bytes.

    Feed with ``receive_data``; ``next_frame`` returns one frame's payload or
    ``None`` (feed more). Raises ``DeciderDead`` for an oversized length or a
    stream that ended inside a frame, and again on every later call.
    """

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._max = max_frame
        self._buf = bytearray()
        self._eof = False
        self._error: DeciderDead | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def receive_data(self, data: bytes) -> None:
        """Add bytes; ``b""`` means the decider closed its side."""
        if self._error is not None:
            raise self._error
        if not data:
            self._eof = True
        self._buf += data

    def next_frame(self) -> bytes | None:
        if self._error is not None:
            raise self._error
        if len(self._buf) >= 4:
            (size,) = _LEN.unpack_from(self._buf)
            if size > self._max:
                self._buf.clear()
                raise self._fail("oversized frame")
            if len(self._buf) >= 4 + size:
                frame = bytes(self._buf[4 : 4 + size])
                del self._buf[: 4 + size]
                return frame
        if self._eof:
            self._buf.clear()
            raise self._fail("decider closed the stream")
        return None

    def _fail(self, reason: str) -> DeciderDead:
        self._error = DeciderDead(reason)
        return self._error


# --- the link's state machine -----------------------------------------------------

# Per-request states. A request is WAITING for its first verdict, READING_BODY
# after a need_body (only a deny may come), or SHOWN once its body went out.
WAITING, READING_BODY, SHOWN = "waiting", "reading_body", "shown"
# Given-up ids remember whether a need_body may still legitimately arrive.
_LATE_BEFORE_BODY, _LATE_AFTER_BODY = "late", "late_shown"

# Which verdicts each state accepts; anything else breaks the link.
_ACCEPTS: dict[str, frozenset[type]] = {
    WAITING: frozenset({Allow, Deny, NeedBody}),
    READING_BODY: frozenset({Deny}),
    SHOWN: frozenset({Allow, Deny}),
}


class DeciderLink:
    """Both directions of one decider link: bytes in, ``(id, verdict)`` events out.

    Use: ``start()`` gives the hello frame to send; feed everything the decider
    writes to ``receive_data`` and drain ``next_event``: first a ``Hello``, then
    verdicts for waiting requests. ``request(fields)`` opens a request and gives
    its id and frame; ``body(id, data, cut)`` answers a need_body; ``give_up(id)``
    stops waiting on a request (its timer ran out, or the proxy refused it
    itself). ``kill(reason)`` ends the link from this side.
    """

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._decoder = FrameDecoder(max_frame)
        self._hello: Hello | None = None
        self._last_id = 0
        self._open: dict[int, str] = {}
        self._late: dict[int, str] = {}
        self._dead: DeciderDead | None = None

    @property
    def dead(self) -> DeciderDead | None:
        """Why the link died, or ``None`` while it lives."""
        return self._dead

    @property
    def hello(self) -> Hello | None:
        return self._hello

    @property
    def buffered(self) -> int:
        return self._decoder.buffered

    def state(self, ident: int) -> str | None:
        """A request's state, or ``None`` once it ended or was given up."""
        return self._open.get(ident)

    def start(self) -> bytes:
        return encode_frame({"t": "hello", "proto": PROTO})

    def kill(self, reason: str) -> DeciderDead:
        """End the link (idempotent); returns the error every later call raises."""
        if self._dead is None:
            self._dead = DeciderDead(reason)
            self._open.clear()
            self._late.clear()
        return self._dead

    def receive_data(self, data: bytes) -> None:
        """Bytes from the decider; ``b""`` is its EOF.

        Raises:
            DeciderDead: the link is dead (now, or before).
        """
        if self._dead is not None:
            raise self._dead
        self._decoder.receive_data(data)

    def next_event(self) -> Hello | Verdict | None:
        """The next event, or ``None`` (feed more bytes).

        Returns the ``Hello`` once, then verdicts for requests that wait on
        them. Verdicts that arrive for given-up or forgotten ids are dropped
        here and never returned. An ``Allow`` or ``Deny`` ends its request; a
        ``NeedBody`` moves it to ``READING_BODY``.

        Raises:
            DeciderDead: the only exception expected; the link is dead for good.
        """
        if self._dead is not None:
            raise self._dead
        while True:
            try:
                frame = self._decoder.next_frame()
                if frame is None:
                    return None
                event = self._on_frame(parse_strict_json(frame))
            except DeciderDead as exc:
                raise self.kill(exc.reason) from None
            if event is not None:
                return event

    def _on_frame(self, msg: dict[str, object]) -> Hello | Verdict | None:
        if self._hello is None:
            self._hello = validate_hello(msg)
            return self._hello
        verdict = validate_verdict(msg)
        ident = verdict.id
        state = self._open.get(ident)
        if state is not None:
            if type(verdict) not in _ACCEPTS[state]:
                raise DeciderDead(
                    f"{type(verdict).__name__.lower()} for id {ident} while it is {state}"
                )
            if isinstance(verdict, NeedBody):
                self._open[ident] = READING_BODY
            else:
                del self._open[ident]
            return verdict
        late = self._late.get(ident)
        if late is not None:
            if isinstance(verdict, NeedBody):
                if late != _LATE_BEFORE_BODY:
                    raise DeciderDead("need_body where none may come")
            else:
                del self._late[ident]
            return None
        if ident < self._last_id and self._last_id - ident >= ID_WINDOW:
            return None
        raise DeciderDead(f"verdict for id {ident}, which nothing waits on")

    def request(self, fields: Mapping[str, object]) -> tuple[int, bytes]:
        """Open the next request: its id and its ``req`` frame.

        Raises:
            DeciderDead: the link is dead, no hello came yet, or ids ran out.
            ValueError: the frame would be larger than ``MAX_FRAME``; nothing changes.
        """
        if self._dead is not None:
            raise self._dead
        if self._hello is None:
            raise DeciderDead("decider not ready")
        if self._last_id >= MAX_ID:
            raise self.kill("request ids exhausted")
        ident = self._last_id + 1
        frame = encode_frame({"t": "req", "id": ident, **fields})
        if len(frame) - 4 > MAX_FRAME:
            raise ValueError("request too large for the decider")
        self._last_id = ident
        self._open[ident] = WAITING
        self._prune()
        return ident, frame

    def body(self, ident: int, data: bytes, cut: bool) -> bytes:
        """The ``body`` frame answering a need_body; the request then waits in ``SHOWN``.

        Raises:
            DeciderDead: the link is dead.
            RuntimeError: ``ident`` is not reading its body (a bug in the caller).
        """
        if self._dead is not None:
            raise self._dead
        if self._open.get(ident) != READING_BODY:
            raise RuntimeError(f"request {ident} is not waiting for its body")
        self._open[ident] = SHOWN
        return encode_body_frame(ident, data, cut)

    def give_up(self, ident: int) -> None:
        """Stop waiting on a request; its late verdicts are dropped. No-op if it ended."""
        state = self._open.pop(ident, None)
        if state is None or self._dead is not None:
            return
        self._late[ident] = _LATE_BEFORE_BODY if state == WAITING else _LATE_AFTER_BODY
        self._prune()

    def _prune(self) -> None:
        if len(self._late) > ID_WINDOW:
            for ident in [i for i in self._late if self._last_id - i >= ID_WINDOW]:
                del self._late[ident]


_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX = frozenset("0123456789abcdefABCDEF")


def path_ambiguity(path: str) -> str | None:
    """Why origins could read ``path`` as another path than its text says, or ``None``.

    The decider judges the path it is sent and the origin gets that same text, so
    the text must mean one path: a decider refusing ``/private/`` must not be
    passed by ``/./private/``, ``//private/``, ``/%70rivate/``, ``/x/../private/``,
    ``/private%2fkey`` or Tomcat's ``/private;x/key``. Refused: dot-segments, empty
    segments, backslashes, ``;``, malformed escapes, and escapes of unreserved
    characters (they mean the character itself), of ``/``, ``\\``, ``;`` and NUL,
    an escaped escape (``%252e``, for origins that decode twice), escapes that are
    not UTF-8 (the overlong
    ``%c0%ae``), and a segment ending in ``.`` or a space (Windows servers drop
    them). Case is the decider's: an origin that ignores it needs a decider that
    does too.

    >>> path_ambiguity("/v1/messages"), path_ambiguity("*")
    (None, None)
    >>> path_ambiguity("/a/%2E%2E/b")
    'ambiguous path: an escaped unreserved character (%2E)'
    """
    if path == "*":
        return None  # OPTIONS *
    if not path.startswith("/"):
        return "ambiguous path: it does not start with '/'"
    segments = path.split("/")[1:]
    if any(seg in (".", "..") for seg in segments):
        return "ambiguous path: a '.' or '..' segment"
    if any(not seg for seg in segments[:-1]):
        return "ambiguous path: an empty segment ('//')"
    for bad in ("\\", ";"):
        if bad in path:
            return f"ambiguous path: {bad!r} (servers read it differently)"
    at = path.find("%")
    while at >= 0:
        escape = path[at : at + 3]
        if len(escape) < 3 or not _HEX.issuperset(escape[1:]):
            return "ambiguous path: a malformed %-escape"
        char = chr(int(escape[1:], 16))
        if char in _UNRESERVED:
            return f"ambiguous path: an escaped unreserved character ({escape})"
        if char in "/\\;\0":
            return f"ambiguous path: an escaped separator or NUL ({escape})"
        if char == "%" and _HEX.issuperset(path[at + 3 : at + 5]) and len(path) >= at + 5:
            return f"ambiguous path: an escaped escape ({path[at : at + 5]}), decoded twice by some"
        at = path.find("%", at + 3)
    from urllib.parse import unquote_to_bytes

    try:
        decoded = unquote_to_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        return "ambiguous path: escapes that are not UTF-8 (an overlong form reads as '.')"
    if any(seg and seg[-1] in ". " for seg in decoded.split("/")):
        return "ambiguous path: a segment ending in '.' or a space (Windows servers drop it)"
    return None


def req_fields(
    *,
    method: str,
    host: str,
    port: int,
    target: str,
    headers: Sequence[tuple[str, str]],
    sni: str | None = None,
) -> dict[str, object] | str:
    """A ``req`` frame's fields (all but ``t`` and ``id``), or why it cannot be asked.

    ``target`` is the request target as spelled (path and query); ``headers``
    are the client's, names in any case. Past the protocol's limits, or with a
    value it refuses, the answer is a reason string: the proxy answers 400 itself.
    """
    path, _, query = target.partition("?")
    out: dict[str, list[str]] = {}
    host_header: str | None = None
    host_headers = 0
    for raw_name, value in headers:
        name = raw_name.lower()
        if not _TOKEN.fullmatch(name) or _has_control(value) or not _well_formed(value):
            return "request header the decider cannot be asked about"
        if name == "host":
            host_headers += 1
            host_header = value
            continue
        out.setdefault(name, []).append(value)
    if host_headers > 1:
        return "more than one Host header"
    if not headers_fit(out):
        return "request headers too large"
    if not method or not host or not path or not 1 <= port <= 65535:
        return "request the decider cannot be asked about"
    for text in (host, host_header or "", sni or "", path):
        if _utf8_len(text) > MAX_HOST_PATH:
            return "request target too large"
    if not all(_well_formed(t) for t in (method, host, path, query)):
        return "request the decider cannot be asked about"
    ambiguous = path_ambiguity(path)
    if ambiguous:
        return ambiguous
    fields: dict[str, object] = {"method": method, "host": host, "port": port}
    if host_header is not None:
        fields["hostHeader"] = host_header
    if sni:
        fields["sni"] = sni
    fields["path"] = path
    if query:
        fields["query"] = query
    if out:
        fields["headers"] = out
    frame = encode_frame({"t": "req", "id": MAX_ID, **fields})
    if len(frame) - 4 > MAX_FRAME:
        return "request too large for the decider"
    return fields
