"""The host's local routes, from an rtnetlink route dump: the addresses that reach it.

Rules:
- A route of type ``local`` (``RTN_LOCAL``) delivers to the host itself. A
  single-address one (/32, /128) counts from any table. A wider one (an address
  with a prefix on ``lo``, AnyIP: the whole prefix is local) counts only from
  the tables the host's own traffic uses, ``main`` and ``local``: a
  policy-routing table may hold ``local 0.0.0.0/0`` or ``local ::/0`` for a
  transparent proxy, which only marked packets take.
- ``parse_dump`` is pure (bytes in, text out) and tested by tables; ``read``
  is the one function that talks to the kernel.
- Both families come from one dump (``AF_UNSPEC``), so IPv4 and IPv6 follow the
  same rules.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

NLMSG_ERROR = 2
NLMSG_DONE = 3
RTM_NEWROUTE = 24
RTM_GETROUTE = 26
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
RTN_LOCAL = 2
RTA_DST = 1
RTA_TABLE = 15
RT_TABLE_MAIN = 254
RT_TABLE_LOCAL = 255

_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_RTMSG = struct.Struct("=BBBBBBBBI")  # struct rtmsg
_ATTR = struct.Struct("=HH")  # struct rtattr


def _align(n: int) -> int:
    return (n + 3) & ~3


def dump_request(seq: int = 1) -> bytes:
    """An ``RTM_GETROUTE`` dump request for every table of both families."""
    body = _RTMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0, 0)
    header = _HEADER.pack(
        _HEADER.size + len(body), RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP, seq, 0
    )
    return header + body


def parse_dump(data: bytes) -> tuple[list[str], bool]:
    """The local routes in one read of the dump, and whether the dump ended there.

    Each route is ``ADDRESS`` (one address) or ``ADDRESS/PREFIX``. A kernel error
    message raises ``OSError``; a message cut short raises ``ValueError``.
    """
    out: list[str] = []
    offset = 0
    while offset < len(data):
        if offset + _HEADER.size > len(data):
            raise ValueError("netlink message header cut short")
        length, kind, _flags, _seq, _pid = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size or offset + length > len(data):
            raise ValueError(f"netlink message of {length} bytes does not fit its read")
        body = data[offset + _HEADER.size : offset + length]
        if kind == NLMSG_DONE:
            return out, True
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", body)
            raise OSError(-code, "rtnetlink route dump refused")
        if kind == RTM_NEWROUTE:
            route = _local_route(body)
            if route is not None:
                out.append(route)
        offset += _align(length)
    return out, False


def _local_route(body: bytes) -> str | None:
    if len(body) < _RTMSG.size:
        raise ValueError("rtmsg cut short")
    family, dst_len, _src, _tos, table, _proto, _scope, kind, _flags = _RTMSG.unpack_from(body)
    if kind != RTN_LOCAL or family not in (socket.AF_INET, socket.AF_INET6):
        return None
    width = 32 if family == socket.AF_INET else 128
    dst = bytes(width // 8)  # no RTA_DST: the default route, 0.0.0.0/0 or ::/0
    offset = _align(_RTMSG.size)
    while offset + _ATTR.size <= len(body):
        size, attr = _ATTR.unpack_from(body, offset)
        if size < _ATTR.size or offset + size > len(body):
            raise ValueError(f"route attribute of {size} bytes does not fit its message")
        value = body[offset + _ATTR.size : offset + size]
        if attr == RTA_DST:
            dst = value
        elif attr == RTA_TABLE and len(value) == 4:
            (table,) = struct.unpack("=I", value)  # the full id: rtm_table holds 8 bits
        offset += _align(size)
    if len(dst) != width // 8 or dst_len > width:
        raise ValueError(f"route destination of {len(dst)} bytes, prefix {dst_len}")
    address = str(ipaddress.ip_address(dst))
    if dst_len == width:
        return address
    if table in (RT_TABLE_MAIN, RT_TABLE_LOCAL):
        return f"{address}/{dst_len}"
    return None


def read() -> list[str]:
    """The host's local routes, both families, from a dump of every routing table.

    Raises ``OSError`` when the kernel refuses the dump or the socket.
    """
    out: list[str] = []
    with socket.socket(
        socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE
    ) as s:
        s.sendall(dump_request())
        done = False
        while not done:
            routes, done = parse_dump(s.recv(1 << 16))
            out += routes
    return list(dict.fromkeys(out))
