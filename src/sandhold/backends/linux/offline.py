"""A run with the network off: a namespace where its DNS lookups reach sandhold, which
answers them REFUSED at once and keeps their names.

The namespace holds its loopback and one datagram socket bound at 127.0.0.1:53,
which the sandbox's resolver asks (``OFFLINE_RESOLV_CONF``, bound over its
/etc/resolv.conf). The compiled front makes it (``sandhold-exec --offline-net``,
then bubblewrap with ``--share-net``); without it, ``netns``'s Python helper does.

Rules (issue 15):
- Every run with the network off pays for this, so the module imports ``_socket``
  and ``_thread`` only (``socket`` and the rest cost ~4 ms), ``net.dns`` at the first
  datagram; a failure to make the namespace fails the launch, as any network
  namespace's.
- The socket is read here, on the host side, by one thread (``OfflineDns``): no
  process of sandhold's runs in the namespace. Every query gets ``REFUSED`` as soon
  as it is read (``dns.parse_query``, the transparent stub's sans-I/O reader), so a
  lookup fails at once instead of waiting out the resolver's timeouts; what cannot
  be parsed gets what ``dns`` answers for it, or nothing.
- The names are kept, in order, at most ``MAX_NAMES`` of them, and each before its
  answer is sent: a name whose refusal the sandbox saw is in ``names``. What is no
  printable ASCII in a name is escaped (``shown_name``): the sandbox chooses the
  bytes, the user's terminal shows them.
"""

from __future__ import annotations

import _socket
import _thread
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

OFFLINE_RESOLV_CONF = "nameserver 127.0.0.1\n"
"""The sandbox's /etc/resolv.conf with the network off: the socket above."""


def spawn_offline(
    path: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    pass_fds: Sequence[int],
    cgroup_procs: Sequence[str] = (),
) -> tuple[int, _socket.socket]:
    """Start ``path`` (bubblewrap) in the namespace; returns (pid, the DNS socket).
    ``cgroup_procs``: the limit cgroups the helper enters before anything else
    (``process.enter_cgroups``), so nothing it starts runs outside them.

    Raises:
        CgroupRefused: a cgroup refused the helper.
        OSError: the namespace or the socket could not be made (the helper's error,
            re-raised here).
    """
    from sandhold.backends.linux.supervisor.front import confining_front

    front = confining_front()
    if front is None:
        from sandhold.backends.linux.netns import Spawn, _spawn

        how = Spawn(path, argv, env, pass_fds, cgroup_procs=tuple(cgroup_procs))
        pid, sent = _spawn(how, offline=True)
        return pid, _socket.socket(fileno=sent[0])
    from sandhold.backends.process import _RESET, spawn_into

    parent_end, child_end = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    fds: list[int] = []
    try:
        os.set_inheritable(child_end.fileno(), True)
        helper = [front, "--offline-net", str(child_end.fileno()), "--", path, *argv[1:]]
        if cgroup_procs:  # a fork that enters them, then execs the front
            pid = spawn_into(cgroup_procs, front, helper, env)
        else:
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


MAX_NAMES = 64


def shown_name(name: str) -> str:
    """``name`` as the run's line prints it: what is no printable ASCII (a terminal's
    escape sequence the sandbox put in a label) written as ``\\xNN``.

    >>> shown_name("ex\x1b[2Jample.com")
    'ex\\x1b[2Jample.com'
    """
    return "".join(c if " " < c < "\x7f" else f"\\x{ord(c):02x}" for c in name)


class OfflineDns:
    """Answers one sandbox's DNS queries (module rules). ``start``, then ``stop``
    once the sandbox is gone."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.names: list[str] = []
        self.stopped = False

    def start(self) -> None:
        # not threading.Thread: its start() waits for the thread to be scheduled, a
        # round on a busy machine that every run would pay
        _thread.start_new_thread(self._serve, ())

    def stop(self) -> list[str]:
        """The names asked, once the sandbox is gone (bwrap has exited: every process
        of its PID namespace with it). The thread is woken (a shutdown of the socket)
        but not waited for: it closes the socket as it ends, and waiting would cost a
        scheduling round on a busy machine, every run."""
        self.stopped = True
        try:
            self.sock.shutdown(_socket.SHUT_RD)
        except OSError:
            pass  # ENOTCONN, as for any unbound peer: the reader is woken all the same
        return list(self.names)

    def _serve(self) -> None:
        try:
            self._answer_all()
        finally:
            self.sock.close()

    def _answer_all(self) -> None:
        while True:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            if self.stopped:
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
