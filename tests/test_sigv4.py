"""SigV4 re-signing of masked AWS credentials (F-CRED-3).

The re-signer is checked against AWS's published SigV4 test-suite vectors (get-vanilla,
get-vanilla-query-order-key-case, post-vanilla) and S3's documented GET Object example;
the shapes it cannot re-sign are refused by a table. The sandbox test signs with curl's
``--aws-sigv4`` inside the sandbox (with the placeholders) against a local upstream that
verifies the signature with the real keys, using a verifier written here from the
specification (not the one under test), as root and unprivileged.
"""

from __future__ import annotations

import hashlib
import hmac
import http.server
import os
import ssl
import threading
import urllib.parse
from collections.abc import Iterator

import pytest

from conftest import World
from sandhold.net.sigv4 import Verdict, classify, resign
from sandhold.policy.credentials import Sigv4Policy
from sandhold.policy.placeholders import AwsKeys
from tlsupstreams import QuietHandler

SUITE_KEY = ("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
S3_KEY = ("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
FAKE_ID = "AKIAFAKEFAKEFAKEFAKE"
EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def _verdict(real: tuple[str, str], region: str, service: str) -> Verdict:
    keys = AwsKeys(FAKE_ID, real[0], real[1], None, ("*.amazonaws.com",))
    return Verdict("resign", keys=keys, region=region, service=service)


def _placeholder_auth(date: str, region: str, service: str, signed: str) -> bytes:
    return (
        f"AWS4-HMAC-SHA256 Credential={FAKE_ID}/{date[:8]}/{region}/{service}/aws4_request, "
        f"SignedHeaders={signed}, Signature={'0' * 64}"
    ).encode()


# (name, method, target, host, extra headers, key, service, date, expected Authorization)
VECTORS = [
    (
        "get-vanilla",
        b"GET",
        b"/",
        "example.amazonaws.com",
        [],
        SUITE_KEY,
        "service",
        "20150830T123600Z",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host;x-amz-date, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
    ),
    (
        "get-vanilla-query-order-key-case",
        b"GET",
        b"/?Param2=value2&Param1=value1",
        "example.amazonaws.com",
        [],
        SUITE_KEY,
        "service",
        "20150830T123600Z",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host;x-amz-date, "
        "Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
    ),
    (
        "post-vanilla",
        b"POST",
        b"/",
        "example.amazonaws.com",
        [],
        SUITE_KEY,
        "service",
        "20150830T123600Z",
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host;x-amz-date, "
        "Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
    ),
    (
        "s3-get-object",
        b"GET",
        b"/test.txt",
        "examplebucket.s3.amazonaws.com",
        [(b"range", b"bytes=0-9"), (b"x-amz-content-sha256", EMPTY.encode())],
        S3_KEY,
        "s3",
        "20130524T000000Z",
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
    ),
]


@pytest.mark.parametrize(
    ("name", "method", "target", "host", "extra", "key", "service", "date", "expected"),
    VECTORS,
    ids=[v[0] for v in VECTORS],
)
def test_resigning_reproduces_the_published_vectors(  # noqa: PLR0917
    name: str,
    method: bytes,
    target: bytes,
    host: str,
    extra: list[tuple[bytes, bytes]],
    key: tuple[str, str],
    service: str,
    date: str,
    expected: str,
) -> None:
    signed = ";".join(sorted(["host", "x-amz-date", *(k.decode() for k, _ in extra)]))
    headers = [
        (b"host", host.encode()),
        (b"x-amz-date", date.encode()),
        *extra,
        (b"authorization", _placeholder_auth(date, "us-east-1", service, signed)),
    ]
    out = dict(resign(method, target, headers, b"", _verdict(key, "us-east-1", service)))
    assert out[b"authorization"].decode() == expected


def test_session_token_is_sent_and_signed() -> None:
    keys = AwsKeys(FAKE_ID, *SUITE_KEY, "real-session-token", ("*.amazonaws.com",))
    verdict = Verdict("resign", keys=keys, region="us-east-1", service="service")
    headers = [
        (b"host", b"example.amazonaws.com"),
        (b"x-amz-date", b"20150830T123600Z"),
        (b"x-amz-security-token", b"placeholder-token"),
        (
            b"authorization",
            _placeholder_auth("20150830", "us-east-1", "service", "host;x-amz-date"),
        ),
    ]
    out = dict(resign(b"GET", b"/", headers, b"", verdict))
    assert out[b"x-amz-security-token"] == b"real-session-token"
    assert b"x-amz-security-token" in out[b"authorization"].split(b"SignedHeaders=")[1]


POLICY = Sigv4Policy()
KEYS = [AwsKeys(FAKE_ID, *SUITE_KEY, None, ("*.amazonaws.com",))]
AUTH = _placeholder_auth("20150830T123600Z", "us-east-1", "s3", "host;x-amz-date")


@pytest.mark.parametrize(
    ("target", "headers", "policy", "action", "words"),
    [
        (b"/", [(b"authorization", AUTH)], POLICY, "resign", ""),
        (
            b"/",
            [
                (b"authorization", AUTH),
                (b"x-amz-content-sha256", b"STREAMING-AWS4-HMAC-SHA256-PAYLOAD"),
            ],
            POLICY,
            "deny",
            "credentials.sigv4.streaming",
        ),
        (
            b"/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential="
            + f"{FAKE_ID}%2F20150830%2Fus-east-1%2Fs3%2Faws4_request".encode()
            + b"&X-Amz-Signature=00",
            [],
            POLICY,
            "deny",
            "credentials.sigv4.presigned",
        ),
        (
            b"/",
            [(b"authorization", AUTH.replace(b"AWS4-HMAC-SHA256", b"AWS4-ECDSA-P256-SHA256"))],
            POLICY,
            "deny",
            "credentials.sigv4.sigv4a",
        ),
        (
            b"/",
            [(b"authorization", AUTH.replace(b"AWS4-HMAC-SHA256", b"AWS4-ECDSA-P256-SHA256"))],
            Sigv4Policy(sigv4a="passthrough"),
            "passthrough",
            "",
        ),
        (
            b"/",
            [(b"authorization", AUTH.replace(FAKE_ID.encode(), b"AKIAREALREALREALREAL"))],
            POLICY,
            "none",
            "",
        ),
        (b"/", [(b"authorization", b"Bearer xyz")], POLICY, "none", ""),
        (
            b"/",
            [
                (
                    b"authorization",
                    f"AWS4-ECDSA-P256-SHA256 Credential={FAKE_ID}/20150830/s3/aws4_request, "
                    "SignedHeaders=host, Signature=00".encode(),
                )
            ],
            POLICY,
            "deny",
            "credentials.sigv4.sigv4a",
        ),
    ],
)
def test_shapes(
    target: bytes, headers: list[tuple[bytes, bytes]], policy: Sigv4Policy, action: str, words: str
) -> None:
    verdict = classify(b"GET", target, headers, KEYS, policy)
    assert verdict.action == action
    assert words in verdict.reason


# --- in a sandbox, against an upstream that verifies with the real keys ----------------


def _spec_signature(
    method: str, path: str, headers: dict[str, str], body: bytes, secret: str
) -> tuple[str, str]:
    """(signature the request carries, signature it should carry), from the SigV4 spec."""
    auth = headers["authorization"]
    fields = dict(f.strip().split("=", 1) for f in auth.split(" ", 1)[1].split(","))
    _, date, region, service, _ = fields["Credential"].split("/")
    signed = fields["SignedHeaders"].split(";")
    url = urllib.parse.urlsplit(path)
    query = sorted(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
    canonical_query = "&".join(
        f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
        for k, v in query
    )
    canonical_headers = "".join(f"{h}:{' '.join(headers[h].split())}\n" for h in signed)
    payload = headers.get("x-amz-content-sha256") or hashlib.sha256(body).hexdigest()
    canonical = "\n".join(
        [method, url.path or "/", canonical_query, canonical_headers, ";".join(signed), payload]
    )
    amz_date = headers["x-amz-date"]
    scope = f"{date}/{region}/{service}/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return fields["Signature"], hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


REAL_ID, REAL_SECRET = "AKIAREALKEYID0000001", "real-secret-access-key/0123456789abcdefghij"


class _Verifier(QuietHandler):
    def _handle(self) -> None:
        body = self.length_body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        ok = False
        if headers.get("authorization", "").startswith("AWS4-HMAC-SHA256 "):
            carried, wanted = _spec_signature(self.command, self.path, headers, body, REAL_SECRET)
            ok = carried == wanted and f"Credential={REAL_ID}/" in headers["authorization"]
        self.seen.append({"ok": ok, "auth": headers.get("authorization"), "body": body})
        out = b"verified\n" if ok else b"bad signature\n"
        self.send_response(200 if ok else 403)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_PUT = do_POST = _handle


@pytest.fixture(scope="module")
def verifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    from cryptography.hazmat.primitives.asymmetric import ec

    from tlsupstreams import CERTS, _cert, _key_pem, _pem

    CERTS.mkdir(exist_ok=True)
    os.chmod(CERTS, 0o755)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("sigv4 test CA", ca_key, None, [])
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = _cert("aws", key, ("sigv4 test CA", ca_key), ["127.0.0.1"])
    (CERTS / "sigv4-ca.pem").write_bytes(_pem(ca))
    os.chmod(CERTS / "sigv4-ca.pem", 0o644)
    (CERTS / "sigv4-leaf.pem").write_bytes(_pem(leaf) + _key_pem(key))
    seen: list[dict[str, object]] = []
    handler = type("Handler", (_Verifier,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(CERTS / "sigv4-leaf.pem"))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"port": server.server_address[1], "seen": seen, "ca": str(CERTS / "sigv4-ca.pem")}
    server.shutdown()


def _aws_settings(verifier: dict[str, object], **sigv4: str) -> dict[str, object]:
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    return {
        "network": {
            "allowedDomains": ["127.0.0.1"],
            "tlsTerminate": {"extraCaCertPaths": [verifier["ca"]]},
        },
        "credentials": {
            "envVars": [{"name": n, "mode": "mask"} for n in names],
            **({"sigv4": sigv4} if sigv4 else {}),
        },
    }


def _aws_env(world: World) -> dict[str, str]:
    return world.env(AWS_ACCESS_KEY_ID=REAL_ID, AWS_SECRET_ACCESS_KEY=REAL_SECRET)


def test_curl_signed_in_the_sandbox_is_resigned(world: World, verifier: dict[str, object]) -> None:
    port = verifier["port"]
    seen = verifier["seen"]
    assert isinstance(seen, list)
    mark = len(seen)
    s = world.settings(_aws_settings(verifier))
    script = (
        "curl -sS -m 10 --aws-sigv4 aws:amz:us-east-1:execute-api "
        '--user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" '
        '--data "{\\"id\\": \\"$AWS_ACCESS_KEY_ID\\"}" '
        f'"https://127.0.0.1:{port}/prod/items?b=2&a=1"; '
        'echo "$AWS_ACCESS_KEY_ID"'
    )
    r = world.sandhold(
        "-s", str(s), "--", "env", "NO_PROXY=", "no_proxy=", "sh", "-c", script, env=_aws_env(world)
    )
    assert r.returncode == 0, r.stderr
    answer, key_id = r.stdout.splitlines()
    assert answer == "verified", r.stdout + r.stderr
    assert key_id.startswith("AKIA") and len(key_id) == 20 and key_id != REAL_ID
    (got,) = seen[mark:]
    # the body's placeholder was put back before signing: the signature covers it
    assert got["ok"] and got["body"] == b'{"id": "%s"}' % REAL_ID.encode()
    for text in (r.stdout, r.stderr):
        assert REAL_SECRET not in text and REAL_ID not in text


@pytest.mark.parametrize(
    ("case", "curl_args"),
    [
        (
            "presigned",
            [
                "https://127.0.0.1:{port}/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=$AWS_ACCESS_KEY_ID%2F20250101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Signature=00"
            ],
        ),
        (
            "streaming",
            [
                "--aws-sigv4",
                "aws:amz:us-east-1:s3",
                "--user",
                "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY",
                "-H",
                "x-amz-content-sha256: STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
                "https://127.0.0.1:{port}/up",
            ],
        ),
        (
            "sigv4a",
            [
                "-H",
                "Authorization: AWS4-ECDSA-P256-SHA256 Credential=$AWS_ACCESS_KEY_ID/20250101/s3/"
                "aws4_request, SignedHeaders=host, Signature=00",
                "https://127.0.0.1:{port}/a",
            ],
        ),
    ],
)
def test_shapes_it_cannot_resign_get_403(
    world: World, verifier: dict[str, object], case: str, curl_args: list[str]
) -> None:
    port = verifier["port"]
    seen = verifier["seen"]
    assert isinstance(seen, list)
    mark = len(seen)
    s = world.settings(_aws_settings(verifier))
    args = " ".join(f'"{a.format(port=port)}"' for a in curl_args)
    r = world.sandhold(
        "-s",
        str(s),
        "--",
        "env",
        "NO_PROXY=",
        "no_proxy=",
        "sh",
        "-c",
        f"curl -sS -m 10 -i {args}",
        env=_aws_env(world),
    )
    assert "\nHTTP/1.1 403 " in r.stdout and f"credentials.sigv4.{case}" in r.stdout, (
        r.stdout + r.stderr
    )
    assert seen[mark:] == []  # nothing reached the upstream
