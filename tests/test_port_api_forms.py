"""The API's other forms: handle details as a read-only mapping, the sandbox-centred
``LiveSandbox`` (``port.sandbox(spec)``), and ``BlockingSandboxPort.exec``/``explain``.

The mapping is checked as a value; the forms drive real sandboxes, as root and as
a user, and check that each call reached the sandbox (its output, its state).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping

import pytest

from conftest import World
from portdriver import drive
from sandhold.errors import SpecError
from sandhold.spec import SandboxBackend, SandboxHandle, SandboxState, json_dumps

NATIVE, WARM = SandboxBackend.NATIVE, SandboxState.WARM


@pytest.mark.parametrize(
    "details",
    [
        {"pid": "12", "workdir": "/w"},
        (("workdir", "/w"), ("pid", "12")),
        {"workdir": "/w", "pid": "12"},
    ],
)
def test_handle_details_are_a_read_only_mapping_that_round_trips(details: object) -> None:
    h = SandboxHandle("s", NATIVE, WARM, details=details)  # type: ignore[arg-type]
    assert isinstance(h.details, Mapping)
    assert h.details == {"pid": "12", "workdir": "/w"} and list(h.details) == ["pid", "workdir"]
    assert h.details["pid"] == "12" and h.detail("pid") == "12" and h.detail("no", "-") == "-"
    with pytest.raises(TypeError):
        h.details["pid"] = "13"  # type: ignore[index]
    same = SandboxHandle("s", NATIVE, WARM, details={"workdir": "/w", "pid": "12"})
    assert h == same and hash(h) == hash(same)
    assert SandboxHandle.from_json(json.loads(json_dumps(h))) == h
    assert json.loads(json_dumps(h))["details"] == {"pid": "12", "workdir": "/w"}
    assert pickle.loads(pickle.dumps(h)) == h
    with pytest.raises(SpecError):
        SandboxHandle.from_json({**h.to_json(), "details": {"pid": 12}})


def test_a_live_sandbox_runs_commands_and_is_destroyed(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            sandbox = await port.sandbox(spec("live"))
            OUT["state"] = sandbox.state.value
            OUT["handle"] = type(sandbox.handle).__name__
            OUT["mapping"] = sandbox.handle.details["workdir"] == WORK
            r = await sandbox.run("echo hi; echo err >&2; exit 3")
            OUT["run"] = [r.stdout.decode(), r.stderr.decode(), r.exit_code]
            cat = await sandbox.exec(["cat"], stdin=PIPE)
            await cat.write(b"ping")
            await cat.close_stdin()
            OUT["exec"] = (await cat.output()).stdout.decode()
            OUT["suspended"] = (await sandbox.suspend()).state.value
            OUT["resumed"] = (await sandbox.resume()).state.value
            OUT["port_sees"] = port.handle(sandbox.session_id).state.value
            try:
                await sandbox
            except SandholdError as exc:
                OUT["again"] = "launched by this LiveSandbox already" in str(exc)
            OUT["destroyed"] = (await sandbox.destroy()).state.value
            try:
                async with port.sandbox(spec("ctx")) as box:
                    OUT["ctx"] = (await box.run("echo in")).stdout.decode()
                    raise KeyError("boom")
            except KeyError:
                pass
            OUT["ctx_after"] = port.handle("ctx").state.value
        """,
    )
    assert out["state"] == "warm" and out["handle"] == "SandboxHandle" and out["mapping"]
    assert out["run"] == ["hi\n", "err\n", 3]
    assert out["exec"] == "ping"
    assert (out["suspended"], out["resumed"], out["port_sees"]) == ("suspended", "warm", "warm")
    assert out["again"] is True and out["destroyed"] == "destroyed"
    assert out["ctx"] == "in\n" and out["ctx_after"] == "destroyed"


BLOCKING = """
with BlockingSandboxPort() as port:
    s = spec("b")
    OUT["explain"] = WORK in port.explain(s)
    h = port.launch(s)
    run = port.exec(h, ["sh", "-c", "echo one; echo two >&2; exit 4"])
    OUT["events"] = [e.type for e in run]
    cat = port.exec(h, ["cat"], stdin=BlockingSandboxPort.PIPE)
    cat.write(b"pong")
    cat.close_stdin()
    r = cat.output()
    OUT["cat"] = [r.stdout.decode(), r.exit_code]
    slow = port.exec(h, "sleep 30")
    slow.kill()
    OUT["killed"] = slow.wait().exit_code
    OUT["destroyed"] = port.destroy(h).state.value
print(json.dumps(OUT))
"""


def test_the_blocking_port_execs_and_explains(world: World) -> None:
    out = drive(world, BLOCKING, custom_run=True)
    assert out["explain"] is True
    assert out["events"][-1] == "exit" and {"stdout", "stderr"} <= set(out["events"])
    assert out["cat"] == ["pong", 0]
    assert out["killed"] == 137 and out["destroyed"] == "destroyed"


def test_the_documented_live_sandbox_example_runs(world: World) -> None:
    import re

    from test_port_docs import DOC

    section = DOC.read_text().split("## One sandbox as an object", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    script = world.mkfile("live.py", code)
    r = world.ident.run([world.ident.python, str(script)], cwd=world.work, env=world.env())
    assert r.returncode == 0, r.stderr
    # what each print's comment in the page says it prints
    said = [line.split("# ", 1)[1] for line in code.splitlines() if "print(" in line]
    assert r.stdout.splitlines() == said
    assert (world.work / "out.txt").read_text() == "made by a test\n"
