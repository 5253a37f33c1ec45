"""Schema-based fuzzing of every route of a real ``sandhold serve`` (schemathesis).

The served OpenAPI document drives the cases. Path parameters are sometimes
replaced by ids that exist (a workspace, a live run, its exec), so the fuzzer
reaches past the 404s. Verdicts: no 5xx, the server still answers, and after
it stops no sandbox it made is left running.
"""

from __future__ import annotations

import os

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from conftest import World
from serverkit import git_repo, served, wait_exec
from test_server_lifecycle import gone


@pytest.mark.parametrize("ident", ["root", "user"], indirect=True)
def test_no_route_gives_a_5xx_or_leaks_a_sandbox(world: World) -> None:
    repo = git_repo(world, "repo")
    marker = f"fuzz-{os.getpid()}"
    with served(world) as s, s.client() as api:
        schema = schemathesis.openapi.from_url(f"{s.url}/openapi.json")
        ws = api.post("/v1/workspaces", json={"name": "w", "repos": [str(repo)]}).json()
        run = api.post(
            "/v1/runs", json={"workspace_id": ws["id"], "mode": "review", "network": "deny"}
        ).json()
        ex = api.post(f"/v1/runs/{run['id']}/execs", json={"shell": "echo fuzz"}).json()
        wait_exec(api, run["id"], ex["exec_id"])
        # a live process the fuzzer's run must not lose (its exec id is not offered: a
        # long poll on it would wait for as long as the case asks)
        api.post(f"/v1/runs/{run['id']}/execs", json={"shell": f"sleep 600 # {marker}"})
        real = {"ws_id": ws["id"], "run_id": run["id"], "exec_id": ex["exec_id"]}
        operations = [op.ok() for op in schema.get_all_operations()]
        assert len(operations) >= 15
        headers = {"authorization": f"Bearer {s.token}"}

        @settings(
            max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @hypothesis.given(st.data())
        def fuzz(data: st.DataObject) -> None:
            op = data.draw(st.sampled_from(operations))
            case = data.draw(op.as_strategy())
            # a live run's event stream never ends: only its unknown ids are fuzzed
            follows = case.path.endswith("/events")
            for name in list(case.path_parameters or {}):
                if name in real and not follows and data.draw(st.booleans()):
                    case.path_parameters[name] = real[name]
            if case.method.upper() == "DELETE" and case.path_parameters.get("run_id") == run["id"]:
                return  # keep the live run for the rest of the cases
            response = case.call(base_url=s.url, headers=headers, timeout=30)
            case.validate_response(response, checks=[not_a_server_error])

        fuzz()
        assert api.get("/healthz").json() == {"status": "ok"}
        assert api.get(f"/v1/runs/{run['id']}").json()["state"] in ("active", "warm", "suspended")
        live = [
            r
            for r in api.get("/v1/runs").json()["items"]
            if r["state"] not in ("destroyed", "error")
        ]
    assert gone(marker)
    with served(world) as s, s.client() as api:
        states = {r["id"]: r["state"] for r in api.get("/v1/runs").json()["items"]}
        assert all(states[r["id"]] == "error" for r in live)
        assert os.listdir(s.state / "runs") == []
