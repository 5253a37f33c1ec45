"""The server side of SOCKS5 (RFC 1928), sans-I/O: bytes in, typed events out, replies back.

Rules:
- What a sandbox needs and nothing more: authentication method 0x00 (none) and
  the CONNECT command, to an IPv4 address, a domain name or an IPv6 address.
  BIND and UDP ASSOCIATE (and unknown commands) are refused with reply 0x07,
  unknown address types with 0x08, everything else malformed with 0x01.
- The exchange, and every legal move, is the ``_NEXT`` table: client greeting →
  ``Greeting`` (the caller sends ``METHOD_NO_AUTH``) → client request →
  ``ConnectRequest`` → the caller sends ``reply(code)``: success opens the
  tunnel, any other code ends the exchange. A client may send its greeting and
  request at once; bytes after the request are the tunnel's first payload
  (``trailing_data``).
- Bytes are checked as they arrive, so garbage is refused at its first bad byte.
  A greeting is at most 257 bytes and a request at most 262; the machine holds at
  most ``MAX_BUFFERED`` bytes in all, however the client splits them.
- Errors: ``SocksError`` carries the reply code and the bytes to send before
  closing: ``05 FF`` (no acceptable method) while the greeting is read (a SOCKS4
  client, version byte 4, gets its own "request rejected", ``00 5B`` and six
  zeros), a reply with the code after it. It is raised only by ``receive_data`` and
  ``next_event``, where the client's bytes come in, and by ``fail`` for a
  caller-detected fault (a deadline). After one, the machine is in ``ERROR``
  and raises the same error again.
- Domain names are decoded as UTF-8 with surrogate escapes: bytes that are not
  UTF-8 reach the domain policy as text it refuses ("invalid host"); nothing is
  guessed here.
"""

from __future__ import annotations

import ipaddress

from sandhold._record import record
from sandhold.net.errors import SocksError

VERSION = 5
METHOD_NONE = 0x00
METHOD_REFUSED = 0xFF
CMD_CONNECT, CMD_BIND, CMD_UDP_ASSOCIATE = 1, 2, 3
ATYP_IPV4, ATYP_DOMAIN, ATYP_IPV6 = 1, 3, 4

# reply codes (RFC 1928 §6)
SUCCEEDED = 0x00
GENERAL_FAILURE = 0x01
NOT_ALLOWED = 0x02  # "connection not allowed by ruleset"
NETWORK_UNREACHABLE = 0x03
HOST_UNREACHABLE = 0x04
CONNECTION_REFUSED = 0x05
TTL_EXPIRED = 0x06
COMMAND_NOT_SUPPORTED = 0x07
ADDRESS_TYPE_NOT_SUPPORTED = 0x08

METHOD_NO_AUTH = bytes((VERSION, METHOD_NONE))
METHOD_NONE_ACCEPTABLE = bytes((VERSION, METHOD_REFUSED))
SOCKS4_REJECTED = bytes((0, 0x5B, 0, 0, 0, 0, 0, 0))
MAX_BUFFERED = 64 * 1024

# states
GREETING = "greeting"  # reading the client's method list
REQUEST = "request"  # method chosen, reading the client's request
REPLYING = "replying"  # request returned, the caller owes a reply
TUNNEL = "tunnel"  # success sent: the bytes from here on are the payload
CLOSED = "closed"  # a failure reply was sent
ERROR = "error"  # the client's bytes broke the protocol

# (state, move) -> next state; anything else is illegal
_NEXT: dict[tuple[str, str], str] = {
    (GREETING, "greeting"): REQUEST,
    (REQUEST, "request"): REPLYING,
    (REPLYING, "reply-success"): TUNNEL,
    (REPLYING, "reply-failure"): CLOSED,
}


@record
class Greeting:
    """The client's greeting: the authentication methods it offers (0x00 among them)."""

    methods: tuple[int, ...]


@record
class ConnectRequest:
    """A CONNECT request: ``host`` as sent (an address is in its usual text form).

    ``address_type`` is ``"ipv4"``, ``"ipv6"`` or ``"domain"``.
    """

    host: str
    port: int
    address_type: str


def reply_bytes(code: int) -> bytes:
    """A reply with ``code`` and the bound address 0.0.0.0:0 (sandboxes never need it)."""
    return bytes((VERSION, code, 0, ATYP_IPV4, 0, 0, 0, 0, 0, 0))


class Socks5Server:
    """One client's SOCKS5 handshake, seen from the server (rules in the module doc).

    >>> s = Socks5Server()
    >>> s.receive_data(bytes([5, 1, 0, 5, 1, 0, 3, 11]) + b"example.com" + bytes([1, 187]))
    >>> s.next_event()
    Greeting(methods=(0,))
    >>> s.next_event()
    ConnectRequest(host='example.com', port=443, address_type='domain')
    >>> s.reply(SUCCEEDED)
    b'\\x05\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00'
    """

    def __init__(self) -> None:
        self.state = GREETING
        self._buffer = bytearray()
        self._eof = False
        self._error: SocksError | None = None

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    @property
    def trailing_data(self) -> bytes:
        """Bytes the client sent after its request (the tunnel's first payload)."""
        return bytes(self._buffer) if self.state in (REPLYING, TUNNEL) else b""

    def receive_data(self, data: bytes) -> None:
        """Add bytes from the client; ``b""`` means the client closed its side.

        Raises:
            SocksError: more than ``MAX_BUFFERED`` bytes before the reply, or the
                machine already failed.
        """
        if self._error is not None:
            raise self._error
        if not data:
            self._eof = True
            return
        if len(self._buffer) + len(data) > MAX_BUFFERED:
            raise self.fail(f"more than {MAX_BUFFERED} bytes sent before the reply")
        self._buffer += data

    def next_event(self) -> Greeting | ConnectRequest | None:
        """The next complete message from the client, or ``None`` (feed more bytes).

        Returns ``None`` as well while a reply is owed, and in the tunnel.

        Raises:
            SocksError: the client's bytes break the protocol, or it closed
                mid-message. The only exception expected here.
        """
        if self._error is not None:
            raise self._error
        event: Greeting | ConnectRequest | None
        if self.state == GREETING:
            event, move = self._greeting(), "greeting"
        elif self.state == REQUEST:
            event, move = self._request(), "request"
        else:
            return None
        if event is None:
            if self._eof:
                raise self.fail(f"the client closed during the {self.state}")
            return None
        self._move(move)
        return event

    def reply(self, code: int) -> bytes:
        """The reply to the client's request; ``SUCCEEDED`` opens the tunnel.

        Raises:
            RuntimeError: no request is waiting for a reply (a bug in the caller).
        """
        self._move("reply-success" if code == SUCCEEDED else "reply-failure")
        return reply_bytes(code)

    def fail(
        self, reason: str, code: int = GENERAL_FAILURE, *, reply: bytes | None = None
    ) -> SocksError:
        """Enter ``ERROR`` for a reason the caller found (a deadline); returns the error to raise.

        The error's ``reply`` suits the stage the exchange was in, unless given.
        """
        if self._error is None:
            if reply is not None:
                self._error = SocksError(code, reason, reply)
            elif self.state == GREETING:
                self._error = SocksError(METHOD_REFUSED, reason, METHOD_NONE_ACCEPTABLE)
            elif self.state in (REQUEST, REPLYING):
                self._error = SocksError(code, reason, reply_bytes(code))
            else:
                self._error = SocksError(code, reason, b"")
            self.state = ERROR
            self._buffer.clear()
        return self._error

    def _move(self, move: str) -> None:
        nxt = _NEXT.get((self.state, move))
        if nxt is None:
            raise RuntimeError(f"SOCKS5: {move!r} is not legal in state {self.state!r}")
        self.state = nxt

    def _take(self, n: int) -> bytes:
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    def _greeting(self) -> Greeting | None:
        buf = self._buffer
        if len(buf) >= 1 and buf[0] == 4:
            # a SOCKS4/4a client reads an 8-byte reply: "request rejected" (0x5B) in
            # its own terms, not 05 FF it cannot decode
            raise self.fail("SOCKS4 is not supported; only SOCKS5", reply=SOCKS4_REJECTED)
        if len(buf) >= 1 and buf[0] != VERSION:
            raise self.fail(f"not a SOCKS5 greeting (version byte 0x{buf[0]:02x})")
        if len(buf) >= 2 and buf[1] == 0:
            raise self.fail("the greeting offers no authentication method")
        if len(buf) < 2 or len(buf) < 2 + buf[1]:
            return None
        methods = tuple(self._take(2 + buf[1])[2:])
        if METHOD_NONE not in methods:
            raise self.fail("the client does not offer 'no authentication' (0x00)")
        return Greeting(methods)

    def _request(self) -> ConnectRequest | None:
        buf = self._buffer
        if len(buf) >= 1 and buf[0] != VERSION:
            raise self.fail(f"not a SOCKS5 request (version byte 0x{buf[0]:02x})")
        if len(buf) >= 2 and buf[1] != CMD_CONNECT:
            name = {CMD_BIND: "BIND", CMD_UDP_ASSOCIATE: "UDP ASSOCIATE"}.get(buf[1])
            what = f"{name} is" if name else f"command 0x{buf[1]:02x} is"
            raise self.fail(f"{what} not supported; only CONNECT", COMMAND_NOT_SUPPORTED)
        if len(buf) >= 3 and buf[2] != 0:
            raise self.fail("the reserved byte of the request is not zero")
        if len(buf) < 4:
            return None
        atyp = buf[3]
        if atyp == ATYP_IPV4:
            size = 4 + 4 + 2
        elif atyp == ATYP_IPV6:
            size = 4 + 16 + 2
        elif atyp == ATYP_DOMAIN:
            if len(buf) < 5:
                return None
            if buf[4] == 0:
                raise self.fail("empty domain name")
            size = 5 + buf[4] + 2
        else:
            raise self.fail(
                f"address type 0x{atyp:02x} is not supported", ADDRESS_TYPE_NOT_SUPPORTED
            )
        if len(buf) < size:
            return None
        raw = self._take(size)
        port = int.from_bytes(raw[-2:], "big")
        if atyp == ATYP_IPV4:
            return ConnectRequest(str(ipaddress.IPv4Address(raw[4:8])), port, "ipv4")
        if atyp == ATYP_IPV6:
            return ConnectRequest(str(ipaddress.IPv6Address(raw[4:20])), port, "ipv6")
        return ConnectRequest(raw[5:-2].decode("utf-8", "surrogateescape"), port, "domain")
