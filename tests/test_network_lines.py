"""Network refusals said by default, and the network off failing fast (issue 15),
through the real CLI as root and unprivileged."""

from __future__ import annotations

import shutil
import time

import pytest

from conftest import World


def _lines(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if x.startswith("sandhold:")]


CURL = ("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}\\n")


def test_a_refused_host_is_named_on_one_line(world: World) -> None:
    s = world.settings({"network": {"allowedDomains": ["allowed.example.com"]}})
    curl = "curl -s -o /dev/null -w '%{http_code}\\n'"
    script = f"{curl} http://evil.example.net/; {curl} http://evil.example.net/x"
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script)
    assert r.returncode == 0 and r.stdout == "403\n403\n", r.stderr
    assert _lines(r.stderr) == [
        "sandhold: network: refused evil.example.net:80 (not in allowedDomains); to allow it: "
        '"network": {"allowedDomains": ["evil.example.net"]} (-d lists every refusal)'
    ], r.stderr
    r = world.sandhold("-q", "-s", str(s), "--", *CURL, "http://evil.example.net/")
    assert r.stdout == "403\n" and r.stderr == "", r.stderr


def test_a_deny_listed_host_says_which_list(world: World) -> None:
    s = world.settings(
        {"network": {"allowedDomains": ["*.example.net"], "deniedDomains": ["evil.example.net"]}}
    )
    r = world.sandhold("-s", str(s), "--", *CURL, "http://evil.example.net/")
    (line,) = _lines(r.stderr)
    assert line.startswith("sandhold: network: refused evil.example.net:80 (deniedDomains: ")
    assert "network.deniedDomains entry refuses it" in line
    r = world.sandhold("-s", str(s), "--", *CURL, "http://169.254.169.254/")
    assert _lines(r.stderr) == [
        "sandhold: network: refused 169.254.169.254:80 (baseline deny: cloud metadata) "
        "(-d lists every refusal)"
    ]


def test_no_line_when_nothing_was_refused(world: World) -> None:
    s = world.settings({"network": {"allowedDomains": ["allowed.example.com"]}})
    r = world.sandhold("-s", str(s), "--", "true")
    assert r.returncode == 0 and r.stderr == ""


@pytest.mark.skipif(shutil.which("npx") is None, reason="npx is not installed")
def test_npx_with_the_network_off_fails_fast_and_says_why(world: World) -> None:
    """npm retried a failed fetch for about 70 s; with the network off it runs offline."""
    start = time.monotonic()
    r = world.sandhold("--", "npx", "-y", "some-mcp-server-not-cached", timeout=60)
    took = time.monotonic() - start
    assert r.returncode != 0
    assert took < 20, took
    assert "ENOTCACHED" in r.stderr, r.stderr


def test_explain_says_the_network_is_off_and_what_runs_offline(world: World) -> None:
    r = world.sandhold("--explain", "--", "true")
    assert r.returncode == 0
    assert "npm_config_offline=true" in r.stdout and "UV_OFFLINE=1" in r.stdout
