"""Run a session's egress proxies beside a blocking CLI run: one event loop in one thread.

The CLI's main thread waits for the sandbox with ``sigwaitinfo`` (it must: the
sandbox's ``--die-with-parent`` is tied to that thread); the proxies, the
``--control-fd`` reader and the ``--violations`` writer run on an asyncio loop
in a background thread. Signals stay blocked there, so they reach the main
thread only.

Rules:
- The domain policy is rebuilt from the plan's lists, and from every valid
  control line; an invalid line is reported on stderr and changes nothing.
- Every decision, allowed or refused, goes to the violations file as a JSON line
  (when one was asked for); refusals are also counted for ``--debug`` and for the
  one line the CLI prints by default (``refusal_line``: the hosts refused, the rule,
  and the settings key that would allow one).
- If the proxies fail, the listeners close: the sandbox loses its network; it
  never gains another way out.
- Masked credentials (``plan.injections``): the CA is loaded (or made) and the
  trust bundle written before the sandbox starts, so that a CA problem stops
  the launch (``LaunchError``); the HTTP proxy then terminates TLS for the
  hosts that get injections (``tls_terminate``). A control line's
  ``tlsTerminate`` (``excludeDomains``, ``maxTunnels``, ``handshakeTimeoutMs``)
  and ``credentials.sigv4`` apply from the next CONNECT; a line without
  ``tlsTerminate`` keeps the current ones (termination cannot be switched off
  live, nor the CA changed), and masks stay as launched.

Cancellation: ``stop()`` closes the session (and so the listeners) and joins the
thread; it is safe to call twice.
"""

from __future__ import annotations

import os
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    import socket
    from typing import Any, TextIO

    from sandhold.backends.linux.netns import TransparentSockets
    from sandhold.policy.cliplan import EgressPlan
    from sandhold.policy.domains import DomainPolicy
    from sandhold.refusals import BoundedRecord
    from sandhold.settings import FilesystemSettings, NetworkSettings


def _log(message: str) -> None:
    sys.stderr.write(f"sandhold: {message}\n")
    sys.stderr.flush()


class EgressRunner:
    """The proxies of one CLI run (see module rules)."""

    def __init__(
        self,
        plan: EgressPlan,
        launch_filesystem: FilesystemSettings,
        *,
        control_fd: int | None = None,
        violations: TextIO | None = None,
        launch_network: NetworkSettings | None = None,
    ) -> None:
        self.plan = plan
        self.policy: DomainPolicy | None = None  # built in the proxies' thread
        self._launch_filesystem = launch_filesystem
        self._launch_network = launch_network
        self._control_fd = control_fd
        self._violations = violations  # the caller's, opened before the sandbox ran
        self.refused: dict[tuple[str, str], int] = {}  # (target, rule) -> count
        self.kinds: dict[str, str] = {}  # refused target -> the rule's kind (the first)
        # the file is the user's disk: bounded per run
        self._record_file = None if violations is None else _file_record(violations)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()  # set once serving (or failed)
        self._error: BaseException | None = None
        self._stopped = False
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._ca: Any = None
        self._terminator: Any = None
        if plan.tls is not None:
            self._ca = _prepare_tls(plan)

    # -- called from the main thread ----------------------------------------------

    def start(
        self,
        http: socket.socket,
        socks: socket.socket,
        *,
        transparent: TransparentSockets | None = None,
    ) -> None:
        """Start serving on the two listeners, without waiting for them.

        ``transparent``: the namespace's transparent-egress sockets (issue 20),
        served beside the proxies by the same session.

        The listeners' backlog holds the sandbox's first connections until the
        proxies accept them, so the command need not wait for the event loop
        (and asyncio's ~15 ms import) before it starts. If the proxies fail to
        start, the listeners are closed (the sandbox loses its network) and the
        failure is reported on stderr.
        """
        self._thread = threading.Thread(
            target=self._main,
            args=(http, socks, transparent),
            name="sandhold-egress",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True  # a loop that starts from now on ends at once
            loop, stop = self._loop, self._stop
        os.write(self._wake_w, b"x")
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass  # the loop already ended
        if self._thread is not None:
            self._thread.join()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def summary(self) -> str:
        """One line naming the refused hosts, for ``--debug``."""
        if not self.refused:
            return "network: no connection refused"
        parts = [
            f"{target} ({rule})" + (f" x{n}" if n > 1 else "")
            for (target, rule), n in sorted(self.refused.items())
        ]
        total = sum(self.refused.values())
        return f"network: refused {total} connection(s): " + ", ".join(parts)

    def refusal_line(self, limit: int = 3) -> str | None:
        """The one line of a run that had connections refused (printed by default;
        ``-q`` silences it), or None: the hosts, the rule of each, and what to add."""
        if not self.refused:
            return None
        from sandhold.policy.domains import DENIED, UNLISTED

        firsts: dict[str, str] = {}
        for target, rule in self.refused:
            firsts.setdefault(target, rule)
        shown = [f"{t} ({rule})" for t, rule in list(firsts.items())[:limit]]
        more = f" and {len(firsts) - limit} more" if len(firsts) > limit else ""
        line = f"network: refused {', '.join(shown)}{more}"
        unlisted = next((t for t, k in self.kinds.items() if k == UNLISTED), None)
        denied = next((t for t, k in self.kinds.items() if k == DENIED), None)
        if unlisted is not None:
            line += f'; to allow it: "network": {{"allowedDomains": ["{_host(unlisted)}"]}}'
        elif denied is not None:
            line += "; a network.deniedDomains entry refuses it (remove it there to allow it)"
        return line + " (-d lists every refusal)"

    # -- the loop thread ----------------------------------------------------------------

    def _main(
        self, http: socket.socket, socks: socket.socket, transparent: TransparentSockets | None
    ) -> None:
        # Wait for the first connection (or control line) before loading asyncio
        # and the proxies: a run that never uses the network never pays for them.
        import select

        poll = select.poll()
        fds = [http.fileno(), socks.fileno(), self._wake_r]
        if transparent is not None:
            fds += [s.fileno() for s in transparent.all()]
        if self._control_fd is not None:
            fds.append(self._control_fd)
        for fd in fds:
            poll.register(fd, select.POLLIN)
        woken = {fd for fd, _ in poll.poll()}
        if woken == {self._wake_r}:
            self._ready.set()
            return  # stopped before anything asked for the network
        import asyncio

        try:
            asyncio.run(self._serve(http, socks, transparent))
        except BaseException as exc:  # the run goes on, offline: fail closed, and say so
            self._error = exc
            http.close()
            socks.close()
            for sock in transparent.all() if transparent is not None else ():
                sock.close()
            _log(f"the egress proxies failed ({exc}); the sandbox has no network now")
        finally:
            self._ready.set()

    async def _serve(
        self, http: socket.socket, socks: socket.socket, transparent: TransparentSockets | None
    ) -> None:
        import asyncio

        from sandhold.net.budget import raise_fd_limit
        from sandhold.net.egress import EgressSession
        from sandhold.policy.domains import DomainPolicy

        plan = self.plan
        policy = DomainPolicy.for_cli(
            plan.allowed_domains, plan.denied_domains, plan.allow_all_domains
        )
        if self.policy is None:
            self.policy = policy

        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            if self._stopped:
                self._stop.set()
        current = lambda: self.policy or policy  # noqa: E731
        diverted = None
        if transparent is not None:
            from sandhold.net.transparent import TransparentEgress
            from sandhold.policy.transparent import SyntheticNames

            diverted = TransparentEgress(
                tcp=transparent.tcp,
                dns_udp=transparent.dns_udp,
                dns_tcp=transparent.dns_tcp,
                nflog=transparent.nflog,
                policy=current,
                on_decision=self._record,
                names=SyntheticNames(),
            )
        session = EgressSession(
            http_listener=http,
            socks_listener=socks,
            policy=current,
            on_decision=self._record,
            extra_listeners=diverted.listeners() if diverted is not None else (),
            **self._credential_hooks(),
        )
        raise_fd_limit()  # each tunnel holds two fds (and a pipe pair while backpressured)
        if diverted is not None:
            diverted.start()
        async with session:
            if self._control_fd is not None:
                self._watch_control(self._control_fd)
            self._ready.set()
            stop = asyncio.ensure_future(self._stop.wait())
            closed = asyncio.ensure_future(session.wait_closed())
            await asyncio.wait({stop, closed}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            closed.cancel()
            if session.failure is not None:
                _log(
                    f"the egress proxies failed ({session.failure}); the sandbox has no network now"
                )
            if diverted is not None:
                await diverted.aclose()

    def _credential_hooks(self) -> dict[str, Any]:
        plan = self.plan
        if not plan.injections:
            return {}
        from sandhold.net.tls_terminate import credential_hooks

        hooks = credential_hooks(
            plan.injections,
            ca=self._ca,
            tls=plan.tls,
            plaintext=plan.plaintext_inject,
            aws_keys=plan.aws_keys,
            sigv4=plan.sigv4,
        )
        self._terminator = hooks.get("terminator")
        return hooks

    def _apply_credentials(self, creds: Any) -> None:
        """A control line's TLS lists and bounds and SigV4 policy, for the tunnels that follow."""
        term, tls = self._terminator, creds.tls_terminate
        if tls is None:
            _log("control line: without tlsTerminate; TLS termination keeps its settings")
        else:
            term.exclude_domains = tuple(tls.exclude_domains)
            term.max_tunnels = tls.max_tunnels
            term.handshake_timeout = tls.handshake_timeout_ms / 1000
        if creds.sigv4 is not None:
            term.sigv4_policy = creds.sigv4

    def _record(self, decision: Any) -> None:
        allowed = bool(decision.allowed)
        if not allowed:
            key = (str(decision.target), str(decision.rule))
            if key not in self.refused and len(self.refused) >= MAX_SUMMARY_KEYS:
                key = ("(other hosts)", "")  # a sandbox may try any number of names
            self.refused[key] = self.refused.get(key, 0) + 1
            if len(self.kinds) < MAX_SUMMARY_KEYS:
                self.kinds.setdefault(key[0], str(getattr(decision, "kind", "")))
        if self._record_file is not None:
            from sandhold.refusals import line

            entry = line(
                decision.action,
                decision.target,
                decision.rule,
                time.time(),
                kind=str(getattr(decision, "kind", "")),
                allowed=allowed,
                reason=decision.reason,
                proxy=decision.proxy,
            )
            self._record_file.add(entry, time.time())

    def _watch_control(self, fd: int) -> None:
        from sandhold.net.control import Applied, ControlChannel
        from sandhold.policy.domains import DomainPolicy

        assert self._loop is not None
        loop = self._loop
        channel = ControlChannel(self._launch_filesystem, self._launch_network)
        os.set_blocking(fd, False)

        def readable() -> None:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError as exc:
                _log(f"control fd {fd}: {exc.strerror}; keeping the current network rules")
                data = b""
            if not data:
                loop.remove_reader(fd)
            for event in channel.feed(data):
                if isinstance(event, Applied):
                    net = event.network
                    try:
                        self.policy = DomainPolicy.for_cli(
                            net.allowed_domains, net.denied_domains, net.allow_all_domains
                        )
                    except ValueError as exc:  # validated already; belt and braces
                        _log(f"control line rejected: {exc}; keeping the previous rules")
                        continue
                    if self._terminator is not None:
                        self._apply_credentials(event.credentials)
                    if event.note:
                        _log(event.note)
                else:
                    _log(f"control line rejected: {event.reason}; keeping the previous rules")

        loop.add_reader(fd, readable)


def _host(target: str) -> str:
    """The host of ``host:port`` (an IPv6 one in brackets, as allowedDomains spells it)."""
    host = target.rsplit(":", 1)[0]
    return host


def _prepare_tls(plan: EgressPlan) -> Any:
    """Load or make the CA and write the sandbox's trust bundle (main thread, pre-launch).

    Raises:
        LaunchError: the CA cannot be read, made or trusted, or the bundle written.
    """
    from sandhold.errors import LaunchError
    from sandhold.net.ca import prepare

    tls = plan.tls
    assert tls is not None
    ca, bundle, notes = prepare(
        tls.ca_cert_path, tls.ca_key_path, plan.ca_dir, tls.extra_ca_cert_paths
    )
    for note in notes:
        _log(note)
    if plan.trust_bundle:
        try:
            fd = os.open(
                plan.trust_bundle, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644
            )
            with os.fdopen(fd, "wb") as f:
                f.write(bundle)
        except OSError as exc:
            raise LaunchError(
                "native", "tls trust bundle", f"{plan.trust_bundle}: {exc.strerror}"
            ) from exc
    return ca


MAX_LOGGED = 100_000  # violations-file lines per run
MAX_SUMMARY_KEYS = 1_000  # distinct refused (host, rule) pairs counted for --debug


def _file_record(file: TextIO) -> BoundedRecord:
    from sandhold.refusals import BoundedRecord

    def write(data: bytes) -> None:
        file.write(data.decode())
        file.flush()

    return BoundedRecord(write, MAX_LOGGED, "decisions")
