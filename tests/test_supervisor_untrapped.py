"""A creating call that the filter does not trap is refused by the kernel.

Every name a supervised command makes is made by the supervisor, which stands outside
the command's own Landlock domain; that domain handles every make-* right and grants
none (``landlock.confine_command``, ``confine_command`` in ``exec.c``). So a gap in the
trapped list (a new system call, a missed flag) cannot make a name unchecked. Shown
with a filter that traps nothing at all, loaded by the compiled front, by the CLI's
Python runner and by the child step of SandboxPort's agent, as root and as an
unprivileged user: every way of making a name fails with ``EACCES`` and leaves
nothing behind, while writing to and removing existing files still works.
"""

from __future__ import annotations

import json

import pytest

from conftest import World
from sandhold.backends.linux.supervisor.landlock import landlock_abi

pytestmark = pytest.mark.skipif(landlock_abi() < 1, reason="the kernel has no Landlock")

# Run as the command, in a directory it may write: each way of making a name.
ATTEMPTS = r"""
import errno, json, os, socket
R = {}

def attempt(what, fn):
    try:
        fn()
        R[what] = "ok"
    except OSError as e:
        R[what] = errno.errorcode.get(e.errno, str(e.errno))

def bind():
    with socket.socket(socket.AF_UNIX) as s:
        s.bind("sock")

attempt("open", lambda: os.close(os.open("file", os.O_WRONLY | os.O_CREAT, 0o644)))
attempt("mkdir", lambda: os.mkdir("dir"))
attempt("symlink", lambda: os.symlink("existing", "sym"))
attempt("link", lambda: os.link("existing", "hard"))
attempt("rename", lambda: os.rename("existing", "renamed"))
attempt("mkfifo", lambda: os.mkfifo("fifo"))
attempt("bind", bind)
attempt("write", lambda: open("existing", "a").write("more"))
attempt("unlink", lambda: os.unlink("doomed"))
print(json.dumps(R), flush=True)
"""

# Run as the test's identity: start the command behind a filter that traps nothing.
DRIVER = r"""
import os, socket, subprocess, sys
from pathlib import Path
import sandhold
from sandhold.backends.linux import seccomp
from sandhold.policy.syscalls import FOREIGN_ABI, KILL_PROCESS, Rule
from sandhold.backends.linux.supervisor.supervisor import prepare_child, receive_listener

front, work, script = sys.argv[1:4]
program = seccomp.build_program(
    (Rule(FOREIGN_ABI, KILL_PROCESS, "test"),), seccomp.native_arch()
)
command = [sys.executable, script]
if front == "compiled":
    helper = Path(sandhold.__file__).parent / "_helper" / "sandhold-exec"
    prog = os.memfd_create("program", 0)
    os.write(prog, program)
    os.lseek(prog, 0, os.SEEK_SET)
    argv = [str(helper), str(prog), "-1", "-1", "1", "/bin/false", "1", work, "--", *command]
    sys.exit(subprocess.run(argv, pass_fds=(prog,)).returncode)
ours, theirs = socket.socketpair()
pid = os.fork()
if pid == 0:
    try:
        ours.close()
        if front == "runner":  # the CLI's Python runner, without a compiled front
            from sandhold.backends.linux.supervisor.runner import _child

            _child(theirs.fileno(), program, command)
        from sandhold.backends.linux.supervisor.landlock import confine_command

        confine_command()  # as the agent's forking thread is, before its execs
        prepare_child(theirs.fileno(), program, confine=False)
        os.execv(command[0], command)
    finally:
        os._exit(126)
theirs.close()
os.close(receive_listener(ours.fileno()))
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""

MADE = ("file", "dir", "sym", "hard", "renamed", "fifo", "sock")


@pytest.mark.parametrize("front", ["compiled", "runner", "agent"])
def test_a_creation_the_filter_misses_is_refused_by_the_kernel(world: World, front: str) -> None:
    script = world.mkfile("attempts.py", ATTEMPTS)
    driver = world.mkfile("driver.py", DRIVER)
    world.mkfile("work/existing", "data")
    world.mkfile("work/doomed")
    r = world.ident.run(
        [world.ident.python, str(driver), front, str(world.work), str(script)],
        cwd=world.work,
        env=world.env(),
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for what in ("open", "mkdir", "symlink", "link", "rename", "mkfifo", "bind"):
        assert out[what] == "EACCES", (what, out)
    assert out["write"] == "ok" and out["unlink"] == "ok", out
    assert sorted(p.name for p in world.work.iterdir()) == ["existing"]
    assert (world.work / "existing").read_text() == "datamore"
    assert not any((world.work / name).exists() for name in MADE)


# Run as the test's identity: the compiled front, where the kernel refuses the Landlock
# ABI query for another reason than having none (a container's seccomp profile).
REFUSED_ABI = r"""
import os, struct, sys
from pathlib import Path
import sandhold
from sandhold.backends.linux.supervisor import notify

# landlock_create_ruleset (444 on x86_64 and aarch64) -> EPERM, the rest allowed
insns = [(0x20, 0, 0, 0), (0x15, 0, 1, 444), (0x06, 0, 0, 0x00050001), (0x06, 0, 0, 0x7FFF0000)]
program = b"".join(struct.pack("<HBBI", *i) for i in insns)
helper = Path(sandhold.__file__).parent / "_helper" / "sandhold-exec"
pid = os.fork()
if pid == 0:
    notify.install_filter(program, listener=False)
    os.execv(str(helper), [str(helper), "--confine", "1", sys.argv[1], "--", "true"])
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_a_refused_landlock_query_stops_the_compiled_front(world: World) -> None:
    """Only ENOSYS/EOPNOTSUPP mean no Landlock; an EPERM from a seccomp profile is no
    answer, and the command does not run without the domain (it did, silently)."""
    driver = world.mkfile("refused.py", REFUSED_ABI)
    r = world.ident.run(
        [world.ident.python, str(driver), str(world.work)], cwd=world.work, env=world.env()
    )
    assert r.returncode == 126 and "landlock_create_ruleset" in r.stderr, (r.returncode, r.stderr)
