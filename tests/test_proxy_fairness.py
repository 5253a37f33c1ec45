"""Fair proxy shares (issue 21): sandboxes holding idle connections cannot starve another.

The table test drives ``budget.decide`` alone; the port test runs six hog
sandboxes of one real ``SandboxPort`` (RLIMIT_NOFILE 512: 64 connection slots,
16 a sandbox at most) against a victim whose requests to a local upstream must
all succeed. Verdicts are the victim's HTTP statuses, seen on the host.
"""

from __future__ import annotations

import pytest

from conftest import World
from sandhold.net.budget import BudgetPlan, ConnectionBudget, Grant, Reclaim, Refuse, decide
from test_port_egress import _drive, port_test_names, upstream

__all__ = ["port_test_names", "upstream"]  # fixtures, imported for pytest

PLAN = BudgetPlan(limit=100, reserve=40, slots=10, per_session=4)

# holdings {session: (held, idle)}, asker, verdict
DECISIONS = [
    ({}, 1, Grant()),
    ({1: (3, 3)}, 1, Grant()),
    ({1: (4, 0)}, 1, Refuse),  # its own cap, slots free or not
    ({1: (4, 4), 2: (4, 4), 3: (2, 0)}, 4, Reclaim(1, idle=True)),  # the most, lowest first
    ({1: (4, 0), 2: (3, 1), 3: (3, 0)}, 4, Reclaim(2, idle=True)),  # idle before the most
    ({1: (4, 0), 2: (3, 0), 3: (3, 0)}, 4, Reclaim(1, idle=False)),  # none idle: the most
    ({1: (4, 4), 2: (3, 3), 3: (3, 0)}, 3, Refuse),  # the asker holds its fair share (3)
    ({1: (4, 4), 2: (4, 0), 3: (2, 0)}, 3, Reclaim(1, idle=True)),  # 2 < 3: under its share
    ({1: (4, 4), 2: (2, 2), 3: (2, 2), 4: (2, 2)}, 5, Reclaim(1, idle=True)),  # fair is 2
    ({1: (2, 2), 2: (2, 2), 3: (2, 2), 4: (2, 2), 5: (2, 2)}, 5, Refuse),  # all at 2
    ({1: (2, 2), 2: (2, 2), 3: (2, 2), 4: (2, 2), 5: (2, 2)}, 6, Reclaim(1, idle=True)),  # fair 1
]


@pytest.mark.parametrize(("holdings", "asker", "verdict"), DECISIONS)
def test_the_budget_decides_fair_shares(
    holdings: dict[int, tuple[int, int]], asker: int, verdict: object
) -> None:
    got = decide(PLAN, holdings, asker)
    if verdict is Refuse:
        assert isinstance(got, Refuse), got
    else:
        assert got == verdict


def test_a_session_under_its_fair_share_always_gets_a_slot() -> None:
    """Every way to fill the slots among up to five sessions: a session under its fair
    share is granted (or given a reclaimed slot), and nothing is over-granted."""
    import itertools

    for count in range(1, 6):
        for held in itertools.product(range(PLAN.per_session + 1), repeat=count):
            if sum(held) > PLAN.slots:
                continue
            holdings = {i + 1: (h, h // 2) for i, h in enumerate(held)}
            for asker in [*holdings, count + 1]:
                mine = holdings.get(asker, (0, 0))[0]
                active = len({s for s, (h, _) in holdings.items() if h} | {asker})
                got = decide(PLAN, holdings, asker)
                if mine < min(PLAN.per_session, PLAN.slots // active):
                    assert not isinstance(got, Refuse), (holdings, asker, got)
                if isinstance(got, Reclaim):
                    assert got.victim != asker
                    assert holdings[got.victim][0] > PLAN.slots // active
                    assert sum(h for h, _ in holdings.values()) == PLAN.slots


def test_without_sockets_the_accounts_still_balance() -> None:
    budget = ConnectionBudget(PLAN)
    a, b = budget.session(), budget.session()
    assert [a.take() for _ in range(4)] == [None] * 4 and a.take() is not None
    assert b.take() is None
    for _ in range(4):
        a.give()
    b.give()
    assert budget.used == 0


HOG = """
import select, socket, sys, time
held, opened = [], 0
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    readable, _, _ = select.select(held, [], [], 0.05)
    for s in readable:  # dropped (head timeout, reclaimed, refused): open another
        held.remove(s)
        s.close()
    while len(held) < int(sys.argv[2]):
        try:
            held.append(socket.create_connection(("127.0.0.1", 3128), timeout=2))
            opened += 1
        except OSError:
            time.sleep(0.05)
            break
print(opened)
"""

VICTIM = "for i in $(seq 15); do curl -sS -m 10 -o /dev/null -w '%{http_code} ' URL; done"


def test_six_hog_sandboxes_cannot_starve_a_seventh(world: World, upstream: int) -> None:
    out = _drive(
        world,
        upstream,
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))
        from sandhold.net.budget import plan_budget
        HOG = {HOG!r}
        VICTIM = {VICTIM!r}.replace("URL", "http://allowed.port.test:UPSTREAM/")

        async def main(port):
            plan = plan_budget(512)
            OUT["plan"] = [plan.slots, plan.per_session]
            net = allow("allowed.port.test")
            hogs = [await port.launch(spec("hog" + str(i), egress_allowlist=net)) for i in range(6)]
            victim = await port.launch(spec("victim", egress_allowlist=net))
            runs = [
                port.run(h, ["python3", "-c", HOG, "12", str(plan.per_session)]) for h in hogs
            ]
            running = asyncio.gather(*runs)
            await asyncio.sleep(2)  # every hog holds what it can
            r = await port.run(victim, ["sh", "-c", VICTIM])
            OUT["victim"] = [r.exit_code, r.stdout.decode().split(), r.stderr.decode()[-500:]]
            OUT["hogs"] = [h.stdout.decode().strip() for h in await running]
        """,
        timeout=120,
    )
    assert out["plan"] == [64, 16]  # six hogs of 16 want more than the 64 slots
    code, statuses, err = out["victim"]
    assert statuses == ["200"] * 15, (statuses, err)
    assert code == 0
    assert all(int(n) >= 16 for n in out["hogs"]), out["hogs"]
