"""The server's records in SQLite: clients, workspaces, runs and execs.

Rules:
- One database file, ``<state-dir>/state.db`` (0600), in WAL mode with a busy
  timeout, so ``sandhold serve --add-client`` can write while a server runs;
  ``synchronous=NORMAL``: every commit survives a crash of the server, the last
  ones may not survive a power loss of the machine.
- Tokens are never stored: only their SHA-256 (they are 256-bit random, so a
  plain hash is enough; lookups compare hashes in constant time by index).
- Every read of a client's thing is scoped by its client id in the query: there
  is no unscoped getter for a route to call by mistake.
- JSON columns hold lists; times are Unix seconds (float).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS clients (
    id TEXT PRIMARY KEY, name TEXT UNIQUE NOT NULL, token_sha256 TEXT UNIQUE NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS workspaces (
    id TEXT PRIMARY KEY, client_id TEXT NOT NULL, name TEXT NOT NULL, repos TEXT NOT NULL,
    created REAL NOT NULL, deleted INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, client_id TEXT NOT NULL, workspace_id TEXT NOT NULL,
    repo TEXT NOT NULL, mode TEXT NOT NULL, network TEXT NOT NULL, backend TEXT NOT NULL,
    state TEXT NOT NULL, error TEXT, worktree TEXT NOT NULL, egress_allowlist TEXT NOT NULL,
    push TEXT NOT NULL, ask_timeout REAL NOT NULL, created REAL NOT NULL, updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS execs (
    run_id TEXT NOT NULL, exec_id INTEGER NOT NULL, client_id TEXT NOT NULL,
    command TEXT NOT NULL, state TEXT NOT NULL, exit_code INTEGER, signal INTEGER,
    killed TEXT, created REAL NOT NULL, ended REAL,
    stdout BLOB, stderr BLOB, stdout_truncated INTEGER NOT NULL DEFAULT 0,
    stderr_truncated INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, exec_id)
);
"""

LIVE_RUN_STATES = ("created", "warm", "active", "suspended")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class NameTaken(Exception):
    """A client of that name exists already."""


class Store:
    """The database (rules in the module doc). Not thread-safe: one per thread."""

    def __init__(self, path: str) -> None:
        fresh = not os.path.exists(path)
        if fresh:  # made 0600 before SQLite writes a byte to it
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600))
        self.db = sqlite3.connect(path, timeout=10.0, isolation_level=None)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA busy_timeout=10000")
        # WAL with NORMAL: a commit survives the server's crash, not the machine's
        # power loss, and costs no fsync (an fsync per exec record held every request)
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # -- clients -----------------------------------------------------------------------

    def add_client(self, client_id: str, name: str, token: str) -> None:
        try:
            self.db.execute(
                "INSERT INTO clients VALUES (?, ?, ?, ?)",
                (client_id, name, token_hash(token), time.time()),
            )
        except sqlite3.IntegrityError as exc:
            if "clients.name" in str(exc):
                raise NameTaken(name) from None
            raise

    def client_count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM clients").fetchone()[0])

    def client_for_token(self, token: str) -> str | None:
        row = self.db.execute(
            "SELECT id FROM clients WHERE token_sha256 = ?", (token_hash(token),)
        ).fetchone()
        return None if row is None else str(row["id"])

    # -- workspaces --------------------------------------------------------------------

    def add_workspace(self, ws_id: str, client_id: str, name: str, repos: list[str]) -> None:
        self.db.execute(
            "INSERT INTO workspaces (id, client_id, name, repos, created) VALUES (?, ?, ?, ?, ?)",
            (ws_id, client_id, name, json.dumps(repos), time.time()),
        )

    def workspace(self, client_id: str, ws_id: str) -> dict[str, Any] | None:
        row = self.db.execute(
            "SELECT * FROM workspaces WHERE id = ? AND client_id = ? AND deleted = 0",
            (ws_id, client_id),
        ).fetchone()
        return None if row is None else _workspace(row)

    def workspaces(self, client_id: str) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT * FROM workspaces WHERE client_id = ? AND deleted = 0 ORDER BY created",
            (client_id,),
        ).fetchall()
        return [_workspace(r) for r in rows]

    def delete_workspace(self, client_id: str, ws_id: str) -> None:
        self.db.execute(
            "UPDATE workspaces SET deleted = 1 WHERE id = ? AND client_id = ?", (ws_id, client_id)
        )

    # -- runs --------------------------------------------------------------------------

    def add_run(self, run: dict[str, Any]) -> None:
        now = time.time()
        self.db.execute(
            "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run["id"],
                run["client_id"],
                run["workspace_id"],
                run["repo"],
                run["mode"],
                run["network"],
                run["backend"],
                run["state"],
                run.get("error"),
                run["worktree"],
                json.dumps(run["egress_allowlist"]),
                run["push"],
                run["ask_timeout"],
                now,
                now,
            ),
        )

    def set_run_state(self, run_id: str, state: str, error: str | None = None) -> None:
        self.db.execute(
            "UPDATE runs SET state = ?, error = coalesce(?, error), updated = ? WHERE id = ?",
            (state, error, time.time(), run_id),
        )

    def run(self, client_id: str, run_id: str) -> dict[str, Any] | None:
        row = self.db.execute(
            "SELECT * FROM runs WHERE id = ? AND client_id = ?", (run_id, client_id)
        ).fetchone()
        return None if row is None else _run(row)

    def runs(self, client_id: str) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT * FROM runs WHERE client_id = ? ORDER BY created", (client_id,)
        ).fetchall()
        return [_run(r) for r in rows]

    def live_runs(self) -> list[dict[str, Any]]:
        marks = ", ".join("?" for _ in LIVE_RUN_STATES)
        rows = self.db.execute(
            f"SELECT * FROM runs WHERE state IN ({marks})", LIVE_RUN_STATES
        ).fetchall()
        return [_run(r) for r in rows]

    def live_runs_of_workspace(self, ws_id: str) -> int:
        marks = ", ".join("?" for _ in LIVE_RUN_STATES)
        row = self.db.execute(
            f"SELECT count(*) FROM runs WHERE workspace_id = ? AND state IN ({marks})",
            (ws_id, *LIVE_RUN_STATES),
        ).fetchone()
        return int(row[0])

    # -- execs -------------------------------------------------------------------------

    def add_exec(self, run_id: str, exec_id: int, client_id: str, command: object) -> None:
        self.db.execute(
            "INSERT INTO execs (run_id, exec_id, client_id, command, state, created) "
            "VALUES (?, ?, ?, ?, 'running', ?)",
            (run_id, exec_id, client_id, json.dumps(command), time.time()),
        )

    def end_exec(
        self,
        run_id: str,
        exec_id: int,
        *,
        exit_code: int | None,
        signal: int,
        killed: str | None,
        stdout: bytes,
        stderr: bytes,
        stdout_truncated: bool,
        stderr_truncated: bool,
    ) -> None:
        self.db.execute(
            "UPDATE execs SET state = 'exited', exit_code = ?, signal = ?, killed = ?, "
            "ended = ?, stdout = ?, stderr = ?, stdout_truncated = ?, stderr_truncated = ? "
            "WHERE run_id = ? AND exec_id = ?",
            (
                exit_code,
                signal,
                killed,
                time.time(),
                stdout,
                stderr,
                int(stdout_truncated),
                int(stderr_truncated),
                run_id,
                exec_id,
            ),
        )

    def end_running_execs(self, run_id: str, reason: str) -> None:
        """Execs still marked running when their run ended without telling."""
        self.db.execute(
            "UPDATE execs SET state = 'exited', killed = coalesce(killed, ?), ended = ? "
            "WHERE run_id = ? AND state = 'running'",
            (reason, time.time(), run_id),
        )

    def exec(self, client_id: str, run_id: str, exec_id: int) -> dict[str, Any] | None:
        row = self.db.execute(
            "SELECT * FROM execs WHERE run_id = ? AND exec_id = ? AND client_id = ?",
            (run_id, exec_id, client_id),
        ).fetchone()
        return None if row is None else _exec(row)

    def execs(self, client_id: str, run_id: str) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT * FROM execs WHERE run_id = ? AND client_id = ? ORDER BY exec_id",
            (run_id, client_id),
        ).fetchall()
        return [_exec(r) for r in rows]


def _workspace(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "name": row["name"],
        "repos": json.loads(row["repos"]),
        "created": row["created"],
    }


def _run(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "client_id": row["client_id"],
        "workspace_id": row["workspace_id"],
        "repo": row["repo"],
        "mode": row["mode"],
        "network": row["network"],
        "backend": row["backend"],
        "state": row["state"],
        "error": row["error"],
        "worktree": row["worktree"],
        "egress_allowlist": json.loads(row["egress_allowlist"]),
        "push": row["push"],
        "ask_timeout": row["ask_timeout"],
        "created": row["created"],
        "updated": row["updated"],
    }


def _exec(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "exec_id": row["exec_id"],
        "run_id": row["run_id"],
        "command": json.loads(row["command"]),
        "state": row["state"],
        "exit_code": row["exit_code"],
        "signal": row["signal"],
        "killed": row["killed"],
        "created": row["created"],
        "ended": row["ended"],
        "stdout": bytes(row["stdout"] or b""),
        "stderr": bytes(row["stderr"] or b""),
        "stdout_truncated": bool(row["stdout_truncated"]),
        "stderr_truncated": bool(row["stderr_truncated"]),
    }
