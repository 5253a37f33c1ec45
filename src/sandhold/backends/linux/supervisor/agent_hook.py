"""The creation-time supervisor as a hook of the in-sandbox agent (``SandboxPort`` launches).

The port starts the agent with ``--hook sandhold.backends.linux.supervisor.agent_hook:hook=HEX``,
``HEX`` being the hex of a ``marshal`` blob: ``{"program": bytes or None,
"policy": {CreationPolicy fields} or None, "landlock": [paths] or None,
"lock_fd": fd}`` (no program: Landlock only, nothing trapped; ``lock_fd``, when
there is a program: the user's creation lock, inherited). Then, for every exec:

- ``warm`` (agent, right after ``HELLO``): the agent enters the Landlock domain
  (before any thread exists, so the supervisor thread and every exec inherit it)
  and imports what the supervisor needs: ~10 ms the first exec no longer waits
  for (with 50 sandboxes launched at once, their first execs waited ~400 ms for
  it). It starts nothing: the host may still be moving the agent into the
  sandbox's cgroup, and a process forked before that move would stay outside.
  A failure is left for ``prepare``, which tries again and fails the exec;
- ``prepare`` (agent, before fork): on the first exec, the supervisor thread,
  the compiled front and the thread the execs fork from (``agent.main.Forker``, in
  the command's own nested domain); then a socket pair for the listener;
- ``pre_exec`` (child, before exec): the notifying filter; the listener goes to
  the agent (``supervisor.prepare_child``). A failure fails the exec: the
  command never runs unconfined;
- ``spawned`` (agent): the listener goes to the compiled front (``start_front``,
  started with the supervisor thread when built), tagged with the exec id: it
  performs the ordinary calls and passes the others to the supervisor thread.
  Without the front, or once it is gone, the listener joins the thread itself.

Refused creations come from the supervisor thread; they are queued and an
eventfd wakes the agent's loop, which sends them as ``VIOLATION`` frames
attributed to the exec whose process tree made the call (the agent is
single-threaded and its channel is not thread-safe).
"""

from __future__ import annotations

import marshal
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandhold.agent.main import Agent, ExecContext
    from sandhold.backends.linux.supervisor.supervisor import Supervisor
    from sandhold.backends.linux.supervisor.violation import Violation
    from sandhold.policy.creation import CreationPolicy


class SupervisorHook:
    def __init__(self, agent: Agent, setup: dict[str, object]) -> None:
        program, fields, landlock = setup.get("program"), setup.get("policy"), setup.get("landlock")
        if (program is None) != (fields is None) or (program is None and landlock is None):
            raise ValueError("supervisor setup: a program with its policy, or Landlock paths")
        if program is not None and not (isinstance(program, bytes) and isinstance(fields, dict)):
            raise ValueError("supervisor setup: bad program or policy")
        if landlock is not None and not isinstance(landlock, tuple | list):
            raise ValueError("supervisor setup: bad Landlock paths")
        self.agent = agent
        self.program: bytes | None = program
        self.fields: dict[str, object] | None = fields  # type: ignore[assignment]
        self.landlock = None if landlock is None else tuple(str(p) for p in landlock)
        lock_fd = setup.get("lock_fd", -1)
        if not isinstance(lock_fd, int):
            raise ValueError("supervisor setup: bad lock fd")
        from sandhold.backends.linux.supervisor.runner import own_lock

        self.lock_fd = own_lock(lock_fd)  # kept by the agent (--keep-fd), close-on-exec
        self.supervisor: Supervisor | None = None
        self.front = -1  # the compiled front's control socket (start_front), if it runs
        self.queue: list[Violation] = []  # append/pop(0) are atomic under the GIL
        self.wake = -1
        self.confined = False
        self.built: tuple[CreationPolicy, Supervisor] | None = None
        self.program_fd = -1  # the filter, for the compiled reaper (compiled_pre_exec)

    def _start(self, *, start: bool = True) -> Supervisor | None:
        """Build the supervisor (no thread, no process: ``warm`` may), then start it."""
        from sandhold.backends.linux.supervisor import notify
        from sandhold.backends.linux.supervisor.front import compiled_front, start_front
        from sandhold.backends.linux.supervisor.supervisor import Supervisor
        from sandhold.policy.creation import CreationPolicy

        if self.built is None:
            self.wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            self.agent.watch(self.wake, self._drain)
            assert self.fields is not None
            policy = CreationPolicy(**self.fields)  # type: ignore[arg-type]
            self.built = policy, Supervisor(policy, self._refused, lock_fd=self.lock_fd)
        if not start:
            return None
        policy, supervisor = self.built
        exe = compiled_front()
        if exe is not None:
            try:  # before the thread starts: no fork beside a running thread
                self.front = start_front(exe, policy, supervisor, self.lock_fd)
            except OSError:
                self.front = -1  # the thread serves every listener itself
        # Every exec shares one domain, entered by a thread that only forks (Landlock
        # nests the calling thread only): the execs may signal and trace each other,
        # make no name themselves, nor signal what stands outside it: the front that
        # holds their listeners, the supervisor thread (which keeps the outer domain's
        # rights, cross-directory links and renames included), and the agent itself,
        # whose pid is its main thread's: a SIGSTOP there would hang every exec.
        supervisor.start()
        notify.load()  # libc before the fork: the child need not load it
        from sandhold.agent.main import Forker
        from sandhold.backends.linux.supervisor.landlock import confine_command

        forker = Forker(self.agent.reapers, confine_command)
        self.agent.fork, self.agent.spawn_from = forker.fork, forker.call
        self.supervisor = supervisor
        return supervisor

    def _refused(self, violation: Violation) -> None:  # the supervisor thread
        self.queue.append(violation)
        os.eventfd_write(self.wake, 1)

    def _drain(self, fd: int, _events: int) -> None:  # the agent's loop
        try:
            os.eventfd_read(fd)
        except BlockingIOError:
            pass
        while self.queue:
            v = self.queue.pop(0)
            exec_id = v.tag if isinstance(v.tag, int) else 0
            self.agent.violation(exec_id, v.action, v.target, f"{v.syscall} {v.target}", v.rule)

    # -- the hook ------------------------------------------------------------------------

    def _confine_agent(self) -> None:
        """Landlock on the agent itself, before any thread: every exec inherits the domain,
        and so do the creations the supervisor thread performs for them."""
        from sandhold.backends.linux.supervisor import notify

        notify.load()  # libc before the first fork: the children need not load it
        from sandhold.backends.linux.supervisor.runner import no_core_dumps

        no_core_dumps()
        if self.landlock is not None:
            from sandhold.backends.linux.supervisor.landlock import restrict_writes

            restrict_writes(self.landlock)
        self.confined = True

    def warm(self) -> None:
        try:
            if not self.confined:
                self._confine_agent()
            if self.program is not None:
                self._start(start=False)
                from sandhold.backends.linux.supervisor import front  # noqa: F401
        except Exception:  # prepare does it again, and fails the exec
            pass

    def prepare(self, ctx: ExecContext) -> tuple[int, int] | None:
        if not self.confined:
            self._confine_agent()
        if self.program is None:
            return None
        if self.supervisor is None:
            self._start()
        import _socket  # not ``socket``: it imports enum (~4 ms)

        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        return ours.detach(), theirs.detach()

    def pre_exec(self, ctx: ExecContext, state: object) -> None:  # the child
        if state is None:
            return  # Landlock only: inherited from the agent
        from sandhold.backends.linux.supervisor.supervisor import prepare_child

        assert isinstance(state, tuple) and self.program is not None
        ours, theirs = state
        os.close(ours)
        prepare_child(theirs, self.program, confine=False)  # the agent's domain: _start
        os.close(theirs)

    def compiled_pre_exec(self, ctx: ExecContext, state: object) -> tuple[int, int] | None:
        """``pre_exec`` for the agent's compiled reaper: the filter as a sealed memfd
        (made once) and the socket its listener goes over; None: the Python reaper."""
        if state is None:
            return -1, -1  # Landlock only: inherited from the agent
        assert isinstance(state, tuple) and self.program is not None
        if self.program_fd < 0:
            try:
                from sandhold.backends.linux.supervisor.notify import sealed_memfd

                self.program_fd = sealed_memfd("sandhold-filter", self.program)
            except OSError:
                return None
        return self.program_fd, state[1]

    def spawned(self, ctx: ExecContext, state: object, pid: int) -> None:
        if state is None:
            return
        from sandhold.backends.linux.supervisor.supervisor import receive_listener

        assert isinstance(state, tuple) and self.supervisor is not None
        ours, theirs = state
        os.close(theirs)
        try:
            listener = receive_listener(ours)
        except OSError:
            return  # the child failed before its exec (and reports why); nothing runs
        finally:
            os.close(ours)
        if self.front >= 0:
            from sandhold.backends.linux.supervisor.front import front_add_listener

            try:
                front_add_listener(self.front, listener, ctx.exec_id)
            except OSError:  # the front is gone (the sandbox may kill it): the thread
                os.close(self.front)
                self.front = -1
            else:
                os.close(listener)
                return
        self.supervisor.add_listener(listener, ctx.exec_id)


def hook(agent: Agent, arg: str) -> SupervisorHook:
    setup = marshal.loads(bytes.fromhex(arg))
    if not isinstance(setup, dict):
        raise ValueError("supervisor setup is not a mapping")
    return SupervisorHook(agent, setup)
