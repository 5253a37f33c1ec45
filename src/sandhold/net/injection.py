"""Putting real credential values back in place of their placeholders, per host, sans I/O.

Rules (F-CRED-3):
- Which placeholders apply is decided by the CONNECT target (or the absolute
  URI's host of a plain request), never by the ``Host`` header: a placeholder
  is replaced only on its own hosts (``injectHosts`` patterns, matched as
  ``allowedDomains`` entries are, ports ignored). Anywhere else it passes
  unchanged.
- Headers: every placeholder in a header value is replaced. The request
  target is left as sent.
- Bodies: replaced as they stream (``StreamSubstituter``: whole and byte by
  byte give the same output), unless the body has a ``Content-Encoding``
  (compressed bytes cannot hold a placeholder to find).
- Nothing here logs, and nothing renders a real value.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from collections.abc import Iterable, Sequence

    from sandhold.policy.placeholders import Injection


def _host_matches(patterns: Iterable[str], host: str) -> bool:
    from sandhold.policy.credentials import strip_port
    from sandhold.policy.domains import matches

    for pattern in patterns:
        try:
            if matches(strip_port(pattern), host):
                return True
        except ValueError:
            continue  # an entry that is no pattern injects nowhere
    return False


class Injector:
    """The placeholders of one run, looked up per destination host (cached)."""

    def __init__(self, injections: Sequence[Injection], max_hosts: int = 1024) -> None:
        self._injections = tuple(injections)
        self._cache: dict[str, dict[bytes, bytes]] = {}
        self._max_hosts = max_hosts

    def __bool__(self) -> bool:
        return bool(self._injections)

    def pairs_for(self, host: str) -> dict[bytes, bytes]:
        """placeholder -> real value, for the placeholders injected at ``host``."""
        host = host.lower().rstrip(".")
        found = self._cache.get(host)
        if found is None:
            found = {
                i.placeholder.encode(): i.real.encode()
                for i in self._injections
                if _host_matches(i.hosts, host)
            }
            if len(self._cache) >= self._max_hosts:
                self._cache.clear()  # bounded: a sandbox may name any number of hosts
            self._cache[host] = found
        return found

    def wants(self, host: str) -> bool:
        return bool(self.pairs_for(host))


def _pattern(pairs: dict[bytes, bytes]) -> re.Pattern[bytes]:
    import re

    # placeholders are never inside one another (placeholders module), so the
    # leftmost match is the only one
    return re.compile(b"|".join(re.escape(p) for p in pairs))


def substitute(data: bytes, pairs: dict[bytes, bytes]) -> bytes:
    """``data`` with every placeholder of ``pairs`` replaced."""
    if not pairs:
        return data
    return _pattern(pairs).sub(lambda m: pairs[m.group(0)], data)


def substitute_headers(
    headers: Iterable[tuple[bytes, bytes]], pairs: dict[bytes, bytes]
) -> list[tuple[bytes, bytes]]:
    if not pairs:
        return list(headers)
    sub = _pattern(pairs).sub  # compiled once for all the values

    def real(m: re.Match[bytes]) -> bytes:
        return pairs[m.group(0)]

    return [(name, sub(real, value)) for name, value in headers]


class StreamSubstituter:
    """Replaces placeholders in a stream fed in pieces; ``flush`` at its end.

    Holds back at most the longest placeholder's length minus one byte: a
    placeholder cut by a chunk boundary is still found.
    """

    def __init__(self, pairs: dict[bytes, bytes]) -> None:
        self._pairs = pairs
        self._re = _pattern(pairs) if pairs else None
        self._keep = max((len(p) for p in pairs), default=1) - 1
        self._carry = b""

    def feed(self, data: bytes) -> bytes:
        if self._re is None:
            return data
        buf = self._carry + data
        out: list[bytes] = []
        i = 0
        for m in self._re.finditer(buf):
            out.append(buf[i : m.start()])
            out.append(self._pairs[m.group(0)])
            i = m.end()
        # a match not yet complete can only start in the last ``keep`` bytes
        hold = max(i, len(buf) - self._keep)
        out.append(buf[i:hold])
        self._carry = buf[hold:]
        return b"".join(out)

    def flush(self) -> bytes:
        rest, self._carry = self._carry, b""
        return rest
