"""Run one command under the creation-time supervisor: the agent's steps, as a program.

``python -m sandhold.backends.linux.supervisor.run --policy JSON [--violations FILE]
[--landlock none|child|self] [--no-supervisor] -- CMD ARGS...``

It forks, confines the child (``prepare_child``) and serves its listener from
a supervisor thread in this process until the child and everything it started
have exited; then it writes one JSON line per violation and exits with the
command's status (128+N for death by signal N). Tests and ``bench/`` use it,
inside bubblewrap or without; the agent does the same steps in-process.

``--policy`` is a JSON object with ``writable_roots``, ``deny_write``, ``scratch``,
``cwd`` and ``home`` (see ``creation_policy``). ``--landlock child`` confines the
command only; ``self`` confines this process before any thread starts, so the
supervisor's own emulated calls are under the same Landlock domain.
``--no-supervisor`` runs the command with the same fork and exec but no filter
(the benchmark's baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

from sandhold.backends.linux.supervisor import notify
from sandhold.backends.linux.supervisor.supervisor import (
    Supervisor,
    build_program,
    prepare_child,
    receive_listener,
)
from sandhold.backends.linux.supervisor.violation import Violation
from sandhold.policy.creation import creation_policy


def _status(wait_status: int) -> int:
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandhold.backends.linux.supervisor.run")
    parser.add_argument("--policy", required=True)
    parser.add_argument("--violations")
    parser.add_argument("--landlock", choices=("none", "child", "self"), default="none")
    parser.add_argument("--no-supervisor", action="store_true")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args(argv)
    spec = json.loads(args.policy)
    policy = creation_policy(
        writable_roots=spec.get("writable_roots", ()),
        deny_write=spec.get("deny_write", ()),
        scratch=spec.get("scratch", ()),
        cwd=spec.get("cwd", os.getcwd()),
        home=spec.get("home", os.environ.get("HOME", "/")),
        realpath=os.path.realpath,
    )
    writable = (*policy.writable_roots, *policy.scratch)
    # opened now: under --landlock self this process may not create it later
    report = open(args.violations, "a") if args.violations else sys.stderr  # noqa: SIM115
    if args.landlock == "self":
        from sandhold.backends.linux.supervisor.landlock import restrict_writes

        restrict_writes(writable)

    violations: list[Violation] = []
    supervisor = None
    program = b""
    if not args.no_supervisor:
        supervisor = Supervisor(policy, violations.append)
        supervisor.start()
        program = build_program()
    notify.load()
    notify.set_dumpable(False)  # the sandboxed tree shares our uid: no ptrace of us
    parent_sock, child_sock = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the child: confine, hand over the listener, exec
        try:
            parent_sock.close()
            if supervisor is not None:
                prepare_child(
                    child_sock.fileno(),
                    program,
                    landlock=writable if args.landlock == "child" else None,
                )
            child_sock.close()
            os.execvp(args.command[0], args.command)
        except BaseException as exc:  # never run the command unconfined
            os.write(2, f"supervisor child: {exc}\n".encode())
        finally:
            os._exit(126)
    child_sock.close()
    try:
        if supervisor is not None:
            supervisor.add_listener(receive_listener(parent_sock.fileno()))
        _, wait_status = os.waitpid(pid, 0)
        if supervisor is not None:
            supervisor.wait_idle(timeout=30)
    finally:
        parent_sock.close()
        if supervisor is not None:
            supervisor.close()
    from sandhold.refusals import line

    now = time.time()
    out = "".join(
        json.dumps(line(v.action, v.target, v.rule, now, kind=v.kind, syscall=v.syscall)) + "\n"
        for v in violations
    )
    report.write(out)
    if report is not sys.stderr:
        report.close()
    if supervisor is not None and supervisor.errors:
        sys.stderr.write(f"supervisor: {supervisor.errors} internal errors\n")
    return _status(wait_status)


if __name__ == "__main__":
    sys.exit(main())
