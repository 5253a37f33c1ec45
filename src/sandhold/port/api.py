"""Sandboxes as a library: launch from a spec, exec many commands, stream events, freeze, destroy.

``SandboxPort`` is the async lifecycle API (``BlockingSandboxPort`` wraps it
for scripts); ``SandboxManager`` keeps the CLI's one-shot "wrap this command".

Rules:
- A sandbox moves only through ``spec.TRANSITIONS``; an illegal call raises
  ``InvalidTransition`` and changes nothing.
- Backend choice (F-BE-1, F-BE-6, F-BE-7): an explicit backend is used exactly
  or the launch fails (``microvm`` always fails here: sandhold has no microVM
  backend, and never falls back). An unspecified backend follows the port's
  ``sandbox`` policy: ``"require"`` (default) means native or
  ``BackendUnavailable``; ``"on"`` means native when the host offers it, else
  ``none``; ``"off"`` means ``none``. Every fallback is logged, and the handle
  and every event carry the backend in use.
- Everything the sandbox says is untrusted: a malformed or impossible frame from
  the agent puts the sandbox in ``error`` and kills it. Its text is bounded: each
  violation field and ``LOG`` message is cut to ``MAX_AGENT_TEXT`` characters,
  ``LOG`` lines are logged at most once a second, and a reader's queued
  violations are bounded by count and by bytes.
- Timeouts, kills, freezing and destroying are done by the host. A timeout or
  kill is delivered by the agent (SIGKILL to the command's whole tree: its process
  group and everything below its reaper, ``setsid`` children included); if the
  agent does not report the exit within ``kill_grace`` the sandbox goes to
  ``error`` and is killed whole. Time spent suspended does not count.
- ``ping`` is a liveness check that waits ``timeout`` at most; each ping has a
  token of its own, and pings still waiting when the sandbox is torn down (or
  its agent dies) fail with ``InvalidTransition``: nothing waits for ever.
- ``destroy`` returns only when no process of the sandbox is left (checked from
  the host), on every backend: ``none`` runs in a PID namespace of its own where
  the host allows one (``details["destroy"]`` says what it got); commands still
  running get ``killed`` (destroyed) and ``exit``.
- Resource limits use cgroup v2 only where delegated; a limit that cannot be
  enforced fails the launch (``UnenforceablePolicy``), never runs unlimited.
- Network (F-NET-1, F-NET-3): every native sandbox gets its own HTTP and SOCKS5
  proxy (``EgressNetwork``), its only way out; the allowlist is
  ``DomainPolicy.for_spec(egress_allowlist, network_enabled)``, so
  ``network_enabled=False`` keeps the proxies and refuses everything. Each
  refusal becomes a ``violation`` event, attributed to the exec whose process
  holds the refused connection (read from the host, off the event loop, with
  bounded work: ``_Attribution``); when that cannot be known for sure it is
  attributed to exec 0 (unknown, saying why), never guessed. Teardown cuts the
  network first.
- One process serves every sandbox of a port: the port raises its soft
  ``RLIMIT_NOFILE`` to the hard limit, and each sandbox's proxies get a share of
  its fds (``net.budget``); a sandbox beyond its share has its own new
  connections refused, and the reserve keeps launches working. Name lookups run
  on threads of their own, a few per sandbox at most (``LookupThreads``).
- Flow control: when a subscriber's unread output takes more than ``HIGH_WATER``
  bytes (its data, plus ``EVENT_COST`` per event: many tiny writes cost memory
  too), the port stops reading that sandbox's channel (its commands block on
  write) until every subscriber is under ``LOW_WATER``. Read or ``wait()`` each
  ``Execution``, and read each ``events()`` stream, you keep; one dropped unread
  (even one never started) is unsubscribed when collected.

Cancellation: cancelling ``launch`` kills what it started and leaves the handle
``destroyed``; ``destroy`` and ``aclose`` are shielded and finish even when
cancelled; cancelling ``Execution.wait`` leaves the command running.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import weakref

from sandhold.agent import protocol as P
from sandhold.errors import (
    LaunchError,
    LaunchFailed,
    SandholdError,
    SpecError,
    UnenforceablePolicy,
)
from sandhold.port.attribution import ATTRIBUTION_THREADS
from sandhold.port.execution import (
    PIPE,
    ExecResult,
    Execution,
    _Pipe,
    check_exec_args,
    check_timeout,
    pump,
)
from sandhold.port.facts import (
    code_paths,
    confinement_facts,
    describe,
    diag_tail,
    drop_import_paths,
    egress_network,
    egress_policy,
    guard_import_roots,
    host_home,
    launch_facts,
    load_ca,
    masked_file_texts,
    prepare_credentials,
)
from sandhold.port.flow import Listener
from sandhold.port.flow import stream as event_stream
from sandhold.port.sandbox import Channel, ExecState, Sandbox
from sandhold.spec import (
    RUNNING_STATES,
    Action,
    KillReason,
    ReadyEvent,
    SandboxBackend,
    SandboxHandle,
    SandboxSpec,
    SandboxState,
    SandboxViolation,
    StartingEvent,
    ViolationEvent,
    transition,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
    from concurrent.futures import ThreadPoolExecutor
    from types import TracebackType

    from sandhold.backends.linux.launcher import (
        AgentBoot,
        EgressNetwork,
        NetworkSetup,
    )
    from sandhold.backends.linux.session import Session
    from sandhold.net.outbound import LookupThreads
    from sandhold.policy.specplan import SpecPlan
    from sandhold.port.execution import StdinArg
    from sandhold.port.live import LiveSandbox
    from sandhold.spec import ResourceLimits, SandboxEvent


log = logging.getLogger("sandhold")


KEEP_DESTROYED = 64  # destroyed sandboxes whose final handle a port still answers for
PING_TIMEOUT = 10.0  # seconds ping waits for the agent's answer by default


class SandboxPort:
    """Launch and drive sandboxes (see the module rules). An async context manager.

    Args:
        sandbox: what an unspecified backend means: ``"require"`` (native or
            fail), ``"on"`` (native when offered, else none, logged) or ``"off"``
            (none, logged).
        bwrap: the bubblewrap executable (default: found on PATH).
        python: the interpreter that runs the agent (default: this one).
        launch_timeout: seconds to wait for the agent's hello.
        kill_grace: seconds the agent has to confirm a kill before the sandbox
            is declared broken and killed whole.
    """

    PIPE = PIPE

    def __init__(
        self,
        *,
        sandbox: str = "require",
        bwrap: str | None = None,
        python: str | None = None,
        launch_timeout: float = 10.0,
        kill_grace: float = 5.0,
    ) -> None:
        if sandbox not in ("require", "on", "off"):
            raise ValueError(f"sandbox must be 'require', 'on' or 'off', not {sandbox!r}")
        self.sandbox_policy = sandbox
        self.bwrap = bwrap
        self.python = python
        self.launch_timeout = launch_timeout
        self.kill_grace = kill_grace
        self._sandboxes: dict[str, Sandbox] = {}
        self._closed = False
        from sandhold.net.budget import ConnectionBudget, plan_budget, raise_fd_limit

        # Every sandbox's proxies share this process's fd table: raise the limit, and
        # give each sandbox a share of it, so one cannot starve the others or a launch.
        self._connections = ConnectionBudget(plan_budget(raise_fd_limit()))
        self._warned = False
        # The egress seam: a factory the integrator sets, called per native launch
        # with the spec, returning a ``NetworkSetup`` (see backends/linux/launcher.py).
        self._network_factory: Callable[[SandboxSpec], NetworkSetup | None] | None = None
        self._attribution_pool: ThreadPoolExecutor | None = None
        self._lookups: LookupThreads | None = None

    def _lookup_threads(self) -> LookupThreads:
        """The threads every sandbox's proxies resolve names on, a few each at most."""
        if self._lookups is None:
            from sandhold.net.outbound import LookupThreads

            self._lookups = LookupThreads()
        return self._lookups

    def _attribution_threads(self) -> ThreadPoolExecutor:
        """The threads attribution scans run on (``Attribution``), made at first use."""
        if self._attribution_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._attribution_pool = ThreadPoolExecutor(
                ATTRIBUTION_THREADS, thread_name_prefix="sandhold-attribution"
            )
        return self._attribution_pool

    async def __aenter__(self) -> SandboxPort:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Destroy every sandbox this port launched. Safe to call twice.

        Every sandbox's network is cut before the first ``await``.

        Cancellation: shielded; the sandboxes are gone when it returns or raises.
        """
        self._closed = True
        live = [sb for sb in self._sandboxes.values() if sb.state is not SandboxState.DESTROYED]
        for sb in live:
            sb.cut_network()
        if live:
            await asyncio.shield(asyncio.gather(*(self._destroy(sb) for sb in live)))
        if self._attribution_pool is not None:
            self._attribution_pool.shutdown(wait=False, cancel_futures=True)
            self._attribution_pool = None
        if self._lookups is not None:
            self._lookups.close()
            self._lookups = None

    def _forget_old_destroyed(self) -> None:
        """Keep the last ``KEEP_DESTROYED`` destroyed sandboxes' final handles; a
        long-lived port must not grow with every session it ever ran."""
        gone = [sid for sid, sb in self._sandboxes.items() if sb.state is SandboxState.DESTROYED]
        for sid in gone[: max(0, len(gone) - KEEP_DESTROYED)]:
            del self._sandboxes[sid]

    # -- lookups -------------------------------------------------------------------

    def _get(self, handle: SandboxHandle | str) -> Sandbox:
        sid = handle if isinstance(handle, str) else handle.session_id
        sb = self._sandboxes.get(sid)
        if sb is None:
            raise SpecError("session_id", f"no sandbox {sid!r} in this port")
        return sb

    def handle(self, handle: SandboxHandle | str) -> SandboxHandle:
        """The current snapshot of a sandbox (by handle or session id)."""
        return self._get(handle).snapshot()

    def handles(self) -> list[SandboxHandle]:
        return [sb.snapshot() for sb in self._sandboxes.values()]

    def explain(self, spec: SandboxSpec) -> str:
        """What a native launch of ``spec`` would mount, and why, without launching it.

        Raises:
            SpecError, UnenforceablePolicy: as ``launch`` would.
        """
        from sandhold.backends.linux.hostfs import OsHostView
        from sandhold.backends.linux.launcher import agent_boot
        from sandhold.backends.linux.session import private_base
        from sandhold.explain import render_spec_plan
        from sandhold.policy.specplan import SpecHost, plan_spec

        spec = spec.validate()
        egress_policy(spec)
        base = private_base()
        boot = agent_boot(self.python)
        facts = SpecHost(
            host_home(),
            f"{base}/<session>/tmp",
            base,
            boot.paths,
            code_paths(),
            masked_file_texts=masked_file_texts(spec),
            entropy=os.urandom,  # fresh placeholders: a launch mints its own
            **confinement_facts(),
            **launch_facts(),
        )
        plan = plan_spec(spec, facts, OsHostView())
        return render_spec_plan(plan)

    def sandbox(
        self,
        spec: SandboxSpec,
        *,
        backend: SandboxBackend | None = None,
        limits: ResourceLimits | None = None,
    ) -> LiveSandbox:
        """The sandbox-centred form: ``sandbox = await port.sandbox(spec)`` launches it
        (as ``launch``, same arguments and errors) and gives a ``LiveSandbox`` whose
        methods are this port's calls on it (``await sandbox.run("make test")``,
        ``await sandbox.destroy()``); ``async with port.sandbox(spec) as sandbox:``
        destroys it on exit. Nothing starts until it is awaited or entered.
        """
        from sandhold.port.live import LiveSandbox

        return LiveSandbox(self, spec, backend=backend, limits=limits)

    # -- backend choice ------------------------------------------------------------

    def select_backend(self, requested: SandboxBackend | None) -> SandboxBackend:
        """The backend a launch will use (``policy.backend``: see its rules).

        Raises:
            BackendUnavailable: an explicit backend (or, with ``sandbox="require"``,
                native) is not available here. Nothing was started.
        """
        from sandhold.policy.backend import choose_backend
        from sandhold.probe import quick_probe

        choice = choose_backend(
            requested and requested.value,
            quick_probe(self.bwrap),
            switch=self.sandbox_policy,
            unisolated="launch with backend=SandboxBackend.NONE",
            kvm=os.path.exists("/dev/kvm") if requested is SandboxBackend.MICROVM else None,
        )
        if choice.log_line:
            log.log(
                logging.WARNING if choice.log_level == "warning" else logging.INFO, choice.log_line
            )
        return SandboxBackend(choice.backend)

    # -- launch --------------------------------------------------------------------

    async def launch(
        self,
        spec: SandboxSpec,
        *,
        backend: SandboxBackend | None = None,
        limits: ResourceLimits | None = None,
        ask: Callable[[str, int], Awaitable[bool]] | None = None,
    ) -> SandboxHandle:
        """Start a sandbox for ``spec`` and wait until it is ready for ``exec``.

        Args:
            spec: what to launch; validated here.
            backend: an exact backend, or None for the port's ``sandbox`` policy.
            limits: memory/pids/CPU limits (cgroup v2, where delegated).
            ask: native backend: ``await ask(host, port)`` for a connection to a
                target that no list decides (neither the allowlist nor a deny
                list nor the baseline); ``True`` lets it through, anything else
                refuses it (with a violation, rule ``asked: denied``). The
                connection waits meanwhile: bound the wait yourself. ``None``:
                such targets are refused at once.

        Returns:
            The handle, in state ``warm``.

        Raises:
            SpecError: the spec is malformed, or its session id is already live.
            BackendUnavailable: the backend cannot be used (nothing started).
            UnenforceablePolicy: the spec or limits cannot be enforced here (a spec
                with ``credentials`` or ``tls_terminate`` on a backend other than
                native, say).
            LaunchError: ``tls_terminate``'s CA cannot be read or made (nothing
                started).
            LaunchFailed: starting failed; ``exc.handle`` is in state ``error``.

        Cancellation: what was started is killed; the handle ends ``destroyed``.
        """
        if self._closed:
            raise SandholdError("this SandboxPort is closed")
        spec = spec.validate()
        old = self._sandboxes.get(spec.session_id)
        if old is not None and old.state is not SandboxState.DESTROYED:
            raise SpecError("session_id", f"{spec.session_id!r} already has a live sandbox")
        chosen = self.select_backend(backend)
        if chosen is not SandboxBackend.NATIVE and (spec.credentials or spec.tls_terminate):
            raise UnenforceablePolicy(
                "credentials",
                chosen.value,
                "masked credentials need the native backend's own proxy to put them back "
                "and its mounts to mask files; on the host the command would run with the "
                "harness's environment: launch it native, or drop credentials and "
                "tls_terminate from the spec",
            )
        if limits is not None and limits.controllers:
            from sandhold.backends.linux import cgroups

            why = cgroups.probe().limits_reason(limits.controllers)
            if why is not None:
                raise UnenforceablePolicy("resource limits", chosen.value, why)
        from sandhold.backends.linux.launcher import agent_boot

        boot = agent_boot(self.python)
        session: Session | None = None
        plan: SpecPlan | None = None
        policy = egress_policy(spec)  # checked whatever the backend: the spec is bad or not
        egress: EgressNetwork | None = None
        loaded_ca = None
        if chosen is SandboxBackend.NATIVE:
            loaded_ca = load_ca(spec)  # before the plan: it hides a CA made just now
            session, plan = self._plan_native(spec, boot)
            # before anything of the sandbox runs: this process must never import a
            # module it could plant in the script's own directory
            drop_import_paths(plan.drop_import_paths)
            guard_import_roots(plan.guard_import_roots)
        sb = Sandbox(self, spec, chosen)
        self._sandboxes[spec.session_id] = sb
        self._forget_old_destroyed()
        sb.publish(StartingEvent(spec.session_id, chosen))
        started = time.monotonic()
        step = "start"
        try:
            from sandhold.backends.linux import launcher

            if plan is not None and session is not None:
                from sandhold.probe import quick_probe

                bwrap = quick_probe(self.bwrap).bwrap or "bwrap"
                factory = self._network_factory
                masked: tuple[tuple[str, str], ...] = ()
                hooks: dict[str, object] = {}
                if plan.credentials is not None:
                    if factory is not None:
                        raise UnenforceablePolicy(
                            "credentials",
                            chosen.value,
                            "port._network_factory replaces the port's own proxies, and "
                            "only they put masked credentials back",
                        )
                    step = "credentials"
                    masked, hooks = prepare_credentials(plan.credentials, session, loaded_ca)
                if factory is not None:
                    sb.network = factory(spec)
                    sb.details["network"] = "set up by port._network_factory"
                else:
                    sb.network = egress = egress_network(sb, policy, ask, hooks)
                    sb.details["network"] = plan.network
                sb.workdir = plan.workdir
                passed = dict(plan.environment)  # the plan decided it (``explain`` shows it)
                if factory is not None:  # the integrator's network: its own variables
                    for name in plan.proxy_variables:
                        passed.pop(name, None)
                    if sb.network is not None:
                        passed.update(sb.network.environment())
                sb.details["workdir"] = plan.workdir
                for warning in plan.warnings:
                    # once per port at WARNING (the CLI says it on every run; a
                    # server would say it on every launch), then at INFO
                    level = logging.INFO if self._warned else logging.WARNING
                    log.log(level, "sandbox %s: %s", spec.session_id, warning)
                    self._warned = True
                sb.details["confinement"] = (
                    ", ".join(
                        (
                            *(("creation-time supervisor",) if plan.creation is not None else ()),
                            *(("landlock",) if plan.landlock is not None else ()),
                        )
                    )
                    or "mounts only"
                )
                step = "spawn bwrap"
                sb.proc = launcher.spawn_native(
                    plan,
                    bwrap=bwrap,
                    session=session,
                    boot=boot,
                    network=sb.network,
                    masked=masked,
                )
                session = None  # the process owns it now
                if egress is not None and egress.netns:
                    sb.details["network_namespace"] = str(egress.netns)
            else:
                sb.workdir = spec.guest_workdir or (
                    spec.bind_mounts[0].host_path if spec.bind_mounts else os.getcwd()
                )
                log.warning(
                    "sandbox %s: backend none: commands run on the host without isolation "
                    "(environment scrubbed)",
                    spec.session_id,
                )
                sb.details.update(workdir=sb.workdir, network="host network (no isolation)")
                from sandhold.policy.env import filter_environment

                passed = filter_environment(os.environ).as_mapping()
                step = "start agent"
                sb.proc = launcher.spawn_host(sb.workdir, boot=boot)
            sb.base_env = dict(passed)
            step = "agent hello"
            await self._start(sb, limits)
            sb.details["launch_ms"] = f"{(time.monotonic() - started) * 1000:.1f}"
            sb.apply(Action.READY)
            sb.publish(ReadyEvent(spec.session_id, chosen))
            return sb.snapshot()
        except asyncio.CancelledError:
            if session is not None:
                session.close()
            await asyncio.shield(sb.release(KillReason.DESTROYED))
            sb.state = transition(sb.state, Action.DESTROY)
            raise
        except Exception as exc:  # whatever broke, nothing started may stay behind
            if session is not None:
                session.close()
            detail = describe(exc, sb)
            if sb.state is SandboxState.CREATED:
                sb.error = f"{step}: {detail}"
                sb.apply(Action.FAIL)
            await asyncio.shield(sb.release(KillReason.DESTROYED))
            raise LaunchFailed(chosen.value, step, detail, sb.snapshot()) from exc

    def _plan_native(self, spec: SandboxSpec, boot: AgentBoot) -> tuple[Session, SpecPlan]:
        from sandhold.backends.linux.hostfs import OsHostView
        from sandhold.backends.linux.session import open_session
        from sandhold.policy.specplan import SpecHost, plan_spec

        session = open_session()
        try:
            plan = plan_spec(
                spec,
                SpecHost(
                    home=host_home(),
                    tmpdir=session.tmpdir,
                    private_root=session.base,
                    agent_paths=boot.paths,
                    code_paths=code_paths(),
                    masked_file_texts=masked_file_texts(spec),
                    entropy=os.urandom,
                    **confinement_facts(),
                    **launch_facts(),
                ),
                OsHostView(),
            )
        except BaseException:
            session.close()
            raise
        return session, plan

    async def _start(self, sb: Sandbox, limits: ResourceLimits | None) -> None:
        """Wait for the agent's hello while its tree is put in its cgroup (overlapped)."""
        proc = sb.proc
        assert proc is not None
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_unix_connection(lambda: Channel(sb), sock=proc.channel)
        sb.transport = transport
        known: asyncio.Future[None] = loop.create_future()

        def on_diag() -> None:
            if not proc.read_diag():
                loop.remove_reader(proc.diag_fd)

        def on_status() -> None:
            more = proc.read_status()
            if proc.init_pid and not known.done():
                known.set_result(None)
            if not more:
                assert proc.status_fd is not None
                loop.remove_reader(proc.status_fd)
                if not known.done():
                    what = (
                        ("bwrap status", "bwrap ended before the sandbox ran")
                        if sb.backend is SandboxBackend.NATIVE
                        else ("agent status", "the agent ended before naming its init")
                    )
                    known.set_exception(LaunchError(sb.backend.value, *what))

        def exited() -> None:
            if proc.reap() is None:
                return
            loop.remove_reader(proc.pidfd)
            if sb.teardown is None:
                proc.read_diag()
                status = proc.exit_status or 0
                sb.fail(f"the sandbox exited (status {status:#x}){diag_tail(proc)}")

        loop.add_reader(proc.diag_fd, on_diag)
        if proc.status_fd is not None:
            loop.add_reader(proc.status_fd, on_status)
        else:
            # none: once the agent said HELLO, its namespace (if any) and init exist
            def said_hello(_: object) -> None:
                if not known.done():
                    known.set_result(None)

            sb.ready.add_done_callback(said_hello)
        loop.add_reader(proc.pidfd, exited)
        want_limits = limits is not None and bool(limits.controllers)

        async def identify_then_adopt() -> None:
            await self._identify(sb, known)
            # Moving the tree into its cgroup starts as soon as bwrap has named the
            # sandbox's init, while the agent's interpreter starts. The first move
            # costs the kernel an RCU grace period (~15 ms here). The agent forks
            # nothing before its first exec, and exec and suspend wait for the move,
            # so without limits it may finish behind ``ready``; limits must hold
            # before anything runs, so then ``ready`` waits for it.
            adopt = self._adopt(sb, limits) if want_limits else self._adopt_quietly(sb)
            sb.settling = loop.create_task(adopt)

        tree = loop.create_task(identify_then_adopt())
        hello = asyncio.ensure_future(asyncio.shield(sb.ready))
        try:
            async with asyncio.timeout(self.launch_timeout):
                await asyncio.gather(hello, tree)
                if want_limits and sb.settling is not None:
                    await sb.settling
        except TimeoutError:
            raise LaunchError(
                sb.backend.value, "agent hello", f"not ready within {self.launch_timeout:g} s"
            ) from None
        finally:
            for task in (tree, hello):
                if not task.done():
                    task.cancel()
            await asyncio.gather(tree, hello, return_exceptions=True)
            if not known.done():
                known.cancel()
            elif not known.cancelled():
                known.exception()  # retrieved: a failure here is reported by ``tree``

    async def _identify(self, sb: Sandbox, known: asyncio.Future[None]) -> None:
        """Pin the sandbox's init once bwrap has named it (native) or the agent has said
        HELLO in a PID namespace of its own (none), and record the pids."""
        proc = sb.proc
        assert proc is not None
        await known
        if proc.backend == "native":
            proc.pin_init()
            sb.details.update(
                pid=str(proc.pid),
                init_pid=str(proc.init_pid),
                pid_namespace=str(proc.pid_namespace),
            )
        else:
            from sandhold.backends.linux import cgroups

            sb.details["pid"] = str(proc.pid)
            if proc.find_pid_namespace():
                sb.details["init_pid"] = str(proc.init_pid)
                if proc.pid_namespace:  # as root; a user may not read it (find_pid_namespace)
                    sb.details["pid_namespace"] = str(proc.pid_namespace)
                sb.details["destroy"] = "pid namespace (its init's death ends every process)"
            elif cgroups.probe().base is not None:
                sb.details["destroy"] = "cgroup, and the processes below the agent"
            else:
                sb.details["destroy"] = (
                    "best effort: the processes below the agent (no PID namespace: user "
                    "namespaces are off; no cgroup); a command that kills the agent and "
                    "its reaper first leaves its orphans out of reach"
                )
                log.warning("sandbox %s: destroy is %s", sb.spec.session_id, sb.details["destroy"])

    async def _adopt(self, sb: Sandbox, limits: ResourceLimits | None) -> None:
        """Put the tree in a cgroup of its own (freezer, limits), or settle for SIGSTOP.

        Raises:
            UnenforceablePolicy: limits were asked for and the cgroup cannot carry them.
        """
        from sandhold.backends.linux import cgroups

        proc = sb.proc
        assert proc is not None
        info = cgroups.probe()
        want_limits = limits is not None and bool(limits.controllers)
        if want_limits and limits is not None:
            sb.details["limits"] = ", ".join(limits.controllers)
        else:
            why = info.limits_reason(cgroups.LIMIT_CONTROLLERS)
            sb.details["limits"] = f"unavailable: {why}" if why else "available (none set)"
        sb.details["cgroup"] = ""
        sb.details["freezer"] = "sigstop"
        if not (info.freezer or want_limits):
            return
        try:
            cgroup = cgroups.SandboxCgroup.create(
                info, f"sandhold-{os.getpid()}-{os.urandom(4).hex()}"
            )
            proc.cgroup = cgroup  # from here on, closing the sandbox removes it
            sb.details.update(cgroup=cgroup.path, freezer="cgroup" if info.freezer else "sigstop")
            if limits is not None and want_limits:
                cgroup.set_limits(limits)
            await asyncio.to_thread(proc.adopt, cgroup)
            if not proc.cgroup_complete:  # native: the agent follows once it said HELLO
                try:
                    async with asyncio.timeout(self.launch_timeout):
                        await asyncio.shield(sb.ready)
                except Exception as exc:  # it never came (the launch says why)
                    why = "the agent did not start"
                    raise LaunchError(sb.backend.value, "cgroup", why) from exc
                await asyncio.to_thread(proc.adopt_agent)
        except (OSError, LaunchError) as exc:
            # Part of the tree may be inside: the cgroup stays for close() to kill and
            # remove, but the freezer is not used on a partial tree.
            proc.cgroup_complete = False
            sb.details["freezer"] = "sigstop"
            if want_limits:
                raise UnenforceablePolicy("resource limits", sb.backend.value, str(exc)) from exc
            # No cgroup after all: suspend falls back to SIGSTOP, which needs none.
            if sb.teardown is None:
                log.info(
                    "sandbox %s: no cgroup (%s); suspend uses SIGSTOP", sb.spec.session_id, exc
                )

    async def _adopt_quietly(self, sb: Sandbox) -> None:
        try:
            await self._adopt(sb, None)
        except Exception:  # _adopt only raises for limits, which are never set here
            log.exception("sandbox %s: cgroup set-up failed", sb.spec.session_id)

    # -- exec ------------------------------------------------------------------------

    async def exec(
        self,
        handle: SandboxHandle | str,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: StdinArg = None,
        timeout: float | None = None,
    ) -> Execution:
        """Start ``command`` in the sandbox; returns at once with its ``Execution``.

        Args:
            command: an argv list, or a string run by ``/bin/sh -c``.
            cwd: working directory (relative: to the spec's workdir; default: it).
            env: variables set on top of the sandbox's scrubbed environment.
            stdin: None (``/dev/null``), bytes/str (sent, then closed), an async
                iterable of bytes (streamed, then closed), or ``PIPE`` (use
                ``Execution.write``/``close_stdin``).
            timeout: seconds of running time after which the command's whole
                tree is killed (``killed`` timeout, then ``exit``).

        Raises:
            InvalidTransition: the sandbox is not warm or active.
            ValueError: an empty command, a NUL in an argument or variable, or a
                timeout that is not a positive finite number.
            TypeError: an argument of the wrong type. Nothing has run then.

        Cancellation: the request is sent at the first await, or after the
        sandbox's cgroup move if that is still going on (right after ``launch``);
        cancelled before that, nothing ran. A cancelled caller after it leaves the
        command running (find it with ``handle``/``events``).
        """
        sb = self._get(handle)
        sb.check(Action.EXEC)
        if sb.settling is not None and not sb.settling.done():
            await sb.settled()
            sb.check(Action.EXEC)
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        if not argv or not argv[0]:
            raise ValueError("empty command")
        check_exec_args(argv, cwd, env, stdin, timeout)  # before anything runs
        workdir = sb.workdir
        path = cwd if cwd is None or cwd.startswith("/") else f"{workdir.rstrip('/')}/{cwd}"
        run_env = dict(sb.base_env)
        if sb.network is not None:
            run_env.update(sb.network.exec_environment(sb.next_id))
        if env:
            run_env.update(env)
        run_env["PWD"] = path or workdir
        items = [*argv, *(f"{k}={v}" for k, v in run_env.items())]
        if any("\0" in s for s in items) or any("=" in k or not k for k in run_env):
            raise ValueError("arguments and variables may not contain NUL; names not '=' or empty")
        ex = ExecState(sb.next_id, timeout)
        sb.next_id += 1
        sub = sb.subscribe(ex.exec_id)
        request = P.encode_fields(
            {
                "argv": argv,
                "env": [f"{k}={v}" for k, v in run_env.items()],
                "cwd": path or workdir,
                "stdin": 0 if stdin is None else 1,
            }
        )
        sb.send(P.EXEC, ex.exec_id, request)
        sb.execs[ex.exec_id] = ex
        sb.apply(Action.EXEC)
        ex.stdin_open = stdin is not None
        if timeout is not None:
            ex.deadline = time.monotonic() + timeout
            ex.timer = asyncio.get_running_loop().call_later(timeout, sb.on_timeout, ex)
        execution = Execution(sb, ex, sub)
        if stdin is not None and not isinstance(stdin, _Pipe):
            asyncio.get_running_loop().create_task(pump(execution, stdin))
        return execution

    async def run(
        self,
        handle: SandboxHandle | str,
        command: Sequence[str] | str,
        **kwargs: object,
    ) -> ExecResult:
        """``exec`` then ``output``: the finished command's status and output."""
        execution = await self.exec(handle, command, **kwargs)  # type: ignore[arg-type]
        return await execution.output()

    async def kill(
        self, handle: SandboxHandle | str, exec_id: int, reason: KillReason = KillReason.MANUAL
    ) -> None:
        """SIGKILL one command's whole tree; ``killed`` (reason) then ``exit`` follow.

        A command that already ended is left alone. While the sandbox is
        suspended the kill is delivered when it resumes.
        """
        sb = self._get(handle)
        ex = sb.execs.get(exec_id)
        if ex is not None:
            sb.request_kill(ex, reason)

    async def signal(
        self, handle: SandboxHandle | str, exec_id: int, signo: int, *, group: bool = True
    ) -> None:
        """Deliver ``signo`` to one command (its process group by default)."""
        sb = self._get(handle)
        if exec_id in sb.execs or group:
            fields = P.encode_fields({"signo": int(signo), "group": int(group)})
            sb.send(P.SIGNAL, exec_id, fields)

    async def ping(
        self, handle: SandboxHandle | str, *, timeout: float | None = PING_TIMEOUT
    ) -> float:
        """One round trip to the agent, in seconds (a liveness check).

        Args:
            timeout: seconds to wait for the answer, or None to wait as long as
                the sandbox lives. A suspended sandbox's agent is frozen too: it
                answers once resumed, and the time frozen counts.

        Raises:
            TimeoutError: no answer within ``timeout``; the sandbox is left as it
                is (its agent may be stopped or stuck).
            InvalidTransition: the sandbox is destroyed or failed, or is destroyed
                or fails while the ping waits.
            TypeError, ValueError: ``timeout`` is not None or a positive, finite
                number of seconds. Nothing was sent.

        Cancellation: the answer, if it comes, is dropped.
        """
        check_timeout(timeout)
        sb = self._get(handle)
        token, fut = sb.new_ping()
        try:
            start = time.perf_counter()
            sb.send(P.PING, token, P.encode_fields({}))
            async with asyncio.timeout(timeout):
                await fut
            return time.perf_counter() - start
        except TimeoutError:
            raise TimeoutError(
                f"sandbox {sb.spec.session_id}: the agent did not answer within {timeout:g} s"
            ) from None
        finally:
            sb.pings.pop(token, None)

    def report_violation(
        self, handle: SandboxHandle | str, violation: SandboxViolation, exec_id: int = 0
    ) -> None:
        """Emit a ``violation`` into the sandbox's stream, attributed to ``exec_id``.

        For backends and proxies running in this process (the agent's own
        reports arrive as protocol frames). Ignored once the sandbox is gone.
        """
        sb = self._get(handle)
        if sb.state in RUNNING_STATES:
            sb.publish(ViolationEvent(sb.spec.session_id, sb.backend, exec_id, violation))

    # -- events ------------------------------------------------------------------------

    def events(self, handle: SandboxHandle | str) -> AsyncIterator[SandboxEvent]:
        """Every event of the sandbox from now on, after a replay of its ``starting``
        and ``ready``; ends when the sandbox is destroyed or fails.

        Output of commands started before the call is only partly seen; take
        their ``Execution`` for all of it. The stream counts for flow control from
        this call on: read it, or drop it (it is unsubscribed when collected).
        """
        sb = self._get(handle)
        sub = sb.subscribe(None)
        stream = event_stream(sb, sub)
        # as for an Execution: a stream dropped unread (or never started, so its
        # ``finally`` never runs) must not hold the sandbox's output back for ever
        weakref.finalize(stream, sb.unsubscribe, sub)
        return stream

    def on_events(
        self,
        handle: SandboxHandle | str,
        callback: Callable[[SandboxEvent | None], None],
    ) -> Callable[[], None]:
        """``callback(event)`` for every event of the sandbox, as ``events`` gives them
        (the replay included, called before this returns), then ``callback(None)``
        once when the sandbox ends; returns what stops it.

        The callback runs inside the port's reading of the channel, as each event is
        read: no task and no turn of the loop between a frame and its reader. So it
        must be quick and must not block; and since it queues nothing, flow control
        never waits for it: keep a bounded copy. An exception it raises is logged,
        and it gets no more events.
        """
        sb = self._get(handle)
        sub = sb.subscribe(None, Listener(callback))
        return lambda: sb.unsubscribe(sub)

    # -- suspend / resume / destroy ---------------------------------------------------

    async def suspend(self, handle: SandboxHandle | str) -> SandboxHandle:
        """Freeze the whole process tree (cgroup freezer, else SIGSTOP of every process).

        Raises:
            InvalidTransition: not warm or active.
            LaunchError: the tree would not stop (the sandbox is then failed).
        """
        sb = self._get(handle)
        sb.check(Action.SUSPEND)
        await sb.settled()
        sb.check(Action.SUSPEND)
        proc = sb.proc
        assert proc is not None
        sb.pause_timers()
        try:
            how = await asyncio.to_thread(proc.freeze)
        except LaunchError:
            sb.fail("the sandbox could not be frozen")
            raise
        sb.details["frozen_by"] = how
        sb.apply(Action.SUSPEND)
        return sb.snapshot()

    async def resume(self, handle: SandboxHandle | str) -> SandboxHandle:
        """Thaw a suspended sandbox; it returns to ``active`` if commands were running."""
        sb = self._get(handle)
        action = Action.RESUME_BUSY if sb.execs else Action.RESUME
        sb.check(action)
        proc = sb.proc
        assert proc is not None
        try:
            await asyncio.to_thread(proc.thaw)
        except LaunchError:
            sb.fail("the sandbox could not be thawed")
            raise
        sb.details.pop("frozen_by", None)
        sb.apply(action)
        sb.resume_timers()
        return sb.snapshot()

    async def destroy(self, handle: SandboxHandle | str) -> SandboxHandle:
        """Kill everything in the sandbox and free what it holds; the handle is then invalid.

        The network goes first: the proxies' listeners are shut down before the
        first ``await``, then the tree is killed and the open connections aborted.

        Raises:
            InvalidTransition: already destroyed.
            LaunchError: a process survived SIGKILL (named in the message).

        Cancellation: shielded; the teardown completes.
        """
        sb = self._get(handle)
        sb.check(Action.DESTROY)
        sb.cut_network()
        return await asyncio.shield(self._destroy(sb))

    async def _destroy(self, sb: Sandbox) -> SandboxHandle:
        await sb.release(KillReason.DESTROYED)
        if sb.state is not SandboxState.DESTROYED:
            sb.apply(Action.DESTROY)
        return sb.snapshot()
