"""A CLI sandbox cannot exhaust the host's process table or memory (issue 16).

A red-team run started 3,000 processes, visible on the host. The rules
(``policy.limits``): every CLI sandbox has a process limit (``limits.processes``)
and a memory limit (``limits.memoryMiB``), each enforced by the strongest mechanism
the host offers: a cgroup v2 of its own where delegated, else a cgroup of its own in
the v1 ``pids``/``memory`` hierarchies where writable (root on a hybrid host, as on
the test machine), else RLIMIT_NPROC inside the sandbox's user namespace
(unprivileged) or a count that kills the sandbox past the limit (root), and
RLIMIT_DATA per process. The choice is a table test here; the launches run a fork
loop (bounded: 300 forks of children that sleep 3 s) and a memory hog as root and
unprivileged, under whichever mechanism the host gives that identity, and check
on the host that nothing of them is left afterwards, cgroups included.

The cgroup v2 path cannot run on the test machine (its v2 tree has no pids or
memory controller: they are bound to v1); it is covered by the plan's table.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import World
from sandhold.backends.linux import procfs
from sandhold.errors import SettingsError
from sandhold.policy import limits
from sandhold.policy.limits import CgroupFacts, CgroupLimit
from sandhold.settings import parse_settings

FORK_LOOP = """
import os, sys, time
kids = []
for i in range(300):
    try:
        pid = os.fork()
    except OSError as e:
        print("refused", len(kids), e.errno)
        break
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
else:
    print("all", len(kids))
sys.stdout.flush()
for k in kids:
    os.kill(k, 9)
"""


def test_the_choice_of_mechanism() -> None:
    user = limits.choose(root=False, processes=None, memory_mib=None)
    assert (user.processes, user.memory_mib) == (
        limits.DEFAULT_PROCESSES,
        limits.DEFAULT_MEMORY_MIB,
    )
    assert user.process_mechanism == limits.NPROC
    root = limits.choose(root=True, processes=64, memory_mib=512)
    assert (root.processes, root.memory_mib, root.process_mechanism) == (64, 512, limits.WATCH)
    assert limits.prlimit_argv(user, "/usr/bin/prlimit") == (
        "/usr/bin/prlimit",
        f"--data={limits.DEFAULT_MEMORY_MIB << 20}:{limits.DEFAULT_MEMORY_MIB << 20}",
        f"--nproc={limits.DEFAULT_PROCESSES}:{limits.DEFAULT_PROCESSES}",
        "--",
    )
    assert "--nproc" not in " ".join(limits.prlimit_argv(root, "p"))  # root: no use


V2 = "/sys/fs/cgroup/user.slice/sandhold.service"
PIDS, MEMORY = "/sys/fs/cgroup/pids/user", "/sys/fs/cgroup/memory/user"
M = 512 << 20
CHOICES = [
    # (facts, root, process mechanism, memory mechanism, the cgroups it makes)
    (
        CgroupFacts(v2_base=V2, v2_controllers=("pids", "memory"), v2_why=""),
        False,
        limits.CGROUP2,
        limits.CGROUP2,
        (
            CgroupLimit(
                V2,
                (("pids.max", "64"), ("memory.max", str(M)), ("memory.swap.max", "0")),
                "limits.processes, limits.memoryMiB",
            ),
        ),
    ),
    (  # no swap accounting in v2: no memory.swap.max to write (and swap not bounded)
        CgroupFacts(v2_base=V2, v2_controllers=("pids", "memory"), v2_swap=False, v2_why=""),
        True,
        limits.CGROUP2,
        limits.CGROUP2,
        (
            CgroupLimit(
                V2,
                (("pids.max", "64"), ("memory.max", str(M))),
                "limits.processes, limits.memoryMiB",
            ),
        ),
    ),
    (  # v2 delegates pids only, v1 memory is writable: each limit its strongest
        CgroupFacts(v2_base=V2, v2_controllers=("pids",), v2_why="no memory", v1_memory=MEMORY),
        True,
        limits.CGROUP2,
        limits.CGROUP1,
        (
            CgroupLimit(V2, (("pids.max", "64"),), "limits.processes"),
            CgroupLimit(MEMORY, (("memory.limit_in_bytes", str(M)),), "limits.memoryMiB"),
        ),
    ),
    (  # the test machine as root: v1 both, with memsw (set after the memory limit)
        CgroupFacts(v2_why="no controllers", v1_pids=PIDS, v1_memory=MEMORY, v1_memsw=True),
        True,
        limits.CGROUP1,
        limits.CGROUP1,
        (
            CgroupLimit(PIDS, (("pids.max", "64"),), "limits.processes"),
            CgroupLimit(
                MEMORY,
                (("memory.limit_in_bytes", str(M)), ("memory.memsw.limit_in_bytes", str(M))),
                "limits.memoryMiB",
            ),
        ),
    ),
    (  # only v1 pids: memory falls to RLIMIT_DATA
        CgroupFacts(v2_why="none", v1_pids=PIDS, v1_why="no memory hierarchy"),
        True,
        limits.CGROUP1,
        limits.DATA,
        (CgroupLimit(PIDS, (("pids.max", "64"),), "limits.processes"),),
    ),
    (CgroupFacts(v2_why="none", v1_why="not writable"), False, limits.NPROC, limits.DATA, ()),
    (CgroupFacts(v2_why="none", v1_why="not writable"), True, limits.WATCH, limits.DATA, ()),
]


@pytest.mark.parametrize(("facts", "root", "procs", "memory", "cgroups"), CHOICES)
def test_the_strongest_mechanism_per_limit(
    facts: CgroupFacts, root: bool, procs: str, memory: str, cgroups: tuple[CgroupLimit, ...]
) -> None:
    got = limits.choose(root=root, processes=64, memory_mib=512, cgroups=facts)
    assert (got.process_mechanism, got.memory_mechanism, got.cgroups) == (procs, memory, cgroups)
    argv = limits.prlimit_argv(got, "prlimit")
    assert ("--nproc=64:64" in argv) is (procs == limits.NPROC)
    assert (f"--data={M}:{M}" in argv) is (memory == limits.DATA)
    assert (argv == ()) is (procs != limits.NPROC and memory != limits.DATA) is (not got.rlimits)
    text = "\n".join(got.describe())
    assert "limits.processes" in text and "limits.memoryMiB" in text
    assert ("the whole tree" in text) is (procs in (limits.CGROUP1, limits.CGROUP2))
    assert ("for the whole sandbox" in text) is (memory != limits.DATA)
    swap = {"memory.swap.max", "memory.memsw.limit_in_bytes"} & {
        f for c in cgroups for f, _ in c.files
    }
    assert ("no swap beyond it" in text) is bool(swap)
    # why no stronger mechanism serves, unless cgroup v2 holds both
    assert ("because:" in text) is ((procs, memory) != (limits.CGROUP2,) * 2)
    if (procs, memory) != (limits.CGROUP2,) * 2:
        assert facts.v2_why in text
    if memory == limits.DATA or procs in (limits.NPROC, limits.WATCH):
        assert facts.v1_why in text


def test_the_settings_keys() -> None:
    s = parse_settings('{"limits": {"processes": 100, "memoryMiB": 2048}}', "s.json")
    assert (s.limit_processes, s.limit_memory_mib) == (100, 2048)
    assert parse_settings("{}", "s.json").limit_processes is None
    with pytest.raises(SettingsError):
        parse_settings('{"limits": {"processes": 1}}', "s.json")


def _mechanisms(world: World) -> tuple[str, str]:
    """(process, memory) mechanism the host gives this identity, as sandhold decides it
    (the facts probed as that user: root may write the v1 hierarchies, the user not)."""
    code = (
        "import os;from sandhold.backends.linux.cgroups import limit_facts as f;"
        "from sandhold.policy.limits import choose as c;"
        "l=c(root=os.geteuid()==0,processes=None,memory_mib=None,cgroups=f());"
        "print(l.process_mechanism,l.memory_mechanism)"
    )
    r = world.ident.run([world.ident.python, "-c", code], cwd=world.root, env=world.env())
    assert r.returncode == 0, r.stderr
    procs, memory = r.stdout.split()
    return procs, memory


def _sandbox_cgroups(owner: int) -> list[str]:
    """The limit cgroups sandhold ``owner`` made, found on the host: it makes them below
    its own cgroups, the test's (it is this process's child)."""
    from sandhold.backends.linux.cgroups import limit_facts

    facts = limit_facts()
    found = []
    for parent in {facts.v2_base, facts.v1_pids, facts.v1_memory} - {""}:
        found += [f"{parent}/{n}" for n in os.listdir(parent) if n.startswith(f"sandhold-{owner}-")]
    return sorted(found)


@pytest.mark.sandbox
def test_a_fork_loop_stops_at_the_limit(world: World) -> None:
    from portdriver import leftovers

    world.mkfile("work/loop.py", FORK_LOOP)
    s = world.settings({"limits": {"processes": 40}})
    procs, _memory = _mechanisms(world)
    if world.ident.is_root:
        assert procs == limits.CGROUP1  # the test machine: v1 pids is writable by root
    started = time.monotonic()
    r = world.sandhold("-s", str(s), "--", "python3", "loop.py", timeout=30)
    took = time.monotonic() - started
    if procs == limits.WATCH:
        # counted and killed: the loop never finished (its children sleep 3 s)
        assert r.returncode == 137, (r.stdout, r.stderr)
        assert "limit of 40 processes (limits.processes)" in r.stderr
        assert "all" not in r.stdout
    else:
        # the kernel refuses the fork at the limit: the cgroup's pids.max counts the
        # whole tree, RLIMIT_NPROC the user namespace's processes
        assert r.returncode == 0, r.stderr
        word, count, errno_ = r.stdout.split()
        assert word == "refused" and int(count) <= 40 and errno_ == "11", r.stdout
        if procs == limits.CGROUP1:
            assert "reached its limit of 40 processes (limits.processes)" in r.stderr
    assert took < 3, took  # nothing waited for the sleeping children
    deadline = time.monotonic() + 3
    while (left := leftovers(world.work)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []


HOLD = """
import os, sys, time
kids = []
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(20)
        os._exit(0)
    kids.append(pid)
print(len(kids), flush=True)
sys.stdin.readline()
"""


@pytest.mark.sandbox
def test_the_host_sees_the_sandbox_bounded_in_its_cgroup(world: World) -> None:
    """Seen from the host, while the sandbox holds as many processes as it could make:
    its cgroup counts them all and no more than the limit; a process in it cannot
    move itself out (the hierarchy is read-only in the sandbox); and once it is done
    the cgroup is gone."""
    procs = _mechanisms(world)[0]
    if procs not in (limits.CGROUP1, limits.CGROUP2):
        # the user: the kernel's RLIMIT_NPROC in the sandbox's user namespace, no cgroup
        assert procs == limits.NPROC and not world.ident.is_root
        s = world.settings({"limits": {"processes": 30}})
        r = world.sandhold(
            "-q", "-s", str(s), "--", "prlimit", "--nproc", "--noheadings", "-o", "SOFT,HARD"
        )
        assert (r.returncode, r.stdout.split()) == (0, ["30", "30"]), (r.stdout, r.stderr)
        return
    world.mkfile("work/hold.py", HOLD)
    escape = (
        "for f in /sys/fs/cgroup/pids/cgroup.procs /sys/fs/cgroup/pids/tasks "
        "/sys/fs/cgroup/unified/cgroup.procs; do (echo 0 > $f) 2>/dev/null && echo moved $f; "
        "done; mkdir /sys/fs/cgroup/pids/out 2>/dev/null && echo made; exec python3 hold.py"
    )
    s = world.settings({"limits": {"processes": 30}})
    p = world.popen(
        "-q", "-s", str(s), "--", "sh", "-c", escape,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert p.stdout is not None and p.stdin is not None
        made = p.stdout.readline().decode()
        assert made.strip().isdigit() and int(made) < 30, made
        groups = _sandbox_cgroups(p.pid)
        pids = [g for g in groups if os.path.exists(f"{g}/pids.current")]
        assert len(pids) == 1, groups
        current = int(Path(f"{pids[0]}/pids.current").read_text())
        assert int(made) < current <= 30, (made, current)  # the holder, its kids, the rest
        assert Path(f"{pids[0]}/pids.max").read_text().strip() == "30"
        p.stdin.write(b"\n")
        p.stdin.close()
        assert p.wait(timeout=20) == 0
        assert p.stderr is not None and b"30 processes (limits.processes)" in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert _sandbox_cgroups(p.pid) == []


@pytest.mark.sandbox
def test_a_memory_hog_is_stopped(world: World) -> None:
    s = world.settings({"limits": {"memoryMiB": 128}})
    hog = "x = bytearray(400 << 20); x[::4096] = b'1' * len(x[::4096]); print('held')"
    r = world.sandhold("-s", str(s), "--", "python3", "-c", hog, timeout=60)
    _procs, memory = _mechanisms(world)
    assert "held" not in r.stdout
    if memory == limits.DATA:  # the allocation is refused: RLIMIT_DATA
        assert r.returncode == 1 and "MemoryError" in r.stderr, r.stderr
    else:  # the kernel kills it in its cgroup, and sandhold says which limit
        assert world.ident.is_root and memory == limits.CGROUP1
        assert r.returncode == 137, (r.returncode, r.stderr)
        assert "memory limit of 128 MiB (limits.memoryMiB)" in r.stderr


@pytest.mark.sandbox
def test_a_killed_sandhold_leaves_no_cgroup_behind_the_next_launch(world: World) -> None:
    from portdriver import leftovers

    cgroups = _mechanisms(world)[0] in (limits.CGROUP1, limits.CGROUP2)
    p = world.popen("-q", "--", "sleep", "30", stdout=subprocess.PIPE)
    deadline = time.monotonic() + 10

    def running() -> bool:  # the sandbox's command is in its cgroups (not only bwrap)
        if not cgroups:  # the user: no cgroup; its sleep runs in the work directory
            return any("sleep 30" in x for x in leftovers(world.work))
        held = [Path(f"{g}/cgroup.procs").read_text().split() for g in _sandbox_cgroups(p.pid)]
        return len(held) == 2 and all(any(procfs.comm(int(x)) == "sleep" for x in h) for h in held)

    while not running():
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.02)
    p.kill()  # SIGKILL: sandhold removes nothing; bwrap's sandbox dies with it
    p.wait()
    while leftovers(world.work):
        assert time.monotonic() < deadline + 5, "the sandbox outlived its sandhold"
        time.sleep(0.02)
    if not cgroups:
        assert _sandbox_cgroups(p.pid) == []
        return
    groups = _sandbox_cgroups(p.pid)
    deadline = time.monotonic() + 5
    while any(Path(f"{g}/cgroup.procs").read_text() for g in groups):
        assert time.monotonic() < deadline, "the sandbox outlived its sandhold"
        time.sleep(0.02)
    r = world.sandhold("-q", "--", "true")
    assert r.returncode == 0, r.stderr
    assert _sandbox_cgroups(p.pid) == []  # swept by that launch: its owner is gone


@pytest.mark.sandbox
def test_explain_says_which_limits_apply(world: World) -> None:
    r = world.sandhold("--explain", "--", "true")
    assert r.returncode == 0, r.stderr
    procs, memory = _mechanisms(world)
    how = {
        limits.CGROUP1: "pids.max of its own cgroup in the v1 hierarchy below",
        limits.CGROUP2: "pids.max of its own cgroup v2 below",
        limits.WATCH: "counted every",
        limits.NPROC: "RLIMIT_NPROC",
    }[procs]
    assert f"processes: at most {limits.DEFAULT_PROCESSES}" in r.stdout and how in r.stdout
    assert ("RLIMIT_DATA" in r.stdout) is (memory == limits.DATA)
    assert "not a stronger mechanism because: cgroup v2" in r.stdout  # none here has it


def test_a_cgroup_that_cannot_be_made_or_set_stops_the_launch_naming_the_key() -> None:
    """The backend carries the plan out or fails loud (exit 125): never a quiet fall back
    to a weaker mechanism. Real cgroup files: a parent that does not exist, and (where
    this process may write the v1 pids hierarchy, as root on the test machine) a value
    the kernel refuses; what was made is removed."""
    from sandhold.backends.linux.cgroups import LimitCgroups, limit_facts
    from sandhold.errors import LaunchError

    groups = LimitCgroups()
    with pytest.raises(LaunchError, match=r"\(limits.processes\): cannot make a cgroup in /nope"):
        groups.make((CgroupLimit("/nope", (("pids.max", "64"),), "limits.processes"),))
    assert groups.made == []
    pids = limit_facts().v1_pids
    assert pids or os.geteuid() != 0
    if pids:
        groups = LimitCgroups()
        bad = CgroupLimit(pids, (("pids.max", "-5"),), "limits.processes")
        with pytest.raises(LaunchError, match=r"\(limits.processes\): cannot set .*pids.max"):
            groups.make((bad,))
        made = groups.made[0].path
        assert os.path.isdir(made)
        groups.remove()
        assert not os.path.exists(made)


def test_the_child_enters_its_cgroups_before_exec_or_fails_loud(tmp_path: Path) -> None:
    """``spawn_into``: a cgroup that refuses the child is a ``CgroupRefused`` (the backend
    names the key), an exec that fails is the exec's own error, and a child that got in
    runs inside from its first instruction (its /proc/self/cgroup says so)."""
    from sandhold.backends.linux.cgroups import LimitCgroups, limit_facts
    from sandhold.backends.process import CgroupRefused, spawn_into

    with pytest.raises(CgroupRefused, match=r"cannot enter the cgroup of /nope/cgroup\.procs"):
        spawn_into(["/nope/cgroup.procs"], "/bin/true", ["true"], {})
    with pytest.raises(OSError) as raised:
        spawn_into([], "/nope/true", ["true"], {})
    assert raised.value.errno == 2 and not isinstance(raised.value, CgroupRefused)
    # the network namespace's helper enters them first, and says so alike
    from sandhold.backends.linux.netns import spawn_in_netns

    with pytest.raises(CgroupRefused, match=r"cannot enter the cgroup of /nope/cgroup\.procs"):
        spawn_in_netns("/bin/true", ["true"], {}, [], cgroup_procs=["/nope/cgroup.procs"])
    pids = limit_facts().v1_pids
    if not pids:
        assert os.geteuid() != 0  # root on the test machine may write it
        return
    groups = LimitCgroups()
    groups.make((CgroupLimit(pids, (("pids.max", "16"),), "limits.processes"),))
    try:
        out = tmp_path / "cgroup"
        pid = spawn_into(
            groups.procs, "/bin/sh", ["sh", "-c", f"cat /proc/self/cgroup > {out}"], {}
        )
        assert os.waitpid(pid, 0)[1] == 0
        name = groups.made[0].path.rsplit("/", 1)[1]
        assert any(line.endswith(f":pids:/{name}") for line in out.read_text().splitlines())
    finally:
        groups.remove()


@pytest.mark.parametrize(
    ("point", "root", "path", "expected"),
    [
        ("/sys/fs/cgroup/pids", "/", "/", "/sys/fs/cgroup/pids"),
        ("/sys/fs/cgroup/pids", "/", "/user.slice", "/sys/fs/cgroup/pids/user.slice"),
        # a container's view: the mount's root is the container's own cgroup
        ("/sys/fs/cgroup/pids", "/docker/abc", "/docker/abc", "/sys/fs/cgroup/pids"),
        ("/sys/fs/cgroup/pids", "/docker/abc", "/docker/abc/x", "/sys/fs/cgroup/pids/x"),
        ("/sys/fs/cgroup/pids", "/docker/abc", "/docker/abcd", None),  # not below it
        ("/sys/fs/cgroup/pids", "/docker/abc", "/", None),
    ],
)
def test_where_a_cgroup_shows_in_its_mount(
    point: str, root: str, path: str, expected: str | None
) -> None:
    from sandhold.backends.linux.cgroups import _below

    assert _below(point, root, path) == expected


def test_the_v1_hierarchy_of_a_controller_is_found_by_its_mount_options() -> None:
    from sandhold.backends.linux.cgroups import _v1_cgroup

    table = [
        ("/sys/fs/cgroup/unified", "cgroup2", "/", "rw,nsdelegate"),
        ("/sys/fs/cgroup/cpu,cpuacct", "cgroup", "/", "rw,cpu,cpuacct"),
        ("/sys/fs/cgroup/memory", "cgroup", "/", "rw,memory"),
        ("/sys/fs/cgroup/pids", "cgroup", "/", "rw,pids"),
    ]
    own = [("0", (), "/"), ("4", ("memory",), "/api/x"), ("8", ("pids",), "/")]
    assert _v1_cgroup(table, own, "memory") == "/sys/fs/cgroup/memory/api/x"
    assert _v1_cgroup(table, own, "pids") == "/sys/fs/cgroup/pids"
    assert _v1_cgroup(table, own, "cpu") is None  # this process names no cpu hierarchy
    assert _v1_cgroup(table[:1], own, "pids") is None  # no v1 mount of it
