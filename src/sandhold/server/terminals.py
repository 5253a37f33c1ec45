"""Hosted terminals: a shell on a real PTY, on the host (``none``) or sandboxed (``native``).

Rules:
- ``none`` is the host shell, shown as such. ``native`` runs the shell under
  the fixed terminal profile through the CLI's own pipeline (``sandhold -s
  <profile> -- shell``): the home and the working directory writable, nothing
  else (a private ``$TMPDIR``), the network open to every domain through the
  session's proxies with the resolved-address guard (no host loopback
  services), the secret locations of the home unreadable, everything in its
  own PID namespace. A host without native wrapping gets a 4xx: never a host
  shell with a native badge.
- The shell is the session leader of its PTY (job control, SIGWINCH on
  resize). Deleting the terminal ends every process of it: the native
  sandbox's PID namespace dies with its CLI; on the host, the shell's tree and
  every process still carrying the terminal's marker variable (double-forked and
  ``setsid`` ones included, unless they cleared their environment: ``none``
  is no isolation) are killed.
- The WebSocket needs a single-use ticket (``?ticket=``, at most 30 s old) or
  the bearer token in ``Authorization``; an ``Origin`` other than the server's
  own is refused. Binary frames are PTY bytes both ways, text frames JSON
  control (``resize`` in, ``exit`` out); a malformed control frame is refused
  with a close and changes nothing.
- Output made while no client is attached is kept (the last 1 MiB) and
  replayed on attach. A terminal idle (no input, no output) longer than the
  idle timeout ends; the server's shutdown ends them all. Terminals are not
  restored after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import pwd
import secrets
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time
from dataclasses import dataclass, field
from typing import Any

from sandhold.server.runs import ServerError, not_found

log = logging.getLogger("sandhold.server")

REPLAY = 1024 * 1024
# an attached client's unsent output past which the PTY is not read (the program
# then blocks on a full PTY) until every client is below it again
OUTBOX_HIGH = 4 * 1024 * 1024
# the largest binary frame: WebSocket clients commonly refuse messages over 1 MiB
FRAME_MAX = 512 * 1024
TICKET_TTL = 30.0
MARKER = "SANDHOLD_TERMINAL"
MAX_COLS_ROWS = 1000
MAX_TERMINALS = 64  # per server: each holds a shell, a PTY and fds


def terminal_profile(home: str, cwd: str, bwrap: str | None = None) -> dict[str, Any]:
    """The settings of a native terminal (pure): see the module's rules."""
    from sandhold.policy.mandatory import SECRET_READ_DENY

    writable = [home] if cwd == home else [home, cwd]
    profile: dict[str, Any] = {
        "filesystem": {"allowWrite": writable, "denyRead": list(SECRET_READ_DENY)},
        "network": {"allowAllDomains": True},
    }
    if bwrap is not None:
        profile["bwrapPath"] = bwrap
    return profile


def set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


@dataclass
class Outbox:
    """One attached client's output not yet sent: one sender task per client keeps
    frames in order and memory bounded (see OUTBOX_HIGH)."""

    buf: bytearray = field(default_factory=bytearray)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    final: str | None = None  # a last text frame (the exit), then close
    task: asyncio.Task[None] | None = None


@dataclass
class Terminal:
    id: str
    client_id: str
    backend: str
    cwd: str
    cols: int
    rows: int
    argv: list[str]
    created: float = field(default_factory=time.time)
    proc: subprocess.Popen[bytes] | None = None
    master: int = -1
    pending: bytearray = field(default_factory=bytearray)  # output while detached
    clients: dict[Any, Outbox] = field(default_factory=dict)
    reading: bool = False  # the PTY's reader is on the loop
    eof: bool = False
    exit_code: int | None = None
    last_activity: float = field(default_factory=time.monotonic)
    profile_dir: str = ""
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    waiter: asyncio.Task[None] | None = None
    gone: asyncio.Future[None] | None = None  # the shell has exited (its pidfd said so)

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "backend": self.backend,
            "state": "running" if self.exit_code is None else "exited",
            "exit_code": self.exit_code,
            "cols": self.cols,
            "rows": self.rows,
            "cwd": self.cwd,
            "created": self.created,
        }


class TerminalManager:
    """Every terminal of this server (rules in the module doc)."""

    def __init__(self, *, native: bool, native_why: str, idle_timeout: float, bwrap: str | None):
        self.native = native
        self.native_why = native_why
        self.idle_timeout = idle_timeout
        self.bwrap = bwrap
        self.terminals: dict[str, Terminal] = {}
        self.tickets: dict[str, tuple[str, str, float]] = {}  # ticket -> (client, id, expiry)
        self._reaper: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self._reaper = asyncio.get_running_loop().create_task(self._reap_idle())

    async def shutdown(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        await asyncio.gather(*(self._end(t) for t in list(self.terminals.values())))

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(min(30.0, max(self.idle_timeout / 4, 0.2)))
            now = time.monotonic()
            for term in list(self.terminals.values()):
                if term.exit_code is None and now - term.last_activity > self.idle_timeout:
                    log.info("terminal %s idle for %.0f s: ended", term.id, self.idle_timeout)
                    await self._end(term)

    # -- the API -----------------------------------------------------------------------

    def get(self, client_id: str, term_id: str) -> Terminal:
        term = self.terminals.get(term_id)
        if term is None or term.client_id != client_id:
            raise not_found("terminal", term_id)
        return term

    def list(self, client_id: str) -> list[dict[str, Any]]:
        return [t.view() for t in self.terminals.values() if t.client_id == client_id]

    async def create(self, client_id: str, body: dict[str, Any]) -> dict[str, Any]:
        backend = body.get("backend") or "none"
        live = sum(1 for x in self.terminals.values() if x.exit_code is None)
        if live >= MAX_TERMINALS:
            raise ServerError(
                409,
                "too_many_terminals",
                f"{live} terminals are open (at most {MAX_TERMINALS}): delete one first",
            )
        if backend == "native" and not self.native:
            raise ServerError(
                400,
                "backend_unavailable",
                f"a native terminal is not available on this host: {self.native_why}",
            )
        from sandhold.port.facts import host_home

        home = host_home()  # $HOME, as the CLI and the port read it
        cwd = body.get("cwd") or home
        if not os.path.isdir(cwd):
            raise ServerError(400, "invalid_body", f"cwd {cwd!r} is not a directory")
        shell = body.get("shell") or [
            os.environ.get("SHELL") or pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
        ]
        term = Terminal(
            id=f"term_{secrets.token_hex(8)}",
            client_id=client_id,
            backend=backend,
            cwd=cwd,
            cols=body["cols"],
            rows=body["rows"],
            argv=list(shell),
        )
        await asyncio.to_thread(self._spawn, term, home)
        self.terminals[term.id] = term
        loop = asyncio.get_running_loop()
        self._read_on(term)
        # a pidfd, not a thread blocked in wait(): a thread per terminal would use up
        # the loop's default executor, which the port's freeze and thaw need
        assert term.proc is not None
        pidfd = os.pidfd_open(term.proc.pid)
        term.gone = loop.create_future()

        def exited() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            if term.gone is not None and not term.gone.done():
                term.gone.set_result(None)

        loop.add_reader(pidfd, exited)
        # the shell's end, not the PTY's EOF, ends the terminal: a background job
        # left behind holds the PTY open
        term.waiter = loop.create_task(self._exited(term))
        return term.view()

    def _spawn(self, term: Terminal, home: str) -> None:
        argv = list(term.argv)
        env = _terminal_env(term, home)
        if term.backend == "native":
            term.profile_dir = tempfile.mkdtemp(prefix="sandhold-term-")
            settings = os.path.join(term.profile_dir, "settings.json")
            with open(settings, "w", encoding="utf-8") as f:
                json.dump(terminal_profile(home, term.cwd, self.bwrap), f)
            argv = [sys.executable, "-P", "-m", "sandhold", "-q", "-s", settings, "--", *argv]
        master, slave = os.openpty()
        set_size(slave, term.cols, term.rows)
        os.set_blocking(master, False)
        try:
            term.proc = subprocess.Popen(
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=term.cwd,
                env=env,
                start_new_session=True,
                preexec_fn=_controlling_tty,  # noqa: PLW1509 - one ioctl, nothing else
                close_fds=True,
            )
        except OSError as exc:
            os.close(master)
            raise ServerError(400, "spawn_failed", f"the shell did not start: {exc}") from None
        finally:
            os.close(slave)
        term.master = master

    def _read_on(self, term: Terminal) -> None:
        if not term.reading and not term.eof and term.master >= 0:
            asyncio.get_running_loop().add_reader(term.master, self._readable, term)
            term.reading = True

    def _read_off(self, term: Terminal) -> None:
        if term.reading:
            asyncio.get_running_loop().remove_reader(term.master)
            term.reading = False

    def _maybe_read_on(self, term: Terminal) -> None:
        if all(len(box.buf) < OUTBOX_HIGH for box in term.clients.values()):
            self._read_on(term)

    def _readable(self, term: Terminal) -> None:
        # what is there, up to 1 MiB, in one frame: a frame per 64 KiB read costs
        # the stream half its throughput
        chunks: list[bytes] = []
        size, eof = 0, False
        while size < REPLAY:
            try:
                chunk = os.read(term.master, 65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                eof = True
                break
            chunks.append(chunk)
            size += len(chunk)
        if eof:
            self._read_off(term)
            term.eof = True
        data = b"".join(chunks)
        if not data:
            return
        term.last_activity = time.monotonic()
        if term.clients:
            for box in term.clients.values():
                box.buf += data
                box.wake.set()
                if len(box.buf) >= OUTBOX_HIGH:
                    self._read_off(term)
        else:
            term.pending += data
            if len(term.pending) > REPLAY:
                del term.pending[: len(term.pending) - REPLAY]

    async def _exited(self, term: Terminal) -> None:
        proc = term.proc
        if proc is not None and term.gone is not None:
            await term.gone
            code = proc.wait()  # it has exited: this reaps it at once
            term.exit_code = code if code >= 0 else 128 - code
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGHUP)  # what the shell left in its group
        await asyncio.sleep(0.05)  # the last output still in the PTY
        if term.master >= 0:
            self._readable(term)
        self._kill_rest(term)
        term.ended.set()
        for box in term.clients.values():
            box.final = json.dumps({"type": "exit", "exit_code": term.exit_code})
            box.wake.set()

    async def delete(self, client_id: str, term_id: str) -> dict[str, Any]:
        term = self.get(client_id, term_id)
        await self._end(term)
        self.terminals.pop(term.id, None)
        return term.view()

    async def _end(self, term: Terminal) -> None:
        proc = term.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGHUP)
            try:
                await asyncio.wait_for(asyncio.shield(term.ended.wait()), 2)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        self._kill_rest(term)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(term.ended.wait(), 5)
        if term.master >= 0:
            with contextlib.suppress(ValueError, OSError):
                self._read_off(term)
            term.eof = True  # nothing may turn the reader of a closed fd back on
            with contextlib.suppress(OSError):
                os.close(term.master)
            term.master = -1
        if term.profile_dir:
            import shutil

            shutil.rmtree(term.profile_dir, ignore_errors=True)
        if term.exit_code is None:
            term.exit_code = 128 + signal.SIGHUP

    def _kill_rest(self, term: Terminal) -> None:
        """Every process still marked as the terminal's (double-forked, ``setsid``)."""
        me = os.getpid()
        for _ in range(5):
            found = [p for p in _marked(f"{MARKER}={term.id}".encode()) if p != me]
            if not found:
                return
            for pid in found:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    # -- tickets and the stream --------------------------------------------------------

    def ticket(self, client_id: str, term_id: str) -> dict[str, Any]:
        self.get(client_id, term_id)
        now = time.monotonic()
        for t, (_, _, expiry) in list(self.tickets.items()):
            if expiry < now:
                del self.tickets[t]
        ticket = secrets.token_urlsafe(32)
        self.tickets[ticket] = (client_id, term_id, now + TICKET_TTL)
        return {"ticket": ticket, "expires_in": int(TICKET_TTL)}

    def redeem(self, ticket: str, term_id: str) -> str | None:
        """The client a ticket was given to, if it is for this terminal and fresh; it is
        spent either way."""
        found = self.tickets.pop(ticket, None)
        if found is None:
            return None
        client_id, for_term, expiry = found
        if for_term != term_id or expiry < time.monotonic():
            return None
        return client_id

    async def stream(self, ws: Any, term: Terminal) -> None:
        """Serve an accepted WebSocket for ``term`` until either side ends."""
        if term.exit_code is not None:
            if term.pending:
                await ws.send_bytes(bytes(term.pending))
            await ws.send_text(json.dumps({"type": "exit", "exit_code": term.exit_code}))
            await ws.close(1000)
            return
        # the replay goes out through the client's sender, attached before any await:
        # output made while it is sent joins the same backlog, in order, none left behind
        box = Outbox(buf=term.pending, wake=asyncio.Event())
        term.pending = bytearray()
        box.wake.set()
        box.task = asyncio.get_running_loop().create_task(self._sender(ws, term, box))
        term.clients[ws] = box
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("bytes") is not None:
                    term.last_activity = time.monotonic()
                    await _write_all(term.master, message["bytes"])
                elif message.get("text") is not None:
                    problem = self._control(term, message["text"])
                    if problem is not None:
                        await ws.close(1003, problem[:120])
                        return
        except Exception as exc:
            if type(exc).__name__ not in ("WebSocketDisconnect", "ClientDisconnected"):
                raise
        finally:
            self._detach(term, ws)

    def _detach(self, term: Terminal, ws: Any) -> None:
        box = term.clients.pop(ws, None)
        if box is not None and box.task is not None and box.task is not asyncio.current_task():
            box.task.cancel()
        self._maybe_read_on(term)  # a client gone is no reason to hold the PTY

    async def _sender(self, ws: Any, term: Terminal, box: Outbox) -> None:
        try:
            while True:
                await box.wake.wait()
                box.wake.clear()
                while box.buf:
                    data = bytes(box.buf[:FRAME_MAX])
                    del box.buf[:FRAME_MAX]
                    self._maybe_read_on(term)
                    await ws.send_bytes(data)
                if box.final is not None:
                    await ws.send_text(box.final)
                    await ws.close(1000)
                    return
        except asyncio.CancelledError:
            raise
        except Exception:
            self._detach(term, ws)  # the connection is gone: its output is not kept

    def _control(self, term: Terminal, text: str) -> str | None:
        try:
            msg = json.loads(text)
        except ValueError:
            return "a control frame is one JSON object"
        if (
            not isinstance(msg, dict)
            or msg.get("type") != "resize"
            or set(msg)
            != {
                "type",
                "cols",
                "rows",
            }
        ):
            return 'the only control frame is {"type": "resize", "cols", "rows"}'
        cols, rows = msg["cols"], msg["rows"]
        if not all(type(v) is int and 1 <= v <= MAX_COLS_ROWS for v in (cols, rows)):
            return f"cols and rows are integers from 1 to {MAX_COLS_ROWS}"
        term.cols, term.rows = cols, rows
        if term.master >= 0:
            set_size(term.master, cols, rows)  # the kernel sends the PTY's group SIGWINCH
        return None


def _controlling_tty() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


async def _write_all(fd: int, data: bytes) -> None:
    """Keystrokes into the PTY; a full input queue (a program not reading) waits here,
    in this connection's task, never in a thread."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            await asyncio.sleep(0.005)
            continue
        view = view[n:]


def _terminal_env(term: Terminal, home: str) -> dict[str, str]:
    from sandhold.policy.env import filter_environment

    env = dict(filter_environment(os.environ).as_mapping())
    env.update(TERM="xterm-256color", HOME=home, **{MARKER: term.id})
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    return env


def _marked(marker: bytes) -> list[int]:
    from sandhold.backends.linux import procfs

    uid = os.getuid()
    return [p for p in procfs.pids() if procfs.owner(p) == uid and marker in procfs.environ(p)]
