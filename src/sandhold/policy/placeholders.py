"""Placeholders: what a sandbox sees in place of a masked secret, and what the proxy puts back.

Rules (F-CRED-2):
- A placeholder never equals its secret, never contains it (secrets of 4 bytes
  or more), and no two placeholders of a run are equal or one inside the other:
  the proxy scans streams for them, so a nested pair would make what is
  replaced depend on where a chunk was cut. A clash is re-minted (a bounded
  number of times, then an error: it would mean the entropy source is broken).
- Randomness comes in as an argument (``entropy(n) -> n bytes``), so this module
  stays pure; the CLI passes ``os.urandom``. A placeholder is fresh per secret
  and per run.
- Shapes that tools check are kept: an AWS access key id keeps its four-letter
  prefix (AKIA, ASIA, ...) and its length; a JWT stays three base64url segments
  with JSON header and payload (``alg: HS256`` and a filler signature, never
  ``alg: none``, so a verifier the placeholder reaches rejects it); with
  ``maskClaims`` the original header and every other claim are kept and only
  the named string claims are replaced. Anything else becomes
  ``sandhold_placeholder_<32 hex>``, padded to the secret's length.
- ``extract``: every match's group 1 is replaced (one placeholder per distinct
  value) and every other byte is kept, so the file or value still parses;
  ``maskDuplicates`` also replaces the verbatim value where the pattern did not
  reach. Nothing matched (or no candidate is a JWT) is ``no_match``: the caller
  applies ``onExtractNoMatch``.
- ``Injection`` rows pair each placeholder with its real value and its hosts;
  their ``repr`` never shows the real value.
"""

from __future__ import annotations

from sandhold._record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from sandhold.policy.credentials import CredentialSource

PREFIX = "sandhold_placeholder_"
_PAD_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
_BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_AWS_KEY_PREFIXES = ("AKIA", "ASIA", "AIDA", "AROA", "AIPA", "ANPA", "ANVA", "APKA", "ABIA", "ACCA")
_FAR_FUTURE = 4102444800  # 2100-01-01: a placeholder token never looks expired
_MAX_TRIES = 8


class Injection:
    """One placeholder and the real value the proxy puts in its place, at ``hosts``."""

    __slots__ = ("hosts", "name", "placeholder", "real")

    def __init__(self, placeholder: str, real: str, hosts: tuple[str, ...], name: str) -> None:
        self.placeholder = placeholder
        self.real = real
        self.hosts = hosts
        self.name = name

    def __repr__(self) -> str:  # the real value must never reach a log or --explain
        return f"Injection({self.name!r}, {self.placeholder!r}, real=<{len(self.real)} chars>)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Injection) and (
            self.placeholder,
            self.real,
            self.hosts,
            self.name,
        ) == (other.placeholder, other.real, other.hosts, other.name)

    def __hash__(self) -> int:
        return hash((self.placeholder, self.hosts, self.name))


class AwsKeys:
    """One masked pair: the placeholder key id and the real keys (hidden from repr)."""

    __slots__ = ("access_key_id", "hosts", "placeholder", "secret_access_key", "session_token")

    def __init__(
        self,
        placeholder: str,
        access_key_id: str,
        secret_access_key: str,
        session_token: str | None,
        hosts: tuple[str, ...],
    ) -> None:
        self.placeholder = placeholder
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.session_token = session_token
        self.hosts = hosts

    def __repr__(self) -> str:
        return f"AwsKeys({self.placeholder!r}, real=<hidden>)"


@record
class Masked:
    """The masked text, its injections, and whether anything was found to mask."""

    text: str
    injections: tuple[Injection, ...] = ()
    no_match: bool = False


class Minter:
    """Mints the placeholders of one run (module rules); remembers them to keep them apart."""

    def __init__(self, entropy: Callable[[int], bytes]) -> None:
        self._entropy = entropy
        self._minted: list[str] = []

    def _fresh(self, secret: str, make: Callable[[], str]) -> str:
        for _ in range(_MAX_TRIES):
            candidate = make()
            if candidate == secret or (len(secret) >= 4 and secret in candidate):
                continue
            if any(candidate in m or m in candidate for m in self._minted):
                continue
            self._minted.append(candidate)
            return candidate
        raise RuntimeError("the entropy source keeps repeating itself; no placeholder minted")

    def _hex(self, n: int) -> str:
        return self._entropy(n).hex()

    def generic(self, secret: str) -> str:
        """``sandhold_placeholder_<hex>``, padded to the secret's byte length."""

        def make() -> str:
            base = PREFIX + self._hex(16)
            pad = len(secret.encode()) - len(base)
            if pad <= 0:
                return base
            return base + "".join(_PAD_ALPHABET[b % 36] for b in self._entropy(pad))

        return self._fresh(secret, make)

    def aws_key_id(self, secret: str) -> str:
        """The same prefix and length, in the key id's own alphabet."""

        def make() -> str:
            tail = self._entropy(len(secret) - 4)
            return secret[:4] + "".join(_BASE32[b % 32] for b in tail)

        return self._fresh(secret, make)

    def jwt(self, secret: str) -> str:
        """A well-formed HS256 token with a far-future ``exp`` and a filler signature."""

        def make() -> str:
            header = _b64json({"alg": "HS256", "typ": "JWT"})
            payload = _b64json({"exp": _FAR_FUTURE, "sandhold": PREFIX + self._hex(16)})
            return f"{header}.{payload}.{_b64(self._entropy(32))}"

        return self._fresh(secret, make)

    def shaped(self, secret: str) -> str:
        if is_aws_key_id(secret):
            return self.aws_key_id(secret)
        return self.generic(secret)


def is_aws_key_id(value: str) -> bool:
    return (
        len(value) == 20
        and value.startswith(_AWS_KEY_PREFIXES)
        and all(c.isdigit() or c in _BASE32 for c in value[4:])
    )


def _b64(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64json(value: object) -> str:
    import json

    return _b64(json.dumps(value, separators=(",", ":")).encode())


def _unb64json(segment: str) -> object:
    import base64
    import binascii
    import json

    try:
        raw = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
        return json.loads(raw)
    except (ValueError, binascii.Error):
        return None


def decode_jwt(token: str) -> tuple[dict[str, object], dict[str, object]] | None:
    """Header and payload of ``token`` if it is a JWT (three segments, JSON objects,
    ``alg`` in the header), else None."""
    parts = token.split(".")
    if len(parts) != 3 or not all(parts[:2]):
        return None
    header, payload = _unb64json(parts[0]), _unb64json(parts[1])
    if not isinstance(header, dict) or "alg" not in header or not isinstance(payload, dict):
        return None
    return header, payload


# A JWT anywhere in a text: every JWT starts with base64url '{"' (eyJ).
JWT_PATTERN = r"(eyJ[A-Za-z0-9_-]*\.eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*)"


def _mask_jwt(
    token: str, claims: Sequence[str] | None, minter: Minter, source: CredentialSource
) -> tuple[str, list[Injection]] | None:
    decoded = decode_jwt(token)
    if decoded is None:
        return None
    hosts = source.inject_hosts
    if claims is None:
        fake = minter.jwt(token)
        return fake, [Injection(fake, token, hosts, source.key)]
    _, payload = decoded
    rows: list[Injection] = []
    for claim in claims:
        value = payload.get(claim)
        if isinstance(value, str) and value:
            fake_claim = minter.generic(value)
            payload = {**payload, claim: fake_claim}
            rows.append(Injection(fake_claim, value, hosts, f"{source.key}.{claim}"))
    if not rows:
        return None
    header_segment = token.split(".", 1)[0]
    import json

    body = _b64(json.dumps(payload, separators=(",", ":")).encode())
    fake = minter._fresh(token, lambda: f"{header_segment}.{body}.{_b64(minter._entropy(32))}")
    return fake, [Injection(fake, token, hosts, source.key), *rows]


def mask(source: CredentialSource, value: str, minter: Minter) -> Masked:
    """Mask ``value`` (a variable's value or a file's text) as ``source`` asks.

    Raises:
        RuntimeError: the entropy source repeats itself.
    """
    hosts = source.inject_hosts
    if source.extract is None and source.decode is None:
        fake = minter.shaped(value)
        return Masked(fake, (Injection(fake, value, hosts, source.key),))
    import re

    pattern = re.compile(source.extract or JWT_PATTERN)
    done: dict[str, str] = {}  # real capture -> its placeholder
    rows: list[Injection] = []
    pieces: list[str] = []
    last = 0
    for m in pattern.finditer(value):
        start, end = m.span(1)
        if start < 0:
            continue  # group 1 did not take part in this match
        real = m.group(1)
        if real not in done:
            if source.decode == "jwt":
                masked = _mask_jwt(real, source.mask_claims, minter, source)
                if masked is None:
                    continue  # not a JWT: left as it is
                done[real], new_rows = masked[0], masked[1]
                rows.extend(new_rows)
            elif real:
                done[real] = minter.shaped(real)
                rows.append(Injection(done[real], real, hosts, source.key))
            else:
                continue
        pieces.append(value[last:start])
        pieces.append(done[real])
        last = end
    pieces.append(value[last:])
    if not done:
        return Masked(value, no_match=True)
    text = "".join(pieces)
    if source.mask_duplicates:
        for real, fake in sorted(done.items(), key=lambda kv: -len(kv[0])):
            text = _replace_outside(text, real, fake, list(done.values()))
    return Masked(text, tuple(rows))


def _replace_outside(text: str, real: str, fake: str, fakes: Sequence[str]) -> str:
    """Replace ``real`` with ``fake`` where it is not inside a placeholder already placed."""
    out: list[str] = []
    i = 0
    while True:
        j = text.find(real, i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        inside = next((f for f in fakes if f and _covers(text, f, j, len(real))), None)
        if inside is not None:
            k = text.find(inside, max(0, j - len(inside) + 1))
            out.append(text[i : k + len(inside)])
            i = k + len(inside)
            continue
        out.append(text[i:j])
        out.append(fake)
        i = j + len(real)


def _covers(text: str, fake: str, at: int, length: int) -> bool:
    start = max(0, at - len(fake) + length)
    k = text.find(fake, start)
    return 0 <= k <= at and at + length <= k + len(fake)
