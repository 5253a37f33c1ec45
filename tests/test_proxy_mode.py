"""``sandhold proxy`` end to end, as root and unprivileged: a real decider process, real clients.

The proxy gets its listening socket and its decider socket as inherited fds;
the decider is a small Python script speaking the protocol (``DECIDER``); the
clients are curl and urllib against a local upstream on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import REPO, World

DECIDER = r"""
import base64, json, socket, struct, sys
sock = socket.socket(fileno=int(sys.argv[1]))
cfg = json.loads(sys.argv[2])
log = open(cfg["log"], "a", buffering=1)

def send(msg):
    data = json.dumps(msg).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)

def recv():
    def exactly(n):
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                sys.exit(0)
            data += chunk
        return data
    (size,) = struct.unpack(">I", exactly(4))
    msg = json.loads(exactly(size))
    log.write(json.dumps(msg) + "\n")
    return msg

assert recv() == {"t": "hello", "proto": 1}
send({"t": "hello", "proto": 1, "allowedDomains": cfg["allowed"], "deniedDomains": cfg["denied"]})
while True:
    req = recv()
    ident, path = req["id"], req["path"]
    if path == "/deny":
        send({"t": "verdict", "id": ident, "action": "deny", "status": 451, "reason": "not here"})
    elif path == "/slow":
        pass
    elif path == "/exit":
        sys.exit(0)
    elif path == "/garbage":
        sock.sendall(b"\x00\x00\x00\x02{]")
    elif path == "/body":
        send({"t": "verdict", "id": ident, "action": "need_body", "max": 10})
        body = base64.b64decode(recv()["data"])
        if body.startswith(b"ok"):
            send({"t": "verdict", "id": ident, "action": "allow"})
        else:
            deny = {"action": "deny", "status": 422, "reason": "bad body"}
            send({"t": "verdict", "id": ident, **deny})
    elif path == "/sethdr":
        edits = {"setHeaders": {"x-tenant": ["a"]}}
        send({"t": "verdict", "id": ident, "action": "allow", **edits})
    else:
        send({"t": "verdict", "id": ident, "action": "allow", "removeHeaders": ["x-secret"]})
"""


class _Echo(BaseHTTPRequestHandler):
    def _echo(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        data = json.dumps(
            {"path": self.path, "headers": dict(self.headers), "body": body.decode()}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _echo

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


class Proxy:
    """A running ``sandhold proxy`` with its decider; ``get`` sends one request through it."""

    def __init__(self, world: World, upstream: int, *, denied: list[str], timeout: str) -> None:
        self.upstream = upstream
        self.log = world.root / "decider.log"
        script = world.mkfile("decider.py", DECIDER)
        ours, theirs = socket.socketpair()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        cfg = {"allowed": [f"127.0.0.1:{upstream}"], "denied": denied, "log": str(self.log)}
        self.decider = subprocess.Popen(
            [sys.executable, str(script), str(theirs.fileno()), json.dumps(cfg)],
            pass_fds=[theirs.fileno()],
        )
        self.proc = world.popen(
            "proxy",
            "--listen-fd",
            str(self.listener.fileno()),
            "--decider-fd",
            str(ours.fileno()),
            "--decider-timeout",
            timeout,
            pass_fds=[ours.fileno(), self.listener.fileno()],
            stderr=subprocess.PIPE,
        )
        ours.close()
        theirs.close()
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline().decode()
        assert "serving fd" in line, line

    def get(
        self, path: str, data: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes, str | None]:
        proxy = urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{self.port}"})
        opener = urllib.request.build_opener(proxy)
        url = f"http://127.0.0.1:{self.upstream}{path}"
        request = urllib.request.Request(url, data=data, headers=headers or {})
        try:
            with opener.open(request, timeout=10) as response:
                return response.status, response.read(), None
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), exc.headers.get("X-Deny-Reason")

    def curl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["curl", "-sS", "--max-time", "10", "-x", f"http://127.0.0.1:{self.port}",
             "-o", "-", "-w", "\n%{http_code}", "-D", "-", *args],
            capture_output=True, text=True, check=False,
        )  # fmt: skip

    def asked(self) -> list[dict[str, object]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def stop(self) -> str:
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        _, err = self.proc.communicate(timeout=10)
        self.decider.kill()
        self.decider.wait()
        self.listener.close()
        return err.decode()


@pytest.fixture
def proxy(world: World, upstream: int) -> Iterator[Proxy]:
    p = Proxy(world, upstream, denied=["127.0.0.1:1"], timeout="0.5")
    yield p
    p.stop()


def test_allow_deny_and_header_edits(proxy: Proxy) -> None:
    status, body, _ = proxy.get("/ok?q=1", headers={"X-Secret": "s", "X-Other": "o"})
    assert status == 200
    seen = json.loads(body)
    assert seen["path"] == "/ok?q=1"
    assert "X-Secret" not in seen["headers"]  # the allow's removeHeaders
    assert seen["headers"]["X-Other"] == "o"
    req = proxy.asked()[-1]
    assert req["method"] == "GET" and req["host"] == "127.0.0.1" and req["port"] == proxy.upstream
    assert req["path"] == "/ok" and req["query"] == "q=1"
    assert req["headers"]["x-secret"] == ["s"]  # type: ignore[index]

    assert proxy.get("/deny") == (451, b"sandhold: not here\n", "decider")
    status, _, code = proxy.get("/sethdr")
    assert (status, code) == (403, "plaintext_header_set")

    out = proxy.curl(f"http://127.0.0.1:{proxy.upstream}/curl")
    assert out.stdout.endswith("\n200"), out
    out = proxy.curl(f"http://127.0.0.1:{proxy.upstream}/deny")
    assert out.stdout.endswith("\n451") and "X-Deny-Reason: decider" in out.stdout


def test_the_decider_sees_the_host_the_origin_gets(proxy: Proxy) -> None:
    """The proxy writes Host from the URL; a client's Host naming another site must not
    be what the decider judges."""
    status, body, _ = proxy.get("/ok", headers={"Host": "bank.example"})
    assert status == 200
    sent = json.loads(body)["headers"]["Host"]
    assert sent == f"127.0.0.1:{proxy.upstream}"
    assert proxy.asked()[-1]["hostHeader"] == sent


def test_need_body_shows_the_body_then_decides(proxy: Proxy) -> None:
    status, body, _ = proxy.get("/body", data=b"ok, and a long tail")
    assert status == 200
    assert json.loads(body)["body"] == "ok, and a long tail"  # forwarded whole
    shown = proxy.asked()[-1]
    assert shown == {"t": "body", "id": shown["id"], "data": "b2ssIGFuZCBhIA==", "cut": True}
    got = proxy.get("/body", data=b"nope")
    assert got == (422, b"sandhold: bad body\n", "decider"), (got, proxy.asked()[-3:])
    out = proxy.curl(
        "-H", "Expect:", "--data-binary", "ok", f"http://127.0.0.1:{proxy.upstream}/body"
    )
    assert out.stdout.endswith("\n200"), out
    assert proxy.asked()[-1]["data"] == "b2s="


def test_a_body_behind_expect_100_continue_is_asked_for_at_once(proxy: Proxy) -> None:
    """The decider wants the body; the client waits for a 100 before sending it."""
    head = (
        f"POST http://127.0.0.1:{proxy.upstream}/body HTTP/1.1\r\nHost: x\r\n"
        "Content-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(head)
        s.settimeout(3)  # a strict client waits; without the 100 this times out
        assert s.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(b"ok")
        s.settimeout(10)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert b" 200 OK" in data and b'"body": "ok"' in data, data
    assert proxy.asked()[-1]["data"] == "b2s="


def test_hello_lists_refuse_without_asking(proxy: Proxy) -> None:
    before = len(proxy.asked())
    out = proxy.curl("http://127.0.0.1:1/")  # deniedDomains
    assert out.stdout.endswith("\n403") and "X-Deny-Reason: host_not_allowed" in out.stdout
    out = proxy.curl("http://127.0.0.2:80/")  # in no list
    assert out.stdout.endswith("\n403") and "X-Deny-Reason: host_not_allowed" in out.stdout
    out = proxy.curl("http://169.254.169.254/")  # the baseline denylist
    assert out.stdout.endswith("\n403")
    assert len(proxy.asked()) == before


def test_connect_is_refused_as_an_opaque_tunnel(proxy: Proxy) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
        target = f"127.0.0.1:{proxy.upstream}"
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 403")
    assert b"X-Deny-Reason: opaque_tunnel" in answer


def test_timeout_then_decider_exit_fails_closed(proxy: Proxy) -> None:
    started = time.monotonic()
    status, body, code = proxy.get("/slow")
    assert (status, code) == (503, "decider_unavailable")
    assert b"timed out" in body
    assert time.monotonic() - started < 5
    assert proxy.get("/ok")[0] == 200  # a late verdict costs only its own request
    status, _, code = proxy.get("/exit")
    assert (status, code) == (503, "decider_unavailable")
    proxy.proc.wait(timeout=10)
    with pytest.raises(urllib.error.URLError):  # every later request: refused
        proxy.get("/ok")
    err = proxy.stop()
    assert "stopped (decider: decider closed the stream)" in err
    assert proxy.proc.returncode == 0


def test_malformed_frame_kills_the_link_logged_once(world: World, upstream: int) -> None:
    p = Proxy(world, upstream, denied=[], timeout="5")
    status, _, code = p.get("/garbage")
    assert (status, code) == (503, "decider_unavailable")
    p.proc.wait(timeout=10)
    err = p.stop()
    assert err.count("the link is dead") == 1, err
    assert "frame is not valid JSON" in err


def test_listen_prints_the_bound_address_and_lifeline_stops_it(world: World, upstream: int) -> None:
    script = world.mkfile("decider.py", DECIDER)
    ours, theirs = socket.socketpair()
    life_r, life_w = socket.socketpair()
    cfg = {"allowed": [f"127.0.0.1:{upstream}"], "denied": [], "log": str(world.root / "log")}
    decider = subprocess.Popen(
        [sys.executable, str(script), str(theirs.fileno()), json.dumps(cfg)],
        pass_fds=[theirs.fileno()],
    )
    proc = world.popen(
        "proxy", "--listen", "127.0.0.1:0", "--decider-fd", str(ours.fileno()),
        "--lifeline-fd", str(life_r.fileno()),
        pass_fds=[ours.fileno(), life_r.fileno()], stderr=subprocess.PIPE,
    )  # fmt: skip
    for s in (ours, theirs, life_r):
        s.close()
    assert proc.stderr is not None
    line = proc.stderr.readline().decode()
    match = re.search(r"serving 127\.0\.0\.1:(\d+)", line)
    assert match, line
    proxy = urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{match[1]}"})
    with urllib.request.build_opener(proxy).open(
        f"http://127.0.0.1:{upstream}/x", timeout=10
    ) as response:
        assert response.status == 200
    life_w.close()
    assert proc.wait(timeout=10) == 0
    assert b"stopped (lifeline closed)" in proc.stderr.read()
    decider.kill()
    decider.wait()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen-fd", "0", "--decider-fd", "0", "--ca-fd", "3"], "TLS termination"),
        (["--strip-response-header", "set-cookie"], "not supported yet"),
        (["--listen", "127.0.0.1:0"], "a decider is required"),
        (["--decider-fd", "0"], "--listen-fd (or --listen"),
        (["--decider-fd", "0", "--listen", "0.0.0.0:0"], "not a loopback address"),
        (["--decider-fd", "0", "--listen", "127.0.0.1"], "HOST:PORT"),
        (["--decider-fd", "x", "--listen", "127.0.0.1:0"], "file descriptor number"),
        # str.isdigit takes these; int() reads the first as 3 and chokes on the second
        (["--decider-fd", "\u0663", "--listen", "127.0.0.1:0"], "file descriptor number"),
        (["--decider-fd", "\u00b2", "--listen", "127.0.0.1:0"], "file descriptor number"),
        (["--decider-fd", "9" * 20, "--listen", "127.0.0.1:0"], "file descriptor number"),
        (["--decider-fd", "0", "--listen", "127.0.0.1:\u0663\u0663"], "HOST:PORT"),
        (["--decider-fd", "0", "--decider-in", "0", "--listen", "127.0.0.1:0"], "not both"),
        (["--bogus"], "unknown option"),
        (["--decider-fd", "97", "--listen", "127.0.0.1:0"], "not an open file descriptor"),
        (["--decider-timeout", "0", "--decider-fd", "0", "--listen", "127.0.0.1:0"], "seconds"),
    ],
)
def test_bad_usage_exits_2(world: World, args: list[str], message: str) -> None:
    out = world.sandhold("proxy", *args)
    assert out.returncode == 2, out
    assert message in out.stderr
    assert out.stdout == ""


def test_version_anywhere_and_help(world: World) -> None:
    out = world.sandhold("proxy", "--bogus", "--ca-fd", "9", "--version")
    assert (out.returncode, out.stdout) == (0, "sandhold proxy 0.1.0\n")
    out = world.sandhold("proxy", "--help")
    assert out.returncode == 0 and "--decider-fd" in out.stdout
    assert "sandhold proxy" in world.sandhold("--help").stdout


def test_a_decider_that_never_says_hello_fails_the_start(world: World) -> None:
    ours, theirs = socket.socketpair()
    theirs.sendall(b"\x00\x00\x00\x02{}")  # not a hello
    out = subprocess.run(
        [world.ident.python, "-P", "-m", "sandhold", "proxy", "--listen", "127.0.0.1:0",
         "--decider-fd", str(ours.fileno())],
        pass_fds=[ours.fileno()], capture_output=True, text=True, timeout=20,
        env=world.env(), cwd=world.work, check=False,
        **({} if world.ident.is_root else {"user": world.ident.uid, "group": world.ident.gid}),
    )  # fmt: skip
    ours.close()
    theirs.close()
    assert out.returncode == 1, out
    assert "start failed" in out.stderr and "bad hello" in out.stderr


BYPASS_PATHS = [
    "//private/x",
    "/./private/x",
    "/x/../private/x",
    "/%70rivate/x",
    "/private%2fx",
    "/private;p/x",
    "/private\\x",
    "/private/%zz",
]


def test_the_docs_example_runs(world: World, upstream: int) -> None:
    text = (REPO / "docs" / "proxy-mode.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "docs/proxy-mode.md has no python example"
    example = world.mkfile("example_decider.py", blocks[0])
    shell = re.findall(r"```sh\n(.*?)```", text, re.S)[0]
    assert "--decider-in" in shell or "--decider-fd" in shell
    ours, theirs = socket.socketpair()
    decider = subprocess.Popen(
        [sys.executable, str(example)], stdin=theirs.fileno(), stdout=theirs.fileno()
    )
    theirs.close()
    proc = world.popen(
        "proxy", "--listen", "127.0.0.1:0", "--decider-fd", str(ours.fileno()),
        pass_fds=[ours.fileno()], stderr=subprocess.PIPE,
    )  # fmt: skip
    ours.close()
    assert proc.stderr is not None
    match = re.search(r"serving 127\.0\.0\.1:(\d+)", proc.stderr.readline().decode())
    assert match
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{match[1]}"})
    )
    try:
        with opener.open(f"http://127.0.0.1:{upstream}/", timeout=10) as response:
            assert response.status == 200
        with pytest.raises(urllib.error.HTTPError) as denied:
            opener.open(f"http://127.0.0.1:{upstream}/private/x", timeout=10)
        assert denied.value.code == 403
        assert denied.value.headers["X-Deny-Reason"] == "decider"
        # spellings an origin reads as /private/... that a prefix test would pass
        for path in BYPASS_PATHS:
            request = f"GET http://127.0.0.1:{upstream}{path} HTTP/1.1\r\nHost: x\r\n\r\n"
            with socket.create_connection(("127.0.0.1", int(match[1])), timeout=10) as s:
                s.sendall(request.encode())
                head = s.recv(65536)
            assert head.startswith(b"HTTP/1.1 400 "), (path, head)
            assert b"ambiguous path" in head and b'"path"' not in head, (path, head)
        with opener.open(f"http://127.0.0.1:{upstream}/a%20b/c/", timeout=10) as response:
            assert json.loads(response.read())["path"] == "/a%20b/c/"  # as sent
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        decider.kill()
        decider.wait()


def test_a_body_sent_after_the_head_reaches_the_decider(proxy: Proxy) -> None:
    """The body arriving in a later packet than the head is read, not taken for EOF."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        url = f"http://127.0.0.1:{proxy.upstream}/body"
        s.sendall(f"POST {url} HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n".encode())
        time.sleep(0.3)  # the head alone first: the proxy starts reading the body empty-handed
        s.sendall(b"nope")
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 422"), answer
    assert proxy.asked()[-1] == {"t": "body", "id": proxy.asked()[-1]["id"], "data": "bm9wZQ=="}


class _RawOrigin:
    """An origin that records the bytes of each request it gets and answers 200."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.got: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                data = b""
                with contextlib.suppress(OSError):
                    while not data.endswith(b"0\r\n\r\n"):
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                self.got.append(data)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def _send_raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    return answer


def test_an_inspected_chunked_body_reaches_the_origin_as_the_decider_saw_it(
    world: World,
) -> None:
    """Chunk extensions and trailers are no part of the decoded body the decider sees:
    the body goes on re-encoded from what it saw, and trailers are refused."""
    origin = _RawOrigin()
    proxy = Proxy(world, origin.port, denied=[], timeout="2")
    try:
        head = (
            f"POST http://127.0.0.1:{origin.port}/body HTTP/1.1\r\nHost: x\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
        ).encode()
        answer = _send_raw(proxy.port, head + b"2;x=SECRET\r\nok\r\n3\r\n-go\r\n0\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert proxy.asked()[-1]["data"] == "b2stZ28="  # "ok-go"
        sent = origin.got[-1]
        assert sent.endswith(b"\r\n\r\n5\r\nok-go\r\n0\r\n\r\n") and b"SECRET" not in sent, sent
        answer = _send_raw(proxy.port, head + b"2\r\nok\r\n0\r\nX-Trailer: SECRET\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert b"trailers" in answer and len(origin.got) == 1
    finally:
        proxy.stop()
    # a new decider: the test's one stops at a need_body that gets no body frame
    proxy = Proxy(world, origin.port, denied=[], timeout="2")
    try:
        # framing far larger than the body: no "cut" (the decider would think it saw a
        # prefix) that sends the raw extensions on
        padded = b"".join(
            b"1;x=SECRET" + b"S" * 15000 + b"\r\n" + bytes([c]) + b"\r\n" for c in b"ok1234"
        )
        answer = _send_raw(proxy.port, head + padded + b"0\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert b"framing" in answer and len(origin.got) == 1
    finally:
        proxy.stop()
        origin.sock.close()
