"""Masked credentials through the CLI, in real sandboxes, as root and unprivileged (F-CRED-2).

The sandbox sees placeholders only; ``--explain`` and the warnings never show a real value.
"""

from __future__ import annotations

import json
import re

from conftest import World

REAL = {
    "MY_TOKEN": "real-token-0123456789abcdef",
    "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "DATABASE_URL": "postgres://app:db-password-98765@db.example.com:5432/app",
}
SETTINGS = {
    "network": {"allowedDomains": ["127.0.0.1"]},
    "credentials": {
        "allowPlaintextInject": True,
        "envVars": [
            {"name": "MY_TOKEN", "mode": "mask"},
            {"name": "AWS_ACCESS_KEY_ID", "mode": "mask"},
            {"name": "DATABASE_URL", "mode": "mask", "extract": "://[^:]+:([^@]+)@"},
            {"name": "UNSET_ONE", "mode": "mask"},
        ],
    },
}
SECRETS = ("real-token-0123456789abcdef", "IOSFODNN7EXAMPLE", "db-password-98765")


def test_masked_variables_hold_placeholders(world: World) -> None:
    s = world.settings(SETTINGS)
    script = (
        "for v in MY_TOKEN AWS_ACCESS_KEY_ID DATABASE_URL UNSET_ONE; do printenv $v || echo -; done"
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, env=world.env(**REAL))
    assert r.returncode == 0, r.stderr
    token, key_id, url, unset = r.stdout.splitlines()
    assert token.startswith("sandhold_placeholder_") and len(token) >= len(REAL["MY_TOKEN"])
    assert re.fullmatch(r"AKIA[A-Z2-7]{16}", key_id) and key_id != REAL["AWS_ACCESS_KEY_ID"]
    assert re.fullmatch(r"postgres://app:sandhold_placeholder_\w+@db\.example\.com:5432/app", url)
    assert unset == "-"  # unset on the host: nothing to mask, nothing made up
    for secret in SECRETS:
        assert secret not in r.stdout + r.stderr


def test_each_run_gets_fresh_placeholders(world: World) -> None:
    s = world.settings(SETTINGS)
    outs = [
        world.sandhold("-s", str(s), "--", "printenv", "MY_TOKEN", env=world.env(**REAL)).stdout
        for _ in range(2)
    ]
    assert outs[0] != outs[1] and all(o.startswith("sandhold_placeholder_") for o in outs)


def test_explain_and_debug_never_show_real_values(world: World) -> None:
    s = world.settings(SETTINGS)
    r = world.sandhold("--explain", "-s", str(s), "--", "true", env=world.env(**REAL))
    assert r.returncode == 0, r.stderr
    assert "masked credentials put back by the proxy" in r.stdout
    r2 = world.sandhold("--debug", "-s", str(s), "--", "true", env=world.env(**REAL))
    for secret in SECRETS:
        assert secret not in r.stdout + r.stderr + r2.stdout + r2.stderr


def test_no_match_is_withheld_or_an_error(world: World) -> None:
    settings = {
        "network": {"allowedDomains": ["127.0.0.1"]},
        "credentials": {
            "allowPlaintextInject": True,
            "envVars": [{"name": "DATABASE_URL", "mode": "mask", "extract": "token=(\\w+)"}],
        },
    }
    s = world.settings(settings)
    r = world.sandhold(
        "-s",
        str(s),
        "--",
        "sh",
        "-c",
        "printenv DATABASE_URL || echo withheld",
        env=world.env(**REAL),
    )
    assert r.stdout.strip() == "withheld" and "found nothing to mask" in r.stderr
    settings["credentials"]["envVars"][0]["onExtractNoMatch"] = "error"  # type: ignore[index]
    s = world.settings(settings)
    r = world.sandhold("-s", str(s), "--", "true", env=world.env(**REAL))
    assert r.returncode == 2 and "onExtractNoMatch" in r.stderr
    assert "db-password" not in r.stderr


NETRC = (
    "machine api.example.com login bot password netrc-secret-0123456789\n"
    "machine other.example.com login me password second-netrc-secret\n"
)
JWT_HEADER = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9"  # {"alg":"RS256","typ":"JWT"}


def _jwt() -> str:
    import base64
    import json

    payload = {"iss": "issuer", "sub": "user-1", "secret": "claim-secret-value-42"}
    raw = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    return f"{JWT_HEADER}.{raw}.c2lnbmF0dXJlLXJlYWw"


def test_masked_files_are_copies_with_placeholders(world: World) -> None:
    netrc = world.mkfile("home/.netrc", NETRC, 0o600)
    token = world.mkfile("home/token.txt", "whole-file-secret-token-777", 0o600)
    jwt = _jwt()
    world.mkfile("home/creds.json", json.dumps({"id_token": jwt, "n": 1}) + "\n", 0o600)
    settings = {
        "network": {"allowedDomains": ["127.0.0.1"]},
        "credentials": {
            "allowPlaintextInject": True,
            "files": [
                {"path": "~/.netrc", "mode": "mask", "extract": "password\\s+(\\S+)"},
                {"path": "~/token.txt", "mode": "mask"},
                {"path": "~/creds.json", "mode": "mask", "decode": "jwt", "maskClaims": ["secret"]},
            ],
        },
    }
    s = world.settings(settings)
    code = (
        "import json, netrc, os, base64\n"
        "h = os.environ['HOME']\n"
        "n = netrc.netrc(h + '/.netrc')\n"
        "print(n.authenticators('api.example.com')[2])\n"
        "print(open(h + '/token.txt').read())\n"
        "tok = json.load(open(h + '/creds.json'))['id_token']\n"
        "seg = tok.split('.')[1]\n"
        "claims = json.loads(base64.urlsafe_b64decode(seg + '=' * (-len(seg) % 4)))\n"
        "print(claims['sub'], claims['secret'], tok.split('.')[0])\n"
    )
    r = world.sandhold("-s", str(s), "--", "python3", "-c", code)
    assert r.returncode == 0, r.stderr
    password, whole, claims = r.stdout.splitlines()
    assert password.startswith("sandhold_placeholder_")  # and the .netrc still parses
    assert whole.startswith("sandhold_placeholder_")
    sub, secret, header = claims.split()
    assert sub == "user-1" and secret.startswith("sandhold_placeholder_") and header == JWT_HEADER
    for real in ("netrc-secret", "second-netrc-secret", "whole-file-secret", "claim-secret-value"):
        assert real not in r.stdout + r.stderr
    assert netrc.read_text() == NETRC and token.read_text() == "whole-file-secret-token-777"
    r = world.sandhold("--explain", "-s", str(s), "--", "true")
    assert f"masked credential file {netrc}: the sandbox sees a copy" in r.stdout
    assert "netrc-secret" not in r.stdout


def test_a_masked_file_that_matches_nothing_stays_denied(world: World) -> None:
    world.mkfile("home/.netrc", "no credentials in here\n", 0o600)
    settings = {
        "network": {"allowedDomains": ["127.0.0.1"]},
        "credentials": {
            "allowPlaintextInject": True,
            "files": [{"path": "~/.netrc", "mode": "mask", "extract": "password\\s+(\\S+)"}],
        },
    }
    s = world.settings(settings)
    r = world.sandhold("-s", str(s), "--", "cat", f"{world.home}/.netrc")
    assert r.returncode != 0 and "no credentials" not in r.stdout
    assert "found nothing to mask" in r.stderr
