"""The egress proxies of a sandbox session: one HTTP proxy and one SOCKS5 proxy (SPEC §5).

Layers, bottom up; each module states its own rules:

- ``httphead`` and ``socks5`` are sans-I/O: bytes in, typed events out, answer
  bytes back. They never touch a socket, and raise only ``errors.BadRequest`` and
  ``errors.SocksError``, where the client's bytes come in.
- ``relay`` moves bytes both ways between two connected sockets, losing none.
- ``budget`` shares one process's file descriptors among its sessions.
- ``outbound`` carries out a decision for one connection: ``decide`` from
  ``sandhold.policy.domains``, resolve, ``guard_addresses``, dial. Policy lives
  in ``policy/domains.py``; nothing in this package decides anything itself.
- ``http_proxy`` and ``socks_proxy`` serve one client connection each.
- ``egress`` is the public entry point: ``EgressSession`` accepts on two
  listening sockets it is given and runs both proxies for one sandbox session.

Nothing here is imported by the CLI at start-up; import ``sandhold.net.egress``
where the proxies are needed. This module imports nothing on purpose.
"""
