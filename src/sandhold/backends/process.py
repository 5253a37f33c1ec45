"""Run one child to completion, passing signals on and its status back.

Rules (SPEC §9):
- stdin, stdout and stderr are inherited untouched; only the fds named in
  ``pass_fds`` are inherited besides them.
- The child starts with default signal dispositions and an empty signal mask
  (Python ignores SIGPIPE; a wrapped ``yes | head`` must behave as unwrapped).
- SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to sandhold are
  passed to every process of the sandbox (``targets``), as sudo does: a signal the
  terminal sent to the whole foreground group (``si_code == SI_KERNEL``) already
  reached them and is not sent twice.
- The result is the child's exit status, or 128+N when signal N killed it.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

_signal: Any = __import__("_signal")  # the C module: ``signal`` imports enum (4 ms)

FORWARDED = (
    _signal.SIGINT,
    _signal.SIGTERM,
    _signal.SIGHUP,
    _signal.SIGQUIT,
    _signal.SIGUSR1,
    _signal.SIGUSR2,
)
_SI_KERNEL = 0x80
# Dispositions reset to default in the child (Python itself ignores the last two).
_RESET = (*FORWARDED, _signal.SIGCHLD, _signal.SIGPIPE, _signal.SIGXFSZ)


def exit_status(wait_status: int) -> int:
    """Shell-style status: the exit code, or 128+N for death by signal N."""
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.waitstatus_to_exitcode(wait_status)


def run_supervised(
    path: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    pass_fds: Iterable[int] = (),
    targets: Callable[[int], Iterable[int]] | None = None,
    after_spawn: Callable[[int], None] | None = None,
    spawn: Callable[[], int] | None = None,
) -> int:
    """Spawn ``path`` and wait for it, forwarding signals (see module rules).

    Args:
        targets: given the spawned pid, the pids a forwarded signal goes to
            (default: the spawned process alone).
        after_spawn: called with the pid right after spawning (e.g. to close
            the parent's copies of fds meant for the child).
        spawn: starts the child instead of ``posix_spawn(path, argv, env)`` and
            returns its pid; it runs with the forwarded signals blocked and must
            give the child default dispositions and an empty mask itself.

    Raises:
        OSError: the executable could not be spawned.
    """
    watched = {*FORWARDED, _signal.SIGCHLD}
    old_mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, watched)
    try:
        inherit_only(set(pass_fds))
        if spawn is not None:
            pid = spawn()
        else:
            pid = os.posix_spawn(path, list(argv), dict(env), setsigmask=(), setsigdef=_RESET)
        if after_spawn is not None:
            after_spawn(pid)
        while True:
            info = _signal.sigwaitinfo(watched)
            if info.si_signo == _signal.SIGCHLD:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done == pid:
                    return exit_status(status)
                continue
            if info.si_code == _SI_KERNEL:
                continue  # from the terminal: the sandbox's processes got it too
            for target in (targets or _just)(pid):
                try:
                    os.kill(target, info.si_signo)
                except (ProcessLookupError, PermissionError):
                    pass  # already gone
    finally:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, old_mask)


class CgroupRefused(OSError):
    """A cgroup refused the child (``enter_cgroups``): internal, the backend turns it
    into a ``LaunchError`` naming the limit's key."""


def enter_cgroups(procs: Iterable[str]) -> None:
    """Move the calling process into each cgroup whose ``cgroup.procs`` file is named
    (``0`` is the writer itself, in v1 and v2 alike). Called in a child between fork
    and exec: everything it execs and starts is inside from its first instruction.

    Raises:
        CgroupRefused: a cgroup refused it (gone, full, not ours).
    """
    for path in procs:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        except OSError as exc:
            raise CgroupRefused(
                exc.errno, f"cannot enter the cgroup of {path}: {exc.strerror}"
            ) from exc


def spawn_into(procs: Sequence[str], path: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Start ``path`` as ``posix_spawn`` would (default dispositions, an empty signal
    mask, the fds ``inherit_only`` left inheritable), but inside the cgroups of
    ``procs`` before it runs (``enter_cgroups``); returns its pid.

    Raises:
        CgroupRefused: the cgroups refused the child.
        OSError: the exec failed (the child's error comes back through a
            close-on-exec pipe; the child is reaped either way).
    """
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    args, environ = list(argv), dict(env)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; its failure comes back through the pipe
        try:
            os.close(report_r)
            enter_cgroups(procs)
            _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
            for sig in _RESET:
                _signal.signal(sig, _signal.SIG_DFL)
            if os.getppid() != parent:
                os._exit(127)  # sandhold was killed meanwhile: start no orphan sandbox
            os.execve(path, args, environ)
        except OSError as exc:
            stage = "cgroup" if isinstance(exc, CgroupRefused) else "exec"
            os.write(report_w, f"{stage} {exc.errno or 0} {exc.strerror or exc}".encode())
        except BaseException:  # nothing may unwind into a copy of the parent's code
            pass
        os._exit(127)
    os.close(report_w)
    try:
        report = b""
        while chunk := os.read(report_r, 512):
            report += chunk
    finally:
        os.close(report_r)
    if report:
        os.waitpid(pid, 0)
        stage, _, rest = report.decode(errors="replace").partition(" ")
        code, _, why = rest.partition(" ")
        error = CgroupRefused if stage == "cgroup" else OSError
        raise error(int(code) if code.isdigit() else 0, why)
    return pid


def inherit_only(keep: set[int]) -> None:
    """Make every fd but stdio and ``keep`` close-on-exec.

    sandhold's caller may have handed it open files or directories; an inherited
    directory fd is a way onto the host from outside the sandbox's mounts.
    """
    from sandhold.backends.linux import procfs

    for fd in procfs.own_fds():
        if fd <= 2:
            continue
        try:
            os.set_inheritable(fd, fd in keep)
        except OSError:
            continue  # the directory listing's own fd, closed by now


def _just(pid: int) -> list[int]:
    return [pid]
