"""Start a real ``sandhold serve`` as a test identity, and talk to it over HTTP.

``served(world, *args)`` starts the server as the world's identity (root or the
unprivileged user) with its own state dir, waits for its ``listening`` line, and
yields a ``Served`` with its URL, the first client's token and an httpx client.
On exit it stops the server with SIGTERM and checks that it ended.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from conftest import World


class Served:
    def __init__(self, world: World, proc: subprocess.Popen[bytes], state: Path) -> None:
        self.world = world
        self.proc = proc
        self.state = state
        self.log = ""
        self.url = ""
        self.unix = ""

    def read_until(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        assert self.proc.stderr is not None
        fd = self.proc.stderr.fileno()
        while True:
            found = re.search(pattern, self.log)
            if found:
                return found
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                with contextlib.suppress(OSError):
                    while select.select([fd], [], [], 0.2)[0]:
                        chunk = os.read(fd, 65536)
                        if not chunk:
                            break
                        self.log += chunk.decode("utf-8", "replace")
                found = re.search(pattern, self.log)
                if found:
                    return found
                raise AssertionError(f"server never logged {pattern!r}; log:\n{self.log}")
            if select.select([fd], [], [], min(left, 0.5))[0]:
                chunk = os.read(fd, 65536)
                if chunk:
                    self.log += chunk.decode("utf-8", "replace")

    @property
    def token(self) -> str:
        return (self.state / "token").read_text().strip()

    def client(self, token: str | None = None, **kw: Any) -> httpx.Client:
        token = self.token if token is None else token
        headers = {"authorization": f"Bearer {token}"} if token else {}
        if self.unix and not self.url:
            return httpx.Client(
                base_url="http://localhost",
                transport=httpx.HTTPTransport(uds=self.unix),
                headers=headers,
                timeout=60,
                **kw,
            )
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, **kw)

    def add_client(self, name: str) -> subprocess.CompletedProcess[str]:
        return self.world.sandhold(
            "serve", "--state-dir", str(self.state), "--add-client", name, timeout=60
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the server did not stop on signal {sig}:\n{self.log}") from None
        with contextlib.suppress(AssertionError):
            self.read_until(r"\Z.", timeout=0)  # drain what is left
        return code


def start(
    world: World,
    *args: str,
    env: dict[str, str] | None = None,
    state: Path | None = None,
    wait: bool = True,
) -> Served:
    state = state or world.root / "state"
    if not state.exists():
        state.mkdir(mode=0o700)
        world.ident.chown(state)
    argv = ["serve", "--state-dir", str(state)]
    if not any(a.startswith(("--listen", "--unix")) for a in args):
        argv += ["--listen", "127.0.0.1:0"]
    proc = world.popen(*argv, *args, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    served = Served(world, proc, state)
    if wait:
        m = served.read_until(r"listening on (http://\S+|unix:\S+)\n")
        if m.group(1).startswith("http"):
            served.url = m.group(1)
        with contextlib.suppress(AssertionError):
            if not served.url:
                served.unix = m.group(1)[5:]
            else:
                served.unix = served.read_until(r"listening on unix:(\S+)\n", 0.5).group(1)
    return served


@contextlib.contextmanager
def served(
    world: World, *args: str, env: dict[str, str] | None = None, state: Path | None = None
) -> Iterator[Served]:
    s = start(world, *args, env=env, state=state)
    try:
        yield s
    finally:
        s.stop()


def git_repo(world: World, rel: str) -> Path:
    """A registered checkout with one commit, a hook, a config, owned by the identity."""
    path = world.mkdir(rel)
    env = world.env(
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    for argv in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "-A"],
        ["git", "commit", "-qm", "init", "--allow-empty"],
    ):
        if argv[1] == "add":
            (path / "README").write_text("hello\n")
            world.ident.chown(path / "README")
        out = world.ident.run(argv, cwd=path, env=env)
        assert out.returncode == 0, out.stderr
    return path


def tree_digest(path: Path) -> dict[str, tuple[int, str]]:
    """Every entry under ``path`` (``.git`` included): mode and content hash or link target."""
    import hashlib

    out: dict[str, tuple[int, str]] = {}
    for d, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            full = os.path.join(d, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, path)
            if os.path.islink(full):
                out[rel] = (st.st_mode, "->" + os.readlink(full))
            elif os.path.isfile(full):
                with open(full, "rb") as f:
                    out[rel] = (st.st_mode, hashlib.sha256(f.read()).hexdigest())
            else:
                out[rel] = (st.st_mode, "dir")
    return out


def wait_exec(api: httpx.Client, run_id: str, exec_id: int, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = api.get(f"/v1/runs/{run_id}/execs/{exec_id}", params={"wait": "10"})
        assert r.status_code == 200, r.text
        if r.json()["state"] == "exited":
            return dict(r.json())
        time.sleep(0.05)
    raise AssertionError(f"exec {exec_id} of {run_id} never ended")


def run_cmd(api: httpx.Client, run_id: str, shell: str, **kw: Any) -> dict[str, Any]:
    r = api.post(f"/v1/runs/{run_id}/execs", json={"shell": shell, **kw})
    assert r.status_code == 201, r.text
    return wait_exec(api, run_id, r.json()["exec_id"])


def sse(
    api: httpx.Client,
    run_id: str,
    *,
    last: int | None = None,
    until: Any = None,
    timeout: float = 30,
) -> list[tuple[int, dict[str, Any]]]:
    """Events of a run until ``until(event)`` is true (or the stream ends)."""
    import json

    headers = {} if last is None else {"last-event-id": str(last)}
    got: list[tuple[int, dict[str, Any]]] = []
    with api.stream(
        "GET", f"/v1/runs/{run_id}/events", headers=headers, timeout=httpx.Timeout(timeout)
    ) as resp:
        assert resp.status_code == 200, resp.read()
        event_id, data = 0, ""
        for line in resp.iter_lines():
            if line.startswith("id:"):
                event_id = int(line[3:])
            elif line.startswith("data:"):
                data = line[5:].strip()
            elif not line and data:
                got.append((event_id, json.loads(data)))
                data = ""
                if until is not None and until(got[-1][1]):
                    break
    return got
