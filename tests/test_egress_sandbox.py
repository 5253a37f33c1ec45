"""Egress through the session's proxies, with real clients inside real sandboxes (issue 3).

Upstream servers run on the host at 127.0.0.1 (plain HTTP, and HTTPS with a
self-signed certificate); test names reach them through the host's
/etc/hosts, which the proxies' resolver reads. Because those names resolve to
loopback, the resolved-address guard refuses them unless ``127.0.0.1`` is
itself allowed, which the "allowed" policy below does on purpose and the
rebinding test does not. Every test runs as root and as an unprivileged user.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import World

NAMES = ("allowed.test", "other.test", "rebind.test", "www.allowed.test")
MARK = "# sandhold-tests"


@pytest.fixture(scope="session")
def test_names() -> Iterator[None]:
    """Map the test names to 127.0.0.1 in the host's /etc/hosts for the session."""
    hosts = Path("/etc/hosts")
    original = hosts.read_text()
    kept = "".join(line for line in original.splitlines(keepends=True) if MARK not in line)
    if not kept.endswith("\n"):
        kept += "\n"
    hosts.write_text(kept + "".join(f"127.0.0.1 {n} {MARK}\n" for n in NAMES))
    yield
    hosts.write_text(kept)


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def upstream(
    tmp_path_factory: pytest.TempPathFactory, test_names: None
) -> Iterator[dict[str, object]]:
    root = tmp_path_factory.mktemp("upstream")
    (root / "hello.txt").write_text("hello from upstream\n")
    # a bare repository served over the dumb HTTP protocol (a smart-HTTP stand-in)
    work = root / "src"
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    (work / "README").write_text("egress test repo\n")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    subprocess.run(["git", "-C", str(work), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(work), "commit", "-qm", "init"], check=True, env=env)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(root / "repo.git")], check=True)
    subprocess.run(["git", "-C", str(root / "repo.git"), "update-server-info"], check=True)
    # a certificate for every test name
    certdir = Path("/var/tmp/sandhold-test-tls")
    certdir.mkdir(exist_ok=True)
    os.chmod(certdir, 0o755)
    cert, key = certdir / "cert.pem", certdir / "key.pem"
    san = ",".join(f"DNS:{n}" for n in NAMES)
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=allowed.test",
            "-addext",
            f"subjectAltName={san}",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    os.chmod(cert, 0o644)

    def serve(tls: bool) -> http.server.ThreadingHTTPServer:
        handler = lambda *a: _Handler(*a, directory=str(root))  # noqa: E731
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        if tls:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(cert, key)
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    plain, tls = serve(False), serve(True)
    yield {"http": plain.server_address[1], "https": tls.server_address[1], "cert": str(cert)}
    plain.shutdown()
    tls.shutdown()


ALLOW = {
    "network": {
        "allowedDomains": ["allowed.test", "*.allowed.test", "127.0.0.1"],
        "deniedDomains": ["other.test"],
    }
}


def _curl(
    world: World, settings: dict[str, object], *curl_args: str, extra: tuple[str, ...] = ()
) -> tuple[int, str, str]:
    s = world.settings(settings)
    r = world.sandhold(*extra, "-s", str(s), "--", "curl", "-sS", "-m", "10", *curl_args)
    return r.returncode, r.stdout, r.stderr


def test_allowed_http_passes_and_denied_gets_403(world: World, upstream: dict[str, object]) -> None:
    port = upstream["http"]
    code, out, err = _curl(world, ALLOW, f"http://allowed.test:{port}/hello.txt")
    assert code == 0 and out == "hello from upstream\n", err
    code, out, _ = _curl(world, ALLOW, "-i", f"http://other.test:{port}/hello.txt")
    assert " 403 " in out.splitlines()[0]
    assert "x-proxy-error:" in out.lower() and "other.test" in out


def test_https_through_connect(world: World, upstream: dict[str, object]) -> None:
    port, cert = upstream["https"], upstream["cert"]
    code, out, err = _curl(
        world, ALLOW, "--cacert", str(cert), f"https://www.allowed.test:{port}/hello.txt"
    )
    assert code == 0 and out == "hello from upstream\n", err
    code, _, err = _curl(world, ALLOW, "--cacert", str(cert), f"https://other.test:{port}/")
    assert code == 56 and "403" in err  # curl: CONNECT tunnel failed, response 403


def test_socks5(world: World, upstream: dict[str, object]) -> None:
    port = upstream["http"]
    socks = "socks5h://127.0.0.1:1080"
    code, out, err = _curl(world, ALLOW, "-x", socks, f"http://allowed.test:{port}/hello.txt")
    assert code == 0 and out == "hello from upstream\n", err
    code, _, err = _curl(world, ALLOW, "-x", socks, f"http://other.test:{port}/")
    assert code == 97, err  # connection not allowed by ruleset


def test_direct_connections_and_dns_fail(world: World, upstream: dict[str, object]) -> None:
    port = upstream["http"]
    for url in (f"http://127.0.0.1:{port}/hello.txt", f"http://allowed.test:{port}/hello.txt"):
        code, out, _ = _curl(world, ALLOW, "--noproxy", "*", url)
        assert code != 0 and out == ""
    s = world.settings(ALLOW)
    r = world.sandhold(
        "-s",
        str(s),
        "--",
        "python3",
        "-c",
        "import socket\ntry:\n socket.getaddrinfo('example.com', 80)\n print('resolved')\n"
        "except OSError as e:\n print('failed')",
    )
    assert r.stdout.strip() == "failed"


@pytest.mark.parametrize(
    "host",
    [
        "169.254.169.254",
        "2852039166",
        "0xa9fea9fe",
        "0251.0376.0251.0376",
        "169.254.43518",
        "[::ffff:169.254.169.254]",
        "metadata.google.internal",
        "METADATA.GOOGLE.INTERNAL.",
        "OTHER.test",
        "other.test.",
    ],
)
def test_odd_spellings_of_denied_hosts_are_denied(
    world: World, upstream: dict[str, object], host: str
) -> None:
    settings = {"network": {"allowAllDomains": True, "deniedDomains": ["other.test"]}}
    _code, out, _ = _curl(world, settings, "-i", f"http://{host}:{upstream['http']}/")
    assert " 403 " in out.splitlines()[0], (host, out)


def test_rebinding_to_loopback_is_refused(world: World, upstream: dict[str, object]) -> None:
    settings = {"network": {"allowedDomains": ["rebind.test"]}}
    _code, out, _ = _curl(world, settings, "-i", f"http://rebind.test:{upstream['http']}/hello.txt")
    assert " 403 " in out.splitlines()[0] and "hello" not in out


def test_python_urllib_uses_the_proxy(world: World, upstream: dict[str, object]) -> None:
    s = world.settings(ALLOW)
    code = (
        f"import urllib.request; print(urllib.request.urlopen("
        f"'http://allowed.test:{upstream['http']}/hello.txt', timeout=10).read().decode(), end='')"
    )
    r = world.sandhold("-s", str(s), "--", "python3", "-c", code)
    assert r.returncode == 0 and r.stdout == "hello from upstream\n", r.stderr


def test_git_clone_over_https_through_the_proxy(world: World, upstream: dict[str, object]) -> None:
    s = world.settings({**ALLOW, "filesystem": {"allowWrite": ["."]}})
    url = f"https://allowed.test:{upstream['https']}/repo.git"
    r = world.sandhold(
        "-s",
        str(s),
        "--",
        "sh",
        "-c",
        f'git -c http.sslCAInfo={upstream["cert"]} clone -q {url} "$TMPDIR/c" '
        '&& cat "$TMPDIR/c/README"',
    )
    assert r.returncode == 0 and r.stdout == "egress test repo\n", r.stderr


def test_environment_points_tools_at_the_proxies(world: World) -> None:
    s = world.settings(ALLOW)
    r = world.sandhold(
        "-s",
        str(s),
        "--",
        "sh",
        "-c",
        'echo "$HTTP_PROXY|$https_proxy|$ALL_PROXY|$NO_PROXY|'
        '${GIT_SSH_COMMAND-unset}|${JAVA_TOOL_OPTIONS-unset}|${NODE_USE_ENV_PROXY-unset}"',
    )
    http, https, allp, no_proxy, *workarounds = r.stdout.strip().split("|")
    assert http == https == "http://127.0.0.1:3128"
    assert allp == "socks5h://127.0.0.1:1080"
    assert no_proxy == "localhost,127.0.0.1,::1"
    # programs that ignore the proxy variables are transparent egress's (issue 20)
    assert workarounds == ["unset"] * 3


def test_control_fd_flips_403_to_200_mid_run(world: World, upstream: dict[str, object]) -> None:
    url = f"http://allowed.test:{upstream['http']}/hello.txt"
    start = {"network": {"allowedDomains": [], "deniedDomains": []}}
    s = world.settings(start)
    script = (
        f"curl -s -o /dev/null -w '%{{http_code}}\\n' {url}; read go; "
        f"curl -s -o /dev/null -w '%{{http_code}}\\n' {url}"
    )
    r_fd, w_fd = os.pipe()
    proc = world.popen(
        "-s",
        str(s),
        "--control-fd",
        str(r_fd),
        "--",
        "sh",
        "-c",
        script,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        pass_fds=(r_fd,),
    )
    os.close(r_fd)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == b"403\n"
        os.write(w_fd, b"this is not json\n")  # rejected; the old rules stay
        os.write(w_fd, json.dumps({"network": ALLOW["network"]}).encode() + b"\n")
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"200\n"
    finally:
        os.close(w_fd)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
    assert proc.returncode == 0


def test_control_fd_is_not_visible_in_the_sandbox(world: World) -> None:
    r_fd, w_fd = os.pipe()
    try:
        proc = world.popen(
            "--control-fd",
            str(r_fd),
            "--",
            "sh",
            "-c",
            "ls /proc/self/fd",
            stdout=subprocess.PIPE,
            pass_fds=(r_fd,),
        )
        out, _ = proc.communicate(timeout=20)
    finally:
        os.close(r_fd)
        os.close(w_fd)
    assert sorted(out.decode().split()) == ["0", "1", "2", "3"]  # 3: ls's own directory fd


def test_violations_file_and_debug_summary(world: World, upstream: dict[str, object]) -> None:
    log = world.root / "decisions.jsonl"
    port = upstream["http"]
    _code, _, err = _curl(
        world,
        ALLOW,
        f"http://other.test:{port}/",
        f"http://allowed.test:{port}/hello.txt",
        extra=("-d", "--violations", str(log)),
    )
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    refused = [e for e in entries if not e["allowed"]]
    allowed = [e for e in entries if e["allowed"]]
    assert refused and refused[0]["action"] == "network-outbound"
    assert refused[0]["target"] == f"other.test:{port}" and refused[0]["rule"]
    assert allowed and allowed[0]["target"] == f"allowed.test:{port}"
    assert f"refused 1 connection(s): other.test:{port}" in err


def test_no_egress_without_allowed_domains_means_no_proxies(world: World) -> None:
    r = world.sandhold("--", "sh", "-c", 'echo "${HTTP_PROXY:-none}"; cat /proc/net/tcp | wc -l')
    assert r.stdout.split()[0] == "none"
