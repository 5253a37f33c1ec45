"""Port-launched sandboxes reach the network only through their own proxies (issue 4; SPEC §5).

Each scenario runs a ``SandboxPort`` as the test's identity (root, then an
unprivileged user) through ``portdriver.drive``. The upstream is a plain HTTP
server on the host's 127.0.0.1 that answers with the name it was asked for, and
the test names map to 127.0.0.1 in the host's /etc/hosts, which the proxies'
resolver reads (the approach of ``test_egress_sandbox.py``). Because those
names resolve to loopback, the resolved-address guard refuses them unless
``127.0.0.1`` is itself allowed, so the allowlists below name it.
"""

from __future__ import annotations

import selectors
import socket
import subprocess
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import World
from localnet import echo_server, mapped_names
from portdriver import drive

MARK = "# sandhold-port-egress-tests"
NAMES = ("allowed.port.test", "denied.port.test", *(f"p{i}.port.test" for i in range(20)))


@pytest.fixture(scope="session")
def port_test_names() -> Iterator[None]:
    """Map the test names to 127.0.0.1 in /etc/hosts (only our own marked lines)."""
    with mapped_names(NAMES, MARK):
        yield


@pytest.fixture(scope="session")
def upstream(port_test_names: None) -> Iterator[int]:
    with echo_server() as port:
        yield port


HELPERS = """
import json as _json

def allow(*names):
    return (*names, "127.0.0.1")

async def collect(execution):
    return [e async for e in execution]

def watch(port, handle):
    seen = []
    async def run():
        async for e in port.events(handle):
            seen.append(e)
    return seen, asyncio.get_running_loop().create_task(run())

def violations(events):
    return [
        [e.exec_id, e.violation.action, e.violation.target, e.violation.rule,
         _json.loads(e.violation.raw)]
        for e in events if e.type == "violation"
    ]
"""


def _drive(world: World, upstream: int, body: str, timeout: float = 120) -> dict[str, Any]:
    code = HELPERS + textwrap.dedent(body).replace("UPSTREAM", str(upstream))
    return drive(world, code, timeout=timeout)


def test_allowed_is_reached_and_refusals_are_violations_of_the_right_exec(
    world: World, upstream: int
) -> None:
    out = _drive(
        world,
        upstream,
        """
        async def main(port):
            h = await port.launch(spec(egress_allowlist=allow("allowed.port.test")))
            OUT["network"] = h.detail("network")
            OUT["explain"] = port.explain(spec(egress_allowlist=allow("allowed.port.test")))
            seen, task = watch(port, h)
            ok = await port.run(h, ["curl", "-sS", "-m", "10", "http://allowed.port.test:UPSTREAM/"])
            OUT["ok"] = [ok.exit_code, ok.stdout.decode(), ok.stderr.decode()]
            # Two refusals at once from two execs: one by a child of the exec's shell
            # through the HTTP proxy, one through SOCKS5; a third exec stays quiet.
            quiet = await port.exec(h, ["sleep", "1"])
            a = await port.exec(h, ["sh", "-c",
                "sleep 0.2; curl -sS -i -m 10 http://denied.port.test:UPSTREAM/ | head -1; true"])
            b = await port.exec(h, ["curl", "-sS", "-m", "10", "-x", "socks5h://127.0.0.1:1080",
                                    "http://denied.port.test:UPSTREAM/"])
            ea, eb, eq = await asyncio.gather(collect(a), collect(b), collect(quiet))
            OUT["a_status"] = b"".join(e.data for e in ea if e.type == "stdout").decode()
            OUT["b_exit"] = [e.exit_code for e in eb if e.type == "exit"]
            OUT["own_a"] = violations(ea)
            OUT["own_b"] = violations(eb)
            OUT["own_quiet"] = violations(eq)
            OUT["ids"] = [a.exec_id, b.exec_id, quiet.exec_id]
            await port.destroy(h)
            await task
            OUT["stream"] = violations(seen)
        """,
    )
    assert out["ok"] == [0, f"hello from allowed.port.test:{upstream}\n", ""]
    network = str(out["network"])
    assert "own proxies only" in network and "loopback only" not in network
    assert "allowed.port.test" in network
    assert "network: through this session's own proxies only" in str(out["explain"])
    a_id, b_id, _quiet = out["ids"]
    assert str(out["a_status"]).startswith("HTTP/1.1 403")
    assert out["b_exit"] == [97]  # curl: connection not allowed by ruleset (SOCKS5)
    target = f"denied.port.test:{upstream}"
    (va,) = out["own_a"]
    (vb,) = out["own_b"]
    assert va[:3] == [a_id, "network-outbound", target] and va[3]
    assert vb[:3] == [b_id, "network-outbound", target] and vb[3]
    assert va[4]["proxy"] == "http" and vb[4]["proxy"] == "socks5"
    assert va[4]["rule"] == va[3] and va[4]["reason"]
    assert va[4]["attribution"].startswith(f"exec {a_id}:")
    assert out["own_quiet"] == []
    assert sorted(v[0] for v in out["stream"]) == sorted([a_id, b_id])


def test_simultaneous_refusals_each_belong_to_their_own_exec(world: World, upstream: int) -> None:
    """Many refused connections accepted together: each violation names its own exec."""
    out = _drive(
        world,
        upstream,
        """
        async def main(port):
            h = await port.launch(spec(egress_allowlist=allow("allowed.port.test")))
            go = "while [ ! -e /tmp/go ]; do :; done; "  # every exec starts its request at once
            execs = {}
            for i in range(8):
                via = "-x socks5h://127.0.0.1:1080 " if i % 2 else ""
                url = f"http://denied.port.test:{2000 + i}/"
                execs[i] = await port.exec(h, ["sh", "-c", f"{go}curl -s -m 10 {via}{url}; true"])
            await port.run(h, ["touch", "/tmp/go"])
            results = await asyncio.gather(*(collect(ex) for ex in execs.values()))
            OUT["seen"] = [[ex.exec_id, violations(events)] for ex, events in
                           zip(execs.values(), results)]
        """,
    )
    for i, (exec_id, found) in enumerate(out["seen"]):
        ((owner, _action, target, _rule, raw),) = found
        assert owner == exec_id and target == f"denied.port.test:{2000 + i}", (i, found)
        assert raw["proxy"] == ("socks5" if i % 2 else "http")


def test_network_disabled_still_has_proxies_that_refuse_everything(
    world: World, upstream: int
) -> None:
    out = _drive(
        world,
        upstream,
        """
        async def main(port):
            s = spec(network_enabled=False, egress_allowlist=allow("allowed.port.test"))
            h = await port.launch(s)
            OUT["network"] = h.detail("network")
            OUT["explain"] = port.explain(s)
            script = (
                'echo "$HTTP_PROXY $ALL_PROXY"; '
                "curl -s -o /dev/null -w '%{http_code}\\\\n' http://allowed.port.test:UPSTREAM/; "
                "curl -s -o /dev/null -w '%{http_code}\\\\n' https://github.com/; "
                "curl -s -m 5 -x socks5h://127.0.0.1:1080 http://allowed.port.test:UPSTREAM/; "
                "echo socks=$?"
            )
            ex = await port.exec(h, ["sh", "-c", script])
            events = await collect(ex)
            OUT["stdout"] = b"".join(e.data for e in events if e.type == "stdout").decode()
            OUT["own"] = violations(events)
            OUT["id"] = ex.exec_id
        """,
    )
    assert "network_enabled is false: every connection is refused" in str(out["network"])
    assert "every connection is refused" in str(out["explain"])
    lines = str(out["stdout"]).splitlines()
    assert lines == ["http://127.0.0.1:3128 socks5h://127.0.0.1:1080", "403", "000", "socks=97"]
    targets = [v[2] for v in out["own"]]
    assert targets == [
        f"allowed.port.test:{upstream}",
        "github.com:443",
        f"allowed.port.test:{upstream}",
    ]
    assert all(v[0] == out["id"] and v[1] == "network-outbound" for v in out["own"])


def test_direct_connections_and_dns_fail(world: World, upstream: int) -> None:
    out = _drive(
        world,
        upstream,
        """
        PROBE = '''
        import socket
        def attempt(f):
            try:
                f()
                return "ok"
            except OSError as e:
                return type(e).__name__ + ":" + str(e.errno)
        print(attempt(lambda: socket.create_connection(("127.0.0.1", UPSTREAM), 2)))
        print(attempt(lambda: socket.create_connection(("1.1.1.1", 80), 2).recv(1)))
        print(attempt(lambda: socket.getaddrinfo("example.com", 80)))
        listening = set()
        for table in ("tcp", "tcp6"):
            for row in open("/proc/net/" + table).read().splitlines()[1:]:
                f = row.split()
                if f[3] == "0A":
                    listening.add(int(f[1].split(":")[1], 16))
        print(sorted(listening))
        '''
        import textwrap

        async def main(port):
            h = await port.launch(spec(egress_allowlist=allow("allowed.port.test")))
            r = await port.run(h, ["python3", "-c", textwrap.dedent(PROBE)])
            OUT["probe"] = r.stdout.decode().splitlines()
            r = await port.run(h, ["curl", "-sS", "-m", "5", "--noproxy", "*",
                                   "http://allowed.port.test:UPSTREAM/"])
            OUT["curl"] = [r.exit_code, r.stdout.decode()]
        """,
    )
    direct, outside, dns, listening = out["probe"]
    assert direct == "ConnectionRefusedError:111"  # nothing of the host on this loopback
    # diverted to the session (issue 20), which refuses it: a reset, nothing dialled
    assert outside == "ConnectionResetError:104"
    assert dns.startswith("gaierror")  # the DNS stub: NXDOMAIN for a name not allowed
    # the only doors: the session's proxies, its transparent listener and DNS stub
    assert listening == "[53, 1080, 3128, 3129]"
    code, body = out["curl"]
    assert code != 0 and body == ""


def test_twenty_sandboxes_have_their_own_proxies_and_no_cross_talk(
    world: World, upstream: int
) -> None:
    out = _drive(
        world,
        upstream,
        """
        N = 20

        async def one(port, h, i):
            mine = f"http://p{i}.port.test:UPSTREAM/"
            other = f"http://p{(i + 1) % N}.port.test:UPSTREAM/"
            r = await port.run(h, ["sh", "-c",
                f"curl -sS -m 20 {mine}; curl -s -o /dev/null -w '%{{http_code}}' -m 20 {other}"])
            return r.stdout.decode()

        async def main(port):
            handles = await asyncio.gather(*(
                port.launch(spec(f"s{i}", egress_allowlist=allow(f"p{i}.port.test")))
                for i in range(N)
            ))
            watches = [watch(port, h) for h in handles]
            OUT["netns"] = [h.detail("network_namespace") for h in handles]
            OUT["results"] = await asyncio.gather(*(one(port, h, i) for i, h in enumerate(handles)))
            await asyncio.gather(*(port.destroy(h) for h in handles))
            for _, task in watches:
                await task
            OUT["violations"] = [violations(seen) for seen, _ in watches]
        """,
        timeout=240,
    )
    netns = out["netns"]
    assert len(set(netns)) == 20 and all(netns)
    for i, text in enumerate(out["results"]):
        assert text == f"hello from p{i}.port.test:{upstream}\n403", (i, text)
    for i, found in enumerate(out["violations"]):
        assert [v[2] for v in found] == [f"p{(i + 1) % 20}.port.test:{upstream}"], (i, found)
        assert found[0][0] == 1  # the only exec of that sandbox


def test_destroy_closes_the_proxies_at_once(world: World, upstream: int) -> None:
    out = _drive(
        world,
        upstream,
        """
        import subprocess, textwrap
        ENTER = textwrap.dedent('''
            import ctypes, os, socket, sys
            libc = ctypes.CDLL(None, use_errno=True)
            for fd, kind in ((int(sys.argv[1]), 0x10000000), (int(sys.argv[2]), 0x40000000)):
                if libc.setns(fd, kind) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            listening = [r.split()[9] for r in open("/proc/net/tcp").read().splitlines()[1:]
                         if r.split()[3] == "0A"]
            try:
                socket.create_connection(("127.0.0.1", 3128), 2).close()
                print("connected", len(listening))
            except OSError as e:
                print(type(e).__name__, len(listening))
        ''')

        def from_inside(fds):
            r = subprocess.run([sys.executable, "-c", ENTER, *map(str, fds)], pass_fds=fds,
                               capture_output=True, text=True, timeout=20)
            return (r.stdout + r.stderr).strip()

        def our_sockets():
            found = set()
            for fd in os.listdir("/proc/self/fd"):
                try:
                    link = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    found.add(link[8:-1])
            return found

        async def main(port):
            h = await port.launch(spec(egress_allowlist=allow("allowed.port.test")))
            bwrap = h.detail("pid")
            rows = open(f"/proc/{bwrap}/net/tcp").read().splitlines()[1:]
            listeners = [r.split()[9] for r in rows if r.split()[3] == "0A"]
            fds = [os.open(f"/proc/{bwrap}/ns/{kind}", os.O_RDONLY) for kind in ("user", "net")]
            OUT["held"] = sorted(set(listeners) & our_sockets()) == sorted(listeners)
            r = await port.run(h, ["curl", "-sS", "-m", "10", "http://allowed.port.test:UPSTREAM/"])
            OUT["before"] = [r.stdout.decode(), await asyncio.to_thread(from_inside, fds)]
            await port.destroy(h)
            OUT["after"] = await asyncio.to_thread(from_inside, fds)
            OUT["still_held"] = sorted(set(listeners) & our_sockets())
            OUT["listeners"] = len(listeners)
        """,
    )
    # the two proxies, the transparent listener and the DNS stub's (issue 20)
    assert out["listeners"] == 4 and out["held"] is True
    assert out["before"] == [f"hello from allowed.port.test:{upstream}\n", "connected 4"]
    assert out["after"] == "ConnectionRefusedError 0"  # nothing listens there any more
    assert out["still_held"] == []


def test_destroying_with_connections_open_leaks_nothing(world: World, upstream: int) -> None:
    """STYLE §11: proxies with requests in flight; destroy, cancelled at several points."""
    out = _drive(
        world,
        upstream,
        """
        async def busy(port, sid):
            h = await port.launch(spec(sid, egress_allowlist=allow("allowed.port.test")))
            ex = await port.exec(h, ["sh", "-c",
                "url=http://allowed.port.test:UPSTREAM/slow; curl -s -m 30 $url & "
                "curl -s -m 30 -x socks5h://127.0.0.1:1080 $url & wait"])
            return h, ex

        async def main(port):
            me = os.getpid()
            h, ex = await busy(port, "warm-up")
            await asyncio.sleep(0.5)
            await port.destroy(h)
            await ex.wait()
            fds = len(os.listdir("/proc/self/fd"))
            times = []
            for delay_ms in (0, 0, 1, 3, 10):
                h, ex = await busy(port, f"b{len(times)}")
                await asyncio.sleep(0.5)  # both requests are in the proxies by now
                start = time.monotonic()
                destroy = asyncio.get_running_loop().create_task(port.destroy(h))
                await asyncio.sleep(delay_ms / 1000)
                destroy.cancel()
                try:
                    await destroy
                except asyncio.CancelledError:
                    pass  # shielded: the teardown goes on
                result = await ex.output()
                while port.handle(h).state.value != "destroyed" and time.monotonic() < start + 10:
                    await asyncio.sleep(0.005)
                times.append(time.monotonic() - start)
                OUT.setdefault("states", []).append(port.handle(h).state.value)
                # killed by the destroy, or ended on its own when its network was cut first
                OUT.setdefault("ended", []).append([str(result.killed), result.stdout.decode()])
            await asyncio.sleep(0.2)
            OUT["slowest"] = max(times)
            OUT["fds"] = len(os.listdir("/proc/self/fd")) - fds
            OUT["children"] = [p for p in descendants(me) if stat_fields(p)[0] != "Z"]
        """,
    )
    assert out["states"] == ["destroyed"] * 5
    for killed, stdout in out["ended"]:
        assert killed in ("KillReason.DESTROYED", "None") and stdout == ""  # never answered
    assert float(out["slowest"]) < 5
    assert out["fds"] == 0 and out["children"] == []


def test_a_refusal_nobody_can_be_blamed_for_is_reported_as_unknown(
    world: World, upstream: int
) -> None:
    out = _drive(
        world,
        upstream,
        """
        async def main(port):
            h = await port.launch(spec(egress_allowlist=allow("allowed.port.test")))
            seen, task = watch(port, h)
            busy = await port.exec(h, ["sleep", "3"])  # running meanwhile: never to be blamed
            # The exec ends at once; its orphaned child makes the refused request later.
            gone = await port.run(h, ["sh", "-c",
                "(sleep 0.5; curl -s -m 5 http://denied.port.test:UPSTREAM/) >/dev/null 2>&1 &"])
            OUT["gone_exit"] = gone.exit_code
            deadline = time.monotonic() + 10
            while not violations(seen) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            OUT["violations"] = violations(seen)
            OUT["busy"] = busy.exec_id
            await port.destroy(h)
            await task
        """,
    )
    assert out["gone_exit"] == 0
    ((exec_id, _action, target, _rule, raw),) = out["violations"]
    assert exec_id == 0 and target == f"denied.port.test:{upstream}"
    assert raw["attribution"].startswith("unknown:")


# A request made by a process whose main thread has exited: its leader's own
# /proc/PID/fd then shows nothing, and its socket shows only through the live thread.
ZOMBIE_LEADER_REQUEST_C = r"""
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
static char *port;
static void *ask(void *arg) {
    struct sockaddr_in proxy = {.sin_family = AF_INET, .sin_port = htons(3128)};
    char buf[4096];
    int s = socket(AF_INET, SOCK_STREAM, 0);
    ssize_t n;
    usleep(200000); /* the leader is a zombie by now */
    inet_pton(AF_INET, "127.0.0.1", &proxy.sin_addr);
    if (s < 0 || connect(s, (struct sockaddr *)&proxy, sizeof proxy)) exit(2);
    n = snprintf(buf, sizeof buf, "GET http://denied.port.test:%s/ HTTP/1.1\r\n"
                 "Host: denied.port.test:%s\r\nConnection: close\r\n\r\n", port, port);
    if (write(s, buf, n) != n) exit(3);
    while ((n = read(s, buf, sizeof buf)) > 0) fwrite(buf, 1, n, stdout);
    exit(0);
    return arg;
}
int main(int argc, char **argv) {
    pthread_t t;
    port = argv[1];
    if (pthread_create(&t, 0, ask, 0)) return 1;
    pthread_exit(0);
}
"""


def test_a_refusal_by_a_process_whose_main_thread_exited_names_its_exec(
    world: World, upstream: int
) -> None:
    """The holder of the refused connection is found through the process's live thread
    when its leader shows Z (and no fds)."""
    source = world.work / "zask.c"
    source.write_text(ZOMBIE_LEADER_REQUEST_C)
    binary = world.work / "zask"
    subprocess.run(["gcc", "-O2", "-pthread", "-o", str(binary), str(source)], check=True)
    world.ident.chown(binary)
    out = _drive(
        world,
        upstream,
        f"""
        async def main(port):
            h = await port.launch(spec(egress_allowlist=allow("allowed.port.test")))
            seen, task = watch(port, h)
            ex = await port.exec(h, ["{binary}", "UPSTREAM"])
            events = await collect(ex)
            OUT["id"] = ex.exec_id
            OUT["status"] = b"".join(e.data for e in events if e.type == "stdout").decode()
            OUT["exit"] = [e.exit_code for e in events if e.type == "exit"]
            await port.destroy(h)
            await task
            OUT["violations"] = violations(seen)
        """,
    )
    assert str(out["status"]).startswith("HTTP/1.1 403") and out["exit"] == [0]
    ((exec_id, _action, target, _rule, raw),) = out["violations"]
    assert target == f"denied.port.test:{upstream}"
    assert exec_id == out["id"], raw["attribution"]
    assert raw["attribution"].startswith(f"exec {exec_id}:")


class _Silent:
    """A TCP server that takes connections and never answers nor closes them, not even
    after the other end has (until the test ends)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.port = int(self.listener.getsockname()[1])
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.stop = False
        self.ended: list[socket.socket] = []  # the other end closed; ours stays open
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop:
            for key, _ in self.selector.select(0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self.listener:
                    conn, _ = sock.accept()
                    self.selector.register(conn, selectors.EVENT_READ)
                    continue
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    self.selector.unregister(sock)
                    self.ended.append(sock)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        for sock in self.ended:
            sock.close()

    def close(self) -> None:
        self.stop = True
        self.thread.join(5)


@pytest.fixture
def silent(port_test_names: None) -> Iterator[int]:
    server = _Silent()
    yield server.port
    server.close()


GREEDY = """
import socket
ok = refused = 0
held = []
for i in range(300):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
        s.sendall(b"CONNECT allowed.port.test:SILENT HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        if s.recv(64).startswith(b"HTTP/1.1 200"):
            ok += 1
            held.append(s)
            continue
    except OSError:
        pass
    refused += 1
print(ok, refused)
"""


def test_one_sandbox_cannot_take_the_ports_file_descriptors(
    world: World, upstream: int, silent: int
) -> None:
    """Sandbox A opens 300 tunnels to a server that never answers nor closes, and its
    command exits. With RLIMIT_NOFILE at 512 that is more fds than the port has: A
    gets only its share (the rest are reset at once, said once in the log), B's
    requests and a new launch still work, and A's tunnels, half-closed by the exit,
    are cut after the half-closed timeout (1 s here), which gives A its share back."""
    out = _drive(
        world,
        upstream,
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))
        import sandhold.net.relay
        sandhold.net.relay.HALF_CLOSED_TIMEOUT = 1.0
        from sandhold.net.budget import plan_budget
        GREEDY = {GREEDY.replace("SILENT", str(silent))!r}

        def fds():
            return len(os.listdir("/proc/self/fd"))

        async def main(port):
            OUT["share"] = plan_budget(512).per_session
            a = await port.launch(spec("a", egress_allowlist=allow("allowed.port.test")))
            b = await port.launch(spec("b", egress_allowlist=allow("allowed.port.test")))
            url = "http://allowed.port.test:UPSTREAM/"
            await port.run(a, ["curl", "-sS", "-m", "10", url])  # the proxies are up
            before = fds()
            r = await port.run(a, ["python3", "-c", GREEDY])
            OUT["greedy"] = [r.exit_code, r.stdout.decode().split(), r.stderr.decode()[-300:]]
            OUT["held"] = fds() - before
            r = await port.run(b, ["curl", "-sS", "-m", "10", url])
            OUT["b"] = [r.exit_code, r.stdout.decode()]
            mid = fds()
            c = await port.launch(spec("c", egress_allowlist=allow("allowed.port.test")))
            r = await port.run(c, ["curl", "-sS", "-m", "10", url])
            OUT["c"] = [r.exit_code, r.stdout.decode()]
            before += fds() - mid  # what sandbox c holds
            start = time.monotonic()
            while time.monotonic() - start < 15 and fds() > before + 4:
                await asyncio.sleep(0.1)
            OUT["left"] = fds() - before
            r = await port.run(a, ["python3", "-c", GREEDY])
            OUT["again"] = r.stdout.decode().split()
        """,
        timeout=120,
    )
    share = out["share"]
    assert share == 16
    assert out["greedy"][:2] == [0, [str(share), str(300 - share)]], out["greedy"]
    assert out["held"] >= 2 * share  # two fds a tunnel, and no more than that share
    hello = f"hello from allowed.port.test:{upstream}\n"
    assert out["b"] == [0, hello] and out["c"] == [0, hello]
    assert out["left"] <= 4, out["left"]  # the half-closed tunnels were cut
    assert out["again"] == [str(share), str(300 - share)]
    stderr = str(out["_stderr"])
    assert stderr.count("refusing new connections") <= 4, stderr[-3000:]
    assert "cannot accept" not in stderr and "Too many open files" not in stderr


FD_HOG = """
import os, sys, time
fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(5000)]
for _ in range(19):
    if os.fork() == 0:
        break
print("ready", flush=True)
time.sleep(60)
"""


def test_refusals_in_a_sandbox_full_of_fds_do_not_stall_the_port(
    world: World, upstream: int
) -> None:
    """20 processes holding 5,000 fds each, then 30 refused requests at once: finding
    who made each is done off the event loop, bounded and batched, so the loop stays
    responsive; every refusal is still reported, naming its exec or saying why not."""
    out = _drive(
        world,
        upstream,
        f"""
        FD_HOG = {FD_HOG!r}

        async def main(port):
            h = await port.launch(spec(egress_allowlist=allow("allowed.port.test")))
            seen, task = watch(port, h)
            hog = await port.exec(h, ["python3", "-c", FD_HOG])
            async for e in hog:
                if e.type == "stdout":
                    break
            await asyncio.sleep(0.5)  # every fork has its fds
            gaps = []

            async def ticker():
                while True:
                    t = time.monotonic()
                    await asyncio.sleep(0.01)
                    gaps.append(time.monotonic() - t)

            tick = asyncio.get_running_loop().create_task(ticker())
            go = "while [ ! -e /tmp/go ]; do sleep 0.01; done; "  # all started, then all ask
            curl = "curl -s -m 20 -o /dev/null -w %{{http_code}} http://denied.port.test:UPSTREAM/"
            execs = [await port.exec(h, ["sh", "-c", go + curl]) for _ in range(30)]
            await port.run(h, ["touch", "/tmp/go"])
            results = await asyncio.gather(*(collect(ex) for ex in execs))
            tick.cancel()
            OUT["max_gap"] = max(gaps)
            OUT["codes"] = [b"".join(e.data for e in r if e.type == "stdout").decode()
                            for r in results]
            OUT["own"] = [[v[0] for v in violations(r)] for r in results]
            OUT["ids"] = [ex.exec_id for ex in execs]
            await port.kill(h, hog.exec_id)
            await port.destroy(h)
            await task
            OUT["stream"] = [v[4]["attribution"] for v in violations(seen)]
        """,
        timeout=180,
    )
    assert out["codes"] == ["403"] * 30
    assert len(out["stream"]) == 30  # every refusal reported
    assert out["own"] == [[i] for i in out["ids"]], out["stream"]  # each its own exec
    assert out["max_gap"] < 0.5, out["max_gap"]


def test_one_sandboxs_stuck_lookups_do_not_starve_anothers(world: World, upstream: int) -> None:
    """Sandbox A asks for 60 names whose DNS never answers (the port's getaddrinfo is
    made to hang for them); B's lookups still get threads of their own and answer at
    once, while A's time out on their own."""
    out = _drive(
        world,
        upstream,
        """
        import socket, threading
        RELEASE = threading.Event()
        _real = socket.getaddrinfo

        def _getaddrinfo(host, *args, **kwargs):
            if str(host).rstrip(".").endswith("stuck.port.test"):
                RELEASE.wait(60)  # a DNS server that never answers
                raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
            return _real(host, *args, **kwargs)

        socket.getaddrinfo = _getaddrinfo

        async def main(port):
            a = await port.launch(spec("a", egress_allowlist=allow("*.stuck.port.test")))
            b = await port.launch(spec("b", egress_allowlist=allow("allowed.port.test")))
            many = " ".join(
                f"curl -s -o /dev/null -m 30 http://n{i}.stuck.port.test/ &" for i in range(60)
            )
            stuck = await port.exec(a, ["sh", "-c", many + " wait"])
            await asyncio.sleep(1.0)  # every one of them is waiting for its lookup
            t = time.monotonic()
            r = await port.run(b, ["curl", "-sS", "-m", "20", "http://allowed.port.test:UPSTREAM/"])
            OUT["b"] = [r.exit_code, r.stdout.decode(), r.stderr.decode()]
            OUT["b_seconds"] = time.monotonic() - t
            RELEASE.set()
            await port.kill(a, stuck.exec_id)
            await stuck.wait()
        """,
        timeout=120,
    )
    assert out["b"] == [0, f"hello from allowed.port.test:{upstream}\n", ""]
    assert out["b_seconds"] < 3, out["b_seconds"]


def test_a_bad_allowlist_entry_fails_before_anything_starts(world: World) -> None:
    out: dict[str, Any] = drive(
        world,
        """
        async def main(port):
            for s in (spec(egress_allowlist=("*.com",)), spec(egress_allowlist=("https://a.b",))):
                for call in (port.launch, port.explain):
                    try:
                        result = call(s)
                        if asyncio.iscoroutine(result):
                            await result
                        OUT.setdefault("errors", []).append("no error")
                    except SpecError as exc:
                        OUT.setdefault("errors", []).append(str(exc))
            OUT["handles"] = len(port.handles())
        """,
    )
    errors = out["errors"]
    assert len(errors) == 4 and all("egress_allowlist" in e for e in errors), errors
    assert out["handles"] == 0
