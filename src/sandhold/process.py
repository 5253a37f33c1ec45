"""Run one child to completion, passing signals on and its status back.

Rules (SPEC §9):
- stdin, stdout and stderr are inherited untouched; only the fds named in
  ``pass_fds`` are inherited besides them.
- The child starts with default signal dispositions and an empty signal mask
  (Python ignores SIGPIPE; a wrapped ``yes | head`` must behave as unwrapped).
- SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to sandhold are
  passed to every process of the sandbox (``targets``), as sudo does. A child in
  sandhold's own group got a signal the terminal sent to the whole foreground
  group (``si_code == SI_KERNEL``) already: it is not sent twice.
- ``own_group``: the child leads a process group of its own, so that ``kill(0,
  sig)`` in the sandbox reaches that group and never sandhold's (a PID namespace
  does not isolate process groups: sandhold's group holds whatever started it).
  While sandhold's group is the foreground of its controlling terminal, the
  child's group gets it for the run (``tcsetpgrp``) and sandhold takes it back at
  the end, so the terminal's ^C reaches the command and a read from the terminal does not
  stop it; sandhold keeps SIGTTOU blocked meanwhile so that it may take the
  terminal back from the background. The child is a monitor (bubblewrap) that
  must outlive the keyboard's SIGINT and SIGQUIT to report its command's status:
  it starts with both ignored (``MONITOR_IGNORES``), and what it runs must
  restore them. When that group stops (^Z, or a read from the terminal while
  sandhold runs in the background), sandhold takes the terminal back and stops
  too, as its caller's shell expects of a job; continued, it hands the terminal
  over again if it is in the foreground, and continues the group.
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
MONITOR_IGNORES = (_signal.SIGINT, _signal.SIGQUIT)
"""What an ``own_group`` child starts ignoring: the keyboard's signals to its group."""


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
    own_group: bool = False,
) -> int:
    """Spawn ``path`` and wait for it, forwarding signals (see module rules).

    Args:
        targets: given the spawned pid, the pids a forwarded signal goes to
            (default: the spawned process alone).
        after_spawn: called with the pid right after spawning (e.g. to close
            the parent's copies of fds meant for the child).
        spawn: starts the child instead of ``posix_spawn(path, argv, env)`` and
            returns its pid; it runs with the forwarded signals blocked and must
            give the child default dispositions and an empty mask itself (with
            ``own_group``: its own process group, made before it returns, and
            ``MONITOR_IGNORES`` ignored).
        own_group: the child leads a process group of its own (see module rules).

    Raises:
        OSError: the executable could not be spawned.
    """
    watched = {*FORWARDED, _signal.SIGCHLD}
    blocked = {*watched, _signal.SIGTTOU} if own_group else watched
    old_mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, blocked)
    tty: _Terminal | None = None
    killed_by = 0
    try:
        _inherit_only(set(pass_fds))
        if own_group:
            # ^C before the sandbox exists: it never runs (the child would ignore it)
            early = _signal.sigtimedwait(MONITOR_IGNORES, 0)
            if early is not None:
                return 128 + int(early.si_signo)
            tty = _Terminal.controlling()
        if spawn is not None:
            pid = spawn()
        elif own_group:
            pid = _spawn_monitor(path, argv, env)
        else:
            pid = os.posix_spawn(path, list(argv), dict(env), setsigmask=(), setsigdef=_RESET)
        if tty is not None:
            tty.hand_over(pid)
        if after_spawn is not None:
            after_spawn(pid)
        options = os.WNOHANG | (os.WUNTRACED if tty is not None else 0)
        while True:
            info = _signal.sigwaitinfo(watched)
            if info.si_signo == _signal.SIGCHLD:
                done, status = os.waitpid(pid, options)
                if done == pid and os.WIFSTOPPED(status):
                    assert tty is not None
                    tty.stopped(pid, os.WSTOPSIG(status))
                elif done == pid:
                    if killed_by and os.WIFSIGNALED(status):
                        return 128 + killed_by
                    return exit_status(status)
                continue
            if info.si_code == _SI_KERNEL and not own_group:
                continue  # from the terminal: the child's group (ours) got it too
            for target in (targets or _just)(pid):
                sig = info.si_signo
                if own_group and target == pid and sig in MONITOR_IGNORES:
                    # the monitor ignores it, and has not started the command yet:
                    # end the launch as the signal would have
                    killed_by, sig = sig, _signal.SIGKILL
                try:
                    os.kill(target, sig)
                except (ProcessLookupError, PermissionError):
                    pass  # already gone
    finally:
        if tty is not None:
            tty.take_back()
        _signal.pthread_sigmask(_signal.SIG_SETMASK, old_mask)


def _spawn_monitor(path: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
    """``posix_spawn`` in a new process group, with ``MONITOR_IGNORES`` ignored: a
    spawned child keeps what its parent ignores, so ignore them here for the spawn
    (they are blocked, and waited for: sandhold itself is not affected)."""
    saved = [(sig, _signal.signal(sig, _signal.SIG_IGN)) for sig in MONITOR_IGNORES]
    try:
        reset = tuple(s for s in _RESET if s not in MONITOR_IGNORES)
        return os.posix_spawn(
            path, list(argv), dict(env), setpgroup=0, setsigmask=(), setsigdef=reset
        )
    finally:
        for sig, handler in saved:
            _signal.signal(sig, handler)


class _Terminal:
    """sandhold's controlling terminal while an ``own_group`` child runs: who has its
    foreground (see module rules). SIGTTOU is blocked meanwhile, so ``tcsetpgrp``
    works from the background too."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.handed = False  # the child's group has the foreground from us

    @classmethod
    def controlling(cls) -> _Terminal | None:
        """The controlling terminal, whatever stdio is (a pager reads /dev/tty)."""
        try:
            return cls(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC))
        except OSError:
            return None  # none

    def _foreground(self) -> int:
        try:
            return os.tcgetpgrp(self.fd)
        except OSError:
            return -1  # hung up

    def _give(self, group: int) -> None:
        try:
            os.tcsetpgrp(self.fd, group)
        except OSError:
            pass  # hung up, or the group is gone: nothing to hand over

    def hand_over(self, group: int) -> None:
        """Give ``group`` the foreground if sandhold's group has it."""
        if self._foreground() == os.getpgrp():
            self._give(group)
            self.handed = True

    def stopped(self, group: int, sig: int) -> None:
        """``group`` (the child's) stopped with ``sig``: stop with it, as a job does."""
        ours, fg = os.getpgrp(), self._foreground()
        if sig in (_signal.SIGTTIN, _signal.SIGTTOU) and fg in (group, ours):
            # it touched the terminal before it got it (the hand-over races its start,
            # or sandhold has been brought to the foreground since): it has it now
            self.hand_over(group)
            os.killpg(group, _signal.SIGCONT)
            return
        if self.handed:
            self._give(ours)
            self.handed = False
        # SIGTTOU is blocked here; a stop of that kind is reported as a ^Z
        os.kill(os.getpid(), _signal.SIGTSTP if sig == _signal.SIGTTOU else sig)
        # continued (fg, bg or kill -CONT): the terminal goes with sandhold's group
        self.hand_over(group)
        try:
            os.killpg(group, _signal.SIGCONT)
        except ProcessLookupError:
            pass  # gone meanwhile: its exit is reported next

    def take_back(self) -> None:
        """The child is done: sandhold's group gets the foreground back if it gave it."""
        if self.handed:
            self._give(os.getpgrp())
        os.close(self.fd)


def _inherit_only(keep: set[int]) -> None:
    """Make every fd but stdio and ``keep`` close-on-exec.

    sandhold's caller may have handed it open files or directories; an inherited
    directory fd is a way onto the host from outside the sandbox's mounts.
    """
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2:
            continue
        try:
            os.set_inheritable(fd, fd in keep)
        except OSError:
            continue  # the directory listing's own fd, closed by now


def _just(pid: int) -> list[int]:
    return [pid]
