"""Transparent egress: the connections, DNS queries and refused datagrams the sandbox's
ruleset (``policy.transparent``) diverts to sandhold's sockets in its namespace.

Rules (issue 20):
- A diverted connection's target is its original destination
  (``SO_ORIGINAL_DST`` / ``IP6T_SO_ORIGINAL_DST``), read from the accepted
  socket, never from anything the client sends. An address of the synthetic
  blocks stands for the one name the DNS stub gave it out for; one it never
  gave out is refused. Any other address is an IP literal, decided by the
  policy's IP entries as the proxies decide it.
- Before anything is dialled the client's first bytes are read (at most
  ``first_timeout`` seconds; a protocol where the server speaks first waits
  that long once): a TLS ClientHello's SNI, or a plain HTTP request's ``Host``,
  must name the same host as the synthetic address, else the connection is
  refused (``rule: transparent: SNI/Host differs``); a ClientHello that is not
  whole in the first TLS record is refused too (its SNI could hide in the
  next), and so is a request line naming another host (an absolute URI, or
  CONNECT: the server could be a proxy). Only the first request or
  ClientHello is checked: later requests on a kept-alive connection reach the
  same server, as a CONNECT tunnel's do.
- Then the same ``outbound.Dialer`` as the proxies decides and dials the name
  (resolved on the host, then the resolved-address guard), with one
  ``EgressDecision`` (``proxy="transparent"``) per connection. A connection
  through the explicit proxies never comes here (loopback is not diverted), so
  nothing is counted twice.
- A refusal is answered in the client's protocol: HTTP → 403 naming the rule;
  TLS → a fatal ``access_denied`` alert; anything else → a reset. A dial that
  fails is a reset.
- DNS (UDP and TCP, every address): ``dns.DnsStub`` answers; a refused name is
  a violation (``proxy="dns"``). A refused datagram (the ruleset drops it, the
  sender sees ``EPERM``) is read from NFLOG and is a violation
  (``proxy="udp"``). Those two kinds cost the sandbox next to nothing, so at
  most ``REPORTS_PER_SECOND`` of them are reported a second (the rest are
  refused all the same, and counted in a log line). Every read is bounded;
  TCP DNS connections have a deadline.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time

from sandhold._throttle import Throttle
from sandhold.net._conn import RECV_SIZE, answer_and_close, peer_of
from sandhold.net.errors import DialFailed, Refused
from sandhold.net.relay import abort
from sandhold.policy.domains import Decision, canonical_host
from sandhold.policy.transparent import TRANSPARENT, UDP, is_synthetic

TYPE_CHECKING = False  # typing costs start-up time; mypy honours this name
if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from sandhold.net._conn import Limits
    from sandhold.net.outbound import DecisionSink, Dialer
    from sandhold.net.relay import Relayer
    from sandhold.policy.domains import DomainPolicy
    from sandhold.policy.transparent import SyntheticNames

log = logging.getLogger("sandhold.net")

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h; IP6T_SO_ORIGINAL_DST has the same number
FIRST_TIMEOUT = 0.25
_TLS_HANDSHAKE = 22
_ACCESS_DENIED_ALERT = bytes((21, 3, 3, 0, 2, 2, 49))  # fatal access_denied (RFC 8446 §6)
_HTTP_METHODS = (
    b"GET ",
    b"POST ",
    b"PUT ",
    b"HEAD ",
    b"DELETE ",
    b"OPTIONS ",
    b"PATCH ",
    b"TRACE ",
    b"CONNECT ",
)
MISMATCH_RULE = "transparent: SNI/Host differs"
UNKNOWN_RULE = "transparent: unknown synthetic address"
SPLIT_RULE = "transparent: ClientHello not whole"
UDP_RULE = "transparent: UDP other than DNS"
DNS_RULE_PREFIX = "dns: "


def original_destination(conn: socket.socket) -> tuple[str, int]:
    """Where a diverted connection was going: (address, port).

    Raises:
        OSError: the socket was not diverted (no conntrack entry) or is gone.
    """
    if conn.family == socket.AF_INET6:
        raw = conn.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
        port = struct.unpack_from("!H", raw, 2)[0]
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), port
    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port = struct.unpack_from("!H", raw, 2)[0]
    return socket.inet_ntop(socket.AF_INET, raw[4:8]), port


def _own_address(conn: socket.socket) -> tuple[str, int]:
    try:
        local = conn.getsockname()
    except OSError:
        return ("", 0)
    return (str(local[0]), int(local[1]))


# -- sniffing the first bytes (sans-I/O) -------------------------------------------


def tls_record_complete(data: bytes) -> bool:
    """Whether ``data`` holds a whole first TLS record (or cannot be one)."""
    if len(data) < 5 or data[0] != _TLS_HANDSHAKE:
        return len(data) >= 5 or (bool(data) and data[0] != _TLS_HANDSHAKE)
    length: int = struct.unpack_from("!H", data, 3)[0]
    return len(data) >= 5 + length


def tls_server_name(data: bytes) -> str | None:
    """The SNI of a ClientHello at the start of ``data``; None if there is none.

    Bounded by ``data``; any malformed input is None (the connection then goes
    by its address alone, which is what a client with no SNI gets too).
    """
    try:
        if data[0] != _TLS_HANDSHAKE or data[5] != 1:
            return None
        end = min(len(data), 5 + struct.unpack_from("!H", data, 3)[0])
        pos = 5 + 4 + 2 + 32  # record header, handshake header, version, random
        pos += 1 + data[pos]  # session id
        pos += 2 + struct.unpack_from("!H", data, pos)[0]  # cipher suites
        pos += 1 + data[pos]  # compression methods
        ext_end = min(end, pos + 2 + struct.unpack_from("!H", data, pos)[0])
        pos += 2
        while pos + 4 <= ext_end:
            kind, length = struct.unpack_from("!HH", data, pos)
            pos += 4
            if kind == 0 and pos + 5 <= ext_end:
                if data[pos + 2] != 0:
                    return None
                size = struct.unpack_from("!H", data, pos + 3)[0]
                name = data[pos + 5 : pos + 5 + size]
                return name.decode("ascii") if len(name) == size else None
            pos += length
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return None


def tls_hello_whole(data: bytes) -> bool:
    """Whether the first TLS record holds a whole ClientHello.

    A ClientHello split over records (legal, and a way to hide its SNI from a
    check of the first record) or cut short is not whole.
    """
    if len(data) < 9 or data[0] != _TLS_HANDSHAKE or data[5] != 1:
        return False
    record: int = struct.unpack_from("!H", data, 3)[0]
    hello = int.from_bytes(data[6:9], "big")
    return len(data) >= 5 + record and 4 + hello <= record


def is_tls(data: bytes) -> bool:
    return len(data) >= 3 and data[0] == _TLS_HANDSHAKE and data[1] == 3


def is_http(data: bytes) -> bool:
    return data.startswith(_HTTP_METHODS)


def _strip_port(authority: str) -> str:
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    return authority.rpartition(":")[0] if authority.count(":") == 1 else authority


def http_host(data: bytes) -> str | None:
    """The ``Host`` of a plain HTTP request head at the start of ``data`` (None: none)."""
    head = data.partition(b"\r\n\r\n")[0]
    for line in head.split(b"\r\n")[1:64]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"host":
            return _strip_port(value.strip().decode("latin-1"))
    return None


def http_target_host(data: bytes) -> str | None:
    """The host a request line names itself: an absolute URI's, or CONNECT's (None: none).

    A server that is also a proxy would go where these say, whatever ``Host`` says.
    """
    line = data.partition(b"\r\n")[0].decode("latin-1")
    method, _, rest = line.partition(" ")
    target = rest.partition(" ")[0]
    if method == "CONNECT":
        return _strip_port(target)
    scheme, sep, after = target.partition("://")
    if sep and scheme.lower() in ("http", "https", "ws", "wss"):
        authority = after.partition("/")[0].partition("?")[0].rpartition("@")[2]
        return _strip_port(authority)
    return None


def _same_host(claimed: str, name: str) -> bool:
    try:
        return canonical_host(claimed) == name
    except ValueError:
        return False


def _refusal_answer(first: bytes, decision: Decision) -> bytes | None:
    """What a refused client is told (None: a reset)."""
    if is_tls(first):
        return _ACCESS_DENIED_ALERT
    if is_http(first):
        from sandhold.net.httphead import render_answer
        from sandhold.net.outbound import target_text

        target = target_text(decision.host, decision.port)
        body = (
            f"sandhold: the sandbox network policy refused the connection to {target}.\n"
            f"rule: {decision.rule}\nreason: {decision.reason}\n"
            "setting: network.allowedDomains / deniedDomains"
        )
        header = f"blocked-by-sandbox-policy; host={target}; rule={decision.rule}"
        return render_answer(403, body, [("X-Proxy-Error", header)])
    return None


# -- one diverted connection -------------------------------------------------------


async def _first_bytes(
    loop: asyncio.AbstractEventLoop, conn: socket.socket, limits: Limits, first_timeout: float
) -> bytes:
    """What the client sends first: a whole TLS record or HTTP head if it starts as one."""
    data = b""
    try:
        async with asyncio.timeout(first_timeout):
            data = await loop.sock_recv(conn, RECV_SIZE)
    except TimeoutError:
        return b""  # the server speaks first (SSH servers, SMTP, databases)
    if not data:
        return b""
    try:
        async with asyncio.timeout(limits.head_timeout):
            while len(data) < limits.max_head_bytes:
                if is_tls(data) and tls_record_complete(data):
                    break
                if is_http(data) and b"\r\n\r\n" in data:
                    break
                if not (is_tls(data) or is_http(data) or data[:1] == b"\x16"):
                    break
                more = await loop.sock_recv(conn, RECV_SIZE)
                if not more:
                    break
                data += more
    except TimeoutError:
        pass  # what arrived is checked as it is
    return data


async def serve_transparent_client(
    conn: socket.socket,
    dialer: Dialer,
    relayer: Relayer,
    limits: Limits,
    *,
    names: SyntheticNames,
    first_timeout: float = FIRST_TIMEOUT,
    destinations: dict[tuple[str, int], tuple[str, int]] | None = None,
) -> None:
    """Serve one diverted connection to its end (module rules); owns ``conn``.

    Never raises for anything the client or the target does. ``destinations``,
    if given, maps the client's address to its original destination while the
    connection is decided (so a decision's sink can find the sandbox's socket).

    Cancellation: both sockets are aborted (RST) and ``CancelledError`` re-raised.
    """
    loop = asyncio.get_running_loop()
    client: socket.socket | None = conn
    upstream: socket.socket | None = None
    peer = peer_of(conn)
    first = b""
    try:
        try:
            address, port = original_destination(conn)
        except OSError:
            return  # no conntrack entry: nothing to serve
        if (address, port) == _own_address(conn):
            return  # a direct connection to the listener itself, not a diverted one
        if destinations is not None and peer[1]:
            destinations[peer] = (address, port)
        first = await _first_bytes(loop, conn, limits, first_timeout)
        refusal: Decision | None = None
        host = address
        if is_synthetic(address):
            name = names.name_of(address)
            if name is None:
                refusal = Decision(
                    False,
                    address,
                    port,
                    UNKNOWN_RULE,
                    f"{address} was never handed out by the sandbox's DNS stub",
                    "invalid",
                )
            else:
                host = name
                if is_tls(first) and not tls_hello_whole(first):
                    refusal = Decision(
                        False,
                        name,
                        port,
                        SPLIT_RULE,
                        f"the connection to {name} sent a ClientHello that is not whole in"
                        " its first TLS record, so its SNI cannot be checked",
                        "invalid",
                    )
                claims = [tls_server_name(first)] if is_tls(first) else []
                if is_http(first):
                    claims += [http_target_host(first), http_host(first)]
                claimed = next(
                    (c for c in claims if c is not None and not _same_host(c, name)), None
                )
                if refusal is None and claimed is not None:
                    refusal = Decision(
                        False,
                        name,
                        port,
                        MISMATCH_RULE,
                        f"the connection to {name} names {claimed[:253]!r}"
                        " in its TLS SNI or HTTP Host",
                        "invalid",
                    )
        if refusal is not None:
            dialer.report(refusal, TRANSPARENT, client=peer)
            raise Refused(refusal)
        upstream = await dialer.dial(host, port, TRANSPARENT, client=peer)
        client, pair = None, upstream
        upstream = None
        result = await relayer.relay(conn, pair, first_a_to_b=first)
        if result.error is not None:
            log.debug("transparent: %s:%s cut: %s", host, port, result.error)
    except Refused as exc:
        answer = _refusal_answer(first, exc.decision)
        if answer is not None:
            client = None
            await answer_and_close(conn, answer, limits.answer_timeout)
    except DialFailed as exc:
        log.debug("transparent: %s", exc)
    finally:
        if destinations is not None:
            destinations.pop(peer, None)
        if upstream is not None:
            abort(upstream)
        if client is not None:
            abort(client)


# -- DNS and refused datagrams ------------------------------------------------------

_NFULNL_MSG_PACKET = 4 << 8  # NFNL_SUBSYS_ULOG, NFULNL_MSG_PACKET
_NFULA_PAYLOAD = 9
_MAX_DNS_TCP = 64  # queries per TCP DNS connection
REPORTS_PER_SECOND = 100
_DNS_TCP_TIMEOUT = 10.0


def refused_datagrams(message: bytes) -> list[tuple[str, int, str, int]]:
    """(source, source port, destination, port) of each packet in an NFLOG netlink read.

    Bounded by the message; malformed parts are skipped.
    """
    out: list[tuple[str, int, str, int]] = []
    pos = 0
    while pos + 16 <= len(message) and len(out) < 1024:
        length, kind = struct.unpack_from("=IH", message, pos)
        if length < 16 or pos + length > len(message):
            break
        if kind == _NFULNL_MSG_PACKET:
            attr = pos + 16 + 4  # nlmsghdr, nfgenmsg
            while attr + 4 <= pos + length:
                alen, atype = struct.unpack_from("=HH", message, attr)
                if alen < 4:
                    break
                if atype & 0x7FFF == _NFULA_PAYLOAD:
                    found = _packet_addresses(message[attr + 4 : attr + alen])
                    if found is not None:
                        out.append(found)
                attr += (alen + 3) & ~3
        pos += (length + 3) & ~3
    return out


def _packet_addresses(packet: bytes) -> tuple[str, int, str, int] | None:
    try:
        version = packet[0] >> 4
        if version == 4:
            ihl = (packet[0] & 0xF) * 4
            src = socket.inet_ntop(socket.AF_INET, packet[12:16])
            dst = socket.inet_ntop(socket.AF_INET, packet[16:20])
            l4, proto = ihl, packet[9]
        elif version == 6:
            src = socket.inet_ntop(socket.AF_INET6, packet[8:24])
            dst = socket.inet_ntop(socket.AF_INET6, packet[24:40])
            l4, proto = 40, packet[6]
        else:
            return None
        if proto in (6, 17, 132, 136):  # TCP, UDP, SCTP, UDP-Lite: ports
            sport, dport = struct.unpack_from("!HH", packet, l4)
            return src, sport, dst, dport
        return src, 0, dst, 0
    except (IndexError, struct.error, ValueError):
        return None


class TransparentEgress:
    """The DNS stub and the refused-datagram log of one session (module rules).

    The diverted TCP listeners are served by the session's ``EgressSession``
    (``listeners``), so they share its budget, its caps and its fail-closed end.

    Args:
        dns_udp: the stub's datagram sockets (bound in the sandbox's namespace).
        dns_tcp: the stub's TCP listeners.
        nflog: the NFLOG socket of refused datagrams.
        policy: called per query / connection for the session's ``DomainPolicy``.
        on_decision: gets an ``EgressDecision`` for every refused name and datagram.
        names: the session's ``SyntheticNames`` (shared with ``listeners``).
        destinations: passed to ``serve_transparent_client``.

    Cancellation: ``aclose`` stops reading and closes every socket before its
    first ``await``, then waits for the TCP DNS connections it cancelled.
    """

    def __init__(
        self,
        *,
        tcp: Sequence[socket.socket],
        dns_udp: Sequence[socket.socket],
        dns_tcp: Sequence[socket.socket],
        nflog: socket.socket,
        policy: Callable[[], DomainPolicy],
        on_decision: DecisionSink | None,
        names: SyntheticNames,
        destinations: dict[tuple[str, int], tuple[str, int]] | None = None,
    ) -> None:
        from sandhold.net.dns import DnsStub

        self._destinations = destinations
        self._tcp = tuple(tcp)
        self._udp = tuple(dns_udp)
        self._dns_tcp = tuple(dns_tcp)
        self._nflog = nflog
        self._on_decision = on_decision
        self.names = names
        self.stub = DnsStub(policy, names, self._refused_name)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._reports: set[asyncio.Future[object]] = set()
        self._lost = Throttle()  # a flood of datagrams can overrun the log's buffer
        self._unreported = Throttle()
        self._window = float("-inf")
        self._reported = 0
        self._closed = False

    def listeners(
        self,
    ) -> list[
        tuple[socket.socket, Callable[[socket.socket, Dialer, Relayer, Limits], Awaitable[None]]]
    ]:
        """The diverted-TCP listeners and their handler, for ``EgressSession``."""
        import functools

        handler = functools.partial(
            serve_transparent_client, names=self.names, destinations=self._destinations
        )
        return [(sock, handler) for sock in self._tcp]

    def sockets(self) -> tuple[socket.socket, ...]:
        """Every socket this owns or hands to the session (to watch, or to cut)."""
        return (*self._tcp, *self._udp, *self._dns_tcp, self._nflog)

    def start(self) -> None:
        """Start answering DNS and reading refusals; call it in the running loop."""
        loop = self._loop = asyncio.get_running_loop()
        for sock in (*self._udp, *self._dns_tcp, self._nflog):
            sock.setblocking(False)
        for sock in self._udp:
            loop.add_reader(sock.fileno(), self._on_datagram, sock)
        for sock in self._dns_tcp:
            loop.add_reader(sock.fileno(), self._on_dns_connection, sock)
        loop.add_reader(self._nflog.fileno(), self._on_nflog)

    async def aclose(self) -> None:
        """Stop, close every socket, end the TCP DNS connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        loop = self._loop
        for sock in (*self._udp, *self._dns_tcp, self._nflog):
            if sock.fileno() >= 0:
                if loop is not None and not loop.is_closed():
                    loop.remove_reader(sock.fileno())
                sock.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _report(self, decision: Decision, proxy: str, client: tuple[str, int]) -> None:
        if self._on_decision is None:
            return
        from sandhold.net.outbound import ACTION, EgressDecision, target_text

        record = EgressDecision(
            ACTION,
            target_text(decision.host, decision.port),
            False,
            decision.rule,
            decision.reason,
            proxy,
            client,
        )
        try:
            pending = self._on_decision(record)
        except Exception:  # reporting cannot change a refusal
            log.exception("transparent: on_decision failed (the refusal stands)")
            return
        if pending is not None and hasattr(pending, "__await__"):
            # a look at the sender (the port's attribution): it runs on its own, and
            # nothing waits for it, since the datagram or the answer is already gone
            task = asyncio.ensure_future(pending)
            self._reports.add(task)
            task.add_done_callback(self._reports.discard)

    def _may_report(self) -> bool:
        """At most ``REPORTS_PER_SECOND`` datagram and name refusals are reported: a
        ``sendto`` costs the sandbox nearly nothing, a report costs the host (the
        port attributes each one). The rest are counted in a log line."""
        now = time.monotonic()
        if now - self._window >= 1.0:
            self._window, self._reported = now, 0
        if self._reported < REPORTS_PER_SECOND:
            self._reported += 1
            return True
        held = self._unreported.take()
        if held is not None:
            more = f" ({held} more since the last such line)" if held else ""
            log.warning(
                "transparent: over %d refusals a second; the rest are refused unreported%s",
                REPORTS_PER_SECOND,
                more,
            )
        return False

    def _refused_name(self, decision: Decision) -> None:
        if not self._may_report():
            return
        rule = DNS_RULE_PREFIX + decision.rule
        self._report(
            Decision(False, decision.host, 53, rule, decision.reason, decision.kind), "dns", ("", 0)
        )

    def _on_datagram(self, sock: socket.socket) -> None:
        for _ in range(64):
            try:
                data, peer = sock.recvfrom(4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # e.g. an ICMP error queued on the socket: nothing to answer
            reply = self.stub.respond(data)
            if reply is not None:
                try:
                    sock.sendto(reply, peer)
                except OSError:
                    pass  # the asker is gone or its buffer is full: DNS retries

    def _on_dns_connection(self, listener: socket.socket) -> None:
        assert self._loop is not None
        for _ in range(64):
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue
            if len(self._tasks) >= 256:
                abort(conn)  # bounded: a flood of TCP DNS costs the flooder only
                continue
            conn.setblocking(False)
            task = self._loop.create_task(self._serve_dns_tcp(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve_dns_tcp(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(_DNS_TCP_TIMEOUT):
                buf = b""
                for _ in range(_MAX_DNS_TCP):
                    while len(buf) < 2 or len(buf) < 2 + struct.unpack_from("!H", buf)[0]:
                        data = await loop.sock_recv(conn, RECV_SIZE)
                        if not data:
                            return
                        buf += data
                    size = struct.unpack_from("!H", buf)[0]
                    message, buf = buf[2 : 2 + size], buf[2 + size :]
                    reply = self.stub.respond(message)
                    if reply is None:
                        return
                    await loop.sock_sendall(conn, struct.pack("!H", len(reply)) + reply)
        except (TimeoutError, OSError):
            pass  # the asker is slow or gone
        finally:
            conn.close()

    def _on_nflog(self) -> None:
        for _ in range(64):
            try:
                message = self._nflog.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # ENOBUFS: refusals were dropped from the log
                held = self._lost.take()
                if held is not None:
                    more = f" ({held} more since the last such line)" if held else ""
                    log.warning(
                        "transparent: refused datagrams were not all reported (%s)%s", exc, more
                    )
                continue
            for src, sport, dst, dport in refused_datagrams(message):
                if not self._may_report():
                    continue
                self._report(
                    Decision(
                        False,
                        dst,
                        dport,
                        UDP_RULE,
                        "the sandbox may send datagrams only to its DNS stub"
                        " (QUIC falls back to TCP)",
                        "unlisted",
                    ),
                    UDP,
                    (src, sport),
                )
