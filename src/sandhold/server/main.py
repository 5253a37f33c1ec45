"""``sandhold serve``: arguments, state dir, clients, the boot probe, sockets, uvicorn.

Rules:
- It listens on 127.0.0.1:7317 unless told otherwise; a ``--listen`` address
  that is not loopback is refused without ``--allow-remote``. ``--unix PATH``
  alone opens no TCP port; the socket is made 0600.
- The state dir (default ``$XDG_STATE_HOME/sandhold/server``, else
  ``~/.local/state/sandhold/server``) is made 0700 and must be the caller's
  own and not writable by others: it holds the token and every record.
- The first start makes a client ``default`` and writes its token to
  ``<state-dir>/token`` (0600, never overwritten in place, no symlink
  followed). ``--add-client NAME`` prints a new client's token alone on
  stdout (exit 2 if the name exists); a running server accepts it at once.
- It probes once and logs exactly one of the three boot lines; ``--sandbox``
  beats ``SANDHOLD_SANDBOX``.
- SIGTERM or SIGINT: every sandbox is destroyed before the process ends.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import secrets
import socket
import stat
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

log = logging.getLogger("sandhold.server")
DEFAULT_PORT = 7317


class ServeError(Exception):
    pass


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sandhold serve", description="the agent sandbox server")
    p.add_argument("--listen", metavar="HOST:PORT", help=f"TCP address (127.0.0.1:{DEFAULT_PORT})")
    p.add_argument("--unix", metavar="PATH", help="a unix socket to listen on (0600)")
    p.add_argument("--sandbox", choices=("on", "off"), help="the agent sandbox switch")
    p.add_argument("--state-dir", metavar="DIR", help="records, tokens and run checkouts")
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --listen")
    p.add_argument("--add-client", metavar="NAME", help="print a token for a new client")
    p.add_argument("--bwrap", metavar="PATH", help="the bubblewrap executable")
    p.add_argument(
        "--upstream-ca",
        metavar="FILE",
        action="append",
        default=[],
        help="a CA certificate file trusted (besides the system's) for upstreams a run's "
        "credentials are put back for (repeatable)",
    )
    p.add_argument(
        "--terminal-idle",
        type=float,
        default=1800.0,
        metavar="SECONDS",
        help="end a terminal idle this long (default 30 min)",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning"))
    return p.parse_args(list(argv))


def default_state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME", "")
    if not base.startswith("/"):
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "sandhold", "server")


def prepare_state_dir(path: str) -> str:
    path = os.path.abspath(path)
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ServeError(f"state dir {path} is not a directory (a symlink is refused)")
    if st.st_uid != os.getuid():
        raise ServeError(f"state dir {path} belongs to uid {st.st_uid}, not to you")
    if st.st_mode & 0o022:
        raise ServeError(
            f"state dir {path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): "
            "chmod 700 it"
        )
    os.makedirs(os.path.join(path, "runs"), mode=0o700, exist_ok=True)
    return os.path.realpath(path)


def new_token() -> str:
    return f"shd_{secrets.token_urlsafe(32)}"


def write_token(path: str, token: str) -> None:
    tmp = f"{path}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)


def parse_listen(value: str, allow_remote: bool) -> tuple[str, int]:
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ServeError(f"--listen {value!r}: give HOST:PORT (e.g. 127.0.0.1:{DEFAULT_PORT})")
    host = host.strip("[]") or "127.0.0.1"
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ServeError(f"--listen {value!r}: the host must be an IP address") from None
    if not ip.is_loopback and not allow_remote:
        raise ServeError(
            f"--listen {value!r} is not a loopback address: anyone who can reach it could "
            "try tokens; pass --allow-remote to mean it"
        )
    return host, int(port_text)


def command_rules(state_dir: str) -> Any:
    """The command policy: ``<state-dir>/command-policy.json`` if there, else the defaults."""
    import json

    from sandhold.policy.commands import DEFAULT_RULES, CommandRules

    path = os.path.join(state_dir, "command-policy.json")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return DEFAULT_RULES
    except (OSError, ValueError) as exc:
        raise ServeError(f"{path}: cannot be read as JSON: {exc}") from None
    try:
        rules = CommandRules.from_json(data)
    except ValueError as exc:
        raise ServeError(f"{path}: {exc}") from None
    log.info("command policy from %s", path)
    return rules


def boot_line(switch: str, probe: Any) -> str:
    if switch == "off":
        return "agent sandbox DISABLED by --sandbox off"
    if probe.available:
        return f"agent sandbox ON ({probe.note})"
    return f"no OS-native agent sandbox on this host ({probe.hint or probe.note})"


def host_view(switch: str, probe: Any) -> dict[str, Any]:
    return {
        "sandbox": switch,
        "backends": {
            "native": {
                "available": bool(probe.available),
                "note": probe.note,
                "hint": probe.hint or "",
            },
            "microvm": {
                "available": False,
                "note": "sandhold has no microVM backend yet",
                "hint": "use 'native' (or 'none' for no isolation)",
            },
            "none": {
                "available": True,
                "note": "commands run on the host without isolation (environment scrubbed)",
                "hint": "",
            },
        },
    }


def add_client(state_dir: str, name: str) -> int:
    from sandhold.server.store import NameTaken, Store

    store = Store(os.path.join(state_dir, "state.db"))
    token = new_token()
    try:
        store.add_client(f"cl_{secrets.token_hex(8)}", name, token)
    except NameTaken:
        sys.stderr.write(f"sandhold serve: a client named {name!r} exists already\n")
        return 2
    finally:
        store.close()
    sys.stdout.write(token + "\n")
    return 0


def main(argv: Sequence[str]) -> int:
    try:
        args = parse(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(message)s",
    )
    try:
        return serve(args)
    except ServeError as exc:
        sys.stderr.write(f"sandhold serve: {exc}\n")
        return 2


def serve(args: argparse.Namespace) -> int:
    state_dir = prepare_state_dir(args.state_dir or default_state_dir())
    if args.add_client is not None:
        return add_client(state_dir, args.add_client)
    switch = args.sandbox or os.environ.get("SANDHOLD_SANDBOX", "on").strip().lower() or "on"
    if switch not in ("on", "off"):
        raise ServeError(f"SANDHOLD_SANDBOX must be 'on' or 'off', not {switch!r}")
    listen = None
    if args.listen is not None or args.unix is None:
        listen = parse_listen(args.listen or f"127.0.0.1:{DEFAULT_PORT}", args.allow_remote)

    from sandhold.server.store import Store

    store = Store(os.path.join(state_dir, "state.db"))
    if store.client_count() == 0:
        token = new_token()
        store.add_client(f"cl_{secrets.token_hex(8)}", "default", token)
        write_token(os.path.join(state_dir, "token"), token)
        log.info("made client 'default'; its token is in %s", os.path.join(state_dir, "token"))

    from sandhold.probe import full_probe

    probe = full_probe(args.bwrap)
    log.info(boot_line(switch, probe))

    sockets: list[socket.socket] = []
    allowed: set[str] = set()
    if listen is not None:
        host, port = listen
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP by name: asyncio sets TCP_NODELAY only on sockets that say so,
        # and without it every response waits ~40 ms on the client's delayed ACK
        tcp = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            tcp.bind((host, port))
        except OSError as exc:
            raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        tcp.listen(128)
        port = tcp.getsockname()[1]
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        allowed |= {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"{shown}:{port}"}
        sockets.append(tcp)
        log.info("listening on http://%s:%d", shown, port)
    if args.unix is not None:
        path = os.path.abspath(args.unix)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            unix.bind(path)
        except OSError as exc:
            raise ServeError(f"cannot listen on {path}: {exc.strerror}") from None
        finally:
            os.umask(old)
        unix.listen(128)
        sockets.append(unix)
        log.info("listening on unix:%s", path)

    from sandhold.policy.dispatch import HostOffer
    from sandhold.port import SandboxPort
    from sandhold.server.app import Server, build_app
    from sandhold.server.runs import RunManager

    offer = HostOffer(
        native_available=bool(probe.available),
        native_note=probe.note,
        native_hint=probe.hint or "",
        switch=switch,
    )
    port_obj = SandboxPort(sandbox="on" if switch == "on" else "off", bwrap=args.bwrap)
    cas = tuple(os.path.abspath(p) for p in args.upstream_ca)
    for ca in cas:
        if not os.path.isfile(ca):
            raise ServeError(f"--upstream-ca {ca}: not a file")
    runs = RunManager(
        store, state_dir, offer, port_obj, rules=command_rules(state_dir), upstream_cas=cas
    )
    from sandhold.server.terminals import TerminalManager

    if args.terminal_idle <= 0:
        raise ServeError("--terminal-idle must be a positive number of seconds")
    terminals = TerminalManager(
        native=bool(probe.available) and switch == "on",
        native_why="the agent sandbox is DISABLED (--sandbox off)"
        if switch == "off"
        else f"{probe.note}{'; ' + probe.hint if probe.hint else ''}",
        idle_timeout=args.terminal_idle,
        bwrap=args.bwrap,
    )
    server = Server(runs, host_view(switch, probe), state_dir, terminals)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        await port_obj.__aenter__()
        runs.recover()
        terminals.start()
        try:
            yield
        finally:
            await terminals.shutdown()
            await runs.shutdown()
            await port_obj.aclose()
            log.info("stopped: every sandbox is destroyed")

    app = build_app(server, allowed, lifespan=lifespan)
    import uvicorn

    config = uvicorn.Config(
        app,
        lifespan="on",
        log_level="warning",
        access_log=False,
        ws="websockets-sansio",
        # a terminal's output over loopback: compression only costs CPU (with it the
        # stream ran at 55 MB/s, without 60-100, bench/terminal.py)
        ws_per_message_deflate=False,
        # httptools (llhttp) parses a request in a fraction of h11's time; the loop is
        # named, so an installed uvloop never changes how the port's processes are run
        http="httptools",
        loop="asyncio",
        timeout_graceful_shutdown=3,
        server_header=False,
    )
    uvicorn.Server(config).run(sockets=sockets)
    store.close()
    return 0
