"""AWS SigV4: re-signing, with the real keys, requests the sandbox signed with masked ones.

Rules (F-CRED-3):
- A request is this module's only when it names a masked pair's placeholder
  access key id (exact match, in the ``Credential=`` of its ``Authorization``
  or its ``X-Amz-Credential`` query parameter) and its CONNECT target is one of
  that key id's hosts. Everything else, requests signed with real keys
  included, is left alone.
- Shapes: ``AWS4-HMAC-SHA256`` in ``Authorization`` is re-signed. A presigned
  URL (``X-Amz-Algorithm``/``X-Amz-Signature`` in the query), a streaming
  upload (``x-amz-content-sha256: STREAMING-*``) and SigV4A
  (``AWS4-ECDSA-P256-SHA256``) cannot be: each follows its
  ``credentials.sigv4`` policy, ``deny`` (the default: 403 naming the case and
  the setting) or ``passthrough`` (forwarded with the ordinary substitution; the
  upstream will reject the placeholder signature).
- Re-signing is botocore's ``SigV4Auth`` (imported on first use; never our own
  HMAC), over the headers the client signed plus ``x-amz-date``,
  ``x-amz-security-token`` and ``x-amz-content-sha256``, the body bytes actually
  forwarded (a literal payload hash is recomputed; ``UNSIGNED-PAYLOAD`` stays),
  the client's ``X-Amz-Date``, and the scope's region and service. With a
  session token, the real token is sent (and signed) as
  ``x-amz-security-token``. Without botocore such a request is refused 403.
"""

from __future__ import annotations

from sandhold._record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from sandhold.policy.credentials import Sigv4Policy
    from sandhold.policy.placeholders import AwsKeys

HMAC = "AWS4-HMAC-SHA256"
ECDSA = "AWS4-ECDSA-P256-SHA256"
UNSIGNED = "UNSIGNED-PAYLOAD"
EXTRA_SIGNED = (b"x-amz-date", b"x-amz-security-token", b"x-amz-content-sha256")


@record
class Verdict:
    """``action`` is "none" (not ours), "resign", "deny" or "passthrough"."""

    action: str
    reason: str = ""
    code: str = ""
    keys: AwsKeys | None = None
    region: str = ""
    service: str = ""


NONE = Verdict("none")


def _credential(value: str) -> tuple[str, str, str] | None:
    """(key id, region, service) of ``AKID/date/region/service/aws4_request``, or of
    SigV4A's ``AKID/date/service/aws4_request`` (no region: it is signed for a set)."""
    parts = value.split("/")
    if len(parts) == 4 and parts[3] == "aws4_request":
        return parts[0], "", parts[2]
    if len(parts) != 5 or parts[4] != "aws4_request":
        return None
    return parts[0], parts[2], parts[3]


def _query(target: bytes) -> dict[str, str]:
    from urllib.parse import parse_qsl

    _, _, query = target.partition(b"?")
    try:
        return dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True))
    except ValueError:
        return {}


def classify(
    method: bytes,
    target: bytes,
    headers: Sequence[tuple[bytes, bytes]],
    keys: Sequence[AwsKeys],
    policy: Sigv4Policy,
) -> Verdict:
    """What to do with one request (module rules); ``keys`` are those of its host."""
    if not keys:
        return NONE
    by_placeholder = {k.placeholder: k for k in keys}
    lower = {k.lower(): v for k, v in headers}
    auth = lower.get(b"authorization", b"").decode("latin-1")
    algorithm, _, rest = auth.partition(" ")
    found: tuple[str, str, str] | None = None
    for field in rest.split(","):
        name, _, value = field.strip().partition("=")
        if name == "Credential":
            found = _credential(value)
    shape = ""
    if found is not None and found[0] in by_placeholder:
        if algorithm == ECDSA:
            shape = "sigv4a"
        elif algorithm != HMAC or not found[1]:
            return NONE
        elif lower.get(b"x-amz-content-sha256", b"").startswith(b"STREAMING-"):
            shape = "streaming"
    else:
        query = _query(target)
        cred = _credential(query.get("X-Amz-Credential", ""))
        if cred is None or cred[0] not in by_placeholder or "X-Amz-Algorithm" not in query:
            return NONE
        found, shape = cred, "presigned"
    assert found is not None
    key, region, service = found
    if not shape:
        return Verdict("resign", keys=by_placeholder[key], region=region, service=service)
    why = {
        "streaming": "an aws-chunked streaming upload signs each chunk off the seed "
        "signature, so re-signing would mean rewriting the body",
        "presigned": "a presigned URL carries its signature in the URL itself",
        "sigv4a": "SigV4A signatures are asymmetric: there is no shared-key HMAC to redo",
    }[shape]
    if getattr(policy, shape) == "passthrough":
        return Verdict("passthrough", code=f"sigv4-{shape}")
    setting = f"credentials.sigv4.{shape}"
    return Verdict(
        "deny",
        reason=f"sandhold cannot re-sign this masked-credential request: {why} "
        f'({setting} is "deny"; "passthrough" forwards it unsigned)',
        code=f"sigv4-{shape}",
    )


def resign(
    method: bytes,
    target: bytes,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes,
    verdict: Verdict,
) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``authorization`` (and the token, date and payload hash)
    signed anew with the real keys over ``body``.

    Raises:
        ImportError: botocore is not installed.
    """
    import hashlib

    from botocore.auth import S3SigV4Auth, SigV4Auth  # type: ignore[import-untyped]
    from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]
    from botocore.credentials import Credentials  # type: ignore[import-untyped]

    keys = verdict.keys
    assert keys is not None
    lower = [(k.lower(), v) for k, v in headers]
    original = dict(lower)
    auth = original.get(b"authorization", b"").decode("latin-1")
    signed = set()
    for field in auth.partition(" ")[2].split(","):
        name, _, value = field.strip().partition("=")
        if name == "SignedHeaders":
            signed = {h.encode() for h in value.split(";") if h}
    amz_date = original.get(b"x-amz-date", b"").decode("latin-1")
    if not amz_date:
        import datetime

        amz_date = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    payload = original.get(b"x-amz-content-sha256")
    drop = {b"authorization", b"x-amz-date", b"x-amz-security-token"}
    out = [(k, v) for k, v in lower if k not in drop]
    extra: list[tuple[bytes, bytes]] = [(b"x-amz-date", amz_date.encode())]
    if keys.session_token is not None:
        extra.append((b"x-amz-security-token", keys.session_token.encode()))
    if payload is not None and payload != UNSIGNED.encode():
        payload = hashlib.sha256(body).hexdigest().encode()  # over what is forwarded
        out = [(k, v) for k, v in out if k != b"x-amz-content-sha256"]
        extra.append((b"x-amz-content-sha256", payload))
    out += extra
    to_sign = [(k, v) for k, v in out if k in signed or k in EXTRA_SIGNED]
    host = original.get(b"host", b"").decode("latin-1")
    request = AWSRequest(
        method=method.decode("ascii"),
        url=f"https://{host}{target.decode('latin-1')}",
        headers={k.decode("latin-1"): v.decode("latin-1") for k, v in to_sign},
        data=body,
    )
    request.context["timestamp"] = amz_date
    if payload == UNSIGNED.encode():
        request.context["payload_signing_enabled"] = False
    creds = Credentials(keys.access_key_id, keys.secret_access_key, keys.session_token)
    signer_class = S3SigV4Auth if verdict.service == "s3" else SigV4Auth
    signer = signer_class(creds, verdict.service, verdict.region)
    canonical = signer.canonical_request(request)
    signature = signer.signature(signer.string_to_sign(request, canonical), request)
    names = signer.signed_headers(signer.headers_to_sign(request))
    value = (
        f"{HMAC} Credential={signer.scope(request)}, SignedHeaders={names}, Signature={signature}"
    )
    return [(b"authorization", value.encode()), *out]
