"""The Linux native backend: carry a launch plan out with bubblewrap.

It hands bwrap the compiled seccomp filter and the mount list, runs it under
``process.run_supervised`` and reports bwrap's own set-up failures as
``LaunchError`` (exit 125), never as the command's status.

With a creation policy in the plan, bwrap runs ``sandhold.backends.linux.supervisor.runner``
(this interpreter, the package from its own directory) in front of the command:
it gets the notifying filter and the policy through a sealed memfd and writes
the refused creations to a second memfd, read here after bwrap has exited.
Without one, bwrap runs ``sandhold-exec --confine`` (or ``runner.confine_main``)
in front of it, which only enters the plan's Landlock domain and execs it: every
launch's command writes only where the plan lets it and signals nothing outside
the sandbox.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from sandhold._record import record
from sandhold.backends.linux.bwrap import BwrapFds, bwrap_argv
from sandhold.backends.linux.seccomp import build_program, native_arch
from sandhold.backends.linux.supervisor.notify import sealed_memfd
from sandhold.backends.process import (  # _signal: the C module, no enum
    CgroupRefused,
    _signal,
    run_supervised,
)
from sandhold.errors import LaunchError
from sandhold.policy.limits import (
    DATA,
    MEMORY_KEY,
    NPROC,
    PROCESSES_KEY,
    WATCH,
    WATCH_INTERVAL,
    Limits,
    prlimit_argv,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable, Sequence

    from sandhold.backends.linux.netns import TransparentSockets
    from sandhold.backends.linux.offline import OfflineDns
    from sandhold.backends.linux.session import Session
    from sandhold.net.egress_runner import EgressRunner
    from sandhold.policy.cliplan import LaunchPlan
    from sandhold.policy.creation import CreationPolicy


class _Status:
    """bwrap's ``--json-status-fd`` stream: the sandbox's pid and namespaces, then its exit."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.info: dict[str, int] = {}
        os.set_blocking(fd, False)

    def poll(self) -> dict[str, int]:
        while True:
            try:
                chunk = os.read(self.fd, 4096)
            except BlockingIOError:
                break
            if not chunk:
                break
            self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            self.info.update(_flat_ints(line.decode("utf-8", "replace")))
        return self.info


def _flat_ints(line: str) -> dict[str, int]:
    """Parse bwrap's one-line status objects (string keys, integer values).

    Hand-parsed: importing ``json`` for this costs more than the whole parse.
    """
    out: dict[str, int] = {}
    for item in line.strip().strip("{}").split(","):
        key, sep, value = item.partition(":")
        value = value.strip()
        if sep and value.lstrip("-").isdigit():
            out[key.strip().strip('"')] = int(value)
    return out


def sandbox_pids(init_pid: int, pid_ns: int) -> list[int]:
    """Host pids of every process in the sandbox's PID namespace but its init."""
    from sandhold.backends.linux import procfs

    # a process gone meanwhile, or not ours to inspect, has namespace 0: not ours
    return [p for p in procfs.pids() if p != init_pid and procfs.namespace(p) == pid_ns]


# Loads the sandhold package from the directory in argv[1] without putting that
# directory on sys.path: it may lie in a writable root, where a planted json.py would
# shadow the standard library. The package itself is bound read-only (the plan's
# extra_read_only), and with -I -S nothing else is searched but the standard library.
PACKAGE_BOOT = (
    "import sys,importlib.util as u\n"
    "d=sys.argv[1]+'/sandhold';s=u.spec_from_file_location("
    "'sandhold',d+'/__init__.py',submodule_search_locations=[d])\n"
    "m=u.module_from_spec(s);sys.modules['sandhold']=m;s.loader.exec_module(m)\n"
)
RUNNER_BOOT = (
    PACKAGE_BOOT + "from sandhold.backends.linux.supervisor.runner import main;main(sys.argv[2:])\n"
)
CONFINE_BOOT = (
    PACKAGE_BOOT
    + "from sandhold.backends.linux.supervisor.runner import confine_main as c;c(sys.argv[2:])\n"
)


def runner_paths() -> tuple[str, str]:
    """(interpreter, directory holding the ``sandhold`` package) for the runner."""
    import sys

    import sandhold

    python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return python, os.path.dirname(os.path.dirname(os.path.realpath(sandhold.__file__)))


def own_code_paths() -> tuple[str, ...]:
    """Where this process's code comes from, now and at its next start, as spelled and
    as resolved: what it imports
    from (lazily, also after a command ran; entries that do not exist yet included, and
    zip files); its whole installation (``sys.prefix``: a venv's ``pyvenv.cfg``,
    ``bin/`` and the site directories ``site`` adds only once they exist); the user
    site directory when this interpreter reads one; and, run from a checkout, what of
    the checkout starts the next run (``scripts/``, ``bin/``, ``pyproject.toml``)."""
    import site
    import sys

    import sandhold

    found = [p for p in sys.path if p]
    found += [os.path.dirname(sys.executable), sys.prefix]
    if site.ENABLE_USER_SITE and sys.prefix == sys.base_prefix:
        found.append(site.getusersitepackages())
    package_parent = os.path.dirname(os.path.dirname(os.path.realpath(sandhold.__file__)))
    checkout = os.path.dirname(package_parent)
    if os.path.basename(package_parent) == "src" and os.path.exists(
        os.path.join(checkout, "pyproject.toml")
    ):
        found += [os.path.join(checkout, n) for n in ("scripts", "bin", "pyproject.toml")]
    # both spellings: the one Python and the user name (through a symlink, maybe) is
    # the one the next start follows, and the resolved one is what gets mounted
    return tuple(dict.fromkeys(q for p in found for q in (os.path.abspath(p), os.path.realpath(p))))


@record
class ExecHelper:
    """The compiled front of the runner (``_helper/exec.c``) and the execute-only
    interpreter it turns into at the first trapped call (see ``exec_helper``)."""

    exe: str
    python: str


def exec_helper(private_base: str) -> ExecHelper | None:
    """The helper, if built (``scripts/setup``), with an execute-only copy of this
    interpreter in ``private_base``; None: the Python runner does the whole job.

    An interpreter that cannot be read is non-dumpable from its first instruction, so
    the supervisor it becomes stays out of the command's reach (ptrace, /proc/PID/mem)
    across the helper's exec. ``SANDHOLD_EXEC_HELPER=0`` turns the helper off.
    """
    import sys

    from sandhold.backends.linux.supervisor.front import compiled_front

    exe = compiled_front()
    if exe is None:
        return None
    source = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    try:
        st = os.stat(source)
        key = f"{st.st_dev:x}-{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"
        copy = f"{private_base}/bin/{os.path.basename(source)}-{key}"
        if not os.path.exists(copy):
            _execute_only_copy(source, copy)
    except OSError:
        return None  # no room or no rights: the Python runner works everywhere
    return ExecHelper(exe, copy)


def _execute_only_copy(source: str, copy: str) -> None:
    import errno
    import shutil
    import subprocess

    os.makedirs(os.path.dirname(copy), mode=0o700, exist_ok=True)
    tmp = f"{copy}.{os.getpid()}"
    try:
        shutil.copyfile(source, tmp)
        os.chmod(tmp, 0o111)
        # once per interpreter: a noexec file system, or an interpreter that needs its
        # own file to start, shows here rather than in the middle of a command's run
        try:
            probe = subprocess.run([tmp, "-I", "-S", "-c", "pass"], check=False, timeout=30)
            ok = probe.returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if not ok:
            raise OSError(errno.ENOEXEC, f"{tmp} cannot run as the supervisor's interpreter")
        os.rename(tmp, copy)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def supervisor_setup(
    creation: CreationPolicy | None, landlock: tuple[str, ...] | None
) -> dict[str, object]:
    """What the supervisor in a sandbox starts from (the CLI's runner, the agent's hook):
    its notifying filter, its policy's fields (both None: Landlock only) and the
    Landlock paths (None: no domain). Plain data, sent with ``marshal``."""
    if creation is None:
        return {"program": None, "policy": None, "landlock": landlock}
    from sandhold.policy.syscalls import creation_rules

    rules = creation_rules(None, connect=creation.unix_sockets is not None)
    return {
        "program": build_program(rules, native_arch()),
        "policy": {f: getattr(creation, f) for f in creation._fields},  # type: ignore[attr-defined]
        "landlock": landlock,
    }


def _landlock_paths(creation: CreationPolicy) -> tuple[str, ...]:
    from sandhold.backends.linux.supervisor.landlock import DEFAULT_DEVICES, DEFAULT_DIRS

    return (*creation.writable_roots, *creation.scratch, *DEFAULT_DIRS, *DEFAULT_DEVICES)


def confined_command(landlock: Sequence[str], command: Sequence[str]) -> tuple[str, ...]:
    """``command`` behind the front of a launch with no supervisor: the compiled one
    (``sandhold-exec --confine``) if built, else ``runner.confine_main`` in this
    interpreter. ``landlock``: where it may write, besides the usual devices."""
    from sandhold.backends.linux.supervisor.front import confining_front
    from sandhold.backends.linux.supervisor.landlock import DEFAULT_DEVICES, DEFAULT_DIRS

    paths = (*landlock, *DEFAULT_DIRS, *DEFAULT_DEVICES)
    exe = confining_front()
    if exe is not None:
        return (exe, "--confine", str(len(paths)), *paths, "--", *command)
    python, package_parent = runner_paths()
    boot = (python, "-I", "-S", "-B", "-c", CONFINE_BOOT, package_parent)
    return (*boot, str(len(paths)), *paths, "--", *command)


def _runner_setup(setup: dict[str, object]) -> int:
    """A sealed memfd with the runner's setup (see ``supervisor.runner``)."""
    import marshal

    return sealed_memfd("sandhold-runner", marshal.dumps(setup))


@record
class SupervisedCommand:
    """A command wrapped in the creation-time supervisor's runner: ``argv``, the fds it
    needs (the caller passes them to the sandbox and closes them) and among them the
    report fd the runner writes refused creations to."""

    argv: tuple[str, ...]
    fds: list[int]
    report_fd: int


def supervised_command(
    creation: CreationPolicy, command: Sequence[str], helper: ExecHelper | None, lock_fd: int
) -> SupervisedCommand:
    """``command`` under the supervisor: the compiled front when ``helper`` is given
    (it performs ordinary calls itself and hands the rest to the Python runner),
    else the Python runner alone. ``lock_fd``: ``session.creation_lock``, which it
    holds around each call (the caller keeps and closes it)."""
    setup = supervisor_setup(creation, (*creation.writable_roots, *creation.scratch))
    setup_fd = _runner_setup(setup)
    report_fd = os.memfd_create("sandhold-refused", os.MFD_CLOEXEC)
    fds = [setup_fd, report_fd]
    python, package_parent = runner_paths()
    runner = (
        helper.python if helper is not None else python, "-I", "-S", "-B", "-c",
        RUNNER_BOOT, package_parent, "--setup-fd", str(setup_fd), "--report-fd",
        str(report_fd), "--lock-fd", str(lock_fd),
    )  # fmt: skip
    if helper is None:
        return SupervisedCommand((*runner, "--", *command), fds, report_fd)
    from sandhold.policy.creation import fastpath_rules

    notifying = setup["program"]
    assert isinstance(notifying, bytes)
    prog_fd = sealed_memfd("sandhold-filter", notifying)
    rules_fd = sealed_memfd("sandhold-fastpath", fastpath_rules(creation))
    fds += [prog_fd, rules_fd]
    landlock = _landlock_paths(creation)
    argv = (
        helper.exe, str(prog_fd), str(rules_fd), str(lock_fd), str(len(runner)), *runner,
        str(len(landlock)), *landlock, "--", *command,
    )  # fmt: skip
    return SupervisedCommand(argv, fds, report_fd)


def _read_report(fd: int) -> list[dict[str, object]]:
    size = os.fstat(fd).st_size
    if not size:
        return []  # nothing refused (and no json import: ~5 ms with re and enum)
    import json

    data = os.pread(fd, size, 0)
    out = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill: the rest still counts
        if isinstance(entry, dict):
            out.append(entry)
    return out


def _prlimit(limits: Limits) -> tuple[str, ...]:
    """The ``prlimit`` step in front of the command (``policy.limits``): run inside the
    sandbox, after bubblewrap made its user namespace, where RLIMIT_NPROC counts the
    sandbox's own processes only.

    Raises:
        LaunchError: no ``prlimit`` (util-linux) here: the limits cannot be set.
    """
    mechanisms = (limits.process_mechanism, limits.memory_mechanism)
    found = next(
        (
            f"{d}/prlimit"
            for d in ("/usr/bin", "/bin", "/usr/sbin", "/sbin")
            if os.access(f"{d}/prlimit", os.X_OK)
        ),
        None,
    )
    if found is None:
        keys = [k for k, m in ((PROCESSES_KEY, NPROC), (MEMORY_KEY, DATA)) if m in mechanisms]
        raise LaunchError("native", ", ".join(keys), "prlimit (util-linux) is not installed")
    return prlimit_argv(limits, found)


def _count(init: int, pid_ns: int) -> int:
    """The processes of the sandbox's PID namespace: its own /proc (bubblewrap mounts
    one for it, and it may not mount another) lists exactly them, at a cost that grows
    with the sandbox, not with the host; else every host process is looked at."""
    from sandhold.backends.linux import procfs

    try:
        return procfs.view_pids(init)
    except OSError:  # not there (yet): the slower count is the same count
        return len(sandbox_pids(init, pid_ns)) + 1


class _Watcher:
    """Counts a root sandbox's processes every ``WATCH_INTERVAL`` seconds and kills its
    PID namespace's init (so every process in it) once they pass ``limit``
    (``policy.limits``: the kernel applies no RLIMIT_NPROC to root)."""

    def __init__(self, limit: int, status: _Status, lock: threading.RLock) -> None:
        self.limit, self.status, self.lock = limit, status, lock
        self.done = threading.Event()
        self.killed = False
        self.thread = threading.Thread(target=self._run, name="sandhold-limits", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()

    def _run(self) -> None:
        # every signal is the main thread's (run_supervised waits for them there)
        _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
        while not self.done.wait(WATCH_INTERVAL):
            with self.lock:
                info = self.status.poll()
            if "child-pid" not in info or "exit-code" in info:
                continue
            if _count(info["child-pid"], info["pid-namespace"]) > self.limit:
                self.killed = True
                # its init gone, the kernel kills the whole PID namespace; a pid reused
                # after bwrap's exit is no concern: "exit-code" is read first
                with contextlib.suppress(ProcessLookupError):
                    os.kill(info["child-pid"], _signal.SIGKILL)
                return


def _limit_keys(plan: LaunchPlan) -> str:
    """The settings keys the plan's limit cgroups enforce, for a launch error."""
    return ", ".join(c.key for c in plan.limits.cgroups) if plan.limits else "limits"


def _limit_notes(limits: Limits, refused: int, killed: int) -> None:
    """Say which cgroup limit the sandbox ran into: the command itself often says only
    "Resource temporarily unavailable" or "Killed"."""
    if refused:
        sys.stderr.write(
            f"sandhold: the sandbox reached its limit of {limits.processes} processes "
            f"(limits.processes): {refused} fork(s) refused\n"
        )
    if killed:
        sys.stderr.write(
            f"sandhold: the sandbox reached its memory limit of {limits.memory_mib} MiB "
            f"(limits.memoryMiB): the kernel killed {killed} process(es)\n"
        )


def _offline_resolv_conf(offline: bool, session: Session) -> tuple[tuple[str, str], ...]:
    """With the network off, /etc/resolv.conf as the sandbox sees it: naming the DNS
    socket in its namespace (``netns.OFFLINE_RESOLV_CONF``). Where the host has none,
    none is bound: glibc, Go and c-ares then ask 127.0.0.1 by default."""
    if not offline or not os.path.exists("/etc/resolv.conf"):
        return ()
    from sandhold.backends.linux.offline import OFFLINE_RESOLV_CONF

    return session.write_copies([("/etc/resolv.conf", OFFLINE_RESOLV_CONF.encode())], "resolv")


def config_copies(plan: LaunchPlan, session: Session) -> tuple[tuple[str, str], ...]:
    """Copy each repository config the run writes privately (``git.allowConfig``) into
    the session's directory, which the sandbox cannot see, twice: ``<copy>`` is bound
    writable in its place, ``<copy>.orig`` stays as the run found it, for the host to
    tell what the run changed (``gitapply``)."""
    if not plan.config_copies:
        return ()
    from sandhold.gitapply import copy_name

    out = []
    for i, path in enumerate(plan.config_copies):
        copy = copy_name(session.path, i)
        try:
            with open(path, "rb") as f:
                data = f.read()
            for name, mode in ((copy, 0o600), (f"{copy}.orig", 0o400)):
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
                with os.fdopen(fd, "wb") as out_file:
                    out_file.write(data)
        except OSError as exc:
            raise LaunchError("native", "git.allowConfig copy", f"{path}: {exc.strerror}") from exc
        out.append((path, copy))
    return tuple(out)


def run_native(
    plan: LaunchPlan,
    session: Session,
    bwrap: str,
    *,
    egress: EgressRunner | None = None,
    on_refused: Callable[[list[dict[str, object]]], None] | None = None,
    helper: ExecHelper | None = None,
    on_lookups: Callable[[list[str]], None] | None = None,
) -> int:
    """Run the plan's command in bubblewrap; returns its exit status.

    With an egress plan, the sandbox starts in a network namespace holding only
    the proxies' listeners, and ``egress`` serves them while the command runs.
    With a creation policy, ``on_refused`` gets the refused creations (JSON-ready
    dicts, the ``--violations`` shape) once bwrap has exited; with the network off
    (``offline_dns``), ``on_lookups`` gets the names the sandbox looked up, all
    refused; ``helper`` (from
    ``exec_helper``, and carved into the plan) puts the compiled front in place of
    the Python runner's start.

    Raises:
        LaunchError: bubblewrap, the network namespace or the proxies could not
            be set up.
    """
    assert plan.fs is not None
    if (plan.egress is None) != (egress is None):
        raise ValueError("an egress plan needs an egress runner, and only then")
    program = build_program(plan.syscalls, native_arch())
    seccomp_fd = os.memfd_create("sandhold-seccomp", os.MFD_CLOEXEC)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    open_fds = [seccomp_fd, status_w, status_r]
    command = plan.command
    if plan.limits is not None and plan.limits.rlimits:
        command = (*_prlimit(plan.limits), *command)
    user_command = command
    child_fds: tuple[int, ...] = (seccomp_fd, status_w)
    report_fd = -1
    if plan.creation is not None:
        from sandhold.backends.linux.session import creation_lock

        lock_fd = creation_lock(session.base)
        open_fds.append(lock_fd)
        sup = supervised_command(plan.creation, user_command, helper, lock_fd)
        command, report_fd = sup.argv, sup.report_fd
        open_fds += sup.fds
        child_fds += (*sup.fds, lock_fd)
    else:
        assert plan.landlock is not None
        command = confined_command(plan.landlock, user_command)

    def close(fd: int) -> None:
        if fd in open_fds:
            open_fds.remove(fd)
            os.close(fd)

    from sandhold.backends.linux.cgroups import LimitCgroups, stop_warming

    groups = LimitCgroups()
    try:
        if plan.limits is not None and plan.limits.cgroups:
            groups.make(plan.limits.cgroups)  # before the first process: none escapes
        os.write(seccomp_fd, program)
        os.lseek(seccomp_fd, 0, os.SEEK_SET)
        offline = plan.offline_dns and egress is None
        fds = BwrapFds(
            seccomp=seccomp_fd,
            status=status_w,
            hidden_file=session.hidden_file,
            hidden_dir=session.hidden_dir,
            masked=(
                *session.write_copies([(p, t.encode()) for p, t in plan.masked_files]),
                *_offline_resolv_conf(offline, session),
            ),
            config_copies=config_copies(plan, session),
        )
        argv = bwrap_argv(
            bwrap, plan.fs, fds, plan.cwd, command, share_net=egress is not None or offline
        )
        lookups: list[OfflineDns] = []
        status = _Status(status_r)
        listeners: list[socket.socket] = []
        env = dict(plan.environment)
        transparent: list[TransparentSockets] | None = (
            [] if plan.egress is not None and plan.egress.transparent else None
        )

        def spawn() -> int:
            if offline:
                from sandhold.backends.linux.offline import OfflineDns, spawn_offline

                try:
                    pid, dns = spawn_offline(bwrap, argv, env, child_fds, groups.procs)
                except CgroupRefused as exc:
                    raise LaunchError(
                        "native", _limit_keys(plan), exc.strerror or str(exc)
                    ) from exc
                except OSError as exc:
                    raise LaunchError("native", "network namespace", str(exc)) from exc
                lookups.append(OfflineDns(dns))
                return pid
            from sandhold.backends.linux.netns import spawn_in_netns

            try:
                pid, http, socks = spawn_in_netns(
                    bwrap, argv, env, child_fds, transparent=transparent, cgroup_procs=groups.procs
                )
            except CgroupRefused as exc:
                raise LaunchError("native", _limit_keys(plan), exc.strerror or str(exc)) from exc
            except OSError as exc:
                raise LaunchError("native", "network namespace", str(exc)) from exc
            listeners.extend((http, socks))
            return pid

        def spawn_in_cgroups() -> int:
            from sandhold.backends.process import spawn_into

            try:
                return spawn_into(groups.procs, bwrap, argv, env)
            except CgroupRefused as exc:
                raise LaunchError("native", _limit_keys(plan), exc.strerror or str(exc)) from exc

        # the watcher polls it too; re-entrant: a signal handler (targets) may run while
        # the main thread is in one already
        status_lock = threading.RLock()
        watcher = None
        if plan.limits is not None and plan.limits.process_mechanism == WATCH:
            watcher = _Watcher(plan.limits.processes, status, status_lock)

        def after_spawn(_pid: int) -> None:
            stop_warming()  # the child is in its cgroups (``wrap._limit_facts``)
            close(seccomp_fd)  # the child has its copies
            close(status_w)  # so that bwrap's exit is seen as EOF
            if watcher is not None:
                # here, run_supervised's signal mask is in force: the thread inherits
                # it, so no forwarded signal is ever delivered to it
                watcher.start()
            if egress is not None:
                egress.start(
                    listeners[0], listeners[1], transparent=transparent[0] if transparent else None
                )
            for server in lookups:
                server.start()

        def targets(pid: int) -> list[int]:
            with status_lock:
                info = status.poll()
            if "child-pid" not in info:
                return [pid]  # not started yet: stopping bwrap stops it all
            return sandbox_pids(info["child-pid"], info["pid-namespace"]) or [pid]

        try:
            code = run_supervised(
                bwrap,
                argv,
                env,
                pass_fds=child_fds,
                targets=targets,
                after_spawn=after_spawn,
                spawn=spawn
                if egress is not None or offline
                else (spawn_in_cgroups if groups.procs else None),
            )
        except OSError as exc:
            raise LaunchError("native", "exec bwrap", f"{bwrap}: {exc.strerror}") from exc
        finally:
            if watcher is not None:
                watcher.stop()
            for server in lookups:
                names = server.stop()
                if names and on_lookups is not None:
                    on_lookups(names)
        if watcher is not None and watcher.killed:
            sys.stderr.write(
                f"sandhold: the sandbox passed its limit of {watcher.limit} processes "
                "(limits.processes): it was killed\n"
            )
        if groups.made and plan.limits is not None:
            _limit_notes(plan.limits, *groups.counts())
        with status_lock:
            info = status.poll()
        if report_fd >= 0 and on_refused is not None:
            refused = _read_report(report_fd)
            if refused:
                on_refused(refused)
        if "exit-code" not in info and code < 128:
            raise LaunchError("native", "bubblewrap set-up", "see bwrap's message above")
        return code
    finally:
        if egress is not None:
            egress.stop()
        for fd in list(open_fds):
            close(fd)
        groups.remove()  # bwrap has exited: its PID namespace, so every process, is gone
