"""The server's records survive it; its sandboxes do not (issue 17), as root and as a user.

A restart keeps clients, workspaces, runs and execs; runs that were live are
``error`` with the reason and their checkouts are gone. SIGTERM, SIGINT and
even SIGKILL of the server leave no process of any run behind, native or
none, double-forked and ``setsid`` ones included.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from conftest import World
from serverkit import git_repo, run_cmd, served, start


def processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read().replace(b"\0", b" "):
                    found.append(int(pid))
        except OSError:
            pass
    return found


def gone(marker: str, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not processes_with(marker):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["term", "int", "kill"]
)
def test_stopping_the_server_leaves_no_process_of_any_run(world: World, sig: int) -> None:
    repo = git_repo(world, "repo")
    marker = f"77{os.getpid() % 1000}.{sig}"
    s = start(world)
    try:
        with s.client() as api:
            ws = api.post("/v1/workspaces", json={"name": "w", "repos": [str(repo)]}).json()
            runs = []
            for backend in ("native", "none"):
                r = api.post(
                    "/v1/runs",
                    json={
                        "workspace_id": ws["id"],
                        "mode": "chat",
                        "network": "deny",
                        "backend": backend,
                    },
                )
                assert r.status_code == 201, r.text
                runs.append(r.json())
                cmd = (
                    f"sleep {marker}1 & setsid sh -c 'sleep {marker}2 &'; "
                    f"(sleep {marker}3 &) ; sleep {marker}4"
                )
                assert (
                    api.post(f"/v1/runs/{r.json()['id']}/execs", json={"shell": cmd}).status_code
                    == 201
                )
            deadline = time.monotonic() + 10
            while len(processes_with(f"sleep {marker}")) < 8 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert len(processes_with(f"sleep {marker}")) >= 8
    finally:
        s.stop(sig)
    assert gone(f"sleep {marker}"), processes_with(f"sleep {marker}")
    if sig != signal.SIGKILL:
        assert "every sandbox is destroyed" in s.log

    # the next start: records kept, the live runs marked error, checkouts removed
    with served(world) as again, again.client() as api:
        assert api.get("/v1/workspaces").json()["items"][0]["id"] == ws["id"]
        for old in runs:
            rec = api.get(f"/v1/runs/{old['id']}").json()
            assert rec["state"] == "error" and "server stopped" in rec["error"], rec
            assert not os.path.exists(rec["worktree"])
            execs = api.get(f"/v1/runs/{old['id']}/execs").json()["items"]
            assert len(execs) == 1 and execs[0]["state"] == "exited"
        assert os.listdir(again.state / "runs") == []


def test_a_restart_keeps_every_record(world: World) -> None:
    repo = git_repo(world, "repo")
    with served(world) as s, s.client() as api:
        bob = s.add_client("bob").stdout.strip()
        ws = api.post("/v1/workspaces", json={"name": "w", "repos": [str(repo)]}).json()
        run = api.post(
            "/v1/runs", json={"workspace_id": ws["id"], "mode": "review", "network": "allow"}
        ).json()
        done = run_cmd(api, run["id"], "echo kept; exit 3")
        kept = api.delete(f"/v1/runs/{run['id']}?keep_worktree=true").json()
    with served(world) as s, s.client() as api, s.client(token=bob) as bob_api:
        assert api.get(f"/v1/workspaces/{ws['id']}").json() == ws
        assert api.get(f"/v1/runs/{run['id']}").json() == kept
        assert kept["state"] == "destroyed" and os.path.isdir(kept["worktree"])
        again = api.get(f"/v1/runs/{run['id']}/execs/{done['exec_id']}").json()
        assert again == done
        assert again["exit_code"] == 3 and again["stdout"] == "kept\n"
        assert bob_api.get("/v1/runs").json() == {"items": []}  # bob's token survives too
        assert bob_api.get(f"/v1/runs/{run['id']}").status_code == 404
