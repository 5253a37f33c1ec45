"""How many proxy connections each sandbox of one process may hold, from its file-descriptor limit.

Every sandbox of a ``SandboxPort`` is served by one process: one fd table for
all of their proxies, launches and execs. One sandbox, or several together,
must not be able to use it up and starve another.

Rules:
- ``raise_fd_limit`` raises the soft ``RLIMIT_NOFILE`` to the hard limit (what
  the CLI does too) and returns the limit in force.
- ``plan_budget`` (pure) splits that limit. A reserve, never spent on
  connections, is kept for launches, execs and the process's own fds: a quarter
  of the limit, at least ``MIN_RESERVE``. The rest is ``slots`` connections of
  ``FDS_PER_CONNECTION`` each, shared by every session of the process; one
  session may hold at most ``per_session`` of them (a quarter of the slots,
  between ``MIN_PER_SESSION`` and ``MAX_PER_SESSION``, never more than the slots).
- Fair shares (``decide``, pure): a session's fair share is the slots divided
  by the sessions holding any (itself included), at least 1. A session at its
  ``per_session`` cap is refused. Otherwise it gets a free slot if there is
  one. When none is free, a session under its fair share always gets one: a
  connection of another session holding more than its fair share is reclaimed
  for it, an idle one first (``set_idle``: no complete request head yet, or a
  keep-alive connection between requests), taken from the session holding the
  most that has one; only when no such session has an idle connection, the
  oldest connection of the session holding the most. A session at or over its
  fair share is refused when every slot is taken. Several sessions together
  can therefore never keep another from its fair share.
- ``SessionBudget.take`` applies ``decide``: it grants one slot or returns why
  not; the proxies then refuse that connection (reset). A reclaimed connection
  is shut down (``socket.shutdown``: its proxy task sees EOF and ends) and its
  slot passes at once to the asker; its later ``give`` is a no-op. ``give``
  returns a slot.
- Nothing here touches a socket but that shutdown; only ``raise_fd_limit`` asks
  the OS anything.
"""

from __future__ import annotations

import contextlib
import socket
import weakref

from sandhold._record import record

FDS_PER_CONNECTION = 6  # both sockets, and a pipe pair each way while a side waits
MIN_RESERVE = 128
MIN_PER_SESSION = 8
MAX_PER_SESSION = 4096
SESSION_SHARE = 4  # one session may hold a quarter of the slots (fair shares: module rules)


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


@record
class Grant:
    """``decide``: a free slot for the asker."""


@record
class Reclaim:
    """``decide``: take a connection of session ``victim`` (an idle one if ``idle``)."""

    victim: int
    idle: bool


@record
class Refuse:
    """``decide``: refuse the asker's connection, for ``reason``."""

    reason: str


def decide(
    plan: BudgetPlan, holdings: dict[int, tuple[int, int]], asker: int
) -> Grant | Reclaim | Refuse:
    """What to do with a new connection of session ``asker`` (module rules, pure).

    ``holdings`` maps each session to (connections held, of which idle); the
    asker may be missing from it (it holds none).

    >>> plan = BudgetPlan(limit=100, reserve=40, slots=10, per_session=4)
    >>> decide(plan, {1: (4, 4), 2: (4, 0), 3: (2, 0)}, 4)
    Reclaim(victim=1, idle=True)
    >>> decide(plan, {1: (4, 4), 2: (3, 0), 3: (3, 0)}, 3).reason[:40]
    "the process's 10 proxy connections (of 1"
    """
    held = holdings.get(asker, (0, 0))[0]
    if held >= plan.per_session:
        return Refuse(
            f"this sandbox holds {held} proxy connections, its share of the "
            f"process's {plan.limit} file descriptors"
        )
    used = sum(h for h, _ in holdings.values())
    if used < plan.slots:
        return Grant()
    sessions = len({s for s, (h, _) in holdings.items() if h > 0} | {asker})
    fair = max(1, plan.slots // sessions)
    if held < fair:
        over = sorted(
            ((h, idle, s) for s, (h, idle) in holdings.items() if s != asker and h > fair),
            key=lambda row: (-row[0], row[2]),
        )
        for _, idle, s in over:
            if idle > 0:
                return Reclaim(s, idle=True)
        if over:
            return Reclaim(over[0][2], idle=False)
    return Refuse(
        f"the process's {plan.slots} proxy connections (of {plan.limit} file "
        f"descriptors) are all taken, and this sandbox holds its fair share ({fair}) of them"
    )


class ConnectionBudget:
    """The connection slots every session of one process shares (module rules)."""

    def __init__(self, plan: BudgetPlan) -> None:
        self.plan = plan
        self.used = 0
        self._sessions: dict[int, SessionBudget] = {}  # those holding any
        self._next = 0

    def session(self) -> SessionBudget:
        """A new session's account, holding nothing yet."""
        self._next += 1
        return SessionBudget(self, self._next)


class SessionBudget:
    """One session's slots; ``take`` before serving a connection, ``give`` after."""

    def __init__(self, budget: ConnectionBudget, number: int = 0) -> None:
        self.budget = budget
        self.number = number
        self.held = 0
        # each held connection (one taken without a socket is never reclaimed) -> idle;
        # in taking order, so the oldest comes first
        self._conns: dict[socket.socket, bool] = {}

    def take(self, conn: socket.socket | None = None) -> str | None:
        """Take a slot for ``conn``: None if granted, else why the connection is refused.

        Another session's connection may be reclaimed for it (module rules).
        """
        budget = self.budget
        holdings = {n: (s.held, sum(s._conns.values())) for n, s in budget._sessions.items()}
        verdict = decide(budget.plan, holdings, self.number)
        if isinstance(verdict, Refuse):
            return verdict.reason
        if isinstance(verdict, Reclaim) and not budget._sessions[verdict.victim]._reclaim(
            verdict.idle
        ):
            return f"the process's {budget.plan.slots} proxy connections are all taken"
        self.held += 1
        budget.used += 1
        budget._sessions[self.number] = self
        if conn is not None:
            self._conns[conn] = False
            _ACCOUNTS[conn] = self
        return None

    def give(self, conn: socket.socket | None = None) -> None:
        """Return a slot taken before (a reclaimed connection's was passed on already)."""
        if conn is not None:
            if conn not in self._conns:
                return  # reclaimed: its slot went to another connection
            del self._conns[conn]
            _ACCOUNTS.pop(conn, None)
        if self.held > 0:
            self.held -= 1
            self.budget.used -= 1
        if self.held == 0:
            self.budget._sessions.pop(self.number, None)

    def _reclaim(self, idle: bool) -> bool:
        """Shut down one connection (an idle one if ``idle``, else the oldest); its slot
        is free at once. False if this session holds none it can name (taken without
        a socket)."""
        victim = next((c for c, i in self._conns.items() if i or not idle), None)
        if victim is None:
            return False
        self.give(victim)
        with contextlib.suppress(OSError):
            victim.shutdown(socket.SHUT_RDWR)
        return True


# which account holds a connection, so the proxy serving it can say when it is
# idle without knowing about budgets; weak, so a closed socket drops out
_ACCOUNTS: weakref.WeakKeyDictionary[socket.socket, SessionBudget] = weakref.WeakKeyDictionary()


def set_idle(conn: socket.socket, idle: bool) -> None:
    """Mark ``conn`` idle (reclaimable first) or busy; a no-op for one no budget holds."""
    account = _ACCOUNTS.get(conn)
    if account is not None and conn in account._conns:
        account._conns[conn] = idle
