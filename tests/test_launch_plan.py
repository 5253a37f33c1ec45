"""The CLI's launch plan and the creation-time supervisor (F-BE-5): pure, by table."""

from __future__ import annotations

import json

import pytest

from fakehost import FakeHost
from sandhold.errors import UnenforceablePolicy
from sandhold.explain import render_plan
from sandhold.policy.cliplan import LaunchPlan, LaunchRequest, plan_launch
from sandhold.policy.creation import denied, describe, unix_socket_denied
from sandhold.policy.refusal import DENY_PATH, Refusal
from sandhold.settings import parse_settings

HOME, CWD, PRIV = "/home/u", "/home/u/proj", "/tmp/sandhold-1000"
TMP = f"{PRIV}/s1/tmp"
HOST = FakeHost(
    {
        CWD: "dir",
        f"{CWD}/a.py": "file",
        f"{HOME}/.local/bin": "dir",
        f"{HOME}/.ssh": "dir",
        PRIV: "dir",
        TMP: "dir",
        "/usr/lib/sandhold": "dir",
    }
)


def launch(settings: dict[str, object], *, supervisor: bool = True, **extra: object) -> LaunchPlan:
    extra.setdefault("environ", (("PATH", "/usr/bin"),))
    req = LaunchRequest(
        command=("true",),
        cwd=CWD,
        home=HOME,
        settings=parse_settings(json.dumps(settings), "test.json"),
        backend="native",
        tmpdir=TMP,
        private_root=PRIV,
        supervisor=supervisor,
        runner_paths=("/usr/lib/sandhold",),
        **extra,  # type: ignore[arg-type]
    )
    return plan_launch(req, HOST)


def test_no_writable_root_needs_no_supervisor() -> None:
    for supervisor in (True, False):
        plan = launch({}, supervisor=supervisor)
        assert plan.creation is None and plan.warnings == ()


def test_writable_roots_get_a_creation_policy() -> None:
    plan = launch({"filesystem": {"allowWrite": ["."], "denyWrite": ["**/*.lock", "out/"]}})
    policy = plan.creation
    assert policy is not None
    assert policy.writable_roots == (CWD,) and policy.scratch == (TMP,)
    # the user config and home paths lie outside every writable root here: nothing
    # can be made there, so the supervisor's rules leave them out
    assert [o for _, o in policy.deny_paths] == [
        "filesystem.denyWrite[0]",
        "filesystem.denyWrite[1]",
    ]
    assert denied(policy, f"{CWD}/deep/x.lock") is not None
    assert denied(policy, f"{CWD}/out/new") is not None
    assert denied(policy, f"{CWD}/.env") is not None
    assert denied(policy, f"{TMP}/.env") is None  # the session's scratch
    assert denied(policy, f"{CWD}/src/main.py") is None
    assert plan.fs is not None and plan.fs.unpinned == ()
    assert not any("not protected" in w for w in plan.warnings)
    text = "\n".join(describe(policy))
    assert CWD in text and "**/*.lock" in text and ".env" in text and "hooks" in text
    assert "in a .jj: config.toml, config-id" in text


def test_a_writable_home_gets_the_user_config_and_home_paths_unless_granted() -> None:
    plan = launch({"filesystem": {"allowWrite": ["~", "~/.local/bin"]}})
    policy = plan.creation
    assert policy is not None
    denied_paths = dict(policy.deny_paths)
    assert denied_paths[f"{HOME}/.config/git/config"] == "mandatory: git's user config"
    assert denied_paths[f"{HOME}/.ssh"].startswith("home: ")
    assert denied_paths[f"{HOME}/.local/lib"].startswith("home: ")
    # named by the user: a grant inside a home path lifts it
    assert f"{HOME}/.local/bin" not in denied_paths
    assert denied(policy, f"{HOME}/.local/bin/tool") is None
    assert denied(policy, f"{HOME}/.ssh/config") is not None
    assert denied(policy, f"{HOME}/.config/systemd/user/x.service") is not None
    assert plan.fs is not None
    mounts = {m.path: m.op for m in plan.fs.mounts}
    assert mounts[f"{HOME}/.ssh"] == "ro-bind" and mounts.get(f"{HOME}/.local/bin") != "ro-bind"


@pytest.mark.parametrize(
    ("settings", "supervisor", "expected"),
    [
        ({}, True, (TMP,)),  # nothing writable: no supervisor, Landlock all the same
        ({}, False, (TMP,)),
        ({"filesystem": {"allowWrite": ["."]}}, True, (CWD, TMP)),
    ],
)
def test_every_native_launch_gets_a_landlock_domain(
    settings: dict[str, object], supervisor: bool, expected: tuple[str, ...]
) -> None:
    plan = launch(settings, supervisor=supervisor)
    assert plan.landlock == expected
    assert (
        f"landlock (where the kernel has it): the command writes only below {', '.join(expected)}"
        in render_plan(plan)
    )


def test_backend_none_has_no_landlock_domain() -> None:
    req = LaunchRequest(
        command=("true",),
        cwd=CWD,
        home=HOME,
        environ=(),
        settings=parse_settings("{}", "test.json"),
        backend="none",
        tmpdir=TMP,
        private_root=PRIV,
    )
    assert plan_launch(req, HOST).landlock is None


def test_without_user_notification_writable_roots_are_refused_not_weakened() -> None:
    with pytest.raises(UnenforceablePolicy, match="seccomp user notification") as err:
        launch({"filesystem": {"allowWrite": ["."]}}, supervisor=False)
    assert "**/.env" in str(err.value) and "**/.git/hooks/" in str(err.value)


def test_the_runner_can_read_its_own_code_whatever_is_denied() -> None:
    plan = launch({"filesystem": {"allowWrite": ["."], "denyRead": ["/usr/lib"]}})
    assert plan.fs is not None
    carve = [m for m in plan.fs.mounts if m.path == "/usr/lib/sandhold"]
    assert carve and "supervisor" in carve[0].reason


FAMILIES = ["ALLOW", "ALLOW", "ALLOW", "EPERM"]  # inet, inet6, netlink; any other but unix


def test_unix_sockets_by_path_need_the_supervisor() -> None:  # F-NET-5
    settings = {"network": {"allowUnixSockets": ["/run/app.sock", "~/agent.sock"]}}
    with pytest.raises(UnenforceablePolicy, match=r"network\.allowUnixSockets"):
        launch(settings, supervisor=False)
    plan = launch(settings)
    policy = plan.creation
    assert policy is not None and policy.writable_roots == ()  # for the sockets alone
    assert policy.unix_sockets == ("/home/u/agent.sock", "/run/app.sock")
    assert unix_socket_denied(policy, "/run/app.sock") is None
    assert unix_socket_denied(policy, "/run/other.sock") is not None
    # the sandbox may not make an allowed name itself (bind, or a link to another socket)
    assert denied(policy, "/run/app.sock") == Refusal(
        DENY_PATH, "network.allowUnixSockets[0]: /run/app.sock"
    )
    socket_rules = [r for r in plan.syscalls if r.syscall == "socket"]
    # inet, inet6, netlink; no other family; then unix: stream only
    assert [r.action for r in socket_rules] == [*FAMILIES, "ALLOW", "EPERM"]
    assert not any("allowUnixSockets" in w for w in plan.warnings)


def test_all_unix_sockets_or_none_need_no_connect_supervision() -> None:
    plan = launch({"network": {"allowAllUnixSockets": True, "allowUnixSockets": ["/x.sock"]}})
    assert plan.creation is None
    assert [r.action for r in plan.syscalls if r.syscall == "socket"] == FAMILIES
    plan = launch({})
    assert [r.action for r in plan.syscalls if r.syscall == "socket"] == [*FAMILIES, "EPERM"]


def test_a_refusal_says_why_the_supervisor_cannot_run() -> None:
    """The kernel may lack user notification, or Yama may forbid reading the calls."""
    settings = {"filesystem": {"allowWrite": ["."]}}
    with pytest.raises(UnenforceablePolicy, match=r"seccomp user notification \(Linux 5\.9\+\)"):
        launch(settings, supervisor=False)
    yama = "Yama forbids here (kernel.yama.ptrace_scope = 2; 0 or 1 allow it)"
    with pytest.raises(UnenforceablePolicy, match=r"ptrace_scope = 2"):
        launch(settings, supervisor=False, supervisor_blocker=yama)


def test_kernel_file_systems_mounted_elsewhere_are_hidden() -> None:
    """The read-only view of the host would show a chroot's /proc (every host process):
    hidden, while the sandbox's own /proc and /dev and the host's /sys stay as they are."""
    chroot = f"{CWD}/chroot/proc"
    host = FakeHost({**HOST.entries, chroot: "dir", "/srv/dev": "dir"})
    req = LaunchRequest(
        command=("true",),
        cwd=CWD,
        home=HOME,
        environ=(("PATH", "/usr/bin"),),
        settings=parse_settings("{}", "test.json"),
        backend="native",
        tmpdir=TMP,
        private_root=PRIV,
        runner_paths=("/usr/lib/sandhold",),
        kernel_mounts=(
            ("/proc", "proc"),
            ("/sys/fs/cgroup", "cgroup2"),
            ("/dev/pts", "devpts"),
            (chroot, "proc"),
            ("/srv/dev", "devtmpfs"),
        ),
    )
    plan = plan_launch(req, host)
    assert plan.fs is not None
    hidden = {m.path: m.reason for m in plan.fs.mounts if m.op == "hide-dir"}
    assert hidden.get(chroot) == "sandhold: the host's proc mounted here"
    assert hidden.get("/srv/dev") == "sandhold: the host's devtmpfs mounted here"
    assert not any(p.startswith(("/proc", "/sys", "/dev")) for p in hidden)


@pytest.mark.parametrize(
    ("settings", "environ", "expected"),
    [
        # the home is read-only: npm's and the XDG tools' caches go below $TMPDIR
        (
            {"filesystem": {"allowWrite": ["."]}},
            {},
            {"XDG_CACHE_HOME": f"{TMP}/.cache", "npm_config_cache": f"{TMP}/.npm"},
        ),
        ({}, {}, {"XDG_CACHE_HOME": f"{TMP}/.cache", "npm_config_cache": f"{TMP}/.npm"}),
        # a writable home keeps them where they are
        ({"filesystem": {"allowWrite": ["~"]}}, {}, {}),
        # one the user passed stays as passed
        (
            {"filesystem": {"allowWrite": ["."]}, "env": {"passthrough": ["XDG_CACHE_HOME"]}},
            {"XDG_CACHE_HOME": "/srv/cache"},
            {"XDG_CACHE_HOME": "/srv/cache", "npm_config_cache": f"{TMP}/.npm"},
        ),
    ],
)
def test_caches_move_below_tmpdir_where_the_home_is_read_only(
    settings: dict[str, object], environ: dict[str, str], expected: dict[str, str]
) -> None:
    plan = launch(settings, environ=(("PATH", "/usr/bin"), *environ.items()))
    env = dict(plan.environment)
    got = {k: env[k] for k in ("XDG_CACHE_HOME", "npm_config_cache") if k in env}
    assert got == expected


NETWORK = {"network": {"allowedDomains": ["example.com"]}}
WORKAROUNDS = ("GIT_SSH_COMMAND", "JAVA_TOOL_OPTIONS", "NODE_USE_ENV_PROXY")


@pytest.mark.parametrize(
    ("passthrough", "environ", "expected"),
    [
        # no workaround for runtimes that ignore the proxy variables: transparent egress
        ((), {"GIT_SSH_COMMAND": "ssh -i k", "JAVA_TOOL_OPTIONS": "-Xmx1g"}, {}),
        # the user's own, passed through, stays as written
        (
            ("GIT_SSH_COMMAND", "JAVA_TOOL_OPTIONS"),
            {"GIT_SSH_COMMAND": "ssh -i k", "JAVA_TOOL_OPTIONS": "-Xmx1g"},
            {"GIT_SSH_COMMAND": "ssh -i k", "JAVA_TOOL_OPTIONS": "-Xmx1g"},
        ),
    ],
)
def test_a_network_launch_sets_proxy_variables_and_no_workarounds(
    passthrough: tuple[str, ...], environ: dict[str, str], expected: dict[str, str]
) -> None:
    settings = {**NETWORK, "env": {"passthrough": list(passthrough)}}
    plan = launch(settings, environ=(("PATH", "/usr/bin"), *environ.items()))
    assert plan.egress is not None and plan.egress.transparent
    env = dict(plan.environment)
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:3128" and env["npm_config_proxy"]
    assert {k: env[k] for k in WORKAROUNDS if k in env} == expected
