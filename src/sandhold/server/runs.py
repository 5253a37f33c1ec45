"""Runs: each a sandbox on ``SandboxPort`` with its own checkout, its history and its asks.

Rules:
- A run is made in this order, and undone in reverse on any failure: the
  dispatch plan (``policy.dispatch``), the record, the checkout, the sandbox.
  The 201 is sent once the sandbox is ready; a failed launch leaves the record
  in state ``error`` with the reason, and no checkout.
- One event stream per run, subscribed at launch, feeds everything: the run's
  history (SSE ids 1, 2, … per run, kept for the run's life, bounded by count
  and bytes: the oldest go first), each exec's captured output (1 MiB per
  stream, then cut with a flag) and its end, written to the store.
- Output is decoded as UTF-8 per exec and stream with an incremental decoder,
  so a character cut across two chunks arrives whole; bytes that are not UTF-8
  become U+FFFD.
- Every lookup is scoped by the calling client: another client's run, exec or
  ask is ``not_found``, exactly as an id that never existed.
- Asks (network ``ask``): a connection no list decides waits; one ask per
  ``host:port`` at a time (later connections wait on the same one); no answer
  within ``ask_timeout`` is a deny, and the ask is ``expired`` (409 to a late
  answer); ``remember`` holds for that ``host:port`` for the rest of the run.
- Shutdown destroys every sandbox; a run that was live is then ``error``
  ("the server stopped"), and its checkout is removed. At start, runs the last
  server left live are marked the same and their checkouts removed.
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import contextlib
import json
import logging
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sandhold.errors import SandholdError
from sandhold.policy.dispatch import (
    DispatchError,
    HostOffer,
    RunRequest,
    plan_run,
    run_credentials_problem,
)
from sandhold.server.checkout import CheckoutError, make_checkout, remove_checkout
from sandhold.server.store import Store

log = logging.getLogger("sandhold.server")

MAX_CAPTURE = 1024 * 1024  # per exec and stream
MAX_HISTORY_EVENTS = 20_000
MAX_HISTORY_BYTES = 16 * 1024 * 1024
KEEP_ENDED_RUNS = 200  # histories of ended runs kept in memory (not across restarts)
LOST = "the server stopped while the run was live"


class ServerError(Exception):
    """A refusal for a client: ``status`` 4xx, ``code`` and a message that says why."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def not_found(kind: str, ident: str) -> ServerError:
    return ServerError(404, "not_found", f"no {kind} {ident!r}")


@dataclass
class Capture:
    """One exec's captured output and end."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    ended: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)  # set with ``ended``
    recorded: bool = False  # the store has its row
    exit_code: int | None = None
    signal: int = 0
    killed: str | None = None
    decoders: dict[str, codecs.IncrementalDecoder] = field(default_factory=dict)

    def add(self, stream: str, data: bytes) -> str:
        buf = self.stdout if stream == "stdout" else self.stderr
        room = MAX_CAPTURE - len(buf)
        if len(data) > room:
            setattr(self, f"{stream}_truncated", True)
        buf += data[: max(room, 0)]
        dec = self.decoders.get(stream)
        if dec is None:
            dec = self.decoders[stream] = codecs.getincrementaldecoder("utf-8")("replace")
        return dec.decode(data)


@dataclass
class Ask:
    ask_id: str
    host: str
    port: int
    future: asyncio.Future[bool]
    state: str = "pending"  # pending, answered, expired


class LiveRun:
    """A run's in-memory side: its history, captures and asks."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.id: str = record["id"]
        self.client_id: str = record["client_id"]
        self.history: collections.deque[tuple[int, str]] = collections.deque()
        self.history_bytes = 0
        self.next_event_id = 1
        # followers waiting for the next event: resolved in place, no task per event
        self.waiters: set[asyncio.Future[None]] = set()
        self.ended = False
        self.captures: dict[int, Capture] = {}
        self.asks: dict[str, Ask] = {}
        self.pending_asks: dict[tuple[str, int], Ask] = {}
        self.remembered: dict[tuple[str, int], bool] = {}
        self.ask_timeout: float = float(record["ask_timeout"])

    def publish(self, event: dict[str, Any]) -> None:
        text = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
        self.history.append((self.next_event_id, text))
        self.next_event_id += 1
        self.history_bytes += len(text)
        while len(self.history) > MAX_HISTORY_EVENTS or self.history_bytes > MAX_HISTORY_BYTES:
            _, old = self.history.popleft()
            self.history_bytes -= len(old)
        self._wake()

    def end(self) -> None:
        self.ended = True
        for ask in self.pending_asks.values():
            if not ask.future.done():
                ask.future.set_result(False)
        self._wake()

    def _wake(self) -> None:
        waiters, self.waiters = self.waiters, set()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def follow(self, after: int) -> AsyncIterator[tuple[int, str]]:
        """Events with an id above ``after``, then live ones until the run ends;
        ``(0, "")`` after 15 s without one (a keep-alive for the SSE writer)."""
        while True:
            for i, text in list(self.history):
                if i > after:
                    yield i, text
                    after = i
            if self.ended:
                return
            if self.next_event_id - 1 > after:
                continue
            fut = asyncio.get_running_loop().create_future()
            self.waiters.add(fut)
            try:
                async with asyncio.timeout(15.0):
                    await fut
            except TimeoutError:
                yield 0, ""
            finally:
                self.waiters.discard(fut)

    async def ask(self, host: str, port: int) -> bool:
        key = (host, port)
        if key in self.remembered:
            return self.remembered[key]
        ask = self.pending_asks.get(key)
        if ask is None:
            loop = asyncio.get_running_loop()
            ask = Ask(f"ask_{secrets.token_hex(8)}", host, port, loop.create_future())
            self.asks[ask.ask_id] = ask
            self.pending_asks[key] = ask
            self.publish(
                {
                    "type": "ask",
                    "exec_id": None,
                    "backend": self.record["backend"],
                    "ask_id": ask.ask_id,
                    "host": host,
                    "port": port,
                    "timeout": self.ask_timeout,
                }
            )
        try:
            return await asyncio.wait_for(asyncio.shield(ask.future), self.ask_timeout)
        except TimeoutError:
            if ask.state == "pending":
                ask.state = "expired"
                self.pending_asks.pop(key, None)
                self.publish(
                    {
                        "type": "ask_expired",
                        "exec_id": None,
                        "backend": self.record["backend"],
                        "ask_id": ask.ask_id,
                        "host": host,
                        "port": port,
                    }
                )
            return False

    def answer(self, ask_id: str, allow: bool, remember: bool) -> None:
        ask = self.asks.get(ask_id)
        if ask is None:
            raise not_found("ask", ask_id)
        if ask.state != "pending":
            raise ServerError(409, "ask_closed", f"ask {ask_id!r} is {ask.state}: answer no more")
        ask.state = "answered"
        self.pending_asks.pop((ask.host, ask.port), None)
        if remember:
            self.remembered[(ask.host, ask.port)] = allow
        if not ask.future.done():
            ask.future.set_result(allow)
        self.publish(
            {
                "type": "ask_answered",
                "exec_id": None,
                "backend": self.record["backend"],
                "ask_id": ask_id,
                "decision": "allow" if allow else "deny",
                "remember": remember,
            }
        )


def event_json(ev: Any, live: LiveRun) -> dict[str, Any]:
    """A port event as the API shows it: SPEC §4 type, exec_id (null: run-level),
    backend, the type's fields, output as text."""
    out: dict[str, Any] = {
        "type": ev.type,
        "exec_id": ev.exec_id or None,
        "backend": ev.backend.value,
    }
    if ev.type in ("stdout", "stderr"):
        cap = live.captures.setdefault(ev.exec_id, Capture())
        out["data"] = cap.add(ev.type, ev.data)
    elif ev.type == "exit":
        out.update(exit_code=ev.exit_code, signal=ev.signal)
        if ev.error:
            out["error"] = ev.error
    elif ev.type == "killed":
        out["reason"] = kill_reason(ev.reason.value)
        if ev.detail:
            out["detail"] = ev.detail
    elif ev.type == "violation":
        out["violation"] = ev.violation.to_json()
    return out


def kill_reason(value: str) -> str:
    """The API's three reasons: a kill by destroy or failure is a manual one."""
    return value if value in ("timeout", "oom", "manual") else "manual"


class RunManager:
    """Every run of this server (rules in the module doc)."""

    def __init__(
        self,
        store: Store,
        state_dir: str,
        offer: HostOffer,
        port: Any,
        rules: Any = None,
        *,
        upstream_cas: tuple[str, ...] = (),
    ) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from sandhold.policy.commands import DEFAULT_RULES

        self.rules = DEFAULT_RULES if rules is None else rules  # the command policy
        self._git = ThreadPoolExecutor(4, thread_name_prefix="sandhold-checkout")
        self.store = store
        self.state_dir = state_dir
        self.offer = offer
        self.port = port  # a started SandboxPort
        # CA files trusted, besides the system's, for the upstreams of terminated TLS
        self.upstream_cas = upstream_cas
        self.live: dict[str, LiveRun] = {}
        self.ended: collections.OrderedDict[str, LiveRun] = collections.OrderedDict()
        self.closing = False

    # -- start and stop ----------------------------------------------------------------

    def recover(self) -> None:
        """Runs the last server left live: marked ``error``, checkouts removed."""
        for rec in self.store.live_runs():
            remove_checkout(os.path.dirname(rec["worktree"]))
            self.store.set_run_state(rec["id"], "error", LOST)
            self.store.end_running_execs(rec["id"], "manual")
            log.warning("run %s was live when the server stopped: marked error", rec["id"])

    async def shutdown(self) -> None:
        self.closing = True
        runs = list(self.live.values())
        await asyncio.gather(*(self._destroy(r, keep=False, error=LOST) for r in runs))
        self._git.shutdown(wait=False, cancel_futures=True)

    # -- lookups -----------------------------------------------------------------------

    def record(self, client_id: str, run_id: str) -> dict[str, Any]:
        rec = self.store.run(client_id, run_id)
        if rec is None:
            raise not_found("run", run_id)
        return rec

    def owns(self, client_id: str, run_id: str) -> None:
        """The ownership check alone: a live run's from memory (the exec path asks it
        two or three times a request), any other's from the store."""
        live = self.live.get(run_id)
        if live is None or live.client_id != client_id:
            self.record(client_id, run_id)

    def _live(self, client_id: str, run_id: str) -> LiveRun:
        live = self.live.get(run_id)
        if live is not None and live.client_id == client_id:
            return live
        rec = self.record(client_id, run_id)  # 404, or not live: 409
        raise ServerError(409, "run_not_live", f"run {run_id!r} is {rec['state']}")

    def view(self, rec: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in rec.items() if k != "client_id"}
        live = self.live.get(rec["id"])
        if live is not None:
            with contextlib.suppress(Exception):
                out["state"] = self.port.handle(rec["id"]).state.value
        return out

    # -- runs --------------------------------------------------------------------------

    async def create(self, client_id: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.closing:
            raise ServerError(409, "shutting_down", "the server is shutting down")
        ws = self.store.workspace(client_id, body["workspace_id"])
        if ws is None:
            raise not_found("workspace", body["workspace_id"])
        request = RunRequest(
            mode=body["mode"],
            network=body["network"],
            repo=body.get("repo"),
            backend=body.get("backend"),
            egress_allowlist=tuple(body.get("egress_allowlist") or ()),
            push=body.get("push") or "deny",
        )
        try:
            plan = plan_run(request, tuple(ws["repos"]), self.offer)
        except DispatchError as exc:
            raise ServerError(exc.status, exc.code, exc.message) from None
        credentials = body.get("credentials")
        if credentials is not None:
            problem = run_credentials_problem(credentials, request.network)
            if problem is not None:
                raise ServerError(400, "invalid_credentials", problem)
        run_id = f"run_{secrets.token_hex(8)}"
        run_dir = os.path.join(self.state_dir, "runs", run_id)
        checkout = os.path.join(run_dir, "checkout")
        from sandhold.errors import SpecError

        try:  # checked before anything is made or recorded
            spec = self._spec(
                run_id=run_id,
                client_id=client_id,
                workspace_id=ws["id"],
                mode=request.mode,
                plan=plan,
                checkout=checkout,
                credentials=credentials,
            )
        except SpecError as exc:
            # the spec's words name a field and never quote a value
            raise ServerError(400, "invalid_credentials", exc.render()) from None
        rec: dict[str, Any] = {
            "id": run_id,
            "client_id": client_id,
            "workspace_id": ws["id"],
            "repo": plan.repo,
            "mode": request.mode,
            "network": request.network,
            "backend": plan.backend,
            "state": "created",
            "error": None,
            "worktree": checkout,
            "egress_allowlist": list(plan.egress_allowlist),
            "push": request.push,
            "ask_timeout": float(body.get("ask_timeout") or 60.0),
        }
        self.store.add_run(rec)
        try:
            os.makedirs(run_dir, mode=0o700)
            # its own threads: a slow clone must not hold the default executor,
            # which the port's freeze and thaw need
            await asyncio.get_running_loop().run_in_executor(
                self._git, make_checkout, plan.repo, checkout, f"sandhold/{run_id}"
            )
        except (OSError, CheckoutError) as exc:
            remove_checkout(run_dir)
            self.store.set_run_state(run_id, "error", f"checkout failed: {exc}")
            raise ServerError(409, "checkout_failed", f"the run's checkout failed: {exc}") from None
        live = LiveRun(rec)
        self.live[run_id] = live
        try:
            await self._launch(live, plan, spec)
            if self.live.get(run_id) is not live:
                # it failed before its listener was there: the listener got the end
                # at once, and the run is no more warm than a failed launch
                raise RuntimeError(
                    self.port.handle(run_id).error or "the sandbox ended as it started"
                )
        except BaseException as exc:
            self.live.pop(run_id, None)
            live.end()
            with contextlib.suppress(Exception):
                await self.port.destroy(run_id)  # a failed launch leaves a handle in error
            remove_checkout(run_dir)
            why = exc.render() if isinstance(exc, SandholdError) else str(exc)
            self.store.set_run_state(run_id, "error", f"launch failed: {why}")
            if isinstance(exc, Exception):
                raise ServerError(
                    409, "launch_failed", f"the sandbox did not start: {why}"
                ) from None
            raise
        self.store.set_run_state(run_id, "warm")
        return self.view(self.record(client_id, run_id))

    def _spec(
        self,
        *,
        run_id: str,
        client_id: str,
        workspace_id: str,
        mode: str,
        plan: Any,
        checkout: str,
        credentials: dict[str, Any] | None,
    ) -> Any:
        """The run's validated ``SandboxSpec`` (``SpecError`` if its credentials do not
        fit its network: a host outside the allowlist, a bad mode...)."""
        from sandhold.spec import SandboxBindMount, SandboxCredentials, SandboxMode, SandboxSpec

        binds = [SandboxBindMount(checkout, read_only=not plan.checkout_writable)]
        binds += [SandboxBindMount(r, read_only=True) for r in plan.read_only_binds]
        tls = None
        if credentials is not None:
            from sandhold.policy.credentials import TlsTerminate

            # the per-install CA, for the injection hosts only
            tls = TlsTerminate(extra_ca_cert_paths=self.upstream_cas)
        return SandboxSpec(
            session_id=run_id,
            workspace_id=workspace_id,
            agent_id=client_id,
            bind_mounts=tuple(binds),
            network_enabled=plan.network_enabled,
            egress_allowlist=plan.egress_allowlist,
            guest_workdir=checkout,
            mode=SandboxMode(mode),
            protected_paths=plan.protected_paths,
            credentials=None if credentials is None else SandboxCredentials(credentials),
            tls_terminate=tls,
        ).validate()

    async def _launch(self, live: LiveRun, plan: Any, spec: Any) -> None:
        from sandhold.spec import SandboxBackend

        await self.port.launch(
            spec,
            backend=SandboxBackend(plan.backend),
            ask=live.ask if plan.ask else None,
        )
        # a listener, not a stream read by a task: an exec's end reaches its waiting
        # request in the callback that read the frame, not a turn of the loop later
        # (under 50 busy sandboxes each turn may wait for the CPU for milliseconds)
        self.port.on_events(live.id, lambda ev: self._on_event(live, ev))

    def _on_event(self, live: LiveRun, ev: Any) -> None:
        """One event of the run's sandbox, as the port reads it; None: it has ended."""
        if ev is None:
            self._ended(live)
            return
        try:
            live.publish(event_json(ev, live))
            if ev.type == "killed":
                cap = live.captures.setdefault(ev.exec_id, Capture())
                cap.killed = kill_reason(ev.reason.value)
            elif ev.type == "exit" and ev.exec_id:
                cap = live.captures.setdefault(ev.exec_id, Capture())
                cap.ended, cap.exit_code, cap.signal = True, ev.exit_code, ev.signal
                if cap.recorded:
                    self._record_end(live, ev.exec_id, cap)
                    cap.done.set()
        except Exception:
            log.exception("run %s: its events failed", live.id)
            self._ended(live)
            raise  # and the port stops calling

    def _ended(self, live: LiveRun) -> None:
        """The sandbox is gone (destroyed, or it failed under us)."""
        if self.live.get(live.id) is live:
            del self.live[live.id]
            with contextlib.suppress(Exception):
                handle = self.port.handle(live.id)
                if handle.state.value == "error":
                    self.store.set_run_state(live.id, "error", handle.error or "the sandbox failed")
                    self.store.end_running_execs(live.id, "manual")
        live.end()
        self.ended[live.id] = live
        while len(self.ended) > KEEP_ENDED_RUNS:
            self.ended.popitem(last=False)

    def _record_end(self, live: LiveRun, exec_id: int, cap: Capture) -> None:
        self.store.end_exec(
            live.id,
            exec_id,
            exit_code=cap.exit_code,
            signal=cap.signal,
            killed=cap.killed,
            stdout=bytes(cap.stdout),
            stderr=bytes(cap.stderr),
            stdout_truncated=cap.stdout_truncated,
            stderr_truncated=cap.stderr_truncated,
        )

    async def delete(self, client_id: str, run_id: str, keep_worktree: bool) -> dict[str, Any]:
        rec = self.record(client_id, run_id)
        live = self.live.get(run_id)
        if live is not None:
            await self._destroy(live, keep=keep_worktree)
        elif rec["state"] != "destroyed":
            if not keep_worktree:
                remove_checkout(os.path.dirname(rec["worktree"]))
            self.store.set_run_state(run_id, "destroyed")
        return self.view(self.record(client_id, run_id))

    async def _destroy(self, live: LiveRun, *, keep: bool, error: str | None = None) -> None:
        try:
            await self.port.destroy(live.id)
        except Exception as exc:
            log.warning("run %s: destroy: %s", live.id, exc)
        self._ended(live)
        self.store.end_running_execs(live.id, "manual")
        if not keep:
            remove_checkout(os.path.dirname(live.record["worktree"]))
        if error is not None:
            self.store.set_run_state(live.id, "error", error)
        else:
            self.store.set_run_state(live.id, "destroyed")

    async def suspend(self, client_id: str, run_id: str) -> dict[str, Any]:
        live = self._live(client_id, run_id)
        await self._transition(self.port.suspend, live, "suspend")
        self.store.set_run_state(run_id, "suspended")
        return self.view(self.record(client_id, run_id))

    async def resume(self, client_id: str, run_id: str) -> dict[str, Any]:
        live = self._live(client_id, run_id)
        handle = await self._transition(self.port.resume, live, "resume")
        self.store.set_run_state(run_id, handle.state.value)
        return self.view(self.record(client_id, run_id))

    async def _transition(self, step: Any, live: LiveRun, what: str) -> Any:
        from sandhold.errors import InvalidTransition

        try:
            return await step(live.id)
        except InvalidTransition as exc:
            raise ServerError(
                409, "invalid_state", f"cannot {what} run {live.id!r}: {exc}"
            ) from None

    # -- execs -------------------------------------------------------------------------

    async def start_exec(self, client_id: str, run_id: str, body: dict[str, Any]) -> dict[str, Any]:
        from sandhold.policy.commands import check_command

        live = self._live(client_id, run_id)
        command: list[str] | str = body["argv"] if body.get("argv") is not None else body["shell"]
        refusal = check_command(
            command, mode=live.record["mode"], push=live.record["push"], rules=self.rules
        )
        if refusal is not None:
            raise ServerError(403, "command_policy", refusal.message)
        cwd = body.get("cwd")
        if cwd is not None:
            cwd = os.path.join(live.record["worktree"], cwd)
        from sandhold.errors import InvalidTransition

        try:
            execution = await self.port.exec(
                run_id,
                command,
                cwd=cwd,
                env=body.get("env"),
                stdin=body.get("stdin"),
                timeout=body.get("timeout"),
            )
        except InvalidTransition as exc:
            raise ServerError(
                409, "invalid_state", f"run {run_id!r} cannot run a command: {exc}"
            ) from None
        except (ValueError, TypeError) as exc:
            raise ServerError(400, "invalid_body", str(exc)) from None
        exec_id = int(execution.exec_id)
        del execution  # the run's stream carries its events; this one would hold them back
        self.store.add_exec(run_id, exec_id, client_id, command)
        cap = live.captures.setdefault(exec_id, Capture())
        cap.recorded = True
        if cap.ended:
            self._record_end(live, exec_id, cap)
            cap.done.set()
        return {"exec_id": exec_id, "run_id": run_id, "state": "running"}

    async def wait_exec(self, client_id: str, run_id: str, exec_id: int, wait: float) -> None:
        """Return when the exec has ended, or after ``wait`` seconds (a long poll)."""
        self.owns(client_id, run_id)
        live = self.live.get(run_id)
        cap = live.captures.get(exec_id) if live is not None else None
        if cap is not None and cap.recorded and not cap.done.is_set():
            # asyncio.timeout, not wait_for: wait_for runs the wait as a task of its own,
            # two more turns of a loop 50 busy runs share before the answer goes out
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await cap.done.wait()

    def get_exec(self, client_id: str, run_id: str, exec_id: int) -> dict[str, Any]:
        self.owns(client_id, run_id)
        row = self.store.exec(client_id, run_id, exec_id)
        if row is None:
            raise not_found("exec", str(exec_id))
        live = self.live.get(run_id) or self.ended.get(run_id)
        cap = live.captures.get(exec_id) if live is not None else None
        if cap is not None and row["state"] == "running":
            row.update(
                stdout=bytes(cap.stdout),
                stderr=bytes(cap.stderr),
                stdout_truncated=cap.stdout_truncated,
                stderr_truncated=cap.stderr_truncated,
            )
        row["stdout"] = row["stdout"].decode("utf-8", "replace")
        row["stderr"] = row["stderr"].decode("utf-8", "replace")
        return row

    def list_execs(self, client_id: str, run_id: str) -> list[dict[str, Any]]:
        self.record(client_id, run_id)
        out = []
        for row in self.store.execs(client_id, run_id):
            for k in ("stdout", "stderr"):
                row.pop(k)
            out.append(row)
        return out

    # -- events and asks ---------------------------------------------------------------

    def history(self, client_id: str, run_id: str) -> LiveRun | None:
        self.record(client_id, run_id)
        return self.live.get(run_id) or self.ended.get(run_id)

    def answer(self, client_id: str, run_id: str, ask_id: str, allow: bool, remember: bool) -> None:
        self.record(client_id, run_id)
        live = self.live.get(run_id) or self.ended.get(run_id)
        if live is None:
            raise not_found("ask", ask_id)
        live.answer(ask_id, allow, remember)
