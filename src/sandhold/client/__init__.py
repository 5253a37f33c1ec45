"""A Python client for ``sandhold serve``: ``Client`` (async) and ``SyncClient``.

Example::

    from sandhold.client import SyncClient

    with SyncClient("http://127.0.0.1:7317", token=open(token_file).read().strip()) as api:
        ws = api.create_workspace("demo", ["/home/me/project"])
        run = api.create_run(ws["id"], mode="chat", network="deny")
        result = api.run(run["id"], shell="git status --short")
        print(result["exit_code"], result["stdout"])
        api.delete_run(run["id"])

Rules:
- Every method is one request (``run`` and ``wait_exec`` poll); a 4xx or 5xx
  raises ``ApiError`` with the server's ``code`` and ``message``; no usable answer
  (cannot connect, broken off, timed out, malformed, too large) raises
  ``ClientError``.
- ``http://HOST:PORT`` only, or ``unix=PATH`` for the server's unix socket.
- ``token`` defaults to the contents of ``$SANDHOLD_TOKEN``.
- The HTTP is ``_http.Transport`` (h11, a keep-alive pool; why, in its doc).
- ``SyncClient`` runs a ``Client`` on a private event loop thread, so the two
  cannot drift apart.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from sandhold.client._http import Response, Transport
from sandhold.errors import ApiError, ClientError  # raised here (one of errors.py's tree)


def _exec_body(
    *,
    argv: list[str] | None,
    shell: str | None,
    cwd: str | None,
    env: dict[str, str] | None,
    timeout: float | None,
    stdin: str | None,
) -> dict[str, Any]:
    body = _drop_none({"argv": argv, "shell": shell, "cwd": cwd, "env": env, "timeout": timeout})
    if stdin is not None:
        body["stdin"] = stdin  # an empty stdin is a stdin
    return body


def _drop_none(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


def _check(response: Response) -> Any:
    if response.status >= 400:
        try:
            err = json.loads(response.body)["error"]
            code, message = str(err["code"]), str(err["message"])
        except (ValueError, KeyError, TypeError):
            code, message = "http_error", response.body[:500].decode(errors="replace")
        raise ApiError(response.status, code, message)
    try:
        return json.loads(response.body)
    except ValueError as exc:
        raise ClientError(f"the server answered {response.status} without JSON") from exc


def _address(base_url: str | None) -> tuple[str, int]:
    """(host, port) of an ``http://`` URL; anything else is refused."""
    url = urlsplit(base_url or "http://127.0.0.1:7317")
    if url.scheme != "http" or not url.hostname or url.path not in ("", "/"):
        raise ClientError(
            f"{base_url!r}: the client speaks http://HOST:PORT (or unix=PATH), nothing else"
        )
    try:
        port = url.port or 80
    except ValueError as exc:
        raise ClientError(f"{base_url!r}: {exc}") from None
    if url.username or url.password or url.query or url.fragment:
        raise ClientError(f"{base_url!r}: no user, query or fragment in the server's URL")
    return url.hostname, port


def _target(path: str, params: dict[str, Any] | None = None) -> str:
    """A request target: ``path`` percent-encoded (an id cannot add a query or a
    fragment), then ``params`` as its query."""
    target = quote(path, safe="/-_.~:@!$&'()*+,;=")
    return f"{target}?{urlencode(params)}" if params else target


def _parse_sse(lines: list[str]) -> tuple[int, dict[str, Any]] | None:
    """One server-sent event (``id:`` and ``data:`` lines; comments and other fields
    ignored), or None for one without data (a keep-alive)."""
    event_id, data = 0, []
    try:
        for line in lines:
            if line.startswith("id:"):
                event_id = int(line[3:].strip())
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
        if not data:
            return None
        event = json.loads("\n".join(data))
    except ValueError as exc:
        raise ClientError(f"a malformed event from the server: {exc}") from exc
    if not isinstance(event, dict):
        raise ClientError("a malformed event from the server: not an object")
    return event_id, event


class Client:
    """The async client (see the module doc)."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: str | None = None,
        unix: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.token = token if token is not None else os.environ.get("SANDHOLD_TOKEN", "")
        host, port = ("localhost", 0) if unix is not None else _address(base_url)
        self._http = Transport(
            host=host,
            port=port,
            unix=unix,
            headers=[(b"authorization", f"Bearer {self.token}".encode())],
            timeout=timeout,
        )

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        target = _target(path, params)
        if body is None:
            return _check(await self._http.request(method, target))
        data = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json")]
        return _check(await self._http.request(method, target, data, headers))

    async def healthz(self) -> Any:
        return await self.request("GET", "/healthz")

    async def host(self) -> Any:
        return await self.request("GET", "/v1/host")

    async def create_workspace(self, name: str, repos: list[str]) -> Any:
        return await self.request("POST", "/v1/workspaces", {"name": name, "repos": repos})

    async def workspaces(self) -> list[Any]:
        return list((await self.request("GET", "/v1/workspaces"))["items"])

    async def workspace(self, workspace_id: str) -> Any:
        return await self.request("GET", f"/v1/workspaces/{workspace_id}")

    async def delete_workspace(self, workspace_id: str) -> Any:
        return await self.request("DELETE", f"/v1/workspaces/{workspace_id}")

    async def create_run(
        self,
        workspace_id: str,
        *,
        mode: str,
        network: str,
        repo: str | None = None,
        backend: str | None = None,
        egress_allowlist: list[str] | None = None,
        push: str | None = None,
        ask_timeout: float | None = None,
        credentials: dict[str, Any] | None = None,
    ) -> Any:
        """A new run. ``credentials``: srt's block with each ``envVars`` entry's real
        ``value``; the run's sandbox sees placeholders only."""
        body = _drop_none(
            {
                "workspace_id": workspace_id,
                "credentials": credentials,
                "mode": mode,
                "network": network,
                "repo": repo,
                "backend": backend,
                "egress_allowlist": egress_allowlist,
                "push": push,
                "ask_timeout": ask_timeout,
            }
        )
        return await self.request("POST", "/v1/runs", body)

    async def runs(self) -> list[Any]:
        return list((await self.request("GET", "/v1/runs"))["items"])

    async def get_run(self, run_id: str) -> Any:
        return await self.request("GET", f"/v1/runs/{run_id}")

    async def delete_run(self, run_id: str, *, keep_worktree: bool = False) -> Any:
        params = {"keep_worktree": "true"} if keep_worktree else {}
        return await self.request("DELETE", f"/v1/runs/{run_id}", **params)

    async def suspend(self, run_id: str) -> Any:
        return await self.request("POST", f"/v1/runs/{run_id}/suspend")

    async def resume(self, run_id: str) -> Any:
        return await self.request("POST", f"/v1/runs/{run_id}/resume")

    async def exec(
        self,
        run_id: str,
        *,
        argv: list[str] | None = None,
        shell: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        stdin: str | None = None,
    ) -> int:
        body = _exec_body(argv=argv, shell=shell, cwd=cwd, env=env, timeout=timeout, stdin=stdin)
        return int((await self.request("POST", f"/v1/runs/{run_id}/execs", body))["exec_id"])

    async def get_exec(self, run_id: str, exec_id: int) -> Any:
        return await self.request("GET", f"/v1/runs/{run_id}/execs/{exec_id}")

    async def wait_exec(self, run_id: str, exec_id: int) -> Any:
        """The exec once it has ended (long polls of ``?wait=``)."""
        while True:
            found = await self.request("GET", f"/v1/runs/{run_id}/execs/{exec_id}", wait="30")
            if found["state"] == "exited":
                return found

    async def run(
        self,
        run_id: str,
        *,
        argv: list[str] | None = None,
        shell: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        stdin: str | None = None,
    ) -> Any:
        """Start an exec and return it once ended, with its output (one request for a
        command that ends within the long poll, then ``wait_exec``)."""
        body = _exec_body(argv=argv, shell=shell, cwd=cwd, env=env, timeout=timeout, stdin=stdin)
        found = await self.request("POST", f"/v1/runs/{run_id}/execs", body, wait="30")
        if found["state"] == "exited":
            return found
        return await self.wait_exec(run_id, int(found["exec_id"]))

    async def answer_ask(
        self, run_id: str, ask_id: str, decision: str, *, remember: bool = False
    ) -> Any:
        body = {"decision": decision, "remember": remember}
        return await self.request("POST", f"/v1/runs/{run_id}/asks/{ask_id}", body)

    async def events(
        self, run_id: str, *, last_event_id: int | None = None
    ) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        """The run's events as ``(id, event)``: its history, then live ones."""
        headers = [(b"accept", b"text/event-stream")]
        if last_event_id is not None:
            headers.append((b"last-event-id", b"%d" % last_event_id))
        target = _target(f"/v1/runs/{run_id}/events")
        async with self._http.stream("GET", target, headers) as (head, chunks):
            if head.status >= 400:
                head.body = b"".join([c async for c in chunks])[:65536]
                _check(head)
            lines: list[str] = []
            pending = b""
            async for chunk in chunks:
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    line = raw.removesuffix(b"\r").decode(errors="replace")
                    if line:
                        lines.append(line)
                        continue
                    parsed = _parse_sse(lines)
                    lines = []
                    if parsed is not None:
                        yield parsed


class SyncClient:
    """The same API, blocking: a facade over ``Client`` on a private event loop thread.

    Every method of ``Client`` is here with the same arguments; ``events``
    is a plain iterator.
    """

    def __init__(self, base_url: str | None = None, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="sandhold-client", daemon=True
        )
        self._thread.start()

        async def make() -> Client:
            return Client(base_url, **kwargs)

        self._client = self._call(make())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if name == "events":

            def events(*args: Any, **kwargs: Any) -> Iterator[tuple[int, dict[str, Any]]]:
                stream = method(*args, **kwargs)
                try:
                    while True:
                        try:
                            yield self._call(stream.__anext__())
                        except StopAsyncIteration:
                            return
                finally:
                    self._call(stream.aclose())

            return events
        if not callable(method) or not asyncio.iscoroutinefunction(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(method(*args, **kwargs))

        call.__name__ = name
        call.__doc__ = method.__doc__
        return call
