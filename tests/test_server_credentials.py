"""A run given an API key it never sees (issue 19, through ``sandhold serve``), as root
and as a user.

The client sends srt's credentials block with each value; the run's sandbox sees a
placeholder; the server's proxy terminates TLS for the entry's hosts and the local
upstream (its own CA, trusted through ``--upstream-ca``) receives the real value,
while the same placeholder sent to another allowed host arrives unchanged. A block
that would make the server a deputy (a ``files`` entry, an entry without its value:
the server's own file or variable) or that does not fit the run (no network, a host
outside the allowlist) is a 400 that records nothing. The real value appears in no
answer, event, record or log of the server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import World
from serverkit import git_repo, run_cmd, served, sse
from test_server_runs import new_run, workspace
from tlsupstreams import REAL, serve_upstreams
from tlsupstreams import mark as _mark
from tlsupstreams import seen_since as _seen_since


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, object]]:
    with serve_upstreams() as up:
        yield up


def _block(**entry: Any) -> dict[str, Any]:
    return {
        "envVars": [
            {"name": "API_KEY", "mode": "mask", "value": REAL, "injectHosts": ["127.0.0.1"]} | entry
        ]
    }


def test_a_run_uses_a_key_it_never_holds(world: World, upstreams: dict[str, Any]) -> None:
    tls1, tls2 = upstreams["ports"]["tls1"], upstreams["ports"]["tls2"]
    repo = git_repo(world, "repo")
    with served(world, "--upstream-ca", upstreams["ca"]) as s, s.client() as api:
        ws = workspace(api, repo)
        run = new_run(
            api,
            ws,
            mode="chat",
            network="allow",
            egress_allowlist=["127.0.0.1", "127.0.0.2"],
            credentials=_block(),
        )
        mark = _mark(upstreams)
        out = run_cmd(
            api,
            run["id"],
            'echo "$API_KEY"; '
            f'curl -sS -m 10 -H "Authorization: Bearer $API_KEY" https://127.0.0.1:{tls1}/srv; '
            f'curl -sS -m 10 -H "Authorization: Bearer $API_KEY" https://127.0.0.2:{tls2}/other',
            # the upstreams are the host's loopback, which a sandbox reaches only through
            # the proxies (its own 127.0.0.1 is its namespace's)
            env={"NO_PROXY": "", "no_proxy": ""},
        )
        shown = out["stdout"].splitlines()
        assert shown[0].startswith("sandhold_placeholder_"), out
        assert shown[1:] == ["ok", "ok"], out["stderr"]
        got = {g["path"]: g for g in _seen_since(upstreams, mark)}
        assert got["/srv"]["auth"] == f"Bearer {REAL}"
        assert got["/other"]["auth"] == f"Bearer {shown[0]}"  # not an injection host

        # what would make the server a deputy, or does not fit the run: 400, nothing made
        before = api.get("/v1/runs").json()["items"]
        bad = [
            ("deny", ["127.0.0.1"], _block()),
            ("allow", ["127.0.0.1"], {"files": [{"path": "/etc/hostname", "mode": "mask"}]}),
            ("allow", ["127.0.0.1"], {"envVars": [{"name": "HOME", "mode": "mask"}]}),
            ("allow", ["127.0.0.2"], _block()),  # its host is not in the allowlist
            ("allow", ["127.0.0.1"], _block(mode="sometimes")),
            ("allow", ["127.0.0.1"], ["not", "an", "object"]),
        ]
        for network, allow, creds in bad:
            body: dict[str, Any] = {"workspace_id": ws, "mode": "chat", "network": network}
            if network != "deny":
                body["egress_allowlist"] = allow
            body["credentials"] = creds
            r = api.post("/v1/runs", json=body)
            assert r.status_code == 400, (creds, r.text)
            assert r.json()["error"]["code"] in ("invalid_credentials", "invalid_body"), r.text
            assert REAL not in r.text
        assert api.get("/v1/runs").json()["items"] == before

        # the value is in no answer, event, record or log
        seen = json.dumps(api.get(f"/v1/runs/{run['id']}").json())
        seen += json.dumps(api.get("/v1/runs").json())
        seen += json.dumps(sse(api, run["id"], until=lambda e: e["type"] == "exit"))
        assert api.delete(f"/v1/runs/{run['id']}").status_code == 200
    assert REAL not in seen
    for path in s.state.rglob("*"):
        if path.is_file():
            assert REAL.encode() not in path.read_bytes(), path
    assert REAL not in s.log and "every sandbox is destroyed" in s.log
