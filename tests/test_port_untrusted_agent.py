"""The host does not trust the agent: lies and stalls put the sandbox in ``error`` and kill it.

A fake agent (a script given to ``SandboxPort(python=…)``) speaks the protocol
badly on purpose. As root and as an unprivileged user, on both backends.
"""

from __future__ import annotations

import pytest

from conftest import World
from portdriver import drive

FAKE = r"""#!/usr/bin/python3 -I
import os, struct, sys, time
sys.path.insert(0, sys.argv[sys.argv.index("-c") + 2])
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
