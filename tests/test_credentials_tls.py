"""Masked credentials put back by the terminating proxy, with real clients in real sandboxes.

Upstreams run on the host at 127.0.0.1 and 127.0.0.2 with certificates of their own
CA (given to sandhold as ``extraCaCertPaths``); they record what they receive and
answer without echoing it. ``API_KEY`` is injected at 127.0.0.1 only. Every test runs
as root and as an unprivileged user (F-CRED-3).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest

from conftest import World
from tlsupstreams import REAL, serve_upstreams
from tlsupstreams import mark as _mark
from tlsupstreams import seen_since as _seen_since


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, object]]:
    with serve_upstreams() as up:
        yield up


def _settings(upstreams: dict[str, object], **creds: object) -> dict[str, object]:
    return {
        "network": {
            "allowedDomains": ["127.0.0.1", "127.0.0.2"],
            "tlsTerminate": {"extraCaCertPaths": [upstreams["ca"]]},
        },
        "credentials": {
            "envVars": [{"name": "API_KEY", "mode": "mask", "injectHosts": ["127.0.0.1"]}],
            **creds,
        },
    }


def _run(world: World, settings: dict[str, object], *command: str, extra: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    s = world.settings(settings)
    # the upstreams are on loopback, which the sandbox's NO_PROXY sends direct
    argv = ("env", "NO_PROXY=", "no_proxy=", *command)
    return world.sandhold(*extra, "-s", str(s), "--", *argv, env=world.env(API_KEY=REAL))


def test_curl_gets_the_real_key_to_its_host_only(
    world: World, upstreams: dict[str, object]
) -> None:
    ports = upstreams["ports"]
    assert isinstance(ports, dict)
    mark = _mark(upstreams)
    script = (
        'echo "$API_KEY"; '
        f'curl -sS -m 10 -H "Authorization: Bearer $API_KEY" --data "key=$API_KEY" '
        f"https://127.0.0.1:{ports['tls1']}/one https://127.0.0.1:{ports['tls1']}/two && "
        f'curl -sS -m 10 -H "Authorization: Bearer $API_KEY" https://127.0.0.2:{ports["tls2"]}/other'
    )
    r = _run(world, _settings(upstreams), "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    placeholder, *answers = r.stdout.splitlines()
    assert placeholder.startswith("sandhold_placeholder_") and answers == ["ok", "ok", "ok"]
    assert REAL not in r.stdout + r.stderr
    got = _seen_since(upstreams, mark)
    by_path = {g["path"]: g for g in got}
    assert by_path["/one"]["auth"] == f"Bearer {REAL}" and by_path["/one"]["body"] == f"key={REAL}"
    assert by_path["/two"]["auth"] == f"Bearer {REAL}"  # the same tunnel, kept alive
    assert by_path["/other"]["auth"] == f"Bearer {placeholder}"  # not its host: unchanged


def test_python_urllib_in_the_sandbox(world: World, upstreams: dict[str, object]) -> None:
    ports = upstreams["ports"]
    assert isinstance(ports, dict)
    mark = _mark(upstreams)
    code = (
        "import os, urllib.request\n"
        f"req = urllib.request.Request('https://127.0.0.1:{ports['tls1']}/py', "
        "data=('{\"k\": \"%s\"}' % os.environ['API_KEY']).encode(), "
        "headers={'X-Api-Key': os.environ['API_KEY'], 'Content-Type': 'application/json'})\n"
        "print(urllib.request.urlopen(req, timeout=10).read().decode().strip())\n"
    )
    r = _run(world, _settings(upstreams), "python3", "-c", code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    (got,) = _seen_since(upstreams, mark)
    assert got["x_key"] == REAL and json.loads(str(got["body"])) == {"k": REAL}


def test_a_bad_upstream_certificate_fails_the_request(
    world: World, upstreams: dict[str, object]
) -> None:
    ports = upstreams["ports"]
    assert isinstance(ports, dict)
    mark = _mark(upstreams)
    script = (
        f'curl -sS -m 10 -i -H "Authorization: Bearer $API_KEY" https://127.0.0.1:{ports["bad"]}/x'
    )
    r = _run(world, _settings(upstreams), "sh", "-c", script)
    assert "\nHTTP/1.1 502 " in r.stdout, r.stdout + r.stderr  # after the CONNECT's 200
    assert "upstream-tls-failed" in r.stdout and "certificate verify failed" in r.stdout
    assert _seen_since(upstreams, mark) == []  # nothing was sent to the impostor


def test_plain_http_is_injected_only_with_the_opt_in(
    world: World, upstreams: dict[str, object]
) -> None:
    ports = upstreams["ports"]
    assert isinstance(ports, dict)
    script = f'curl -sS -m 10 -H "Authorization: Bearer $API_KEY" http://127.0.0.1:{ports["plain"]}/plain'
    mark = _mark(upstreams)
    r = _run(world, _settings(upstreams), "sh", "-c", script)
    assert r.stdout.strip() == "ok", r.stderr
    (got,) = _seen_since(upstreams, mark)
    assert str(got["auth"]).startswith("Bearer sandhold_placeholder_")
    mark = _mark(upstreams)
    r = _run(world, _settings(upstreams, allowPlaintextInject=True), "sh", "-c", script)
    assert r.stdout.strip() == "ok", r.stderr
    (got,) = _seen_since(upstreams, mark)
    assert got["auth"] == f"Bearer {REAL}"


def test_no_log_or_record_has_the_real_value(world: World, upstreams: dict[str, object]) -> None:
    ports = upstreams["ports"]
    assert isinstance(ports, dict)
    violations = world.root / "violations.jsonl"
    script = (
        'curl -sS -m 10 -H "Authorization: Bearer $API_KEY" '
        f"https://127.0.0.1:{ports['tls1']}/log; "
        f"curl -sS -m 10 https://127.0.0.3:{ports['tls1']}/refused; true"
    )
    r = _run(
        world,
        _settings(upstreams),
        "sh",
        "-c",
        script,
        extra=("--debug", "--violations", str(violations)),
    )
    assert r.returncode == 0, r.stderr
    recorded = violations.read_text()
    assert "127.0.0.3" in recorded  # the file was written
    for text in (r.stdout, r.stderr, recorded):
        assert REAL not in text
    # the sandbox could not read sandhold's CA key either
    r = _run(world, _settings(upstreams), "sh", "-c", "cat ~/.local/state/sandhold/ca/ca-key.pem")
    assert r.returncode != 0 and "PRIVATE KEY" not in r.stdout
    assert (world.home / ".local/state/sandhold/ca/ca-key.pem").stat().st_mode & 0o077 == 0


NODE_CONNECT = r"""
const http = require('http'), tls = require('tls');
const proxy = new URL(process.env.HTTPS_PROXY);
const [host, port] = [process.argv[2], Number(process.argv[3])];
const req = http.request(
  {host: proxy.hostname, port: proxy.port, method: 'CONNECT', path: `${host}:${port}`});
req.on('connect', (res, socket) => {
  // trusts the proxy's CA through NODE_EXTRA_CA_CERTS, as node does by default
  const s = tls.connect({socket, servername: host, host}, () => {
    const auth = `Authorization: Bearer ${process.env.API_KEY}`;
    s.write(`GET /node HTTP/1.1\r\nHost: ${host}\r\n${auth}\r\nConnection: close\r\n\r\n`);
  });
  let out = '';
  s.on('data', d => out += d);
  s.on('end', () => { console.log(out.split('\r\n')[0]); });
  s.on('error', e => { console.log('error ' + e.message); process.exit(1); });
});
req.end();
"""


def test_node_and_git_get_the_real_key(world: World, upstreams: dict[str, object]) -> None:
    ports = upstreams["ports"]
    assert isinstance(ports, dict)
    script = world.mkfile("work/connect.js", NODE_CONNECT)
    mark = _mark(upstreams)
    r = _run(world, _settings(upstreams), "node", str(script), "127.0.0.1", str(ports["tls1"]))
    assert r.stdout.strip() == "HTTP/1.1 200 OK", r.stdout + r.stderr
    (got,) = _seen_since(upstreams, mark)
    assert got["auth"] == f"Bearer {REAL}"
    mark = _mark(upstreams)
    git = (
        'git -c http.extraHeader="Authorization: Bearer $API_KEY" '
        f"ls-remote https://127.0.0.1:{ports['tls1']}/repo.git; true"
    )
    r = _run(world, _settings(upstreams), "sh", "-c", git)
    got_git = _seen_since(upstreams, mark)
    assert got_git, r.stderr  # git reached the upstream through the terminating proxy
    assert all(g["auth"] == f"Bearer {REAL}" for g in got_git)
    assert REAL not in r.stdout + r.stderr


def test_control_fd_changes_which_hosts_are_terminated(
    world: World, upstreams: dict[str, object]
) -> None:
    import contextlib
    import subprocess

    ports = upstreams["ports"]
    assert isinstance(ports, dict)
    settings = _settings(upstreams)
    del settings["credentials"]["envVars"][0]["injectHosts"]  # type: ignore[index]
    s = world.settings(settings)
    url = f"https://127.0.0.1:{ports['tls1']}/live"
    curl = f'curl -sS -m 10 -H "Authorization: Bearer $API_KEY" {url}'
    r_fd, w_fd = os.pipe()
    proc = world.popen(
        "-s", str(s), "--control-fd", str(r_fd), "--",
        "env", "NO_PROXY=", "no_proxy=", "sh", "-c", f"{curl}; read go; {curl}",
        env=world.env(API_KEY=REAL),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(r_fd,),
    )  # fmt: skip
    os.close(r_fd)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        mark = _mark(upstreams)
        assert proc.stdout.readline() == b"ok\n"
        (first,) = _seen_since(upstreams, mark)
        assert first["auth"] == f"Bearer {REAL}"
        live = json.loads(json.dumps(settings))
        live["network"]["tlsTerminate"]["excludeDomains"] = ["127.0.0.1"]
        os.write(w_fd, json.dumps(live).encode() + b"\n")
        time.sleep(0.5)  # the line is read by the proxies' thread
        mark = _mark(upstreams)
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"ok\n"
        (second,) = _seen_since(upstreams, mark)
        assert str(second["auth"]).startswith("Bearer sandhold_placeholder_")  # tunnelled now
    finally:
        os.close(w_fd)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
    assert proc.returncode == 0
