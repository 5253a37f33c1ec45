"""srt-compatible settings: parse, validate, default.

Rules:
- The file has srt's JSON shape (``~/.srt-settings.json`` works unchanged) plus
  sandhold's own ``env`` block. Every key srt knows is listed in ``SCHEMA`` with
  what sandhold does with it on Linux: enforce it, accept it as having no effect
  here (said in ``--explain``), or refuse the file because honouring it is not
  possible yet and ignoring it would weaken the policy.
- Unknown keys, wrong types, bad patterns, an empty file or a file that is not
  JSON are errors naming the file, the dotted key and the problem
  (``SettingsError``). Nothing ever falls back to the defaults.
- Parsing takes a string; ``load_settings`` is the only function that reads disk.
"""

from __future__ import annotations

from sandhold._record import record
from sandhold.errors import SettingsError
from sandhold.policy import paths

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from sandhold.policy.credentials import AwsPair, CredentialSource, Sigv4Policy, TlsTerminate

DEFAULT_SETTINGS_NAME = ".sandhold-settings.json"
DEFAULTS_SOURCE = "<built-in defaults>"


@record
class FilesystemSettings:
    deny_read: tuple[str, ...] = ()
    allow_read: tuple[str, ...] = ()
    allow_write: tuple[str, ...] = ()
    deny_write: tuple[str, ...] = ()
    # sandhold's own key: below these, the default credential globs do not apply
    allow_credential_write: tuple[str, ...] = ()
    # sandhold's own key: read-denied trees whose files' hard links go unchecked
    skip_hard_link_check: tuple[str, ...] = ()


@record
class NetworkSettings:
    allowed_domains: tuple[str, ...] = ()
    denied_domains: tuple[str, ...] = ()
    allow_unix_sockets: tuple[str, ...] = ()
    allow_all_unix_sockets: bool = False
    allow_local_binding: bool = False
    allow_all_domains: bool = False


@record
class CredentialSettings:
    """The validated ``credentials`` block (``policy.credentials`` reads it) and
    ``network.tlsTerminate``; empty when the file has neither."""

    sources: tuple[CredentialSource, ...] = ()
    allow_plaintext_inject: bool = False
    aws_pairs: tuple[AwsPair, ...] = ()
    sigv4: Sigv4Policy | None = None
    tls_terminate: TlsTerminate | None = None

    @property
    def masked(self) -> tuple[CredentialSource, ...]:
        return tuple(s for s in self.sources if s.mode == "mask")

    @property
    def file_paths(self) -> tuple[str, ...]:
        return tuple(s.target for s in self.sources if s.kind == "file")


@record
class Settings:
    """A validated settings file (or the built-in defaults).

    ``notes`` are human sentences about keys that were accepted but change nothing
    on this platform, or were honoured more strictly than written; the CLI prints
    them under ``--debug`` and ``--explain``, and ``warnings`` always.
    """

    source: str = DEFAULTS_SOURCE
    filesystem: FilesystemSettings = FilesystemSettings()
    network: NetworkSettings = NetworkSettings()
    env_passthrough: tuple[str, ...] = ()
    env_deny: tuple[str, ...] = ()
    bwrap_path: str | None = None
    git_safe_directories: tuple[str, ...] = ()
    # git.allowConfig (sandhold's own key): the repository config keys a run may change,
    # applied by the host after the run (``policy.gitchanges``)
    git_allow_config: tuple[str, ...] = ()
    # limits.processes, limits.memoryMiB (None: policy.limits' defaults)
    limit_processes: int | None = None
    limit_memory_mib: int | None = None
    credentials: CredentialSettings = CredentialSettings()
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


DEFAULT_SETTINGS = Settings()


# --- the schema table ---------------------------------------------------------
# A node is one of:
#   ("str",) ("bool",) ("int", lo, hi) ("list", item) ("map", value) ("object", {key: node})
#   ("tuple2int",)
# Each object key maps to (node, disposition). Dispositions:
#   "use"        read by sandhold and enforced
#   "inert:WHY"  accepted; has no effect on Linux or only affects reporting
#   "strict:WHY" accepted; sandhold is stricter than the key asks (warned)
#   "refuse:WHY" accepted only when absent/false/empty: a set value is an error
_S: tuple[str] = ("str",)
_B: tuple[str] = ("bool",)
_LS = ("list", _S)

_MACOS = "inert:macOS only"
# The user asks for traffic to take a route sandhold does not build (their own proxy
# ports, a parent proxy, TLS interception): going direct instead would bypass it.
_NET_LATER = (
    "refuse:sandhold's own proxies would go direct instead of the route this asks for; "
    "remove the key to use them"
)

SCHEMA: dict[str, tuple[object, str]] = {
    "filesystem": (
        (
            "object",
            {
                "denyRead": (("list", ("pathentry",)), "use"),
                "allowRead": (("list", ("pathentry",)), "use"),
                "allowWrite": (("list", ("pathentry",)), "use"),
                "denyWrite": (("list", ("pathentry",)), "use"),
                "allowCredentialWrite": (("list", ("path",)), "use"),
                "skipHardLinkCheck": (("list", ("path",)), "use"),
                "allowGitConfig": (
                    _B,
                    "strict:.git/config is a mandatory write deny (F-SET-5) and stays read-only; "
                    "git.allowConfig lets a run change chosen keys",
                ),
                "disabled": (
                    _B,
                    "refuse:sandhold never switches its filesystem policy off; "
                    "use --backend none to run without isolation",
                ),
            },
        ),
        "use",
    ),
    "network": (
        (
            "object",
            {
                "allowedDomains": (("list", ("domain",)), "use"),
                "deniedDomains": (("list", ("denied-domain",)), "use"),
                "deniedDomainReasons": (("map", _S), "inert:reasons only label refusals"),
                "strictAllowlist": (_B, "inert:sandhold's allowlist is always strict"),
                "allowAllDomains": (_B, "use"),
                "allowUnixSockets": (("list", ("path",)), "use"),
                "allowAllUnixSockets": (_B, "use"),
                "allowLocalBinding": (
                    _B,
                    "inert:on Linux the sandbox binds only its own loopback",
                ),
                "allowMachLookup": (_LS, _MACOS),
                "httpProxyPort": (("int", 1, 65535), _NET_LATER),
                "socksProxyPort": (("int", 1, 65535), _NET_LATER),
                "mitmProxy": (
                    (
                        "object",
                        {"socketPath": (_S, "use"), "domains": (("list", ("hostpattern",)), "use")},
                    ),
                    _NET_LATER,
                ),
                "tlsTerminate": (
                    (
                        "object",
                        {
                            "caCertPath": (_S, "use"),
                            "caKeyPath": (_S, "use"),
                            "excludeDomains": (("list", ("hostpattern",)), "use"),
                            "extraCaCertPaths": (_LS, "use"),
                            "maxTunnels": (("int", 1, 65536), "use"),
                            "handshakeTimeoutMs": (("int", 100, 600000), "use"),
                        },
                    ),
                    "use",
                ),
                # srt 0.0.83's request-pipeline keys
                "deniedResolvedAddresses": (
                    ("list", ("address",)),
                    "refuse:sandhold's resolved-address guard takes no extra ranges yet, and "
                    "dialling a name that resolves into one would break the rule; remove the "
                    "key (the built-in guard still refuses local and metadata addresses)",
                ),
                "refuseOpaqueTunnels": (
                    _B,
                    "refuse:sandhold cannot see into tunnels it does not terminate, so it "
                    "cannot refuse only the opaque ones; remove the key or set it to false",
                ),
                "requireHostMatch": (
                    _B,
                    "refuse:sandhold's HTTP proxy does not compare the Host header or the TLS "
                    "name with the CONNECT target yet (it always dials the CONNECT target); "
                    "remove the key or set it to false",
                ),
                "stripResponseHeaders": (
                    ("list", ("nonempty",)),
                    "refuse:sandhold passes response headers through unchanged, so the "
                    "named headers would reach the sandbox; remove the key",
                ),
                "allowPlaintextHeaderSet": (
                    _B,
                    "inert:it only governs header edits of a filterRequest callback, which a "
                    "settings file cannot set",
                ),
                "ambiguousRequestTarget": (
                    ("enum", "refuse", "asSpelled", "normalize"),
                    "inert:it only applies while a filterRequest callback is set, which a "
                    "settings file cannot set",
                ),
                "parentProxy": (
                    (
                        "object",
                        {"http": (_S, "use"), "https": (_S, "use"), "noProxy": (_S, "use")},
                    ),
                    _NET_LATER,
                ),
            },
        ),
        "use",
    ),
    "credentials": (
        (
            "object",
            {
                "files": (
                    (
                        "list",
                        (
                            "object",
                            {
                                "path": (("path",), "use"),
                                "mode": (("enum", "deny", "mask"), "use"),
                                "extract": (_S, "use"),
                                "onExtractNoMatch": (("enum", "warn", "deny", "error"), "use"),
                                "decode": (("enum", "jwt"), "use"),
                                "maskClaims": (("list", ("nonempty",)), "use"),
                                "maskDuplicates": (_B, "use"),
                                "injectHosts": (("list", ("hostpattern",)), "use"),
                            },
                        ),
                    ),
                    "use",
                ),
                "envVars": (
                    (
                        "list",
                        (
                            "object",
                            {
                                "name": (("envname",), "use"),
                                "mode": (("enum", "deny", "mask"), "use"),
                                "extract": (_S, "use"),
                                "onExtractNoMatch": (("enum", "warn", "deny", "error"), "use"),
                                "decode": (("enum", "jwt"), "use"),
                                "maskClaims": (("list", ("nonempty",)), "use"),
                                "injectHosts": (("list", ("hostpattern",)), "use"),
                            },
                        ),
                    ),
                    "use",
                ),
                "allowPlaintextInject": (_B, "use"),
                "awsPairs": (
                    (
                        "list",
                        (
                            "object",
                            {
                                "accessKeyIdVar": (("envname",), "use"),
                                "secretAccessKeyVar": (("envname",), "use"),
                                "sessionTokenVar": (("envname",), "use"),
                            },
                        ),
                    ),
                    "use",
                ),
                "sigv4": (
                    (
                        "object",
                        {
                            "streaming": (("enum", "deny", "passthrough"), "use"),
                            "presigned": (("enum", "deny", "passthrough"), "use"),
                            "sigv4a": (("enum", "deny", "passthrough"), "use"),
                        },
                    ),
                    "use",
                ),
            },
        ),
        "use",
    ),
    "ignoreViolations": (("map", _LS), "inert:only filters violation reports"),
    "enableWeakerNestedSandbox": (_B, "strict:sandhold never weakens its sandbox"),
    "allowNestedUserNamespaces": (
        _B,
        "strict:sandhold keeps new user namespaces disabled in the sandbox (bwrap "
        "--disable-userns and its seccomp filter): a command holding one could take "
        "the read-only binds that enforce the write denies out of its view",
    ),
    "javaAgentJarPath": (
        ("abspath",),
        "inert:the JVM needs no agent jar: transparent egress decides its connections "
        "by the same policy as the proxies",
    ),
    "enableWeakerNetworkIsolation": (_B, _MACOS),
    "allowAppleEvents": (_B, _MACOS),
    "allowPty": (_B, _MACOS),
    "ripgrep": (
        ("object", {"command": (_S, "use"), "args": (_LS, "use"), "argv0": (_S, "use")}),
        "inert:sandhold scans writable roots itself",
    ),
    "mandatoryDenySearchDepth": (
        ("int", 1, 10),
        "strict:sandhold searches writable roots at every depth",
    ),
    "seccomp": (
        ("object", {"applyPath": (_S, "use"), "argv0": (_S, "use")}),
        "inert:sandhold builds its own seccomp filter",
    ),
    "bwrapPath": (("abspath",), "use"),
    "socatPath": (("abspath",), "inert:sandhold needs no socat"),
    "windows": (
        (
            "object",
            {
                "backend": (("enum", "mxc", "srt-win"), "use"),
                "sandboxUser": (_S, "use"),
                "sublayerGuid": (_S, "use"),
                "wfpSublayerGuid": (_S, "use"),
                "proxyPortRange": (("tuple2int",), "use"),
                "srtWin": (("object", {"path": (_S, "use")}), "use"),
            },
        ),
        "inert:Windows only",
    ),
    "git": (
        (
            "object",
            {
                "safeDirectories": (_LS, "use"),
                # sandhold's own key
                "allowConfig": (("list", ("configpattern",)), "use"),
            },
        ),
        "use",
    ),
    # sandhold's own block
    "limits": (
        (
            "object",
            {
                "processes": (("int", 16, 1 << 22), "use"),
                "memoryMiB": (("int", 64, 1 << 30), "use"),
            },
        ),
        "use",
    ),
    "env": (("object", {"passthrough": (("list", ("envpattern",)), "use")}), "use"),
}

_TYPE_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
    type(None): "null",
}


def _describe(value: object) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


class _Checker:
    """Walks a parsed JSON value against ``SCHEMA``; collects notes and warnings."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.notes: list[str] = []
        self.warnings: list[str] = []

    def fail(self, key: str, reason: str) -> SettingsError:
        return SettingsError(self.source, key, reason)

    def check(self, node: tuple[object, ...], value: object, key: str) -> None:
        kind = node[0]
        if kind == "object":
            fields = node[1]
            assert isinstance(fields, dict)
            if not isinstance(value, dict):
                raise self.fail(key, f"expected an object, got {_describe(value)}")
            for name, item in value.items():
                sub = f"{key}.{name}" if key else name
                if name not in fields:
                    raise self.fail(sub, _unknown_key_reason(name, fields))
                child, disposition = fields[name]
                self.check(child, item, sub)
                self._dispose(disposition, item, sub)
        elif kind == "list":
            if not isinstance(value, list):
                raise self.fail(key, f"expected an array, got {_describe(value)}")
            item_node = node[1]
            assert isinstance(item_node, tuple)
            for i, item in enumerate(value):
                self.check(item_node, item, f"{key}[{i}]")
        elif kind == "map":
            if not isinstance(value, dict):
                raise self.fail(key, f"expected an object, got {_describe(value)}")
            item_node = node[1]
            assert isinstance(item_node, tuple)
            for name, item in value.items():
                if paths.has_surrogate(name):
                    raise self.fail(f"{key}.{name!a}", "a key with a lone surrogate, not text")
                self.check(item_node, item, f"{key}.{name}")
        elif kind == "bool":
            if not isinstance(value, bool):
                raise self.fail(key, f"expected true or false, got {_describe(value)}")
        elif kind == "int":
            lo, hi = node[1], node[2]
            assert isinstance(lo, int) and isinstance(hi, int)
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.fail(key, f"expected an integer, got {_describe(value)}")
            if not lo <= value <= hi:
                raise self.fail(key, f"must be between {lo} and {hi}, got {value}")
        elif kind == "tuple2int":
            ok = (
                isinstance(value, list)
                and len(value) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            )
            if not ok:
                raise self.fail(key, "expected an array of two integers")
        elif kind == "pathentry":
            if isinstance(value, dict):
                if set(value) != {"path", "literal"} or value.get("literal") is not True:
                    raise self.fail(key, 'expected a path, or {"path": "<path>", "literal": true}')
                self.check(("path",), value["path"], f"{key}.path")
                if paths.is_glob(value["path"]):
                    raise self.fail(
                        f"{key}.path",
                        "not supported: a literal path with '*', '?' or '[' in it; sandhold "
                        "reads those as a glob and has no literal spelling for them yet",
                    )
            else:
                self.check(("path",), value, key)
        elif kind == "enum":
            if value not in node[1:]:
                allowed = ", ".join(repr(v) for v in node[1:])
                raise self.fail(key, f"expected one of {allowed}, got {value!r}")
        else:
            if not isinstance(value, str):
                raise self.fail(key, f"expected a string, got {_describe(value)}")
            if paths.has_surrogate(value):
                raise self.fail(key, "contains a lone surrogate (\\ud800-\\udfff), not text")
            check = _STRING_CHECKS.get(str(kind))
            if check is not None:
                problem = check(value)
                if problem:
                    raise self.fail(key, problem)

    def _dispose(self, disposition: str, value: object, key: str) -> None:
        if disposition == "use":
            return
        verb, _, why = disposition.partition(":")
        is_set = value not in (False, None, [], {}, "")
        if verb == "refuse" and is_set:
            raise self.fail(key, f"not supported: {why}")
        if verb == "strict" and is_set:
            self.warnings.append(f"{key} is not honoured: {why}")
        elif verb == "inert":
            self.notes.append(f"{key} has no effect here: {why}")


def _unknown_key_reason(name: str, fields: Mapping[str, object]) -> str:
    import difflib  # error path only

    close = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    known = ", ".join(sorted(fields))
    return f"unknown key{hint}; known keys here: {known}"


def _check_path(text: str) -> str | None:
    try:
        paths.validate_pattern(text)
    except ValueError as exc:
        return str(exc)
    return None


def _check_abspath(text: str) -> str | None:
    return None if text.startswith("/") else "must be an absolute path"


def _check_domain(text: str) -> str | None:
    from sandhold.policy import domains  # only when a file lists domains

    try:
        domains.validate_pattern(text, allow_bare_star=False)
    except ValueError as exc:
        return str(exc)
    return None


def _check_denied_domain(text: str) -> str | None:
    from sandhold.policy import domains

    try:
        domains.validate_pattern(text, allow_bare_star=True)
    except ValueError as exc:
        return str(exc)
    return None


def _check_hostpattern(text: str) -> str | None:
    """A domain pattern without ``:port`` (srt's injectHosts, excludeDomains, mitmProxy)."""
    from sandhold.policy import domains

    problem = _check_domain(text)
    if problem is None and domains.split_port(text)[1] is not None:
        return "a port is not accepted here; name the host only"
    return problem


def _check_address(text: str) -> str | None:
    import ipaddress  # only when a file lists addresses

    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return (
            'not an IP address or CIDR range; use an IPv4/IPv6 literal or CIDR, e.g. "10.0.0.0/8", '
            '"192.168.1.10", "fc00::/7" (IPv6 unbracketed)'
        )
    return None


def _check_nonempty(text: str) -> str | None:
    return None if text else "must not be empty"


def _check_envname(text: str) -> str | None:
    ok = text and (text[0].isalpha() or text[0] == "_") and text.replace("_", "a").isalnum()
    return None if ok and text.isascii() else "not a valid environment variable name"


def _check_envpattern(text: str) -> str | None:
    return _check_envname(text.replace("*", "_")) if text.strip("*") else "pattern matches nothing"


def _check_configpattern(text: str) -> str | None:
    # a key's section, maybe its subsection, and its name; '*' stands for any of them
    if text.count(".") < 1 or any(not part for part in text.split(".")):
        return "expected a git config key or pattern: section.name, section.*, remote.*.url"
    if any(ord(c) < 32 for c in text) or any(c in text for c in "?[]"):
        return "only '*' is a wildcard here; no control characters"
    return None


_STRING_CHECKS: dict[str, Callable[[str], str | None]] = {
    "configpattern": _check_configpattern,
    "path": _check_path,
    "abspath": _check_abspath,
    "domain": _check_domain,
    "hostpattern": _check_hostpattern,
    "address": _check_address,
    "nonempty": _check_nonempty,
    "denied-domain": _check_denied_domain,
    "envname": _check_envname,
    "envpattern": _check_envpattern,
}


class DuplicateKey(Exception):  # not a ValueError: json's fallback must not swallow it
    """A JSON object names a key twice: ``json`` would keep the last silently, which
    can drop a rule (``{"denyRead": ["~/.ssh"], "denyRead": []}``)."""


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return out


class _JsonContext:
    """What the C scanner of ``json`` reads off its decoder (``json.loads``'s defaults,
    but a duplicate key is an error)."""

    strict = True
    object_hook = None
    object_pairs_hook = staticmethod(_unique_pairs)
    parse_float = float
    parse_int = int
    parse_constant = float
    memo: dict[str, str] = {}  # noqa: RUF012 - the scanner's key cache, read as is


def _loads(text: str) -> object:
    """``json.loads(text)`` through the stdlib's C scanner alone.

    ``json`` imports ``re`` (and ``re`` imports ``enum``): about 5 ms of every CLI
    start with a settings file. Anything the fast path does not take cleanly goes
    to ``json.loads``, so results and error messages are exactly ``json``'s.
    """
    try:
        import _json

        scan = _json.make_scanner(_JsonContext())  # type: ignore[arg-type]
        start = len(text) - len(text.lstrip(" \t\n\r"))
        value, end = scan(text, start)
        if text[end:].strip(" \t\n\r"):
            raise ValueError("extra data")
        return value
    except (ImportError, StopIteration, ValueError, RecursionError, SystemError):
        # SystemError: the C scanner's error path wants ``json.decoder`` loaded
        import json

        return json.loads(text, object_pairs_hook=_unique_pairs)


def parse_settings(text: str, source: str) -> Settings:
    """Validate settings JSON ``text`` read from ``source``.

    Raises:
        SettingsError: the text is empty, not JSON, or does not fit the schema.
    """
    if not text.strip():
        raise SettingsError(source, "", "the file is empty (delete it to use the defaults)")
    try:
        raw = _loads(text)
    except DuplicateKey as exc:
        raise SettingsError(
            source,
            "",
            f"the key {exc.args[0]!r} appears twice in one object (JSON would "
            "keep only the last, silently)",
        ) from None
    except ValueError as exc:
        import json

        if isinstance(exc, json.JSONDecodeError):
            why = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
        else:
            why = str(exc)  # e.g. an integer too long to convert
        raise SettingsError(source, "", f"not valid JSON: {why}") from None
    except RecursionError:
        raise SettingsError(source, "", "not valid JSON: nested too deeply") from None
    checker = _Checker(source)
    checker.check(("object", SCHEMA), raw, "")
    assert isinstance(raw, dict)
    fs = raw.get("filesystem", {})
    net = raw.get("network", {})
    credentials = _credentials(source, raw, net)
    # A masked file stays unreadable at its real path whatever the sandbox is shown
    # there; a denied one is simply unreadable.
    deny_read = [*_path_entries(fs.get("denyRead", [])), *credentials.file_paths]
    # Every named variable, masked ones included, is withheld from what the sandbox
    # inherits: a masked one is given back only as its placeholder, by the plan.
    env_deny = [s.target for s in credentials.sources if s.kind == "env"]
    return Settings(
        source=source,
        filesystem=FilesystemSettings(
            deny_read=tuple(deny_read),
            allow_read=_path_entries(fs.get("allowRead", ())),
            allow_write=_path_entries(fs.get("allowWrite", ())),
            deny_write=_path_entries(fs.get("denyWrite", ())),
            allow_credential_write=tuple(fs.get("allowCredentialWrite", ())),
            skip_hard_link_check=tuple(fs.get("skipHardLinkCheck", ())),
        ),
        network=NetworkSettings(
            allowed_domains=tuple(net.get("allowedDomains", ())),
            denied_domains=tuple(net.get("deniedDomains", ())),
            allow_unix_sockets=tuple(net.get("allowUnixSockets", ())),
            allow_all_unix_sockets=bool(net.get("allowAllUnixSockets", False)),
            allow_local_binding=bool(net.get("allowLocalBinding", False)),
            allow_all_domains=bool(net.get("allowAllDomains", False)),
        ),
        env_passthrough=tuple(raw.get("env", {}).get("passthrough", ())),
        env_deny=tuple(env_deny),
        bwrap_path=raw.get("bwrapPath"),
        git_safe_directories=tuple(raw.get("git", {}).get("safeDirectories", ())),
        git_allow_config=tuple(raw.get("git", {}).get("allowConfig", ())),
        limit_processes=raw.get("limits", {}).get("processes"),
        limit_memory_mib=raw.get("limits", {}).get("memoryMiB"),
        credentials=credentials,
        notes=tuple(checker.notes),
        warnings=tuple(checker.warnings),
    )


def _path_entries(entries: Iterable[object]) -> tuple[str, ...]:
    """Path entries as strings: a ``{path, literal: true}`` entry is its path (the
    checker refused the literal spellings that would read as a glob)."""
    return tuple(e["path"] if isinstance(e, dict) else e for e in entries)  # type: ignore[misc]


def _credentials(source: str, raw: dict[str, object], net: dict[str, object]) -> CredentialSettings:
    from sandhold.policy import credentials as rules  # only for a file that has the block

    try:
        tls = rules.read_tls_terminate(net.get("tlsTerminate"))  # type: ignore[arg-type]
        if "credentials" not in raw:
            return CredentialSettings(tls_terminate=tls)
        creds = rules.read_credentials(
            raw["credentials"],  # type: ignore[arg-type]
            allowed_domains=net.get("allowedDomains", ()),  # type: ignore[arg-type]
            denied_domains=net.get("deniedDomains", ()),  # type: ignore[arg-type]
            allow_all_domains=bool(net.get("allowAllDomains", False)),
            tls=tls,
        )
    except rules.CredentialsProblem as exc:
        raise SettingsError(source, exc.key, exc.reason) from None
    return CredentialSettings(
        sources=creds.sources,
        allow_plaintext_inject=creds.allow_plaintext_inject,
        aws_pairs=creds.aws_pairs,
        sigv4=creds.sigv4,
        tls_terminate=tls,
    )


def read_credential_blocks(
    source: str,
    credentials: object,
    tls_terminate: object,
    *,
    allowed_domains: Sequence[str],
    denied_domains: Sequence[str] = (),
) -> CredentialSettings:
    """A ``credentials`` block and a ``network.tlsTerminate`` block given apart from a
    settings file (a ``SandboxSpec``'s), checked exactly as a file's are: the same
    schema, then the same rules (``policy.credentials``). Either may be None.

    Raises:
        SettingsError: naming the key (``credentials.…``, ``network.tlsTerminate.…``).
    """
    checker = _Checker(source)
    raw: dict[str, object] = {}
    net: dict[str, object] = {
        "allowedDomains": list(allowed_domains),
        "deniedDomains": list(denied_domains),
    }
    if credentials is not None:
        checker.check(SCHEMA["credentials"][0], credentials, "credentials")  # type: ignore[arg-type]
        raw["credentials"] = credentials
    if tls_terminate is not None:
        network = SCHEMA["network"][0]
        node = network[1]["tlsTerminate"][0]  # type: ignore[index]
        checker.check(node, tls_terminate, "network.tlsTerminate")
        net["tlsTerminate"] = tls_terminate
    return _credentials(source, raw, net)


MAX_SETTINGS_BYTES = 4 << 20


def load_settings(path: str | None, home: str) -> Settings:
    """Read and validate a settings file (the I/O edge of this module).

    ``path`` None means the default location: absent there gives the built-in
    defaults; a path given explicitly must exist.

    Raises:
        SettingsError: missing explicit file, unreadable, or invalid.
    """
    import os
    import stat

    explicit = path is not None
    if path is None:
        path = f"{home.rstrip('/')}/{DEFAULT_SETTINGS_NAME}"
    try:
        # O_NONBLOCK: a FIFO must not hang the start; only a regular file is settings
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SettingsError(path, "", "is not a regular file")
            if st.st_size > MAX_SETTINGS_BYTES:
                raise SettingsError(path, "", f"is larger than {MAX_SETTINGS_BYTES} bytes")
            data = f.read(MAX_SETTINGS_BYTES + 1)
    except FileNotFoundError:
        if explicit:
            raise SettingsError(path, "", "the file does not exist") from None
        return DEFAULT_SETTINGS
    except OSError as exc:
        raise SettingsError(path, "", f"cannot be read: {exc.strerror}") from None
    if len(data) > MAX_SETTINGS_BYTES:
        raise SettingsError(path, "", f"is larger than {MAX_SETTINGS_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SettingsError(path, "", "is not UTF-8 text") from None
    return parse_settings(text, path)
