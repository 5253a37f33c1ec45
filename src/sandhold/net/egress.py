"""One sandbox session's egress: an HTTP proxy and a SOCKS5 proxy, on two listeners it is given.

Rules:
- The session only accepts. Its listening sockets are created, bound and put
  into listening state by whoever builds the sandbox (in production: inside the
  sandbox's network namespace, by another process) and handed over; the session
  owns them from the constructor on, and closes them.
- Fail closed (SPEC §9). When the session closes, or accepting fails in a way
  that is not about one connection, both listeners are shut down and closed
  before anything else, and every open connection is aborted. ``shutdown``
  stops a listener even if another process still holds a copy of it: queued
  connections are reset and new ones refused. The sandbox loses its network; it
  never gains another way out.
- Every connection reads ``policy()`` afresh (a new config applies from the
  next connection) and goes through ``outbound.Dialer``: decide, resolve, guard,
  dial, with one ``EgressDecision`` to ``on_decision``. Nothing here decides.
- Bounded: at most ``max_connections`` client connections at once (beyond that
  the listeners are not polled, and new connections wait in the kernel's
  backlog). With a ``budget`` (``budget.SessionBudget``: the session's share of
  the process's file descriptors), a connection the budget refuses is accepted
  and reset at once, and said in the log at most once per 10 s with a count. Out
  of file descriptors, accepting pauses for 100 ms (logged likewise). Every wait
  on a client has a deadline, given to the constructor.
- A connection handler that fails with a bug logs it and costs that connection
  only; an accept callback that fails ends the session (the network is cut).

Proxy mode (``sandhold proxy``) runs the HTTP proxy alone: ``socks_listener``
may be ``None``, and a ``request_filter`` (``request_filter`` module) decides
each HTTP request after the domain policy. Without them nothing changes.

Each proxy connection needs two file descriptors (and a pipe pair while a
transfer is under backpressure): raise ``RLIMIT_NOFILE`` for many tunnels
(``budget.raise_fd_limit``) and share it out with a ``budget``.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import socket

from sandhold._throttle import Throttle
from sandhold.net._conn import Limits
from sandhold.net.http_proxy import serve_http_client
from sandhold.net.outbound import (
    Dialer,
    EgressDecision,
    discover_host_addresses,
    system_resolver,
)
from sandhold.net.relay import Relayer, abort
from sandhold.net.socks_proxy import serve_socks_client

TYPE_CHECKING = False  # typing costs start-up time; mypy honours this name
if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence
    from types import TracebackType
    from typing import TypeAlias

    from sandhold.net.budget import SessionBudget
    from sandhold.net.injection import Injector
    from sandhold.net.outbound import Asker, DecisionSink, Resolver
    from sandhold.net.request_filter import RequestFilter
    from sandhold.net.tls_terminate import Terminator
    from sandhold.policy.domains import DomainPolicy

    _Handler: TypeAlias = Callable[[socket.socket, Dialer, Relayer, Limits], Awaitable[None]]

__all__ = ["EgressDecision", "EgressSession", "discover_host_addresses", "system_resolver"]

log = logging.getLogger("sandhold.net")

_ACCEPT_BATCH = 64  # accepts per wake-up before other work runs
_FD_BACKOFF = 0.1  # seconds to wait when out of file descriptors
# Failures of one pending connection, not of the listener: skip it and go on.
_SKIP = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNABORTED",
        "EPROTO",
        "ENETDOWN",
        "ENOPROTOOPT",
        "EHOSTDOWN",
        "ENONET",
        "EHOSTUNREACH",
        "EOPNOTSUPP",
        "ENETUNREACH",
        "EPERM",
        "ECONNRESET",
    )
    if hasattr(errno, name)
)
_OUT_OF_FDS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

NEW, RUNNING, CLOSING, CLOSED = "new", "running", "closing", "closed"


class EgressSession:
    """The HTTP and SOCKS5 proxies of one sandbox session (rules in the module doc).

    Use it as an async context manager, or call ``start()`` in a running loop
    and ``await aclose()`` later::

        async with EgressSession(http_listener=h, socks_listener=s,
                                 policy=lambda: current_policy) as session:
            ...

    Args:
        http_listener: a bound, listening TCP socket for the HTTP proxy.
        socks_listener: a bound, listening TCP socket for the SOCKS5 proxy, or
            ``None`` for the HTTP proxy alone (proxy mode).
        policy: called once per connection for the session's ``DomainPolicy``.
        resolver: ``await resolver(host, port)`` → IP addresses as text; the
            loop's ``getaddrinfo`` by default.
        host_addresses: the host's own addresses, refused by the address guard;
            read afresh for each connection by default (``discover_host_addresses``,
            about 60 µs), so that an address the host gains during a session is
            guarded too.
        on_decision: called with an ``EgressDecision`` for every connection that
            reached a decision, allowed or refused; it must not block.
        head_timeout: seconds for a client's whole request head or SOCKS5
            handshake (slowloris bound).
        connect_timeout: seconds to connect to an allowed target.
        resolve_timeout: seconds for the resolver.
        answer_timeout: seconds to deliver an error answer before closing.
        max_head_bytes: largest HTTP request head (431 beyond).
        max_connections: client connections served at once.
        splice: force (``True``) or forbid (``False``) the splice relay; ``None``
            uses it where available.
        request_filter: decides each HTTP request the policy allowed, before
            anything is dialled (``http_proxy`` rules); ``None``: no filter.
        body_timeout: seconds for a request body the filter asks to see.
        budget: the session's share of the process's connections (the
            ``budget`` module); ``None``: only ``max_connections``.
        label: names the session in log lines (a sandbox's id).
        half_closed_timeout: seconds a tunnel one side has closed may stay idle
            (``relay``).
        ask: awaited for a target no list decides (``outbound.Dialer``): ``True``
            allows it; ``None``: such targets are refused at once.
        extra_listeners: more listeners and their handlers, served and closed like
            the two proxies' (transparent egress: ``net.transparent``).

    Raises:
        ValueError: a listener is closed, not a stream socket, or not listening.

    Cancellation: ``aclose`` shuts down and closes both listeners before its
    first ``await``, so even a cancelled ``aclose`` (or an ``async with`` body
    that is cancelled) cuts the sandbox off at once. It then cancels every
    connection, which aborts its sockets with RST, and waits for them; if that
    wait is itself cancelled, the connections still finish aborting on their own.
    """

    def __init__(
        self,
        *,
        http_listener: socket.socket,
        socks_listener: socket.socket | None,
        policy: Callable[[], DomainPolicy],
        resolver: Resolver | None = None,
        host_addresses: Sequence[str] | None = None,
        on_decision: DecisionSink | None = None,
        head_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        resolve_timeout: float = 10.0,
        answer_timeout: float = 2.0,
        max_head_bytes: int = 64 * 1024,
        max_connections: int = 4096,
        splice: bool | None = None,
        request_filter: RequestFilter | None = None,
        body_timeout: float = 60.0,
        budget: SessionBudget | None = None,
        label: str = "",
        half_closed_timeout: float | None = None,
        ask: Asker | None = None,
        extra_listeners: Sequence[tuple[socket.socket, _Handler]] = (),
        terminator: Terminator | None = None,
        plaintext_injector: Injector | None = None,
    ) -> None:
        _check_listener("http_listener", http_listener)
        self._ask = ask
        http_handler: _Handler = serve_http_client
        if request_filter is not None:
            http_handler = functools.partial(serve_http_client, request_filter=request_filter)
        if terminator is not None or plaintext_injector is not None:
            # masked credentials (tls_terminate, injection): additive, like the filter
            http_handler = functools.partial(
                serve_http_client,
                request_filter=request_filter,
                terminator=terminator,
                plaintext=plaintext_injector,
            )
        listeners: list[tuple[socket.socket, _Handler]] = [(http_listener, http_handler)]
        if socks_listener is not None:
            _check_listener("socks_listener", socks_listener)
            listeners.append((socks_listener, serve_socks_client))
        for extra, handler in extra_listeners:
            _check_listener("extra listener", extra)
            listeners.append((extra, handler))
        self._listeners: tuple[tuple[socket.socket, _Handler], ...] = tuple(listeners)
        self.http_address: tuple[object, ...] = tuple(http_listener.getsockname())
        self.socks_address: tuple[object, ...] = (
            tuple(socks_listener.getsockname()) if socks_listener is not None else ()
        )
        """The SOCKS5 listener's address; ``()`` when there is none (proxy mode)."""
        self._policy = policy
        self._resolver: Resolver = resolver if resolver is not None else system_resolver
        self._host_addresses = None if host_addresses is None else tuple(host_addresses)
        self._on_decision = on_decision
        self._limits = Limits(head_timeout, answer_timeout, max_head_bytes, body_timeout)
        self._resolve_timeout = resolve_timeout
        self._connect_timeout = connect_timeout
        self._max_connections = max_connections
        self._relayer = Relayer(splice=splice, half_closed_timeout=half_closed_timeout)
        self._budget = budget
        self._label = f"egress ({label})" if label else "egress"
        self._refusals = Throttle()
        self._fd_warnings = Throttle()
        self._dialer: Dialer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state = NEW
        self._accepting = False
        self._active = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closer: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self.failure: BaseException | None = None
        """What ended the session if it died on its own (``None`` otherwise)."""

    def __repr__(self) -> str:
        return (
            f"<EgressSession {self._state} http={self.http_address} socks={self.socks_address}"
            f" connections={self._active}>"
        )

    @property
    def closed(self) -> bool:
        return self._state == CLOSED

    @property
    def connections(self) -> int:
        """Client connections being served now."""
        return self._active

    async def __aenter__(self) -> EgressSession:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def start(self) -> None:
        """Start accepting on both listeners; call it with a running event loop.

        Raises:
            RuntimeError: started before, or already closed; or no running loop.
        """
        if self._state != NEW:
            raise RuntimeError(f"EgressSession.start: the session is {self._state}")
        self._loop = asyncio.get_running_loop()
        self._dialer = Dialer(
            self._policy,
            self._resolver,
            discover_host_addresses if self._host_addresses is None else self._host_addresses,
            self._on_decision,
            resolve_timeout=self._resolve_timeout,
            connect_timeout=self._connect_timeout,
            ask=self._ask,
        )
        for listener, _ in self._listeners:
            listener.setblocking(False)
        self._state = RUNNING
        self._resume_accepting()

    async def aclose(self) -> None:
        """Close both listeners, abort every connection, release the relays. Idempotent.

        Cancellation: see the class doc; the listeners are closed first, always.
        """
        if self._state == CLOSED:
            return
        if self._state == CLOSING:
            await self._closed.wait()
            return
        self._state = CLOSING
        self._close_listeners()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        try:
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._relayer.close()
            self._state = CLOSED
            self._closed.set()

    def stop_accepting(self) -> None:
        """Shut down and close the listeners now; connections being served carry on.

        For a graceful end (proxy mode gives refusals in flight a moment to be
        written); ``aclose`` still has to follow. Idempotent.
        """
        self._close_listeners()

    async def wait_closed(self) -> None:
        """Return once the session is closed, by ``aclose`` or because it failed (``failure``)."""
        await self._closed.wait()

    # -- accepting -------------------------------------------------------------------

    def _resume_accepting(self) -> None:
        if self._state != RUNNING or self._accepting or self._active >= self._max_connections:
            return
        assert self._loop is not None
        for listener, handler in self._listeners:
            self._loop.add_reader(listener.fileno(), self._on_acceptable, listener, handler)
        self._accepting = True

    def _pause_accepting(self) -> None:
        if not self._accepting:
            return
        assert self._loop is not None
        for listener, _ in self._listeners:
            self._loop.remove_reader(listener.fileno())
        self._accepting = False

    def _on_acceptable(self, listener: socket.socket, handler: _Handler) -> None:
        try:
            self._accept_some(listener, handler)
        except Exception as exc:  # the listener broke, or a bug: fail closed
            self._die(exc)

    def _accept_some(self, listener: socket.socket, handler: _Handler) -> None:
        assert self._loop is not None
        for _ in range(_ACCEPT_BATCH):
            if self._active >= self._max_connections:
                self._pause_accepting()
                return
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in _SKIP:
                    continue
                if exc.errno in _OUT_OF_FDS:
                    held = self._fd_warnings.take()
                    if held is not None:
                        log.warning(
                            "%s: cannot accept (%s); pausing %g s each time%s",
                            self._label,
                            exc,
                            _FD_BACKOFF,
                            _since(held),
                        )
                    self._pause_accepting()
                    self._loop.call_later(_FD_BACKOFF, self._resume_accepting)
                    return
                raise
            why = self._budget.take(conn) if self._budget is not None else None
            if why is not None:
                abort(conn)  # refused: the sandbox sees a reset at once, not a hang
                held = self._refusals.take()
                if held is not None:
                    log.warning(
                        "%s: refusing new connections: %s%s", self._label, why, _since(held)
                    )
                continue
            self._spawn(conn, handler)

    def _spawn(self, conn: socket.socket, handler: _Handler) -> None:
        assert self._loop is not None and self._dialer is not None
        conn.setblocking(False)
        if conn.family in (socket.AF_INET, socket.AF_INET6):
            try:
                # the relay forwards what it reads at once; Nagle would only add delay
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # reset before we got to it: this connection only
                conn.close()
                if self._budget is not None:
                    self._budget.give(conn)
                return
        task = self._loop.create_task(self._serve(handler, conn, self._dialer))
        self._active += 1
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._connection_done(done, conn))

    async def _serve(self, handler: _Handler, conn: socket.socket, dialer: Dialer) -> None:
        try:
            await handler(conn, dialer, self._relayer, self._limits)
        except Exception:  # a bug: it costs this connection only (the handler closed it)
            log.exception("egress: connection handler failed")
            conn.close()

    def _connection_done(self, task: asyncio.Task[None], conn: socket.socket) -> None:
        if conn.fileno() >= 0:
            # a task cancelled before its first step never ran its handler's cleanup
            abort(conn)
        self._tasks.discard(task)
        self._active -= 1
        if self._budget is not None:
            self._budget.give(conn)
        self._resume_accepting()

    # -- ending ----------------------------------------------------------------------

    def _die(self, exc: BaseException) -> None:
        if self._state != RUNNING:
            return
        self.failure = exc
        log.error("egress: the proxies failed; the sandbox network is cut off", exc_info=exc)
        self._close_listeners()  # now, not when the task below gets to run
        assert self._loop is not None
        self._closer = self._loop.create_task(self.aclose())

    def _close_listeners(self) -> None:
        self._pause_accepting()
        for listener, _ in self._listeners:
            if listener.fileno() < 0:
                continue
            try:
                # stops the listening socket itself, even where another process
                # holds a copy of it: queued connections are reset
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # not connected/listening any more: closing is all that is left
            listener.close()


def _since(held: int) -> str:
    return f" ({held} more since the last such line)" if held else ""


def _check_listener(name: str, sock: socket.socket) -> None:
    if not isinstance(sock, socket.socket) or sock.fileno() < 0:
        raise ValueError(f"{name} must be an open socket.socket")
    if sock.type != socket.SOCK_STREAM:
        raise ValueError(f"{name} must be a stream (TCP) socket")
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        raise ValueError(f"{name} is not listening (call listen() before handing it over)")
