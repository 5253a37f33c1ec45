"""docs/recipes.md runs: each recipe's settings and ``.mcp.json`` are written out as
the page shows them, the server is started from the ``.mcp.json`` command, and the
test speaks MCP to it over stdio, as root and as an unprivileged user.

The packages are stand-ins of the same names served from a local registry (nothing
outside the machine is reachable); the test adds only that registry's address to
``allowedDomains`` and the variable that points npm or uv at it to
``env.passthrough``, and reads ``/home/me`` as the test's home."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, World
from test_package_caches import HOST, Registry, find_uv, npm_tarball, wheel

RECIPE = re.compile(r"<!-- recipe: (\S+) (\S+) -->\n```json\n(.*?)```", re.S)

NODE_SERVER = """\
const readline = require("readline");
const rl = readline.createInterface({input: process.stdin});
rl.on("line", (line) => {
  const msg = JSON.parse(line);
  const result = msg.method === "initialize"
    ? {protocolVersion: "2025-06-18", capabilities: {tools: {}},
       serverInfo: {name: "stand-in", version: "1.0.0"}, args: process.argv.slice(2)}
    : {tools: [{name: "read_file"}]};
  console.log(JSON.stringify({jsonrpc: "2.0", id: msg.id, result}));
});
"""

PYTHON_SERVER = """\
import json, sys

def main():
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["method"] == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "stand-in", "version": "1.0"}, "args": sys.argv[1:]}
        else:
            result = {"tools": [{"name": "fetch"}]}
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""

REQUESTS = (
    json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
    + "\n"
    + json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    + "\n"
)


def recipes() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for name, file, body in RECIPE.findall((REPO / "docs/recipes.md").read_text()):
        found.setdefault(name, {})[file] = json.loads(body)
    return found


def test_the_page_has_both_recipes() -> None:
    assert set(recipes()) == {"node", "python"}
    assert all(set(r) == {"settings.json", ".mcp.json"} for r in recipes().values())


def _start(
    world: World, recipe: dict[str, Any], registry: Registry, var: str, value: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    home = str(world.home)
    (server,) = recipe[".mcp.json"]["mcpServers"].values()
    assert server["command"] == "sandhold"
    args = [a.replace("/home/me", home) for a in server["args"]]
    settings = json.loads(json.dumps(recipe["settings.json"]))
    settings["network"]["allowedDomains"].append(HOST)
    settings.setdefault("env", {}).setdefault("passthrough", []).append(var)
    path = Path(args[args.index("-s") + 1])
    world.mkfile(str(path.relative_to(world.root)), json.dumps(settings))
    bindir = Path(find_uv() or "/nonexistent").parent
    env = world.env(
        PATH=f"{bindir}:/usr/local/bin:/usr/bin:/bin", TMPDIR=str(world.root), **{var: value}
    )
    argv = [world.ident.python, "-P", "-m", "sandhold", *args]
    return world.ident.run(argv, cwd=world.work, env=env, input=REQUESTS, timeout=120), args


def _check(r: subprocess.CompletedProcess[str], args: list[str], launcher: int) -> None:
    """The server answered both requests and got the arguments after its launcher's
    ``launcher`` words (``npx -y PKG``); sandhold said nothing (``-q``)."""
    assert r.returncode == 0, r.stderr
    assert "sandhold:" not in r.stderr, r.stderr
    first, second = (json.loads(line) for line in r.stdout.splitlines())
    assert first["result"]["serverInfo"]["name"] == "stand-in"
    assert first["result"]["args"] == args[args.index("--") + 1 + launcher :]
    assert second["id"] == 2 and second["result"]["tools"]


@pytest.mark.skipif(shutil.which("npx") is None, reason="npx is not installed")
def test_node_recipe(world: World) -> None:
    name = "@modelcontextprotocol/server-filesystem"
    world.mkdir("home/notes")
    with Registry({name: npm_tarball(name, NODE_SERVER)}, {}) as registry:
        for _ in range(2):
            r, args = _start(
                world, recipes()["node"], registry, "npm_config_registry", registry.url + "/"
            )
            _check(r, args, 3)
        assert len(registry.downloads) == 1  # the second start came from the cache


def test_python_recipe(world: World) -> None:
    if find_uv() is None:
        pytest.skip("uv is not installable here")
    project = "mcp-server-fetch"
    with Registry({}, {project: wheel(project, project, PYTHON_SERVER)}) as registry:
        seen = []
        for _ in range(2):
            r, args = _start(
                world, recipes()["python"], registry, "UV_INDEX_URL", registry.url + "/simple"
            )
            _check(r, args, 2)
            seen.append(len(registry.downloads))
        assert seen[0] >= 1 and seen[1] == seen[0], seen
