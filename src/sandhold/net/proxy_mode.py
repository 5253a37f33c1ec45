"""``sandhold proxy`` (F-CTL-2): the HTTP proxy alone, every request decided by an external decider.

Rules:
- The command line is srt-proxy's, so a host that starts ``srt proxy`` can start
  this with the same descriptors: ``--listen-fd`` (or ``--listen`` on loopback;
  another address needs ``--listen-any-interface``), ``--decider-fd`` (or
  ``--decider-in`` and ``--decider-out``), ``--lifeline-fd``,
  ``--plaintext-header-set``, ``-d``. ``--version`` anywhere prints one line and
  does nothing else. ``--ca-fd`` (TLS termination) and
  ``--strip-response-header`` are refused (exit 2): not supported yet, never
  ignored. ``--decider-timeout SECONDS`` (default 5) is sandhold's own.
- Nothing is served before the decider's hello: its ``allowedDomains`` and
  ``deniedDomains`` become the domain policy (baseline denylist first, then
  denied, then allowed; nothing else is allowed), and the decider then decides
  every request the policy lets through (``net.decider_client``).
- The proxy stops when the decider's stream ends or breaks the protocol (every
  pending request is answered 503 ``decider_unavailable`` first), when the
  lifeline ends, on SIGTERM or SIGINT, or when the listener fails. Stopping
  shuts the listener down at once (queued and new connections are refused),
  gives answers in flight 1 s, then aborts what is left.
- Exit status: 0 after a stop, 1 if the start failed (no hello, an unusable
  hello, a listener that cannot be served), 2 for bad usage. The reason is one
  ``sandhold proxy: stopped (...)`` line on stderr.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import socket
import sys

from sandhold._record import record
from sandhold.errors import UsageError, is_fd_number

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from sandhold.net.egress import EgressDecision

HELP = """\
usage: sandhold proxy (--listen-fd N | --listen HOST:PORT)
                      (--decider-fd N | --decider-in N --decider-out N) [options]

Run only the HTTP proxy, deciding every request through an external decider
(srt's decider protocol, version 1) on inherited file descriptors.

options:
  --listen-fd N            accept connections on this inherited listening socket
  --listen HOST:PORT       listen on this loopback address instead (port 0: any;
                           the address is printed on stderr)
  --listen-any-interface   let --listen bind a non-loopback address (unauthenticated!)
  --decider-fd N           bidirectional decider stream (a socket)
  --decider-in N           decider -> proxy stream (with --decider-out)
  --decider-out N          proxy -> decider stream (with --decider-in)
  --lifeline-fd N          shut down when this stream ends
  --plaintext-header-set   let allow verdicts set headers on plain-HTTP requests
  --decider-timeout S      seconds to wait for each verdict (default 5)
  -d, --debug              log every decision on stderr
  -h, --help               show this help
      --version            print the version and exit; nothing else is read
  --ca-fd, --strip-response-header: not supported yet (refused)

Plain HTTP only: every CONNECT is refused (403, X-Deny-Reason: opaque_tunnel).
See docs/proxy-mode.md for the protocol.
"""

_FD_OPTS = {
    "--listen-fd": "listen_fd",
    "--decider-fd": "decider_fd",
    "--decider-in": "decider_in",
    "--decider-out": "decider_out",
    "--lifeline-fd": "lifeline_fd",
}
_FLAGS = {
    "--listen-any-interface": "listen_any_interface",
    "--plaintext-header-set": "plaintext_header_set",
    "-d": "debug",
    "--debug": "debug",
    "-h": "help",
    "--help": "help",
}
_UNSUPPORTED = {
    "--ca-fd": "TLS termination (--ca-fd) is not supported yet by sandhold proxy",
    "--strip-response-header": "--strip-response-header is not supported yet by sandhold proxy",
}
_GRACE = 1.0  # seconds for answers in flight when the proxy stops


@record
class ProxyOptions:
    listen_fd: int | None = None
    listen: tuple[str, int] | None = None
    listen_any_interface: bool = False
    decider_fd: int | None = None
    decider_in: int | None = None
    decider_out: int | None = None
    lifeline_fd: int | None = None
    plaintext_header_set: bool = False
    decider_timeout: float = 5.0
    debug: bool = False
    help: bool = False
    version: bool = False


def parse_proxy_args(args: Sequence[str]) -> ProxyOptions:
    """Parse ``sandhold proxy``'s arguments (module rules).

    Raises:
        UsageError: an unknown or unsupported option, a bad value, or a missing one.
    """
    if "--version" in args:
        return ProxyOptions(version=True)
    values: dict[str, object] = {}
    listen_text: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=")
        if name in _UNSUPPORTED:
            raise UsageError(_UNSUPPORTED[name])
        if name in _FD_OPTS or name in ("--listen", "--decider-timeout"):
            if eq:
                value = inline
            elif i + 1 < len(args):
                i += 1
                value = args[i]
            else:
                raise UsageError(f"{name} needs a value")
            if name == "--listen":
                listen_text = value
            elif name == "--decider-timeout":
                try:
                    timeout = float(value)
                except ValueError:
                    timeout = -1.0
                if not 0 < timeout <= 3600:
                    raise UsageError(f"--decider-timeout needs seconds (0-3600], got {value!r}")
                values["decider_timeout"] = timeout
            else:
                if not is_fd_number(value):
                    raise UsageError(f"{name} needs a file descriptor number, got {value!r}")
                values[_FD_OPTS[name]] = int(value)
        elif arg in _FLAGS:
            values[_FLAGS[arg]] = True
        else:
            raise UsageError(f"unknown option {arg!r} (see sandhold proxy --help)")
        i += 1
    opts = ProxyOptions(**values)  # type: ignore[arg-type]
    if opts.help:
        return opts
    if opts.decider_fd is not None and (
        opts.decider_in is not None or opts.decider_out is not None
    ):
        raise UsageError("give --decider-fd, or --decider-in and --decider-out, not both")
    if opts.decider_fd is None and (opts.decider_in is None or opts.decider_out is None):
        raise UsageError("a decider is required (--decider-fd, or --decider-in and --decider-out)")
    if opts.listen_fd is not None and listen_text is not None:
        raise UsageError("give --listen-fd or --listen, not both")
    if listen_text is not None:
        host, port = _listen_address(listen_text)
        if not _is_loopback(host) and not opts.listen_any_interface:
            raise UsageError(
                f"--listen {listen_text!r} is not a loopback address (127.0.0.0/8, [::1] or"
                " localhost); pass --listen-any-interface to bind it anyway"
            )
        return ProxyOptions(**{**values, "listen": (host, port)})  # type: ignore[arg-type]
    if opts.listen_fd is None:
        raise UsageError("--listen-fd (or --listen for development) is required")
    return opts


def _listen_address(text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    digits = port_text.isascii() and port_text.isdigit() and len(port_text) <= 5
    if not sep or not digits or int(port_text) > 65535:
        raise UsageError(f"--listen needs HOST:PORT with a port from 0 to 65535 (got {text!r})")
    return host, int(port_text)


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_fd(name: str, fd: int | None) -> None:
    if fd is None:
        return
    try:
        os.fstat(fd)
    except OSError:
        raise UsageError(f"{name} {fd} is not an open file descriptor") from None


def run_proxy(args: Sequence[str], *, debug: bool = False) -> int:
    """Entry point of ``sandhold proxy``; returns the exit status.

    Raises:
        UsageError: bad arguments (the caller prints it and exits 2).
    """
    opts = parse_proxy_args(args)
    if opts.version:
        import sandhold

        sys.stdout.write(f"sandhold proxy {sandhold.__version__}\n")
        return 0
    if opts.help:
        sys.stdout.write(HELP)
        return 0
    for name, fd in (
        ("--listen-fd", opts.listen_fd),
        ("--decider-fd", opts.decider_fd),
        ("--decider-in", opts.decider_in),
        ("--decider-out", opts.decider_out),
        ("--lifeline-fd", opts.lifeline_fd),
    ):
        _check_fd(name, fd)
    listener = _open_listener(opts)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("sandhold proxy: %(message)s"))
    logger = logging.getLogger("sandhold")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if (debug or opts.debug) else logging.WARNING)
    try:
        why, failed = asyncio.run(_serve(opts, listener))
    finally:
        logger.removeHandler(handler)
    sys.stderr.write(f"sandhold proxy: stopped ({why})\n")
    return 1 if failed else 0


def _open_listener(opts: ProxyOptions) -> socket.socket:
    if opts.listen_fd is not None:
        try:
            sock = socket.socket(fileno=opts.listen_fd)
        except OSError as exc:
            raise UsageError(f"--listen-fd {opts.listen_fd} is not a socket: {exc}") from None
        if sock.type != socket.SOCK_STREAM or not sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_ACCEPTCONN
        ):
            raise UsageError(f"--listen-fd {opts.listen_fd} is not a listening stream socket")
        return sock
    assert opts.listen is not None
    host, port = opts.listen
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as exc:
        raise UsageError(f"--listen {host}:{port}: cannot listen: {exc}") from None
    return sock


async def _serve(opts: ProxyOptions, listener: socket.socket) -> tuple[str, bool]:
    """Serve until stopped; returns why, and whether the start failed."""
    from sandhold.net.decider_client import DeciderClient, DeciderFilter
    from sandhold.net.egress import EgressSession
    from sandhold.policy.domains import DomainPolicy

    loop = asyncio.get_running_loop()
    stopped: asyncio.Future[str] = loop.create_future()

    def stop(why: str) -> None:
        if not stopped.done():
            stopped.set_result(why)

    read_fd = opts.decider_fd if opts.decider_fd is not None else opts.decider_in
    write_fd = opts.decider_fd if opts.decider_fd is not None else opts.decider_out
    assert read_fd is not None and write_fd is not None
    client = DeciderClient(
        read_fd,
        write_fd,
        timeout=opts.decider_timeout,
        on_dead=lambda reason: stop(f"decider: {reason}"),
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signal.Signals(signum).name)
    if opts.lifeline_fd is not None:
        _watch_lifeline(loop, opts.lifeline_fd, stop)
    client.start()
    assert client.hello is not None
    first: set[asyncio.Future[Any]] = {client.hello, stopped}
    await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
    if not client.hello.done() or client.hello.exception() is not None:
        client.close()
        listener.close()
        why = stopped.result() if stopped.done() else "no hello"
        return f"start failed: {why}", True
    hello = client.hello.result()
    try:
        policy = DomainPolicy.for_cli(hello.allowed_domains, hello.denied_domains)
    except ValueError as exc:
        client.close()
        listener.close()
        return f"start failed: the decider's hello: {exc}", True
    log = logging.getLogger("sandhold.net")

    def on_decision(decision: EgressDecision) -> None:
        verb = "allowed" if decision.allowed else "refused"
        log.debug("%s %s (%s: %s)", verb, decision.target, decision.rule, decision.reason)

    session = EgressSession(
        http_listener=listener,
        socks_listener=None,
        policy=lambda: policy,
        on_decision=on_decision,
        request_filter=DeciderFilter(client, plaintext_header_set=opts.plaintext_header_set),
    )
    session.start()
    where = session.http_address
    shown = f"fd {opts.listen_fd}" if opts.listen_fd is not None else _address_text(where)
    sys.stderr.write(f"sandhold proxy: serving {shown}\n")
    sys.stderr.flush()
    closed = asyncio.ensure_future(session.wait_closed())
    ends: set[asyncio.Future[Any]] = {closed, stopped}
    await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
    why = stopped.result() if stopped.done() else f"listener failed: {session.failure}"
    session.stop_accepting()
    client.close(why)  # pending requests are answered 503 now
    deadline = loop.time() + _GRACE
    while session.connections and loop.time() < deadline:
        await asyncio.sleep(0.025)
    await session.aclose()
    closed.cancel()
    return why, False


def _address_text(address: tuple[object, ...]) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def _watch_lifeline(loop: asyncio.AbstractEventLoop, fd: int, stop: Callable[[str], None]) -> None:
    os.set_blocking(fd, False)

    def readable() -> None:
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
            stop("lifeline closed")

    loop.add_reader(fd, readable)
