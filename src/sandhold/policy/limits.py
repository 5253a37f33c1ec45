"""Process and memory limits of a CLI sandbox: which apply, and how they are enforced.

Rules (issue 16):
- Every CLI sandbox (native backend) has a limit on its processes and one on its
  memory: ``DEFAULT_PROCESSES`` and ``DEFAULT_MEMORY_MIB`` unless the settings'
  ``limits.processes`` and ``limits.memoryMiB`` say otherwise.
- Each limit takes the strongest mechanism the host offers (``choose``, over the
  probed ``CgroupFacts``), decided per limit:
  1. cgroup v2 (``CGROUP2``), where this process's v2 cgroup is delegated to it and
     the controller (``pids``, ``memory``) is enabled for its children: the
     sandbox gets a cgroup of its own below it, which bounds the whole tree (every
     process and thread in ``pids.max``; every page it is charged for in
     ``memory.max``, and no swap: ``memory.swap.max`` 0, where swap is accounted).
  2. cgroup v1 (``CGROUP1``), where v2 has no such controller but the v1 ``pids``
     or ``memory`` hierarchy is writable here (root on a hybrid host): a cgroup of
     its own below this process's cgroup in that hierarchy, ``pids.max``,
     ``memory.limit_in_bytes`` and, where the kernel has it,
     ``memory.memsw.limit_in_bytes`` at the same value (no swap beyond it).
  3. Otherwise, processes unprivileged (``NPROC``): ``RLIMIT_NPROC``, set inside
     the sandbox's user namespace before the command starts. Since Linux 5.14 the
     kernel counts it per user namespace, so it bounds the sandbox's own processes
     (sandhold's front and supervisor count among them), not the user's others;
     set before the user namespace exists it would count all of the user's
     processes on the host, so it is not set there. The command cannot raise it
     (it lacks ``CAP_SYS_RESOURCE`` in the host's user namespace).
  4. Otherwise, processes as root (``WATCH``): the kernel never applies
     ``RLIMIT_NPROC`` to root, so sandhold counts the processes of the sandbox's
     PID namespace (its init included, threads not) every ``WATCH_INTERVAL``
     seconds and kills the whole sandbox once they pass the limit, saying so: a
     bound reached by reaction, which a fork loop may overshoot for one interval.
  5. Otherwise, memory (``DATA``): ``RLIMIT_DATA`` of each process (its heap and
     private writable mappings, not the address space a runtime reserves): a
     bound per process, not on the sandbox's total; root can raise it.
- A cgroup is made and filled before the sandbox's first process runs (the child
  enters it between fork and exec, so nothing escapes it) and removed after the
  sandbox has exited (one left by a sandhold that was killed is removed by the
  next launch that looks there). The backend carries the plan out and decides
  nothing: a cgroup the plan names that cannot be made or written stops the
  launch, naming the key (``limits.processes``, ``limits.memoryMiB``), never a
  quiet fall back to a weaker mechanism.

Pure: the facts come in as ``CgroupFacts`` (``backends/linux/cgroups.limit_facts``);
the backend carries the choice out (``backends/linux/native.py``).
"""

from __future__ import annotations

from sandhold._record import record

DEFAULT_PROCESSES = 2048
"""Processes a CLI sandbox may have at once, by default (``limits.processes``)."""

DEFAULT_MEMORY_MIB = 16384
"""The memory a CLI sandbox may use, by default (``limits.memoryMiB``), in MiB: the
whole sandbox's under a cgroup, each process's data segment under ``DATA``."""

WATCH_INTERVAL = 0.02
"""Seconds between two counts of a root sandbox's processes (``WATCH``)."""

CGROUP2, CGROUP1, NPROC, WATCH, DATA = (
    "cgroup-v2",
    "cgroup-v1",
    "rlimit-nproc",
    "watch",
    ("rlimit-data"),
)
MECHANISMS = (CGROUP2, CGROUP1, NPROC, WATCH, DATA)

PROCESSES_KEY, MEMORY_KEY = "limits.processes", "limits.memoryMiB"


@record
class CgroupFacts:
    """What the host offers for a sandbox's limits (probed at the edge).

    ``v2_base``: the delegated v2 cgroup a sandbox's cgroup is made in ("" when
    none), with ``v2_controllers``, those of ``pids`` and ``memory`` enabled for its
    children, ``v2_swap``: its cgroups have ``memory.swap.max``.
    ``v1_pids``/``v1_memory``: this process's cgroup in that v1 hierarchy
    when it is writable here ("" when not), ``v1_memsw``: the memory one has
    ``memory.memsw.limit_in_bytes``. ``v2_why``/``v1_why``: why each does not
    serve, in words, for ``--explain`` and ``probe``."""

    v2_base: str = ""
    v2_controllers: tuple[str, ...] = ()
    v2_swap: bool = True  # memory.swap.max exists there (swap accounting is on)
    v2_why: str = "no cgroup v2 was looked for"
    v1_pids: str = ""
    v1_memory: str = ""
    v1_memsw: bool = False
    v1_why: str = "no cgroup v1 was looked for"


@record
class CgroupLimit:
    """One cgroup the sandbox gets: made in ``parent``, its ``files`` written in order
    (name, value), then the sandbox's first process moved in. ``key`` names the
    settings key(s) it enforces, for the error when it cannot be made."""

    parent: str
    files: tuple[tuple[str, str], ...]
    key: str


@record
class Limits:
    """The limits of one launch and how each is enforced."""

    processes: int
    memory_mib: int
    process_mechanism: str  # CGROUP2, CGROUP1, NPROC or WATCH
    memory_mechanism: str  # CGROUP2, CGROUP1 or DATA
    cgroups: tuple[CgroupLimit, ...] = ()
    why: str = ""  # why no stronger mechanism serves (cgroup v2, then v1), in words

    @property
    def rlimits(self) -> bool:
        """Some limit is an rlimit (``prlimit`` runs in front of the command)."""
        return self.process_mechanism == NPROC or self.memory_mechanism == DATA

    def cgroup_for(self, key: str) -> CgroupLimit | None:
        """The cgroup that enforces settings key ``key``, or None."""
        return next((c for c in self.cgroups if key in c.key.split(", ")), None)

    def describe(self) -> tuple[str, ...]:
        """``--explain`` and ``probe`` lines."""
        procs = self.cgroup_for(PROCESSES_KEY)
        if procs is not None:
            how = f"pids.max of {_own_cgroup(self.process_mechanism, procs.parent)}"
            lines = [
                f"processes: at most {self.processes}, the whole tree ({PROCESSES_KEY}): {how}"
            ]
        elif self.process_mechanism == NPROC:
            how = "RLIMIT_NPROC in the sandbox's user namespace (it counts its own processes)"
            lines = [f"processes: at most {self.processes} ({PROCESSES_KEY}): {how}"]
        else:
            how = (
                f"counted every {int(WATCH_INTERVAL * 1000)} ms in its PID namespace, the "
                "sandbox killed past it (root: the kernel applies no RLIMIT_NPROC to root)"
            )
            lines = [f"processes: at most {self.processes} ({PROCESSES_KEY}): {how}"]
        memory = self.cgroup_for(MEMORY_KEY)
        if memory is not None:
            names = [name for name, _value in memory.files if name.startswith("memory.")]
            swap = (
                ", no swap beyond it"
                if {"memory.swap.max", "memory.memsw.limit_in_bytes"} & set(names)
                else ", swap not bounded (this kernel has no memory.memsw)"
            )
            where = _own_cgroup(self.memory_mechanism, memory.parent)
            lines.append(
                f"memory: at most {self.memory_mib} MiB for the whole sandbox ({MEMORY_KEY}): "
                f"{names[0]} of {where}{swap}"
            )
        else:
            lines.append(
                f"memory: at most {self.memory_mib} MiB of data per process ({MEMORY_KEY}): "
                "RLIMIT_DATA, per process, not the sandbox's total"
            )
        if self.why:
            lines.append(f"not a stronger mechanism because: {self.why}")
        return tuple(lines)


def _own_cgroup(mechanism: str, parent: str) -> str:
    if mechanism == CGROUP2:
        return f"its own cgroup v2 below {parent}"
    return f"its own cgroup in the v1 hierarchy below {parent}"


def choose(
    *,
    root: bool,
    processes: int | None,
    memory_mib: int | None,
    cgroups: CgroupFacts | None = None,
) -> Limits:
    """The limits of a CLI launch (module rules): ``processes`` and ``memory_mib`` from
    the settings (None: the defaults); ``root``: sandhold runs as root; ``cgroups``:
    what the host offers (None: no cgroup, as on a host that has none)."""
    facts = cgroups if cgroups is not None else CgroupFacts()
    n = processes if processes is not None else DEFAULT_PROCESSES
    mib = memory_mib if memory_mib is not None else DEFAULT_MEMORY_MIB
    size = str(mib << 20)
    v2 = facts.v2_base and facts.v2_controllers
    process_mechanism = memory_mechanism = ""
    v2_files: list[tuple[str, str]] = []
    if v2 and "pids" in facts.v2_controllers:
        process_mechanism = CGROUP2
        v2_files.append(("pids.max", str(n)))
    if v2 and "memory" in facts.v2_controllers:
        memory_mechanism = CGROUP2
        v2_files.append(("memory.max", size))
        if facts.v2_swap:  # without swap accounting there is no such file, nor a swap bound
            v2_files.append(("memory.swap.max", "0"))
    keys = [k for k, m in ((PROCESSES_KEY, process_mechanism), (MEMORY_KEY, memory_mechanism)) if m]
    found = [CgroupLimit(facts.v2_base, tuple(v2_files), ", ".join(keys))] if keys else []
    if not process_mechanism and facts.v1_pids:
        process_mechanism = CGROUP1
        found.append(CgroupLimit(facts.v1_pids, (("pids.max", str(n)),), PROCESSES_KEY))
    if not memory_mechanism and facts.v1_memory:
        memory_mechanism = CGROUP1
        files = [("memory.limit_in_bytes", size)]
        if facts.v1_memsw:  # after the memory limit: the kernel keeps memsw >= it
            files.append(("memory.memsw.limit_in_bytes", size))
        found.append(CgroupLimit(facts.v1_memory, tuple(files), MEMORY_KEY))
    chosen = (process_mechanism, memory_mechanism)
    reasons = [facts.v2_why] if any(m != CGROUP2 for m in chosen) else []
    if not all(chosen):
        reasons.append(facts.v1_why)
    return Limits(
        processes=n,
        memory_mib=mib,
        process_mechanism=process_mechanism or (WATCH if root else NPROC),
        memory_mechanism=memory_mechanism or DATA,
        cgroups=tuple(found),
        why="; ".join(r for r in reasons if r),
    )


def prlimit_argv(limits: Limits, prlimit: str) -> tuple[str, ...]:
    """util-linux ``prlimit``'s arguments that set ``limits``' rlimits on the command it
    runs (the soft and hard values alike), before ``--`` and the command; () when no
    limit is an rlimit (cgroups hold them all)."""
    if not limits.rlimits:
        return ()
    argv = [prlimit]
    if limits.memory_mechanism == DATA:
        data = limits.memory_mib << 20
        argv.append(f"--data={data}:{data}")
    if limits.process_mechanism == NPROC:
        argv.append(f"--nproc={limits.processes}:{limits.processes}")
    return (*argv, "--")
