"""ssh's ProxyCommand inside a sandbox: reach HOST:PORT through the session's SOCKS5 proxy.

Usage: ``python3 sshproxy.py PROXY_HOST PROXY_PORT HOST PORT``. It asks the
proxy to CONNECT to HOST (by name: the proxy resolves and checks it) and then
copies stdin to the connection and the connection to stdout, passing each
side's end-of-file on, until both directions are done. ``GIT_SSH_COMMAND``
points ssh here, so git over ssh needs no socat or netcat in the sandbox.
Standard library only: it runs with whatever ``python3`` the sandbox has.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import threading

REPLIES = {
    1: "general failure",
    2: "connection not allowed by ruleset",
    3: "network unreachable",
    4: "host unreachable",
    5: "connection refused",
    6: "TTL expired",
    7: "command not supported",
    8: "address type not supported",
}


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the SOCKS5 proxy closed the connection")
        data += chunk
    return data


def socks5_connect(proxy: tuple[str, int], host: str, port: int) -> socket.socket:
    """An open connection to ``host:port`` through the SOCKS5 proxy at ``proxy``.

    Raises:
        ConnectionError: the proxy refused or failed (its reason in the message).
    """
    sock = socket.create_connection(proxy)
    sock.sendall(b"\x05\x01\x00")
    if _recv_exact(sock, 2) != b"\x05\x00":
        raise ConnectionError("the SOCKS5 proxy wants an authentication method we lack")
    name = host.encode("idna")
    sock.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + struct.pack("!H", port))
    ver, rep, _rsv, atyp = _recv_exact(sock, 4)
    if ver != 5 or rep != 0:
        raise ConnectionError(f"SOCKS5 proxy: {REPLIES.get(rep, f'reply {rep}')}")
    skip = {1: 4, 4: 16}.get(atyp)
    if skip is None:
        skip = _recv_exact(sock, 1)[0]
    _recv_exact(sock, skip + 2)
    return sock


def _pump_in(sock: socket.socket) -> None:
    stdin = sys.stdin.fileno()
    try:
        while chunk := os.read(stdin, 65536):
            sock.sendall(chunk)
    finally:
        sock.shutdown(socket.SHUT_WR)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        sys.stderr.write("usage: sshproxy.py PROXY_HOST PROXY_PORT HOST PORT\n")
        return 2
    try:
        sock = socks5_connect((argv[0], int(argv[1])), argv[2], int(argv[3]))
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"sandhold sshproxy: {argv[2]}:{argv[3]}: {exc}\n")
        return 1
    threading.Thread(target=_pump_in, args=(sock,), daemon=True).start()
    stdout = sys.stdout.fileno()
    while chunk := sock.recv(65536):
        os.write(stdout, chunk)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
