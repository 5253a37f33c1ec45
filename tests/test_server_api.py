"""``sandhold serve`` over real HTTP, as root and as an unprivileged user (issue 17).

Each test starts a real server as the test's identity (``serverkit``), with its
own state dir, and talks to it with httpx: boot lines, auth across clients,
the Host check, bad bodies, and the lifecycle of workspaces and runs.
"""

from __future__ import annotations

import json
import os
import socket
import stat

import pytest

from conftest import World
from serverkit import git_repo, run_cmd, served, start

BOOT_LINES = (
    r"agent sandbox ON \(.+\)",
    r"no OS-native agent sandbox on this host \(.+\)",
    r"agent sandbox DISABLED by --sandbox off",
)


def boot_lines(log: str) -> list[str]:
    import re

    return [line for line in log.splitlines() if any(re.search(p, line) for p in BOOT_LINES)]


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ((), {}, "agent sandbox ON (bubblewrap"),
        (("--sandbox", "off"), {}, "agent sandbox DISABLED by --sandbox off"),
        ((), {"SANDHOLD_SANDBOX": "off"}, "agent sandbox DISABLED by --sandbox off"),
        (("--bwrap", "/nonexistent/bwrap"), {}, "no OS-native agent sandbox on this host ("),
    ],
    ids=["on", "off-flag", "off-env", "no-native"],
)
def test_the_boot_line_is_exactly_one_of_three(
    world: World, args: tuple[str, ...], env: dict[str, str], expected: str
) -> None:
    with served(world, *args, env=world.env(**env)) as s:
        lines = boot_lines(s.log)
        assert len(lines) == 1 and expected in lines[0], s.log
        with s.client() as api:
            host = api.get("/v1/host").json()
        off = "off" in json.dumps(env) or "off" in args
        assert host["sandbox"] == ("off" if off else "on")
        assert set(host["backends"]) == {"native", "microvm", "none"}
        assert host["backends"]["native"]["available"] is ("--bwrap" not in args)
        assert host["backends"]["microvm"]["available"] is False
        for b in host["backends"].values():
            assert set(b) == {"available", "note", "hint"}


def test_healthz_openapi_tokens_and_clients(world: World) -> None:
    repo = git_repo(world, "repo")
    with served(world) as s:
        token_file = s.state / "token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert token_file.stat().st_uid == world.ident.uid
        db = s.state / "state.db"
        assert stat.S_IMODE(db.stat().st_mode) == 0o600
        assert s.token.encode() not in db.read_bytes()  # stored hashed
        with s.client(token="") as anon:
            r = anon.get("/healthz")
            assert r.status_code == 200 and r.json() == {"status": "ok"}
            assert anon.get("/openapi.json").status_code == 200
            assert "/v1/runs" in anon.get("/openapi.json").json()["paths"]
            for path in ("/v1/host", "/v1/workspaces", "/v1/runs"):
                r = anon.get(path)
                assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        with s.client(token="shd_wrong") as wrong:
            assert wrong.get("/v1/runs").status_code == 401
        with s.client(token=s.token + "x") as wrong:
            assert wrong.get("/v1/runs").status_code == 401

        added = s.add_client("bob")
        assert added.returncode == 0, added.stderr
        bob_token = added.stdout.strip()
        assert added.stdout == bob_token + "\n" and bob_token != s.token
        again = s.add_client("bob")
        assert again.returncode == 2 and "bob" in again.stderr and again.stdout == ""

        with s.client() as alice, s.client(token=bob_token) as bob:
            ws = alice.post("/v1/workspaces", json={"name": "a", "repos": [str(repo)]}).json()
            run = alice.post(
                "/v1/runs", json={"workspace_id": ws["id"], "mode": "chat", "network": "deny"}
            ).json()
            done = run_cmd(alice, run["id"], "echo secret-output")
            assert done["stdout"] == "secret-output\n"

            # bob: a new client, accepted at once; sees nothing of alice's
            assert bob.get("/v1/workspaces").json() == {"items": []}
            assert bob.get("/v1/runs").json() == {"items": []}
            never = {
                "GET": [
                    "/v1/workspaces/ws_0000",
                    "/v1/runs/run_0000",
                    "/v1/runs/run_0000/execs/1",
                    "/v1/runs/run_0000/events",
                ],
            }
            theirs = [
                ("GET", f"/v1/workspaces/{ws['id']}", None),
                ("DELETE", f"/v1/workspaces/{ws['id']}", None),
                ("GET", f"/v1/runs/{run['id']}", None),
                ("GET", f"/v1/runs/{run['id']}/execs/1", None),
                ("GET", f"/v1/runs/{run['id']}/execs", None),
                ("GET", f"/v1/runs/{run['id']}/events", None),
                ("POST", f"/v1/runs/{run['id']}/execs", {"shell": "echo pwned > x"}),
                ("POST", f"/v1/runs/{run['id']}/suspend", None),
                ("POST", f"/v1/runs/{run['id']}/asks/ask_1", {"decision": "allow"}),
                ("DELETE", f"/v1/runs/{run['id']}", None),
                ("POST", "/v1/runs", {"workspace_id": ws["id"], "mode": "chat", "network": "deny"}),
            ]
            codes = set()
            for method, path, body in theirs:
                r = bob.request(method, path, json=body)
                assert r.status_code == 404, (method, path, r.text)
                codes.add(r.json()["error"]["code"])
            for path in never["GET"]:
                r = bob.get(path)
                assert r.status_code == 404
                codes.add(r.json()["error"]["code"])
            assert codes == {"not_found"}
            # alice's things are untouched by bob's attempts
            assert alice.get(f"/v1/runs/{run['id']}").json()["state"] == "warm"
            assert len(alice.get(f"/v1/runs/{run['id']}/execs").json()["items"]) == 1
            assert alice.delete(f"/v1/runs/{run['id']}").json()["state"] == "destroyed"


def test_host_header_check_and_listeners(world: World) -> None:
    sock = world.root / "s.sock"
    with served(world, "--listen", "127.0.0.1:0", "--unix", str(sock)) as s:
        port = s.url.rsplit(":", 1)[1]
        with s.client() as api:
            for good in (
                f"127.0.0.1:{port}",
                f"localhost:{port}",
                f"[::1]:{port}",
                f"LOCALHOST:{port}",
            ):
                assert api.get("/v1/host", headers={"host": good}).status_code == 200, good
            for bad in (
                "evil.example",
                f"evil.example:{port}",
                "127.0.0.1",
                f"127.0.0.1:{port}.",
                f"127.0.0.1:{int(port) + 1}",
                f"localhost.:{port}",
                f"127.1:{port}",
                f"[::ffff:127.0.0.1]:{port}",
                "",
            ):
                r = api.get("/healthz", headers={"host": bad})
                assert r.status_code == 403, bad
                assert r.json()["error"]["code"] == "host_not_allowed"
        assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
        s.unix, saved = str(sock), s.url
        s.url = ""
        with s.client() as api:  # any Host passes over the unix socket
            assert api.get("/v1/host", headers={"host": "evil.example"}).status_code == 200
        s.url = saved

    # --unix alone opens no TCP port
    with served(world, "--unix", str(sock)) as s:
        assert "listening on http" not in s.log
        pid = s.proc.pid
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        tcp_listening = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                for line in f.readlines()[1:]:
                    parts = line.split()
                    if parts[3] == "0A":
                        tcp_listening.add(f"socket:[{parts[9]}]")
        assert not inodes & tcp_listening

    # a non-loopback address needs --allow-remote
    bad = world.sandhold("serve", "--state-dir", str(world.root / "state"), "--listen", "0.0.0.0:0")
    assert bad.returncode == 2 and "--allow-remote" in bad.stderr


def test_bad_bodies_get_a_4xx_and_change_nothing(world: World) -> None:
    repo = git_repo(world, "repo")
    other = world.mkdir("plain")
    world.symlink("link", str(repo))
    worktree_file = world.mkdir("wt")
    (worktree_file / ".git").write_text("gitdir: /elsewhere\n")
    with served(world, "--sandbox", "off") as s, s.client() as api:
        ws = api.post("/v1/workspaces", json={"name": "a", "repos": [str(repo)]}).json()
        before = (
            api.get("/v1/workspaces").json(),
            api.get("/v1/runs").json(),
            sorted(os.listdir(s.state / "runs")),
        )
        run = {"workspace_id": ws["id"], "mode": "chat", "network": "deny"}
        cases = [
            ("/v1/workspaces", {"name": "x", "repos": []}),
            ("/v1/workspaces", {"name": "x", "repos": ["relative/path"]}),
            ("/v1/workspaces", {"name": "x", "repos": [f"{repo}/../repo"]}),
            ("/v1/workspaces", {"name": "x", "repos": [f"{repo}/"]}),
            ("/v1/workspaces", {"name": "x", "repos": [str(world.root / "link")]}),
            ("/v1/workspaces", {"name": "x", "repos": [str(other)]}),
            ("/v1/workspaces", {"name": "x", "repos": [str(worktree_file)]}),
            ("/v1/workspaces", {"name": "x", "repos": [str(world.root / "missing")]}),
            ("/v1/workspaces", {"name": "x", "repos": [str(repo), str(repo)]}),
            ("/v1/workspaces", {"name": "x", "repos": [str(s.state)]}),
            ("/v1/workspaces", {"name": 5, "repos": [str(repo)]}),
            ("/v1/workspaces", {"name": "x", "repos": [str(repo)], "extra": 1}),
            ("/v1/workspaces", {"name": "x", "repos": str(repo)}),
            ("/v1/runs", {**run, "mode": "yolo"}),
            ("/v1/runs", {**run, "mode": 1}),
            ("/v1/runs", {k: v for k, v in run.items() if k != "mode"}),
            ("/v1/runs", {k: v for k, v in run.items() if k != "network"}),
            ("/v1/runs", {**run, "network": "deny", "egress_allowlist": ["example.com"]}),
            ("/v1/runs", {**run, "mode": "review", "push": "allow"}),
            ("/v1/runs", {**run, "backend": "microvm"}),
            ("/v1/runs", {**run, "backend": "native"}),  # the switch is off
            ("/v1/runs", {**run, "repo": str(other)}),
            ("/v1/runs", {**run, "unknown": True}),
            ("/v1/runs", {**run, "ask_timeout": -1}),
            ("/v1/runs", {**run, "ask_timeout": "60"}),
            ("/v1/runs", {**run, "egress_allowlist": "example.com"}),
            ("/v1/runs", [run]),
            ("/v1/runs", None),
        ]
        for path, body in cases:
            r = api.post(path, content=json.dumps(body))
            assert 400 <= r.status_code < 500, (path, body, r.status_code, r.text)
            err = r.json()["error"]
            assert err["code"] and err["message"], r.text
        for raw in (b"{", b"\xff\xfe", b'{"name": "x", "repos": ["/a"]}{}', b"[]" * 10):
            r = api.post("/v1/workspaces", content=raw)
            assert 400 <= r.status_code < 500, raw
        huge = b'{"name": "' + b"x" * (2 * 1024 * 1024) + b'", "repos": []}'
        r = api.post("/v1/workspaces", content=huge)
        assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

        def chunks():  # no Content-Length: counted as it streams
            for _ in range(40):
                yield b"x" * 65536

        r = api.post("/v1/workspaces", content=chunks())
        assert r.status_code == 413
        after = (
            api.get("/v1/workspaces").json(),
            api.get("/v1/runs").json(),
            sorted(os.listdir(s.state / "runs")),
        )
        assert after == before

        # bad exec bodies on a live run change nothing either
        live = api.post("/v1/runs", json={**run, "backend": "none"}).json()
        for body in (
            {},
            {"argv": []},
            {"argv": "ls"},
            {"shell": "ls", "argv": ["ls"]},
            {"shell": "ls", "cwd": "/etc"},
            {"shell": "ls", "timeout": 0},
            {"shell": "ls", "env": {"A": 1}},
            {"argv": ["a\u0000b"]},
            {"shell": "ls", "stdin": 5},
            {"shell": "ls", "bogus": 1},
        ):
            r = api.post(f"/v1/runs/{live['id']}/execs", json=body)
            assert 400 <= r.status_code < 500, (body, r.text)
        # the exec route's fast path takes only a JSON body and a plain wait; the rest
        # is FastAPI's to refuse, the same way
        execs = f"/v1/runs/{live['id']}/execs"
        good = json.dumps({"argv": ["touch", "never"]})
        for headers, params in (
            ({"content-type": "text/plain"}, {}),
            ({"content-type": "application/json"}, {"wait": "60.5"}),
            ({"content-type": "application/json"}, {"wait": "61"}),
            ({"content-type": "application/json"}, {"wait": "nan"}),
            ({"content-type": "application/json", "authorization": "Bearer nope"}, {}),
        ):
            r = api.post(execs, content=good, headers=headers, params=params)
            assert 400 <= r.status_code < 500, (headers, params, r.status_code, r.text)
            assert r.json()["error"]["code"], r.text
        for raw in (b'{"argv": ["touch", "never"]} x', b'{"argv": ["touch", "never"], "argv": 1}'):
            r = api.post(execs, content=raw, headers={"content-type": "application/json"})
            assert 400 <= r.status_code < 500, (raw, r.text)
        assert api.get(f"/v1/runs/{live['id']}/execs").json() == {"items": []}
        r = api.get(f"/v1/runs/{live['id']}/events", headers={"last-event-id": "x"})
        assert r.status_code == 400
        api.delete(f"/v1/runs/{live['id']}")


def test_workspace_delete_waits_for_its_runs(world: World) -> None:
    repo = git_repo(world, "repo")
    with served(world) as s, s.client() as api:
        ws = api.post("/v1/workspaces", json={"name": "a", "repos": [str(repo)]}).json()
        run = api.post(
            "/v1/runs", json={"workspace_id": ws["id"], "mode": "chat", "network": "deny"}
        ).json()
        r = api.delete(f"/v1/workspaces/{ws['id']}")
        assert r.status_code == 409 and r.json()["error"]["code"] == "workspace_busy"
        assert api.delete(f"/v1/runs/{run['id']}").status_code == 200
        assert api.delete(f"/v1/workspaces/{ws['id']}").status_code == 200
        assert api.get(f"/v1/workspaces/{ws['id']}").status_code == 404
        assert api.get(f"/v1/runs/{run['id']}").json()["state"] == "destroyed"


def test_the_server_refuses_a_port_in_use(world: World) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    s = start(world, "--listen", f"127.0.0.1:{port}", wait=False)
    assert s.proc.wait(30) == 2
    busy.close()
