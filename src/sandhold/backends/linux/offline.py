"""Start a sandbox with the network off in a namespace where its DNS lookups reach sandhold.

The namespace holds its loopback and one datagram socket bound at 127.0.0.1:53,
which the sandbox's resolver asks (``OFFLINE_RESOLV_CONF``, bound over its
/etc/resolv.conf); sandhold reads and answers that socket from the host side
(``net.offline_dns``), so no process of sandhold's runs in the namespace. The
compiled front makes it (``sandhold-exec --offline-net``, then bubblewrap with
``--share-net``); without it, ``netns``'s Python helper does.

Rules: every run with the network off pays for it, so this module imports
``_socket`` only (``socket`` and the rest cost ~4 ms), and a failure fails the
launch, as any network namespace's.
"""

from __future__ import annotations

import _socket
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

OFFLINE_RESOLV_CONF = "nameserver 127.0.0.1\n"
"""The sandbox's /etc/resolv.conf with the network off: the socket above."""


def spawn_offline(
    path: str, argv: Sequence[str], env: Mapping[str, str], pass_fds: Sequence[int]
) -> tuple[int, _socket.socket]:
    """Start ``path`` (bubblewrap) in the namespace; returns (pid, the DNS socket).

    Raises:
        OSError: the namespace or the socket could not be made (the helper's error,
            re-raised here).
    """
    from sandhold.backends.linux.supervisor.front import confining_front

    front = confining_front()
    if front is None:
        from sandhold.backends.linux.netns import Spawn, _spawn

        pid, sent = _spawn(Spawn(path, argv, env, pass_fds), offline=True)
        return pid, _socket.socket(fileno=sent[0])
    from sandhold.backends.process import _RESET

    parent_end, child_end = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    fds: list[int] = []
    try:
        os.set_inheritable(child_end.fileno(), True)
        helper = [front, "--offline-net", str(child_end.fileno()), "--", path, *argv[1:]]
        pid = os.posix_spawn(front, helper, dict(env), setsigmask=(), setsigdef=_RESET)
        child_end.close()
        msg, ancillary, _flags, _addr = parent_end.recvmsg(256, _socket.CMSG_SPACE(4))
        for level, kind, data in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                fds += [
                    int.from_bytes(data[i : i + 4], sys.byteorder) for i in range(0, len(data), 4)
                ]
    finally:
        child_end.close()
        parent_end.close()
    if msg != b"ok" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        os.waitpid(pid, 0)
        _, err, reason = [*msg.decode(errors="replace").split(" ", 2), "", "", ""][:3]
        raise OSError(int(err) if err.isdigit() else 0, reason or "network namespace set-up failed")
    return pid, _socket.socket(fileno=fds[0])
