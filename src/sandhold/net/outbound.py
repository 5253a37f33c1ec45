"""Carry out the domain policy for one outbound connection: decide, resolve, guard, dial, report.

Rules:
- For every connection, in this order: ``decide`` (which canonicalises the
  host) → resolve the canonical name (an IP literal is not resolved) →
  ``guard_addresses`` on every resolved address → dial those checked addresses,
  in order, until one answers. The client's text is never resolved or dialled,
  and an address is dialled in the spelling the guard checked.
- The policy callable is called once per connection, so a new config applies
  from the next connection. If it raises, the connection is refused (fails
  closed) with the rule ``"policy unavailable"``.
- Exactly one ``EgressDecision`` per connection that reached ``decide`` goes to
  ``on_decision``, before the client is answered: the refusal, or the allowance.
  A later dial failure does not change it (it is not a policy decision). A
  callback that raises is logged; it cannot change the outcome. A callback may
  return an awaitable for a refusal (a look at the client that must not block
  the loop): ``dial`` answers the refusal once it is done, or after
  ``report_wait`` seconds, and never cancels it.
- Nothing here decides: every refusal is ``decide``'s or ``guard_addresses``'
  own ``Decision``, passed on unchanged.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import socket
import sys

from sandhold._record import record
from sandhold.net.errors import DialFailed, Refused
from sandhold.policy.domains import (
    ALLOWED,
    UNAVAILABLE,
    UNLISTED,
    Decision,
    decide,
    guard_addresses,
    guard_canonical_name,
)

TYPE_CHECKING = False  # typing costs start-up time; mypy honours this name
if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence
    from concurrent.futures import ThreadPoolExecutor
    from typing import Any, TypeAlias

    from sandhold.policy.domains import DomainPolicy

    Resolver: TypeAlias = Callable[[str, int], Awaitable[Sequence[str]]]
    _GetAddrInfo: TypeAlias = Callable[..., Awaitable[list[tuple[Any, ...]]]]
    DecisionSink: TypeAlias = Callable[["EgressDecision"], Awaitable[object] | None]
    # asked about a target no list decides: True allows it (``Dialer``'s ``ask``)
    Asker: TypeAlias = Callable[[Decision], Awaitable[bool]]

log = logging.getLogger("sandhold.net")

ACTION = "network-outbound"

_DIAL_KINDS = {
    errno.ECONNREFUSED: "refused",
    errno.EHOSTUNREACH: "unreachable",
    errno.ENETUNREACH: "network",
    errno.EADDRNOTAVAIL: "network",
    errno.EAFNOSUPPORT: "network",
}


@record
class EgressDecision:
    """One connection's verdict, for events and violation logs (F-NET-4).

    ``action`` is always ``"network-outbound"``; ``target`` is ``host:port`` with
    the canonical host (IPv6 in brackets); ``rule`` and ``reason`` come from the
    domain policy; ``proxy`` is ``"http"`` or ``"socks5"``; ``client`` is the
    address (host, port) of the sandbox-side connection the decision is about,
    so a caller can tell which process made it.
    """

    action: str
    target: str
    allowed: bool
    rule: str
    reason: str
    proxy: str
    client: tuple[str, int] = ("", 0)
    kind: str = ""  # the domain policy's ``Decision.kind``: what code branches on


def target_text(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Resolved(list[str]):
    """A resolver's addresses for one name, in order, and the name it answered for
    (``canonical``: a CNAME's target, an ``/etc/hosts`` alias's first name; "" when
    unknown). The dialer checks that name against the deny rules too."""

    canonical: str = ""


async def system_resolver(
    host: str, port: int, *, getaddrinfo: _GetAddrInfo | None = None
) -> Resolved:
    """The host's resolver (``getaddrinfo``): every TCP address of ``host``, in order.

    ``getaddrinfo`` is the loop's by default (its default executor); a
    ``LookupThreads`` resolver passes its own.

    The policy decided ``host``: when the resolver's search list turned it into
    another name (``secret`` answered as ``secret.corp.example``), ``host.`` is asked
    again as an absolute name, and the name is refused if that fails. Whatever
    other name answers (a CNAME, an alias) is in ``canonical`` for the deny rules.

    Raises:
        OSError: the name does not resolve, or only through the search list.
    """
    lookup = getaddrinfo or asyncio.get_running_loop().getaddrinfo
    kind = {"type": socket.SOCK_STREAM, "proto": socket.IPPROTO_TCP}
    infos = await lookup(host, port, flags=socket.AI_CANONNAME, **kind)
    canonical = _canonical_name(infos)
    if canonical.startswith(host.lower() + ".") and canonical[len(host) + 1 :] in (
        search_domains()
    ):
        try:
            infos = await lookup(host + ".", port, flags=socket.AI_CANONNAME, **kind)
        except socket.gaierror as exc:
            raise OSError(
                f"{host} resolves only as {canonical}, through the resolver's search list"
            ) from exc
        canonical = _canonical_name(infos)
    out = Resolved(dict.fromkeys(str(info[4][0]) for info in infos))
    out.canonical = canonical
    return out


class LookupThreads:
    """Threads for the name lookups of many sessions, of which one session may use only a few.

    ``getaddrinfo`` blocks a thread until the host's resolver answers or gives up
    (seconds, or longer for a name whose DNS server never answers), and a lookup
    that timed out for its connection keeps its thread. With one pool for every
    session, one sandbox asking for such names would hold every thread and the
    others' lookups would time out. So each session's resolver (``resolver()``)
    has at most ``per_session`` lookups in the threads at once, counted until the
    thread is free again, not until its caller gave up; more wait their turn
    (within the dialer's resolve timeout). ``threads`` is a multiple of it.

    Args:
        threads: threads in all (made as needed).
        per_session: lookups one session may have in them at once.

    Cancellation: a cancelled lookup still holds its session's turn until its
    thread returns.
    """

    # 512: made as needed, so 128 sandboxes can each hold their 4 threads with names
    # whose DNS never answers before another's lookup has to wait (review: with 32,
    # eight sandboxes could starve every other)
    def __init__(self, threads: int = 512, per_session: int = 4) -> None:
        if not 0 < per_session < threads:
            raise ValueError("LookupThreads: need 0 < per_session < threads")
        self.threads = threads
        self.per_session = per_session
        self._pool: ThreadPoolExecutor | None = None

    def resolver(self) -> Resolver:
        """A new session's resolver (``system_resolver`` on these threads)."""
        import functools

        turns = _Turns(self, self.per_session)
        return functools.partial(system_resolver, getaddrinfo=turns.getaddrinfo)

    def close(self) -> None:
        """Let the threads end once their lookups return; new lookups fail. Idempotent."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="sandhold-dns")
        return self._pool


class _Turns:
    """One session's lookups in the shared threads: at most ``limit`` at once."""

    def __init__(self, threads: LookupThreads, limit: int) -> None:
        self.threads = threads
        self.free = asyncio.Semaphore(limit)

    async def getaddrinfo(self, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        await self.free.acquire()
        loop = asyncio.get_running_loop()
        try:
            # socket.getaddrinfo read at call time: a test may stand in for the DNS
            job = self.threads._executor().submit(socket.getaddrinfo, *args, **kwargs)
        except BaseException:
            self.free.release()
            raise

        def returned(_: object) -> None:
            try:
                loop.call_soon_threadsafe(self.free.release)
            except RuntimeError:
                pass  # the loop is closed: nobody is left to take a turn

        job.add_done_callback(returned)
        return await asyncio.wrap_future(job)


def _canonical_name(infos: Sequence[tuple[object, ...]]) -> str:
    return next((str(info[3]) for info in infos if info[3]), "").rstrip(".").lower()


def search_domains(path: str = "/etc/resolv.conf") -> tuple[str, ...]:
    """The resolver's search list as glibc reads it: ``LOCALDOMAIN``, else the last
    ``search`` or ``domain`` line of ``path``. Lower case, no trailing dots.

    Raises:
        OSError: ``path`` exists but cannot be read (out of fds, say): the caller
            cannot tell a search-list answer, so it must refuse, not guess none.
    """
    import os

    names: list[str] = []
    local = os.environ.get("LOCALDOMAIN")
    if local is not None:
        names = local.split()
    else:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    words = line.split()
                    if words and words[0] in ("search", "domain"):
                        names = words[1:]
        except FileNotFoundError:
            pass  # no resolv.conf: glibc has no search list either
    return tuple(n.rstrip(".").lower() for n in names if n.strip("."))


def discover_host_addresses() -> tuple[str, ...]:
    """The host's own IP addresses, for the resolved-address guard.

    Linux: every local route of the routing tables (``local_routes``: a wide one,
    ``ADDRESS/PREFIX``, from the main and local tables only) and every address in
    ``/proc/net/if_inet6`` (no DNS, no subprocess). Elsewhere: the source
    addresses the host would use for the Internet, found by connecting UDP
    sockets (which sends nothing).
    Loopback and link-local are guarded whatever this returns.
    """
    found: list[str] = []
    if sys.platform.startswith("linux"):
        found += _local_routes()
        found += _inet6_addresses()
    if not found:
        for family, probe in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
            try:
                with socket.socket(family, socket.SOCK_DGRAM) as s:
                    s.connect((probe, 9))
                    found.append(str(s.getsockname()[0]))
            except OSError:
                pass  # no route for this family: no address to add
    return tuple(dict.fromkeys(found))


def _local_routes() -> list[str]:
    from sandhold.net import local_routes

    try:
        return local_routes.read()
    except (OSError, ValueError):
        return []


def _inet6_addresses() -> list[str]:
    from sandhold.backends.linux import procfs

    return [str(ipaddress.IPv6Address(int(a, 16))) for a in procfs.inet6_addresses()]


def _spelling(address: str) -> str:
    """The spelling of a resolved address that the guard checks and the dialer dials.

    Brackets and a zone id are dropped; IPv4-mapped IPv6 becomes IPv4. Text
    that is not an address comes back unchanged, and the guard refuses it.
    """
    text = address.strip("[]").partition("%")[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class Dialer:
    """Opens allowed outbound connections for one session's proxies (rules in the module doc).

    Args:
        policy: called once per connection for the session's current policy.
        resolver: ``await resolver(host, port)`` → addresses (text).
        host_addresses: the host's own addresses, refused by the guard: a list, or a
            function called for each connection (addresses come and go: a VPN, a
            container bridge, a new DHCP lease).
        on_decision: receives one ``EgressDecision`` per connection.
        resolve_timeout: seconds for the resolver.
        connect_timeout: seconds for dialling all of a target's addresses.
        report_wait: seconds a refusal waits for what ``on_decision`` returned.
        ask: for a target that no list decides (an ``unlisted`` refusal), awaited
            with that refusal before anything is reported; ``True`` allows the
            connection (rule ``asked``), anything else (``False``, an exception)
            keeps the refusal. Deny lists, the baseline and the address guard are
            never asked. ``None``: unlisted targets are refused at once.
    """

    def __init__(
        self,
        policy: Callable[[], DomainPolicy],
        resolver: Resolver,
        host_addresses: Sequence[str] | Callable[[], Sequence[str]],
        on_decision: DecisionSink | None,
        *,
        resolve_timeout: float,
        connect_timeout: float,
        report_wait: float = 2.0,
        ask: Asker | None = None,
    ) -> None:
        self._policy = policy
        self._ask = ask
        self._resolver = resolver
        if callable(host_addresses):
            self._host_addresses = host_addresses
        else:
            fixed = tuple(host_addresses)
            self._host_addresses = lambda: fixed
        # every address ever seen stays guarded: a read that fails (out of fds) or
        # misses one must not unguard it
        self._seen: tuple[str, ...] = tuple(self._host_addresses())
        self._on_decision = on_decision
        self._resolve_timeout = resolve_timeout
        self._connect_timeout = connect_timeout
        self._report_wait = report_wait

    async def dial(
        self, host: str, port: int, proxy: str, *, client: tuple[str, int] = ("", 0)
    ) -> socket.socket:
        """A connected, non-blocking socket to ``host:port`` if the policy allows it.

        Args:
            host: the host as the client wrote it (any spelling).
            port: the port the client asked for.
            proxy: ``"http"`` or ``"socks5"``, for the decision record.

        Raises:
            Refused: the policy or the address guard refused the connection.
            DialFailed: allowed, but it did not resolve or no address answered.

        Cancellation: a socket being dialled is closed; nothing is reported
        beyond the decision already made.
        """
        policy, decision, pending = await self._decide_asking(host, port, proxy, client)
        if policy is None or not decision.allowed:
            await self._settle(pending)
            raise Refused(decision)
        target = target_text(decision.host, decision.port)
        try:
            addresses, canonical = await self._resolve(decision, target)
        except DialFailed:
            self._report(decision, proxy, client)
            raise
        # read after resolving: as current as it can be
        self._seen = tuple(dict.fromkeys((*self._seen, *self._host_addresses())))
        guarded = guard_canonical_name(policy, decision.host, port, canonical) or guard_addresses(
            policy, decision.host, port, addresses, self._seen
        )
        if guarded is not None:
            await self._settle(self._report(guarded, proxy, client))
            raise Refused(guarded)
        self._report(decision, proxy, client)
        return await self._connect(addresses, decision.port, target)

    async def check(
        self, host: str, port: int, proxy: str, *, client: tuple[str, int] = ("", 0)
    ) -> Decision:
        """The policy's allowance for ``host:port``, before anything is resolved or dialled.

        For a proxy with a request filter: a refusal is reported here (as
        ``dial`` would report it); an allowance is not, since ``dial`` reports
        it later, or ``report`` the filter's refusal.

        Raises:
            Refused: the policy refused the target, or could not be read.
        """
        policy, decision, _ = await self._decide_asking(host, port, proxy, client)
        if policy is None or not decision.allowed:
            raise Refused(decision)
        return decision

    async def _decide_asking(
        self, host: str, port: int, proxy: str, client: tuple[str, int]
    ) -> tuple[DomainPolicy | None, Decision, Awaitable[object] | None]:
        """``_decide``, with an unlisted target put to ``ask`` before it is refused."""
        policy, decision, pending = self._decide(host, port, proxy, client, ask=True)
        if policy is None or decision.allowed or self._ask is None or decision.kind != UNLISTED:
            return policy, decision, pending
        try:
            allowed = await self._ask(decision) is True
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("egress: the ask callable failed; refusing %s", decision.host)
            allowed = False
        if allowed:
            return (
                policy,
                Decision(
                    True, decision.host, decision.port, "asked", "allowed when asked", ALLOWED
                ),
                None,
            )
        refusal = Decision(
            False,
            decision.host,
            decision.port,
            "asked: denied",
            f"{decision.reason}; asked, and not allowed",
            UNLISTED,
        )
        return policy, refusal, self._report(refusal, proxy, client)

    def _decide(
        self, host: str, port: int, proxy: str, client: tuple[str, int], *, ask: bool = False
    ) -> tuple[DomainPolicy | None, Decision, Awaitable[object] | None]:
        """The current policy (None: unreadable), its decision for ``host:port``, and for
        a refusal, which is reported here, what ``on_decision`` returned. With ``ask``
        and an asker, an unlisted refusal is returned unreported (and ``None``)."""
        try:
            policy = self._policy()
        except Exception:
            log.exception("egress: the policy callable failed; refusing the connection")
            refusal = Decision(
                False,
                ascii(host)[1:-1][:253],
                port,
                "policy unavailable",
                "the session's network policy could not be read; refusing",
                UNAVAILABLE,
            )
            return None, refusal, self._report(refusal, proxy, client)
        decision = decide(policy, host, port)
        if not decision.allowed:
            if ask and self._ask is not None and decision.kind == UNLISTED:
                return policy, decision, None
            return policy, decision, self._report(decision, proxy, client)
        return policy, decision, None

    def report(self, decision: Decision, proxy: str, *, client: tuple[str, int] = ("", 0)) -> None:
        """Send one ``EgressDecision`` for a connection refused after ``check`` (a filter)."""
        self._report(decision, proxy, client)

    async def _resolve(self, decision: Decision, target: str) -> tuple[list[str], str]:
        """The addresses to dial, and the name the resolver answered for ("" unknown)."""
        if _is_ip(decision.host):
            return [decision.host], ""
        try:
            async with asyncio.timeout(self._resolve_timeout):
                raw = await self._resolver(decision.host, decision.port)
        except TimeoutError:
            raise DialFailed(
                target,
                "resolve",
                f"resolving {decision.host} took longer than {self._resolve_timeout:g} s",
            ) from None
        except Exception as exc:  # any resolver failure is a failed dial, never a pass
            raise DialFailed(target, "resolve", f"cannot resolve {decision.host}: {exc}") from exc
        addresses = list(dict.fromkeys(_spelling(str(a)) for a in raw))
        if not addresses:
            raise DialFailed(target, "resolve", f"{decision.host} has no addresses")
        canonical = getattr(raw, "canonical", "")
        return addresses, canonical if isinstance(canonical, str) else ""

    async def _connect(self, addresses: Sequence[str], port: int, target: str) -> socket.socket:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._connect_timeout
        error: OSError | None = None
        kind, reason = "timeout", f"no answer within {self._connect_timeout:g} s"
        for address in addresses:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as exc:
                error, kind, reason = exc, _DIAL_KINDS.get(exc.errno or 0, "network"), str(exc)
                continue
            try:
                sock.setblocking(False)
                async with asyncio.timeout(remaining):
                    await loop.sock_connect(sock, (address, port))
            except TimeoutError:
                sock.close()
                kind, reason = "timeout", f"no answer within {self._connect_timeout:g} s"
            except OSError as exc:
                sock.close()
                error = exc
                kind = _DIAL_KINDS.get(exc.errno or 0, "unreachable")
                reason = f"{address}: {exc.strerror or exc}"
            except BaseException:
                sock.close()
                raise
            else:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
        raise DialFailed(target, kind, f"cannot connect to {target}: {reason}") from error

    async def _settle(self, pending: Awaitable[object] | None) -> None:
        """Wait, at most ``report_wait`` s, for what ``on_decision`` still does.

        Cancellation: the wait ends; what is waited for carries on.
        """
        if pending is None:
            return
        future = asyncio.ensure_future(pending)
        await asyncio.wait({future}, timeout=self._report_wait)
        if future.done() and not future.cancelled() and future.exception() is not None:
            log.error(
                "egress: on_decision failed (the decision stands)", exc_info=future.exception()
            )

    def _report(
        self, decision: Decision, proxy: str, client: tuple[str, int]
    ) -> Awaitable[object] | None:
        if self._on_decision is None:
            return None
        record = EgressDecision(
            ACTION,
            target_text(decision.host, decision.port),
            decision.allowed,
            decision.rule,
            decision.reason,
            proxy,
            client,
            decision.kind,
        )
        try:
            pending = self._on_decision(record)
        except Exception:
            log.exception("egress: on_decision failed for %s (the decision stands)", record.target)
            return None
        return pending if hasattr(pending, "__await__") else None
