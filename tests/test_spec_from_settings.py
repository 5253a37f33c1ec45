"""``SandboxSpec.from_settings``: a settings file's policy as a spec, whole or not at all.

The mapping is a table: each row is a settings file and the spec fields it must
give; each refusal row names the key the spec cannot express. Paths resolve on a
dict-backed fake (``realpath``). One real launch (as root and as a user) checks that
the spec's sandbox holds the file's policy: the baseline is not allowed, the working
directory is read-only, and ``allowWrite``/``denyWrite`` hold.
"""

from __future__ import annotations

import json

import pytest

from conftest import World
from portdriver import drive
from sandhold._record import replace
from sandhold.errors import SettingsError
from sandhold.settings import parse_settings
from sandhold.spec import (
    UNEXPRESSIBLE_SETTINGS,
    SandboxBindMount,
    SandboxSpec,
    spec_from_settings,
)

CWD = "/w/proj"
HOME = "/home/u"
LINKS = {"/w/link": "/w/proj/sub", "/lib": "/usr/lib", "/bin": "/usr/bin"}


def realpath(path: str) -> str:
    for link, target in LINKS.items():
        if path == link or path.startswith(link + "/"):
            return target + path[len(link) :]
    return path


def spec_of(settings: dict[str, object], **kw: object) -> SandboxSpec:
    parsed = parse_settings(json.dumps(settings), "s.json")
    return spec_from_settings(
        parsed,
        session_id="s",
        workspace_id="w",
        cwd=CWD,
        home=HOME,
        realpath=realpath,
        **kw,  # type: ignore[arg-type]
    )


def rw(p: str) -> SandboxBindMount:
    return SandboxBindMount(p)


def ro(p: str) -> SandboxBindMount:
    return SandboxBindMount(p, read_only=True)


# (settings, bind mounts, protected paths, network_enabled, allowlist, denylist)
ROWS = [
    ({}, (ro(CWD),), (), False, (), ()),  # the CLI's default: no network, cwd read-only
    ({"filesystem": {"allowWrite": ["."]}}, (rw(CWD),), (), False, (), ()),
    (
        {"filesystem": {"allowWrite": ["build", "~/.cache/x"]}},
        (rw(f"{CWD}/build"), rw(f"{HOME}/.cache/x"), ro(CWD)),
        (),
        False,
        (),
        (),
    ),
    (
        {"filesystem": {"allowWrite": ["."], "allowRead": ["src", "/data/ref"]}},
        (rw(CWD), ro("/data/ref")),  # src is inside a writable bind already
        (),
        False,
        (),
        (),
    ),
    (
        {"filesystem": {"allowWrite": ["."], "denyWrite": ["**/.env", "locked"]}},
        (rw(CWD),),
        (f"{CWD}/**/.env", f"{CWD}/locked"),
        False,
        (),
        (),
    ),
    (
        {
            "network": {
                "allowedDomains": ["api.example.com", "*.pkg.example"],
                "deniedDomains": ["bad.pkg.example"],
            }
        },
        (ro(CWD),),
        (),
        True,
        ("api.example.com", "*.pkg.example"),
        ("bad.pkg.example",),
    ),
    # denyRead honoured by what a spec never shows, or hides anyway
    (
        {"filesystem": {"allowWrite": ["~"], "denyRead": ["~/.ssh", "~/.aws/credentials"]}},
        (rw(HOME), ro(CWD)),
        (),
        False,
        (),
        (),
    ),
    (
        {"filesystem": {"denyRead": ["/srv/secrets", "/etc/shadow", "/etc/ssh/ssh_host_rsa_key"]}},
        (ro(CWD),),
        (),
        False,
        (),
        (),
    ),
]


@pytest.mark.parametrize("row", ROWS)
def test_a_settings_file_maps_to_these_spec_fields(row: tuple[object, ...]) -> None:
    settings, binds, protected, net, allow, deny = row
    assert isinstance(settings, dict)
    spec = spec_of(settings)
    assert spec.bind_mounts == binds
    assert spec.protected_paths == protected
    assert (spec.network_enabled, spec.egress_allowlist, spec.egress_denylist) == (net, allow, deny)
    assert spec.egress_baseline is False  # the file's lists only, as the CLI reads them
    assert spec.guest_workdir == CWD
    assert SandboxSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


REFUSALS = [
    *(
        (value, key)
        for key, value in [
            ("filesystem.allowCredentialWrite", {"filesystem": {"allowCredentialWrite": ["x"]}}),
            ("network.allowAllDomains", {"network": {"allowAllDomains": True}}),
            ("network.allowUnixSockets", {"network": {"allowUnixSockets": ["/run/x.sock"]}}),
            ("network.allowAllUnixSockets", {"network": {"allowAllUnixSockets": True}}),
            ("env.passthrough", {"env": {"passthrough": ["GITHUB_TOKEN"]}}),
            ("bwrapPath", {"bwrapPath": "/usr/bin/bwrap"}),
            ("git.safeDirectories", {"git": {"safeDirectories": ["/w"]}}),
            ("git.allowConfig", {"git": {"allowConfig": ["remote.*"]}}),
        ]
    ),
    ({"filesystem": {"allowWrite": ["src/*"]}}, "filesystem.allowWrite[0]"),
    ({"filesystem": {"allowRead": ["/data/**"]}}, "filesystem.allowRead[0]"),
    # a denyRead path a bind (or the system base) would show
    ({"filesystem": {"allowWrite": ["."], "denyRead": ["secrets"]}}, "filesystem.denyRead[0]"),
    ({"filesystem": {"denyRead": ["x", "**/.env"]}}, "filesystem.denyRead[0]"),  # cwd is shown
    ({"filesystem": {"allowWrite": ["~/p"], "denyRead": ["~"]}}, "filesystem.denyRead[0]"),
    ({"filesystem": {"denyRead": ["/etc/hosts"]}}, "filesystem.denyRead[0]"),
    ({"filesystem": {"denyRead": ["/w/link/k"]}}, "filesystem.denyRead[0]"),  # resolves into cwd
]


@pytest.mark.parametrize(("settings", "key"), REFUSALS)
def test_what_a_spec_cannot_express_is_refused_naming_the_key(
    settings: dict[str, object], key: str
) -> None:
    with pytest.raises(SettingsError) as err:
        spec_of(settings)
    assert err.value.key == key
    assert err.value.file == "s.json"


def test_every_unexpressible_key_has_a_refusal_row() -> None:
    assert {k for _, k in REFUSALS} >= set(UNEXPRESSIBLE_SETTINGS)


def test_a_path_and_a_dict_give_one_spec(tmp_path: object) -> None:
    import pathlib

    assert isinstance(tmp_path, pathlib.Path)
    settings = {"filesystem": {"allowWrite": ["."]}, "network": {"allowedDomains": ["a.example"]}}
    f = tmp_path / "settings.json"
    f.write_text(json.dumps(settings))
    kw: dict[str, str] = {"session_id": "s", "cwd": str(tmp_path), "home": str(tmp_path)}
    assert SandboxSpec.from_settings(f, **kw) == SandboxSpec.from_settings(settings, **kw)
    with pytest.raises(SettingsError) as err:
        SandboxSpec.from_settings({"network": {"allowedDomains": ["bad domain"]}}, **kw)
    assert err.value.key.startswith("network.allowedDomains")
    with pytest.raises(SettingsError):
        SandboxSpec.from_settings(tmp_path / "missing.json", **kw)


def test_a_settings_spec_sandbox_holds_the_files_policy(world: World) -> None:
    world.mkdir("work/out")
    out = drive(
        world,
        """
        async def main(port):
            settings = {
                "filesystem": {"allowWrite": ["out"], "denyWrite": ["out/locked"]},
                "network": {"allowedDomains": ["allowed.invalid"]},
            }
            s = SandboxSpec.from_settings(settings, session_id="st", cwd=WORK)
            h = await port.launch(s)
            OUT["net"] = h.detail("network")
            for name, cmd in {
                "out": "touch out/made",
                "cwd": "touch made-here",
                "locked": "touch out/locked",
            }.items():
                OUT[name] = (await port.run(h, cmd)).exit_code
            web = await port.run(h, "curl -s -o /dev/null -w '%{http_code}' http://api.anthropic.com/")
            OUT["baseline"] = web.stdout.decode()
            await port.destroy(h)
        """,
    )
    assert "no baseline" in out["net"]
    assert out["out"] == 0 and out["cwd"] != 0 and out["locked"] != 0
    assert out["baseline"] == "403"  # the library's default would allow it


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("ok.pkg.example", True),
        ("bad.pkg.example", False),  # egress_denylist beats the allow
        ("api.anthropic.com", False),  # in the baseline, which this spec leaves out
        ("github.com", False),
    ],
)
def test_a_spec_without_the_baseline_allows_its_list_only(host: str, allowed: bool) -> None:
    from sandhold.policy.domains import decide
    from sandhold.port.facts import egress_policy

    s = SandboxSpec(
        "s",
        "w",
        egress_allowlist=("*.pkg.example",),
        egress_baseline=False,
        egress_denylist=("bad.pkg.example",),
    )
    assert decide(egress_policy(s), host, 443).allowed is allowed
    with_baseline = egress_policy(replace(s, egress_baseline=True))
    assert decide(with_baseline, "api.anthropic.com", 443).allowed


def test_a_bad_denylist_entry_is_a_spec_error_naming_it() -> None:
    from sandhold.errors import SpecError
    from sandhold.port.facts import egress_policy

    with pytest.raises(SpecError) as err:
        egress_policy(SandboxSpec("s", "w", egress_denylist=("http://x/",)))
    assert err.value.field == "egress_denylist"


def test_cwd_and_home_must_be_absolute() -> None:
    from sandhold.errors import SpecError

    settings = parse_settings("{}", "s.json")
    for cwd, home in (("proj", HOME), (CWD, "~")):
        with pytest.raises(SpecError) as err:
            spec_from_settings(
                settings, session_id="s", workspace_id="", cwd=cwd, home=home, realpath=realpath
            )
        assert err.value.field == ("cwd" if cwd == "proj" else "home")
