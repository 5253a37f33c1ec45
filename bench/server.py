"""Measure ``sandhold serve``: 50 concurrent runs, each one short command, through the API.

For each round, N runs are created at once through a real server (its own
process, real HTTP on 127.0.0.1); once all are up, each runs ``true`` at the
same moment, and the time from the exec request to the exec's end (``POST
.../execs?wait=``, answered once it has ended) is taken per run; then the runs
are deleted. In the same round the same N launches and ``true`` run through
the thin front (``_thin_front.py``: a bare llhttp front over a ``SandboxPort``
in a process of its own, with no auth, store or events), and on a
``SandboxPort`` in this process, for the library's figure. The server's RSS is
read from /proc after the runs are up.

Rows (median over rounds of each round's p50 and p99):
- request-to-exit through the server (``POST .../execs`` to ``exited``), over
  TCP (the budget's row) and over its unix socket (``--unix``);
- the same through the thin front: what one more process and an HTTP round
  trip cost on this host, whatever the server does; the gap between it and the
  server is the server's own share;
- the same on the library (``port.run``);
- run creation (``POST /v1/runs`` to 201) vs ``port.launch``, for context.

Rules:
- Budgets: p99 of request-to-exit <= 250 ms on 2 cores; the server adds at most
  10 ms p50 over the library: the median over rounds of each round's server p50
  less the same round's library p50 (paired: load that drifts between rounds
  cancels), with the range of those differences beside it.
- Server, thin front and library rounds alternate, so load drift hits all three.
- The run is a report: exit 0 even when a budget is missed, 1 when something
  fails, 2 when it cannot run here (no bwrap, no server extra).
- Nothing is written outside ``bench/.scratch/`` and ``bench/results/``.

Usage: .venv/bin/python bench/server.py [--runs N] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SCRATCH = BENCH / ".scratch" / "server"
RESULTS = BENCH / "results"
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(BENCH))

from _serve import start_server  # noqa: E402
from _thin_front import library_spec  # noqa: E402

BUDGET_TEXT = "request-to-exit p99 <= 250 ms with 50 concurrent runs; server adds <= 10 ms p50"


def _log(message: str) -> None:
    sys.stderr.write(f"server bench: {message}\n")
    sys.stderr.flush()


def _pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p * (len(ordered) - 1) + 0.5))]


def _repo() -> Path:
    repo = SCRATCH / "repo"
    if not (repo / ".git").is_dir():
        shutil.rmtree(repo, ignore_errors=True)
        repo.mkdir(parents=True)
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "b",
            "GIT_AUTHOR_EMAIL": "b@b",
            "GIT_COMMITTER_NAME": "b",
            "GIT_COMMITTER_EMAIL": "b@b",
        }
        subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
        (repo / "README").write_text("bench\n")
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
        subprocess.run(["git", "-C", str(repo), "commit", "-qm", "b"], check=True, env=env)
    return repo


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def _server_round(api: object, ws: str, n: int) -> tuple[list[float], list[float]]:
    from sandhold.client import Client

    assert isinstance(api, Client)

    async def create() -> tuple[float, str]:
        t0 = time.perf_counter()
        run = await api.create_run(ws, mode="chat", network="deny")
        return (time.perf_counter() - t0) * 1000, str(run["id"])

    async def run_true(run_id: str) -> float:
        t0 = time.perf_counter()
        done = await api.run(run_id, argv=["true"])
        if done["exit_code"] != 0:
            raise RuntimeError(f"true exited {done['exit_code']}: {done['stderr']}")
        return (time.perf_counter() - t0) * 1000

    made = await asyncio.gather(*(create() for _ in range(n)))
    execs = await asyncio.gather(*(run_true(rid) for _, rid in made))
    await asyncio.gather(*(api.delete_run(rid) for _, rid in made))
    return [m[0] for m in made], list(execs)


async def _library_round(
    port: object, repo: Path, n: int, k: int
) -> tuple[list[float], list[float]]:
    from sandhold.port import SandboxPort

    assert isinstance(port, SandboxPort)

    async def launch(i: int) -> tuple[float, str]:
        own = SCRATCH / "lib" / f"{k}-{i}"
        spec = await asyncio.to_thread(library_spec, f"bench-{k}-{i}", own, repo)
        t0 = time.perf_counter()
        handle = await port.launch(spec)
        return (time.perf_counter() - t0) * 1000, handle.session_id

    async def run_true(sid: str) -> float:
        t0 = time.perf_counter()
        result = await port.run(sid, ["true"])
        if result.exit_code != 0:
            raise RuntimeError(f"true exited {result.exit_code}")
        return (time.perf_counter() - t0) * 1000

    made = await asyncio.gather(*(launch(i) for i in range(n)))
    execs = await asyncio.gather(*(run_true(sid) for _, sid in made))
    await asyncio.gather(*(port.destroy(sid) for _, sid in made))
    return [m[0] for m in made], list(execs)


async def _thin_round(front: object, n: int, k: int) -> list[float]:
    """The same launches and ``true`` through the thin front (``_thin_front``)."""
    from sandhold.client._http import Transport

    assert isinstance(front, Transport)

    async def call(route: str, body: bytes = b"{}") -> dict[str, object]:
        answer = await front.request("POST", route, body)
        if answer.status != 200:
            raise RuntimeError(f"thin front: {route}: {answer.status}")
        found = json.loads(answer.body)
        assert isinstance(found, dict)
        return found

    async def run_true(sid: object) -> float:
        t0 = time.perf_counter()
        done = await call(f"/run/{sid}", b'{"argv": ["true"]}')
        if done["exit_code"] != 0:
            raise RuntimeError(f"true exited {done['exit_code']}")
        return (time.perf_counter() - t0) * 1000

    made = await asyncio.gather(*(call(f"/launch/thin-{k}-{i}") for i in range(n)))
    execs = await asyncio.gather(*(run_true(m["id"]) for m in made))
    await asyncio.gather(*(call(f"/destroy/{m['id']}") for m in made))
    return list(execs)


def _start_thin(repo: Path) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / "_thin_front.py"), str(SCRATCH / "thin"), str(repo)],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        proc.kill()
        raise RuntimeError("the thin front did not start")
    return proc, int(line)


async def _measure(args: argparse.Namespace) -> dict[str, object]:
    from sandhold.client import Client
    from sandhold.client._http import Transport
    from sandhold.port import SandboxPort

    repo = _repo()
    sock = SCRATCH / "server.sock"
    proc, url, token = start_server(SCRATCH, unix=sock)
    thin: subprocess.Popen[bytes] | None = None
    names = ("server_exec", "server_create", "unix_exec", "thin_exec", "lib_exec", "lib_launch")
    rows: dict[str, list[list[float]]] = {k: [] for k in names}
    rss = 0
    try:
        thin, thin_port = _start_thin(repo)  # in here: a front that fails stops the server
        front = Transport(host="127.0.0.1", port=thin_port)
        async with (
            Client(url, token=token) as api,
            Client("http://localhost", token=token, unix=str(sock)) as local,
            SandboxPort() as port,
        ):
            ws = (await api.create_workspace("bench", [str(repo)]))["id"]
            for k in range(args.rounds + 1):  # round 0 warms up
                create, execs = await _server_round(api, ws, args.runs)
                rss = max(rss, _rss_kib(proc.pid))
                _, by_unix = await _server_round(local, ws, args.runs)
                hop = await _thin_round(front, args.runs, k)
                launch, lib = await _library_round(port, repo, args.runs, k)
                if k:
                    rows["server_create"].append(create)
                    rows["server_exec"].append(execs)
                    rows["unix_exec"].append(by_unix)
                    rows["thin_exec"].append(hop)
                    rows["lib_launch"].append(launch)
                    rows["lib_exec"].append(lib)
                _log(
                    f"round {k}: exec p50 server {_pct(execs, 0.5):.1f} ms "
                    f"(unix socket {_pct(by_unix, 0.5):.1f} ms), "
                    f"thin front {_pct(hop, 0.5):.1f} ms, library {_pct(lib, 0.5):.1f} ms"
                )
            await front.aclose()
    finally:
        proc.terminate()
        if thin is not None:
            thin.send_signal(signal.SIGINT)  # its port destroys what is left
            thin.wait(30)
        proc.wait(30)
    summary: dict[str, object] = {}
    for name, rounds in rows.items():
        summary[name] = {
            "p50": statistics.median(_pct(r, 0.5) for r in rounds),
            "p99": statistics.median(_pct(r, 0.99) for r in rounds),
        }
    # the budget's figure: each round's server p50 less the same round's library p50
    # (paired, so that load drifting between rounds cancels), then the median
    summary["added_by_round"] = [
        _pct(srv, 0.5) - _pct(lib, 0.5)
        for srv, lib in zip(rows["server_exec"], rows["lib_exec"], strict=True)
    ]
    summary["server_rss_mib"] = rss / 1024
    summary["samples"] = rows
    return summary


def _report(s: dict[str, object], args: argparse.Namespace) -> str:
    def row(name: str) -> dict[str, float]:
        value = s[name]
        assert isinstance(value, dict)
        return value

    se, ue, te, le = row("server_exec"), row("unix_exec"), row("thin_exec"), row("lib_exec")
    by_round = s["added_by_round"]
    assert isinstance(by_round, list)
    added = statistics.median(by_round)
    hop = te["p50"] - le["p50"]
    p99_ok = se["p99"] <= 250
    added_ok = added <= 10
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    lines = [
        "# sandhold serve: concurrent runs through the API",
        "",
        f"{datetime.date.today()}, commit {commit}, {platform.machine()}, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.1f}; {args.runs} concurrent runs x {args.rounds} rounds "
        "(median over rounds of each round's p50 / p99).",
        "",
        f"Budget: {BUDGET_TEXT}.",
        "",
        "| row | p50 ms | p99 ms |",
        "| --- | ---: | ---: |",
        f"| exec request to exit, through the server | {se['p50']:.1f} | {se['p99']:.1f} |",
        f"| the same over the server's unix socket | {ue['p50']:.1f} | {ue['p99']:.1f} |",
        f"| the same through the thin front (any HTTP hop) | {te['p50']:.1f} | {te['p99']:.1f} |",
        f"| the same, SandboxPort in process | {le['p50']:.1f} | {le['p99']:.1f} |",
        f"| run creation (POST /v1/runs, checkout + launch) | {row('server_create')['p50']:.1f} "
        f"| {row('server_create')['p99']:.1f} |",
        f"| SandboxPort.launch | {row('lib_launch')['p50']:.1f} | {row('lib_launch')['p99']:.1f} |",
        "",
        f"- request-to-exit p99 {se['p99']:.1f} ms: {'PASS' if p99_ok else 'FAIL'} (<= 250 ms)",
        f"- the server adds {added:.1f} ms p50 over the library: "
        f"{'PASS' if added_ok else 'FAIL'} (<= 10 ms; the median of each round's difference, "
        f"which ranged {min(by_round):.1f} to {max(by_round):.1f} ms)",
        f"- over the unix socket the server adds {ue['p50'] - le['p50']:.1f} ms p50",
        f"- one more process and an HTTP round trip (the thin front) "
        f"add {hop:.1f} ms p50 over the library; the server's own share (auth, validation, "
        f"store, events) is the rest: {se['p50'] - te['p50']:.1f} ms",
        f"- server RSS with {args.runs} runs up: {s['server_rss_mib']:.0f} MiB",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    if shutil.which("bwrap") is None:
        _log("bubblewrap is not installed")
        return 2
    try:
        import fastapi  # noqa: F401
        import h11  # noqa: F401
    except ImportError:
        _log("the server extra is not installed (pip install 'sandhold[server]')")
        return 2
    SCRATCH.mkdir(parents=True, exist_ok=True)
    try:
        summary = asyncio.run(_measure(args))
    except Exception as exc:
        _log(f"failed: {exc}")
        return 1
    text = _report(summary, args)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "server.md").write_text(text)
    (RESULTS / "server.json").write_text(json.dumps(summary, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
