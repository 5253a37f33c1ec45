"""srt 0.0.83's credentials block and its newer keys, as sandhold reads them (F-CRED-1, F-SET-1).

One table names every key srt 0.0.83 added and what sandhold does with it; another
names each validation rule of the credentials block with the file that breaks it.
"""

from __future__ import annotations

import json

import pytest

from sandhold.errors import SettingsError
from sandhold.policy.credentials import inject_host_covered
from sandhold.settings import parse_settings

NET = {"allowedDomains": ["*.example.com", "api.other.org:443"]}

# (key, a value srt 0.0.83 accepts, outcome, words the outcome must contain)
# outcome: "use" (read, no note), "note" (accepted, no effect here), "warn" (honoured
# more strictly than written), "refuse" (the file is refused, with the reason)
NEW_KEYS = [
    (
        "network.deniedResolvedAddresses",
        ["10.0.0.0/8", "fc00::/7"],
        "refuse",
        "resolved-address guard",
    ),
    ("network.refuseOpaqueTunnels", True, "refuse", "tunnels"),
    ("network.requireHostMatch", True, "refuse", "Host header"),
    ("network.stripResponseHeaders", ["set-cookie"], "refuse", "response headers"),
    ("network.allowPlaintextHeaderSet", True, "note", "filterRequest"),
    ("network.ambiguousRequestTarget", "asSpelled", "note", "filterRequest"),
    ("network.parentProxy", {"https": "http://proxy:3128"}, "refuse", "go direct"),
    (
        "network.mitmProxy",
        {"socketPath": "/run/m.sock", "domains": ["a.example.com"]},
        "refuse",
        "go direct",
    ),
    ("network.httpProxyPort", 8080, "refuse", "go direct"),
    ("network.socksProxyPort", 1081, "refuse", "go direct"),
    ("network.tlsTerminate", {}, "use", ""),
    ("network.tlsTerminate", {"maxTunnels": 8, "handshakeTimeoutMs": 500}, "use", ""),
    ("allowNestedUserNamespaces", True, "warn", "disable-userns"),
    ("javaAgentJarPath", "/opt/srt-proxy-agent.jar", "note", "transparent egress"),
    ("windows.backend", "mxc", "note", "Windows only"),
    ("filesystem.denyRead", [{"path": "~/.secret", "literal": True}], "use", ""),
    ("filesystem.denyRead", [{"path": "/w/[WIP]", "literal": True}], "refuse", "literal path"),
    ("credentials.allowPlaintextInject", True, "use", ""),
    (
        "credentials.sigv4",
        {"streaming": "passthrough", "presigned": "deny", "sigv4a": "deny"},
        "use",
        "",
    ),
]


def _with(key: str, value: object) -> dict[str, object]:
    doc: dict[str, object] = {"network": dict(NET)}
    node = doc
    *parents, last = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})  # type: ignore[assignment]
    node[last] = value
    return doc


@pytest.mark.parametrize(
    ("key", "value", "outcome", "words"), NEW_KEYS, ids=[r[0] + ":" + r[2] for r in NEW_KEYS]
)
def test_each_srt_0_0_83_key(key: str, value: object, outcome: str, words: str) -> None:
    text = json.dumps(_with(key, value))
    if outcome == "refuse":
        with pytest.raises(SettingsError) as info:
            parse_settings(text, "srt.json")
        assert info.value.key.startswith(key.split(".", maxsplit=1)[0])
        assert key.rsplit(".", 1)[-1] in info.value.key
        assert words in info.value.reason
        return
    s = parse_settings(text, "srt.json")
    # a key inside an inert block (windows) is covered by the block's note
    notes = [
        n for n in s.notes if n.startswith((key, key.split(".", maxsplit=1)[0] + " has no effect"))
    ]
    warnings = [w for w in s.warnings if key in w]
    if outcome == "use":
        assert not notes and not warnings
    elif outcome == "note":
        assert notes and words in notes[0]
    else:
        assert warnings and words in warnings[0]


def test_literal_entry_is_its_path() -> None:
    s = parse_settings(
        json.dumps(_with("filesystem.allowWrite", [{"path": "/w/x", "literal": True}])), "f"
    )
    assert s.filesystem.allow_write == ("/w/x",)
    for bad in (
        {"path": "/w/x"},
        {"path": "/w/x", "literal": False},
        {"path": "/w/x", "literal": True, "x": 1},
    ):
        with pytest.raises(SettingsError, match="literal"):
            parse_settings(json.dumps(_with("filesystem.denyRead", [bad])), "f")


# --- the credentials block's own rules ------------------------------------------------

PLAIN = {"allowPlaintextInject": True}


def _creds(creds: dict[str, object], net: dict[str, object] | None = None) -> str:
    return json.dumps({"network": net if net is not None else dict(NET), "credentials": creds})


def _env(**entry: object) -> dict[str, object]:
    return {"name": "TOKEN", "mode": "mask", **entry}


# (settings text, key of the error, words of the reason)
INVALID = [
    (_creds({"envVars": [_env()]}), "credentials", "requires network.tlsTerminate"),
    (
        _creds({"envVars": [_env(injectHosts=[])], **PLAIN}),
        "credentials.envVars[0]",
        "explicitly empty",
    ),
    (
        _creds({"envVars": [_env(injectHosts=["api.github.com"])], **PLAIN}),
        "credentials.envVars[0].injectHosts[0]",
        "not reachable",
    ),
    (
        _creds({"envVars": [_env(injectHosts=["*.other.org"])], **PLAIN}),
        "credentials.envVars[0].injectHosts[0]",
        "not reachable",
    ),
    (
        _creds({"envVars": [_env(injectHosts=["a.example.com:443"])], **PLAIN}),
        "credentials.envVars[0].injectHosts[0]",
        "port",
    ),
    (
        _creds(
            {"envVars": [_env(injectHosts=["bad.example.com"])], **PLAIN},
            {**NET, "deniedDomains": ["bad.example.com"]},
        ),
        "credentials.envVars[0].injectHosts[0]",
        "deniedDomains",
    ),
    (
        _creds({"envVars": [_env(maskClaims=["sub"])], **PLAIN}),
        "credentials.envVars[0].maskClaims",
        "requires decode",
    ),
    (
        _creds({"envVars": [_env(decode="jwt", maskClaims=[])], **PLAIN}),
        "credentials.envVars[0].maskClaims",
        "explicitly empty",
    ),
    (
        _creds({"envVars": [_env(extract="token=\\S+")], **PLAIN}),
        "credentials.envVars[0].extract",
        "capturing group",
    ),
    (
        _creds({"envVars": [_env(extract="(unclosed")], **PLAIN}),
        "credentials.envVars[0].extract",
        "not a valid regular",
    ),
    (
        _creds({"files": [{"path": "~/.aws/", "mode": "mask"}], **PLAIN}),
        "credentials.files[0].path",
        "single file",
    ),
    (
        _creds({"envVars": [_env()], **PLAIN}, {"allowAllDomains": True}),
        "credentials.envVars[0]",
        "must list its injectHosts",
    ),
    (
        _creds(
            {
                "envVars": [_env(name="K"), _env(name="S", extract="(x)")],
                "awsPairs": [{"accessKeyIdVar": "K", "secretAccessKeyVar": "S"}],
                **PLAIN,
            }
        ),
        "credentials.awsPairs[0].secretAccessKeyVar",
        "whole-value",
    ),
    (
        _creds(
            {
                "envVars": [_env(name="K")],
                "awsPairs": [{"accessKeyIdVar": "K", "secretAccessKeyVar": "S"}],
                **PLAIN,
            }
        ),
        "credentials.awsPairs[0].secretAccessKeyVar",
        'mode "mask"',
    ),
    (
        _creds(
            {
                "envVars": [_env(name="K")],
                "awsPairs": [{"accessKeyIdVar": "K", "secretAccessKeyVar": "K"}],
                **PLAIN,
            }
        ),
        "credentials.awsPairs[0].secretAccessKeyVar",
        "more than one",
    ),
    (
        _creds({"envVars": [_env()], "injectHosts": ["a.example.com"]}),
        "credentials.injectHosts",
        "unknown key",
    ),
    (_creds({"sigv4": {"streaming": "allow"}}), "credentials.sigv4.streaming", "expected one of"),
    (
        _creds({"envVars": [_env(onExtractNoMatch="ignore")], **PLAIN}),
        "credentials.envVars[0].onExtractNoMatch",
        "expected one of",
    ),
]


@pytest.mark.parametrize(("text", "key", "words"), INVALID)
def test_credentials_rules_refuse(text: str, key: str, words: str) -> None:
    with pytest.raises(SettingsError) as info:
        parse_settings(text, "f")
    assert info.value.key == key
    assert words in info.value.reason


def test_inject_hosts_default_to_allowed_domains_without_ports() -> None:
    s = parse_settings(_creds({"envVars": [_env()], **PLAIN}), "f")
    (src,) = s.credentials.sources
    assert src.inject_hosts == ("*.example.com", "api.other.org")
    assert s.env_deny == ("TOKEN",)  # what the sandbox inherits never has the real value


def test_valid_block_reads_every_field() -> None:
    creds = {
        "files": [
            {
                "path": "~/.netrc",
                "mode": "mask",
                "extract": "password (?<pw>\\S+)",
                "onExtractNoMatch": "deny",
                "maskDuplicates": True,
            },
            {"path": "~/.ssh", "mode": "deny"},
        ],
        "envVars": [
            _env(name="AWS_ACCESS_KEY_ID"),
            _env(name="AWS_SECRET_ACCESS_KEY"),
            _env(name="AWS_SESSION_TOKEN"),
            _env(
                name="OIDC", decode="jwt", maskClaims=["secret"], injectHosts=["auth.example.com"]
            ),
        ],
        **PLAIN,
    }
    s = parse_settings(_creds(creds), "f").credentials
    netrc = s.sources[0]
    assert (
        netrc.extract == "password (?P<pw>\\S+)"
        and netrc.on_no_match == "deny"
        and netrc.mask_duplicates
    )
    assert s.sources[-1].mask_claims == ("secret",) and s.sources[-1].inject_hosts == (
        "auth.example.com",
    )
    (pair,) = s.aws_pairs
    assert (pair.access_key_id_var, pair.session_token_var, pair.automatic) == (
        "AWS_ACCESS_KEY_ID",
        "AWS_SESSION_TOKEN",
        True,
    )
    assert s.sigv4 is not None and s.sigv4.streaming == "deny"
    assert s.file_paths == ("~/.netrc", "~/.ssh")


@pytest.mark.parametrize(
    ("host", "patterns", "covered"),
    [
        ("api.github.com", ["*.github.com"], True),
        ("github.com", ["*.github.com"], False),
        ("api.github.com", ["api.github.com:443"], True),
        ("*.github.com", ["*.github.com"], True),
        ("*.a.github.com", ["*.github.com"], True),
        ("*.github.com", ["github.com", "api.github.com"], False),
        ("bedrock.*.amazonaws.com", ["*.amazonaws.com"], True),
        ("bedrock.*.amazonaws.com", ["bedrock.us.amazonaws.com"], False),
    ],
)
def test_inject_host_coverage(host: str, patterns: list[str], covered: bool) -> None:
    assert inject_host_covered(host, patterns) is covered


@pytest.mark.parametrize(
    ("tls", "key", "words"),
    [
        ({"caCertPath": "/ca.pem"}, "network.tlsTerminate", "together"),
        ({"maxTunnels": 0}, "network.tlsTerminate.maxTunnels", "between 1 and 65536"),
        ({"handshakeTimeoutMs": 50}, "network.tlsTerminate.handshakeTimeoutMs", "between 100"),
        (
            {"excludeDomains": ["a.example.com:443"]},
            "network.tlsTerminate.excludeDomains[0]",
            "port",
        ),
    ],
)
def test_tls_terminate_rules(tls: dict[str, object], key: str, words: str) -> None:
    with pytest.raises(SettingsError) as info:
        parse_settings(json.dumps({"network": {**NET, "tlsTerminate": tls}}), "f")
    assert info.value.key == key and words in info.value.reason


def test_exclude_domains_that_swallow_every_inject_host_are_refused() -> None:
    net = {**NET, "tlsTerminate": {"excludeDomains": ["*.example.com", "api.other.org"]}}
    with pytest.raises(SettingsError, match="could never be injected"):
        parse_settings(_creds({"envVars": [_env()]}, net), "f")
    with pytest.raises(SettingsError, match="excludeDomains"):
        parse_settings(_creds({"envVars": [_env(injectHosts=["a.example.com"])]}, net), "f")
    tls = parse_settings(_creds({"envVars": [_env()]}, {**NET, "tlsTerminate": {}}), "f")
    assert tls.credentials.tls_terminate is not None
    assert tls.credentials.tls_terminate.max_tunnels == 256
