"""The spec-launched sandbox's mount plan as a pure function of a spec and host facts (SPEC §4).

Each case builds a fake host, plans, and looks at what the sandbox would see
and whether it could write there. ``effective`` replays the ordered mounts the
way bubblewrap applies them: the deepest mount containing a path decides.
The real-sandbox counterparts are in test_port_spec.py.
"""

from __future__ import annotations

import pytest

from fakehost import FakeHost
from sandhold.errors import SpecError, UnenforceablePolicy
from sandhold.policy import paths
from sandhold.policy.creation import denied
from sandhold.policy.specplan import ETC_SECRETS, SYSTEM_BASE, SpecHost, SpecPlan, plan_spec
from sandhold.spec import SandboxBindMount, SandboxMode, SandboxSpec

HOME = "/home/u"
PROJ = "/home/u/proj"
PRIV = "/tmp/sandhold-1000"
TMP = "/tmp/sandhold-1000/s1/tmp"
PKG = "/opt/sh/sandhold"

BASE_HOST = {
    "/usr/bin/sh": "file",
    "/usr/lib/x.so": "file",
    "/bin": "-> usr/bin",
    "/lib": "-> usr/lib",
    "/etc/passwd": "file",
    "/etc/shadow": "file",
    "/etc/gshadow": "file",
    "/etc/sudoers.d/admin": "file",
    "/etc/ssh/ssh_host_ed25519_key": "file",
    "/etc/ssh/ssh_host_ed25519_key.pub": "file",
    "/etc/ssl/private/site.key": "file",
    "/etc/ssl/certs/ca.pem": "file",
    "/etc/resolv.conf": "-> /run/systemd/resolve/stub-resolv.conf",
    "/run/systemd/resolve/stub-resolv.conf": "file",
    "/run/secret-daemon.sock": "file",
    "/root/.bashrc": "file",
    f"{HOME}/.ssh/id_ed25519": "file",
    f"{HOME}/.aws/credentials": "file",
    f"{HOME}/.bashrc": "file",
    f"{HOME}/other/notes.txt": "file",
    f"{PROJ}/src/main.py": "file",
    f"{PROJ}/.git/hooks": "dir",
    f"{PROJ}/.git/config": "file",
    f"{PROJ}/.env": "file",
    f"{PROJ}/vendor/lib.py": "file",
    f"{PROJ}/.state/log": "file",
    f"{PKG}/__init__.py": "file",
    PRIV: "dir",
    TMP: "dir",
    "/data/real/file": "file",
    "/w/link": "-> /data/real",
}


def plan(
    *binds: SandboxBindMount,
    extra: dict[str, str] | None = None,
    agent: tuple[str, ...] = (PKG,),
    supervisor: bool = True,
    landlock: bool = True,
    code: tuple[str, ...] = (),
    kernel_mounts: tuple[tuple[str, str], ...] = (),
    **kw: object,
) -> SpecPlan:
    host = FakeHost({**BASE_HOST, **(extra or {})})
    # the links these tables name are the harness's own (test_bind_pinning: the refusal)
    kw.setdefault("follow_symlinks", ("/w/link", "/home/v"))
    spec = SandboxSpec("s1", "w1", bind_mounts=binds, **kw)  # type: ignore[arg-type]
    facts = SpecHost(
        HOME,
        TMP,
        PRIV,
        agent,
        code_paths=code,
        supervisor=supervisor,
        landlock=landlock,
        kernel_mounts=kernel_mounts,
    )
    return plan_spec(spec, facts, host)


def effective(p: SpecPlan, path: str) -> str:
    """What the sandbox has at ``path``: "hidden", "ro", "rw", "tmp" or "absent"."""
    deciding = None
    for m in p.fs.mounts:
        if m.op != "remount-ro" and paths.is_within(path, m.path):
            deciding = m
    if deciding is None:
        return "absent"
    return {
        "hide-dir": "hidden",
        "hide-file": "hidden",
        "ro-bind": "ro",
        "bind": "rw",
        "tmpfs": "tmp",
    }[deciding.op]


def test_base_only_shows_the_system_and_private_tmp() -> None:
    p = plan()
    for path in ("/usr/bin/sh", "/bin", "/lib", "/etc/passwd", "/etc/ssl/certs/ca.pem"):
        assert effective(p, path) == "ro", path
    assert effective(p, "/tmp/anything") == "tmp"
    for path in (
        HOME,
        f"{HOME}/.ssh",
        "/root/.bashrc",
        "/run/secret-daemon.sock",
        "/data/real",
    ):
        assert effective(p, path) == "absent", path
    assert effective(p, PRIV) == "tmp"  # the private /tmp is a fresh tmpfs
    assert p.workdir == "/" and not p.home_visible
    assert [m.op for m in p.fs.mounts if m.path == "/tmp"] == ["tmpfs"]
    assert set(SYSTEM_BASE) >= {
        m.path for m in p.fs.mounts if m.reason == "spec base: system directory"
    }


@pytest.mark.parametrize(
    "secret",
    [
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/sudoers.d",
        "/etc/ssh/ssh_host_ed25519_key",
        "/etc/ssl/private",
    ],
)
def test_etc_secrets_are_hidden(secret: str) -> None:
    p = plan()
    assert effective(p, secret) == "hidden"
    assert effective(p, "/etc/ssh/ssh_host_ed25519_key.pub") == "ro"  # public half stays


def test_etc_secrets_table_names_its_reasons() -> None:
    assert all(entry.startswith("/etc/") and why for entry, why in ETC_SECRETS)


def test_etc_links_out_of_the_base_get_their_target() -> None:
    p = plan()
    assert effective(p, "/run/systemd/resolve/stub-resolv.conf") == "ro"
    assert effective(p, "/run/secret-daemon.sock") == "absent"


@pytest.mark.parametrize(
    ("mode", "read_only", "expected"),
    [
        (SandboxMode.CHAT, False, "rw"),
        (SandboxMode.CHAT, True, "ro"),
        (SandboxMode.REVIEW, False, "ro"),
        (SandboxMode.PLAN, False, "ro"),
        (SandboxMode.ORCHESTRATE, False, "ro"),
    ],
)
def test_modes(mode: SandboxMode, read_only: bool, expected: str) -> None:
    p = plan(SandboxBindMount(PROJ, read_only=read_only), mode=mode)
    assert effective(p, f"{PROJ}/src/main.py") == expected
    assert p.workdir == PROJ
    if mode is not SandboxMode.CHAT:
        assert any(f"mode {mode.value}" in n for n in p.notes)


@pytest.mark.parametrize("mode", list(SandboxMode))
def test_protected_paths_never_writable(mode: SandboxMode) -> None:
    p = plan(SandboxBindMount(PROJ), mode=mode, protected_paths=(f"{PROJ}/src",))
    assert effective(p, f"{PROJ}/src/main.py") == "ro"
    reasons = [m.reason for m in p.fs.mounts if m.path == f"{PROJ}/src"]
    assert reasons in ([], ["protected_paths[0]"])


@pytest.mark.parametrize("mode", list(SandboxMode))
def test_runner_state_dirs_writable_in_every_mode(mode: SandboxMode) -> None:
    p = plan(SandboxBindMount(PROJ), mode=mode, runner_state_dirs=(f"{PROJ}/.state",))
    assert effective(p, f"{PROJ}/.state/log") == "rw"
    assert effective(p, f"{PROJ}/src/main.py") == ("rw" if mode is SandboxMode.CHAT else "ro")


def test_runner_state_dir_outside_binds_is_bound() -> None:
    p = plan(runner_state_dirs=(f"{HOME}/other",), mode=SandboxMode.PLAN)
    assert effective(p, f"{HOME}/other/notes.txt") == "rw"
    assert effective(p, f"{HOME}/.bashrc") == "absent"


def test_protected_beats_runner_state_dir() -> None:
    p = plan(
        SandboxBindMount(PROJ),
        runner_state_dirs=(f"{PROJ}/.state",),
        protected_paths=(PROJ,),
    )
    assert effective(p, f"{PROJ}/.state/log") == "ro"
    assert effective(p, f"{PROJ}/src/main.py") == "ro"


def test_mandatory_denies_inside_writable_binds() -> None:
    p = plan(SandboxBindMount(PROJ))
    assert effective(p, f"{PROJ}/.git/hooks") == "ro"
    assert effective(p, f"{PROJ}/.git/config") == "ro"
    assert effective(p, f"{PROJ}/.env") == "ro"
    # names made later are the supervisor's: nothing is created in the user's tree
    assert p.fs.unpinned == ()
    assert p.creation is not None and p.creation.writable_roots == (PROJ,)
    assert p.creation.scratch == ("/tmp",)
    assert p.landlock == (PROJ, "/tmp")


def test_without_the_supervisor_a_writable_bind_is_refused_not_weakened() -> None:
    """F-BE-5: a kernel without seccomp user notification cannot refuse names made later."""
    with pytest.raises(UnenforceablePolicy, match="seccomp user notification"):
        plan(SandboxBindMount(PROJ), supervisor=False)
    # read-only binds need no supervisor: nothing can be created there
    p = plan(SandboxBindMount(PROJ, read_only=True), supervisor=False, landlock=False)
    assert p.creation is None and p.landlock is None


def test_review_mode_supervises_to_report_writes_and_keeps_landlock() -> None:
    p = plan(SandboxBindMount(PROJ), mode=SandboxMode.REVIEW)
    assert p.creation is not None  # nothing writable, but writes tried are reported
    assert p.creation.writable_roots == () and p.creation.scratch == ("/tmp",)
    assert p.landlock == ("/tmp",)


def test_home_is_invisible_unless_bound_and_its_secrets_stay_hidden() -> None:
    p = plan(SandboxBindMount(PROJ))
    assert not p.home_visible
    assert effective(p, f"{HOME}/.bashrc") == "absent"
    p = plan(SandboxBindMount(HOME))
    assert p.home_visible
    assert effective(p, f"{HOME}/other/notes.txt") == "rw"
    assert effective(p, f"{HOME}/.ssh") == "hidden"
    assert effective(p, f"{HOME}/.aws") == "hidden"
    assert effective(p, f"{HOME}/.bashrc") == "ro"  # mandatory: home start-up file


def test_an_explicitly_bound_secret_is_shown() -> None:
    p = plan(SandboxBindMount(f"{HOME}/.ssh", read_only=True))
    assert effective(p, f"{HOME}/.ssh/id_ed25519") == "ro"


KNOWN = f"{HOME}/.ssh/known_hosts"
RUNNER = f"{HOME}/.aws/runner"
SECRET_HOST = {KNOWN: "file", f"{RUNNER}/state": "file", "/home/v": "-> /home/u/.ssh"}


def hide_at(p: SpecPlan, path: str) -> str | None:
    """The perms of the hide-dir at ``path``, or None if there is none."""
    found = [m.perms for m in p.fs.mounts if m.op == "hide-dir" and m.path == path]
    return found[0] if found else None


@pytest.mark.parametrize(
    ("binds", "runner", "expected"),
    [
        # a bind inside the hidden location shows that path and nothing beside it
        (
            (SandboxBindMount(HOME), SandboxBindMount(KNOWN, read_only=True)),
            (),
            {KNOWN: "ro", f"{HOME}/.ssh/id_ed25519": "hidden", f"{HOME}/.ssh": "hidden"},
        ),
        # an ancestor of the home directory hides it as the home directory does
        (
            (SandboxBindMount("/home"), SandboxBindMount(KNOWN, read_only=True)),
            (),
            {KNOWN: "ro", f"{HOME}/.ssh/id_ed25519": "hidden"},
        ),
        # a runner state dir in ~/.aws: writable, and the credentials beside it hidden
        (
            (SandboxBindMount(HOME),),
            (RUNNER,),
            {f"{RUNNER}/state": "rw", f"{HOME}/.aws/credentials": "hidden", KNOWN: "hidden"},
        ),
        # the location named exactly: shown whole
        (
            (SandboxBindMount(HOME), SandboxBindMount(f"{HOME}/.ssh", read_only=True)),
            (),
            {f"{HOME}/.ssh/id_ed25519": "ro", f"{HOME}/.aws/credentials": "hidden"},
        ),
        # named through a symlink: the same place, shown whole
        (
            (SandboxBindMount(HOME), SandboxBindMount("/home/v", read_only=True)),
            (),
            {f"{HOME}/.ssh/id_ed25519": "ro"},
        ),
        # no bind holds the location: the inner bind is all the sandbox sees of it
        # (after a directory to work in: a file cannot be the working directory)
        (
            (SandboxBindMount(PROJ), SandboxBindMount(KNOWN, read_only=True)),
            (),
            {KNOWN: "ro", f"{HOME}/.ssh/id_ed25519": "absent"},
        ),
    ],
)
@pytest.mark.parametrize("mode", [SandboxMode.REVIEW, SandboxMode.CHAT])
def test_a_bind_inside_a_secret_location_shows_only_itself(
    binds: tuple[SandboxBindMount, ...],
    runner: tuple[str, ...],
    expected: dict[str, str],
    mode: SandboxMode,
) -> None:
    p = plan(*binds, runner_state_dirs=runner, mode=mode, extra=SECRET_HOST)
    for path, want in expected.items():
        assert effective(p, path) == want, (path, mode)


def test_a_hole_in_a_secret_location_is_explained() -> None:
    p = plan(
        SandboxBindMount(HOME),
        SandboxBindMount(KNOWN, read_only=True),
        runner_state_dirs=(RUNNER,),
        mode=SandboxMode.REVIEW,
        extra=SECRET_HOST,
    )
    # the hidden locations stay, traversable only (0111) to reach what is shown
    assert hide_at(p, f"{HOME}/.ssh") == "0111" and hide_at(p, f"{HOME}/.aws") == "0111"
    reasons = {m.path: m.reason for m in p.fs.mounts if m.op != "remount-ro"}
    assert reasons[KNOWN] == "bind_mounts[1] (read_only), inside the hidden ~/.ssh"
    assert reasons[RUNNER].startswith("runner_state_dirs[0]")
    assert p.creation is not None and p.creation.writable_roots == (RUNNER,)
    assert p.landlock == (RUNNER, "/tmp")


def test_a_glob_named_path_inside_a_secret_location_is_refused() -> None:
    odd = f"{HOME}/.ssh/k[n]own"
    with pytest.raises(SpecError) as err:
        plan(
            SandboxBindMount(HOME),
            SandboxBindMount(odd, read_only=True),
            extra={odd: "file", f"{HOME}/.ssh/known": "file"},
        )
    assert err.value.field.startswith("bind_mounts[1]") and "glob characters" in str(err.value)


@pytest.mark.parametrize(
    ("binds", "runner", "field", "names"),
    [
        # a symlink to a read-only bind, writable
        (
            (SandboxBindMount("/data/real", read_only=True), SandboxBindMount("/w/link")),
            (),
            "bind_mounts[1].host_path",
            ["bind_mounts[0] (/data/real, read-only)", "bind_mounts[1] (/w/link, writable)"],
        ),
        # the other way round
        (
            (SandboxBindMount("/w/link"), SandboxBindMount("/data/real", read_only=True)),
            (),
            "bind_mounts[1].host_path",
            ["bind_mounts[1] (/data/real, read-only)", "bind_mounts[0] (/w/link, writable)"],
        ),
        # two spellings of one path
        (
            (SandboxBindMount(PROJ, read_only=True), SandboxBindMount(f"{HOME}//proj/")),
            (),
            "bind_mounts[1].host_path",
            [f"bind_mounts[0] ({PROJ}, read-only)", f"bind_mounts[1] ({PROJ}, writable)"],
        ),
        # a symlinked ancestor
        (
            (SandboxBindMount("/w/link/sub", read_only=True), SandboxBindMount("/data/real/sub")),
            (),
            "bind_mounts[1].host_path",
            ["/w/link/sub, read-only", "/data/real/sub, writable", "both /data/real/sub"],
        ),
        # a read_only bind that is also a runner state dir
        (
            (SandboxBindMount("/data/real", read_only=True),),
            ("/w/link",),
            "runner_state_dirs[0]",
            ["bind_mounts[0] (/data/real) makes read_only"],
        ),
    ],
)
def test_aliases_that_disagree_on_writability_are_refused(
    binds: tuple[SandboxBindMount, ...], runner: tuple[str, ...], field: str, names: list[str]
) -> None:
    with pytest.raises(SpecError) as err:
        plan(*binds, runner_state_dirs=runner, extra={"/data/real/sub/x": "file"})
    assert err.value.field == field
    for name in names:
        assert name in str(err.value), err.value


def test_aliases_that_agree_are_one_bind() -> None:
    # every bind read-only in review mode: nothing to disagree on
    p = plan(
        SandboxBindMount("/data/real", read_only=True),
        SandboxBindMount("/w/link"),
        mode=SandboxMode.REVIEW,
    )
    assert effective(p, "/data/real/file") == "ro"
    p = plan(SandboxBindMount("/data/real"), SandboxBindMount("/w/link"))
    assert effective(p, "/data/real/file") == "rw"
    # a runner state dir is writable in every mode, also where a bind is read-only by mode
    p = plan(SandboxBindMount("/w/link"), runner_state_dirs=("/data/real",), mode="review")
    assert effective(p, "/data/real/file") == "rw"


def test_readonly_bind_inside_a_writable_one_stays_readonly() -> None:
    p = plan(SandboxBindMount(PROJ), SandboxBindMount(f"{PROJ}/vendor", read_only=True))
    assert effective(p, f"{PROJ}/vendor/lib.py") == "ro"
    assert effective(p, f"{PROJ}/src/main.py") == "rw"


def test_agent_files_are_read_only_even_inside_a_writable_bind() -> None:
    p = plan(SandboxBindMount("/opt/sh"), agent=(PKG,))
    assert effective(p, "/opt/sh") == "rw"
    assert effective(p, f"{PKG}/__init__.py") == "ro"
    p = plan(agent=(PKG,))
    assert effective(p, f"{PKG}/__init__.py") == "ro"
    assert effective(p, "/opt/sh/other") == "absent"


def test_symlinked_bind_is_made_at_its_resolved_path() -> None:
    p = plan(SandboxBindMount("/w/link"))
    assert effective(p, "/data/real/file") == "rw"
    assert p.workdir == "/data/real"
    assert any("resolved location /data/real" in n for n in p.notes)


def test_exec_grant_roots_are_ignored_on_linux_and_said_so() -> None:
    p = plan(SandboxBindMount(PROJ), exec_grant_roots=(f"{PROJ}/bin",))
    assert any("exec_grant_roots are ignored on Linux" in n for n in p.notes)


def test_guest_workdir() -> None:
    p = plan(SandboxBindMount(PROJ), guest_workdir=f"{PROJ}/src")
    assert p.workdir == f"{PROJ}/src"
    with pytest.raises(SpecError) as info:
        plan(SandboxBindMount(PROJ), guest_workdir=f"{HOME}/other")
    assert info.value.field == "guest_workdir"


def test_glob_protected_paths_with_the_supervisor() -> None:  # F-BE-5
    p = plan(
        SandboxBindMount(PROJ),
        protected_paths=(f"{PROJ}/**/*.secret",),
        extra={f"{PROJ}/cfg/a.secret": "file", f"{PROJ}/cfg/ok.txt": "file"},
    )
    assert effective(p, f"{PROJ}/cfg/a.secret") == "ro"  # what exists at launch
    assert effective(p, f"{PROJ}/cfg/ok.txt") == "rw"
    assert p.creation is not None  # and what is made later
    assert denied(p.creation, f"{PROJ}/new/dir/b.secret") is not None
    assert denied(p.creation, f"{PROJ}/new/dir/b.txt") is None


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("**/.env", "absolute"),  # relative: what would it be relative to?
        (f"{PROJ}/[abc", "["),  # not a glob the rules can read
        (f"{PROJ}/\ud800", "lone surrogate"),  # not text
    ],
)
def test_bad_protected_paths_are_spec_errors(entry: str, why: str) -> None:
    with pytest.raises(SpecError) as err:
        plan(SandboxBindMount(PROJ), protected_paths=(entry,))
    assert err.value.field == "protected_paths[0]" and why in str(err.value), err.value


def test_refusals() -> None:
    with pytest.raises(UnenforceablePolicy) as info:
        plan(SandboxBindMount(PROJ, guest_path="/workspace"))
    assert "guest_path" in info.value.rule
    with pytest.raises(UnenforceablePolicy) as info:  # F-BE-5, without the supervisor
        plan(SandboxBindMount(PROJ), protected_paths=(f"{PROJ}/**/.env",), supervisor=False)
    assert "protected_paths[0]" in info.value.rule
    with pytest.raises(SpecError) as err:
        plan(SandboxBindMount("/nope"))
    assert err.value.field == "bind_mounts[0].host_path"
    with pytest.raises(SpecError) as err:
        plan(runner_state_dirs=("/nope",))
    assert err.value.field == "runner_state_dirs[0]"


def test_mounts_are_ordered_parents_first() -> None:
    p = plan(SandboxBindMount(PROJ), SandboxBindMount(f"{PROJ}/vendor", read_only=True))
    depths = [paths.depth(m.path) for m in p.fs.mounts if m.op != "remount-ro"]
    assert depths == sorted(depths)


def test_a_bind_of_tmp_replaces_the_private_tmp() -> None:
    p = plan(SandboxBindMount("/tmp"), extra={"/tmp/shared/x": "file"})
    assert effective(p, "/tmp/shared/x") == "rw"
    assert effective(p, PRIV) == "hidden"  # sandhold's own data stays covered


def test_network_goes_through_the_sessions_own_proxies() -> None:  # F-NET-1, F-NET-3
    on = plan(network_enabled=True).network
    assert "own proxies only" in on and "127.0.0.1:3128" in on and "127.0.0.1:1080" in on
    off = plan(network_enabled=False).network
    assert "network_enabled is false" in off and "every connection is refused" in off


def test_the_harness_code_inside_a_writable_bind_is_read_only() -> None:
    """The harness (SandboxPort's process) imports lazily from its sys.path: a venv or
    a PYTHONPATH entry inside a writable bind is read-only, or not to be made; the
    harness script's own directory holding the bind is left alone."""
    venv = f"{PROJ}/.venv/lib/site"
    later = f"{PROJ}/not-yet"
    p = plan(
        SandboxBindMount(PROJ),
        extra={f"{venv}/mod.py": "file"},
        code=(venv, later, HOME, "/usr/lib/python3"),
    )
    assert effective(p, f"{venv}/mod.py") == "ro"
    assert effective(p, f"{PROJ}/other.py") == "rw"
    assert p.creation is not None and denied(p.creation, f"{later}/sitecustomize.py")


@pytest.mark.parametrize(
    ("bind", "runner"),
    [("/p/a[b]", None), ("/p/st*r", None), ("/p/q?", None), (None, "/p/a[b]")],
)
def test_a_bind_named_like_a_glob_is_refused(bind: str | None, runner: str | None) -> None:
    """The plan reads entries as patterns: a writable bind of /p/a[b] would make /p/ab
    writable too. Such a name is refused, for runner state dirs as well."""
    extra = {"/p": "dir", "/p/ab": "dir", "/p/a[b]": "dir", "/p/st*r": "dir", "/p/q?": "dir"}
    binds = (SandboxBindMount(bind),) if bind else ()
    with pytest.raises(SpecError) as err:
        plan(*binds, extra=extra, runner_state_dirs=(runner,) if runner else ())
    assert "glob" in str(err.value)


@pytest.mark.parametrize(
    ("link", "target"),
    [("/w/p", "/proc"), ("/w/self", "/proc/1"), ("/w/devs", "/dev"), ("/w/sysfs", "/sys/kernel")],
)
def test_a_bind_that_resolves_into_a_host_kernel_tree_is_refused(link: str, target: str) -> None:
    extra = {link: f"-> {target}", "/proc/1/cmdline": "file", "/dev/null": "file"}
    extra["/sys/kernel/x"] = "file"
    with pytest.raises(SpecError) as err:
        plan(SandboxBindMount(PROJ), SandboxBindMount(link, read_only=True), extra=extra)
    assert err.value.field == "bind_mounts[1].host_path"
    assert f"{link} resolves to {target}" in err.value.reason, err.value.reason
    with pytest.raises(SpecError) as err:
        plan(SandboxBindMount(PROJ), runner_state_dirs=(link,), extra=extra)
    assert err.value.field == "runner_state_dirs[0]"


def test_a_glob_bind_says_it_is_a_glob() -> None:
    with pytest.raises(SpecError) as err:
        plan(SandboxBindMount(f"{HOME}/*"))
    assert err.value.field == "bind_mounts[0].host_path"
    assert "glob pattern" in err.value.reason and "does not exist" not in err.value.reason


def test_the_working_directory_must_be_a_directory() -> None:
    """A file bind is fine, but not as the working directory (the first bind unless
    guest_workdir is set): bubblewrap would fail late, saying little of why."""
    p = plan(SandboxBindMount(PROJ), SandboxBindMount(f"{PROJ}/.env", read_only=True))
    assert effective(p, f"{PROJ}/.env") == "ro"
    p = plan(SandboxBindMount(f"{PROJ}/.env", read_only=True), guest_workdir="/usr")
    assert p.workdir == "/usr"
    cases = [
        ((SandboxBindMount(f"{PROJ}/.env"),), {}, "bind_mounts[0].host_path", "set guest_workdir"),
        ((SandboxBindMount(PROJ),), {"guest_workdir": f"{PROJ}/.env"}, "guest_workdir", "not a"),
        (
            (SandboxBindMount(PROJ),),
            {"guest_workdir": f"{PROJ}/nope"},
            "guest_workdir",
            "not exist",
        ),
    ]
    for binds, kw, field, why in cases:
        with pytest.raises(SpecError) as err:
            plan(*binds, **kw)
        assert err.value.field == field and why in err.value.reason, err.value


def test_a_bind_holding_a_kernel_file_system_mount_is_refused() -> None:
    """bubblewrap binds recursively: a chroot with the host's /proc mounted in it would
    show every host process."""
    mounts = (("/proc", "proc"), (f"{PROJ}/chroot/proc", "proc"), (f"{PROJ}/dev", "devtmpfs"))
    with pytest.raises(SpecError, match=r"holds a mount of the host's proc at .*/chroot/proc"):
        plan(SandboxBindMount(PROJ), kernel_mounts=mounts)
    with pytest.raises(SpecError, match="devtmpfs"):
        plan(SandboxBindMount(PROJ, read_only=True), kernel_mounts=mounts[2:])
    assert plan(SandboxBindMount(PROJ), kernel_mounts=mounts[:1]) is not None  # beside it


def test_jj_user_config_is_protected_in_a_bind_of_the_home() -> None:  # F-SET-5
    """jj's user config directory (its per-repository config too) and what the
    harness's ``$JJ_CONFIG`` names stay unwritable in a writable bind."""
    host = FakeHost(
        {**BASE_HOST, f"{HOME}/.config/jj/config.toml": "file", f"{PROJ}/jj.toml": "file"}
    )
    spec = SandboxSpec("s1", "w1", bind_mounts=(SandboxBindMount(HOME),))
    facts = SpecHost(
        HOME, TMP, PRIV, (PKG,), supervisor=True, landlock=True, jj_config=f"{PROJ}/jj.toml"
    )
    p = plan_spec(spec, facts, host)
    assert effective(p, f"{HOME}/.config/jj") == "ro"
    assert effective(p, f"{PROJ}/jj.toml") == "ro"
    assert effective(p, f"{PROJ}/src/main.py") == "rw"
    assert p.creation is not None
    for path in (f"{HOME}/.jjconfig.toml", f"{HOME}/.config/jj/repos/ab/config.toml"):
        assert denied(p.creation, path) is not None, path


def test_both_plans_end_with_the_same_confinement_steps() -> None:
    """One function (policy/confinement.py) makes both plans' supervisor policy, Landlock
    roots and syscall rules: a change to it reaches the CLI and the spec alike."""
    import inspect

    from sandhold.policy import cliplan, specplan

    for module in (cliplan, specplan):
        source = inspect.getsource(module)
        assert "confine(" in source and "check_pinned(" in source
        assert "creation_policy(" not in source and "syscall_rules(" not in source


def _env_plan(*binds: SandboxBindMount, environ: dict[str, str]) -> SpecPlan:
    facts = SpecHost(
        HOME,
        TMP,
        PRIV,
        (PKG,),
        supervisor=True,
        landlock=True,
        environ=tuple(environ.items()),
    )
    spec = SandboxSpec("s1", "w1", bind_mounts=binds)
    return plan_spec(spec, facts, FakeHost(BASE_HOST))


HARNESS_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": HOME,
    "LANG": "C.UTF-8",
    "GITHUB_TOKEN": "ghp_secret",
    "AWS_SECRET_ACCESS_KEY": "k",
    "TMPDIR": "/host/tmp",
}


@pytest.mark.parametrize(
    ("bind", "home"),
    [
        (SandboxBindMount(PROJ), "/tmp"),  # the home itself is not visible: HOME is /tmp
        (SandboxBindMount(HOME), HOME),  # bound: HOME stays
    ],
)
def test_the_spec_plan_decides_the_environment(bind: SandboxBindMount, home: str) -> None:
    p = _env_plan(bind, environ=HARNESS_ENV)
    env = dict(p.environment)
    assert env["HOME"] == home
    assert env["TMPDIR"] == env["TMP"] == env["TEMP"] == "/tmp"  # never the host's
    assert env["PATH"] == "/usr/bin:/bin" and env["LANG"] == "C.UTF-8"
    assert "GITHUB_TOKEN" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert {n for n, _ in p.dropped_env} >= {"GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY"}
    # the proxy variables are the plan's too, and named as such
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:3128"
    assert env["ALL_PROXY"] == "socks5h://127.0.0.1:1080"
    assert {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"} <= set(p.proxy_variables)
    assert set(p.proxy_variables) <= set(env)
    # no workaround for runtimes that ignore them: transparent egress carries those
    assert not {"GIT_SSH_COMMAND", "JAVA_TOOL_OPTIONS", "NODE_USE_ENV_PROXY"} & set(env)


def test_explain_shows_the_spec_environment() -> None:
    from sandhold.explain import render_spec_plan

    text = render_spec_plan(_env_plan(SandboxBindMount(PROJ), environ=HARNESS_ENV))
    assert "HTTPS_PROXY" in text and "TMPDIR" in text
    assert "GITHUB_TOKEN:" in text  # dropped, with why
    assert "ghp_secret" not in text
