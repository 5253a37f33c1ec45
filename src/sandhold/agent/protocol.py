"""The agent protocol's bytes: frames and field maps, with no I/O (docs/agent-protocol.md).

Rules:
- A frame is a 9-byte header, big-endian ``length:u32 kind:u8 id:u32``, then
  ``length`` payload bytes. ``id`` names the exec the frame is about (0: the
  agent itself). Any byte stream carries it: a socket pair, a pipe pair, vsock,
  a serial line.
- Output and input bytes (``STDOUT``, ``STDERR``, ``STDIN``) travel raw in the
  payload; every other frame's payload is a field map (``encode_fields``).
- A field map is ``count:u16`` then, per field, ``klen:u8 key tag:u8 value``
  with tags ``i`` (i64), ``s`` (u32 length + bytes), ``l`` (u32 count, then
  each item as u32 length + bytes) and ``n`` (null). Text is UTF-8.
- Decoders trust nothing: a frame longer than the reader's limit, an unknown
  tag, or a map that runs past its payload raises ``ProtocolError``. After an
  error the stream is unusable; the reader drops it.
- Imports only ``struct``: the agent imports this module at start-up.
"""

from __future__ import annotations

import struct

VERSION = 1

HEADER = struct.Struct(">IBI")
HEADER_SIZE = HEADER.size  # 9
MAX_PAYLOAD = 4 << 20  # what a reader accepts by default
DATA_CHUNK = 1 << 20  # what a writer puts in one output frame at most

# host -> agent
EXEC = 0x01  # fields: argv (l), env (l, NAME=value), cwd (s), stdin (i: 0 /dev/null, 1 pipe)
STDIN = 0x02  # raw bytes for the exec's stdin; an empty payload closes it
SIGNAL = 0x03  # fields: signo (i), group (i: 1 = the exec's whole process group)
PING = 0x04  # fields: any; echoed back as PONG with the same id
SHUTDOWN = 0x05  # kill every exec and exit

# agent -> host
HELLO = 0x81  # fields: version (i), pid (i); sent once, first: the sandbox is ready
STARTED = 0x82  # fields: pid (i, in the sandbox's PID namespace)
STDOUT = 0x83  # raw bytes
STDERR = 0x84  # raw bytes
EXIT = 0x85  # fields: code (i), signal (i), error (s: why it never started, or "")
STDIN_ACK = 0x86  # fields: n (i, bytes written to the pipe), closed (i: the reader went away)
PONG = 0x87  # the PING's fields
VIOLATION = 0x88  # fields: action, target, raw, rule (s)
LOG = 0x89  # fields: message (s); the agent's own diagnostics

KIND_NAMES = {
    EXEC: "EXEC",
    STDIN: "STDIN",
    SIGNAL: "SIGNAL",
    PING: "PING",
    SHUTDOWN: "SHUTDOWN",
    HELLO: "HELLO",
    STARTED: "STARTED",
    STDOUT: "STDOUT",
    STDERR: "STDERR",
    EXIT: "EXIT",
    STDIN_ACK: "STDIN_ACK",
    PONG: "PONG",
    VIOLATION: "VIOLATION",
    LOG: "LOG",
}
HOST_KINDS = frozenset({EXEC, STDIN, SIGNAL, PING, SHUTDOWN})
AGENT_KINDS = frozenset({HELLO, STARTED, STDOUT, STDERR, EXIT, STDIN_ACK, PONG, VIOLATION, LOG})

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import TypeAlias

    FieldIn: TypeAlias = int | str | bytes | Sequence[str | bytes] | None
    FieldOut: TypeAlias = int | bytes | list[bytes] | None

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")


class ProtocolError(Exception):
    """The peer sent bytes that are not this protocol; the stream must be dropped."""


def frame(kind: int, ident: int, payload: bytes = b"") -> bytes:
    """One frame as bytes."""
    return HEADER.pack(len(payload), kind, ident) + payload


def header(kind: int, ident: int, length: int) -> bytes:
    """A frame's header alone (to send the payload without copying it)."""
    return HEADER.pack(length, kind, ident)


def _blob(value: str | bytes) -> bytes:
    return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)


def encode_fields(fields: Mapping[str, FieldIn]) -> bytes:
    """A field map's bytes (see module rules). Keys are ASCII, at most 255 bytes."""
    out = [_U16.pack(len(fields))]
    for key, value in fields.items():
        k = key.encode("ascii")
        out.append(bytes((len(k),)) + k)
        if value is None:
            out.append(b"n")
        elif isinstance(value, bool | int):
            out.append(b"i" + _I64.pack(int(value)))
        elif isinstance(value, str | bytes | bytearray):
            b = _blob(value)
            out.append(b"s" + _U32.pack(len(b)) + b)
        else:
            items = [_blob(v) for v in value]
            out.append(b"l" + _U32.pack(len(items)))
            out.extend(_U32.pack(len(b)) + b for b in items)
    return b"".join(out)


def decode_fields(payload: bytes) -> dict[str, FieldOut]:
    """Parse a field map.

    Raises:
        ProtocolError: truncated, trailing bytes, unknown tag, duplicate key.
    """
    try:
        return _decode_fields(memoryview(payload))
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed field map: {exc}") from None


def _decode_fields(view: memoryview) -> dict[str, FieldOut]:
    end = len(view)
    (count,) = _U16.unpack_from(view, 0)
    pos = 2
    out: dict[str, FieldOut] = {}

    def take(n: int) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > end:
            raise ProtocolError("field map runs past its frame")
        chunk = bytes(view[pos : pos + n])
        pos += n
        return chunk

    for _ in range(count):
        klen = take(1)[0]
        key = take(klen).decode("ascii")
        if key in out:
            raise ProtocolError(f"duplicate field {key!r}")
        tag = take(1)
        if tag == b"n":
            out[key] = None
        elif tag == b"i":
            out[key] = _I64.unpack(take(8))[0]
        elif tag == b"s":
            out[key] = take(_U32.unpack(take(4))[0])
        elif tag == b"l":
            n = _U32.unpack(take(4))[0]
            if n > end:
                raise ProtocolError("list longer than its frame")
            out[key] = [take(_U32.unpack(take(4))[0]) for _ in range(n)]
        else:
            raise ProtocolError(f"unknown field tag {tag!r}")
    if pos != end:
        raise ProtocolError("trailing bytes after the field map")
    return out


class FrameDecoder:
    """Bytes in, ``(kind, id, payload)`` frames out; feed it any split of the stream."""

    def __init__(self, max_payload: int = MAX_PAYLOAD, kinds: frozenset[int] | None = None) -> None:
        self._buf = bytearray()
        self._max = max_payload
        self._kinds = kinds

    def feed(self, data: bytes, limit: int | None = None) -> list[tuple[int, int, bytes]]:
        """Add bytes; return every frame now complete, in order (at most ``limit``:
        the rest stay buffered, undecoded, for the next call; ``feed(b"")`` takes them).

        Raises:
            ProtocolError: a frame longer than the limit, or of a kind not accepted.
        """
        buf = self._buf
        buf += data
        frames: list[tuple[int, int, bytes]] = []
        pos = 0
        size = len(buf)
        most = size if limit is None else limit
        while size - pos >= HEADER_SIZE and len(frames) < most:
            length, kind, ident = HEADER.unpack_from(buf, pos)
            if length > self._max:
                raise ProtocolError(f"frame of {length} bytes exceeds the {self._max} limit")
            if self._kinds is not None and kind not in self._kinds:
                raise ProtocolError(f"unexpected frame kind 0x{kind:02x}")
            end = pos + HEADER_SIZE + length
            if end > size:
                break
            frames.append((kind, ident, bytes(buf[pos + HEADER_SIZE : end])))
            pos = end
        if pos:
            del buf[:pos]
        return frames

    @property
    def pending(self) -> int:
        """Bytes not yet returned as frames (an incomplete frame, or beyond ``limit``)."""
        return len(self._buf)


def text(value: FieldOut, default: str = "") -> str:
    """A decoded ``s`` field as text (undecodable bytes kept as surrogates)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return default


def integer(value: FieldOut, default: int = 0) -> int:
    return value if isinstance(value, int) else default
