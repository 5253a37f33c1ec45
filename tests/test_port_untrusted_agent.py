"""The host does not trust the agent: lies and stalls put the sandbox in ``error`` and kill it.

A fake agent (a script given to ``SandboxPort(python=…)``) speaks the protocol
badly on purpose. As root and as an unprivileged user, on both backends.
"""

from __future__ import annotations

import pytest

from conftest import World
from portdriver import assert_out_of_reach, drive

FAKE = r"""#!/usr/bin/python3 -I
import os, struct, sys, time
sys.path.insert(0, sys.argv[sys.argv.index("--fd") - 1])
from sandhold.agent import protocol as P
fd = int(sys.argv[sys.argv.index("--fd") + 1])
mode = open(os.path.join(os.path.dirname(sys.argv[0]), "mode")).read().strip()
os.write(fd, P.frame(P.HELLO, 0, P.encode_fields({"version": 1, "pid": os.getpid()})))
dec = P.FrameDecoder(kinds=P.HOST_KINDS)
while True:
    data = os.read(fd, 65536)
    if not data:
        break
    for kind, ident, payload in dec.feed(data):
        if kind == P.EXEC and mode == "lie":
            os.write(fd, P.frame(P.EXIT, 999, P.encode_fields({"code": 0, "signal": 0})))
        elif kind == P.EXEC and mode == "garbage":
            os.write(fd, b"\xff" * 64)
        elif kind == P.EXEC and mode == "ignore-kill":
            os.write(fd, P.frame(P.STARTED, ident, P.encode_fields({"pid": 5})))
"""


@pytest.mark.parametrize("mode", ["lie", "garbage", "ignore-kill"])
@pytest.mark.parametrize("backend", ["native", "none"])
def test_a_misbehaving_agent_fails_the_sandbox(world: World, mode: str, backend: str) -> None:
    fake = world.mkfile("fake/bin/python", FAKE, mode=0o755)
    world.mkfile("fake/bin/mode", mode)
    out = drive(
        world,
        f"""
        async def main(port):
            p = SandboxPort(python={str(fake)!r}, kill_grace=0.5)
            h = await p.launch(spec(), backend=SandboxBackend("{backend}"))
            OUT["ready"] = h.state.value
            before = snapshot(h)
            ex = await p.exec(h, ["sleep", "100"], timeout=0.2)
            t = time.monotonic()
            events = [e async for e in ex]
            OUT["events"] = [
                (e.type, getattr(e, "reason", None) and e.reason.value) for e in events
            ]
            OUT["seconds"] = time.monotonic() - t
            after = p.handle(h)
            OUT["state"] = after.state.value
            OUT["error"] = after.error
            await asyncio.sleep(0.3)
            OUT["left"] = alive_of(before)
            OUT["destroy"] = (await p.destroy(h)).state.value
            await p.aclose()
        """,
    )
    assert out["ready"] == "warm"
    assert out["state"] == "error" and out["destroy"] == "destroyed"
    assert out["events"] == [["killed", "error"], ["exit", None]]
    assert out["left"] == []
    assert out["seconds"] < 5  # type: ignore[operator]
    why = {"lie": "never started", "garbage": "exceeds", "ignore-kill": "did not confirm the kill"}
    assert why[mode] in str(out["error"])


FLOOD = r"""#!/usr/bin/python3 -I
import os, sys
sys.path.insert(0, sys.argv[sys.argv.index("--fd") - 1])
from sandhold.agent import protocol as P
fd = int(sys.argv[sys.argv.index("--fd") + 1])
os.write(fd, P.frame(P.HELLO, 0, P.encode_fields({"version": 1, "pid": os.getpid()})))
dec = P.FrameDecoder(kinds=P.HOST_KINDS)
big = "v" * (1 << 20)
while True:
    data = os.read(fd, 65536)
    if not data:
        break
    for kind, ident, payload in dec.feed(data):
        if kind != P.EXEC:
            continue
        os.write(fd, P.frame(P.STARTED, ident, P.encode_fields({"pid": 5})))
        for _ in range(20):
            os.write(fd, P.frame(P.LOG, 0, P.encode_fields({"message": "L" + big * 3})))
        fields = {"action": big, "target": big, "raw": big, "rule": "r"}
        for _ in range(300):
            os.write(fd, P.frame(P.VIOLATION, ident, P.encode_fields(fields)))
        os.write(fd, P.frame(P.EXIT, ident, P.encode_fields({"code": 0, "signal": 0})))
"""


def test_an_agent_flooding_text_is_cut_short_and_bounded(world: World) -> None:
    """An agent sending megabytes per violation and per LOG frame: each field and log
    line is cut to a few KiB, the log says one line, and a reader that is not reading
    gets a bounded number of bytes of violations queued (the rest counted)."""
    fake = world.mkfile("flood/bin/python", FLOOD, mode=0o755)
    out = drive(
        world,
        f"""
        MAX_AGENT_TEXT, MAX_QUEUED_VIOLATION_BYTES = 8192, 4 << 20

        async def main(port):
            p = SandboxPort(python={str(fake)!r})
            h = await p.launch(spec(), backend=SandboxBackend.NONE)
            stream = p.events(h)
            first = await stream.__anext__()  # subscribed; then it reads nothing a while
            ex = await p.exec(h, ["x"])
            events = [e async for e in ex]
            OUT["exec"] = [e.type for e in events if e.type != "violation"]
            own = [e.violation for e in events if e.type == "violation"]
            OUT["own"] = len(own)
            OUT["field"] = max(len(v.action) for v in own)
            OUT["cut"] = own[0].action[MAX_AGENT_TEXT:]
            await p.destroy(h)
            queued = [e async for e in stream]
            kept = [e for e in queued if e.type == "violation"]
            OUT["first"] = first.type
            OUT["kept"] = sum(e.violation.action != "violations-dropped" for e in kept)
            OUT["dropped"] = sum(
                int(e.violation.target) for e in kept if e.violation.action == "violations-dropped"
            )
            OUT["max_kept"] = MAX_QUEUED_VIOLATION_BYTES // (3 * MAX_AGENT_TEXT + 100)
            await p.aclose()
        """,
    )
    assert out["exec"] == ["exit"]
    assert out["field"] < 8192 + 64  # cut, and the cut said
    assert out["cut"] == f"... [{(1 << 20) - 8192} more characters cut]"
    assert out["first"] == "starting"
    assert 0 < out["kept"] <= out["max_kept"] + 1  # type: ignore[operator]
    assert out["kept"] + out["dropped"] == 300  # type: ignore[operator]
    lines = [ln for ln in str(out["_stderr"]).splitlines() if " agent: " in ln]
    assert len(lines) == 1 and len(lines[0]) < 9000, [ln[:200] for ln in lines]


def test_the_agent_is_out_of_reach_of_what_it_runs_even_without_a_hook(world: World) -> None:
    """A kernel with neither Landlock nor the supervisor, and no writable root: no hook
    is loaded, and the agent is still non-dumpable before its first exec, so nothing it
    runs can take its fds (the channel to the host) or read its memory."""
    out = drive(
        world,
        """
        import sandhold.port.facts as port_module

        async def main(port):
            port_module.confinement_facts()
            port_module._CONFINEMENT.update(supervisor=False, landlock=False)
            h = await port.launch(spec(bind_mounts=(SandboxBindMount(WORK, read_only=True),)))
            OUT["confinement"] = h.detail("confinement")
            r = await port.run(h, REAPER_AND_AGENT)
            OUT["r"] = r.stdout.decode()
            await port.destroy(h)
        """,
    )
    assert out["confinement"] == "mounts only"
    assert_out_of_reach(str(out["r"]))
