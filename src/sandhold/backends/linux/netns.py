"""Start a sandbox in a network namespace whose only doors are sandhold's proxies.

A forked helper unshares a user and a network namespace, brings its loopback
up, opens the proxies' listening sockets there (at fixed ports), hands them to
sandhold over a socket pair, and execs bubblewrap, which keeps that network
namespace (``--share-net``). A listening socket belongs to the namespace it was
created in for life, and its backlog queues connections before anyone accepts,
so no bridge process and no readiness polling are needed: sandhold accepts on
the sockets from the host side and dials out from there. Nothing else on the
host can reach these listeners; nothing in the sandbox can reach anything else.

The helper forks from the calling thread, which must be the main thread:
bubblewrap's ``--die-with-parent`` ties the sandbox to that thread's life.
"""

from __future__ import annotations

import os
import signal
import socket
import struct

from sandhold.backends.process import inherit_only
from sandhold.policy.env import HTTP_PROXY_PORT, SOCKS_PROXY_PORT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
_RESET_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCHLD,
    signal.SIGPIPE,
    signal.SIGXFSZ,
)


def _unshare(flags: int) -> None:
    unshare = getattr(os, "unshare", None)  # Python 3.12+
    if unshare is not None:
        unshare(flags)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(ctypes.c_int(flags)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _enter_namespaces(uid: int, gid: int) -> None:
    _unshare(CLONE_NEWUSER | CLONE_NEWNET)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        import fcntl

        req = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh14x", b"lo", flags | IFF_UP))


def _listener(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(4096)
    return sock


def spawn_in_netns(
    path: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    pass_fds: Sequence[int],
    *,
    stdio: Sequence[int] | None = None,
    new_session: bool = False,
) -> tuple[int, socket.socket, socket.socket]:
    """Fork the namespace helper, which execs ``path``; returns (pid, http, socks).

    The two listening sockets live in the new network namespace at
    127.0.0.1:3128 (HTTP) and 127.0.0.1:1080 (SOCKS5). ``stdio``, if given, are
    the fds the program gets as 0, 1 and 2 (else it inherits ours);
    ``new_session`` makes it a session leader (``setsid``), out of our terminal's
    process group.

    Raises:
        OSError: the namespaces or listeners could not be made (the child's error
            is reported through the socket pair and re-raised here).
    """
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    uid, gid = os.geteuid(), os.getegid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, reported through the pair
        code = 127
        try:
            parent_end.close()
            _enter_namespaces(uid, gid)
            http, socks = _listener(HTTP_PROXY_PORT), _listener(SOCKS_PROXY_PORT)
            socket.send_fds(child_end, [b"ok"], [http.fileno(), socks.fileno()])
            http.close()
            socks.close()
            child_end.close()
            for fd in pass_fds:
                os.set_inheritable(fd, True)
            if new_session:
                os.setsid()
            if stdio:
                import fcntl

                # copies above 2 first, so that no source is overwritten before it is used
                sources = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3) for fd in stdio]
                for target, fd in enumerate(sources):
                    os.dup2(fd, target)
            # the caller's other fds (a port's sockets, a harness's open files) reach
            # neither bwrap nor the sandbox
            inherit_only(set(pass_fds))
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            for sig in _RESET_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            os.execve(path, list(argv), dict(env))
        except OSError as exc:
            try:
                child_end.sendall(f"error {exc.errno or 0} {exc.strerror or exc}".encode())
            except OSError:
                pass
        except BaseException:  # nothing may unwind into a copy of the parent's code
            pass
        os._exit(code)
    child_end.close()
    try:
        msg, fds, _flags, _addr = socket.recv_fds(parent_end, 256, 2)
    finally:
        parent_end.close()
    if msg != b"ok" or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        os.waitpid(pid, 0)
        text = msg.decode(errors="replace")
        _, err, reason = [*text.split(" ", 2), "", "", ""][:3]
        raise OSError(int(err) if err.isdigit() else 0, reason or "network namespace set-up failed")
    return pid, socket.socket(fileno=fds[0]), socket.socket(fileno=fds[1])
