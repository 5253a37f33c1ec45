"""Transparent egress of port-launched sandboxes (issue 20), as root and unprivileged.

The upstream is a plain HTTP server on the host's 127.0.0.1 that answers with
the name it was asked for; the test names map to 127.0.0.1 in the host's
/etc/hosts, which the egress resolver reads, and ``127.0.0.1`` is allowed as an
IP entry (see ``test_port_egress.py``). A port sandbox sees the host's /etc, so
its own resolver would read those lines too and dial its own loopback: the
clients below ask for the names with a trailing dot (``web.pt20.test.``), which
glibc never looks up in /etc/hosts, so the question goes to DNS, and the
sandbox's DNS stub answers it. Every client runs with no proxy variable.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import World
from localnet import BannerHandler, EchoHandler, banner_server, echo_server, mapped_names
from portdriver import drive

MARK = "# sandhold-i20-port-transparent"
NAMES = ("web.pt20.test", "denied.pt20.test")


@pytest.fixture(scope="session")
def pt20_names() -> Iterator[None]:
    """Map the test names to 127.0.0.1 in /etc/hosts (only our own marked lines)."""
    with mapped_names(NAMES, MARK):
        yield


@pytest.fixture(scope="session")
def upstream(pt20_names: None) -> Iterator[int]:
    with echo_server() as port:
        yield port


def _drive(world: World, upstream: int, body: str) -> dict[str, Any]:
    code = textwrap.dedent(body).replace("UPSTREAM", str(upstream)).replace("CLEAN_ARGV", CLEAN)
    return drive(world, code, timeout=120)


CLEAN = '["env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp"]'


def test_port_sandbox_reaches_allowed_names_without_proxies(world: World, upstream: int) -> None:
    before = len(EchoHandler.hits)
    out = _drive(
        world,
        upstream,
        """
        import json, textwrap
        CLEAN = CLEAN_ARGV
        RAW = '''
        import socket, sys
        c = socket.create_connection(("web.pt20.test.", UPSTREAM), timeout=5)
        CRLF = bytes((13, 10))
        c.sendall(b"GET / HTTP/1.1" + CRLF + b"Host: web.pt20.test" + CRLF
                  + b"Connection: close" + CRLF + CRLF)
        data = b""
        while True:
            more = c.recv(4096)
            if not more:
                break
            data += more
        print(data.decode().splitlines()[-1])
        '''

        def violations(events):
            return [[e.exec_id, json.loads(e.violation.raw)] for e in events
                    if e.type == "violation"]

        async def collect(execution):
            return [e async for e in execution]

        async def main(port):
            s = spec(egress_allowlist=("web.pt20.test", "127.0.0.1"))
            OUT["explain"] = port.explain(s)
            h = await port.launch(s)
            r = await port.run(h, [*CLEAN, "curl", "-sS", "-m", "10",
                                   "http://web.pt20.test.:UPSTREAM/"])
            OUT["curl"] = [r.exit_code, r.stdout.decode(), r.stderr.decode()]
            r = await port.run(h, [*CLEAN, "python3", "-c", textwrap.dedent(RAW)])
            OUT["raw"] = [r.exit_code, r.stdout.decode(), r.stderr.decode()]
            r = await port.run(h, [*CLEAN, "node", "-e",
                "fetch('http://web.pt20.test.:UPSTREAM/').then(r => r.text())"
                ".then(t => process.stdout.write(t)).catch(e => { console.error(e); "
                "process.exit(3) })"])
            OUT["node"] = [r.exit_code, r.stdout.decode(), r.stderr.decode()]
            r = await port.run(h, [*CLEAN, "sh", "-c",
                "command -v dig >/dev/null || { echo no-dig; exit 0; }; "
                "dig +short @8.8.8.8 web.pt20.test; dig +short @9.9.9.9 denied.pt20.test"])
            OUT["dig"] = r.stdout.decode()
            denied = await port.exec(h, [*CLEAN, "curl", "-sS", "-m", "10",
                                         "http://denied.pt20.test.:UPSTREAM/"])
            literal = await port.exec(h, [*CLEAN, "sh", "-c",
                "curl -sS -i -m 10 http://192.0.2.80/ | head -1"])
            udp = await port.exec(h, [*CLEAN, "python3", "-c",
                "import socket\\ntry:\\n socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                ".sendto(b'x', ('192.0.2.9', 443))\\nexcept OSError as e:\\n print(e.errno)"])
            ed, el, eu = await asyncio.gather(collect(denied), collect(literal), collect(udp))
            OUT["denied"] = [[e.exit_code for e in ed if e.type == "exit"], violations(ed)]
            OUT["literal"] = [b"".join(e.data for e in el if e.type == "stdout").decode(),
                              violations(el), literal.exec_id]
            OUT["udp"] = b"".join(e.data for e in eu if e.type == "stdout").decode()
            await port.destroy(h)
        """,
    )
    assert "transparent: every TCP connection" in str(out["explain"])
    code, body, err = out["curl"]
    assert code == 0 and body == f"hello from web.pt20.test.:{upstream}\n", err
    assert out["raw"][0] == 0 and out["raw"][1] == "hello from web.pt20.test\n", out["raw"]
    assert out["node"][0] == 0 and out["node"][1] == f"hello from web.pt20.test.:{upstream}\n", out[
        "node"
    ]
    assert len(EchoHandler.hits) == before + 3
    assert out["dig"] == "no-dig\n" or out["dig"].startswith("198.18."), out["dig"]
    assert len(out["dig"].splitlines()) == 1  # the denied name: nothing
    exit_codes, _ = out["denied"]
    assert exit_codes == [6]  # curl: could not resolve host (NXDOMAIN from the stub)
    status, own, exec_id = out["literal"]
    assert status.startswith("HTTP/1.1 403")
    # the refusal is the literal's exec's own violation: attributed from the host by the
    # sandbox socket's original destination
    assert [(v[0], v[1]["proxy"], v[1]["target"]) for v in own] == [
        (exec_id, "transparent", "192.0.2.80:80")
    ]
    assert out["udp"].strip() == "1"  # EPERM at send time


@pytest.fixture(scope="session")
def ssh_like(pt20_names: None) -> Iterator[int]:
    with banner_server() as port:
        yield port


def test_port_git_over_ssh_needs_no_workaround(world: World, ssh_like: int) -> None:
    """A port sandbox's own environment has no GIT_SSH_COMMAND (nor the JVM's or Node's
    proxy switches): git runs plain ssh, and transparent egress takes the connection."""
    before = sum(f.startswith("SSH-2.0-OpenSSH") for f in BannerHandler.firsts)
    out = _drive(
        world,
        ssh_like,
        """
        SCRIPT = (
            'echo "${GIT_SSH_COMMAND-unset} ${JAVA_TOOL_OPTIONS-unset} '
            '${NODE_USE_ENV_PROXY-unset}"; for name in web denied; do '
            "git -c core.sshCommand='ssh -o BatchMode=yes -o ConnectTimeout=5' ls-remote "
            "ssh://git@$name.pt20.test.:UPSTREAM/r.git; done; true"
        )

        async def main(port):
            h = await port.launch(spec(egress_allowlist=("web.pt20.test", "127.0.0.1")))
            r = await port.run(h, ["sh", "-c", SCRIPT])
            OUT["git"] = [r.exit_code, r.stdout.decode(), r.stderr.decode()]
            await port.destroy(h)
        """,
    )
    code, stdout, stderr = out["git"]
    assert code == 0 and stdout.splitlines()[0] == "unset unset unset", (stdout, stderr)
    after = sum(f.startswith("SSH-2.0-OpenSSH") for f in BannerHandler.firsts)
    assert after == before + 1, BannerHandler.firsts  # the allowed name only
    assert "Could not resolve hostname denied.pt20.test" in stderr, stderr
