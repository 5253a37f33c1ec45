"""Time-of-check/time-of-use attacks on the supervisor (F-BE-5): they must never win.

An attacker thread flips a ctypes path buffer between an allowed and a denied
name in a tight loop while another thread makes the call with that buffer,
for several seconds per operation: create, rename onto a denied name, rename
over an existing protected file, link, symlink, mkdir. Afterwards the denied
name must be absent and the protected file unchanged, and both outcomes must
have been seen (the race really ran). As root and as an unprivileged user.

The control runs the same attacker against a naive supervisor that checks the
path and answers CONTINUE (what sandlock does for rename destinations): the
attacker wins there, which shows the attack is real and the test can fail. Behind
that same naive supervisor, a command confined as sandhold confines it (a Landlock
domain that makes no name) does not win either: that layer stands on its own.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from conftest import World
from sandhold.backends.linux.supervisor.landlock import landlock_abi
from test_supervisor_emulation import supervised

SECONDS = 1.25

ATTACKER = textwrap.dedent("""\
    import ctypes, errno, json, os, sys, threading, time
    libc = ctypes.CDLL(None, use_errno=True)
    op, seconds = sys.argv[1], float(sys.argv[4])
    good, bad = sys.argv[2].encode(), sys.argv[3].encode()
    buf = ctypes.create_string_buffer(256)
    ctypes.memmove(buf, good + b"\\0", len(good) + 1)
    addr = ctypes.addressof(buf)
    running = [True]
    flips = [0]

    def flipper():
        g, b, mm = good + b"\\0", bad + b"\\0", ctypes.memmove
        n = 0
        while running[0]:
            mm(addr, b, len(b))
            mm(addr, g, len(g))
            n += 1
        flips[0] = n

    def fd_or_err(rc):
        return rc if rc >= 0 else -ctypes.get_errno()

    keep = {"payload", "source", ".bashrc"}

    def undo():
        # remove what was made (the allowed name, or a torn mix of both names that the
        # flipper left in the buffer), so the next round makes it again
        for name in set(os.listdir(".")) - keep:
            if op in ("rename_new", "rename_over"):
                os.rename(name, "payload")
            elif op == "mkdir":
                os.rmdir(name)
            else:
                os.unlink(name)

    if op in ("rename_new", "rename_over"):
        with open("payload", "w") as f:
            f.write("EVIL\\n")
    if op == "link":
        with open("source", "w") as f:
            f.write("SOURCE\\n")

    def call():
        if op == "create":
            rc = fd_or_err(libc.open(buf, os.O_WRONLY | os.O_CREAT, 0o644))
            if rc >= 0:
                os.close(rc)
                rc = 0
            return rc
        if op in ("rename_new", "rename_over"):
            return fd_or_err(libc.rename(b"payload", buf))
        if op == "link":
            return fd_or_err(libc.link(b"source", buf))
        if op == "symlink":
            return fd_or_err(libc.symlink(b"/etc/hostname", buf))
        if op == "mkdir":
            return fd_or_err(libc.mkdir(buf, 0o755))
        raise SystemExit("unknown op " + op)

    sys.setswitchinterval(0.0001)
    t = threading.Thread(target=flipper)
    t.start()
    outcomes = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        rc = call()
        key = "ok" if rc == 0 else errno.errorcode.get(-rc, str(-rc))
        outcomes[key] = outcomes.get(key, 0) + 1
        if rc == 0:
            if os.path.lexists(bad) and (op != "rename_over" or open(bad).read() != "ORIGINAL\\n"):
                outcomes["WON"] = outcomes.get("WON", 0) + 1  # the denied name was made
                break
            if not os.path.lexists(good):
                outcomes["torn"] = outcomes.get("torn", 0) + 1  # a mix of both names
            undo()
    running[0] = False
    t.join()
    outcomes["flips"] = flips[0]
    print(json.dumps(outcomes))
    """)

# (operation, allowed name, denied name)
CASES = [
    ("create", "allowed.txt", ".env"),
    ("rename_new", "renamed.txt", ".mcp.json"),
    ("rename_over", "renamed.txt", ".bashrc"),
    ("link", "linked.txt", "id_rsa"),
    ("symlink", "symlinked", ".gitmodules"),
    ("mkdir", "madedir", ".claude"),
]


def _attack(
    world: World, op: str, good: str, bad: str, harness: list[str] | None = None
) -> dict[str, int]:
    world.mkfile("work/.bashrc", "ORIGINAL\n")
    argv = [world.ident.python, "-c", ATTACKER, op, good, bad, str(SECONDS)]
    if harness is None:
        result, _violations = supervised(world, argv, timeout=SECONDS * 10 + 60)
    else:
        result = world.ident.run(
            [*harness, *argv], cwd=world.work, env=world.env(), timeout=SECONDS * 10 + 60
        )
    assert result.returncode == 0, result.stderr
    outcomes: dict[str, int] = json.loads(result.stdout.strip().splitlines()[-1])
    return outcomes


@pytest.mark.sandbox
@pytest.mark.parametrize(("op", "good", "bad"), CASES, ids=[c[0] for c in CASES])
def test_path_swapping_attacker_never_wins(world: World, op: str, good: str, bad: str) -> None:
    outcomes = _attack(world, op, good, bad)
    assert "WON" not in outcomes, outcomes
    # the race ran: both names were tried, the flipper ran while calls were in flight
    assert outcomes.get("ok", 0) > 0 and outcomes.get("EACCES", 0) > 0, outcomes
    assert outcomes["flips"] > 10_000, outcomes
    assert not os.path.lexists(world.work / bad) or op == "rename_over"
    assert (world.work / ".bashrc").read_text() == "ORIGINAL\n"


NAIVE = textwrap.dedent("""\
    # check-then-CONTINUE: read the path, decide, let the kernel run the call (re-reading it)
    import os, socket, sys
    from sandhold.backends.linux.supervisor import notify, supervisor
    DENIED = {b".env", b".bashrc", b".mcp.json", b"id_rsa", b".gitmodules", b".claude"}
    prog = supervisor.build_program()
    notify.load()
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the filter alone: not sandhold's Landlock domain, which makes no name
        notify.send_fd(b.fileno(), notify.install_filter(prog))
        os.execvp(sys.argv[1], sys.argv[1:])
    fd = supervisor.receive_listener(a.fileno())
    mem = notify.MemReader()
    import threading
    def serve():
        nr_path = {2: 0, 257: 1, 82: 1, 86: 1, 88: 1, 83: 0}  # x86_64: which arg is the new name
        while True:
            try:
                raw = notify.recv(fd)
            except OSError:
                return
            nid, tid, _f, nr, _a, _ip, *args = notify.NOTIF.unpack(raw)
            try:
                path = mem.cstring(tid, args[nr_path.get(nr, 0)])
            except OSError:
                path = b""
            try:
                if path.rsplit(b"/", 1)[-1] in DENIED:
                    notify.send(fd, nid, 0, 13)
                else:
                    notify.send_continue(fd, nid)
            except OSError:
                pass
    threading.Thread(target=serve, daemon=True).start()
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
    """)


@pytest.mark.sandbox
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the control names x86_64 calls")
@pytest.mark.parametrize(("op", "good", "bad"), [CASES[0], CASES[2]], ids=["create", "rename_over"])
def test_control_a_check_then_continue_supervisor_loses(
    world: World, op: str, good: str, bad: str
) -> None:
    outcomes = _attack(world, op, good, bad, harness=[world.ident.python, "-c", NAIVE])
    assert outcomes.get("WON", 0) > 0, outcomes
    if op == "rename_over":
        assert (world.work / ".bashrc").read_text() == "EVIL\n"
    else:
        assert os.path.lexists(world.work / bad)


# The same naive supervisor, its child confined as sandhold confines a command.
NAIVE_CONFINED = NAIVE.replace(
    "notify.send_fd(b.fileno(), notify.install_filter(prog))",
    "supervisor.prepare_child(b.fileno(), prog)",
)


@pytest.mark.sandbox
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the control names x86_64 calls")
@pytest.mark.skipif(landlock_abi() < 1, reason="the kernel has no Landlock")
@pytest.mark.parametrize(("op", "good", "bad"), [CASES[0], CASES[2]], ids=["create", "rename_over"])
def test_the_commands_own_domain_stops_even_a_naive_supervisor(
    world: World, op: str, good: str, bad: str
) -> None:
    """A layer of its own: the command's Landlock domain lets it make no name itself, so
    the calls the naive supervisor lets the kernel run, the raced ones included, are
    refused (and so are the allowed ones: sandhold's supervisor makes those itself)."""
    assert NAIVE_CONFINED != NAIVE
    world.mkfile("work/payload")  # the command may not make it: it only opens it
    outcomes = _attack(world, op, good, bad, harness=[world.ident.python, "-c", NAIVE_CONFINED])
    assert "WON" not in outcomes and outcomes.get("EACCES", 0) > 0, outcomes
    assert not os.path.lexists(world.work / bad) or op == "rename_over"
    assert (world.work / ".bashrc").read_text() == "ORIGINAL\n"


@pytest.mark.sandbox
@pytest.mark.parametrize(("op", "good", "bad"), CASES, ids=[c[0] for c in CASES])
def test_attacker_never_wins_through_the_cli(world: World, op: str, good: str, bad: str) -> None:
    """The same attack on a real `sandhold` run, for the whole run: the compiled front
    performs the calls that read the allowed name itself and passes the others to the
    Python supervisor, which reads the buffer again and decides on its own copy."""
    settings = world.settings({"filesystem": {"allowWrite": ["."]}})
    harness = [world.ident.python, "-P", "-m", "sandhold", "-s", str(settings), "--"]
    outcomes = _attack(world, op, good, bad, harness=harness)
    assert "WON" not in outcomes, outcomes
    assert outcomes.get("ok", 0) > 0 and outcomes.get("EACCES", 0) > 0, outcomes
    assert outcomes["flips"] > 10_000, outcomes
    assert not os.path.lexists(world.work / bad) or op == "rename_over"
    assert (world.work / ".bashrc").read_text() == "ORIGINAL\n"


# Two sandboxes of one user on one writable root: one moves a directory back and forth
# under a denied path, the other creates an allowed name in it. Each supervisor checks
# and performs its own sandbox's calls one at a time; only the lock they share keeps the
# rename from landing between the other's check and its create.
MOVER = textwrap.dedent("""\
    import os, sys, time
    end = time.monotonic() + float(sys.argv[1])
    n = 0
    while time.monotonic() < end:
        for a, b in (("x", "config"), ("config", "x")):
            try:
                os.rename(a, b)
                n += 1
            except OSError:
                pass
    print(n)
    """)

CREATOR = textwrap.dedent("""\
    import os, sys, time
    end = time.monotonic() + float(sys.argv[1])
    made = wins = 0
    while time.monotonic() < end:
        try:
            fd = os.open("x/prod.yaml", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError:
            continue
        os.close(fd)
        made += 1
        if os.path.exists("config/prod.yaml"):
            wins += 1
        for name in ("x/prod.yaml", "config/prod.yaml"):
            try:
                os.unlink(name)
            except OSError:
                pass
    print(made, wins)
    """)


@pytest.mark.sandbox
@pytest.mark.parametrize("runner", ["front", "python"])
def test_two_sandboxes_cannot_race_a_rename_past_the_check(world: World, runner: str) -> None:
    """``runner``: what supervises the creating sandbox (the mover's renames of a
    directory always reach the Python emulator)."""
    world.mkdir("work/x")
    s = world.settings({"filesystem": {"allowWrite": ["."], "denyWrite": ["config/prod.yaml"]}})
    mover = world.mkfile("mover.py", MOVER)
    creator = world.mkfile("creator.py", CREATOR)
    helper = {"front": "1", "python": "0"}[runner]
    procs = [
        world.popen("-s", str(s), "--", "python3", str(script), str(SECONDS),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    env=world.env(SANDHOLD_EXEC_HELPER=use))
        for script, use in ((mover, "1"), (creator, helper))
    ]  # fmt: skip
    out = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], out
    renames = int(out[0][0])
    made, wins = map(int, out[1][0].split())
    assert renames > 100 and made > 100, out  # the race really ran
    assert wins == 0, out
    assert not (world.work / "config" / "prod.yaml").exists()


# A thread swaps what /proc/self/fd/100 names (a file, an O_PATH fd of a FIFO nobody
# opens for reading) while others open it with O_CREAT: the supervisor must never
# open the FIFO itself (it would wait there, for the whole sandbox and, holding the
# user's creation lock, for every other sandbox of the user). A probe child's mkdir
# every few ms tells a free supervisor from a stuck one.
FD_SWAP = textwrap.dedent("""\
import os, sys, threading, time, json
os.mkfifo("p")
reg = os.open("reg", os.O_WRONLY | os.O_CREAT, 0o644)
fifo = os.open("p", os.O_PATH)
os.dup2(reg, 100)
stop = [False]
attempts = [0]
def flipper():
    while not stop[0]:
        os.dup2(fifo, 100)
        os.dup2(reg, 100)
        for _ in range(3):
            os.dup2(reg, 100)
def writer():
    while not stop[0]:
        try:
            fd = os.open("/proc/self/fd/100", os.O_WRONLY | os.O_CREAT)
            os.close(fd)
        except OSError:
            pass
        attempts[0] += 1
for _ in range(8):
    threading.Thread(target=writer, daemon=True).start()
threading.Thread(target=flipper, daemon=True).start()
end = time.monotonic() + float(sys.argv[1])
stuck = False
n = 0
while time.monotonic() < end:
    pid = os.fork()
    if pid == 0:
        os.mkdir(f"probe{os.getpid()}")
        os.rmdir(f"probe{os.getpid()}")
        os._exit(0)
    t = time.monotonic()
    while time.monotonic() - t < 2:
        if os.waitpid(pid, os.WNOHANG)[0]:
            break
        time.sleep(0.005)
    else:
        stuck = True
        break
    n += 1
stop[0] = True
print(json.dumps({"stuck": stuck, "probes": n, "attempts": attempts[0]}), flush=True)
os._exit(0)
    """)


@pytest.mark.sandbox
def test_a_fifo_swapped_under_a_proc_fd_never_holds_the_supervisor(world: World) -> None:
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    script = world.mkfile("work/fdswap.py", FD_SWAP)
    r = world.sandhold("-s", str(s), "--", "python3", str(script), str(SECONDS), timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["stuck"] is False and out["probes"] > 20, out


@pytest.mark.sandbox
def test_a_creation_lock_held_elsewhere_fails_calls_after_a_while_not_for_ever(
    world: World,
) -> None:
    """Another sandbox may hold the user's creation lock as long as it likes (stopped,
    checking a huge tree): calls that make a name wait at most LOCK_WAIT, then fail
    with EAGAIN and say why, with the compiled front and with the Python runner."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    script = "echo x > made.txt && echo made || echo failed"
    assert world.sandhold("-s", str(s), "--", "sh", "-c", script).stdout == "made\n"
    lock = Path(f"/tmp/sandhold-{world.ident.uid}/creation.lock")
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a stopped sandbox would
        started = time.monotonic()
        procs = [
            world.popen("-s", str(s), "--", "sh", "-c", script.replace("made.txt", name),
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        env=world.env(SANDHOLD_EXEC_HELPER=helper))
            for name, helper in (("a.txt", "1"), ("b.txt", "0"))
        ]  # fmt: skip
        out = [p.communicate(timeout=60) for p in procs]
        waited = time.monotonic() - started
    finally:
        os.close(fd)
    for stdout, stderr in out:
        assert stdout == b"failed\n", (stdout, stderr)
        assert b"held the creation lock for 10 s" in stderr, stderr
        assert b"Resource temporarily unavailable" in stderr, stderr
    assert 9 < waited < 30
    assert not (world.work / "a.txt").exists() and not (world.work / "b.txt").exists()
    again = world.sandhold("-s", str(s), "--", "sh", "-c", script.replace("made.txt", "c.txt"))
    assert again.stdout == "made\n", again.stderr  # let go: calls go through again
