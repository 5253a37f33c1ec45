"""Unix sockets by path (F-NET-5): `allowUnixSockets` paths reachable, every other refused.

Real servers on host unix sockets, real clients (curl, Python) inside the CLI's
sandbox, as root and as an unprivileged user. The bypasses: other paths, symlinks
either way, /proc/self/root, hard links and binds at an allowed name, datagram
sockets, and a thread that flips the address buffer while another connects.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import World


class Servers:
    """HTTP-ish servers on unix sockets; each counts the connections it accepted."""

    def __init__(self, where: Path, names: tuple[str, ...]) -> None:
        where.mkdir(parents=True, exist_ok=True)
        os.chmod(where, 0o755)
        self.where = where
        self.counts = dict.fromkeys(names, 0)
        self.socks: list[socket.socket] = []
        for name in names:
            sock = socket.socket(socket.AF_UNIX)
            path = where / f"{name}.sock"
            sock.bind(str(path))
            os.chmod(path, 0o666)  # connect needs write permission on the socket file
            sock.listen(128)
            self.socks.append(sock)
            threading.Thread(target=self._serve, args=(sock, name), daemon=True).start()

    def path(self, name: str) -> str:
        return str(self.where / f"{name}.sock")

    def _serve(self, sock: socket.socket, name: str) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            self.counts[name] += 1
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(4096)
                    body = name.encode()
                    conn.sendall(
                        b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                    )
                except OSError:
                    pass

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


@pytest.fixture
def servers(world: World) -> Iterator[Servers]:
    s = Servers(world.root / "socks", ("ok", "no", "linked"))
    yield s
    s.close()


CLIENT = r"""
import json, os, socket, sys
out = {}
for name, path in json.loads(sys.argv[1]).items():
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        out[name] = s.recv(4096).split(b"\r\n\r\n", 1)[-1].decode()
    except OSError as e:
        out[name] = os.strerror(e.errno)
    s.close()
for kind in ("SOCK_DGRAM", "SOCK_SEQPACKET"):
    try:
        socket.socket(socket.AF_UNIX, getattr(socket, kind)).close()
        out[kind] = "made"
    except OSError as e:
        out[kind] = os.strerror(e.errno)
a, b = socket.socketpair()
a.sendall(b"pair"); out["socketpair"] = b.recv(4).decode()
srv = socket.socket(socket.AF_UNIX); srv.bind("\0sandhold-abstract"); srv.listen(1)
c = socket.socket(socket.AF_UNIX); c.connect("\0sandhold-abstract"); out["abstract"] = "ok"
print(json.dumps(out))
"""


def _client(world: World, settings: dict[str, object], targets: dict[str, str]) -> dict[str, str]:
    script = world.mkfile("client.py", CLIENT)
    s = world.settings(settings)
    log = world.root / "decisions.jsonl"
    r = world.sandhold(
        "-s", str(s), "--violations", str(log), "--", "python3", str(script), json.dumps(targets)
    )
    assert r.returncode == 0, r.stderr
    out: dict[str, str] = json.loads(r.stdout)
    out["_violations"] = log.read_text() if log.exists() else ""
    return out


def test_listed_paths_are_reachable_and_nothing_else(world: World, servers: Servers) -> None:
    links = world.root / "links"
    links.mkdir()
    (links / "to_no.sock").symlink_to(servers.path("no"))  # an unlisted name for a denied one
    (links / "to_ok.sock").symlink_to(servers.path("ok"))  # an unlisted name for an allowed one
    (links / "listed.sock").symlink_to(servers.path("linked"))  # a listed symlink
    world.ident.chown(links)
    settings = {
        "network": {"allowUnixSockets": [servers.path("ok"), str(links / "listed.sock")]},
    }
    out = _client(
        world,
        settings,
        {
            "ok": servers.path("ok"),
            "no": servers.path("no"),
            "to_no": str(links / "to_no.sock"),
            "to_ok": str(links / "to_ok.sock"),
            "listed": str(links / "listed.sock"),
            "via_proc_root": "/proc/self/root" + servers.path("no"),
            "dotdot": servers.path("ok").replace("/socks/", "/socks/../socks/"),
            "missing": str(world.root / "socks/missing.sock"),
        },
    )
    assert out["ok"] == "ok" and out["to_ok"] == "ok" and out["dotdot"] == "ok"
    assert out["listed"] == "linked"  # reached through the listed spelling
    assert out["no"] == "Permission denied" and out["to_no"] == "Permission denied"
    assert out["via_proc_root"] != "no"
    assert out["missing"] == "No such file or directory"
    assert out["SOCK_DGRAM"] == "Operation not permitted"  # they could send to any path
    assert out["SOCK_SEQPACKET"] == "Operation not permitted"
    assert out["socketpair"] == "pair" and out["abstract"] == "ok"  # nothing reaches the host
    assert servers.counts["no"] == 0
    refused = [json.loads(line) for line in out["_violations"].splitlines()]
    refused = [e for e in refused if e["action"] == "unix-socket-connect"]
    assert {e["target"] for e in refused} == {servers.path("no")}
    assert all(e["rule"].startswith("network.allowUnixSockets") for e in refused)


def test_without_a_list_every_unix_socket_stays_refused(world: World, servers: Servers) -> None:
    script = world.mkfile("c.py", "import socket; socket.socket(socket.AF_UNIX)")
    r = world.sandhold("--", "python3", str(script))
    assert r.returncode != 0 and "Operation not permitted" in r.stderr
    assert servers.counts["ok"] == 0


def test_curl_through_an_allowed_socket(world: World, servers: Servers) -> None:
    s = world.settings({"network": {"allowUnixSockets": [servers.path("ok")]}})
    r = world.sandhold(
        "-s", str(s), "--", "curl", "-sS", "--unix-socket", servers.path("ok"), "http://x/"
    )
    assert (r.returncode, r.stdout) == (0, "ok"), r.stderr
    r = world.sandhold(
        "-s", str(s), "--", "curl", "-sS", "--unix-socket", servers.path("no"), "http://x/"
    )
    assert r.returncode == 7 and servers.counts["no"] == 0


def test_the_sandbox_cannot_put_another_socket_at_an_allowed_name(
    world: World, servers: Servers
) -> None:
    """The allowance is for a name: the sandbox may not make that name itself (a bind, or
    a hard link to a denied socket), even where it may write."""
    work = world.work
    allowed = str(work / "svc.sock")
    s = world.settings(
        {"filesystem": {"allowWrite": ["."]}, "network": {"allowUnixSockets": [allowed]}}
    )
    script = world.mkfile(
        "squat.py",
        f"""
import os, socket
out = {{}}
try:
    os.link({servers.path("no")!r}, {allowed!r}); out["link"] = "made"
except OSError as e:
    out["link"] = os.strerror(e.errno)
try:
    socket.socket(socket.AF_UNIX).bind({allowed!r}); out["bind"] = "made"
except OSError as e:
    out["bind"] = os.strerror(e.errno)
socket.socket(socket.AF_UNIX).bind("mine.sock"); out["other"] = "made"
print(out)
""",
    )
    r = world.sandhold("-s", str(s), "--", "python3", str(script))
    assert r.returncode == 0, r.stderr
    assert "'bind': 'Permission denied'" in r.stdout and "'other': 'made'" in r.stdout
    assert "'link': 'made'" not in r.stdout  # refused (or EXDEV across mounts)
    assert not os.path.lexists(allowed)


RACE = r"""
import ctypes, json, os, socket, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
good, bad, seconds = sys.argv[1].encode(), sys.argv[2].encode(), float(sys.argv[3])
def sun(p):
    return (1).to_bytes(2, "little") + p + b"\0" * (108 - len(p))
buf = ctypes.create_string_buffer(sun(good), 110)
addr = ctypes.addressof(buf)
running = [True]
def flipper():
    g, b, mm = sun(good), sun(bad), ctypes.memmove
    while running[0]:
        mm(addr, b, 110)
        mm(addr, g, 110)
threading.Thread(target=flipper, daemon=True).start()
seen = {}
end = time.monotonic() + seconds
while time.monotonic() < end:
    s = socket.socket(socket.AF_UNIX)
    rc = libc.connect(s.fileno(), buf, 110)
    if rc == 0:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        key = s.recv(4096).split(b"\r\n\r\n", 1)[-1].decode() or "empty"
    else:
        key = os.strerror(ctypes.get_errno())
    seen[key] = seen.get(key, 0) + 1
    s.close()
running[0] = False
print(json.dumps(seen))
"""


def test_a_racing_thread_never_reaches_a_denied_socket(world: World, servers: Servers) -> None:
    script = world.mkfile("race.py", RACE)
    s = world.settings({"network": {"allowUnixSockets": [servers.path("ok")]}})
    r = world.sandhold(
        "-s",
        str(s),
        "--",
        "python3",
        str(script),
        servers.path("ok"),
        servers.path("no"),
        "3",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert "no" not in seen and servers.counts["no"] == 0, seen
    assert seen.get("ok", 0) > 0 and seen.get("Permission denied", 0) > 0, seen  # it raced
