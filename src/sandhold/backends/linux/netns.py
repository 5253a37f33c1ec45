"""Start a sandbox in a network namespace whose only doors are sandhold's proxies.

A forked helper unshares a user and a network namespace, brings its loopback
up, opens the proxies' listening sockets there (at fixed ports), hands them to
sandhold over a socket pair, and execs bubblewrap, which keeps that network
namespace (``--share-net``). A listening socket belongs to the namespace it was
created in for life, and its backlog queues connections before anyone accepts,
so no bridge process and no readiness polling are needed: sandhold accepts on
the sockets from the host side and dials out from there. Nothing else on the
host can reach these listeners; nothing in the sandbox can reach anything else.

With ``transparent`` (issue 20) the helper also gives the namespace a default
route through loopback, loads ``policy.transparent.nft_ruleset`` with
libnftables (in-process: the helper holds ``CAP_NET_ADMIN`` over its own
namespace only until it execs, and ``nft`` as a program would lose it for an
unprivileged user), and opens the transparent listener, the DNS stub's sockets
and an NFLOG socket there. Redirected connections and datagrams land on those
loopback sockets, which sandhold holds from the host side like the proxies'.
A failure at any step fails the launch: a sandbox that was asked for
transparent egress never runs with half of it.

The helper forks from the calling thread, which must be the main thread:
bubblewrap's ``--die-with-parent`` ties the sandbox to that thread's life.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct

from sandhold._record import record
from sandhold.backends.process import CgroupRefused, enter_cgroups, inherit_only
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


def _listener(port: int, host: str = "127.0.0.1") -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind((host, port))
    sock.listen(4096)
    return sock


@record
class TransparentSockets:
    """The host's ends of a namespace's transparent egress (all bound in that namespace).

    ``tcp``: the transparent listeners (127.0.0.1 and, with IPv6, ::1 at
    ``TRANSPARENT_PORT``); ``dns_udp`` and ``dns_tcp``: the DNS stub's datagram
    sockets and listeners (port 53, same addresses); ``nflog``: the netlink
    socket bound to the ruleset's NFLOG group (refused datagrams).
    """

    tcp: tuple[socket.socket, ...]
    dns_udp: tuple[socket.socket, ...]
    dns_tcp: tuple[socket.socket, ...]
    nflog: socket.socket

    def all(self) -> tuple[socket.socket, ...]:
        return (*self.tcp, *self.dns_udp, *self.dns_tcp, self.nflog)


# rtnetlink and nfnetlink constants (linux/rtnetlink.h, linux/netfilter/nfnetlink_log.h)
_NETLINK_ROUTE, _NETLINK_NETFILTER = 0, 12
_RTM_NEWROUTE, _NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_EXCL, _NLM_F_CREATE = 24, 1, 4, 0x200, 0x400
_RT_TABLE_MAIN, _RTPROT_STATIC, _RT_SCOPE_UNIVERSE, _RTN_UNICAST = 254, 4, 0, 1
_RTA_OIF, _RTA_PREFSRC = 4, 7
_LOOPBACK_IFINDEX = 1
_NFULNL_MSG_CONFIG = (4 << 8) | 1  # NFNL_SUBSYS_ULOG
_NFULA_CFG_TIMEOUT, _NFULA_CFG_QTHRESH = 4, 5
_NFULA_CFG_CMD, _NFULA_CFG_MODE, _NFULNL_CFG_CMD_BIND, _NFULNL_COPY_PACKET = 1, 2, 1, 2
_NFLOG_COPY = 64  # bytes of each refused packet: its IP and UDP headers


def _netlink(protocol: int, msg_type: int, body: bytes) -> None:
    """Send one netlink request and raise its error, if the kernel answers one."""
    flags = _NLM_F_REQUEST | _NLM_F_ACK
    if msg_type == _RTM_NEWROUTE:
        flags |= _NLM_F_CREATE | _NLM_F_EXCL
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol) as s:
        s.send(struct.pack("=IHHII", 16 + len(body), msg_type, flags, 1, 0) + body)
        answer = s.recv(4096)
    if len(answer) >= 20 and struct.unpack_from("=H", answer, 4)[0] == 2:  # NLMSG_ERROR
        err = -struct.unpack_from("=i", answer, 16)[0]
        if err:
            raise OSError(err, f"netlink: {os.strerror(err)}")


def _default_route(family: int) -> None:
    """``ip route add default dev lo src <loopback>``: every address is reachable
    (through loopback, where the ruleset redirects it), from a loopback source."""
    source = socket.inet_pton(family, "127.0.0.1" if family == socket.AF_INET else "::1")
    rtm = struct.pack(
        "=BBBBBBBBI",
        family,
        0,
        0,
        0,
        _RT_TABLE_MAIN,
        _RTPROT_STATIC,
        _RT_SCOPE_UNIVERSE,
        _RTN_UNICAST,
        0,
    )
    attrs = struct.pack("=HHi", 8, _RTA_OIF, _LOOPBACK_IFINDEX)
    attrs += struct.pack("=HH", 4 + len(source), _RTA_PREFSRC) + source
    _netlink(_NETLINK_ROUTE, _RTM_NEWROUTE, rtm + attrs)


def _load_ruleset(text: str) -> None:
    import ctypes

    try:
        lib = ctypes.CDLL("libnftables.so.1")
    except OSError as exc:
        raise OSError(
            0, f"transparent egress needs libnftables (the nftables package): {exc}"
        ) from exc
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    ctx = lib.nft_ctx_new(0)
    if not ctx:
        raise OSError(0, "nftables: no context")
    try:
        lib.nft_ctx_buffer_error(ctx)
        if lib.nft_run_cmd_from_buffer(ctx, text.encode()) != 0:
            why = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace")
            raise OSError(0, f"nftables refused the sandbox's ruleset: {why.strip()[:300]}")
    finally:
        lib.nft_ctx_free(ctx)


def _nflog(group: int) -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER)
    try:
        nfgen = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(group))
        cmd = struct.pack("=HHB3x", 5, _NFULA_CFG_CMD, _NFULNL_CFG_CMD_BIND)
        mode = struct.pack("=HH", 10, _NFULA_CFG_MODE)
        mode += struct.pack("!IB", _NFLOG_COPY, _NFULNL_COPY_PACKET) + b"\0\0\0"
        # each refusal is delivered at once, not batched for up to a second
        qthresh = struct.pack("=HH", 8, _NFULA_CFG_QTHRESH) + struct.pack("!I", 1)
        timeout = struct.pack("=HH", 8, _NFULA_CFG_TIMEOUT) + struct.pack("!I", 0)
        body = nfgen + cmd + mode + qthresh + timeout
        flags = _NLM_F_REQUEST | _NLM_F_ACK
        sock.send(struct.pack("=IHHII", 16 + len(body), _NFULNL_MSG_CONFIG, flags, 1, 0) + body)
        answer = sock.recv(4096)
        if len(answer) >= 20 and struct.unpack_from("=H", answer, 4)[0] == 2:
            err = -struct.unpack_from("=i", answer, 16)[0]
            if err:
                raise OSError(err, f"nflog: {os.strerror(err)}")
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _has_ipv6_loopback() -> bool:
    """Whether this namespace has ``::1``: without it, it has no IPv6 at all, so
    there is no IPv6 traffic to divert (and nothing to bind)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        if exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
            return False
        raise
    return True


def _transparent_sockets() -> tuple[list[socket.socket], bytes]:
    """Routes, ruleset and sockets of transparent egress; the sockets and their counts."""
    from sandhold.policy.transparent import (
        DNS_STUB_PORT,
        NFLOG_GROUP,
        TRANSPARENT_PORT,
        nft_ruleset,
    )

    hosts = ["127.0.0.1"]
    _default_route(socket.AF_INET)
    if _has_ipv6_loopback():
        _default_route(socket.AF_INET6)
        hosts.append("::1")
    _load_ruleset(nft_ruleset(TRANSPARENT_PORT, DNS_STUB_PORT, NFLOG_GROUP))
    tcp = [_listener(TRANSPARENT_PORT, host) for host in hosts]
    udp = []
    for host in hosts:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        u = socket.socket(family, socket.SOCK_DGRAM)
        if family == socket.AF_INET6:
            u.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        u.bind((host, DNS_STUB_PORT))
        udp.append(u)
    dns_tcp = [_listener(DNS_STUB_PORT, host) for host in hosts]
    nflog = _nflog(NFLOG_GROUP)
    n = len(hosts)
    return [*tcp, *udp, *dns_tcp, nflog], f" {n}".encode()


def spawn_in_netns(
    path: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    pass_fds: Sequence[int],
    *,
    stdio: Sequence[int] | None = None,
    new_session: bool = False,
    transparent: list[TransparentSockets] | None = None,
    cgroup_procs: Sequence[str] = (),
) -> tuple[int, socket.socket, socket.socket]:
    """Fork the namespace helper, which execs ``path``; returns (pid, http, socks).

    The two listening sockets live in the new network namespace at
    127.0.0.1:3128 (HTTP) and 127.0.0.1:1080 (SOCKS5). ``stdio``, if given, are
    the fds the program gets as 0, 1 and 2 (else it inherits ours);
    ``new_session`` makes it a session leader (``setsid``), out of our terminal's
    process group. With ``transparent`` (a list), the namespace also gets
    transparent egress (module doc) and its sockets are appended to that list
    as one ``TransparentSockets``. ``cgroup_procs``: the cgroups (their
    ``cgroup.procs`` files) the helper enters first, before any namespace, so that
    nothing it starts runs outside them (``process.enter_cgroups``).

    Raises:
        OSError: the namespaces or listeners could not be made (the child's error
            is reported through the socket pair and re-raised here).
    """
    how = Spawn(path, argv, env, pass_fds, stdio, new_session, tuple(cgroup_procs))
    pid, fds = _spawn(how, transparent)
    return pid, socket.socket(fileno=fds[0]), socket.socket(fileno=fds[1])


def _dns_socket() -> socket.socket:
    """The DNS socket of a namespace with the network off (``offline.spawn_offline``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 53))
    return sock


@record
class Spawn:
    """What the helper is to exec, with what (``spawn_in_netns``'s arguments)."""

    path: str
    argv: Sequence[str]
    env: Mapping[str, str]
    pass_fds: Sequence[int]
    stdio: Sequence[int] | None = None
    new_session: bool = False
    cgroup_procs: tuple[str, ...] = ()  # entered first (``spawn_in_netns``)


def _spawn(
    how: Spawn, transparent: list[TransparentSockets] | None = None, offline: bool = False
) -> tuple[int, list[int]]:
    """The helper's fork (see ``spawn_in_netns``); the pid and the fds it sent: the
    proxies' two listeners, or with ``offline`` the DNS socket alone."""
    path, argv, env, pass_fds = how.path, how.argv, how.env, how.pass_fds
    stdio, new_session = how.stdio, how.new_session
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    uid, gid = os.geteuid(), os.getegid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, reported through the pair
        code = 127
        try:
            parent_end.close()
            enter_cgroups(how.cgroup_procs)  # as the host's user, before the user namespace
            _enter_namespaces(uid, gid)
            extra: list[socket.socket] = []
            note = b""
            if transparent is not None:
                extra, note = _transparent_sockets()
            if offline:
                sent = [_dns_socket()]
            else:
                sent = [_listener(HTTP_PROXY_PORT), _listener(SOCKS_PROXY_PORT), *extra]
            socket.send_fds(child_end, [b"ok" + note], [s.fileno() for s in sent])
            for s in sent:
                s.close()
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
                word = "cgroup" if isinstance(exc, CgroupRefused) else "error"
                child_end.sendall(f"{word} {exc.errno or 0} {exc.strerror or exc}".encode())
            except OSError:
                pass
        except BaseException:  # nothing may unwind into a copy of the parent's code
            pass
        os._exit(code)
    child_end.close()
    want = 1 if offline else 2 + (7 if transparent is not None else 0)
    try:
        msg, fds, _flags, _addr = socket.recv_fds(parent_end, 256, want)
    finally:
        parent_end.close()
    if transparent is not None and msg.startswith(b"ok ") and len(fds) == 3 + 3 * int(msg[3:]):
        n = int(msg[3:])
        got = [socket.socket(fileno=fd) for fd in fds[2:]]
        transparent.append(
            TransparentSockets(
                tuple(got[:n]), tuple(got[n : 2 * n]), tuple(got[2 * n : 3 * n]), got[-1]
            )
        )
        msg, fds, want = b"ok", fds[:2], 2
    if msg != b"ok" or len(fds) != want:
        for fd in fds:
            os.close(fd)
        os.waitpid(pid, 0)
        text = msg.decode(errors="replace")
        word, err, reason = [*text.split(" ", 2), "", "", ""][:3]
        error = CgroupRefused if word == "cgroup" else OSError
        raise error(int(err) if err.isdigit() else 0, reason or "network namespace set-up failed")
    return pid, fds
