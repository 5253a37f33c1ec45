"""How many proxy connections each sandbox of one process may hold, from its file-descriptor limit.

Every sandbox of a ``SandboxPort`` is served by one process: one fd table for
all of their proxies, launches and execs. One sandbox must not be able to use it up.

Rules:
- ``raise_fd_limit`` raises the soft ``RLIMIT_NOFILE`` to the hard limit (what
  the CLI does too) and returns the limit in force.
- ``plan_budget`` (pure) splits that limit. A reserve, never spent on
  connections, is kept for launches, execs and the process's own fds: a quarter
  of the limit, at least ``MIN_RESERVE``. The rest is ``slots`` connections of
  ``FDS_PER_CONNECTION`` each, shared by every session of the process; one
  session may hold at most ``per_session`` of them (a quarter of the slots,
  between ``MIN_PER_SESSION`` and ``MAX_PER_SESSION``, never more than the slots).
- ``SessionBudget.take`` grants one slot or returns why not (the session's own
  share is used up, or every slot of the process is); the proxies then refuse
  that connection. ``give`` returns a slot. A grant is never taken back.
- Nothing here touches a socket; only ``raise_fd_limit`` asks the OS anything.
"""

from __future__ import annotations

from sandhold._record import record

FDS_PER_CONNECTION = 6  # both sockets, and a pipe pair each way while a side waits
MIN_RESERVE = 128
MIN_PER_SESSION = 8
MAX_PER_SESSION = 4096
SESSION_SHARE = 4  # one session may hold a quarter of the slots


@record
class BudgetPlan:
    """How a file-descriptor limit is split (module rules)."""

    limit: int
    reserve: int
    slots: int
    per_session: int


def plan_budget(limit: int) -> BudgetPlan:
    """Split ``limit`` (the soft ``RLIMIT_NOFILE``) into a reserve and connection slots."""
    reserve = min(limit, max(MIN_RESERVE, limit // 4))
    slots = (limit - reserve) // FDS_PER_CONNECTION
    per_session = min(slots, MAX_PER_SESSION, max(MIN_PER_SESSION, slots // SESSION_SHARE))
    return BudgetPlan(limit, reserve, slots, per_session)


def raise_fd_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; returns the soft limit in force.

    Child processes inherit the raised limit. Where the hard limit is unlimited
    or refused (not on Linux, where it is bounded by ``fs.nr_open``), the soft
    limit stays as it was.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and (soft == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft
        return hard
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class ConnectionBudget:
    """The connection slots every session of one process shares (module rules)."""

    def __init__(self, plan: BudgetPlan) -> None:
        self.plan = plan
        self.used = 0

    def session(self) -> SessionBudget:
        """A new session's account, holding nothing yet."""
        return SessionBudget(self)


class SessionBudget:
    """One session's slots; ``take`` before serving a connection, ``give`` after."""

    def __init__(self, budget: ConnectionBudget) -> None:
        self.budget = budget
        self.held = 0

    def take(self) -> str | None:
        """Take a slot: None if granted, else why the connection is refused."""
        plan = self.budget.plan
        if self.held >= plan.per_session:
            return (
                f"this sandbox holds {self.held} proxy connections, its share of the "
                f"process's {plan.limit} file descriptors"
            )
        if self.budget.used >= plan.slots:
            return (
                f"the process's {plan.slots} proxy connections (of {plan.limit} file "
                "descriptors) are all taken"
            )
        self.held += 1
        self.budget.used += 1
        return None

    def give(self) -> None:
        """Return a slot taken before."""
        if self.held > 0:
            self.held -= 1
            self.budget.used -= 1
