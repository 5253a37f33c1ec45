"""Hosted terminals over a real WebSocket, as root and as a user (issue 18).

Keystrokes echo, a resize reaches the program, ``exit`` gives the exit frame; a
native terminal cannot read ``~/.ssh`` and can write ``$HOME``; a native
request the host cannot serve is a 4xx that starts nothing; a wrong Origin, a
spent ticket and another client's terminal are refused; DELETE and SIGTERM
leave no process.
"""

from __future__ import annotations

import base64
import json
import os
import socket
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
            ws.send(b"sleep 0.5; echo made-$((1+1))-while-away\r")
        time.sleep(1.5)
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
        # the three sleeps themselves: an `sh -c 'sleep ...'` on its way names the
        # marker too, and counting it let the wait end before the last sleep ran
        deadline = time.monotonic() + 10
        while len(_sleeps(marker)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_sleeps(marker)) >= 3
        assert api.delete(f"/v1/terminals/{term['id']}").status_code == 200
        assert gone(f"sleep {marker}"), processes_with(f"sleep {marker}")
        assert api.get(f"/v1/terminals/{term['id']}").status_code == 404

        term = open_terminal(api, backend=backend, cwd=str(world.work))
        with attach(s, api, term["id"]) as ws:
            ws.send(f"setsid sh -c 'sleep {marker}4 &'; echo started\r".encode())
            read_until(ws, "started")
        time.sleep(0.5)
    assert gone(f"sleep {marker}"), processes_with(f"sleep {marker}")


def _sleeps(marker: str) -> list[int]:
    """The ``sleep`` processes (by argv[0]) whose arguments name ``marker``."""
    found = []
    for pid in processes_with(f"sleep {marker}"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"sleep\0"):
                    found.append(pid)
        except OSError:
            pass
    return found


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


def _server_rss_kib(s: Served) -> int:
    """RSS of the ``sandhold serve`` process of ``s`` (found by its state dir)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if b"serve" not in argv or str(s.state).encode() not in argv:
                continue
            with open(f"/proc/{pid}/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    raise AssertionError("no sandhold serve process found")


def _written() -> int:
    """Bytes written so far by the terminal's program (its /proc io)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if not f.read().startswith(b"yes\0"):
                    continue
            with open(f"/proc/{pid}/io") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))
        except (OSError, StopIteration):
            continue
    raise AssertionError("the terminal's program is not running")


def _silent_websocket(s: Served, path: str) -> socket.socket:
    """A WebSocket opened by hand that then reads nothing (a small receive buffer)."""
    host, port = s.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)  # byte by byte: nothing after the head is read
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def test_a_client_that_does_not_read_holds_the_program_not_the_servers_memory(
    world: World,
) -> None:
    # a terminal printing as fast as it can to a client that reads nothing: the server
    # keeps a bounded backlog and stops reading the PTY, so the program blocks, instead
    # of queueing its output in memory for ever
    with served(world) as s, s.client() as api:
        term = open_terminal(api, shell=["/bin/sh", "-c", "exec yes 0123456789abcdef"])
        ticket = api.post(f"/v1/terminals/{term['id']}/ticket").json()["ticket"]
        sock = _silent_websocket(s, f"/v1/terminals/{term['id']}/ws?ticket={ticket}")
        try:
            before = _server_rss_kib(s)
            time.sleep(2)
            first = _written()
            time.sleep(1)
            later = _written()
            grown = _server_rss_kib(s) - before
            assert later - first < 1024 * 1024, f"`yes` went on writing: {first} -> {later}"
            assert grown < 32 * 1024, f"the server grew by {grown} KiB for one silent client"
        finally:
            sock.close()
        assert api.delete(f"/v1/terminals/{term['id']}").status_code == 200


def test_frames_stay_under_a_mebibyte_and_the_exit_comes_after_the_output(
    world: World,
) -> None:
    with served(world) as s, s.client() as api:
        # it waits for a line, so that all its output is made while attached (output
        # made before that is the replay, bounded at 1 MiB)
        term = open_terminal(
            api,
            shell=[
                "/bin/sh",
                "-c",
                "stty -echo; read go; head -c 20000000 /dev/zero | tr '\\0' a; exit 3",
            ],
        )
        with attach(s, api, term["id"]) as ws:  # websockets refuses messages over 1 MiB
            # the client offers permessage-deflate (websockets does by default, so do
            # browsers); the server declines it: compressing a local terminal's output
            # costs its CPU and the stream's throughput, for nothing on a loopback link
            assert ws.response is not None
            assert "Sec-WebSocket-Extensions" in ws.request.headers  # type: ignore[union-attr]
            assert "Sec-WebSocket-Extensions" not in ws.response.headers
            ws.send(b"go\r")
            got, last = 0, None
            with pytest.raises(ConnectionClosed):
                while True:
                    msg = ws.recv(timeout=20)
                    if isinstance(msg, bytes):
                        assert last is None, "output after the exit frame"
                        got += msg.count(b"a")
                    else:
                        last = json.loads(msg)
        assert got == 20_000_000 and last == {"type": "exit", "exit_code": 3}
