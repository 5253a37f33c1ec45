"""Hosted terminals over a real WebSocket, as root and as a user (issue 18).

Keystrokes echo, a resize reaches the program, ``exit`` gives the exit frame; a
native terminal cannot read ``~/.ssh`` and can write ``$HOME``; a native
request the host cannot serve is a 4xx that starts nothing; a wrong Origin, a
spent ticket and another client's terminal are refused; DELETE and SIGTERM
leave no process.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from conftest import World
from serverkit import Served, served
from test_server_lifecycle import gone, processes_with


def open_terminal(api: Any, **body: Any) -> dict[str, Any]:
    r = api.post(
        "/v1/terminals",
        json={"cols": 80, "rows": 24, "shell": ["/bin/bash", "--norc", "-i"], **body},
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


def attach(s: Served, api: Any, term_id: str, *, origin: str | None = None) -> ClientConnection:
    ticket = api.post(f"/v1/terminals/{term_id}/ticket").json()
    assert 0 < ticket["expires_in"] <= 30
    url = (
        s.url.replace("http://", "ws://") + f"/v1/terminals/{term_id}/ws?ticket={ticket['ticket']}"
    )
    return connect(url, origin=origin, open_timeout=10)  # type: ignore[arg-type]


def refused(url: str, **kw: Any) -> None:
    """The server refuses the WebSocket (at the handshake, or closes it at once)."""
    with (
        pytest.raises((InvalidStatus, ConnectionClosed)),
        connect(url, open_timeout=10, **kw) as ws,
    ):
        ws.recv(timeout=5)


def read_until(ws: ClientConnection, needle: str, timeout: float = 15) -> str:
    seen = ""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"never saw {needle!r} in {seen[-2000:]!r}")
        msg = ws.recv(timeout=left)
        seen += msg.decode("utf-8", "replace") if isinstance(msg, bytes) else f"\n<{msg}>\n"
    return seen


def test_a_none_terminal_echoes_resizes_and_exits(world: World) -> None:
    with served(world) as s, s.client() as api:
        term = open_terminal(api)
        assert term["backend"] == "none" and term["state"] == "running"
        assert [t["id"] for t in api.get("/v1/terminals").json()["items"]] == [term["id"]]
        with attach(s, api, term["id"], origin=s.url) as ws:
            ws.send(b"echo hi-$((6*7))\r")
            read_until(ws, "hi-42")
            ws.send(json.dumps({"type": "resize", "cols": 123, "rows": 45}))
            ws.send(b"stty size\r")
            read_until(ws, "45 123")
            ws.send(b"trap 'echo got-winch' WINCH; sleep 30 & wait\r")
            time.sleep(0.5)
            ws.send(json.dumps({"type": "resize", "cols": 100, "rows": 30}))
            read_until(ws, "got-winch")
            ws.send(b"exit 3\r")
            out = read_until(ws, '"type": "exit"')
            assert '"exit_code": 3' in out
        assert api.get(f"/v1/terminals/{term['id']}").json()["state"] == "exited"


def test_output_made_while_detached_is_replayed(world: World) -> None:
    with served(world) as s, s.client() as api:
        term = open_terminal(api)
        with attach(s, api, term["id"]) as ws:
            ws.send(b"sleep 1; echo made-$((1+1))-while-away\r")
        time.sleep(2.5)
        with attach(s, api, term["id"]) as ws:
            read_until(ws, "made-2-while-away")


def test_a_native_terminal_hides_secrets_and_writes_home(world: World) -> None:
    key = world.mkfile("home/.ssh/id_ed25519", "PRIVATE-KEY-MATERIAL\n", mode=0o600)
    world.mkfile("home/.aws/credentials", "AWS-SECRET\n", mode=0o600)
    with served(world) as s, s.client() as api:
        term = open_terminal(api, backend="native", cwd=str(world.work))
        assert term["backend"] == "native"
        with attach(s, api, term["id"]) as ws:
            ws.send(
                f"cat {key} ~/.aws/credentials; echo home > ~/written; echo cwd > "
                f"{world.work}/w2; echo x > /etc/x; echo done-$((2*3))\r".encode()
            )
            out = read_until(ws, "done-6")
            assert "PRIVATE-KEY-MATERIAL" not in out and "AWS-SECRET" not in out
        assert (world.home / "written").read_text() == "home\n"
        assert (world.work / "w2").read_text() == "cwd\n"
        assert not os.path.exists("/etc/x")
        api.delete(f"/v1/terminals/{term['id']}")


def test_native_on_a_host_without_it_is_a_4xx_that_starts_nothing(world: World) -> None:
    with served(world, "--bwrap", "/nonexistent/bwrap") as s, s.client() as api:
        before = set(processes_with("bash"))
        r = api.post("/v1/terminals", json={"cols": 80, "rows": 24, "backend": "native"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "backend_unavailable"
        assert "bubblewrap" in r.json()["error"]["message"]
        assert api.get("/v1/terminals").json() == {"items": []}
        assert set(processes_with("bash")) <= before
    with served(world, "--sandbox", "off") as s, s.client() as api:
        r = api.post("/v1/terminals", json={"cols": 80, "rows": 24, "backend": "native"})
        assert r.status_code == 400


def test_origin_tickets_and_other_clients_are_refused(world: World) -> None:
    with served(world) as s, s.client() as api:
        bob_token = s.add_client("bob").stdout.strip()
        term = open_terminal(api)
        base = s.url.replace("http://", "ws://") + f"/v1/terminals/{term['id']}/ws"
        port = s.url.rsplit(":", 1)[1]
        for origin in (
            "http://evil.example",
            f"http://evil.example:{port}",
            "null",
            f"https://127.0.0.1:{port}",
            f"http://127.0.0.1:{port}.evil",
        ):
            ticket = api.post(f"/v1/terminals/{term['id']}/ticket").json()["ticket"]
            refused(f"{base}?ticket={ticket}", origin=origin)
        ticket = api.post(f"/v1/terminals/{term['id']}/ticket").json()["ticket"]
        with connect(f"{base}?ticket={ticket}", open_timeout=10) as ws:
            ws.send(b"echo first-use\r")
            read_until(ws, "first-use")
        for bad in (
            f"{base}?ticket={ticket}",
            f"{base}?ticket=forged",
            base,
            f"{base}?token={s.token}",
        ):
            refused(bad)
        # a bearer token in Authorization (non-browser clients) works, bob's does not
        with connect(
            base, additional_headers={"authorization": f"Bearer {s.token}"}, open_timeout=10
        ) as ws:
            ws.send(b"echo by-header\r")
            read_until(ws, "by-header")
        with (
            pytest.raises((InvalidStatus, ConnectionClosed)),
            connect(
                base, additional_headers={"authorization": f"Bearer {bob_token}"}, open_timeout=10
            ) as ws,
        ):
            ws.recv(timeout=5)
        with s.client(token=bob_token) as bob:
            for method, path in (
                ("GET", f"/v1/terminals/{term['id']}"),
                ("DELETE", f"/v1/terminals/{term['id']}"),
                ("POST", f"/v1/terminals/{term['id']}/ticket"),
            ):
                r = bob.request(method, path)
                assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
            assert bob.get("/v1/terminals").json() == {"items": []}
        # a malformed control frame closes the stream and changes nothing
        with attach(s, api, term["id"]) as ws:
            ws.send('{"type": "resize", "cols": "wide", "rows": 1}')
            with pytest.raises(ConnectionClosed):
                for _ in range(50):
                    ws.recv(timeout=5)
        assert api.get(f"/v1/terminals/{term['id']}").json()["cols"] == 80


@pytest.mark.parametrize("backend", ["none", "native"])
def test_delete_and_sigterm_leave_no_process(world: World, backend: str) -> None:
    marker = f"66{os.getpid() % 1000}"
    with served(world) as s, s.client() as api:
        term = open_terminal(api, backend=backend, cwd=str(world.work))
        with attach(s, api, term["id"]) as ws:
            ws.send(
                f"sleep {marker}1 & setsid sh -c 'sleep {marker}2 &'; (sleep {marker}3 &); "
                f"echo started\r".encode()
            )
            read_until(ws, "started")
        deadline = time.monotonic() + 10
        while len(processes_with(f"sleep {marker}")) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(processes_with(f"sleep {marker}")) >= 3
        assert api.delete(f"/v1/terminals/{term['id']}").status_code == 200
        assert gone(f"sleep {marker}"), processes_with(f"sleep {marker}")
        assert api.get(f"/v1/terminals/{term['id']}").status_code == 404

        term = open_terminal(api, backend=backend, cwd=str(world.work))
        with attach(s, api, term["id"]) as ws:
            ws.send(f"setsid sh -c 'sleep {marker}4 &'; echo started\r".encode())
            read_until(ws, "started")
        time.sleep(0.5)
    assert gone(f"sleep {marker}"), processes_with(f"sleep {marker}")


def test_an_idle_terminal_ends(world: World) -> None:
    with served(world, "--terminal-idle", "1") as s, s.client() as api:
        term = open_terminal(api)
        deadline = time.monotonic() + 15
        while api.get(f"/v1/terminals/{term['id']}").json()["state"] != "exited":
            assert time.monotonic() < deadline, "the idle terminal never ended"
            time.sleep(0.2)


def test_many_open_terminals_do_not_starve_the_runs(world: World) -> None:
    """Each terminal once held a thread of the loop's default executor for its life:
    a handful of them left the port's freeze and thaw (which need one) waiting for
    ever. Ten terminals, then a run is suspended and resumed at once."""
    from serverkit import git_repo

    repo = git_repo(world, "repo")
    with served(world) as s, s.client() as api:
        api.timeout = httpx.Timeout(15)
        terms = [open_terminal(api) for _ in range(10)]
        ws = api.post("/v1/workspaces", json={"name": "w", "repos": [str(repo)]}).json()
        run = api.post(
            "/v1/runs", json={"workspace_id": ws["id"], "mode": "chat", "network": "deny"}
        ).json()
        assert api.post(f"/v1/runs/{run['id']}/suspend").json()["state"] == "suspended"
        assert api.post(f"/v1/runs/{run['id']}/resume").json()["state"] == "warm"
        for t in terms:
            assert api.delete(f"/v1/terminals/{t['id']}").status_code == 200
        for _ in range(65):
            r = api.post("/v1/terminals", json={"cols": 80, "rows": 24})
            if r.status_code != 201:
                break
        assert r.status_code == 409 and r.json()["error"]["code"] == "too_many_terminals"
