"""Move bytes both ways between two connected sockets until both are done, losing none.

Rules:
- Byte-exact and in order. A direction reads from its source only once all it
  read before has been written to its destination, so each direction holds at
  most one chunk and a slow reader slows the sender down through TCP (bounded
  memory, real backpressure).
- Half-close passes through: a source's EOF becomes ``shutdown(SHUT_WR)`` on the
  destination, after everything read before it has been written; the other
  direction carries on.
- Half-closed is bounded: once one direction has carried its EOF, the other
  may go ``half_closed_timeout`` seconds without moving a byte (read or
  written); then the tunnel is aborted as a failure (``TimeoutError``). A
  client that has gone away cannot keep a silent upstream, and its two fds, forever.
- Closing: when both directions have carried their EOF, both sockets are closed
  normally. Every byte is in the kernel by then and nothing is left unread, so no
  RST can throw a tail away (the reference proxy closes the client when the
  upstream closes, and loses the end of downloads). When either side fails
  (reset, broken pipe) or the relay is cancelled, both sockets are aborted with
  RST (``SO_LINGER`` 0): a cut transfer never looks complete to either peer.
- ``Relayer.relay`` owns both sockets from the call on. A ``Relayer`` belongs to
  one event loop.

How the bytes move, and why. The relay uses the loop's readiness callbacks
(``add_reader``/``add_writer``) on the raw sockets, not streams or transports,
and on Linux moves data with ``os.splice`` through a pipe, so payload never
enters Python. Prototype relays measured on a 2-core VM (a 1 GiB download
through a separate relay process, both ends Python, median of 5; direct
loopback about 4.5 GB/s): asyncio streams 0.6-1.2 GB/s, protocols with
pause/resume 1.8-2.0 GB/s, ``recv_into`` a buffer plus ``send`` 1.9 GB/s,
``splice`` 2.0-2.3 GB/s. All but streams sit near the 2-core ceiling (three busy
processes on two cores), so what decides is the CPU left to the endpoints: per
GiB the splice relay spent 0.27 s of CPU, protocols 0.42 s, ``recv_into`` 0.51 s.
This relay, in ``bench/proxy.py``: 2.0-2.3 GB/s through a CONNECT tunnel, 0.46-0.59
of direct across quiet runs, 0.29 CPU s/GiB (srt's proxy: 1.2-1.3 GB/s, 0.26-0.31
of direct, 0.7-0.9 CPU s/GiB). Throughput on the shared 2-core machine does not
tell pipe sizes, rounds per wake-up or Nagle apart; the relay's CPU does (a 512
MiB download through an in-process relay, 7 rounds, issue 20): perf puts 88% of
it in the kernel's TCP stack inside ``splice`` and about 11% in Python, and per
GiB 256 KiB pipes took 0.35-0.41 CPU s, 512 KiB 0.27-0.32 s, 1 MiB 0.24-0.29 s
(``bench/proxy.py``, three interleaved pairs: 0.40-0.44 against 0.26-0.32 CPU
s/GiB, and the same throughput, 0.39-0.54 of direct either way).
So a round moves up to 1 MiB, and a wake-up at most ``BURST`` (4 MiB, what 16
rounds of 256 KiB moved before, so other tunnels wait no longer; 16 MiB saved
another 5-10%). The copy path keeps its 256 KiB buffer, which bounds what a
blocked direction holds in Python memory. A blocking splice relay with a thread
per direction took 0.23-0.28 CPU s/GiB in the same harness: the event loop costs
this relay 10-20% at most, not worth two threads per tunnel.

A pipe is held by a direction only while bytes wait in it (the destination is
full); otherwise it goes back to a small pool, so idle tunnels cost no pipe and
no file descriptors, and the per-user pipe-page budget of an unprivileged
sandhold is spent only on transfers actually under backpressure. A 1 MiB pipe
counts 256 pages there (``fs.pipe-user-pages-soft``, 16384 by default: 64 such
pipes for all of the user's processes); past it a new pipe keeps the kernel's
two pages, which is slower, never wrong, and the pool keeps only two spares per
``Relayer`` (a round takes one and gives it back). Where
``os.splice`` is missing (macOS), refused for a socket type, or no pipe can be
had (file descriptors exhausted), the copy path reads into one scratch buffer
shared by every tunnel of the ``Relayer`` and keeps only an unsent remainder per
blocked direction.

Cancellation: cancelling ``relay`` aborts both sockets (RST), closes any pipe
still holding bytes, and re-raises ``CancelledError``; no callback stays
registered.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import struct

from sandhold._record import record

log = logging.getLogger("sandhold.net")

SPLICE_AVAILABLE = hasattr(os, "splice") and hasattr(os, "pipe2")
# the pipe size asked for (the most an unprivileged process may ask, fs.pipe-max-size):
# a round moves up to this much with two splices
CHUNK = 1024 * 1024
# the copy path's buffer, and so the most a blocked direction keeps in Python memory
COPY_CHUNK = 256 * 1024
BURST = 4 * 1024 * 1024  # bytes a direction moves per wake-up before other tunnels run
_LINGER_RST = struct.pack("ii", 1, 0)
HALF_CLOSED_TIMEOUT = 60.0  # seconds a half-closed tunnel may stay idle (default)
if SPLICE_AVAILABLE:
    _SPLICE_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
    import fcntl

    _F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
    _F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)


@record
class RelayResult:
    """How a relay ended: bytes carried each way, and the error that cut it, if any.

    ``error`` is ``None`` when both sides closed cleanly; an ``OSError`` when a
    side reset or went away; ``CancelledError`` is raised, not returned.
    """

    a_to_b: int
    b_to_a: int
    error: BaseException | None = None


def abort(sock: socket.socket) -> None:
    """Close ``sock`` with RST instead of FIN, so the peer sees the cut as an error."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    except OSError:
        pass  # not connected any more, or not TCP: a plain close is all there is
    sock.close()


class _Pipe:
    __slots__ = ("r", "size", "w")

    def __init__(self, r: int, w: int, size: int) -> None:
        self.r, self.w, self.size = r, w, size

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


class Relayer:
    """Runs relays on one event loop, and owns what they share: spare pipes and a scratch buffer.

    Args:
        splice: use ``os.splice`` (Linux); ``None`` picks it where available.
        chunk: the pipe size asked for, and the copy path's buffer up to
            ``COPY_CHUNK``.
        spare_pipes: empty pipes kept for reuse (a round takes one and gives it
            back; only a direction whose destination is full keeps one).
        half_closed_timeout: seconds a half-closed tunnel may stay idle (module
            rules); ``None``: ``HALF_CLOSED_TIMEOUT``.

    Raises:
        ValueError: ``splice=True`` where ``os.splice`` does not exist.
    """

    def __init__(
        self,
        *,
        splice: bool | None = None,
        chunk: int = CHUNK,
        spare_pipes: int = 2,
        half_closed_timeout: float | None = None,
    ) -> None:
        if splice and not SPLICE_AVAILABLE:
            raise ValueError("os.splice is not available on this platform")
        self.splice = SPLICE_AVAILABLE if splice is None else splice
        self.half_closed_timeout = (
            HALF_CLOSED_TIMEOUT if half_closed_timeout is None else half_closed_timeout
        )
        self.chunk = chunk
        self.copy_chunk = min(chunk, COPY_CHUNK)
        # rounds per wake-up (module docstring), for each path
        self.rounds = max(1, BURST // chunk)
        self.copy_rounds = max(1, BURST // self.copy_chunk)
        self._spare_max = spare_pipes
        self._spare: list[_Pipe] = []
        self._scratch: memoryview | None = None
        self._closed = False

    async def relay(
        self,
        a: socket.socket,
        b: socket.socket,
        *,
        first_a_to_b: bytes = b"",
        first_b_to_a: bytes = b"",
    ) -> RelayResult:
        """Relay between connected sockets ``a`` and ``b`` until both are done (module rules).

        ``first_a_to_b`` and ``first_b_to_a`` are sent before anything read from
        the other side (a forwarded request head, bytes a client sent early).

        Returns:
            The bytes carried each way and the error that ended the relay, if any.
            Both sockets are closed on return.

        Cancellation: both sockets are aborted (RST) and ``CancelledError`` is
        re-raised.
        """
        loop = asyncio.get_running_loop()
        tunnel = _Tunnel(self, loop, a, b, first_ab=first_a_to_b, first_ba=first_b_to_a)
        tunnel.start()
        try:
            return await tunnel.future
        except asyncio.CancelledError:
            tunnel.finish(None, cancelled=True)
            raise

    def close(self) -> None:
        """Close the spare pipes; pipes held by live relays close when those end. Idempotent."""
        self._closed = True
        while self._spare:
            self._spare.pop().close()

    # -- shared resources ------------------------------------------------------------

    def _scratch_buffer(self) -> memoryview:
        if self._scratch is None:
            self._scratch = memoryview(bytearray(self.copy_chunk))
        return self._scratch

    def _take_pipe(self) -> _Pipe | None:
        if self._spare:
            return self._spare.pop()
        try:
            r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:  # out of fds: this round goes by the copy path
            log.debug("relay: no pipe (%s); copying instead", exc)
            return None
        try:
            size = fcntl.fcntl(w, _F_SETPIPE_SZ, self.chunk)
        except OSError:
            # over the user's pipe-page budget (unprivileged): a smaller pipe is
            # slower, never wrong
            size = fcntl.fcntl(w, _F_GETPIPE_SZ)
        return _Pipe(r, w, size)

    def _give_pipe(self, pipe: _Pipe) -> None:
        """Return a pipe known to be empty."""
        if self._closed or len(self._spare) >= self._spare_max:
            pipe.close()
        else:
            self._spare.append(pipe)


class _Tunnel:
    """Two directions over one pair of sockets, and how the pair ends."""

    __slots__ = ("a", "ab", "b", "ba", "finished", "future", "idle", "loop", "relayer")

    def __init__(
        self,
        relayer: Relayer,
        loop: asyncio.AbstractEventLoop,
        a: socket.socket,
        b: socket.socket,
        *,
        first_ab: bytes,
        first_ba: bytes,
    ) -> None:
        a.setblocking(False)
        b.setblocking(False)
        self.relayer, self.loop, self.a, self.b = relayer, loop, a, b
        self.future: asyncio.Future[RelayResult] = loop.create_future()
        self.finished = False
        self.idle: asyncio.TimerHandle | None = None  # the half-closed watch
        self.ab = _Direction(self, a, b, first_ab)
        self.ba = _Direction(self, b, a, first_ba)

    def start(self) -> None:
        self.ab.start()
        if not self.finished:
            self.ba.start()

    def direction_done(self) -> None:
        if self.ab.done and self.ba.done:
            self.finish(None)
        elif self.idle is None and not self.finished:
            self._watch_half_closed(None)

    def _watch_half_closed(self, before: tuple[int, int, int] | None) -> None:
        """Abort if the open direction did nothing for a whole period (module rules)."""
        if self.finished:
            return
        live = self.ba if self.ab.done else self.ab
        now = live.progress()
        if now == before:
            timeout = self.relayer.half_closed_timeout
            self.finish(TimeoutError(f"half-closed tunnel idle for {timeout:g} s"))
            return
        self.idle = self.loop.call_later(
            self.relayer.half_closed_timeout, self._watch_half_closed, now
        )

    def finish(self, error: BaseException | None, *, cancelled: bool = False) -> None:
        if self.finished:
            return
        self.finished = True
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        # unregister before closing: the loop keys callbacks by fd number, and a
        # closed number is soon reused by another socket
        self.ab.stop()
        self.ba.stop()
        clean = error is None and not cancelled
        for sock in (self.a, self.b):
            if clean:
                sock.close()
            else:
                abort(sock)
        if error is not None and not isinstance(error, OSError):
            log.error("relay: bug, connection aborted", exc_info=error)
        if not self.future.done():
            self.future.set_result(RelayResult(self.ab.moved, self.ba.moved, error))


class _Direction:
    """Bytes from ``src`` to ``dst``: reading, or waiting for ``dst`` to take what was read."""

    __slots__ = (
        "dfd",
        "done",
        "dst",
        "in_pipe",
        "moved",
        "pending",
        "pipe",
        "reading",
        "sfd",
        "splice",
        "src",
        "tunnel",
        "writing",
    )

    def __init__(self, tunnel: _Tunnel, src: socket.socket, dst: socket.socket, first: bytes):
        self.tunnel, self.src, self.dst = tunnel, src, dst
        self.sfd, self.dfd = src.fileno(), dst.fileno()
        self.splice = tunnel.relayer.splice
        self.pending: memoryview | None = memoryview(first) if first else None
        self.pipe: _Pipe | None = None  # held only while bytes wait in it
        self.in_pipe = 0
        self.moved = 0
        self.done = False
        self.reading = self.writing = False

    # -- registration: at most one of reader/writer at a time ---------------------

    def _want_read(self) -> None:
        loop = self.tunnel.loop
        if self.writing:
            loop.remove_writer(self.dfd)
            self.writing = False
        if not self.reading:
            loop.add_reader(self.sfd, self._on_readable)
            self.reading = True

    def _want_write(self) -> None:
        loop = self.tunnel.loop
        if self.reading:
            loop.remove_reader(self.sfd)
            self.reading = False
        if not self.writing:
            loop.add_writer(self.dfd, self._on_writable)
            self.writing = True

    def stop(self) -> None:
        loop = self.tunnel.loop
        if self.reading:
            loop.remove_reader(self.sfd)
            self.reading = False
        if self.writing:
            loop.remove_writer(self.dfd)
            self.writing = False
        if self.pipe is not None:  # bytes still in it: they die with the tunnel
            self.pipe.close()
            self.pipe = None

    def start(self) -> None:
        if self.pending is not None:
            self._on_writable()
        else:
            self._on_readable()

    def progress(self) -> tuple[int, int, int]:
        """Changes whenever a byte is read or written."""
        return (self.moved, self.in_pipe, len(self.pending) if self.pending is not None else 0)

    # -- callbacks -------------------------------------------------------------------

    def _on_readable(self) -> None:
        try:
            relayer = self.tunnel.relayer
            for _ in range(relayer.rounds if self.splice else relayer.copy_rounds):
                if not (self._round_splice() if self.splice else self._round_copy()):
                    return
            self._want_read()  # more may be waiting; come back after the others
        except Exception as exc:  # OSError: a side failed; anything else is a bug
            self.tunnel.finish(exc)

    def _on_writable(self) -> None:
        try:
            if self.pending is not None:
                try:
                    sent = self.dst.send(self.pending)
                except BlockingIOError:
                    sent = 0
                rest = self.pending[sent:]
                self.pending = rest if len(rest) else None
                if self.pending is not None:
                    self._want_write()
                    return
            if self.pipe is not None:
                self.in_pipe = _drain(self.pipe, self.dfd, self.in_pipe)
                if self.in_pipe:
                    self._want_write()
                    return
                self.tunnel.relayer._give_pipe(self.pipe)
                self.pipe = None
            self._on_readable()  # the source has likely more: read now, not a wake-up later
        except Exception as exc:
            self.tunnel.finish(exc)

    # -- one read, and as much of its write as the destination takes ------------

    def _round_splice(self) -> bool:
        """Move one chunk through a pipe; False when this wake-up is over."""
        relayer = self.tunnel.relayer
        pipe = relayer._take_pipe()
        if pipe is None:
            return self._round_copy()
        try:
            n = os.splice(self.sfd, pipe.w, pipe.size, flags=_SPLICE_FLAGS)
        except BlockingIOError:
            relayer._give_pipe(pipe)
            self._want_read()
            return False
        except OSError as exc:
            relayer._give_pipe(pipe)  # nothing entered it
            if exc.errno != errno.EINVAL:
                raise
            self.splice = False  # a socket type splice refuses: copy from now on
            return True
        if n == 0:
            relayer._give_pipe(pipe)
            self._eof()
            return False
        self.moved += n
        try:
            left = _drain(pipe, self.dfd, n)
        except BaseException:
            pipe.close()  # may hold bytes: never back to the pool
            raise
        if left:
            self.pipe, self.in_pipe = pipe, left
            self._want_write()
            return False
        relayer._give_pipe(pipe)
        return True

    def _round_copy(self) -> bool:
        """Move one chunk through the shared buffer; False when this wake-up is over."""
        buf = self.tunnel.relayer._scratch_buffer()
        try:
            n = self.src.recv_into(buf)
        except BlockingIOError:
            self._want_read()
            return False
        if n == 0:
            self._eof()
            return False
        self.moved += n
        try:
            sent = self.dst.send(buf[:n])
        except BlockingIOError:
            sent = 0
        if sent < n:
            self.pending = memoryview(bytes(buf[sent:n]))  # the buffer is shared: copy out
            self._want_write()
            return False
        return True

    def _eof(self) -> None:
        loop = self.tunnel.loop
        if self.reading:
            loop.remove_reader(self.sfd)
            self.reading = False
        self.done = True
        try:
            self.dst.shutdown(socket.SHUT_WR)
        except OSError as exc:
            # ENOTCONN: the destination is gone; the other direction reports how
            if exc.errno != errno.ENOTCONN:
                raise
        self.tunnel.direction_done()


def _drain(pipe: _Pipe, dfd: int, n: int) -> int:
    """Splice up to ``n`` bytes from ``pipe`` into ``dfd``; return how many are left."""
    while n:
        try:
            moved = os.splice(pipe.r, dfd, n, flags=_SPLICE_FLAGS)
        except BlockingIOError:
            return n
        if moved <= 0:
            raise OSError(errno.EIO, "splice moved nothing out of a non-empty pipe")
        n -= moved
    return 0
