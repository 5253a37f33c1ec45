"""Masked credentials for ``SandboxSpec`` launches (issue 19): the spec's ``credentials``.

The pure half is a table: each row a spec's ``credentials``/``tls_terminate`` and the
field its refusal names (the settings file's own rules, F-CRED-1), and a settings
file's block mapped by ``from_settings``. The real half launches through
``SandboxPort`` as root and as an unprivileged user, with curl and Python's urllib
in the sandbox against the local TLS upstreams of ``tlsupstreams`` (their own CA,
given as ``extraCaCertPaths``): the sandbox's variable and file hold placeholders
only, the upstream at an injection host receives the real values, the same
placeholder sent to another host arrives unchanged, and no event, violation,
explain output or log line holds a real value.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from conftest import World
from portdriver import drive
from sandhold.errors import SpecError
from sandhold.policy.credentials import TlsTerminate
from sandhold.settings import parse_settings
from sandhold.spec import SandboxCredentials, SandboxSpec, spec_from_settings
from tlsupstreams import REAL, serve_upstreams
from tlsupstreams import mark as _mark
from tlsupstreams import seen_since as _seen_since

TLS = TlsTerminate()
KEY = {"name": "API_KEY", "mode": "mask"}
E0 = "credentials.envVars[0]"
DENIED = {"egress_denylist": ("api.a.test",)}

# (credentials block, tls_terminate, spec fields, the field the refusal names)
REFUSED: list[tuple[dict[str, object] | None, TlsTerminate | None, dict[str, object], str]] = [
    ({"envVars": [KEY]}, None, {}, "credentials"),  # masking needs TLS termination
    ({"envVars": [{**KEY, "injectHosts": []}]}, TLS, {}, E0),
    ({"envVars": [{**KEY, "injectHosts": ["evil.test"]}]}, TLS, {}, E0 + ".injectHosts[0]"),
    ({"envVars": [{**KEY, "injectHosts": ["*.a.test"]}]}, TLS, {}, E0 + ".injectHosts[0]"),
    ({"envVars": [{**KEY, "injectHosts": ["api.a.test"]}]}, TLS, DENIED, E0 + ".injectHosts[0]"),
    ({"envVars": [KEY]}, TLS, {"egress_allowlist": ()}, E0),
    ({"envVars": [KEY]}, TLS, {"network_enabled": False}, E0),
    ({"envVars": [{**KEY, "value": 7}]}, TLS, {}, E0 + ".value"),
    ({"envVars": [{**KEY, "mode": "deny", "value": "v"}]}, None, {}, E0 + ".value"),
    ({"envVars": [{**KEY, "extract": "no group"}]}, TLS, {}, E0 + ".extract"),
    ({"envVars": [{**KEY, "maskClaims": ["sub"]}]}, TLS, {}, E0 + ".maskClaims"),
    ({"envVars": [{**KEY, "shape": 1}]}, TLS, {}, E0 + ".shape"),
    ({"files": [{"path": "token", "mode": "mask"}]}, TLS, {}, "credentials.files[0].path"),
    ({"files": [{"path": "/w/dir/", "mode": "mask"}]}, TLS, {}, "credentials.files[0].path"),
    ({"awsPairs": [{"accessKeyIdVar": "A", "secretAccessKeyVar": "B"}]}, TLS, {},
     "credentials.awsPairs[0].accessKeyIdVar"),
    (None, TlsTerminate(ca_cert_path="/c.pem"), {}, "tls_terminate"),
    (None, TlsTerminate(ca_cert_path="c", ca_key_path="/k"), {}, "tls_terminate.caCertPath"),
    (None, TlsTerminate(max_tunnels=0), {}, "tls_terminate.maxTunnels"),
    (None, TlsTerminate(extra_ca_cert_paths=("ca.pem",)), {}, "tls_terminate.extraCaCertPaths[0]"),
]  # fmt: skip


@pytest.mark.parametrize(("block", "tls", "fields", "key"), REFUSED)
def test_a_spec_credentials_block_is_checked_as_a_settings_file_is(
    block: dict[str, object] | None, tls: TlsTerminate | None, fields: dict[str, object], key: str
) -> None:
    kw: dict[str, object] = {"egress_allowlist": ("api.a.test",), **fields}
    creds = SandboxCredentials(block) if block is not None else None
    with pytest.raises(SpecError) as err:
        SandboxSpec("s", "w", credentials=creds, tls_terminate=tls, **kw).validate()  # type: ignore[arg-type]
    assert err.value.field == key
    assert "secret-value" not in str(err.value)


def test_values_stay_out_of_repr_and_redacted_json_and_round_trip() -> None:
    creds = SandboxCredentials({"envVars": [{**KEY, "value": "secret-value"}]})
    spec = SandboxSpec(
        "s", "w", egress_allowlist=("api.a.test",), credentials=creds, tls_terminate=TLS
    ).validate()
    assert "secret-value" not in repr(spec) + json.dumps(spec.to_json(redact=True))
    assert SandboxSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert spec.credentials is not None and spec.credentials.values() == {"API_KEY": "secret-value"}
    (src,) = spec.credential_settings().sources
    assert src.inject_hosts == ("api.a.test",)  # omitted: the allowlist (not the baseline)


def test_from_settings_maps_the_credentials_block() -> None:
    settings = {
        "network": {
            "allowedDomains": ["api.a.test"],
            "tlsTerminate": {"extraCaCertPaths": ["~/ca.pem"], "maxTunnels": 9},
        },
        "credentials": {
            "envVars": [KEY, {"name": "GONE", "mode": "deny"}],
            "files": [{"path": "./token.json", "mode": "mask", "extract": '"t": "([^"]+)"'}],
            "sigv4": {"presigned": "passthrough"},
        },
    }
    spec = spec_from_settings(
        parse_settings(json.dumps(settings), "s.json"),
        session_id="s",
        workspace_id="w",
        cwd="/w/p",
        home="/home/u",
        realpath=lambda p: p,
    )
    assert spec.tls_terminate == TlsTerminate(
        extra_ca_cert_paths=("/home/u/ca.pem",), max_tunnels=9
    )
    creds = spec.credential_settings()
    assert [(s.kind, s.target, s.mode, s.inject_hosts) for s in creds.sources] == [
        ("file", "/w/p/token.json", "mask", ("api.a.test",)),
        ("env", "API_KEY", "mask", ("api.a.test",)),
        ("env", "GONE", "deny", ("api.a.test",)),
    ]
    assert creds.sigv4 is not None and creds.sigv4.presigned == "passthrough"


# -- through the real SandboxPort ---------------------------------------------------


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, object]]:
    with serve_upstreams() as up:
        yield up


HARNESS_REAL = "harness-env-key-81c2e0d4a7b9"

SCENARIO = """
os.environ["HARNESS_KEY"] = HARNESS_REAL  # masked without a value: the harness's own
with open(f"{WORK}/token.json", "w") as f:
    f.write('{"token": "FILE_REAL", "user": "me"}')
with open(f"{HOME}/secret.json", "w") as f:
    f.write('{"token": "LINKED_REAL"}')
os.symlink(f"{HOME}/secret.json", f"{WORK}/linked.json")  # as a sandbox could plant it

async def main(port):
    creds = SandboxCredentials({
        "envVars": [
            {"name": "API_KEY", "mode": "mask", "value": REAL, "injectHosts": ["127.0.0.1"]},
            {"name": "HARNESS_KEY", "mode": "mask", "injectHosts": ["127.0.0.1"]},
        ],
        "files": [{"path": f"{WORK}/token.json", "mode": "mask",
                   "extract": '"token": "([^"]+)"', "injectHosts": ["127.0.0.1"]},
                  {"path": f"{WORK}/linked.json", "mode": "mask",
                   "extract": '"token": "([^"]+)"', "injectHosts": ["127.0.0.1"]}],
    })
    from sandhold.policy.credentials import TlsTerminate
    binds = (SandboxBindMount(WORK), SandboxBindMount(HOME, read_only=True))
    sp = spec(egress_allowlist=("127.0.0.1", "127.0.0.2"), egress_baseline=False, bind_mounts=binds,
              credentials=creds, tls_terminate=TlsTerminate(extra_ca_cert_paths=(CA,)))
    OUT["explain"] = port.explain(sp)
    h = await port.launch(sp)
    events = []
    async def watch():
        async for e in port.events(h):
            events.append(json_dumps(e))
    task = asyncio.get_running_loop().create_task(watch())
    env = {"NO_PROXY": "", "no_proxy": ""}
    shown = await port.run(
        h, ["sh", "-c", 'echo "$API_KEY"; echo "$HARNESS_KEY"; cat token.json'], env=env)
    OUT["shown"] = shown.stdout.decode()
    curl = await port.run(h, ["sh", "-c",
        'T=$(python3 -c "import json; print(json.load(open(\\'token.json\\'))[\\'token\\'])"); '
        'curl -sS -m 10 -H "Authorization: Bearer $API_KEY" -H "X-Api-Key: $T" '
        '--data "h=$HARNESS_KEY" https://127.0.0.1:TLS1/curl && '
        'curl -sS -m 10 -H "Authorization: Bearer $API_KEY" -H "Host: 127.0.0.1:TLS1" '
        'https://127.0.0.2:TLS2/other && '
        'curl -sS -m 10 https://127.0.0.3:TLS1/refused; true'], env=env)
    OUT["curl"] = [curl.exit_code, curl.stdout.decode(), curl.stderr.decode()]
    py = await port.run(h, ["python3", "-c",
        "import os, urllib.request\\n"
        "req = urllib.request.Request('https://127.0.0.1:TLS1/py', "
        "data=('{\\"k\\": \\"%s\\"}' % os.environ['API_KEY']).encode(), "
        "headers={'X-Api-Key': os.environ['API_KEY']})\\n"
        "print(urllib.request.urlopen(req, timeout=10).read().decode().strip())\\n"], env=env)
    OUT["py"] = [py.exit_code, py.stdout.decode(), py.stderr.decode()]
    key = await port.run(h, ["sh", "-c", f"cat {HOME}/.local/state/sandhold/ca/ca-key.pem; "
                             "cat linked.json; cat $HOME/secret.json"])
    OUT["key"] = [key.stdout.decode(), key.stderr.decode()]
    OUT["home"] = os.path.exists(f"{HOME}/.local/state/sandhold/ca/ca-key.pem")
    OUT["details"] = dict(port.handle(h).details)
    await port.destroy(h)
    await task
    OUT["events"] = events
"""


def test_port_sandbox_sees_placeholders_and_the_upstream_the_real_values(
    world: World, upstreams: dict[str, object]
) -> None:
    ports = upstreams["ports"]
    assert isinstance(ports, dict)
    file_real = "file-token-3e9a77c1d05b"
    body = (
        f"REAL = {REAL!r}\nHARNESS_REAL = {HARNESS_REAL!r}\nCA = {upstreams['ca']!r}\n"
        + SCENARIO.replace("TLS1", str(ports["tls1"]))
        .replace("TLS2", str(ports["tls2"]))
        .replace("FILE_REAL", file_real)
        .replace("LINKED_REAL", "linked-secret-0f4c9b")
    )
    mark = _mark(upstreams)
    out = drive(world, body)
    reals = (REAL, HARNESS_REAL, file_real)
    api, harness, token_file = str(out["shown"]).splitlines()
    for placeholder in (api, harness):
        assert placeholder.startswith("sandhold_placeholder_")
    token = json.loads(token_file)
    assert token["user"] == "me" and token["token"].startswith("sandhold_placeholder_")
    assert out["curl"][0] == 0 and out["curl"][1] == "ok\nok\n", out["curl"]
    assert out["py"][:2] == [0, "ok\n"], out["py"]
    got = {g["path"]: g for g in _seen_since(upstreams, mark)}
    assert got["/curl"]["auth"] == f"Bearer {REAL}" and got["/curl"]["x_key"] == file_real
    assert got["/curl"]["body"] == f"h={HARNESS_REAL}"
    assert got["/other"]["auth"] == f"Bearer {api}"  # 127.0.0.2 is no injection host
    assert got["/py"]["x_key"] == REAL and json.loads(str(got["/py"]["body"])) == {"k": REAL}
    assert "/refused" not in got
    # sandhold's CA key (made by this launch, in the home it binds) stays unseen, and
    # the symlinked file is denied, not read through the link: neither is shown
    assert out["home"] and "PRIVATE KEY" not in out["key"][0], out["key"]
    key = world.home / ".local/state/sandhold/ca/ca-key.pem"
    assert key.stat().st_mode & 0o077 == 0 and key.stat().st_uid == world.ident.uid
    assert "linked-secret-0f4c9b" not in json.dumps(out)
    assert "credentials.files[1]" in str(out["_stderr"])  # said: denied, not masked
    explain = str(out["explain"])
    assert E0 + ": placeholder sandhold_placeholder_" in explain
    assert (
        "put back only at 127.0.0.1" in explain
        and "trusts sandhold's CA through /tmp/sandhold-ca-bundle.pem" in explain
    )
    events = "\n".join(out["events"])  # type: ignore[arg-type]
    assert "127.0.0.3" in events  # the refusal was reported
    everything = json.dumps(out) + str(out["_stderr"])
    for real in reals:
        assert real not in everything


def test_credentials_on_backend_none_are_refused_before_anything_runs() -> None:
    import asyncio

    from sandhold.errors import UnenforceablePolicy
    from sandhold.port import SandboxPort
    from sandhold.spec import SandboxBackend

    creds = SandboxCredentials({"envVars": [{**KEY, "value": "secret-value"}]})
    spec = SandboxSpec(
        "s", "w", egress_allowlist=("api.a.test",), credentials=creds, tls_terminate=TLS
    )

    async def launch() -> None:
        async with SandboxPort(sandbox="off") as port:
            await port.launch(spec, backend=SandboxBackend.NONE)

    with pytest.raises(UnenforceablePolicy) as err:
        asyncio.run(launch())
    assert err.value.rule == "credentials" and "secret-value" not in str(err.value)
