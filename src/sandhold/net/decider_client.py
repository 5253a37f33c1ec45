"""The asyncio side of the decider link, and the HTTP proxy's request filter built on it.

``DeciderClient`` moves bytes between ``decider.DeciderLink`` and the decider's
file descriptors (one socket, or a pair of pipes) and owns the only timer.
``DeciderFilter`` turns each proxied request into a ``req`` and the verdict into
a ``FilterAllow`` or ``FilterDeny`` (``request_filter``).

Rules:
- Fail closed. A request passes only on a well-formed allow for its id that
  arrives within ``timeout`` seconds (default 5; no timer runs while the proxy
  reads a body the decider asked for). Otherwise it is refused: the decider's
  deny with its status (``X-Deny-Reason: decider``); a late verdict, a dead or
  not yet ready decider, or too many bodies held: 503 ``decider_unavailable``.
- The link dies on the decider's EOF, a read or write error, any protocol
  violation, or more than ``max_queued`` bytes written and not read. Death is
  logged once and reported once to ``on_dead``; every pending and later request
  is refused with 503.
- Proxy mode serves plain HTTP only: a CONNECT to an allowed host is refused
  with 403 ``opaque_tunnel`` (the reference refuses every tunnel it cannot
  terminate, so the decider sees every request; TLS termination is not here
  yet). ``TRACE`` and ``TRACK`` get 405 ``method_refused`` without asking. A
  request the protocol cannot carry gets 400 ``bad_request`` without asking.
- An allow that sets headers (``setHeaders`` or a credential) on plain HTTP is
  refused with 403 ``plaintext_header_set`` unless ``plaintext_header_set`` is
  on, so a credential never travels in cleartext. A credential first removes
  every credential header the client sent, then goes as
  ``Authorization: Bearer <value>`` (HTTP Basic as ``x-access-token`` for class
  ``github`` on ``github.com``).
- A ``need_body`` for a ``GET``, ``HEAD`` or ``OPTIONS`` request that has a body
  is refused with 403 ``bodyless_method_body``.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import logging
import os

from sandhold.net.decider import (
    CREDENTIAL_HEADERS,
    MAX_BODY,
    Allow,
    DeciderDead,
    DeciderLink,
    Deny,
    Hello,
    NeedBody,
    req_fields,
)
from sandhold.net.request_filter import FilterAllow, FilterDeny

TYPE_CHECKING = False  # typing costs start-up time; mypy honours this name
if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping
    from typing import Any

    from sandhold.net.decider import Verdict
    from sandhold.net.request_filter import BodyReader, FilterInput

    BodySource = Callable[[int], Awaitable[tuple[bytes, bool] | FilterDeny]]

log = logging.getLogger("sandhold.net")

DEFAULT_TIMEOUT = 5.0
MAX_BODY_HELD = 2 * MAX_BODY
MAX_QUEUED = -(-MAX_BODY_HELD * 4 // 3) + (32 << 20)
_READ_SIZE = 64 * 1024
_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})


def unavailable(reason: str = "request decider unavailable") -> FilterDeny:
    return FilterDeny(503, "decider_unavailable", reason)


class DeciderClient:
    """One decider link over file descriptors (module rules).

    Args:
        read_fd: the decider → proxy stream (a socket or a pipe); owned from here on.
        write_fd: the proxy → decider stream; may be ``read_fd`` (a socket).
        timeout: seconds to wait for each verdict.
        on_dead: called once with the reason when the link dies.
        max_body_held: request-body bytes held for the decider at once.
        max_queued: bytes written and not yet taken before the decider counts as gone.

    Call ``start()`` in a running loop; ``hello`` resolves with the decider's
    hello (or fails with ``DeciderDead``). ``close()`` ends the link.
    """

    def __init__(
        self,
        read_fd: int,
        write_fd: int,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        on_dead: Callable[[str], object] | None = None,
        max_body_held: int = MAX_BODY_HELD,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        self._read_fd = read_fd
        self._write_fd = write_fd
        self.timeout = timeout
        self._on_dead = on_dead
        self._max_held = max_body_held
        self._max_queued = max_queued
        self._held = 0
        self._link = DeciderLink()
        self._out = bytearray()
        self._writing = False
        self._waiters: dict[int, asyncio.Future[Verdict]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.hello: asyncio.Future[Hello] | None = None
        self.dead: str | None = None
        """Why the link died, or ``None`` while it lives."""

    def start(self) -> None:
        """Send the hello and start reading. Needs a running loop."""
        self._loop = asyncio.get_running_loop()
        self.hello = self._loop.create_future()
        for fd in {self._read_fd, self._write_fd}:
            os.set_blocking(fd, False)
        self._loop.add_reader(self._read_fd, self._on_readable)
        self._send(self._link.start())

    def close(self, reason: str = "closed") -> None:
        """End the link (idempotent): pending requests are refused, the fds closed."""
        self._die(reason, quiet=True)

    @property
    def body_bytes_held(self) -> int:
        return self._held

    # -- I/O ---------------------------------------------------------------------------

    def _on_readable(self) -> None:
        try:
            data = os.read(self._read_fd, _READ_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            self._die(f"read error: {exc.strerror or exc}")
            return
        try:
            self._link.receive_data(data)
            while (event := self._link.next_event()) is not None:
                self._dispatch(event)
        except DeciderDead as exc:
            self._die(exc.reason)

    def _dispatch(self, event: Hello | Verdict) -> None:
        if isinstance(event, Hello):
            assert self.hello is not None
            if not self.hello.done():
                self.hello.set_result(event)
            return
        waiter = self._waiters.get(event.id)
        if waiter is not None and not waiter.done():
            waiter.set_result(event)

    def _send(self, frame: bytes) -> None:
        if self.dead is not None:
            return
        self._out += frame
        if len(self._out) > self._max_queued:
            self._die(f"not reading: {len(self._out)} bytes queued")
            return
        if not self._writing:
            self._flush()

    def _flush(self) -> None:
        assert self._loop is not None
        while self._out:
            try:
                sent = os.write(self._write_fd, self._out[: _READ_SIZE * 16])
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                self._die(f"write error: {exc.strerror or exc}")
                return
            del self._out[:sent]
        if self._out and not self._writing:
            self._loop.add_writer(self._write_fd, self._flush)
            self._writing = True
        elif not self._out and self._writing:
            self._loop.remove_writer(self._write_fd)
            self._writing = False

    def _die(self, reason: str, *, quiet: bool = False) -> None:
        if self.dead is not None:
            return
        self.dead = reason
        self._link.kill(reason)
        if quiet:
            log.info("decider: link closed (%s)", reason)
        else:
            log.error("decider: the link is dead (%s); every request is refused", reason)
        error = DeciderDead(reason)
        if self.hello is not None and not self.hello.done():
            self.hello.set_exception(error)
            self.hello.exception()  # retrieved: a caller may never await it
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(error)
                waiter.exception()
        if self._loop is not None:
            self._loop.remove_reader(self._read_fd)
            if self._writing:
                self._loop.remove_writer(self._write_fd)
                self._writing = False
        self._out.clear()
        for fd in {self._read_fd, self._write_fd}:
            try:
                os.close(fd)
            except OSError:
                pass  # closed already
        if self._on_dead is not None:
            try:
                self._on_dead(reason)
            except Exception:
                log.exception("decider: on_dead failed")

    # -- one request -------------------------------------------------------------------

    async def ask(
        self, fields: Mapping[str, object], read_body: BodySource, body_length: int | None
    ) -> Allow | FilterDeny:
        """Put one request to the decider; the allow, or the refusal to answer with.

        ``read_body(max)`` is awaited only on a need_body: the body (up to
        ``max`` bytes) and whether it was cut, or a refusal. ``body_length``
        sizes what the body will hold (``None``: unknown, ``max`` is reserved).

        Cancellation: the request is given up (late verdicts are dropped).
        """
        if self.dead is not None:
            return unavailable()
        if self.hello is None or not self.hello.done() or self.hello.exception():
            return unavailable("request decider not ready")
        try:
            ident, frame = self._link.request(fields)
        except ValueError as exc:
            return FilterDeny(400, "bad_request", str(exc))
        except DeciderDead:
            return unavailable()
        reserved = 0
        try:
            verdict = await self._verdict(ident, frame)
            if isinstance(verdict, NeedBody):
                want = verdict.max if body_length is None else min(body_length, verdict.max)
                if self._held + want > self._max_held:
                    return unavailable("too many request bodies held for inspection")
                self._held += want
                reserved = want
                final = await self._with_body(ident, verdict.max, read_body)
                if isinstance(final, FilterDeny):
                    return final
                verdict = final
        except TimeoutError:
            return unavailable("request decider: decider timed out")
        except DeciderDead as exc:
            return unavailable(f"request decider: {exc.reason}")
        finally:
            self._held -= reserved
            self._waiters.pop(ident, None)
            self._link.give_up(ident)  # no-op once a verdict ended it
        if isinstance(verdict, Deny):
            return FilterDeny(verdict.status, "decider", verdict.reason or "denied by the decider")
        assert isinstance(verdict, Allow)
        return verdict

    async def _verdict(self, ident: int, frame: bytes | None) -> Verdict:
        assert self._loop is not None
        waiter: asyncio.Future[Verdict] = self._loop.create_future()
        self._waiters[ident] = waiter
        if frame is not None:
            self._send(frame)
        if self.dead is not None:
            raise DeciderDead(self.dead)
        async with asyncio.timeout(self.timeout):
            return await waiter

    async def _with_body(
        self, ident: int, limit: int, read_body: BodySource
    ) -> Verdict | FilterDeny:
        """Read the body while a deny may come; send it; wait for the final verdict."""
        assert self._loop is not None
        early: asyncio.Future[Verdict] = self._loop.create_future()
        self._waiters[ident] = early
        reading = asyncio.ensure_future(read_body(limit))
        try:
            both: set[asyncio.Future[Any]] = {reading, early}
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not reading.done():
                reading.cancel()
        if early.done():
            reading.cancel()
            return early.result()  # a deny (the link refuses anything else), or DeciderDead
        body = reading.result()
        if isinstance(body, FilterDeny):
            return body
        data, cut = body
        frame = self._link.body(ident, data, cut)
        return await self._verdict(ident, frame)


class DeciderFilter:
    """The proxy's ``RequestFilter`` in proxy mode: every request goes to the decider.

    Args:
        client: the decider link.
        plaintext_header_set: let an allow set headers on plain HTTP.
    """

    def __init__(self, client: DeciderClient, *, plaintext_header_set: bool = False) -> None:
        self._client = client
        self._plaintext_header_set = plaintext_header_set

    async def check(self, request: FilterInput, body: BodyReader) -> FilterAllow | FilterDeny:
        req = request.request
        if req.is_connect:
            return FilterDeny(
                403,
                "opaque_tunnel",
                "CONNECT is refused: this proxy does not terminate TLS, and an opaque tunnel"
                " would bypass the decider",
            )
        if req.method in ("TRACE", "TRACK"):
            return FilterDeny(405, "method_refused", f"{req.method} requests are refused")
        # The origin gets the Host the proxy writes (the URL's authority), not the
        # client's: the decider is shown that one, or a Host naming another site would
        # mislead a decider that trusts it.
        sent_host = _sent_host(req.forward_head)
        headers = [(n, v) for n, v in request.headers if n.lower() != "host"]
        if sent_host is not None:
            headers.append(("host", sent_host))
        fields = req_fields(
            method=req.method,
            host=request.decision.host,
            port=request.decision.port,
            target=request.target,
            headers=headers,
        )
        if isinstance(fields, str):
            return FilterDeny(400, "bad_request", fields)

        async def read_body(limit: int) -> tuple[bytes, bool] | FilterDeny:
            if req.method in _BODYLESS and body.has_body:
                return FilterDeny(
                    403,
                    "bodyless_method_body",
                    "the decider asked to see the body of a request whose method normally"
                    " has none, and it has one",
                )
            return await body.read(limit)

        length = body.length if body.has_body else 0
        verdict = await self._client.ask(fields, read_body, length)
        if isinstance(verdict, FilterDeny):
            return verdict
        return self._allow(verdict, request.decision.host)

    def _allow(self, verdict: Allow, host: str) -> FilterAllow | FilterDeny:
        removes = list(verdict.remove_headers)
        sets: list[tuple[str, str]] = []
        for name, values in verdict.set_headers:
            if values:
                sets += [(name, value) for value in values]
            else:
                removes.append(name)
        if verdict.cred is not None and verdict.credential is not None:
            removes += CREDENTIAL_HEADERS
            sets.append(_place_credential(verdict.cred, verdict.credential, host))
        if sets and not self._plaintext_header_set:
            return FilterDeny(
                403,
                "plaintext_header_set",
                "the decider set headers on a plain-HTTP request (start the proxy with"
                " --plaintext-header-set to allow it)",
            )
        return FilterAllow(tuple(dict.fromkeys(removes)), tuple(sets))


def _place_credential(cls: str, value: str, host: str) -> tuple[str, str]:
    if cls == "github" and host == "github.com":
        token = base64.b64encode(f"x-access-token:{value}".encode()).decode("ascii")
        return "authorization", f"Basic {token}"
    return "authorization", f"Bearer {value}"


def _sent_host(forward_head: bytes) -> str | None:
    """The value of the Host line the proxy writes into the forwarded head."""
    for line in forward_head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"host":
            return value.strip().decode("latin-1")
    return None
