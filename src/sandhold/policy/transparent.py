"""Transparent egress as a plan: the sandbox namespace's packet rules, and the synthetic names.

Rules (issue 20):
- Inside the sandbox's own network namespace every TCP connection to a
  non-loopback address (IPv4 and IPv6, v4-mapped included: those leave as IPv4)
  is redirected to the transparent listener at ``TRANSPARENT_PORT`` on
  loopback; every port-53 datagram or connection, to any address, loopback
  included, lands on the DNS stub at ``DNS_STUB_PORT``. Loopback otherwise
  stays loopback: the explicit proxies (3128, 1080) are reached as before, and
  a connection through them is decided there only, never twice.
- Every other datagram (and anything that is neither TCP nor UDP) to a
  non-loopback address is logged to NFLOG group ``NFLOG_GROUP`` and dropped in
  the output hook, so the sender's ``sendto``/``connect`` fails at once with
  ``EPERM``; the host reads the log and reports each as a violation. The
  output filter's policy is drop: a packet that escaped the redirect goes
  nowhere.
- The DNS stub answers a name only if ``name_decision`` allows it, with an
  address from ``SYNTHETIC_V4`` / ``SYNTHETIC_V6`` that stands for that one
  name (``SyntheticNames``): one name, one index, both families. Nothing is
  ever forwarded to a real resolver, so a query carries nothing out. The map
  is bounded (``MAX_NAMES``); past it, new names are refused, old ones kept.
- Nothing here touches the OS: the ruleset is text for ``nft``, and the map is
  a value the net/ code consults.
"""

from __future__ import annotations

import ipaddress

from sandhold.policy.domains import Decision, DomainPolicy, canonical_host, decide, split_port

TRANSPARENT_PORT = 3129
DNS_STUB_PORT = 53
NFLOG_GROUP = 20
SYNTHETIC_V4 = ipaddress.IPv4Network("198.18.0.0/15")  # RFC 2544 benchmarking: never routed
SYNTHETIC_V6 = ipaddress.IPv6Network("fd53:616e:6468::/64")  # ULA, "Sandh"
MAX_NAMES = 65_536  # per session; the v4 block has room for 131 070
TRANSPARENT = "transparent"  # the EgressDecision.proxy of the transparent listener
UDP = "udp"  # the EgressDecision.proxy of a refused datagram
_CANDIDATE_PORTS = (443, 80)
EXPLAIN = (
    "every TCP connection (IPv4 and IPv6) and DNS query, proxy variables or not, is decided"
    " by the same policy (DNS: synthetic addresses for allowed names, NXDOMAIN otherwise);"
    " other datagrams are refused with EPERM"
)


def nft_ruleset(
    transparent_port: int = TRANSPARENT_PORT,
    dns_port: int = DNS_STUB_PORT,
    nflog_group: int = NFLOG_GROUP,
    *,
    ipv6: bool = True,
) -> str:
    """The ``nft -f`` text for the sandbox's namespace (module rules)."""
    v6 = ipv6
    lines = [
        "table inet sandhold {",
        "  chain divert {",
        "    type nat hook output priority -100; policy accept;",
        f"    meta l4proto {{ tcp, udp }} th dport 53 redirect to :{dns_port}",
        "    ip daddr 127.0.0.0/8 accept",
        "    ip6 daddr ::1 accept" if v6 else "",
        f"    meta l4proto tcp redirect to :{transparent_port}",
        "  }",
        "  chain guard {",
        "    type filter hook output priority 0; policy drop;",
        "    ip daddr 127.0.0.0/8 accept",
        "    ip6 daddr ::1 accept" if v6 else "",
        f"    log group {nflog_group} drop",
        "  }",
        "}",
    ]
    return "\n".join(line for line in lines if line) + "\n"


def is_synthetic(address: str) -> bool:
    """Whether ``address`` (text) is in one of the synthetic blocks."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return ip in SYNTHETIC_V4 if ip.version == 4 else ip in SYNTHETIC_V6


class SyntheticNames:
    """One session's names ↔ synthetic addresses, one-to-one and bounded.

    Index ``i`` (from 1) is ``SYNTHETIC_V4[i]`` and ``SYNTHETIC_V6[i]``; a name
    keeps its index for the session.
    """

    def __init__(self, max_names: int = MAX_NAMES) -> None:
        if not 0 < max_names < SYNTHETIC_V4.num_addresses - 1:
            raise ValueError("SyntheticNames: max_names out of range")
        self._max = max_names
        self._index: dict[str, int] = {}
        self._names: list[str] = [""]  # index 0 (the network address) is never handed out

    def __len__(self) -> int:
        return len(self._index)

    def address(self, name: str, version: int) -> str | None:
        """The address standing for ``name`` (canonical), allocated if new; None if full."""
        i = self._index.get(name)
        if i is None:
            if len(self._index) >= self._max:
                return None
            i = len(self._names)
            self._names.append(name)
            self._index[name] = i
        block = SYNTHETIC_V4 if version == 4 else SYNTHETIC_V6
        return str(block[i])

    def name_of(self, address: str) -> str | None:
        """The name ``address`` stands for, or None (not synthetic, or never handed out)."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return None
        block = SYNTHETIC_V4 if ip.version == 4 else SYNTHETIC_V6
        if ip not in block:
            return None
        i = int(ip) - int(block.network_address)
        return self._names[i] if 0 < i < len(self._names) else None


def name_decision(policy: DomainPolicy, name: str) -> Decision:
    """Whether the DNS stub answers ``name``: the policy allows it on some port.

    The ports tried are 443, 80 and every port an allow entry names; a connection
    is still decided on its own port later. An IP literal is never answered
    (nothing to resolve), and neither is a name that does not canonicalise.
    """
    ports = list(_CANDIDATE_PORTS)
    for entry in policy.allowed:
        try:
            _, port = split_port(entry)
        except ValueError:
            continue  # a bad entry allows nothing (the policy's own rule)
        if port is not None and port not in ports:
            ports.append(port)
    first: Decision | None = None
    for port in ports:
        decision = decide(policy, name, port)
        if decision.allowed:
            try:
                literal = canonical_host(name) == decision.host and _is_literal(decision.host)
            except ValueError:
                literal = True
            if literal:
                return Decision(
                    False, decision.host, port, "dns: address literal", _LITERAL, "invalid"
                )
            return decision
        if first is None or decision.deny_listed:
            first = decision
        if decision.deny_listed:
            break  # a deny rule names it: no other port changes that
    assert first is not None
    return first


_LITERAL = "an address is not a name: the DNS stub answers names only"


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
