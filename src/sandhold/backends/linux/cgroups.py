"""cgroups for sandboxes: freeze, kill and limit a sandbox's tree, where this process may.

Rules:
- cgroup v2, only below this process's own v2 cgroup ("delegated" means: we can
  make a child cgroup there). On a hybrid host the v2 tree is the one mounted
  with type ``cgroup2`` (often ``/sys/fs/cgroup/unified``).
- cgroup v1 only for a CLI sandbox's limits (``policy.limits``: where v2 has no
  ``pids`` or ``memory`` controller), and only below this process's own cgroup in
  the ``pids`` and ``memory`` hierarchies, where it may write (``limit_facts``).
  A v1 cgroup is never frozen or killed through here.
- The freezer and ``cgroup.kill`` are core files of every non-root v2 cgroup;
  they need no controller. Limits need the ``memory``, ``pids`` and ``cpu``
  controllers enabled for our children (the base's ``cgroup.subtree_control``);
  this module never enables a controller, so a host that has not done so
  reports the limits as unavailable, with the reason.
- ``probe`` runs once per process (it makes and removes one test cgroup, and
  removes empty sandbox cgroups left by owners that died without cleaning up).
- Everything here reports through return values and ``OSError``; the caller
  decides what an unavailable feature means (the port refuses limits it cannot
  enforce, and falls back to SIGSTOP for freezing).
"""

from __future__ import annotations

import os
import time

from sandhold._record import record
from sandhold.backends.linux import procfs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandhold.policy.limits import CgroupFacts, CgroupLimit
    from sandhold.spec import ResourceLimits

LIMIT_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


@record
class CgroupSupport:
    base: str | None  # where sandbox cgroups are made; None: no delegated v2 cgroup
    freezer: bool
    kill: bool  # cgroup.kill (Linux 5.14+)
    controllers: tuple[str, ...]  # limit controllers our children get
    layout: str  # "v2", "hybrid (v1 + v2)", "v1 only"
    reason: str  # why something is missing ("" when all is there)

    def limits_reason(self, wanted: tuple[str, ...]) -> str | None:
        """Why ``wanted`` controllers cannot be used, or None if they can."""
        if self.base is None:
            return self.reason
        missing = [c for c in wanted if c not in self.controllers]
        if not missing:
            return None
        return (
            f"the {'/'.join(missing)} controller(s) are not enabled for children of "
            f"{self.base} (cgroup v2 layout: {self.layout}); sandhold does not enable "
            "controllers itself"
        )


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _v2_mount() -> tuple[str | None, str]:
    """The cgroup2 mount point and the host's layout."""
    mount = None
    v1 = False
    try:
        table = procfs.mounts()
    except OSError:
        table = []  # no mount table: no cgroup found, and the reason says so
    for point, fstype, _root, _options in table:
        if fstype == "cgroup2" and mount is None:
            mount = point
        elif fstype == "cgroup":
            v1 = True
    if mount is None:
        return None, "v1 only" if v1 else "none"
    return mount, "hybrid (v1 + v2)" if v1 else "v2"


_PROBE: list[CgroupSupport] = []


def probe() -> CgroupSupport:
    """What this process may do with cgroup v2 (cached)."""
    if _PROBE:
        return _PROBE[0]
    _PROBE.append(_probe())
    return _PROBE[0]


def _probe() -> CgroupSupport:
    mount, layout = _v2_mount()
    if mount is None:
        return CgroupSupport(None, False, False, (), layout, f"no cgroup v2 hierarchy ({layout})")
    own = next((path for ident, _c, path in procfs.cgroups() if ident == "0"), None)
    if own is None:
        return CgroupSupport(None, False, False, (), layout, "this process has no v2 cgroup")
    base = mount + own.rstrip("/") if own != "/" else mount
    test = f"{base}/sandhold-probe-{os.getpid()}-{os.urandom(3).hex()}"
    try:
        os.mkdir(test)
    except OSError as exc:
        return CgroupSupport(
            None,
            False,
            False,
            (),
            layout,
            f"cgroup v2 is not delegated to this user ({base}: {exc.strerror})",
        )
    try:
        freezer = os.access(f"{test}/cgroup.freeze", os.W_OK)
        kill = os.access(f"{test}/cgroup.kill", os.W_OK)
        enabled = (_read(f"{base}/cgroup.subtree_control") or "").split()
    finally:
        os.rmdir(test)
    controllers = tuple(c for c in LIMIT_CONTROLLERS if c in enabled)
    reason = "" if freezer else "cgroup.freeze is missing (Linux < 5.2)"
    _sweep(base)
    return CgroupSupport(base, freezer, kill, controllers, layout, reason)


def limit_facts() -> CgroupFacts:
    """What this host offers for a CLI sandbox's limits (``policy.limits.CgroupFacts``).

    Cheap, for every launch: the mount table, ``/proc/self/cgroup``, one read of
    ``cgroup.subtree_control`` and ``access`` checks; no cgroup is made here (a
    launch that makes one and fails stops, naming the key)."""
    from sandhold.policy.limits import CgroupFacts

    try:
        table = procfs.mounts()
    except OSError as exc:
        why = f"the mount table cannot be read ({exc.strerror})"
        return CgroupFacts(v2_why=why, v1_why=why)
    own = procfs.cgroups()
    v2_base, v2_controllers, v2_why = _v2_limit_base(table, own)
    # a non-root cgroup has memory.swap.max with swap accounting; the root one has
    # only memory.swap.current then
    swap = any(os.path.exists(f"{v2_base}/memory.swap.{f}") for f in ("max", "current"))
    found: dict[str, str] = {}
    missing: list[str] = []
    for controller in ("pids", "memory"):
        where = _v1_cgroup(table, own, controller)
        if where is None:
            missing.append(f"no cgroup v1 {controller} hierarchy")
        elif not (os.access(where, os.W_OK) and os.access(f"{where}/cgroup.procs", os.W_OK)):
            missing.append(f"the v1 {controller} cgroup {where} is not writable by this user")
        else:
            found[controller] = where
    memory = found.get("memory", "")
    return CgroupFacts(
        v2_base=v2_base,
        v2_controllers=v2_controllers,
        v2_swap=swap,
        v2_why=v2_why,
        v1_pids=found.get("pids", ""),
        v1_memory=memory,
        v1_memsw=bool(memory) and os.path.exists(f"{memory}/memory.memsw.limit_in_bytes"),
        v1_why="; ".join(missing) or "",
    )


WARM_FOR = 0.5  # seconds: the most a launch keeps cgroup moves fast (``warm_moves``)
_warm: list[bool] = []  # set while a warm-up runs; cleared to stop it


def warm_moves() -> None:
    """Keep cgroup moves fast until ``stop_warming``, in a thread of its own.

    Why: the kernel makes a cgroup move wait a whole RCU grace period (5-20 ms
    here) unless another move ended moments before; a launch's child would pay it
    between fork and exec. Moving this process into the v1 cgroup it is in already
    is such a move and changes nothing: the first pays the grace period while the
    launch is planned, each next one (every 2 ms) keeps the window open, and the
    child's move then takes ~0.1 ms. Only an optimisation: errors end it quietly,
    and it ends by itself after ``WARM_FOR``."""
    if _warm or os.geteuid() != 0:  # v1 hierarchies are root's (``limit_facts``)
        return
    procs = _own_v1_procs()
    if procs is None:
        return
    import _thread

    me = str(os.getpid())
    _warm.append(True)

    def loop() -> None:
        end = time.monotonic() + WARM_FOR
        try:
            while _warm and time.monotonic() < end:
                _write(procs, me)
                time.sleep(0.002)
        except OSError:
            pass
        _warm.clear()

    # not threading.Thread: its start() waits for the thread to be scheduled
    _thread.start_new_thread(loop, ())


def _own_v1_procs() -> str | None:
    """This process's ``cgroup.procs`` in the v1 pids hierarchy, if it is mounted where
    hybrid hosts mount it; a cheap guess, before the mount table is read."""
    for _ident, controllers, path in procfs.cgroups():
        if controllers == ("pids",):
            procs = f"/sys/fs/cgroup/pids{path.rstrip('/')}/cgroup.procs"
            return procs if os.access(procs, os.W_OK) else None
    return None


def stop_warming() -> None:
    _warm.clear()


def _below(point: str, root: str, path: str) -> str | None:
    """Where cgroup ``path`` (as /proc/self/cgroup names it) shows in a mount of its
    hierarchy at ``point`` whose root is ``root``; None: outside that mount."""
    if root == "/":
        return point if path == "/" else point + path
    if path == root or path.startswith(root + "/"):
        return point + path[len(root) :]
    return None


def _v2_limit_base(
    table: list[tuple[str, str, str, str]], own: list[tuple[str, tuple[str, ...], str]]
) -> tuple[str, tuple[str, ...], str]:
    """(base, the limit controllers enabled for its children, why not) of cgroup v2."""
    mount = next(((p, r) for p, kind, r, _o in table if kind == "cgroup2"), None)
    path = next((where for ident, _c, where in own if ident == "0"), None)
    if mount is None or path is None:
        return "", (), "no cgroup v2 hierarchy holds this process"
    base = _below(mount[0], mount[1], path)
    if base is None:
        return "", (), f"this process's cgroup v2 {path} is outside the mount at {mount[0]}"
    enabled = (_read(f"{base}/cgroup.subtree_control") or "").split()
    controllers = tuple(c for c in ("pids", "memory") if c in enabled)
    if not os.access(base, os.W_OK):
        return "", (), f"cgroup v2 is not delegated to this user ({base} is not writable)"
    if len(controllers) < 2:
        offered = (_read(f"{base}/cgroup.controllers") or "").split()
        return (
            base if controllers else "",
            controllers,
            f"cgroup v2 at {base} does not enable "
            + " and ".join(c for c in ("pids", "memory") if c not in controllers)
            + f" for its children (its cgroup.controllers: {' '.join(offered) or 'none'};"
            " sandhold does not enable controllers itself)",
        )
    return base, controllers, ""


def _v1_cgroup(
    table: list[tuple[str, str, str, str]],
    own: list[tuple[str, tuple[str, ...], str]],
    controller: str,
) -> str | None:
    """This process's cgroup in the v1 hierarchy of ``controller``, as mounted here."""
    path = next((where for _i, names, where in own if controller in names), None)
    for point, kind, root, options in table:
        if kind == "cgroup" and controller in options.split(",") and path is not None:
            where = _below(point, root, path)
            if where is not None:
                return where.rstrip("/") or "/"
    return None


class LimitCgroups:
    """The cgroups of one CLI sandbox's limits (``policy.limits.Limits.cgroups``).

    ``make`` creates and fills each one; ``procs`` are the files the sandbox's first
    process writes itself into before it execs (``backends.process.spawn_into``);
    ``remove`` waits for the last exits and removes them, and is safe to call twice.
    A cgroup left behind by a sandhold that was killed is removed by the next
    ``make`` in the same place (its owner's pid is in the name)."""

    def __init__(self) -> None:
        self.made: list[SandboxCgroup] = []

    @property
    def procs(self) -> tuple[str, ...]:
        return tuple(f"{c.path}/cgroup.procs" for c in self.made)

    def make(self, limits: tuple[CgroupLimit, ...]) -> None:
        """Make each cgroup and write its files.

        Raises:
            LaunchError: one cannot be made or written: the key it enforces is named.
        """
        from sandhold.errors import LaunchError

        name = f"sandhold-{os.getpid()}-{os.urandom(3).hex()}"
        for limit in limits:
            _sweep(limit.parent)
            try:
                os.mkdir(f"{limit.parent}/{name}")
            except OSError as exc:
                raise LaunchError(
                    "native", limit.key, f"cannot make a cgroup in {limit.parent}: {exc.strerror}"
                ) from exc
            group = SandboxCgroup(f"{limit.parent}/{name}")
            self.made.append(group)
            for file, value in limit.files:
                try:
                    _write(f"{group.path}/{file}", value)
                except OSError as exc:
                    raise LaunchError(
                        "native", limit.key, f"cannot set {group.path}/{file}: {exc.strerror}"
                    ) from exc

    def counts(self) -> tuple[int, int]:
        """(forks refused at ``pids.max``, processes the kernel killed for memory) so
        far, summed over the cgroups (v1 and v2 name them alike but for the OOM kills'
        file)."""
        refused = kills = 0
        for group in self.made:
            refused += _counter(f"{group.path}/pids.events", "max")
            kills += _counter(f"{group.path}/memory.events", "oom_kill")
            kills += _counter(f"{group.path}/memory.oom_control", "oom_kill")
        return refused, kills

    def remove(self) -> None:
        for group in self.made:
            group.remove(timeout=5.0)


def _counter(path: str, name: str) -> int:
    """The counter ``name`` of a flat-keyed cgroup file (``pids.events``...); 0 if none."""
    for line in (_read(path) or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


def _sweep(base: str) -> None:
    """Remove empty sandbox cgroups whose owner died without removing them (SIGKILL)."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if len(parts) != 3 or parts[0] != "sandhold" or not parts[1].isdigit():
            continue
        if procfs.exists(int(parts[1])):
            continue  # the owner lives (or its pid was reused: then it waits for later)
        try:
            os.rmdir(f"{base}/{name}")
        except OSError:
            continue  # not empty: processes still in it are not ours to judge here


class SandboxCgroup:
    """One sandbox's cgroup (see module rules). ``remove`` is safe to call twice."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.removed = False

    @classmethod
    def create(cls, support: CgroupSupport, name: str) -> SandboxCgroup:
        """Make ``<base>/<name>``.

        Raises:
            OSError: not delegated after all, or the name is taken.
        """
        if support.base is None:
            raise OSError(0, support.reason)
        path = f"{support.base}/{name}"
        os.mkdir(path)
        return cls(path)

    def set_limits(self, limits: ResourceLimits) -> None:
        if limits.memory_bytes is not None:
            _write(f"{self.path}/memory.max", str(limits.memory_bytes))
            _write(f"{self.path}/memory.swap.max", "0")
        if limits.pids is not None:
            _write(f"{self.path}/pids.max", str(limits.pids))
        if limits.cpus is not None:
            quota = max(1000, int(limits.cpus * CPU_PERIOD_US))
            _write(f"{self.path}/cpu.max", f"{quota} {CPU_PERIOD_US}")

    def add(self, pid: int) -> None:
        _write(f"{self.path}/cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        text = _read(f"{self.path}/cgroup.procs") or ""
        return [int(p) for p in text.split()]

    def freeze(self, frozen: bool) -> None:
        _write(f"{self.path}/cgroup.freeze", "1" if frozen else "0")

    def freezing(self) -> bool:
        """The cgroup is asked to freeze (``cgroup.freeze``), whether or not every task
        has stopped yet."""
        return (_read(f"{self.path}/cgroup.freeze") or "").strip() == "1"

    def is_frozen(self) -> bool:
        for line in (_read(f"{self.path}/cgroup.events") or "").splitlines():
            if line.startswith("frozen "):
                return line.split()[1] == "1"
        return False

    def kill(self) -> None:
        """SIGKILL everything inside (``cgroup.kill``, or one by one on older kernels)."""
        try:
            _write(f"{self.path}/cgroup.kill", "1")
            return
        except OSError:
            pass  # no cgroup.kill: below
        for _ in range(50):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass

    def oom_kills(self) -> int:
        for line in (_read(f"{self.path}/memory.events") or "").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def remove(self, timeout: float = 2.0) -> None:
        """Remove the (emptied) cgroup; waits up to ``timeout`` for the last exits."""
        if self.removed:
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                os.rmdir(self.path)
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    return  # still busy: a later remove() can try again
                time.sleep(0.002)
                continue
            break
        self.removed = True
