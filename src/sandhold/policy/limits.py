"""Process and memory limits of a CLI sandbox: which apply, and how they are enforced.

Rules (issue 16):
- Every CLI sandbox (native backend) has a limit on its processes and one on its
  memory: ``DEFAULT_PROCESSES`` and ``DEFAULT_MEMORY_MIB`` unless the settings'
  ``limits.processes`` and ``limits.memoryMiB`` say otherwise.
- cgroup v2, which bounds a whole tree, is not used by the CLI yet (the port uses
  it where delegated): the strongest mechanism left is chosen by who runs it.
- Processes, unprivileged (``NPROC``): ``RLIMIT_NPROC``, set inside the sandbox's
  user namespace before the command starts. Since Linux 5.14 the kernel counts it
  per user namespace, so it bounds the sandbox's own processes (sandhold's front
  and supervisor count among them), not the user's others; set before the user
  namespace exists it would count all of the user's processes on the host, so it
  is not set there. The command cannot raise it (it lacks ``CAP_SYS_RESOURCE``
  in the host's user namespace).
- Processes, root (``WATCH``): the kernel never applies ``RLIMIT_NPROC`` to root,
  so sandhold counts the processes of the sandbox's PID namespace (its init
  included, threads not) every
  ``WATCH_INTERVAL`` seconds and kills the whole sandbox (its namespace's init)
  once they pass the limit, saying so: a bound reached by reaction, which a fork
  loop may overshoot for one interval.
- Memory (``DATA``): ``RLIMIT_DATA`` of each process (its heap and private
  writable mappings, not the address space a runtime reserves): a bound per
  process, not on the sandbox's total; root can raise it.

Pure: the backend carries the choice out (``backends/linux/native.py``).
"""

from __future__ import annotations

from sandhold._record import record

DEFAULT_PROCESSES = 2048
"""Processes a CLI sandbox may have at once, by default (``limits.processes``)."""

DEFAULT_MEMORY_MIB = 16384
"""The data segment one process of a CLI sandbox may have, by default
(``limits.memoryMiB``), in MiB."""

WATCH_INTERVAL = 0.02
"""Seconds between two counts of a root sandbox's processes (``WATCH``)."""

NPROC, WATCH, DATA = "rlimit-nproc", "watch", "rlimit-data"


@record
class Limits:
    """The limits of one launch and how each is enforced."""

    processes: int
    memory_mib: int
    process_mechanism: str  # NPROC or WATCH
    memory_mechanism: str  # DATA

    def describe(self) -> tuple[str, ...]:
        """``--explain`` and ``probe`` lines."""
        how = {
            NPROC: "RLIMIT_NPROC in the sandbox's user namespace (it counts its own processes)",
            WATCH: (
                f"counted every {int(WATCH_INTERVAL * 1000)} ms in its PID namespace, the "
                "sandbox killed past it (root: the kernel applies no RLIMIT_NPROC to root)"
            ),
        }[self.process_mechanism]
        return (
            f"processes: at most {self.processes} (limits.processes): {how}",
            f"memory: at most {self.memory_mib} MiB of data per process (limits.memoryMiB): "
            "RLIMIT_DATA, per process, not the sandbox's total (cgroup v2 is not used by "
            "the CLI)",
        )


def choose(*, root: bool, processes: int | None, memory_mib: int | None) -> Limits:
    """The limits of a CLI launch (module rules): ``processes`` and ``memory_mib`` from
    the settings (None: the defaults); ``root``: sandhold runs as root."""
    return Limits(
        processes=processes if processes is not None else DEFAULT_PROCESSES,
        memory_mib=memory_mib if memory_mib is not None else DEFAULT_MEMORY_MIB,
        process_mechanism=WATCH if root else NPROC,
        memory_mechanism=DATA,
    )


def prlimit_argv(limits: Limits, prlimit: str) -> tuple[str, ...]:
    """util-linux ``prlimit``'s arguments that set ``limits`` on the command it runs
    (the soft and hard values alike), before ``--`` and the command."""
    data = limits.memory_mib << 20
    argv = [prlimit, f"--data={data}:{data}"]
    if limits.process_mechanism == NPROC:
        argv.append(f"--nproc={limits.processes}:{limits.processes}")
    return (*argv, "--")
