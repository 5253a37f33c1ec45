"""The ``credentials`` block and ``network.tlsTerminate``, read as srt 0.0.83 reads them.

Rules (F-CRED-1, F-CRED-2, F-SET-3):
- Each ``files``/``envVars`` entry is a ``CredentialSource``: ``mode`` deny or
  mask; ``extract`` is a regular expression whose group 1 is the secret (at
  least one capturing group, or it is refused); ``onExtractNoMatch`` warn
  (default), deny or error; ``decode: "jwt"``; ``maskClaims`` needs ``decode``
  and is never an explicit empty list; ``maskDuplicates``; ``injectHosts``.
- ``injectHosts`` omitted means the allowed domains (their ``:port`` dropped:
  injection is per host). An explicit empty list is refused (masked but never
  injected). Every entry must be covered by ``network.allowedDomains``
  (wildcard-aware, ``api.github.com`` under ``*.github.com``), must not be
  wholly denied by ``deniedDomains``, and, for a masked source, not wholly inside
  ``tlsTerminate.excludeDomains``. With ``allowAllDomains`` a masked source must
  name its hosts: "every host" is no place to send a secret.
- A masked source needs ``network.tlsTerminate`` (the real value goes only to a
  certificate-verified upstream) unless ``allowPlaintextInject`` is set.
- A masked file is one file: a path ending in ``/`` is refused.
- ``awsPairs`` slots name masked, whole-value ``envVars`` entries (no
  ``extract``/``decode``), each variable in one slot only. The standard trio
  ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (+ ``AWS_SESSION_TOKEN``) is
  paired automatically when masked whole-value and not in an explicit pair.
- ``sigv4`` shapes (streaming, presigned, sigv4a) default to ``deny``.
- ``tlsTerminate``: ``caCertPath`` and ``caKeyPath`` together or neither;
  ``maxTunnels`` 1-65536 (256); ``handshakeTimeoutMs`` 100-600000 (10000).
- Every problem is reported as (dotted key, reason); the reason says what to
  change. Nothing here touches the OS: the settings parser hands in the parsed
  JSON (already type-checked against its schema).
"""

from __future__ import annotations

from sandhold._record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

DENY = "deny"
MASK = "mask"
AWS_TRIO = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
DEFAULT_MAX_TUNNELS = 256
DEFAULT_HANDSHAKE_TIMEOUT_MS = 10_000


@record
class CredentialSource:
    """One ``credentials.files`` or ``credentials.envVars`` entry.

    ``inject_hosts`` is the resolved list (the allowed domains when the entry
    named none); ``extract`` is already translated to Python's spelling.
    """

    kind: str  # "file" or "env"
    key: str  # its settings key, e.g. "credentials.envVars[0]"
    target: str  # the path as written, or the variable's name
    mode: str
    extract: str | None = None
    on_no_match: str = "warn"
    decode: str | None = None
    mask_claims: tuple[str, ...] | None = None
    mask_duplicates: bool = False
    inject_hosts: tuple[str, ...] = ()


@record
class AwsPair:
    access_key_id_var: str
    secret_access_key_var: str
    session_token_var: str | None = None
    automatic: bool = False  # the standard trio, paired because it was masked


@record
class Sigv4Policy:
    streaming: str = DENY
    presigned: str = DENY
    sigv4a: str = DENY


@record
class TlsTerminate:
    ca_cert_path: str | None = None
    ca_key_path: str | None = None
    exclude_domains: tuple[str, ...] = ()
    extra_ca_cert_paths: tuple[str, ...] = ()
    max_tunnels: int = DEFAULT_MAX_TUNNELS
    handshake_timeout_ms: int = DEFAULT_HANDSHAKE_TIMEOUT_MS


@record
class Credentials:
    sources: tuple[CredentialSource, ...] = ()
    allow_plaintext_inject: bool = False
    aws_pairs: tuple[AwsPair, ...] = ()
    sigv4: Sigv4Policy = Sigv4Policy()

    @property
    def masked(self) -> tuple[CredentialSource, ...]:
        return tuple(s for s in self.sources if s.mode == MASK)


class CredentialsProblem(ValueError):
    """A credentials or tlsTerminate setting srt would refuse: ``key`` and ``reason``."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


# What common tools read for their trust roots: the sandbox's point at the bundle of
# sandhold's CA, the system roots and extraCaCertPaths.
TRUST_VARIABLES = (
    "SSL_CERT_FILE",  # OpenSSL (Python, Ruby, git built on OpenSSL, ...)
    "REQUESTS_CA_BUNDLE",  # requests
    "CURL_CA_BUNDLE",  # curl
    "NODE_EXTRA_CA_CERTS",  # node (added to its own roots)
    "GIT_SSL_CAINFO",  # git
    "PIP_CERT",  # pip
    "AWS_CA_BUNDLE",  # boto3, aws cli
    "CARGO_HTTP_CAINFO",  # cargo
    "DENO_CERT",  # deno
)
TRUST_BUNDLE_NAME = "sandhold-ca-bundle.pem"


def default_ca_dir(home: str, xdg_state_home: str | None) -> str:
    """Where sandhold keeps its per-install CA: ``$XDG_STATE_HOME/sandhold/ca``, else
    ``~/.local/state/sandhold/ca`` (the plan denies the sandbox reading it)."""
    base = xdg_state_home if xdg_state_home and xdg_state_home.startswith("/") else None
    return f"{(base or home.rstrip('/') + '/.local/state').rstrip('/')}/sandhold/ca"


def strip_port(entry: str) -> str:
    from sandhold.policy.domains import split_port

    return split_port(entry)[0]


def inject_host_covered(host: str, patterns: Iterable[str]) -> bool:
    """Whether every host ``host`` (a pattern) names is matched by one of ``patterns``.

    Ports are dropped first. A concrete name is covered by an entry that matches
    it; a wildcard only by the same wildcard or a ``*.`` entry whose base is a
    suffix of what follows its ``*``.

    >>> inject_host_covered("api.github.com", ["*.github.com"])
    True
    >>> inject_host_covered("*.github.com", ["github.com"])
    False
    >>> inject_host_covered("*.a.b.com", ["*.b.com"])
    True
    """
    from sandhold.policy.domains import matches

    host = host.lower().rstrip(".")
    bare = [strip_port(p).lower() for p in patterns]
    if "*" not in host:
        for p in bare:
            try:
                if matches(p, host):
                    return True
            except ValueError:
                continue  # an entry that is no pattern covers nothing
        return False
    after = host[host.index("*") + 1 :]  # ".github.com" of "*.github.com"
    return any(p == host or (p.startswith("*.") and after.endswith(p[1:])) for p in bare)


def _translate_regex(pattern: str) -> str:
    """srt's patterns are JavaScript; the spellings that differ in Python's ``re``
    are named groups and their back-references."""
    import re

    pattern = re.sub(r"\(\?<(?=[A-Za-z_])", "(?P<", pattern)
    return re.sub(r"\\k<([A-Za-z_][A-Za-z0-9_]*)>", r"(?P=\1)", pattern)


def check_extract(pattern: str) -> str:
    """The Python spelling of ``extract``; raises ValueError saying what is wrong."""
    import re

    translated = _translate_regex(pattern)
    try:
        compiled = re.compile(translated)
    except re.error as exc:
        raise ValueError(f"extract is not a valid regular expression: {exc}") from None
    if compiled.groups < 1:
        raise ValueError(
            "extract must contain at least one capturing group: group 1 is the "
            'credential value to mask (e.g. "token:\\s*(\\S+)")'
        )
    return translated


def read_tls_terminate(raw: Mapping[str, object] | None) -> TlsTerminate | None:
    """``network.tlsTerminate`` (schema-checked) as a value.

    Raises:
        CredentialsProblem: the CA pair is half given.
    """
    if raw is None:
        return None
    cert, key = raw.get("caCertPath"), raw.get("caKeyPath")
    if (cert is None) != (key is None):
        raise CredentialsProblem(
            "network.tlsTerminate", "caCertPath and caKeyPath must be provided together"
        )
    return TlsTerminate(
        ca_cert_path=cert,  # type: ignore[arg-type]
        ca_key_path=key,  # type: ignore[arg-type]
        exclude_domains=tuple(raw.get("excludeDomains", ())),  # type: ignore[arg-type]
        extra_ca_cert_paths=tuple(raw.get("extraCaCertPaths", ())),  # type: ignore[arg-type]
        max_tunnels=int(raw.get("maxTunnels", DEFAULT_MAX_TUNNELS)),  # type: ignore[call-overload]
        handshake_timeout_ms=int(
            raw.get("handshakeTimeoutMs", DEFAULT_HANDSHAKE_TIMEOUT_MS)  # type: ignore[call-overload]
        ),
    )


def read_credentials(
    raw: Mapping[str, object],
    *,
    allowed_domains: Sequence[str],
    denied_domains: Sequence[str] = (),
    allow_all_domains: bool = False,
    tls: TlsTerminate | None = None,
) -> Credentials:
    """Validate the (schema-checked) ``credentials`` block against the network lists.

    Raises:
        CredentialsProblem: the first rule broken (module rules), naming its key.
    """
    allowed_hosts = tuple(dict.fromkeys(strip_port(p) for p in allowed_domains))
    exclude = tls.exclude_domains if tls is not None else ()
    sources: list[CredentialSource] = []
    for group, kind, field in (("files", "file", "path"), ("envVars", "env", "name")):
        entries = raw.get(group, [])
        assert isinstance(entries, list)
        for i, entry in enumerate(entries):
            key = f"credentials.{group}[{i}]"
            for required in (field, "mode"):
                if required not in entry:
                    raise CredentialsProblem(f"{key}.{required}", "missing")
            mode = entry["mode"]
            inject = entry.get("injectHosts")
            if inject is not None:
                for j, host in enumerate(inject):
                    if allow_all_domains:
                        continue
                    if not inject_host_covered(host, allowed_hosts):
                        raise CredentialsProblem(
                            f"{key}.injectHosts[{j}]",
                            f"{host!r} is not reachable via network.allowedDomains: add "
                            f"{host!r} (or a covering wildcard) to allowedDomains, or remove "
                            "it from injectHosts",
                        )
                    if inject_host_covered(host, [d for d in denied_domains if d != "*"]) or (
                        "*" in denied_domains
                    ):
                        raise CredentialsProblem(
                            f"{key}.injectHosts[{j}]",
                            f"{host!r} is refused by network.deniedDomains, so the credential "
                            "could never reach it: remove it from one of the two lists",
                        )
            extract = None
            if "extract" in entry:
                try:
                    extract = check_extract(entry["extract"])
                except ValueError as exc:
                    raise CredentialsProblem(f"{key}.extract", str(exc)) from None
            claims = entry.get("maskClaims")
            if claims is not None and "decode" not in entry:
                raise CredentialsProblem(
                    f"{key}.maskClaims",
                    "maskClaims requires decode: it names claims inside the decoded payload. "
                    'Set decode (e.g. "jwt"), or remove maskClaims to mask the whole value',
                )
            if claims is not None and not claims:
                raise CredentialsProblem(
                    f"{key}.maskClaims",
                    "maskClaims is explicitly empty: no claim would ever be masked. Omit it "
                    "to mask the whole token, or list the claims to protect",
                )
            if claims is not None and not all(claims):
                raise CredentialsProblem(f"{key}.maskClaims", "a claim name is empty")
            if mode == MASK:
                if inject is not None and not inject:
                    raise CredentialsProblem(
                        key,
                        "injectHosts is explicitly empty: the credential would be masked but "
                        "never injected. Omit injectHosts to default to "
                        "network.allowedDomains, or list the intended hosts",
                    )
                if inject is None and allow_all_domains:
                    raise CredentialsProblem(
                        key,
                        "with network.allowAllDomains a masked credential must list its "
                        "injectHosts: the real value would otherwise go to any host",
                    )
                if exclude and inject is not None:
                    for j, host in enumerate(inject):
                        if inject_host_covered(host, exclude):
                            raise CredentialsProblem(
                                f"{key}.injectHosts[{j}]",
                                f"{host!r} is entirely covered by "
                                "network.tlsTerminate.excludeDomains: injection runs only "
                                "on TLS-terminated connections, so it would receive the "
                                "placeholder. Remove it from one of the two lists",
                            )
                elif (
                    exclude
                    and allowed_hosts
                    and all(inject_host_covered(p, exclude) for p in allowed_hosts)
                ):
                    raise CredentialsProblem(
                        key,
                        "no injectHosts, so it defaults to network.allowedDomains, but "
                        "network.tlsTerminate.excludeDomains covers every allowed domain: "
                        "it could never be injected anywhere",
                    )
                if kind == "file" and entry["path"].endswith("/"):
                    raise CredentialsProblem(
                        f"{key}.path",
                        'mode "mask" applies to a single file, not a directory. Use mode '
                        f'"deny" for {entry["path"]!r}, or point at the credential file inside it',
                    )
            sources.append(
                CredentialSource(
                    kind=kind,
                    key=key,
                    target=entry[field],
                    mode=mode,
                    extract=extract,
                    on_no_match=entry.get("onExtractNoMatch", "warn"),
                    decode=entry.get("decode"),
                    mask_claims=tuple(claims) if claims is not None else None,
                    mask_duplicates=bool(entry.get("maskDuplicates", False)),
                    inject_hosts=tuple(inject) if inject is not None else allowed_hosts,
                )
            )
    pairs = _aws_pairs(raw, sources)
    masked = any(s.mode == MASK for s in sources)
    plaintext = bool(raw.get("allowPlaintextInject", False))
    if masked and tls is None and not plaintext:
        raise CredentialsProblem(
            "credentials",
            "credential masking requires network.tlsTerminate so that the real value is "
            "sent only over a verified TLS connection. Enable tlsTerminate, or set "
            "credentials.allowPlaintextInject to opt out (not recommended)",
        )
    sigv4 = raw.get("sigv4", {})
    assert isinstance(sigv4, dict)
    return Credentials(
        sources=tuple(sources),
        allow_plaintext_inject=plaintext,
        aws_pairs=pairs,
        sigv4=Sigv4Policy(
            streaming=sigv4.get("streaming", DENY),
            presigned=sigv4.get("presigned", DENY),
            sigv4a=sigv4.get("sigv4a", DENY),
        ),
    )


def _aws_pairs(
    raw: Mapping[str, object], sources: Sequence[CredentialSource]
) -> tuple[AwsPair, ...]:
    env = {s.target: s for s in sources if s.kind == "env"}
    seen: set[str] = set()
    pairs: list[AwsPair] = []
    explicit = raw.get("awsPairs", [])
    assert isinstance(explicit, list)
    for i, pair in enumerate(explicit):
        slots = [
            ("accessKeyIdVar", pair["accessKeyIdVar"]),
            ("secretAccessKeyVar", pair["secretAccessKeyVar"]),
        ]
        if "sessionTokenVar" in pair:
            slots.append(("sessionTokenVar", pair["sessionTokenVar"]))
        for field, name in slots:
            key = f"credentials.awsPairs[{i}].{field}"
            if name in seen:
                raise CredentialsProblem(
                    key,
                    f"{name!r} appears in more than one awsPairs slot (within or across "
                    "pairs): each variable can fill exactly one slot",
                )
            seen.add(name)
            src = env.get(name)
            if src is None or src.mode != MASK:
                raise CredentialsProblem(
                    key,
                    f"{name!r} does not name a credentials.envVars entry with mode "
                    '"mask": an AWS pair links already-masked variables; add the entry '
                    "(masking is the opt-in for SigV4 re-signing)",
                )
            if src.extract is not None or src.decode is not None:
                raise CredentialsProblem(
                    key,
                    f"{name!r} uses extract/decode, but an AWS pair member must be masked "
                    "whole-value: re-signing matches the fake access key id exactly and "
                    "needs the entire real value",
                )
        pairs.append(
            AwsPair(pair["accessKeyIdVar"], pair["secretAccessKeyVar"], pair.get("sessionTokenVar"))
        )

    def whole(name: str) -> bool:
        src = env.get(name)
        return (
            src is not None
            and src.mode == MASK
            and src.extract is None
            and src.decode is None
            and name not in seen
        )

    key_id, secret, token = AWS_TRIO
    if whole(key_id) and whole(secret):
        pairs.append(AwsPair(key_id, secret, token if whole(token) else None, automatic=True))
    return tuple(pairs)
