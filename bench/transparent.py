"""Measure transparent egress (issue 20) against the explicit proxy and direct loopback, in one run.

Three processes: the upstream (this script with ``--serve-upstream``: an echo
and a download server on the host's 127.0.0.1), sandhold's egress (this
process: an ``EgressSession`` with the transparent listener and the DNS stub,
serving the sockets ``netns.spawn_in_netns`` made in a fresh user and network
namespace, the way the CLI runs them), and the load generator (this script with
``--generate``), run once in that namespace (transparent: a name resolved by
the stub, then a plain connect; explicit: CONNECT through 127.0.0.1:3128) and
once on the host (direct: the upstream's own port).

- Connect latency: sequential fresh connections (connect, one 1-byte echo);
  p50/p99 and the p50 added to direct. Budget: added p50 <= 1 ms.
- Request rate: those connections per second, one at a time.
- Throughput: a download (upstream sends, then closes) on one connection,
  median MB/s over rounds, and the median over rounds of the ratio to direct in
  the same round (rounds interleaved). Budget: >= 0.45 of direct.
- Start-up: ``spawn_in_netns`` running ``/bin/true`` with and without the
  transparent set-up (routes, ruleset, sockets), and the CLI's network row
  (``sandhold -s network.json -- true``) with and without it, each interleaved.
  Budget: <= 10 ms more.

Rules:
- The run is a report: it exits 0 even when a budget is missed, 1 when a path
  fails to carry its bytes, 2 when it cannot run here (not Linux, no libnftables).
- The resolver of the egress session maps the bench's one name to 127.0.0.1 and
  the policy allows it and ``127.0.0.1``; the host's own addresses are not
  guarded (``host_addresses=()``), so nothing but the paths is timed.
- Results go to ``bench/results/transparent.{json,md}``; nothing else is written.

Usage: .venv/bin/python bench/transparent.py [--setups N] [--size-mib N] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
NAME = "up.bench.test"
LATENCY_BUDGET_MS = 1.0
THROUGHPUT_BUDGET = 0.45
STARTUP_BUDGET_MS = 10.0


# -- the upstream -------------------------------------------------------------------


def serve_upstream(ready_fd: int) -> None:
    """Echo server (first byte ``e``) and download server (``d`` + 8-byte size)."""
    server = socket.create_server(("127.0.0.1", 0), backlog=1024)
    os.write(ready_fd, str(server.getsockname()[1]).encode() + b"\n")

    def handle(conn: socket.socket) -> None:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            head = conn.recv(9)
            if head[:1] == b"e":
                conn.sendall(head[1:2] or b"o")
                while data := conn.recv(4096):
                    conn.sendall(data)
            elif head[:1] == b"d":
                while len(head) < 9:
                    head += conn.recv(9 - len(head))
                left = int.from_bytes(head[1:9], "big")
                block = b"\0" * (1 << 20)
                while left > 0:
                    n = conn.send(block[: min(left, len(block))])
                    left -= n

    while True:
        conn, _ = server.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


# -- the load generator ---------------------------------------------------------------


def generate(mode: str, port: int, setups: int, size: int, rounds: int) -> None:
    """Print {"latency_ms": [...], "rate": r, "mbps": [...]} for one path."""
    if mode == "transparent":
        target = (socket.getaddrinfo(NAME, port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0], port)
    else:
        target = ("127.0.0.1", port)

    def connect() -> socket.socket:
        if mode == "explicit":
            s = socket.create_connection(("127.0.0.1", 3128))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                more = s.recv(4096)
                if not more:
                    raise OSError("proxy closed")
                head += more
            if b" 200 " not in head.split(b"\r\n", 1)[0]:
                raise OSError(head.split(b"\r\n", 1)[0].decode())
            return s
        s = socket.create_connection(target)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    latency = []
    start = time.perf_counter()
    for _ in range(setups):
        t = time.perf_counter()
        s = connect()
        s.sendall(b"ex")
        if s.recv(1) != b"x":
            raise OSError("no echo")
        latency.append((time.perf_counter() - t) * 1e3)
        s.close()
    rate = setups / (time.perf_counter() - start)
    mbps = []
    for _ in range(rounds):
        s = connect()
        s.sendall(b"d" + size.to_bytes(8, "big"))
        got = 0
        t = time.perf_counter()
        buf = bytearray(1 << 20)
        while n := s.recv_into(buf):
            got += n
        dt = time.perf_counter() - t
        s.close()
        if got != size:
            raise OSError(f"short download: {got} of {size}")
        mbps.append(size / dt / 1e6)
    print(json.dumps({"latency_ms": latency, "rate": rate, "mbps": mbps}))


# -- sandhold's side ---------------------------------------------------------------------


def _serve_egress(sockets: tuple[socket.socket, socket.socket, object]) -> threading.Event:
    import asyncio

    from sandhold.net.egress import EgressSession
    from sandhold.net.outbound import Resolved
    from sandhold.net.transparent import TransparentEgress
    from sandhold.policy.domains import DomainPolicy
    from sandhold.policy.transparent import SyntheticNames

    http, socks, tr = sockets
    policy = DomainPolicy.for_cli([NAME, "127.0.0.1"])
    stop = threading.Event()

    async def resolve(host: str, port: int) -> Resolved:
        out = Resolved(["127.0.0.1"])
        out.canonical = host
        return out

    async def main() -> None:
        diverted = TransparentEgress(
            tcp=tr.tcp,  # type: ignore[attr-defined]
            dns_udp=tr.dns_udp,  # type: ignore[attr-defined]
            dns_tcp=tr.dns_tcp,  # type: ignore[attr-defined]
            nflog=tr.nflog,  # type: ignore[attr-defined]
            policy=lambda: policy,
            on_decision=None,
            names=SyntheticNames(),
        )
        session = EgressSession(
            http_listener=http,
            socks_listener=socks,
            policy=lambda: policy,
            resolver=resolve,
            host_addresses=(),
            extra_listeners=diverted.listeners(),
        )
        diverted.start()
        async with session:
            while not stop.is_set():
                await asyncio.sleep(0.05)
        await diverted.aclose()

    threading.Thread(target=lambda: asyncio.run(main()), daemon=True).start()
    return stop


def _in_namespace(argv: list[str]) -> tuple[str, threading.Event]:
    from sandhold.backends.linux.netns import spawn_in_netns

    r, w = os.pipe()
    found: list[object] = []
    pid, http, socks = spawn_in_netns(
        sys.executable, argv, dict(os.environ), [], stdio=(0, w, 2), transparent=found
    )
    os.close(w)
    stop = _serve_egress((http, socks, found[0]))
    out = b""
    while chunk := os.read(r, 65536):
        out += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise SystemExit(f"the load generator failed in the namespace (status {status})")
    return out.decode(), stop


def startup(n: int) -> dict[str, float]:
    from sandhold.backends.linux.netns import spawn_in_netns

    def one(transparent: bool) -> float:
        found: list[object] | None = [] if transparent else None
        t = time.perf_counter()
        pid, http, socks = spawn_in_netns("/bin/true", ["true"], {}, [], transparent=found)  # type: ignore[arg-type]
        os.waitpid(pid, 0)
        dt = (time.perf_counter() - t) * 1e3
        http.close()
        socks.close()
        for sock in found[0].all() if found else ():  # type: ignore[attr-defined]
            sock.close()
        return dt

    off, on = [], []
    for i in range(n):
        for transparent in (i % 2 == 0, i % 2 == 1):
            (on if transparent else off).append(one(transparent))
    return {"off_p50_ms": statistics.median(off), "on_p50_ms": statistics.median(on)}


_CLI_OFF = (
    "import sandhold.backends.linux.netns as n; o = n.spawn_in_netns; "
    "n.spawn_in_netns = lambda *a, transparent=None, **k: o(*a, **k); "
)
_CLI_RUN = (
    "import sys; from sandhold.cli import main; "
    "sys.argv = ['sandhold', *sys.argv[1:]]; sys.exit(main())"
)


def cli_row(n: int) -> dict[str, float]:
    """The CLI's network row (``sandhold -s network.json -- true``) with and without
    transparent egress (without: the namespace helper is asked for no transparent
    set-up, everything else equal), interleaved."""
    settings = RESULTS.parent / ".scratch" / "transparent-network.json"
    settings.parent.mkdir(exist_ok=True)
    settings.write_text(json.dumps({"network": {"allowedDomains": ["example.com"]}}))

    def one(prefix: str) -> tuple[float, float]:
        argv = [sys.executable, "-P", "-c", prefix + _CLI_RUN, "-s", str(settings), "--", "true"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(argv, check=True, cwd="/")
        wall = (time.perf_counter() - t) * 1e3
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        return wall, cpu * 1e3

    for _ in range(3):
        one("")
        one(_CLI_OFF)
    off: list[tuple[float, float]] = []
    on: list[tuple[float, float]] = []
    for i in range(n):
        for transparent in (i % 2 == 0, i % 2 == 1):
            (on if transparent else off).append(one("" if transparent else _CLI_OFF))
    out = {}
    for label, runs in (("off", off), ("on", on)):
        out[f"{label}_p50_ms"] = statistics.median(w for w, _ in runs)
        out[f"{label}_min_ms"] = min(w for w, _ in runs)
        out[f"{label}_cpu_p50_ms"] = statistics.median(c for _, c in runs)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--setups", type=int, default=1000)
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--startups", type=int, default=40)
    parser.add_argument("--cli-runs", type=int, default=30)
    parser.add_argument("--serve-upstream", type=int, metavar="FD", help=argparse.SUPPRESS)
    parser.add_argument("--generate", nargs=2, metavar=("MODE", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream is not None:
        serve_upstream(args.serve_upstream)
        return 0
    size = args.size_mib << 20
    if args.generate:
        generate(args.generate[0], int(args.generate[1]), args.setups, size, args.rounds)
        return 0
    if not sys.platform.startswith("linux"):
        print("bench/transparent.py: Linux only", file=sys.stderr)
        return 2
    r, w = os.pipe()
    upstream = subprocess.Popen(
        [sys.executable, __file__, "--serve-upstream", str(w)], pass_fds=(w,)
    )
    os.close(w)
    port = int(os.fdopen(r).readline())
    rows: dict[str, dict[str, object]] = {}
    modes = ("direct", "explicit", "transparent")
    samples: dict[str, dict[str, list[float]]] = {
        m: {"latency_ms": [], "rate": [], "mbps": []} for m in modes
    }
    try:
        per_round = max(1, args.setups // args.rounds)
        common = ["--setups", str(per_round), "--size-mib", str(args.size_mib), "--rounds", "1"]
        # rounds interleaved, the starting path rotating, so that the machine's load
        # (it is shared) hits every path alike; ratios are taken within a round
        for r in range(args.rounds):
            for mode in modes[r % 3 :] + modes[: r % 3]:
                argv = [sys.executable, __file__, *common, "--generate", mode, str(port)]
                if mode == "direct":
                    text = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
                else:
                    try:
                        text, stop = _in_namespace(argv)
                    except OSError as exc:
                        print(f"bench/transparent.py: cannot run here: {exc}", file=sys.stderr)
                        return 2
                    stop.set()
                data = json.loads(text)
                samples[mode]["latency_ms"] += data["latency_ms"]
                samples[mode]["rate"].append(data["rate"])
                samples[mode]["mbps"] += data["mbps"]
        for mode in modes:
            lat = sorted(samples[mode]["latency_ms"])
            ratios = [
                a / b for a, b in zip(samples[mode]["mbps"], samples["direct"]["mbps"], strict=True)
            ]
            rows[mode] = {
                "p50_ms": statistics.median(lat),
                "p99_ms": lat[max(0, int(len(lat) * 0.99) - 1)],
                "rate_per_s": statistics.median(samples[mode]["rate"]),
                "mbps": statistics.median(samples[mode]["mbps"]),
                "of_direct": statistics.median(ratios),
            }
        rows["startup"] = startup(args.startups)
        rows["cli"] = cli_row(args.cli_runs)
    finally:
        upstream.kill()
        upstream.wait()
    direct = rows["direct"]
    lines = [
        "# transparent egress vs the explicit proxy vs direct loopback (bench/transparent.py)",
        "",
        f"{platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()} · "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}",
        "",
        "| path | connect p50 | p99 | added p50 | connections/s | throughput | of direct |",
        "|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for mode in ("direct", "explicit", "transparent"):
        row = rows[mode]
        added = float(row["p50_ms"]) - float(direct["p50_ms"])  # type: ignore[arg-type]
        ratio = float(row["of_direct"])  # type: ignore[arg-type]
        lines.append(
            f"| {mode} | {row['p50_ms']:.3f} ms | {row['p99_ms']:.3f} ms | {added:+.3f} ms |"
            f" {row['rate_per_s']:.0f} | {row['mbps']:.0f} MB/s | {ratio:.2f} |"
        )
        if mode == "transparent":
            verdicts.append(
                f"added p50 {added:.3f} ms (budget {LATENCY_BUDGET_MS} ms): "
                + ("ok" if added <= LATENCY_BUDGET_MS else "MISSED")
            )
            verdicts.append(
                f"throughput {ratio:.3f} of direct (budget {THROUGHPUT_BUDGET}): "
                + ("ok" if ratio >= THROUGHPUT_BUDGET else "MISSED")
            )
    st = rows["startup"]
    more = float(st["on_p50_ms"]) - float(st["off_p50_ms"])  # type: ignore[arg-type]
    lines += [
        "",
        f"start-up (`spawn_in_netns` of /bin/true, p50 of {args.startups}): "
        f"{st['off_p50_ms']:.2f} ms without, {st['on_p50_ms']:.2f} ms with transparent egress",
        "",
    ]
    cli = rows["cli"]
    cli_min = float(cli["on_min_ms"]) - float(cli["off_min_ms"])  # type: ignore[arg-type]
    cli_cpu = float(cli["on_cpu_p50_ms"]) - float(cli["off_cpu_p50_ms"])  # type: ignore[arg-type]
    cli_p50 = float(cli["on_p50_ms"]) - float(cli["off_p50_ms"])  # type: ignore[arg-type]
    lines += [
        f"CLI network row (`sandhold -s network.json -- true`, {args.cli_runs} runs each,"
        " interleaved): without / with transparent egress, wall p50"
        f" {cli['off_p50_ms']:.1f} / {cli['on_p50_ms']:.1f} ms ({cli_p50:+.1f}), wall min"
        f" {cli['off_min_ms']:.1f} / {cli['on_min_ms']:.1f} ms ({cli_min:+.1f}), CPU p50"
        f" {cli['off_cpu_p50_ms']:.1f} / {cli['on_cpu_p50_ms']:.1f} ms ({cli_cpu:+.1f});"
        f" load average {os.getloadavg()[0]:.1f} (a shared machine: wall p50 is noise"
        " there, min and CPU are not)",
        "",
    ]
    verdicts.append(
        f"namespace set-up +{more:.2f} ms, CLI network row {cli_min:+.1f} ms (wall min),"
        f" {cli_cpu:+.1f} ms (CPU) (budget {STARTUP_BUDGET_MS} ms): "
        + ("ok" if max(more, cli_min, cli_cpu) <= STARTUP_BUDGET_MS else "MISSED")
    )
    lines += [f"- {v}" for v in verdicts]
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "transparent.md").write_text(text)
    (RESULTS / "transparent.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
