"""docs/api.md's example runs as written and prints what the page says, as root and as a user."""

from __future__ import annotations

import re

from conftest import REPO, World

DOC = REPO / "docs" / "api.md"


def blocks() -> tuple[str, str]:
    text = DOC.read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    output = re.findall(r"Its output:\n\n```\n(.*?)```", text, re.S)[0]
    return code, output


def test_api_example_runs(world: World) -> None:
    code, expected = blocks()
    script = world.mkfile("example.py", code)
    r = world.ident.run([world.ident.python, str(script)], cwd=world.work, env=world.env())
    assert r.returncode == 0, r.stderr
    want = expected.replace("/the/current/directory", str(world.work))
    want = want.replace("/your/home", str(world.home))
    assert r.stdout == want


def test_agent_protocol_doc_names_every_frame_kind() -> None:
    from sandhold.agent import protocol as P

    text = (REPO / "docs" / "agent-protocol.md").read_text()
    for kind, name in P.KIND_NAMES.items():
        assert f"`{name}`" in text and f"0x{kind:02x}" in text, name
