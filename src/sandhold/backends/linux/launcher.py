"""Start a long-lived sandbox with the agent inside it, and hold its process tree.

The port decides; this module carries out. ``spawn_native`` runs bubblewrap
from a ``SpecPlan`` (empty root, the plan's mounts, the seccomp filter,
``--json-status-fd``) with the agent as its command; ``spawn_host`` runs the
agent straight on the host for the ``none`` backend. Either way the result is a
``SandboxProcess``: the channel to the agent and the tree to freeze and kill.

Rules:
- The agent's code reaches it through a sealed memfd of marshalled code objects,
  compiled here once per process from the package's own source, so the agent
  never compiles at start-up and needs no writable bytecode cache. The package
  directory is still bound read-only (hooks import from it); an interpreter
  other than ours gets the source instead.
- The network step runs before bubblewrap: by default bwrap unshares a fresh
  network namespace with only loopback. A ``NetworkSetup`` (the egress seam)
  may spawn bwrap itself inside a namespace it prepared (``share_net``).
  ``EgressNetwork`` is the one the port uses: a namespace whose only exits are
  the listeners of the session's own proxies (``net.egress.EgressSession``)
  and, with transparent egress (issue 20), its transparent listener, DNS stub
  and refused-datagram log (``net.transparent``), all started at the first
  connection or query so that they never delay ``ready``.
- Closing a network cuts it before anything else: the listeners are shut down
  before ``close`` returns, whatever is still being torn down behind them.
- Who made a connection is read from the host, never from the sandbox's word:
  ``SandboxProcess.socket_holders`` finds a process holding each connection's
  socket (``/proc/PID/net/tcp`` of the sandbox's network namespace, then the
  processes' fd tables) and its ancestry as sandbox pids. The sandbox decides
  how many processes and fds there are, so the work is bounded: the first
  holder found is the answer, and the scan gives up after ``max_fds`` fds. It
  blocks: run it off the event loop.
- Freezing uses the cgroup v2 freezer when the sandbox has a cgroup, else
  SIGSTOP of every process of the sandbox (its PID namespace; for ``none``, the
  agent's namespace, or without one the agent and its descendants) until none is
  running; thawing is the reverse.
- ``none`` asks the agent for a PID namespace of its own (``--pid-namespace``,
  ``agent.main.own_pid_namespace``); whether it got one is read from the host
  (``find_pid_namespace``), never taken from the agent's word. With one, ``kill``
  sends SIGKILL to the namespace's init, whose exit the kernel reports only once
  every member is gone. Without one (user namespaces off), the agent and each exec's reaper are
  subreapers and the tree below the agent, and its cgroup's members, are killed;
  a command that kills them first leaves its orphans to the host's init, where
  only a cgroup (root's) still finds them: ``details["destroy"]`` says which.
- A process is judged by its threads, never by its leader alone: a leader that
  called ``pthread_exit`` shows ``Z`` while the other threads run on, so the
  process is alive (and signalled, killed, waited for) until its last thread is
  gone, and stopped only once every live thread is. A leader with no thread
  left is a plain zombie: dead.
- ``kill`` is final and verified from the host: it returns once no process of
  the sandbox is left (or raises ``LaunchError`` naming the survivors). A signal
  to a listed pid goes through a pidfd taken before the list is read again, and
  only if the pid is still listed: a reused pid is never signalled.
- Every fd this module opens is closed by ``close`` (safe to call twice).
"""

from __future__ import annotations

import os
import socket
import sys
import time

from sandhold._record import record
from sandhold.backends.linux import procfs
from sandhold.backends.linux.native import PACKAGE_BOOT, sandbox_pids
from sandhold.backends.linux.supervisor.notify import sealed_memfd
from sandhold.errors import LaunchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    import subprocess
    from collections.abc import Awaitable, Callable, Mapping, Sequence
    from typing import Protocol

    from sandhold.backends.linux.cgroups import SandboxCgroup
    from sandhold.backends.linux.netns import TransparentSockets
    from sandhold.backends.linux.session import Session
    from sandhold.net.budget import SessionBudget
    from sandhold.net.egress import EgressDecision, EgressSession
    from sandhold.net.outbound import Asker, Resolver
    from sandhold.net.transparent import TransparentEgress
    from sandhold.policy.domains import DomainPolicy
    from sandhold.policy.specplan import Pin, SpecPlan

    class NetworkSetup(Protocol):
        """The egress seam: prepares the sandbox's network before bwrap runs.

        ``spawn`` starts bwrap (``argv``, ``env``, keeping ``pass_fds`` and with
        ``stderr`` as its fd 2) inside the network namespace it made, e.g. with
        ``netns.spawn_in_netns``, and returns its pid; ``share_net`` tells the
        launcher to pass ``--share-net`` so bwrap stays in that namespace.
        ``environment`` is what every exec gets (proxy variables);
        ``exec_environment`` what one exec gets (e.g. a token naming it to the
        proxy); ``close`` stops serving: the sandbox has no network once it
        returns, and the awaitable it may return finishes the rest (open
        connections); it is safe to call twice.
        """

        share_net: bool

        def spawn(
            self, argv: Sequence[str], env: Mapping[str, str], pass_fds: Sequence[int], stderr: int
        ) -> int: ...

        def environment(self) -> Mapping[str, str]: ...

        def exec_environment(self, exec_id: int) -> Mapping[str, str]: ...

        def close(self) -> Awaitable[None] | None: ...


SIGKILL, SIGSTOP, SIGCONT = 9, 19, 18
DEAD_STATES = ("", "Z", "X", "x")  # gone, zombie, dead (being reaped; "x" before Linux 4.14)
AGENT_MODULES = (
    "sandhold",
    "sandhold.agent",
    "sandhold.agent.protocol",
    "sandhold.agent.main",
    # its reader of /proc (the one procfs: it imports only os)
    "sandhold.backends",
    "sandhold.backends.linux",
    "sandhold.backends.linux.procfs",
)
_AGENT_PACKAGES = ("sandhold", "sandhold.agent", "sandhold.backends", "sandhold.backends.linux")
BOOT_CODE = (
    "import sys,marshal,os\n"
    "a=sys.argv;fd=int(a[1]);d=marshal.loads(os.pread(fd,int(a[2]),0));os.close(fd)\n"
    "for n,p,c in d:\n"
    " m=type(sys)(n);m.__file__=c.co_filename\n"
    " if p:m.__path__=[p]\n"
    " sys.modules[n]=m;exec(c,m.__dict__)\n"
    " if '.' in n:setattr(sys.modules[n.rpartition('.')[0]],n.rpartition('.')[2],m)\n"
    "sys.modules['sandhold.agent.main'].main(a[3:])\n"
)
# Run first in the sandbox, before the agent says HELLO and before any command: every
# pinned mount is the object the plan saw (device and inode, not followed), or the
# sandbox exits naming it. bubblewrap 0.8 turns --bind-fd back into a path
# (realpath of /proc/self/fd/N) and mounts that path, so a swap in between still
# mounts the other object; only a look at what was mounted closes it. A path the
# sandbox's user may not reach (root's sandbox, caps dropped, in another user's 0700
# directory) is skipped: its parents are mounts checked before it.
PIN_CHECK = (
    "import os,sys\n"
    "for e in sys.argv.pop(1).split(','):\n"
    " h,v,i=e.split(':');p=bytes.fromhex(h)\n"
    " try:s=os.lstat(p)\n"
    " except PermissionError:continue\n"
    " except OSError:s=None\n"
    " if s is None or (s.st_dev,s.st_ino)!=(int(v),int(i)):\n"
    "  os.write(2,b'sandhold: '+p+b' is not what the plan bound: it changed between the plan"
    " and the mount (something is swapping it); refused, nothing ran\\n')\n"
    "  os._exit(125)\n"
)
BOOT_SOURCE = PACKAGE_BOOT + "from sandhold.agent.main import main;main(sys.argv[2:])\n"
AGENT_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
STOP_DEADLINE_S = 2.0
KILL_DEADLINE_S = 5.0


@record
class AgentBoot:
    """How to start the agent: the interpreter, the package, and its compiled code."""

    python: str  # resolved interpreter path
    package_dir: str  # the sandhold package directory (bound read-only)
    prefix: str  # the interpreter's installation prefix (bound read-only if not in /usr)
    code: bytes  # marshalled [(module, package path or "", code)]; b"": import from source

    @property
    def paths(self) -> tuple[str, ...]:
        """Host paths the agent needs to see."""
        out = [self.package_dir, self.prefix]
        if not self.python.startswith(self.prefix.rstrip("/") + "/"):
            out.append(os.path.dirname(self.python))
        return tuple(dict.fromkeys(out))


_BOOTS: dict[str, AgentBoot] = {}


def agent_boot(python: str | None = None) -> AgentBoot:
    """The agent's boot recipe for ``python`` (default: this interpreter); cached."""
    from sandhold.backends.linux.native import runner_paths

    ours, package_parent = runner_paths()
    exe = os.path.realpath(python) if python else ours
    if exe in _BOOTS:
        return _BOOTS[exe]
    import marshal

    package_dir = os.path.join(package_parent, "sandhold")
    code = b""
    if exe == ours:
        units = []
        for name in AGENT_MODULES:
            rel = name.split(".")[1:]
            is_pkg = name in _AGENT_PACKAGES
            path = os.path.join(package_dir, *rel, "__init__.py") if is_pkg else ""
            if not is_pkg:
                path = os.path.join(package_dir, *rel[:-1], rel[-1] + ".py")
            with open(path, encoding="utf-8") as f:
                compiled = compile(f.read(), path, "exec", dont_inherit=True)
            units.append((name, os.path.dirname(path) if is_pkg else "", compiled))
        code = marshal.dumps(units)
        prefix = os.path.realpath(sys.base_prefix)
    else:
        prefix = os.path.dirname(os.path.dirname(exe))
    boot = AgentBoot(exe, package_dir, prefix, code)
    _BOOTS[exe] = boot
    return boot


def _code_fd(boot: AgentBoot) -> int:
    """A sealed, read-only memfd holding the agent's code."""
    return sealed_memfd("sandhold-agent", boot.code)


_REAPER: dict[tuple[str, int, int], bytes] = {}  # the helper's bytes, read once


def _reaper_fd() -> int:
    """An execute-only sealed memfd of the compiled helper, run by the agent as each
    exec's reaper (``sandhold-exec --reap``), or -1: not built, or turned off with
    ``SANDHOLD_EXEC_HELPER=0`` (the agent's Python reaper then forks twice per exec:
    two copies of an interpreter, ~5 ms of CPU for ``true``). Execute-only: a
    process running it is non-dumpable from its first instruction, as the agent is."""
    from sandhold.backends.linux.supervisor.front import confining_front

    exe = confining_front()
    if exe is None:
        return -1
    try:
        st = os.stat(exe)
        key = (exe, st.st_ino, st.st_mtime_ns)
        data = _REAPER.get(key)
        if data is None:
            with open(exe, "rb") as f:
                data = _REAPER[key] = f.read()
        return sealed_memfd("sandhold-exec", data, mode=0o111)
    except OSError:
        return -1  # the Python reaper does the same job


def agent_argv(
    boot: AgentBoot,
    channel_fd: int,
    code_fd: int,
    extra: Sequence[str] = (),
    pins: Sequence[Pin] = (),
) -> list[str]:
    """The agent's command line; with ``pins``, ``PIN_CHECK`` runs first (its list
    is the first argument: ``hexpath:dev:ino`` entries joined by commas)."""
    head = [boot.python, "-I", "-S", "-B", "-c"]
    check = (PIN_CHECK,) if pins else ()
    listed = (",".join(f"{_hex(p.path)}:{p.dev}:{p.ino}" for p in pins),) if pins else ()
    if boot.code:
        head += ["".join((*check, BOOT_CODE)), *listed, str(code_fd), str(len(boot.code))]
    else:
        head += ["".join((*check, BOOT_SOURCE)), *listed, os.path.dirname(boot.package_dir)]
    return [*head, "--fd", str(channel_fd), *extra]


def _landed(plan: SpecPlan, session: Session, masked: Sequence[tuple[str, str]] = ()) -> list[Pin]:
    """What each pinned mount and each hiding mount must show once mounted: the
    pinned object, or the session's cover file or directory, or, for a masked
    credential file (and the trust bundle), its copy bound over it. A hidden path
    swapped for a symlink while bwrap mounts would take the cover to the link's
    target and leave the secret beside it, under another name: ``PIN_CHECK`` refuses
    that. (A hiding tmpfs, the 0111 kind, has no inode to expect: it is not checked.)"""
    from sandhold.policy.specplan import Pin

    copies = dict(masked)
    out = [p for p in plan.pins if p.path not in copies]
    covers = {"hide-file": session.hidden_file, "hide-dir": session.hidden_dir}
    seen: dict[str, os.stat_result] = {}
    for m in plan.fs.mounts:
        if m.path in copies:
            continue
        if m.op not in covers or (m.op == "hide-dir" and (m.perms or "0000") != "0000"):
            continue
        cover = covers[m.op]
        st = seen.get(cover) or os.lstat(cover)
        seen[cover] = st
        out.append(Pin(m.path, st.st_dev, st.st_ino))
    for path, copy in copies.items():
        st = os.lstat(copy)
        out.append(Pin(path, st.st_dev, st.st_ino))
    return out


def _hex(path: str) -> str:
    return os.fsencode(path).hex()


class SandboxProcess:
    """A running sandbox's host side: the agent channel and the process tree (module rules)."""

    def __init__(
        self,
        backend: str,
        pid: int,
        channel: socket.socket,
        diag_fd: int,
        *,
        popen: subprocess.Popen[bytes] | None = None,
        status_fd: int | None = None,
        session: Session | None = None,
    ) -> None:
        self.backend = backend
        self.pid = pid  # bwrap (native) or the agent (none)
        self.popen = popen
        self.channel = channel
        self.diag_fd = diag_fd
        self.status_fd = status_fd
        self.session = session
        self.pidfd = os.pidfd_open(pid)
        self.status: dict[str, int] = {}
        self._status_buf = b""
        self.init_pidfd = -1
        self.cgroup: SandboxCgroup | None = None  # removed by close(), whatever happened
        self.cgroup_complete = False  # every process is in it: the freezer may be used
        self.exit_status: int | None = None
        self.diag = b""
        self._closed = False
        self._killed = False
        self._stopping = False  # set by kill: waits in other threads give up

    # -- what bwrap and the agent told us -----------------------------------------

    def read_status(self) -> bool:
        """Take what bwrap wrote on its status fd; False once it is at its end."""
        if self.status_fd is None:
            return False
        while True:
            try:
                chunk = os.read(self.status_fd, 4096)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self._parse_status()
                return False
            self._status_buf += chunk
        self._parse_status()
        return True

    def _parse_status(self) -> None:
        *lines, self._status_buf = self._status_buf.split(b"\n")
        for line in lines:
            for item in line.decode("ascii", "replace").strip().strip("{}").split(","):
                key, sep, value = item.partition(":")
                if sep and value.strip().lstrip("-").isdigit():
                    self.status[key.strip().strip('"')] = int(value)

    def read_diag(self) -> bool:
        """Keep the tail of bwrap's and the agent's stderr (for error messages);
        False once every writer has closed it."""
        while True:
            try:
                chunk = os.read(self.diag_fd, 65536)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                return False
            self.diag = (self.diag + chunk)[-4096:]

    @property
    def init_pid(self) -> int:
        return self.status.get("child-pid", 0)

    @property
    def pid_namespace(self) -> int:
        return self.status.get("pid-namespace", 0)

    def pin_init(self) -> None:
        """Hold a pidfd on the sandbox's PID-namespace init, checked to be ours."""
        if self.init_pidfd >= 0 or not self.init_pid:
            return
        fd = os.pidfd_open(self.init_pid)
        namespace = procfs.namespace(self.init_pid)  # 0: gone
        if namespace != self.pid_namespace:
            os.close(fd)
            why = "it exited during start-up" if not namespace else "its pid was reused"
            raise LaunchError(self.backend, "sandbox init", why)
        self.init_pidfd = fd

    def find_pid_namespace(self) -> bool:
        """(``none``) Whether the agent made a PID namespace of its own, read from the
        host once it has said HELLO (its init is then running); pins the init.

        The started process's one child is then pid 1 of a namespace (its ``NSpid``,
        which anyone may read); the init is pinned by a pidfd checked afterwards to
        be that child. Both are non-dumpable, so their ``/proc/PID/ns`` may not be
        ours to read (unprivileged: their memory belongs to our user namespace): the
        namespace's inode is recorded where it is (0 where not), and nothing relies on
        it: no process leaves the init's subtree.
        """
        if self.backend == "native" or self.init_pidfd >= 0:
            return self.init_pidfd >= 0
        for child in _children(self.pid):
            fd = os.pidfd_open(child)
            ids = procfs.nspids(child)
            if procfs.ppid(child) == self.pid and len(ids) > 1 and ids[-1] == 1:
                self.init_pidfd = fd
                self.status.update(
                    {
                        "pid-namespace": procfs.namespace(self.pid, "pid_for_children"),
                        "child-pid": child,
                    }
                )
                return True
            os.close(fd)
        return False

    @property
    def namespaced(self) -> bool:
        """(``none``) It runs in a PID namespace of its own (``find_pid_namespace``)."""
        return self.backend != "native" and self.init_pidfd >= 0

    # -- the tree ------------------------------------------------------------------

    def tree(self) -> list[int]:
        """Host pids of every live process of the sandbox (see module rules)."""
        if self.backend == "native":
            if not self.pid_namespace:
                return []
            pids = sandbox_pids(self.init_pid, self.pid_namespace)
            if procfs.namespace(self.init_pid) == self.pid_namespace:
                pids.append(self.init_pid)
        elif self.namespaced:
            # no process leaves the namespace, nor the init's subtree: orphans go to
            # the init (or a reaper below it). The init may not be ours to look at
            # through /proc/PID/ns (find_pid_namespace), its tree always is.
            pids = [self.init_pid, *procfs.descendants(self.init_pid)] if self._init_alive() else []
        else:
            pids = [self.pid, *procfs.descendants(self.pid)] if _state(self.pid) else []
        return _live(pids)

    def _init_alive(self) -> bool:
        """The pinned init has not exited (its pid is still its own)."""
        import select

        return self.init_pidfd >= 0 and not select.select([self.init_pidfd], [], [], 0)[0]

    def socket_holders(
        self, connections: Sequence[tuple[tuple[str, int], tuple[str, int]]], max_fds: int
    ) -> tuple[dict[tuple[tuple[str, int], tuple[str, int]], tuple[int, ...]], bool]:
        """A process of the sandbox holding each TCP connection ``(local, remote)``.

        Read from the host: the sockets' inodes from the sandbox's network
        namespace (``/proc/INIT/net/tcp`` and ``tcp6``, read once for all of
        them), then the fd tables of the sandbox's processes, newest first,
        until every socket has a holder or ``max_fds`` fds were looked at. A
        holder comes back as its ancestry in sandbox pids, itself first, up to
        (not including) the sandbox's init.

        Returns:
            The holder found for each connection (none for a connection nobody
            holds any more, or for the ``none`` backend), and whether the scan
            gave up at ``max_fds`` before it had looked everywhere.
        """
        found: dict[tuple[tuple[str, int], tuple[str, int]], tuple[int, ...]] = {}
        if self.backend != "native" or not self.init_pid or not self.pid_namespace:
            return found, False
        inodes = _tcp_inodes(self.init_pid, connections)
        wanted = {f"socket:[{inode}]": conn for conn, inode in inodes.items()}
        depth = len(procfs.nspids(self.init_pid)) - 1
        if not wanted or depth < 0:
            return found, False
        budget = max_fds
        for pid in sorted(self.tree(), reverse=True):
            if pid == self.init_pid:
                continue
            where = _fd_dir(pid)
            try:
                fds = os.listdir(where)
            except OSError:
                continue
            for fd in fds:
                if budget <= 0:
                    return found, True
                budget -= 1
                try:
                    link = os.readlink(f"{where}/{fd}")
                except OSError:
                    continue
                conn = wanted.pop(link, None)
                if conn is not None:
                    found[conn] = self._ancestry(pid, depth)
                    if not wanted:
                        return found, False
        return found, False

    def _ancestry(self, pid: int, depth: int) -> tuple[int, ...]:
        """``pid`` and its ancestors below the sandbox's init, as sandbox pids."""
        chain = []
        cur = pid
        while cur and cur != self.init_pid and procfs.namespace(cur) == self.pid_namespace:
            ids = procfs.nspids(cur)
            if len(ids) <= depth:
                break
            chain.append(ids[depth])
            cur = procfs.ppid(cur)
        return tuple(chain)

    def adopt(self, cgroup: SandboxCgroup) -> None:
        """Move what the tree has so far into ``cgroup``; later forks inherit it.

        Native: the namespace's init, as soon as bwrap names it; the agent, which
        init may have forked before that move, follows with ``adopt_agent`` once it
        said HELLO (no polling for it meanwhile). Runs while the agent starts (each
        move costs milliseconds of RCU grace period in the kernel); the agent forks
        nothing before its first exec, which the port sends only after both.

        Raises:
            OSError: a move failed.
        """
        self.cgroup = cgroup
        if self.backend != "native":
            cgroup.add(self.pid)
            if self.namespaced:  # the init was forked before: it is moved on its own
                cgroup.add(self.init_pid)
            self.cgroup_complete = True
            return
        cgroup.add(self.init_pid)

    def adopt_agent(self) -> None:
        """Native, after HELLO: move the agent (and anything else init has forked by
        then) into the cgroup ``adopt`` made, unless it inherited it.

        Raises:
            OSError: a move failed.
            LaunchError: no process but init is in the sandbox.
        """
        assert self.cgroup is not None
        agent = sandbox_pids(self.init_pid, self.pid_namespace)
        if not agent:
            raise LaunchError("native", "cgroup", "the agent did not start")
        inside = set(self.cgroup.pids())
        for pid in agent:
            if pid not in inside:
                self.cgroup.add(pid)
        self.cgroup_complete = True

    def freeze(self) -> str:
        """Stop every process; returns how ("cgroup" or "sigstop").

        Raises:
            LaunchError: some process would not stop within the deadline.
        """
        if self.cgroup is not None and self.cgroup_complete:
            self.cgroup.freeze(True)
            _until(self.cgroup.is_frozen, STOP_DEADLINE_S, "cgroup freeze")
            return "cgroup"
        _signal_until(self.tree, SIGSTOP, lambda s: s in ("T", "t"), "SIGSTOP")
        return "sigstop"

    def thaw(self) -> None:
        if self.cgroup is not None and self.cgroup_complete:
            self.cgroup.freeze(False)
            _until(lambda: not self.cgroup or not self.cgroup.is_frozen(), STOP_DEADLINE_S, "thaw")
            return
        _signal_until(self.tree, SIGCONT, lambda s: s not in ("T", "t"), "SIGCONT")

    def kill(self) -> None:
        """Kill the whole tree and make sure of it from the host (see module rules).

        Raises:
            LaunchError: a process of the sandbox survived ``KILL_DEADLINE_S``.
        """
        self._stopping = True
        if self._killed:
            return
        import signal

        if self.cgroup is not None:
            try:
                self.cgroup.kill()
            except OSError:
                pass  # the signals below do the same, one by one
        if self.backend == "native":
            # bwrap's children set PR_SET_PDEATHSIG themselves, after clone(): a bwrap
            # killed in between leaves its child, the namespace's init, running. So
            # stop bwrap (no more clones, and its dead children stay unreaped, their
            # pids not reused), kill every child of it (each is a namespace's init:
            # its death kills the namespace), then bwrap itself.
            _send(self.pidfd, SIGSTOP)
            if self.reap() is None:
                _signal_until(lambda: [self.pid], SIGSTOP, lambda s: s in ("T", "t"), "SIGSTOP")
            namespaces = {self.pid_namespace} - {0}
            for child in _children(self.pid):
                namespaces.add(procfs.namespace(child))
                _kill(child, SIGKILL)
            if self.init_pidfd >= 0:
                try:
                    signal.pidfd_send_signal(self.init_pidfd, SIGKILL)
                except OSError:
                    pass  # already gone
            _send(self.pidfd, SIGKILL)
            _send(self.pidfd, SIGCONT)
            self.reap(block=True)
            self._wait_gone(lambda: _live(_in_namespaces(namespaces - {0})))
        elif self.namespaced:
            # The init's death kills every process of its namespace (none can leave it),
            # and its exit is reported only once they are all gone: the kernel waits
            # for them. Then the parent outside exits on its own.
            import select

            _send(self.init_pidfd, SIGKILL)
            if not select.select([self.init_pidfd], [], [], KILL_DEADLINE_S)[0]:
                left = self.tree()
                raise LaunchError(
                    self.backend, "destroy", f"processes {left} survived SIGKILL for 5 s"
                )
            _send(self.pidfd, SIGKILL)
            self.reap(block=True)
        else:
            # Stop the agent so it cannot spawn, then stop and kill the tree below it
            # while it is still there to find (the agent adopts orphans: a subreaper).
            # The cgroup's members are found even once the agent is gone (cgroup.kill
            # may have killed it), and they are killed one by one all the same:
            # cgroup.kill misses a process whose leader has exited (the SIGKILL waits
            # on the dead leader's own queue).
            if self.reap() is None:
                _send(self.pidfd, SIGSTOP)
            below = lambda: _live(self._below_agent())  # noqa: E731
            if self.cgroup is None or not self.cgroup.freezing():
                # (in a frozen cgroup nothing forks, nor takes a SIGSTOP: SIGKILL will do.
                # Asked, not reached: once cgroup.kill took the agent, the cgroup may say
                # "frozen 0" while the rest stays frozen)
                _signal_until(below, SIGSTOP, lambda s: s in ("T", "t"), "SIGSTOP")
            self._wait_gone(below)
            _send(self.pidfd, SIGKILL)
            self.reap(block=True)
        self._killed = True

    def _below_agent(self) -> list[int]:
        """The ``none`` tree without the agent: its descendants and its cgroup's members."""
        found = set(self.cgroup.pids()) if self.cgroup is not None else set()
        if self.exit_status is None:  # once reaped, its pid may be another process's
            found.update(procfs.descendants(self.pid))
        found.discard(self.pid)
        return sorted(found)

    def _wait_gone(self, live: Callable[[], list[int]]) -> None:
        deadline = time.monotonic() + KILL_DEADLINE_S
        while True:
            left = live()
            if not left:
                return
            _signal_listed(left, live, SIGKILL)
            if time.monotonic() > deadline:
                raise LaunchError(
                    self.backend, "destroy", f"processes {left} survived SIGKILL for 5 s"
                )
            time.sleep(0.0005)

    def reap(self, *, block: bool = False) -> int | None:
        """The top process's wait status once it has exited (None while it runs)."""
        if self.exit_status is not None:
            return self.exit_status
        try:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            pid, status = self.pid, 0
        if pid == 0:
            return None
        self.exit_status = status
        if self.popen is not None:
            self.popen.returncode = os.waitstatus_to_exitcode(status)
        return status

    def close(self) -> None:
        """Close every fd and remove the cgroup and the session directory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for fd in (self.pidfd, self.init_pidfd, self.diag_fd, self.status_fd):
            if fd is not None and fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.channel.close()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.session is not None:
            self.session.close()


def _send(pidfd: int, sig: int) -> None:
    import signal

    try:
        signal.pidfd_send_signal(pidfd, sig)
    except OSError:
        pass  # exited


def _signal_listed(pids: list[int], listed: Callable[[], list[int]], sig: int) -> None:
    """Send ``sig`` to each of ``pids`` that ``listed`` still names once a pidfd holds
    it: a pid that exited and was reused between the listing and the signal is then
    another process, no longer listed as the sandbox's, and gets nothing."""
    fds: dict[int, int] = {}
    for pid in pids:
        try:
            fds[pid] = os.pidfd_open(pid)
        except OSError:
            continue  # gone
    try:
        if fds:
            still = set(listed())
            for pid, fd in fds.items():
                if pid in still:
                    _send(fd, sig)
    finally:
        for fd in fds.values():
            os.close(fd)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass  # exited meanwhile


def _state(pid: int) -> str:
    """The one-letter state of ``pid``'s leader ("" if it is gone)."""
    return procfs.state_and_threads(procfs.read_stat(pid))[0]


def _thread_states(pid: int) -> list[str]:
    """The states of ``pid``'s live threads; [] once none is left (module rules).

    One read does for a process of one thread; the others' threads are read
    one by one from ``/proc/PID/task``. A zombie leader still counts itself in
    the number of threads, so only a leader alone is a plain zombie.
    """
    state, threads = procfs.state_and_threads(procfs.read_stat(pid))
    if threads <= 1:
        return [] if state in DEAD_STATES else [state]
    return [state for _tid, state in _live_threads(pid)]


def _live_threads(pid: int) -> list[tuple[str, str]]:
    """(tid, state) of each thread of ``pid`` that is not dead, from ``/proc/PID/task``."""
    found = []
    for tid in procfs.tasks(pid):  # [] once gone
        state = procfs.state_and_threads(procfs.read_stat(pid, tid))[0]
        if state not in DEAD_STATES:
            found.append((tid, state))
    return found


def _fd_dir(pid: int) -> str:
    """Where ``pid``'s fds show: ``/proc/PID/fd``, or once its leader has exited (its
    own shows none then), the same table through a live thread of it."""
    if _state(pid) not in DEAD_STATES:
        return procfs.fd_dir(pid)
    live = _live_threads(pid)
    return procfs.fd_dir(pid, live[0][0] if live else None)


def _alive(pid: int) -> bool:
    """Whether some thread of ``pid`` is still there to run (module rules)."""
    state, threads = procfs.state_and_threads(procfs.read_stat(pid))
    if state not in DEAD_STATES:
        return True
    return threads > 1 and bool(_live_threads(pid))


def _tcp_inodes(
    pid: int, connections: Sequence[tuple[tuple[str, int], tuple[str, int]]]
) -> dict[tuple[tuple[str, int], tuple[str, int]], int]:
    """The inodes of the IPv4 TCP sockets ``(local, remote)`` in ``pid``'s network
    namespace, also as IPv4-mapped IPv6 (left out: none, or one without an owner)."""
    import struct

    def hex4(address: str, port: int) -> tuple[str, str]:
        raw = socket.inet_aton(address)
        mapped = socket.inet_pton(socket.AF_INET6, f"::ffff:{address}")
        v4 = f"{struct.unpack('<I', raw)[0]:08X}:{port:04X}"
        v6 = "".join(f"{w:08X}" for w in struct.unpack("<4I", mapped)) + f":{port:04X}"
        return v4, v6

    wanted: dict[str, dict[tuple[str, str], tuple[tuple[str, int], tuple[str, int]]]] = {
        "tcp": {},
        "tcp6": {},
    }
    for local, remote in connections:
        try:
            (l4, l6), (r4, r6) = hex4(*local), hex4(*remote)
        except OSError:
            continue  # not an IPv4 address: not a connection to our listeners
        wanted["tcp"][(l4, r4)] = (local, remote)
        wanted["tcp6"][(l6, r6)] = (local, remote)
    found: dict[tuple[tuple[str, int], tuple[str, int]], int] = {}
    for table, want in wanted.items():
        if not want:
            continue
        for fields in procfs.net_table(pid, table):
            if len(fields) > 9:
                conn = want.get((fields[1], fields[2]))
                if conn is not None and conn not in found and int(fields[9]):
                    found[conn] = int(fields[9])
    return found


def _children(pid: int) -> list[int]:
    """The direct children of ``pid``."""
    return procfs.children_by_parent().get(pid, [])


def _in_namespaces(namespaces: set[int]) -> list[int]:
    """Host pids of every process in one of the PID ``namespaces``."""
    if not namespaces:
        return []
    found = []
    for pid in procfs.pids():
        if procfs.namespace(pid) in namespaces:
            found.append(pid)
    return found


def _live(pids: list[int]) -> list[int]:
    return [p for p in pids if _alive(p)]


def _until(done: Callable[[], bool], deadline_s: float, what: str) -> None:
    deadline = time.monotonic() + deadline_s
    while not done():
        if time.monotonic() > deadline:
            raise LaunchError("native", what, f"not done after {deadline_s} s")
        time.sleep(0.0005)


def _signal_until(
    pids: Callable[[], list[int]], sig: int, reached: Callable[[str], bool], what: str
) -> None:
    """Send ``sig`` to every pid until each live thread of each is in the wanted state
    (new pids too). A pid is signalled even if its leader has exited: ``kill``
    still reaches the rest of its thread group."""
    deadline = time.monotonic() + STOP_DEADLINE_S
    while True:
        pending = []
        for pid in pids():
            if not all(reached(state) for state in _thread_states(pid)):
                pending.append(pid)
        if not pending:
            return
        _signal_listed(pending, pids, sig)
        if time.monotonic() > deadline:
            states = ", ".join(
                f"{p} {procfs.comm(p)} {''.join(_thread_states(p))}" for p in pending
            )
            raise LaunchError("native", what, f"processes did not respond: {states}")
        time.sleep(0.0005)


def _pipes() -> tuple[int, int, int, int]:
    diag_r, diag_w = os.pipe2(os.O_CLOEXEC)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(diag_r, False)
    os.set_blocking(status_r, False)
    return diag_r, diag_w, status_r, status_w


def supervisor_hook_arg(plan: SpecPlan, lock_fd: int) -> str:
    """The agent's ``--hook`` for the creation-time supervisor (``supervisor.agent_hook``);
    ``lock_fd``: the user's creation lock as the agent inherits it, or -1."""
    import marshal

    from sandhold.backends.linux.native import supervisor_setup

    setup = supervisor_setup(plan.creation, plan.landlock)
    setup["lock_fd"] = lock_fd
    return "sandhold.backends.linux.supervisor.agent_hook:hook=" + marshal.dumps(setup).hex()


def spawn_native(
    plan: SpecPlan,
    *,
    bwrap: str,
    session: Session,
    boot: AgentBoot,
    network: NetworkSetup | None = None,
    masked: tuple[tuple[str, str], ...] = (),
) -> SandboxProcess:
    """Start bwrap from ``plan`` with the agent inside; returns at once (not yet ready).

    ``masked``: (path in the sandbox, host file) pairs bound read-only over the plan's
    mounts: masked credential files' copies and the trust bundle (``Session.write_copies``).

    Raises:
        LaunchError: the seccomp program or the spawn failed, or a bind source is
            not the object the plan saw (``hostfs.pin_sources``).
        UnenforceablePolicy: no seccomp syscall table for this machine.
    """
    import socket
    import subprocess

    from sandhold.backends.linux.bwrap import BwrapFds, bwrap_argv
    from sandhold.backends.linux.hostfs import pin_sources
    from sandhold.backends.linux.seccomp import build_program, native_arch

    program = build_program(plan.syscalls, native_arch())
    host_end, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    host_end.setblocking(False)
    seccomp_fd = os.memfd_create("sandhold-seccomp", os.MFD_CLOEXEC)
    code_fd = _code_fd(boot) if boot.code else -1
    reaper_fd = _reaper_fd()
    diag_r, diag_w, status_r, status_w = _pipes()
    child_fds = [agent_end.fileno(), seccomp_fd, status_w, diag_w]
    child_fds += [fd for fd in (code_fd, reaper_fd) if fd >= 0]
    lock_fd = -1
    pin_fds: list[int] = []
    try:
        # every source bwrap binds, opened and checked against the plan: a path
        # swapped since the plan fails the launch here, before anything starts
        pinned = pin_sources(plan.pins)
        pin_fds = [fd for _, fd in pinned]
        child_fds += pin_fds
        if plan.creation is not None:
            from sandhold.backends.linux.session import creation_lock

            lock_fd = creation_lock(session.base)
            child_fds.append(lock_fd)
        os.write(seccomp_fd, program)
        os.lseek(seccomp_fd, 0, os.SEEK_SET)
        fds = BwrapFds(
            seccomp=seccomp_fd,
            status=status_w,
            hidden_file=session.hidden_file,
            hidden_dir=session.hidden_dir,
            pinned=tuple(pinned),
            masked=masked,
        )
        confined = plan.creation is not None or plan.landlock is not None
        extra = ("--hook", supervisor_hook_arg(plan, lock_fd)) if confined else ()
        if lock_fd >= 0:
            extra = ("--keep-fd", str(lock_fd), *extra)
        if reaper_fd >= 0:
            extra = ("--reaper", str(reaper_fd), *extra)
        command = agent_argv(
            boot, agent_end.fileno(), code_fd, extra, _landed(plan, session, masked)
        )
        share = network is not None and network.share_net
        argv = bwrap_argv(
            bwrap, plan.fs, fds, plan.workdir, command, share_net=share, host_root=False
        )
        keep = tuple(fd for fd in child_fds if fd != diag_w)
        popen = None
        try:
            if network is not None:
                pid = network.spawn(argv, AGENT_ENV, keep, diag_w)
            else:
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=diag_w,
                    env=AGENT_ENV,
                    pass_fds=keep,
                    start_new_session=True,
                )
                pid = popen.pid
        except OSError as exc:
            raise LaunchError("native", "exec bwrap", f"{bwrap}: {exc.strerror}") from exc
    except BaseException:
        host_end.close()
        for fd in (diag_r, status_r):
            os.close(fd)
        raise
    finally:
        agent_end.close()
        for fd in (seccomp_fd, status_w, diag_w, code_fd, reaper_fd, lock_fd, *pin_fds):
            if fd >= 0:
                os.close(fd)
    return SandboxProcess(
        "native", pid, host_end, diag_r, popen=popen, status_fd=status_r, session=session
    )


def spawn_host(workdir: str, *, boot: AgentBoot) -> SandboxProcess:
    """Start the agent directly on the host (backend ``none``), in a PID namespace of
    its own where the host allows it (module rules).

    Raises:
        LaunchError: the interpreter could not be started.
    """
    import socket
    import subprocess

    host_end, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    host_end.setblocking(False)
    code_fd = _code_fd(boot) if boot.code else -1
    reaper_fd = _reaper_fd()
    diag_r, diag_w = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(diag_r, False)
    keep = (agent_end.fileno(), *(fd for fd in (code_fd, reaper_fd) if fd >= 0))
    extra = ("--pid-namespace", *(("--reaper", str(reaper_fd)) if reaper_fd >= 0 else ()))
    try:
        popen = subprocess.Popen(
            agent_argv(boot, agent_end.fileno(), code_fd, extra),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=diag_w,
            env=AGENT_ENV,
            cwd=workdir,
            pass_fds=keep,
            start_new_session=True,
        )
    except OSError as exc:
        host_end.close()
        os.close(diag_r)
        raise LaunchError("none", "start agent", f"{boot.python}: {exc.strerror}") from exc
    finally:
        agent_end.close()
        os.close(diag_w)
        for fd in (code_fd, reaper_fd):
            if fd >= 0:
                os.close(fd)
    return SandboxProcess("none", popen.pid, host_end, diag_r, popen=popen)


# --- the egress network: a namespace whose only exits are the session's proxies ----------


class _Listener(socket.socket):
    """A proxy listener that knows its own address and can be cut off at once.

    ``local`` pairs with an ``EgressDecision``'s ``client`` to name the one
    socket in the sandbox's namespace a decision is about. ``cut`` stops the
    listener at once: shut down (queued connections are reset, new ones
    refused) and nothing more is accepted.
    """

    local: tuple[str, int] = ("", 0)
    cut_off = False

    def accept(self) -> tuple[socket.socket, tuple[str, int]]:
        if self.cut_off:
            raise BlockingIOError(11, "the listener is cut off")
        return super().accept()

    def cut(self) -> None:
        self.cut_off = True
        if self.fileno() >= 0:
            try:
                self.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # not listening any more: nothing left to stop


def _cut(sock: socket.socket) -> None:
    if sock.fileno() >= 0 and sock.type == socket.SOCK_STREAM:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not listening any more: nothing left to stop


def _adopt_listener(sock: socket.socket) -> _Listener:
    listener = _Listener(fileno=sock.detach())
    address = listener.getsockname()
    listener.local = (str(address[0]), int(address[1]))
    return listener


class EgressNetwork:
    """The sandbox's network: a namespace whose only exits are this session's proxies.

    A ``NetworkSetup``. ``spawn`` starts bubblewrap through
    ``netns.spawn_in_netns``: a fresh user and network namespace with only
    loopback and two listeners in it, 127.0.0.1:3128 (HTTP proxy) and
    127.0.0.1:1080 (SOCKS5), held by this process; with ``transparent`` also a
    route through loopback that the namespace's ruleset diverts to the
    transparent listener and the DNS stub (else no route, no DNS). The first
    connection starts the session's ``EgressSession`` (and loads the proxies),
    so a launch never waits for them: until then connections wait in the
    listeners' backlog. Nothing is shared between sessions: each has its own
    namespace, listeners and proxies.

    Args:
        policy: the session's domain policy (decided by the caller, fixed).
        on_decision: called in the event loop with every ``EgressDecision`` and
            the connection it is about, ``(client, proxy)`` addresses as seen in
            the sandbox, or None if unknown. It must not block; it may return an
            awaitable, and a refusal is answered once that is done (at most 2 s
            later), so the client can still be looked at off the loop.
        budget: the session's share of the process's connections
            (``net.budget``); ``None``: the proxies' own cap only.
        label: names the sandbox in the proxies' log lines.
        resolver: the proxies' resolver (``net.outbound.LookupThreads``);
            ``None``: the event loop's ``getaddrinfo``.
        ask: awaited for a target no list decides (``outbound.Dialer``).
        credential_hooks: the HTTP proxy's ``terminator`` and ``plaintext_injector``
            for masked credentials (``tls_terminate.credential_hooks``), passed on to
            the session; empty: no injection anywhere.
        transparent: divert every TCP connection and DNS query of the sandbox
            to the session (issue 20, ``net.transparent``): programs that ignore
            the proxy variables are decided by the same policy; other datagrams
            are refused with ``EPERM``, each a decision. ``False``: only the two
            proxies' listeners, no route, no DNS (a program that ignores the
            proxy variables then reaches nothing: ``policy.env.proxy_environment``
            sets no workaround for it; no launch of sandhold's asks for this).

    Cancellation: ``close`` cuts the network before it returns (the listeners
    are shut down, or closed if the proxies never started) and returns a task
    that aborts the open connections and closes the listeners; cancelling an
    ``await`` of it leaves that task to finish on its own.
    """

    share_net = True

    def __init__(
        self,
        policy: DomainPolicy,
        *,
        on_decision: Callable[
            [EgressDecision, tuple[tuple[str, int], tuple[str, int]] | None],
            Awaitable[object] | None,
        ],
        budget: SessionBudget | None = None,
        label: str = "",
        resolver: Resolver | None = None,
        ask: Asker | None = None,
        credential_hooks: Mapping[str, object] | None = None,
        transparent: bool = True,
    ) -> None:
        self._policy = policy
        self._credential_hooks = dict(credential_hooks or {})
        self._ask = ask
        self._transparent = transparent
        self._diverted: TransparentEgress | None = None
        self._spare: tuple[socket.socket, ...] = ()  # every transparent socket, to watch and cut
        self._pending: (
            tuple[
                tuple[socket.socket, ...],
                tuple[socket.socket, ...],
                tuple[socket.socket, ...],
                socket.socket,
            ]
            | None
        ) = None
        # a diverted connection's client -> its original destination, while it is decided
        self._destinations: dict[tuple[str, int], tuple[str, int]] = {}
        self._budget = budget
        self._label = label
        self._resolver = resolver
        self._on_decision = on_decision
        self._listeners: tuple[_Listener, _Listener] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watching = False
        self._session: EgressSession | None = None
        self._rest: asyncio.Task[None] | None = None
        self._closed = False
        self.netns = 0  # the network namespace's inode, once spawned
        self.failure: BaseException | None = None  # why the proxies could not start

    @property
    def started(self) -> bool:
        """Whether the proxies are serving (they start at the first connection)."""
        return self._session is not None

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], pass_fds: Sequence[int], stderr: int
    ) -> int:
        """Fork the namespace helper, which execs bwrap (``argv``); returns its pid.

        Call it in the event loop's thread: the proxies will serve from that loop.

        Raises:
            LaunchError: the namespace or the listeners could not be made.
        """
        import asyncio

        from sandhold.backends.linux.netns import spawn_in_netns

        if self._closed or self._listeners is not None:
            raise LaunchError("native", "network namespace", "this network was used already")
        loop = asyncio.get_running_loop()
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        diverted: list[TransparentSockets] | None = [] if self._transparent else None
        try:
            pid, http, socks = spawn_in_netns(
                argv[0],
                argv,
                env,
                pass_fds,
                stdio=(devnull, devnull, stderr),
                new_session=True,
                transparent=diverted,
            )
        except OSError as exc:
            raise LaunchError("native", "network namespace", str(exc)) from exc
        finally:
            os.close(devnull)
        self._listeners = (_adopt_listener(http), _adopt_listener(socks))
        if diverted:
            self._take_transparent(diverted[0])
        try:
            self.netns = procfs.namespace(pid, "net")
        except OSError:
            self.netns = 0  # gone already: the launch will fail on its own
        self._loop = loop
        for fd in self._watched():
            loop.add_reader(fd, self._first_use)
        self._watching = True
        return pid

    def _take_transparent(self, sockets: TransparentSockets) -> None:
        # the proxies' code loads at the first connection, not here (launch time)
        tcp = tuple(_adopt_listener(sock) for sock in sockets.tcp)
        self._pending = (tcp, sockets.dns_udp, sockets.dns_tcp, sockets.nflog)
        self._spare = (*tcp, *sockets.dns_udp, *sockets.dns_tcp, sockets.nflog)

    def _start_transparent(self) -> TransparentEgress | None:
        if self._pending is None:
            return None
        from sandhold.net.transparent import TransparentEgress
        from sandhold.policy.transparent import SyntheticNames

        tcp, udp, dns_tcp, nflog = self._pending
        self._diverted = TransparentEgress(
            tcp=tcp,
            dns_udp=udp,
            dns_tcp=dns_tcp,
            nflog=nflog,
            policy=lambda: self._policy,
            on_decision=self._decided,
            names=SyntheticNames(),
            destinations=self._destinations,
        )
        return self._diverted

    def _watched(self) -> list[int]:
        fds = [listener.fileno() for listener in self._listeners or ()]
        return fds + [sock.fileno() for sock in self._spare if sock.fileno() >= 0]

    def environment(self) -> Mapping[str, str]:
        """The proxy variables every exec gets (``policy.env.proxy_environment``)."""
        from sandhold.policy.env import HTTP_PROXY_PORT, SOCKS_PROXY_PORT, proxy_environment

        return proxy_environment(HTTP_PROXY_PORT, SOCKS_PROXY_PORT)

    def exec_environment(self, exec_id: int) -> Mapping[str, str]:
        """Nothing per exec: refusals are attributed from the host (``socket_holders``)."""
        return {}

    def _unwatch(self) -> None:
        loop, listeners = self._loop, self._listeners
        if self._watching and loop is not None and listeners is not None and not loop.is_closed():
            for fd in self._watched():
                loop.remove_reader(fd)
        self._watching = False

    def _first_use(self) -> None:
        self._unwatch()
        if self._closed or self._listeners is None:
            return
        http, socks = self._listeners
        try:
            from sandhold.net.egress import EgressSession

            diverted = self._start_transparent()
            session = EgressSession(
                http_listener=http,
                socks_listener=socks,
                policy=lambda: self._policy,
                on_decision=self._decided,
                budget=self._budget,
                label=self._label,
                resolver=self._resolver,
                ask=self._ask,
                extra_listeners=diverted.listeners() if diverted is not None else (),
                **self._credential_hooks,  # type: ignore[arg-type]
            )
            session.start()
            if diverted is not None:
                diverted.start()
        except Exception as exc:  # fail closed: the sandbox loses its network, and we say so
            import logging

            self.failure = exc
            logging.getLogger("sandhold").error(
                "egress: the proxies could not start (%s); the sandbox has no network", exc
            )
            self._close_listeners()
            return
        self._session = session

    def _decided(self, decision: EgressDecision) -> Awaitable[object] | None:
        # the proxy reports which sandbox-side connection it decided for; with the
        # listener it came in on, that names one socket in the sandbox's namespace
        listeners = self._listeners or ()
        local = next(
            (
                lst.local
                for lst, kind in zip(listeners, ("http", "socks5"), strict=False)
                if kind == decision.proxy
            ),
            None,
        )
        if decision.proxy == "transparent":
            # the sandbox's socket still names where it was going, not our listener
            local = self._destinations.get(decision.client)
        where = (decision.client, local) if decision.client[1] and local else None
        return self._on_decision(decision, where)

    def _close_listeners(self) -> None:
        for listener in self._listeners or ():
            listener.cut()
            listener.close()
        for sock in self._spare:
            _cut(sock)
            sock.close()

    def close(self) -> asyncio.Task[None] | None:
        """Cut the network now; returns the task finishing the rest, if any (idempotent)."""
        if self._closed:
            return self._rest
        self._closed = True
        self._unwatch()
        session = self._session
        if session is None or self._loop is None or self._loop.is_closed():
            self._close_listeners()
            return None
        for listener in self._listeners or ():
            listener.cut()
        for sock in self._spare:
            _cut(sock)  # the DNS stub's sockets and the diverted listeners: now
        self._rest = self._loop.create_task(self._finish(session))
        return self._rest

    async def _finish(self, session: EgressSession) -> None:
        try:
            await session.aclose()
        finally:
            if self._diverted is not None:
                await self._diverted.aclose()
