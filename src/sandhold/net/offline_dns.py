"""A run with the network off: its DNS lookups answered REFUSED at once, their names kept.

Rules (issue 15):
- The socket is bound at 127.0.0.1:53 in the sandbox's own network namespace
  (``backends.linux.offline``) and read here, on the host side, by one thread: no
  process of sandhold's runs in the namespace. Every query gets ``REFUSED`` as soon
  as it is read (``dns.parse_query``, the transparent stub's sans-I/O reader), so a
  lookup fails at once instead of waiting out the resolver's timeouts; what cannot be
  parsed gets what ``dns`` answers for it, or nothing.
- The names are kept, in order, at most ``MAX_NAMES`` of them, and each before its
  answer is sent: a name whose refusal the sandbox saw is in ``names``. What is no
  printable ASCII in a name is escaped (``shown_name``): the sandbox chooses the
  bytes, the user's terminal shows them.
- Nothing is imported until the first datagram: a run that looks up nothing pays
  for one thread only.
"""

from __future__ import annotations

import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    import _socket

MAX_NAMES = 64
_STOP = b"sandhold: stop"


def shown_name(name: str) -> str:
    """``name`` as the run's line prints it: what is no printable ASCII (a terminal's
    escape sequence the sandbox put in a label) written as ``\\xNN``.

    >>> shown_name("ex\x1b[2Jample.com")
    'ex\\x1b[2Jample.com'
    """
    return "".join(c if " " < c < "\x7f" else f"\\x{ord(c):02x}" for c in name)


class OfflineDns:
    """Answers one sandbox's DNS queries (module rules). ``start``, then ``stop``."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.names: list[str] = []
        self._thread = threading.Thread(target=self._serve, name="sandhold-dns", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait: float = 1.0) -> list[str]:
        """Stop serving (the socket's own address wakes the thread: it lies in the
        sandbox's namespace, which only the socket still reaches); the names asked."""
        try:
            self.sock.sendto(_STOP, self.sock.getsockname())
            self._thread.join(wait)
        except OSError:
            pass  # the names read so far are all there is to say
        self.sock.close()
        return list(self.names)

    def _serve(self) -> None:
        own = self.sock.getsockname()
        while True:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            if peer == own and data == _STOP:
                return
            from sandhold.net import dns  # at the first datagram: module rules

            try:
                query = dns.parse_query(data)
            except dns.NoReply:
                continue
            except dns.DnsError as exc:
                reply = dns.error_answer(exc)
            else:
                name = shown_name(query.name)
                if name and name not in self.names and len(self.names) < MAX_NAMES:
                    self.names.append(name)
                reply = dns.answer(query, dns.REFUSED)
            try:
                self.sock.sendto(reply, peer)
            except OSError:
                pass  # the asker is gone; the next query is served as usual
