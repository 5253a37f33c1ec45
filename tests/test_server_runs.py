"""Runs of ``sandhold serve``: what dispatch gives them, as root and as a user (issue 17).

A ``chat`` run commits in its own checkout but cannot touch the registered
checkout (files, refs, hooks, config) by the routes the filesystem tests try;
a ``review`` run cannot write; a ``deny`` run has no network; ``ask`` waits for
an answer; events resume with ``Last-Event-ID``; the command policy refuses
before anything runs. Verdicts are taken on the host.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import World
from localnet import echo_server, mapped_names
from serverkit import git_repo, run_cmd, served, sse, tree_digest, wait_exec

MARK = "# sandhold-server-tests"
NAMES = ("allowed.server.test", "asked.server.test", "asked2.server.test", "late.server.test")


@pytest.fixture(scope="session")
def upstream() -> Iterator[int]:
    with mapped_names(NAMES, MARK), echo_server() as port:
        yield port


def new_run(api: httpx.Client, ws: str, **body: Any) -> dict[str, Any]:
    r = api.post("/v1/runs", json={"workspace_id": ws, **body})
    assert r.status_code == 201, r.text
    out = dict(r.json())
    assert out["state"] == "warm"
    return out


def workspace(api: httpx.Client, *repos: Path) -> str:
    r = api.post("/v1/workspaces", json={"name": "w", "repos": [str(p) for p in repos]})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


GIT = "git -c user.email=t@t -c user.name=t"


def test_a_chat_run_commits_in_its_checkout_and_cannot_touch_the_registered_one(
    world: World,
) -> None:
    repo = git_repo(world, "repo")
    (repo / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    os.chmod(repo / ".git" / "hooks" / "pre-commit", 0o755)
    world.ident.chown(repo / ".git" / "hooks" / "pre-commit")
    other = git_repo(world, "other")
    before = tree_digest(repo), tree_digest(other)
    with served(world) as s, s.client() as api:
        ws = workspace(api, repo, other)
        run = new_run(api, ws, mode="chat", network="deny")
        assert run["backend"] == "native" and run["repo"] == str(repo)
        checkout = run["worktree"]
        assert checkout.startswith(str(s.state)) and os.path.isdir(checkout)
        done = run_cmd(
            api,
            run["id"],
            f"echo new > file && git add file && {GIT} commit -qm in-run && git log --format=%s",
        )
        assert done["exit_code"] == 0, done
        assert done["stdout"].splitlines()[0] == "in-run"
        r, g = str(repo), f"{repo}/.git"
        attacks = [
            f"echo x > {r}/README",
            f"echo x >> {r}/new-file",
            f"echo '[core]' >> {g}/config",
            f"printf '#!/bin/sh\\necho pwned\\n' > {g}/hooks/post-checkout",
            f"echo x > {g}/hooks/pre-commit",
            f"echo 0000000000000000000000000000000000000000 > {g}/refs/heads/main",
            f"git -C {r} update-ref refs/heads/evil HEAD",
            f"{GIT} -C {r} commit --allow-empty -qm evil",
            f"git -C {r} config core.fsmonitor /tmp/x",
            f"mv {g}/config {g}/config.old",
            f"rm -rf {g}/objects",
            f"ln -s /tmp {r}/planted",
            f"ln {g}/config ./hardlink && echo x >> ./hardlink",
            f"ln -s {g}/config ./sym && echo x >> ./sym",
            f"echo x > /proc/self/root{g}/HEAD",
            f"cd {r} && echo x > README",
            f"python3 -c \"import os; os.rename('{r}/README', '{r}/R2')\"",
            f"unshare -Ur sh -c 'echo x > {r}/README'",
            f"echo x > {other}/README",
            f"git --git-dir={g} --work-tree={r} commit --allow-empty -qm evil",
        ]
        for attack in attacks:
            out = run_cmd(api, run["id"], attack)
            assert out["state"] == "exited"
        assert (tree_digest(repo), tree_digest(other)) == before
        log = world.ident.run(
            ["git", "-C", checkout, "log", "--format=%s", "-1"], cwd=world.root, env=world.env()
        )
        assert log.stdout.strip() == "in-run"  # the run's work is on the host, in its checkout
        api.delete(f"/v1/runs/{run['id']}?keep_worktree=true")
        assert os.path.isdir(checkout)


def test_push_needs_push_allow_and_still_cannot_write_the_registered_repo(world: World) -> None:
    repo = git_repo(world, "repo")
    before = tree_digest(repo)
    with served(world) as s, s.client() as api:
        ws = workspace(api, repo)
        denied = new_run(api, ws, mode="chat", network="deny")
        for cmd in (
            {"shell": "git push origin HEAD"},
            {"argv": ["git", "push"]},
            {"shell": "true && /usr/bin/git -C . push origin main"},
        ):
            r = api.post(f"/v1/runs/{denied['id']}/execs", json=cmd)
            assert r.status_code == 403, cmd
            assert r.json()["error"]["code"] == "command_policy"
            assert "push" in r.json()["error"]["message"]
        assert api.get(f"/v1/runs/{denied['id']}/execs").json() == {"items": []}  # nothing ran
        allowed = new_run(api, ws, mode="chat", network="deny", push="allow")
        out = run_cmd(
            api, allowed["id"], f"{GIT} commit --allow-empty -qm x && git push origin HEAD:main"
        )
        assert out["exit_code"] != 0  # the registered repo is read-only to the run
        assert tree_digest(repo) == before


def test_a_review_run_cannot_write_anything(world: World) -> None:
    repo = git_repo(world, "repo")
    with served(world) as s, s.client() as api:
        ws = workspace(api, repo)
        for mode in ("review", "plan", "orchestrate"):
            run = new_run(api, ws, mode=mode, network="deny")
            out = run_cmd(api, run["id"], "echo x > new; echo x >> README; git status --short")
            assert "Read-only file system" in out["stderr"], out
            assert not os.path.exists(os.path.join(run["worktree"], "new"))
            r = api.post(f"/v1/runs/{run['id']}/execs", json={"shell": "git push"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "command_policy"
            events = sse(api, run["id"], until=lambda e: e["type"] == "exit")
            violations = [e for _, e in events if e["type"] == "violation"]
            assert violations and all(
                set(v["violation"]) == {"action", "target", "rule", "raw"} for v in violations
            )
            api.delete(f"/v1/runs/{run['id']}")


def test_a_deny_run_has_no_network(world: World, upstream: int) -> None:
    repo = git_repo(world, "repo")
    with served(world) as s, s.client() as api:
        ws = workspace(api, repo)
        run = new_run(api, ws, mode="chat", network="deny")
        out = run_cmd(
            api,
            run["id"],
            f"curl -s -o /dev/null -w '%{{http_code}}' http://allowed.server.test:{upstream}/; "
            f"echo; curl -s --noproxy '*' -m 3 http://127.0.0.1:{upstream}/ || echo direct-failed",
        )
        lines = out["stdout"].split()
        assert lines[0] == "403" and "direct-failed" in lines
        events = sse(api, run["id"], until=lambda e: e["type"] == "exit")
        net = [e["violation"] for _, e in events if e["type"] == "violation"]
        assert any(
            v["action"] == "network-outbound" and "allowed.server.test" in v["target"] for v in net
        ), net


def test_an_allow_run_reaches_its_allowlist_only(world: World, upstream: int) -> None:
    repo = git_repo(world, "repo")
    with served(world) as s, s.client() as api:
        ws = workspace(api, repo)
        run = new_run(
            api,
            ws,
            mode="chat",
            network="allow",
            egress_allowlist=["allowed.server.test", "127.0.0.1"],
        )
        out = run_cmd(
            api,
            run["id"],
            f"curl -s http://allowed.server.test:{upstream}/; "
            f"curl -s -o /dev/null -w '%{{http_code}}' http://asked.server.test:{upstream}/",
        )
        assert out["stdout"] == f"hello from allowed.server.test:{upstream}\n403", out


def _answer_when_asked(
    api: httpx.Client,
    run_id: str,
    host: str,
    decision: str | None,
    seen: list,
    *,
    remember: bool = False,
) -> threading.Thread:
    def asked(e: dict[str, Any]) -> bool:
        return e["type"] == "ask" and e["host"] == host

    def go() -> None:
        for _, ev in sse(api, run_id, until=asked, timeout=60):
            if asked(ev):
                seen.append(ev)
                if decision is not None:
                    r = api.post(
                        f"/v1/runs/{run_id}/asks/{ev['ask_id']}",
                        json={"decision": decision, "remember": remember},
                    )
                    seen.append(r.status_code)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_ask_allow_deny_timeout_and_remember(world: World, upstream: int) -> None:
    repo = git_repo(world, "repo")
    with served(world) as s, s.client() as api, s.client() as api2:
        ws = workspace(api, repo)
        run = new_run(
            api, ws, mode="chat", network="ask", egress_allowlist=["127.0.0.1"], ask_timeout=3
        )
        curl = f"curl -s -m 20 -o /dev/null -w '%{{http_code}}' http://HOST:{upstream}/"

        seen: list = []
        t = _answer_when_asked(api2, run["id"], "asked.server.test", "allow", seen, remember=True)
        out = run_cmd(api, run["id"], curl.replace("HOST", "asked.server.test"))
        t.join(30)
        assert out["stdout"] == "200", out
        ask = seen[0]
        assert ask["host"] == "asked.server.test" and ask["port"] == upstream
        assert ask["exec_id"] is None and ask["backend"] == "native" and seen[1] == 200
        # remembered: no second ask for the same host:port
        start = time.monotonic()
        assert run_cmd(api, run["id"], curl.replace("HOST", "asked.server.test"))["stdout"] == "200"
        assert time.monotonic() - start < 2.5
        # a second answer to the same ask: 409; an unknown ask: 404
        r = api.post(f"/v1/runs/{run['id']}/asks/{ask['ask_id']}", json={"decision": "deny"})
        assert r.status_code == 409
        r = api.post(f"/v1/runs/{run['id']}/asks/ask_nope", json={"decision": "deny"})
        assert r.status_code == 404

        seen = []
        t = _answer_when_asked(api2, run["id"], "asked2.server.test", "deny", seen)
        out = run_cmd(api, run["id"], curl.replace("HOST", "asked2.server.test"))
        t.join(30)
        assert out["stdout"] == "403" and seen[1] == 200

        seen = []
        t = _answer_when_asked(api2, run["id"], "late.server.test", None, seen)
        start = time.monotonic()
        out = run_cmd(api, run["id"], curl.replace("HOST", "late.server.test"))
        t.join(30)
        assert out["stdout"] == "403" and 2.5 < time.monotonic() - start < 15
        r = api.post(f"/v1/runs/{run['id']}/asks/{seen[0]['ask_id']}", json={"decision": "allow"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "ask_closed"

        # the asks are part of the run's history like any other event
        history = sse(api, run["id"], until=lambda e: e["type"] == "ask_expired")
        kinds = [e["type"] for _, e in history]
        assert kinds.count("ask") == 3 and kinds.count("ask_answered") == 2
        assert kinds[-1] == "ask_expired"


def test_events_resume_with_last_event_id(world: World) -> None:
    repo = git_repo(world, "repo")
    with served(world) as s, s.client() as api:
        ws = workspace(api, repo)
        run = new_run(api, ws, mode="chat", network="deny")
        for i in range(3):
            run_cmd(api, run["id"], f"echo line-{i}; echo err-{i} >&2")
        full = sse(api, run["id"], until=lambda e: e["type"] == "exit" and e["exec_id"] == 3)
        ids = [i for i, _ in full]
        assert ids == list(range(1, len(ids) + 1))  # 1, 2, … per run
        assert [e["type"] for _, e in full[:2]] == ["starting", "ready"]
        assert all(e["exec_id"] is None for _, e in full[:2])
        for cut in (1, len(full) // 2, len(full) - 1):
            tail = sse(
                api, run["id"], last=cut, until=lambda e: e["type"] == "exit" and e["exec_id"] == 3
            )
            assert tail == full[cut:]
        texts = "".join(e.get("data", "") for _, e in full if e["type"] == "stdout")
        assert texts == "line-0\nline-1\nline-2\n"
        # new events follow live after the replay
        got: list = []

        def follow() -> None:
            got.extend(sse(api, run["id"], last=ids[-1], until=lambda e: e["type"] == "exit"))

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        time.sleep(0.5)
        run_cmd(api, run["id"], "echo live")
        t.join(20)
        assert [e["type"] for _, e in got] == ["stdout", "exit"] and got[0][0] == ids[-1] + 1


def conforms(api: httpx.Client, name: str, answer: dict[str, Any]) -> None:
    """``answer`` has exactly the fields of the served schema ``name``, each of its type
    (the exec routes answer without FastAPI's response filtering: nothing beyond the
    schema may slip out)."""
    from sandhold.server import app

    schema = api.get("/openapi.json").json()["components"]["schemas"][name]
    assert set(answer) == set(schema["properties"]), (name, sorted(answer))
    getattr(app, name).model_validate(answer, strict=True)


def test_exec_fields_timeout_cwd_env_stdin_and_capture_bound(world: World) -> None:
    repo = git_repo(world, "repo")
    with served(world) as s, s.client() as api:
        ws = workspace(api, repo)
        run = new_run(api, ws, mode="chat", network="deny")
        assert run_cmd(api, run["id"], "mkdir sub")["exit_code"] == 0
        out = run_cmd(
            api,
            run["id"],
            "pwd; echo $GREETING; cat",
            cwd="sub",
            env={"GREETING": "hi"},
            stdin="from-stdin",
        )
        assert out["exit_code"] == 0, out
        assert out["stdout"].split("\n")[1:3] == ["hi", "from-stdin"]
        assert out["stdout"].split("\n")[0].endswith("/checkout/sub")
        out = run_cmd(api, run["id"], "sleep 30", timeout=0.5)
        assert out["killed"] == "timeout" and out["exit_code"] != 0
        out = run_cmd(api, run["id"], "head -c 3000000 /dev/zero | tr '\\0' a; echo done >&2")
        assert len(out["stdout"]) == 1024 * 1024 and out["stdout_truncated"] is True
        assert out["stderr"] == "done\n" and out["stderr_truncated"] is False
        r = api.post(f"/v1/runs/{run['id']}/execs", json={"argv": ["/nonexistent"]})
        assert r.status_code == 201
        conforms(api, "ExecStarted", r.json())
        done = api.get(f"/v1/runs/{run['id']}/execs/{r.json()['exec_id']}")
        assert done.status_code == 200
        conforms(api, "ExecOut", done.json())
        conforms(api, "ExecOut", out)
        # ?wait= on the POST: one round trip answers with the ended exec, as GET does;
        # a command outliving the wait is answered running, and the GET finds its end
        execs = f"/v1/runs/{run['id']}/execs"
        r = api.post(execs, params={"wait": "20"}, json={"shell": "echo once"})
        assert r.status_code == 201, r.text
        assert r.json()["state"] == "exited" and r.json()["stdout"] == "once\n", r.json()
        assert r.json()["exit_code"] == 0
        conforms(api, "ExecOut", r.json())
        r = api.post(execs, params={"wait": "0.2"}, json={"shell": "sleep 1; echo late"})
        assert r.status_code == 201 and r.json()["state"] == "running", r.json()
        conforms(api, "ExecOut", r.json())
        assert wait_exec(api, run["id"], r.json()["exec_id"])["stdout"] == "late\n"
        for bad in ("-1", "61", "soon"):
            r = api.post(execs, params={"wait": bad}, json={"shell": "touch never"})
            assert r.status_code == 400, (bad, r.text)
        assert run_cmd(api, run["id"], "test ! -e never")["exit_code"] == 0


def test_suspend_and_resume(world: World) -> None:
    repo = git_repo(world, "repo")
    with served(world) as s, s.client() as api:
        ws = workspace(api, repo)
        run = new_run(api, ws, mode="chat", network="deny")
        r = api.post(f"/v1/runs/{run['id']}/suspend")
        assert r.status_code == 200 and r.json()["state"] == "suspended"
        assert api.post(f"/v1/runs/{run['id']}/suspend").status_code == 409
        r = api.post(f"/v1/runs/{run['id']}/resume")
        assert r.status_code == 200 and r.json()["state"] == "warm"
        assert run_cmd(api, run["id"], "echo ok")["stdout"] == "ok\n"


def test_a_sandbox_that_fails_before_its_listener_is_there_is_a_failed_launch(
    tmp_path: Path,
) -> None:
    """The run's events come through the port's listener, which gets the end at once
    when the sandbox failed before it was there: that run is a failed launch (409,
    ``error`` with the reason, its checkout and sandbox gone), never ``warm``. A real
    port and sandbox; only the moment of the failure is chosen."""
    import asyncio
    import subprocess

    from sandhold.policy.dispatch import HostOffer
    from sandhold.port import SandboxPort
    from sandhold.server.runs import RunManager, ServerError
    from sandhold.server.store import Store

    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    for argv in (["init", "-q"], ["-c", "user.name=t", "-c", "user.email=t@t",
                                   "commit", "-q", "--allow-empty", "-m", "i"]):  # fmt: skip
        subprocess.run(["git", "-C", str(repo), *argv], check=True, env=env)
    store = Store(str(tmp_path / "state.db"))
    store.add_client("c1", "one", "token")
    store.add_workspace("ws1", "c1", "w", [str(repo)])

    async def create() -> tuple[ServerError, dict[str, Any], list[Any]]:
        async with SandboxPort() as port:
            listen = port.on_events

            def failing_first(sid: str, callback: Any) -> Any:
                port._get(sid).fail("the test: it died at once")
                return listen(sid, callback)

            port.on_events = failing_first  # type: ignore[method-assign]
            runs = RunManager(store, str(tmp_path), HostOffer(True, "test"), port)
            with pytest.raises(ServerError) as failed:
                await runs.create("c1", {"workspace_id": "ws1", "mode": "chat", "network": "deny"})
            (rec,) = store.runs("c1")
            return failed.value, rec, [port.handle(rec["id"]).state.value, list(runs.live)]

    err, rec, (state, live) = asyncio.run(create())
    assert (err.status, err.code) == (409, "launch_failed")
    assert "it died at once" in err.message
    assert rec["state"] == "error" and "it died at once" in rec["error"]
    assert not os.path.exists(os.path.dirname(rec["worktree"]))  # the checkout is gone
    assert live == [] and state in ("error", "destroyed")
