"""The compiled front (``_helper/sandhold-exec``): where it is, and how the agent runs it.

Light on purpose: the CLI asks ``compiled_front`` on every supervised start and
``confining_front`` on every other one, so this module imports nothing beyond ``os``
until a front is started.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandhold.backends.linux.supervisor.supervisor import Supervisor
    from sandhold.policy.creation import CreationPolicy


def _built() -> str | None:
    """``_helper/sandhold-exec`` if built (``scripts/setup``) and not turned off with
    ``SANDHOLD_EXEC_HELPER=0``."""
    if os.environ.get("SANDHOLD_EXEC_HELPER") == "0":
        return None
    # this file is sandhold/backends/linux/supervisor/front.py
    here = os.path.realpath(__file__).rsplit("/", 4)[0]
    exe = os.path.join(here, "_helper", "sandhold-exec")
    return exe if os.access(exe, os.X_OK) else None


def confining_front() -> str | None:
    """The compiled front for a launch with no supervisor (``sandhold-exec
    --confine``), or None: the Python ``runner.confine_main`` does it. It reads no
    process's memory, so Yama does not matter here."""
    return _built()


def compiled_front() -> str | None:
    """The compiled front (``_helper/sandhold-exec``, built by ``scripts/setup``), or None
    (not built, ``SANDHOLD_EXEC_HELPER=0``, or Yama's ptrace_scope 1 or more): the Python
    supervisor does it all.

    With Yama at 1 only an ancestor may read a process's memory. The CLI's front hands
    calls to a Python child that is no ancestor of the command, and SandboxPort's front
    is a sibling of what it serves; the Python supervisor alone is the command's parent
    (the CLI's runner) or its exec's (the agent), so it is used instead."""
    if os.environ.get("SANDHOLD_EXEC_HELPER") == "0":
        return None
    from sandhold.backends.linux.hostprobe import yama_ptrace_scope

    if yama_ptrace_scope() >= 1:
        return None
    return _built()


def start_front(exe: str, policy: CreationPolicy, supervisor: Supervisor, lock_fd: int) -> int:
    """Start the compiled front ``exe --serve`` beside ``supervisor``: it performs the
    ordinary calls of the listeners it is given (``front_add_listener``) and passes the
    others to ``supervisor`` (``add_front``), holding ``lock_fd`` (the user's creation
    lock, -1: none) around each. Returns the control socket.

    Start it where its calls must happen (it inherits Landlock and namespaces) and
    before the command exists (it is non-dumpable from its first instruction on).
    """
    import _socket

    from sandhold.policy.creation import fastpath_rules

    ctrl, ctrl_theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    calls, calls_theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    rules = os.memfd_create("sandhold-fastpath", os.MFD_CLOEXEC)
    theirs = (rules, ctrl_theirs.fileno(), calls_theirs.fileno())
    try:
        os.write(rules, fastpath_rules(policy))
        os.lseek(rules, 0, os.SEEK_SET)
        for fd in theirs:
            os.set_inheritable(fd, True)
        if lock_fd >= 0:
            os.set_inheritable(lock_fd, True)  # for this spawn only: no fork runs beside it
        argv = [exe, "--serve", *(str(fd) for fd in theirs), str(lock_fd)]
        os.posix_spawn(exe, argv, {})
    except BaseException:
        ctrl.close()
        calls.close()
        raise
    finally:
        if lock_fd >= 0:
            os.set_inheritable(lock_fd, False)
        os.close(rules)
        ctrl_theirs.close()
        calls_theirs.close()
    supervisor.add_front(calls.detach())
    return int(ctrl.detach())


def front_add_listener(ctrl: int, listener: int, tag: int) -> None:
    """Give ``listener`` to the front behind ``ctrl`` (``start_front``), tagged; the
    caller keeps and closes its own copy. Raises OSError if the front is gone."""
    from sandhold.backends.linux.supervisor import notify

    notify.send_fd(ctrl, listener, tag.to_bytes(8, "little"))
