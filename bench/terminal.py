"""Measure hosted terminals: keystroke-to-echo latency and output throughput.

Through ``sandhold serve`` (a ``none`` terminal, over a real WebSocket on
127.0.0.1), against the same shell on a PTY this process opens and reads
directly, in the same run:

- echo: one byte written, until its echo is read back (``stty raw -echo`` off:
  the PTY's own echo), p50 and p99 of N keystrokes;
- throughput: ``head -c SIZE /dev/zero`` in the shell, bytes read until a marker.

Rules:
- Budgets: p50 echo <= 5 ms over the direct PTY; throughput >= 50 MB/s.
- The run is a report: exit 0 even when a budget is missed, 1 when something fails,
  2 when it cannot run here (no server extra).
- Nothing is written outside ``bench/.scratch/`` and ``bench/results/``.

Usage: .venv/bin/python bench/terminal.py [--keys N] [--mib N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import pty
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SCRATCH = BENCH / ".scratch" / "terminal"
RESULTS = BENCH / "results"
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(BENCH))

from _serve import start_server  # noqa: E402

SHELL = ["/bin/bash", "--norc", "--noprofile", "-i"]


def _pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p * (len(ordered) - 1) + 0.5))]


def _direct(keys: int, size: int) -> tuple[list[float], float]:
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(SHELL[0], SHELL)

    def read_until(marker: bytes, limit: float = 30) -> int:
        got, buf = 0, b""
        deadline = time.monotonic() + limit
        while marker not in buf:
            if not select.select([fd], [], [], max(deadline - time.monotonic(), 0))[0]:
                raise RuntimeError("the direct shell stopped answering")
            chunk = os.read(fd, 1 << 16)
            got += len(chunk)
            buf = (buf + chunk)[-64:]
        return got

    os.write(fd, b"echo rea''dy\r")
    read_until(b"ready")
    samples = []
    for _ in range(keys):
        t0 = time.perf_counter()
        os.write(fd, b"x")
        read_until(b"x")
        samples.append((time.perf_counter() - t0) * 1000)
    os.write(fd, b"\x15")  # ^U: drop the typed line
    t0 = time.perf_counter()
    os.write(fd, f"head -c {size} /dev/zero | tr '\\0' a; echo; echo do''ne\r".encode())
    got = read_until(b"done")
    mbps = got / (time.perf_counter() - t0) / 1e6
    os.write(fd, b"exit\r")
    os.waitpid(pid, 0)
    return samples, mbps


def _served(keys: int, size: int) -> tuple[list[float], float]:
    import httpx
    from websockets.sync.client import connect

    proc, url, token = start_server(SCRATCH)
    try:
        with httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"}) as api:
            term = api.post("/v1/terminals", json={"cols": 80, "rows": 24, "shell": SHELL}).json()
            ticket = api.post(f"/v1/terminals/{term['id']}/ticket").json()["ticket"]
        ws_url = url.replace("http://", "ws://") + f"/v1/terminals/{term['id']}/ws?ticket={ticket}"
        with connect(ws_url, max_size=None) as ws:

            def read_until(marker: bytes) -> int:
                got, buf = 0, b""
                while marker not in buf:
                    msg = ws.recv(timeout=30)
                    if isinstance(msg, str):
                        continue
                    got += len(msg)
                    buf = (buf + msg)[-64:]
                return got

            ws.send(b"echo rea''dy\r")
            read_until(b"ready")
            samples = []
            for _ in range(keys):
                t0 = time.perf_counter()
                ws.send(b"x")
                read_until(b"x")
                samples.append((time.perf_counter() - t0) * 1000)
            ws.send(b"\x15")
            t0 = time.perf_counter()
            ws.send(f"head -c {size} /dev/zero | tr '\\0' a; echo; echo do''ne\r".encode())
            got = read_until(b"done")
            mbps = got / (time.perf_counter() - t0) / 1e6
    finally:
        proc.terminate()
        proc.wait(30)
    return samples, mbps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=300)
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    try:
        import httpx  # noqa: F401
        import websockets  # noqa: F401
    except ImportError:
        sys.stderr.write("terminal bench: the server extra is not installed\n")
        return 2
    SCRATCH.mkdir(parents=True, exist_ok=True)
    size = args.mib << 20
    try:
        d_echo, d_mbps = _direct(args.keys, size)
        s_echo, s_mbps = _served(args.keys, size)
    except Exception as exc:
        sys.stderr.write(f"terminal bench: failed: {exc}\n")
        return 1
    added = statistics.median(s_echo) - statistics.median(d_echo)
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    lines = [
        "# Hosted terminals: echo latency and throughput",
        "",
        f"{datetime.date.today()}, commit {commit}, {platform.machine()}, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.1f}; {args.keys} keystrokes, {args.mib} MiB of output.",
        "",
        "| row | echo p50 ms | echo p99 ms | throughput MB/s |",
        "| --- | ---: | ---: | ---: |",
        f"| through sandhold serve (WebSocket) | {statistics.median(s_echo):.2f} | "
        f"{_pct(s_echo, 0.99):.2f} | {s_mbps:.0f} |",
        f"| the same shell on a PTY read directly | {statistics.median(d_echo):.2f} | "
        f"{_pct(d_echo, 0.99):.2f} | {d_mbps:.0f} |",
        "",
        f"- echo adds {added:.2f} ms p50 over the direct PTY: "
        f"{'PASS' if added <= 5 else 'FAIL'} (<= 5 ms)",
        f"- throughput {s_mbps:.0f} MB/s: {'PASS' if s_mbps >= 50 else 'FAIL'} (>= 50 MB/s)",
        "",
    ]
    text = "\n".join(lines)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "terminal.md").write_text(text)
    (RESULTS / "terminal.json").write_text(
        json.dumps(
            {
                "served_echo_ms": s_echo,
                "direct_echo_ms": d_echo,
                "served_mbps": s_mbps,
                "direct_mbps": d_mbps,
            }
        )
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
