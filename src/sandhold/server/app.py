"""The HTTP API of ``sandhold serve`` (FastAPI on uvicorn): routes, auth, the guards.

Rules:
- Guards before anything else, for HTTP and WebSocket alike (``Guard``, plain
  ASGI): over TCP the ``Host`` header must be one of the server's own
  addresses (``127.0.0.1:PORT``, ``localhost:PORT``, ``[::1]:PORT``, the
  ``--listen`` host), else 403 — a web page cannot reach the server by DNS
  rebinding; over the unix socket any Host passes. A body over 1 MiB is 413,
  by its ``Content-Length`` or as it streams.
- Every route but ``/healthz``, ``/openapi.json`` and the page needs a bearer
  token; none, or a wrong one, is 401. A client sees only its own things:
  another client's id is 404 with the same code as an id that never existed.
- Bodies are validated strictly (no unknown field, no coercion of types); every
  error is ``{"error": {"code", "message"}}`` with a 4xx, and changes nothing.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any, Literal

from fastapi import Depends, FastAPI, Path, Query, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from sandhold.policy.dispatch import repo_path_problem
from sandhold.server.checkout import registered_repo_problem
from sandhold.server.runs import RunManager, ServerError, not_found

MAX_BODY = 1024 * 1024

# -- bodies ------------------------------------------------------------------------------


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class WorkspaceIn(Strict):
    name: str = Field(min_length=1, max_length=200)
    repos: list[str] = Field(min_length=1, max_length=64)


class RunIn(Strict):
    workspace_id: str = Field(max_length=100)
    repo: str | None = Field(default=None, max_length=4096)
    mode: Literal["chat", "review", "plan", "orchestrate"]
    network: Literal["allow", "ask", "deny"]
    backend: Literal["native", "none", "microvm"] | None = None
    egress_allowlist: list[str] | None = Field(default=None, max_length=256)
    push: Literal["allow", "deny"] | None = None
    ask_timeout: float | None = Field(default=None, gt=0, le=3600)
    # srt's credentials block, each envVars entry with its real "value": the sandbox
    # sees placeholders, the proxy puts the values back for the entry's injectHosts
    credentials: dict[str, Any] | None = None


class ExecIn(Strict):
    argv: list[str] | None = Field(default=None, min_length=1, max_length=4096)
    shell: str | None = Field(default=None, min_length=1, max_length=256 * 1024)
    cwd: str | None = Field(default=None, max_length=4096)
    env: dict[str, str] | None = None
    timeout: float | None = Field(default=None, gt=0, le=7 * 24 * 3600)
    stdin: str | None = None

    @model_validator(mode="after")
    def one_command(self) -> ExecIn:
        if (self.argv is None) == (self.shell is None):
            raise ValueError("give exactly one of 'argv' (a list) and 'shell' (a string)")
        if self.cwd is not None and (self.cwd.startswith("/") or "\0" in self.cwd):
            raise ValueError("'cwd' is relative to the run's checkout (no leading '/')")
        return self


class TerminalIn(Strict):
    backend: Literal["none", "native"] | None = None
    cwd: str | None = Field(default=None, max_length=4096)
    cols: int = Field(ge=1, le=1000)
    rows: int = Field(ge=1, le=1000)
    shell: list[str] | None = Field(default=None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def absolute_cwd(self) -> TerminalIn:
        if self.cwd is not None and (not self.cwd.startswith("/") or "\0" in self.cwd):
            raise ValueError("'cwd' is an absolute path")
        if self.shell is not None and any("\0" in a for a in self.shell):
            raise ValueError("'shell' arguments hold no NUL")
        return self


class TerminalOut(BaseModel):
    id: str
    backend: str
    state: Literal["running", "exited"]
    exit_code: int | None
    cols: int
    rows: int
    cwd: str
    created: float


class TerminalList(BaseModel):
    items: list[TerminalOut]


class TicketOut(BaseModel):
    ticket: str
    expires_in: int


class AskIn(Strict):
    decision: Literal["allow", "deny"]
    remember: bool = False


# -- answers (for the OpenAPI document) ---------------------------------------------------


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorOut(BaseModel):
    error: ErrorBody


class BackendOut(BaseModel):
    available: bool
    note: str
    hint: str


class HostOut(BaseModel):
    sandbox: Literal["on", "off"]
    backends: dict[str, BackendOut]


class WorkspaceOut(BaseModel):
    id: str
    name: str
    repos: list[str]
    created: float


class RunOut(BaseModel):
    id: str
    workspace_id: str
    repo: str
    mode: str
    network: str
    backend: str
    state: str
    error: str | None
    worktree: str
    egress_allowlist: list[str]
    push: str
    ask_timeout: float
    created: float
    updated: float


class ExecStarted(BaseModel):
    exec_id: int
    run_id: str
    state: str


class ExecOut(BaseModel):
    exec_id: int
    run_id: str
    command: list[str] | str
    state: Literal["running", "exited"]
    exit_code: int | None
    signal: int | None
    killed: str | None
    created: float
    ended: float | None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool
    stderr_truncated: bool


class Items(BaseModel):
    items: list[dict[str, Any]]


class WorkspaceList(BaseModel):
    items: list[WorkspaceOut]


class RunList(BaseModel):
    items: list[RunOut]


ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorOut} for s in (400, 401, 403, 404, 409, 413, 422)
}


def answer(body: dict[str, Any], status: int = 200) -> JSONResponse:
    """A route's answer as it is: the exec routes, the hot path, skip FastAPI's
    validation and encoding of their ``response_model`` (~0.3 ms a request), which
    stays their OpenAPI schema; tests/test_server_api.py holds their answers to it."""
    return JSONResponse(body, status_code=status)


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


# -- the guard ---------------------------------------------------------------------------


class Guard:
    """Host check and body limit, in front of the app (rules in the module doc)."""

    def __init__(self, app: Any, allowed_hosts: set[str], fast: Any = None) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts
        self.fast = fast  # (scope, headers, body) -> a response, or None: the app answers

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        server = scope.get("server")
        over_tcp = server is not None and server[1] is not None
        if over_tcp:
            host = headers.get("host", b"").decode("latin-1").strip().lower()
            if host not in self.allowed_hosts:
                return await self._refuse(
                    scope,
                    send,
                    403,
                    "host_not_allowed",
                    f"Host {host!r} is not this server's address; use one of "
                    f"{', '.join(sorted(self.allowed_hosts))}",
                )
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        length = headers.get("content-length")
        if length is not None:
            try:
                too_big = int(length) > MAX_BODY
            except ValueError:
                return await self._refuse(
                    scope, send, 400, "invalid_body", "Content-Length is not a number"
                )
            if too_big:
                return await self._refuse(
                    scope, send, 413, "body_too_large", f"a body is at most {MAX_BODY} bytes"
                )
        # The whole body is read here, bounded, before the app sees any of it: a
        # body that grows past the limit as it streams is refused the same way.
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            if len(body) > MAX_BODY:
                await self._refuse(
                    scope, send, 413, "body_too_large", f"a body is at most {MAX_BODY} bytes"
                )
                return
            if not message.get("more_body", False):
                break
        if self.fast is not None:
            response = await self.fast(scope, headers, bytes(body))
            if response is not None:
                await response(scope, receive, send)
                return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Any, send: Any, status: int, code: str, message: str) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
            return
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


# -- the app -----------------------------------------------------------------------------


class Server:
    """What the routes need: the store, the runs, the host offer, the auth cache."""

    def __init__(
        self, runs: RunManager, host: dict[str, Any], state_dir: str, terminals: Any = None
    ) -> None:
        self.runs = runs
        self.terminals = terminals  # a TerminalManager
        self.store = runs.store
        self.host = host
        self.state_dir = state_dir
        # a valid token -> its client id (only valid ones: a guesser cannot grow it);
        # hashing each request's token cost ~0.1 ms (OpenSSL 3's sha256 set-up)
        self._tokens: dict[str, str] = {}

    def client_for(self, token: str) -> str | None:
        client = self._tokens.get(token)
        if client is None:
            # a client added by ``--add-client`` while we run is in the store only
            client = self.store.client_for_token(token)
            if client is not None:
                self._tokens[token] = client
        return client


def build_app(server: Server, allowed_hosts: set[str], lifespan: Any = None) -> Any:
    app = FastAPI(
        title="sandhold server",
        version=_version(),
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        responses=ERRORS,
    )

    async def client(request: Request) -> str:
        return client_of(request.headers.get("authorization", ""))

    def client_of(auth: str) -> str:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ServerError(401, "unauthorized", "send 'Authorization: Bearer <token>'")
        found = server.client_for(token.strip())
        if found is None:
            raise ServerError(401, "unauthorized", "the token is not one of this server's")
        return found

    @app.exception_handler(ServerError)
    async def on_server_error(_request: Request, exc: ServerError) -> JSONResponse:
        return error(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for e in exc.errors()[:5]:
            where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
            problems.append(f"{where}: {e.get('msg', 'invalid')}")
        return error(400, "invalid_body", "; ".join(problems) or "the body is not valid")

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error(exc.status_code, code, str(exc.detail))

    @app.get("/healthz", responses={})
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/host", response_model=HostOut)
    async def host(_c: str = Depends(client)) -> dict[str, Any]:
        return server.host

    # -- workspaces --------------------------------------------------------------------

    @app.post("/v1/workspaces", status_code=201, response_model=WorkspaceOut)
    async def create_workspace(body: WorkspaceIn, c: str = Depends(client)) -> dict[str, Any]:
        repos: list[str] = []
        for i, path in enumerate(body.repos):
            why = repo_path_problem(path) or registered_repo_problem(path)
            if why is None and _overlaps(path, server.state_dir):
                why = f"overlaps the server's state directory {server.state_dir}"
            if why is not None:
                raise ServerError(400, "invalid_repo", f"repos[{i}] {path!r} {why}")
            if path in repos:
                raise ServerError(400, "invalid_repo", f"repos[{i}] {path!r} is listed twice")
            repos.append(path)
        for a in repos:
            for b in repos:
                if a != b and b.startswith(a + "/"):
                    raise ServerError(
                        400, "invalid_repo", f"{b!r} is inside {a!r}: register one of them"
                    )
        ws_id = f"ws_{secrets.token_hex(8)}"
        server.store.add_workspace(ws_id, c, body.name, repos)
        found = server.store.workspace(c, ws_id)
        assert found is not None
        return found

    @app.get("/v1/workspaces", response_model=WorkspaceList)
    async def list_workspaces(c: str = Depends(client)) -> dict[str, Any]:
        return {"items": server.store.workspaces(c)}

    @app.get("/v1/workspaces/{ws_id}", response_model=WorkspaceOut)
    async def get_workspace(ws_id: str, c: str = Depends(client)) -> dict[str, Any]:
        found = server.store.workspace(c, ws_id)
        if found is None:
            raise not_found("workspace", ws_id)
        return found

    @app.delete("/v1/workspaces/{ws_id}", response_model=WorkspaceOut)
    async def delete_workspace(ws_id: str, c: str = Depends(client)) -> dict[str, Any]:
        found = server.store.workspace(c, ws_id)
        if found is None:
            raise not_found("workspace", ws_id)
        if server.store.live_runs_of_workspace(ws_id):
            raise ServerError(
                409, "workspace_busy", f"workspace {ws_id!r} has live runs: delete them first"
            )
        server.store.delete_workspace(c, ws_id)
        return found

    # -- runs --------------------------------------------------------------------------

    @app.post("/v1/runs", status_code=201, response_model=RunOut)
    async def create_run(body: RunIn, c: str = Depends(client)) -> dict[str, Any]:
        return await server.runs.create(c, body.model_dump())

    @app.get("/v1/runs", response_model=RunList)
    async def list_runs(c: str = Depends(client)) -> dict[str, Any]:
        return {"items": [server.runs.view(r) for r in server.store.runs(c)]}

    @app.get("/v1/runs/{run_id}", response_model=RunOut)
    async def get_run(run_id: str, c: str = Depends(client)) -> dict[str, Any]:
        return server.runs.view(server.runs.record(c, run_id))

    @app.delete("/v1/runs/{run_id}", response_model=RunOut)
    async def delete_run(
        run_id: str, keep_worktree: bool = Query(False), c: str = Depends(client)
    ) -> dict[str, Any]:
        return await server.runs.delete(c, run_id, keep_worktree)

    @app.post("/v1/runs/{run_id}/suspend", response_model=RunOut)
    async def suspend_run(run_id: str, c: str = Depends(client)) -> dict[str, Any]:
        return await server.runs.suspend(c, run_id)

    @app.post("/v1/runs/{run_id}/resume", response_model=RunOut)
    async def resume_run(run_id: str, c: str = Depends(client)) -> dict[str, Any]:
        return await server.runs.resume(c, run_id)

    # -- execs -------------------------------------------------------------------------

    @app.post("/v1/runs/{run_id}/execs", status_code=201, response_model=ExecOut | ExecStarted)
    async def start_exec(
        run_id: str,
        body: ExecIn,
        wait: float = Query(0, ge=0, le=60),
        c: str = Depends(client),
    ) -> JSONResponse:
        """Start an exec; with ``wait`` (seconds), answer with the whole exec (as ``GET``
        does) once it has ended or that time has passed: one round trip for a short
        command instead of two."""
        return await exec_answer(c, run_id, body, wait)

    async def exec_answer(c: str, run_id: str, body: ExecIn, wait: float) -> JSONResponse:
        started = await server.runs.start_exec(c, run_id, body.model_dump())
        if not wait:
            return answer(started, 201)
        exec_id = int(started["exec_id"])
        await server.runs.wait_exec(c, run_id, exec_id, wait)
        return answer(server.runs.get_exec(c, run_id, exec_id), 201)

    async def fast_exec(scope: Any, headers: dict[str, bytes], body: bytes) -> Any:
        """``POST /v1/runs/{id}/execs``, the hot path, answered beside FastAPI when the
        request is well formed: a JSON body ``ExecIn`` accepts, a valid token, at most a
        plain ``wait``. Anything else is None: FastAPI's route above answers it (its
        401s, 400s and 404s). Both end in ``exec_answer``. Saves FastAPI's routing,
        dependency solving and middleware, ~0.6 ms of the server's ~1.7 ms an exec."""
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        m = _EXECS_PATH.fullmatch(scope["path"])
        ctype = headers.get("content-type", b"").partition(b";")[0].strip().lower()
        if m is None or ctype != b"application/json":
            return None
        wait = _plain_wait(scope.get("query_string", b""))
        if wait is None:
            return None
        try:
            c = client_of(headers.get("authorization", b"").decode("latin-1"))
            parsed = ExecIn.model_validate_json(body)
        except (ServerError, ValidationError):
            return None
        try:
            return await exec_answer(c, m.group(1), parsed, wait)
        except ServerError as exc:
            return error(exc.status, exc.code, exc.message)

    @app.get("/v1/runs/{run_id}/execs", response_model=Items)
    async def list_execs(run_id: str, c: str = Depends(client)) -> dict[str, Any]:
        return {"items": server.runs.list_execs(c, run_id)}

    @app.get("/v1/runs/{run_id}/execs/{exec_id}", response_model=ExecOut)
    async def get_exec(
        run_id: str,
        exec_id: int = Path(ge=1, le=2**53),
        wait: float = Query(0, ge=0, le=60),
        c: str = Depends(client),
    ) -> JSONResponse:
        """The exec; with ``wait`` (seconds), answered once it has ended or that time
        has passed, whichever comes first (a long poll)."""
        if wait:
            await server.runs.wait_exec(c, run_id, exec_id, wait)
        return answer(server.runs.get_exec(c, run_id, exec_id))

    # -- events and asks ---------------------------------------------------------------

    @app.get(
        "/v1/runs/{run_id}/events",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def events(run_id: str, request: Request, c: str = Depends(client)) -> Any:
        raw = request.headers.get("last-event-id", "0").strip() or "0"
        if not raw.isdigit() or len(raw) > 18:
            raise ServerError(400, "invalid_header", "Last-Event-ID is an event id (an integer)")
        after = int(raw)
        live = server.runs.history(c, run_id)

        async def stream() -> Any:
            if live is None:
                return
            async for event_id, text in live.follow(after):
                if event_id == 0:
                    yield b": keep-alive\n\n"
                else:
                    yield f"id: {event_id}\ndata: {text}\n\n".encode()

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    @app.post("/v1/runs/{run_id}/asks/{ask_id}", response_model=dict[str, str])
    async def answer_ask(
        run_id: str, ask_id: str, body: AskIn, c: str = Depends(client)
    ) -> dict[str, str]:
        server.runs.answer(c, run_id, ask_id, body.decision == "allow", body.remember)
        return {"ask_id": ask_id, "decision": body.decision}

    # -- terminals ---------------------------------------------------------------------

    def terminals() -> Any:
        if server.terminals is None:
            raise ServerError(404, "not_found", "this server hosts no terminals")
        return server.terminals

    @app.post("/v1/terminals", status_code=201, response_model=TerminalOut)
    async def create_terminal(body: TerminalIn, c: str = Depends(client)) -> dict[str, Any]:
        return dict(await terminals().create(c, body.model_dump()))

    @app.get("/v1/terminals", response_model=TerminalList)
    async def list_terminals(c: str = Depends(client)) -> dict[str, Any]:
        return {"items": terminals().list(c)}

    @app.get("/v1/terminals/{term_id}", response_model=TerminalOut)
    async def get_terminal(term_id: str, c: str = Depends(client)) -> dict[str, Any]:
        return dict(terminals().get(c, term_id).view())

    @app.delete("/v1/terminals/{term_id}", response_model=TerminalOut)
    async def delete_terminal(term_id: str, c: str = Depends(client)) -> dict[str, Any]:
        return dict(await terminals().delete(c, term_id))

    @app.post("/v1/terminals/{term_id}/ticket", response_model=TicketOut)
    async def terminal_ticket(term_id: str, c: str = Depends(client)) -> dict[str, Any]:
        return dict(terminals().ticket(c, term_id))

    @app.websocket("/v1/terminals/{term_id}/ws")
    async def terminal_ws(websocket: WebSocket, term_id: str) -> None:
        origin = websocket.headers.get("origin")
        if origin is not None and not _own_origin(origin, allowed_hosts):
            await websocket.close(1008, "Origin is not this server's")
            return
        manager = server.terminals
        if manager is None:
            await websocket.close(1008, "this server hosts no terminals")
            return
        ticket = websocket.query_params.get("ticket")
        found: str | None = None
        if ticket is not None:
            found = manager.redeem(ticket, term_id)
        else:
            scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                found = server.client_for(token.strip())
        if found is None:
            await websocket.close(1008, "a fresh ticket or a bearer token is needed")
            return
        term = manager.terminals.get(term_id)
        if term is None or term.client_id != found:
            await websocket.close(1008, f"no terminal {term_id!r}")
            return
        await websocket.accept()
        await manager.stream(websocket, term)

    from sandhold.server.page import mount_page

    mount_page(app)
    return Guard(app, allowed_hosts, fast_exec)


_EXECS_PATH = re.compile(r"/v1/runs/([^/]+)/execs")
_PLAIN_WAIT = re.compile(rb"(?:wait=(\d{1,2}(?:\.\d{1,6})?))?")


def _plain_wait(query: bytes) -> float | None:
    """``wait`` of a query that is nothing but ``wait=N`` (0-60) or empty, else None."""
    m = _PLAIN_WAIT.fullmatch(query)
    if m is None:
        return None
    wait = float(m.group(1) or 0)
    return wait if wait <= 60 else None


def _own_origin(origin: str, allowed_hosts: set[str]) -> bool:
    """An ``Origin`` of one of the server's own addresses (the Host check's list)."""
    scheme, sep, rest = origin.partition("://")
    return bool(sep) and scheme.lower() == "http" and rest.lower() in allowed_hosts


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _version() -> str:
    from sandhold._version import __version__

    return __version__
