"""A sandboxed command cannot take the trapped calls away from the supervisor.

The attack: kill whatever holds the seccomp listener (the compiled front, or the
Python supervisor), then load a filter with a listener of its own, whose thread
answers CONTINUE, and create a denied name. Two layers stop it, each checked:
the filter refuses a second listener (``seccomp`` with ``NEW_LISTENER``), and the
command sits in a Landlock domain that cannot signal the listener's holder
(``LANDLOCK_SCOPE_SIGNAL``). Through the CLI (compiled front and Python-only) and
through ``SandboxPort``, as root and as an unprivileged user.
"""

from __future__ import annotations

import json

import pytest

from conftest import World
from portdriver import drive
from sandhold.backends.linux.supervisor.landlock import landlock_abi

# argv[1]: a part of the command line of the processes to kill ("" for none).
ATTACK = r"""
import ctypes, errno, json, os, signal, struct, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR_SECCOMP = {"x86_64": 317, "aarch64": 277}[os.uname().machine]
NR_MKDIR = {"x86_64": 83, "aarch64": 34}[os.uname().machine]  # mkdirat on arm64
R = {}

def name(e):
    return errno.errorcode.get(e, str(e))

def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""

me = os.getpid()
victims = []
for p in os.listdir("/proc"):
    if p.isdigit() and int(p) != me and sys.argv[1].encode() in cmdline(p):
        victims.append(int(p))
R["victims"] = len(victims)
signalled = []
for pid in victims:
    try:
        os.kill(pid, signal.SIGKILL)
        signalled.append(pid)
    except OSError as e:
        R["kill"] = name(e.errno)
R["signalled"] = len(signalled)

class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

# USER_NOTIF for mkdir (mkdirat on arm64), allow the rest (the arch check is left out:
# the sandbox's own filter kills foreign ABIs already)
insns = [(0x20, 0, 0, 0), (0x15, 0, 1, NR_MKDIR), (0x06, 0, 0, 0x7FC00000),
         (0x06, 0, 0, 0x7FFF0000)]
buf = ctypes.create_string_buffer(b"".join(struct.pack("<HBBI", *i) for i in insns))
prog = Fprog(len(insns), ctypes.addressof(buf))

def serve(fd):  # answer every notification with CONTINUE
    req = ctypes.create_string_buffer(80)
    resp = ctypes.create_string_buffer(24)
    while libc.ioctl(fd, 0xC0502100, req) == 0:
        struct.pack_into("<QqiI", resp, 0, struct.unpack_from("<Q", req.raw)[0], 0, 0, 1)
        libc.ioctl(fd, 0xC0182101, resp)

def attacker():  # a thread: the filter binds this thread only, the server stays free
    libc.prctl(38, 1, 0, 0, 0)  # no_new_privs
    deadline = time.monotonic() + (3 if signalled else 0)
    while True:  # the holder may take a moment to go
        fd = libc.syscall(NR_SECCOMP, 1, 8, ctypes.byref(prog))  # SET_MODE_FILTER, NEW_LISTENER
        e = ctypes.get_errno()
        if fd >= 0 or e != errno.EBUSY or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    R["listener"] = "ok" if fd >= 0 else name(e)
    if fd >= 0:
        threading.Thread(target=serve, args=(fd,), daemon=True).start()
    try:
        os.mkdir(".claude")
        R["mkdir"] = "ok"
    except OSError as e:
        R["mkdir"] = name(e.errno)

t = threading.Thread(target=attacker)
t.start()
t.join()
print(json.dumps(R), flush=True)
"""

SETTINGS = {"filesystem": {"allowWrite": ["."]}}


def _scoped() -> bool:
    return landlock_abi() >= 6


@pytest.mark.parametrize("front", ["compiled", "python"])
def test_a_command_cannot_replace_the_cli_supervisor(world: World, front: str) -> None:
    script = world.mkfile("work/attack.py", ATTACK)
    env = world.env(SANDHOLD_EXEC_HELPER="1" if front == "compiled" else "0")
    # the command's parent holds the listener: the front, or the Python supervisor
    r = world.sandhold(
        "-s", str(world.settings(SETTINGS)), "--", "python3", str(script), "sandhold",
        env=env,
    )  # fmt: skip
    assert not (world.work / ".claude").exists()
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["victims"] >= 1, out
    if _scoped():
        assert out["signalled"] == 0 and out["kill"] == "EPERM", out
    assert out["listener"] == "EPERM", out
    assert out["mkdir"] == "EACCES", out


def test_a_command_cannot_replace_the_port_front(world: World) -> None:
    script = world.mkfile("work/attack.py", ATTACK)
    out = drive(
        world,
        f"""
        async def main(port):
            h = await port.launch(spec())
            # the front (``sandhold-exec --serve``), not each exec's reaper (``--reap``),
            # which its command may kill (it holds no listener)
            r = await port.run(h, ["python3", {str(script)!r}, "--serve"])
            OUT["attack"] = (r.stdout.decode(), r.stderr.decode(), r.exit_code)
            # the execs of one sandbox still signal each other
            r = await port.run(h, "sleep 30 & echo $!")
            r2 = await port.run(h, f"kill {{r.stdout.decode().strip()}} && echo killed")
            OUT["sibling"] = r2.stdout.decode().strip()
            await port.destroy(h)
        """,
    )
    stdout, stderr, code = out["attack"]  # type: ignore[misc]
    assert not (world.work / ".claude").exists()
    assert code == 0, stderr
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["victims"] == 1, result
    if _scoped():
        assert result["signalled"] == 0 and result["kill"] == "EPERM", result
    assert result["listener"] == "EPERM", result
    assert result["mkdir"] == "EACCES", result
    assert out["sibling"] == "killed"


def test_port_execs_share_one_domain_and_the_thread_keeps_its_rights(world: World) -> None:
    """The execs' domain is entered on the agent's forking thread, after the supervisor
    thread started: one exec may look into another's processes (ptrace access), and the
    thread still links and renames across directories for them (it answered EXDEV when
    it sat in a nested domain that did not grant that)."""
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            r = await port.run(h, "sleep 30 & echo $!")
            pid = r.stdout.decode().strip()
            r = await port.run(h, f"cat /proc/{pid}/environ >/dev/null && echo seen")
            OUT["seen"] = (r.stdout.decode().strip(), r.stderr.decode())
            r = await port.run(h, "mkdir -p a/d b && echo x > a/f && ln a/f b/f && "
                                  "mv a/d b/d && echo moved")
            OUT["moved"] = (r.stdout.decode().strip(), r.stderr.decode())
            await port.destroy(h)
        """,
    )
    assert out["seen"][0] == "seen", out["seen"]
    assert out["moved"][0] == "moved", out["moved"]
    assert (world.work / "b/f").read_text() == "x\n" and (world.work / "b/d").is_dir()
