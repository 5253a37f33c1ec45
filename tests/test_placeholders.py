"""Placeholders as pure values (F-CRED-2): never the secret, unique, shape-keeping."""

from __future__ import annotations

import base64
import json
import os
import re

import pytest

from sandhold.policy.credentials import CredentialSource
from sandhold.policy.placeholders import PREFIX, Minter, decode_jwt, is_aws_key_id, mask


def _src(**kw: object) -> CredentialSource:
    base: dict[str, object] = {
        "kind": "env",
        "key": "credentials.envVars[0]",
        "target": "T",
        "mode": "mask",
        "inject_hosts": ("api.example.com",),
    }
    return CredentialSource(**{**base, **kw})  # type: ignore[arg-type]


def _b64json(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


REAL_JWT = (
    _b64json({"alg": "RS256", "typ": "JWT", "kid": "k1"})
    + "."
    + _b64json({"iss": "https://issuer", "sub": "user-7", "secret": "s3cr3t-claim-value", "exp": 1})
    + ".c2lnbmF0dXJl"
)


def test_generic_placeholder_is_unique_padded_and_never_the_secret() -> None:
    minter = Minter(os.urandom)
    secret = "sk-" + "x" * 60
    a, b = minter.generic(secret), minter.generic(secret)
    assert secret not in {a, b} and a != b and secret not in a
    assert a.startswith(PREFIX) and len(a) == len(secret)
    assert minter.generic("short").startswith(PREFIX)


def test_a_repeating_entropy_source_is_an_error_not_a_clash() -> None:
    minter = Minter(lambda n: b"\0" * n)
    minter.generic("secret-one")
    with pytest.raises(RuntimeError, match="entropy"):
        minter.generic("secret-two")


@pytest.mark.parametrize("key_id", ["AKIAIOSFODNN7EXAMPLE", "ASIAY34FZKBOKMUTVV7A"])
def test_aws_key_id_keeps_prefix_and_length(key_id: str) -> None:
    (row,) = mask(_src(), key_id, Minter(os.urandom)).injections
    fake = row.placeholder
    assert fake[:4] == key_id[:4] and len(fake) == len(key_id) and fake != key_id
    assert is_aws_key_id(fake)
    assert row.real == key_id and key_id not in repr(row)


def test_repr_never_shows_the_real_value() -> None:
    m = mask(_src(), "very-secret-value-123", Minter(os.urandom))
    assert "very-secret-value-123" not in repr(m)


def test_whole_jwt_becomes_a_well_formed_hs256_token() -> None:
    m = mask(_src(decode="jwt"), REAL_JWT, Minter(os.urandom))
    header, payload = decode_jwt(m.text)  # type: ignore[misc]
    assert header["alg"] == "HS256" and payload["exp"] > 2_000_000_000
    assert m.injections[0].real == REAL_JWT and m.text != REAL_JWT


def test_mask_claims_keep_header_and_other_claims() -> None:
    m = mask(_src(decode="jwt", mask_claims=("secret", "absent")), REAL_JWT, Minter(os.urandom))
    _, payload = decode_jwt(m.text)  # type: ignore[misc]
    assert m.text.split(".")[0] == REAL_JWT.split(".")[0]
    assert payload["iss"] == "https://issuer" and payload["sub"] == "user-7"
    assert payload["secret"] != "s3cr3t-claim-value" and "s3cr3t" not in m.text
    reals = {r.real for r in m.injections}
    assert reals == {REAL_JWT, "s3cr3t-claim-value"}  # the whole token and the claim alone


def test_a_value_that_is_no_jwt_is_no_match() -> None:
    assert mask(_src(decode="jwt"), "eyJub3QiOiJqd3Qi.eyJ.x", Minter(os.urandom)).no_match
    assert mask(_src(decode="jwt"), "plain", Minter(os.urandom)).no_match


def test_extract_keeps_a_netrc_parseable() -> None:
    netrc = (
        "machine api.example.com login bot password hunter2-long-secret\n"
        "machine other.example.com login me password second-secret-xyz\n"
        "# backup: hunter2-long-secret\n"
    )
    src = _src(kind="file", extract=r"password\s+(\S+)", mask_duplicates=True)
    m = mask(src, netrc, Minter(os.urandom))
    assert "hunter2" not in m.text and "second-secret" not in m.text
    lines = m.text.splitlines()
    assert [ln.split()[:5] for ln in lines[:2]] == [
        ["machine", "api.example.com", "login", "bot", "password"],
        ["machine", "other.example.com", "login", "me", "password"],
    ]
    first = lines[0].split()[5]
    assert lines[2] == f"# backup: {first}"  # the duplicate got the same placeholder
    assert {r.real for r in m.injections} == {"hunter2-long-secret", "second-secret-xyz"}


def test_extract_without_duplicates_leaves_the_comment() -> None:
    src = _src(extract=r"password=(\w+)")
    m = mask(src, "password=abcdefgh # abcdefgh", Minter(os.urandom))
    assert m.text.endswith("# abcdefgh") and not m.text.startswith("password=abcdefgh")


def test_extract_in_json_and_database_url() -> None:
    doc = json.dumps({"user": "u", "token": "tok-0123456789abcdef", "n": 3})
    m = mask(_src(extract=r'"token":\s*"([^"]+)"'), doc, Minter(os.urandom))
    parsed = json.loads(m.text)
    assert parsed["user"] == "u" and parsed["n"] == 3 and parsed["token"].startswith(PREFIX)
    url = "postgres://app:pa55w0rd-long@db.example.com:5432/app"
    m = mask(_src(extract=r"://[^:]+:([^@]+)@"), url, Minter(os.urandom))
    assert re.fullmatch(r"postgres://app:[a-z0-9_]+@db\.example\.com:5432/app", m.text)


def test_extract_no_match() -> None:
    m = mask(_src(extract=r"token=(\w+)"), "nothing here", Minter(os.urandom))
    assert m.no_match and m.text == "nothing here" and not m.injections


def test_jwt_inside_a_file() -> None:
    text = f"TOKEN={REAL_JWT}\nOTHER=1\n"
    m = mask(_src(kind="file", decode="jwt"), text, Minter(os.urandom))
    assert REAL_JWT not in m.text and m.text.endswith("\nOTHER=1\n")
    token = m.text.split("\n")[0].removeprefix("TOKEN=")
    assert decode_jwt(token) is not None
