"""Measure the egress proxy: tunnel throughput, CONNECT set-up latency, memory of open tunnels.

Each figure is measured side by side in one run for a direct loopback
connection (the floor), sandhold's HTTP proxy and, when it is installed, srt's.
Three kinds of process never share a CPU account: the upstream servers (this
script with ``--serve-upstream``), each proxy under test (this script with
``--serve-sandhold``, given listening sockets the way the sandbox's namespace
helper gives them; srt's ``createHttpProxyServer`` run by node), and the load
generator (this process).

- Throughput: a 1 GiB download (upstream sends, then closes) through a CONNECT
  tunnel and directly, rounds interleaved; median MB/s, the median over rounds
  of the ratio to direct in the same round, and the proxy's CPU seconds per
  GiB. Budget: >= 45% of direct on 2 cores.
- Set-up latency: 2,000 sequential tunnels each (connect, CONNECT, 200, one
  1-byte echo) against 2,000 direct connections (connect, one 1-byte echo),
  interleaved in blocks; p50/p99 and the added latency. Budget: p50 added <= 1 ms.
- Open tunnels: 1,000 tunnels held at once (each checked with an echo) and the
  proxy's whole process tree's PSS (``/proc/<pid>/smaps_rollup``) before and
  while they are open. Budget: <= 100 MiB.

Rules:
- The run is a report: it exits 0 even when a budget is missed. It exits 1 when
  sandhold's proxy cannot carry a download whole (a short byte count), and 2 when
  the bench cannot run here (no venv, not Linux).
- srt is optional: used when ``bench/.scratch/npm`` holds
  ``@anthropic-ai/sandbox-runtime`` and node is on PATH (install it with
  ``bench/cli_overhead.py --install-references``); otherwise its rows say why.
  srt's proxy is run with a filter that allows everything; in real use srt adds
  socat bridges in front of it, which this bench does not count.
- Targets are the IP literal 127.0.0.1 for every proxy, so no resolver is timed
  (sandhold's policy allows ``127.0.0.1`` as an IP entry).
- Only the standard library; sandhold itself is imported only in its proxy process.
  Nothing outside ``bench/.scratch/`` and ``bench/results/`` is written.

Usage: .venv/bin/python bench/proxy.py [--rounds N] [--size-mib N] [--setups N] [--tunnels N]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SCRATCH = BENCH / ".scratch" / "proxy"
RESULTS = BENCH / "results"
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
SRT_DIST = (
    BENCH / ".scratch" / "npm" / "node_modules" / "@anthropic-ai" / "sandbox-runtime" / "dist"
)

DEFAULT_ROUNDS = 7
DEFAULT_SIZE_MIB = 1024
DEFAULT_SETUPS = 2000
DEFAULT_TUNNELS = 1000
WARMUP_SETUPS = 50
SETUP_BLOCK = 100  # set-ups per block; blocks rotate between the rows
BUDGET_RATIO = 0.45
BUDGET_ADDED_P50_MS = 1.0
BUDGET_PSS_MIB = 100.0
BUDGET_TEXT = (
    "tunnel throughput >= 45% of direct loopback on 2 cores (reference: 10-24%); "
    "p50 added CONNECT set-up <= 1 ms; 1,000 open tunnels with the proxy's whole process "
    "tree <= 100 MiB PSS (reference: ~250 MiB in socat processes plus node)"
)
TIMEOUT_S = 120.0

SRT_SCRIPT = """\
// srt's HTTP proxy alone, through its library module: allow everything, print the port.
const { createHttpProxyServer } = await import(process.argv[2] + "/sandbox/http-proxy.js");
const server = createHttpProxyServer({ filter: async () => true });
server.listen(0, "127.0.0.1", () => console.log(server.address().port));
"""


def _log(message: str) -> None:
    sys.stderr.write(f"proxy bench: {message}\n")
    sys.stderr.flush()


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# --- the processes under test ------------------------------------------------------


def serve_upstream(size: int) -> None:
    """Upstream servers: a blob port (send ``size`` bytes, close) and an echo port."""
    _raise_fd_limit()
    block = memoryview(os.urandom(1 << 20))
    blob = socket.create_server(("127.0.0.1", 0), backlog=1024)

    def send_blob(conn: socket.socket) -> None:
        with conn:
            left = size
            try:
                while left:
                    n = min(left, len(block))
                    conn.sendall(block[:n])
                    left -= n
            except OSError:
                pass

    def blob_loop() -> None:
        while True:
            conn, _ = blob.accept()
            threading.Thread(target=send_blob, args=(conn,), daemon=True).start()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(echo, "127.0.0.1", 0, backlog=4096)
        echo_port = server.sockets[0].getsockname()[1]
        threading.Thread(target=blob_loop, daemon=True).start()
        print(blob.getsockname()[1], echo_port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    asyncio.run(main())


def serve_sandhold(http_fd: int, socks_fd: int) -> None:
    """sandhold's proxies on listeners handed over as file descriptors."""
    _raise_fd_limit()
    from sandhold.net.egress import EgressSession
    from sandhold.policy.domains import DomainPolicy

    async def main() -> None:
        policy = DomainPolicy.for_cli(["127.0.0.1"])
        session = EgressSession(
            http_listener=socket.socket(fileno=http_fd),
            socks_listener=socket.socket(fileno=socks_fd),
            policy=lambda: policy,
            host_addresses=(),
            max_connections=8192,
        )
        async with session:
            print("ready", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    asyncio.run(main())


class Child:
    """A process of the bench, stopped by closing its stdin (it inherits our fd limit)."""

    def __init__(self, argv: list[str], env: dict[str, str], pass_fds: tuple[int, ...] = ()):
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            pass_fds=pass_fds,
            text=True,
        )
        assert self.proc.stdout is not None
        self.first_line = self.proc.stdout.readline().strip()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _child_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO / "src")}


def start_sandhold() -> tuple[Child, int]:
    http_l = socket.create_server(("127.0.0.1", 0), backlog=4096)
    socks_l = socket.create_server(("127.0.0.1", 0), backlog=128)
    port = http_l.getsockname()[1]
    child = Child(
        [sys.executable, __file__, "--serve-sandhold", str(http_l.fileno()), str(socks_l.fileno())],
        _child_env(),
        pass_fds=(http_l.fileno(), socks_l.fileno()),
    )
    http_l.close()  # the proxy process owns the listeners now
    socks_l.close()
    if child.first_line != "ready":
        raise RuntimeError(f"sandhold's proxy did not start (said {child.first_line!r})")
    return child, port


def start_srt() -> tuple[Child | None, int, str]:
    """srt's HTTP proxy, or ``(None, 0, why not)``."""
    node = shutil.which("node")
    if node is None:
        return None, 0, "node not found"
    if not (SRT_DIST / "sandbox" / "http-proxy.js").exists():
        return None, 0, f"not installed ({SRT_DIST.parent} missing; see cli_overhead.py)"
    SCRATCH.mkdir(parents=True, exist_ok=True)
    script = SCRATCH / "srt_http_proxy.mjs"
    script.write_text(SRT_SCRIPT)
    child = Child([node, str(script), str(SRT_DIST)], {"PATH": os.environ.get("PATH", "")})
    if not child.first_line.isdigit():
        child.stop()
        return None, 0, f"its proxy did not start (said {child.first_line!r})"
    return child, int(child.first_line), ""


# --- the load generator --------------------------------------------------------------


def _open(proxy_port: int | None, target_port: int) -> tuple[socket.socket, bytes]:
    """A socket to 127.0.0.1:target_port, directly or through a CONNECT tunnel.

    Also returns the tunnel's first bytes if they came with the CONNECT answer.
    """
    if proxy_port is None:
        return socket.create_connection(("127.0.0.1", target_port), timeout=TIMEOUT_S), b""
    s = socket.create_connection(("127.0.0.1", proxy_port), timeout=TIMEOUT_S)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(
        b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (target_port, target_port)
    )
    head = b""
    while b"\r\n\r\n" not in head:
        data = s.recv(4096)
        if not data:
            raise ConnectionError(f"proxy closed during CONNECT: {head!r}")
        head += data
    if not head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
        raise ConnectionError(f"CONNECT refused: {head.splitlines()[0]!r}")
    return s, head.partition(b"\r\n\r\n")[2]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def download(
    proxy_port: int | None, blob_port: int, size: int, pid: int | None
) -> dict[str, float]:
    buf = memoryview(bytearray(1 << 20))
    cpu0 = _cpu_seconds(pid) if pid else 0.0
    started = time.perf_counter()
    s, first = _open(proxy_port, blob_port)
    with s:
        got = len(first)
        while n := s.recv_into(buf):
            got += n
    elapsed = time.perf_counter() - started
    cpu = (_cpu_seconds(pid) - cpu0) if pid else 0.0
    return {"bytes": got, "seconds": elapsed, "mb_s": got / elapsed / 1e6, "cpu_s": cpu}


def setup_once(proxy_port: int | None, echo_port: int) -> float:
    started = time.perf_counter()
    s, _ = _open(proxy_port, echo_port)
    with s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"x")
        if s.recv(1) != b"x":
            raise ConnectionError("echo failed")
        elapsed = time.perf_counter() - started
    return elapsed * 1000.0


def _tree(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, []))
    return out


def pss_mib(pid: int) -> float:
    """PSS of ``pid`` and all its descendants, in MiB."""
    total_kib = 0
    for p in _tree(pid):
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kib += int(line.split()[1])
        except OSError:
            continue
    return total_kib / 1024.0


def hold_tunnels(proxy_port: int, echo_port: int, count: int, pid: int) -> dict[str, Any]:
    idle = pss_mib(pid)
    held: list[socket.socket] = []
    started = time.perf_counter()
    try:
        for _ in range(count):
            s, _ = _open(proxy_port, echo_port)
            s.sendall(b"k")
            if s.recv(1) != b"k":
                raise ConnectionError("echo failed")
            held.append(s)
        opened_s = time.perf_counter() - started
        time.sleep(0.5)  # let the proxy settle before reading its memory
        loaded = pss_mib(pid)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    finally:
        for s in held:
            s.close()
    return {"tunnels": count, "pss_idle_mib": idle, "pss_mib": loaded, "fds": fds,
            "open_s": opened_s}  # fmt: skip


# --- one run ------------------------------------------------------------------------------


class Row:
    def __init__(self, name: str, port: int | None, pid: int | None, why_not: str = "") -> None:
        self.name, self.port, self.pid, self.why_not = name, port, pid, why_not
        self.downloads: list[dict[str, float]] = []
        self.setups_ms: list[float] = []
        self.tunnels: dict[str, Any] | None = None
        self.errors: list[str] = []

    @property
    def runnable(self) -> bool:
        return not self.why_not


def measure(rows: list[Row], blob: int, echo: int, args: argparse.Namespace) -> None:
    size = args.size_mib << 20
    active = [r for r in rows if r.runnable]
    for i in range(args.rounds):
        shift = i % len(active)
        for row in active[shift:] + active[:shift]:
            try:
                result = download(row.port, blob, size, row.pid)
            except OSError as exc:
                row.errors.append(f"download: {exc}")
                continue
            row.downloads.append(result)
            if result["bytes"] != size:
                row.errors.append(f"download short: {int(result['bytes'])} of {size} bytes")
        _log(f"throughput round {i + 1}/{args.rounds}")
    for row in active:
        for _ in range(WARMUP_SETUPS):
            setup_once(row.port, echo)
    blocks = max(1, args.setups // SETUP_BLOCK)
    for b in range(blocks):
        shift = b % len(active)
        for row in active[shift:] + active[:shift]:
            for _ in range(min(SETUP_BLOCK, args.setups)):
                try:
                    row.setups_ms.append(setup_once(row.port, echo))
                except OSError as exc:
                    row.errors.append(f"set-up: {exc}")
        if (b + 1) % 5 == 0 or b + 1 == blocks:
            _log(f"set-up block {b + 1}/{blocks}")
    for row in active:
        if row.port is None or row.pid is None:
            continue
        try:
            row.tunnels = hold_tunnels(row.port, echo, args.tunnels, row.pid)
        except OSError as exc:
            row.errors.append(f"holding {args.tunnels} tunnels: {exc}")
        _log(f"{row.name}: {args.tunnels} tunnels measured")


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(rows: list[Row]) -> dict[str, Any]:
    direct = rows[0]
    direct_mb = [d["mb_s"] for d in direct.downloads]
    d50 = _pct(direct.setups_ms, 0.5) if direct.setups_ms else 0.0
    d99 = _pct(direct.setups_ms, 0.99) if direct.setups_ms else 0.0
    out: dict[str, Any] = {}
    for row in rows:
        s: dict[str, Any] = {"why_not": row.why_not, "errors": row.errors[:10]}
        if row.downloads:
            mbs = [d["mb_s"] for d in row.downloads]
            s["mb_s_median"] = statistics.median(mbs)
            s["mb_s_min"], s["mb_s_max"] = min(mbs), max(mbs)
            # per round, against direct in the same round: drift in the machine's
            # load hits both sides of each ratio alike
            ratios = [m / d for m, d in zip(mbs, direct_mb, strict=False) if d]
            s["ratio"] = statistics.median(ratios) if ratios else None
            gib = [d["bytes"] / (1 << 30) for d in row.downloads]
            s["cpu_s_per_gib"] = (
                statistics.median(d["cpu_s"] / g for d, g in zip(row.downloads, gib, strict=True))
                if row.pid
                else None
            )
        if row.setups_ms:
            s["setup_p50_ms"] = _pct(row.setups_ms, 0.5)
            s["setup_p99_ms"] = _pct(row.setups_ms, 0.99)
            s["added_p50_ms"] = s["setup_p50_ms"] - d50
            s["added_p99_ms"] = s["setup_p99_ms"] - d99
        if row.tunnels is not None:
            s.update(row.tunnels)
        out[row.name] = s
    return out


def _verdicts(s: dict[str, Any]) -> list[str]:
    out = []
    if s.get("ratio") is not None:
        out.append(f"throughput {'PASS' if s['ratio'] >= BUDGET_RATIO else 'FAIL'}")
    if "added_p50_ms" in s:
        out.append(f"set-up {'PASS' if s['added_p50_ms'] <= BUDGET_ADDED_P50_MS else 'FAIL'}")
    if "pss_mib" in s:
        out.append(f"memory {'PASS' if s['pss_mib'] <= BUDGET_PSS_MIB else 'FAIL'}")
    return out


# --- reporting ---------------------------------------------------------------------------


def _version(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    text = (proc.stdout or proc.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _machine() -> dict[str, str]:
    commit = _version(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "src"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    cpu = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "kernel": platform.release(),
        "nproc": str(len(os.sched_getaffinity(0))),
        "cpu": cpu,
        "python": platform.python_version(),
        "sandhold": f"{REPO.name}@{commit}" + (" (src/ modified)" if dirty else ""),
    }
    node = shutil.which("node")
    if node:
        info["node"] = _version([node, "--version"])
    pkg = SRT_DIST.parent / "package.json"
    if pkg.exists():
        info["srt"] = json.loads(pkg.read_text()).get("version", "?")
    return info


def _f(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(summary: dict[str, Any], machine: dict[str, str], args: argparse.Namespace) -> str:
    lines = [
        "# sandhold egress proxy: throughput, set-up latency, open tunnels",
        "",
        f"Run by `bench/proxy.py` on {machine['date']}: {args.rounds} interleaved rounds of a "
        f"{args.size_mib} MiB download; {args.setups} sequential set-ups per row after "
        f"{WARMUP_SETUPS} warm-up ones; {args.tunnels} tunnels held at once.",
        "",
        "- " + "; ".join(f"{k}: {v}" for k, v in machine.items() if k != "date"),
        f"- budget (from the issue): {BUDGET_TEXT}",
        "",
        "| path | MB/s (median) | min-max | x direct | proxy CPU s/GiB | set-up p50 ms "
        "| p99 ms | added p50 | added p99 | PSS idle MiB | PSS with tunnels | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, s in summary.items():
        if s["why_not"]:
            lines.append(f"| {name} | " + " | ".join(["-"] * 10) + f" | {s['why_not']} |")
            continue
        verdict = ", ".join(_verdicts(s)) if name.startswith("sandhold") else (
            "floor" if name.startswith("direct") else "reference")  # fmt: skip
        if s["errors"]:
            verdict += f"; errors: {s['errors'][0]}"
        cells = [
            name,
            _f(s.get("mb_s_median"), ".0f"),
            f"{_f(s.get('mb_s_min'), '.0f')}-{_f(s.get('mb_s_max'), '.0f')}",
            _f(s.get("ratio"), ".2f"),
            _f(s.get("cpu_s_per_gib"), ".2f"),
            _f(s.get("setup_p50_ms"), ".3f"),
            _f(s.get("setup_p99_ms"), ".3f"),
            _f(s.get("added_p50_ms"), ".3f"),
            _f(s.get("added_p99_ms"), ".3f"),
            _f(s.get("pss_idle_mib"), ".1f"),
            _f(s.get("pss_mib"), ".1f"),
            verdict,
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += [
        "",
        "Direct is a Python client reading from a Python server over loopback; the tunnel "
        "rows put the proxy process between them (three busy processes on the machine's "
        "cores). Set-up is connect to echo reply: for tunnels connect, CONNECT, 200, then a "
        "1-byte echo; `added` is the row's percentile minus direct's. PSS counts the proxy's "
        "whole process tree while the tunnels are open and idle. srt runs its "
        "`createHttpProxyServer` alone (no socat bridges). Raw samples: `proxy.json`.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--size-mib", type=int, default=DEFAULT_SIZE_MIB)
    parser.add_argument("--setups", type=int, default=DEFAULT_SETUPS)
    parser.add_argument("--tunnels", type=int, default=DEFAULT_TUNNELS)
    parser.add_argument("--serve-upstream", type=int, metavar="SIZE", help=argparse.SUPPRESS)
    parser.add_argument("--serve-sandhold", nargs=2, type=int, metavar="FD", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_upstream is not None:
        serve_upstream(args.serve_upstream)
        return 0
    if args.serve_sandhold is not None:
        serve_sandhold(*args.serve_sandhold)
        return 0
    if not sys.platform.startswith("linux"):
        _log("this bench reads /proc: Linux only")
        return 2
    if not os.access(VENV_PYTHON, os.X_OK):
        _log(f"{VENV_PYTHON} not found: run scripts/setup --test first")
        return 2
    _raise_fd_limit()

    size = args.size_mib << 20
    load_before = _loadavg()  # other work on the machine skews a 2-core run: it goes in the report
    upstream = Child([sys.executable, __file__, "--serve-upstream", str(size)], _child_env())
    blob, echo = (int(p) for p in upstream.first_line.split())
    children = [upstream]
    try:
        sandhold, sandhold_port = start_sandhold()
        children.append(sandhold)
        rows = [Row("direct (loopback)", None, None), Row("sandhold", sandhold_port, sandhold.pid)]
        srt, srt_port, why_not = start_srt()
        if srt is not None:
            children.append(srt)
        rows.append(Row(f"srt {_machine().get('srt', '')}".strip(), srt_port or None,
                        srt.pid if srt else None, why_not))  # fmt: skip
        measure(rows, blob, echo, args)
    finally:
        for child in reversed(children):
            child.stop()

    machine = _machine()
    machine["loadavg before/after"] = f"{load_before} / {_loadavg()}"
    summary = summarize(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = render(summary, machine, args)
    (RESULTS / "proxy.md").write_text(report)
    raw = {
        row.name: {
            "downloads": row.downloads,
            "setups_ms": [round(x, 4) for x in row.setups_ms],
            "tunnels": row.tunnels,
            "errors": row.errors,
        }
        for row in rows
    }
    data = {
        "machine": machine,
        "method": {
            "rounds": args.rounds,
            "size_bytes": size,
            "setups": args.setups,
            "warmup_setups": WARMUP_SETUPS,
            "tunnels": args.tunnels,
            "timer": "time.perf_counter",
        },
        "budget": {
            "text": BUDGET_TEXT,
            "throughput_ratio": BUDGET_RATIO,
            "added_p50_ms": BUDGET_ADDED_P50_MS,
            "pss_mib": BUDGET_PSS_MIB,
        },
        "summary": summary,
        "raw": raw,
    }
    (RESULTS / "proxy.json").write_text(json.dumps(data, indent=2) + "\n")
    sys.stdout.write(report)
    short = [e for e in rows[1].errors if e.startswith("download")]
    if short or not rows[1].downloads:
        _log(f"sandhold's proxy failed to carry a download: {short[:1]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
