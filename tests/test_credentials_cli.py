"""Masked credentials through the CLI, in real sandboxes, as root and unprivileged (F-CRED-2).

The sandbox sees placeholders only; ``--explain`` and the warnings never show a real value.
"""

from __future__ import annotations

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
