"""Issue 21: what a bind mounts is what the plan decided, and every home's secrets hide.

- A bind source swapped between plan and mount (a RENAME_EXCHANGE loop by anything
  that can write its parent) fails the launch; it never mounts the swapped-in object.
- A bind or runner state dir through a symlink a sandbox could have planted is
  refused, naming the link and ``follow_symlinks``; with the opt-in it is followed.
- A service-style $HOME does not expose the account home's ~/.ssh, nor does a bind of
  /home any user's.

Table tests of the pure plan with the fake host, then real sandboxes through the
SandboxPort as root and as the unprivileged user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from pathlib import Path

import pytest

from conftest import World
from fakehost import FakeHost
from portdriver import drive
from sandhold.policy.specplan import SpecHost, SpecPlan, plan_spec
from sandhold.spec import SandboxBindMount, SandboxSpec, SpecError
from test_spec_plan import BASE_HOST, HOME, PKG, PRIV, TMP, effective

WS = "/srv/ws"
PLANTED = {
    f"{WS}/sub": "-> /data/real",  # left by an earlier session of the workspace
    f"{WS}/deep": "-> /srv/hop",  # a link whose target passes through another link
    "/srv/hop": "-> /etc",
    f"{WS}/real/f": "file",
    "/var/run": "-> /run",  # the system's own links: followed
    "/run/state/x": "file",
}


def splan(
    *binds: SandboxBindMount,
    extra: dict[str, str] | None = None,
    home: str = HOME,
    account_home: str = "",
    homes: tuple[str, ...] = (),
    **kw: object,
) -> SpecPlan:
    host = FakeHost({**BASE_HOST, **PLANTED, **(extra or {})})
    spec = SandboxSpec("s1", "w1", bind_mounts=binds, **kw)  # type: ignore[arg-type]
    facts = SpecHost(
        home, TMP, PRIV, (PKG,), supervisor=True, account_home=account_home, homes=homes
    )
    return plan_spec(spec, facts, host)


@pytest.mark.parametrize(
    ("binds", "runner", "field", "link"),
    [
        ((SandboxBindMount(f"{WS}/sub"),), (), "bind_mounts[0].host_path", f"{WS}/sub"),
        (
            (SandboxBindMount(f"{WS}/real"), SandboxBindMount(f"{WS}/sub/x", read_only=True)),
            (),
            "bind_mounts[1].host_path",
            f"{WS}/sub",
        ),
        ((SandboxBindMount(f"{WS}/real"),), (f"{WS}/sub",), "runner_state_dirs[0]", f"{WS}/sub"),
        # the first link is named: the one in its target is still checked
        ((SandboxBindMount(f"{WS}/deep"),), (), "bind_mounts[0].host_path", f"{WS}/deep"),
    ],
)
def test_a_planted_symlink_on_a_bind_path_is_refused(
    binds: tuple[SandboxBindMount, ...], runner: tuple[str, ...], field: str, link: str
) -> None:
    extra = {"/data/real/x": "file"}
    with pytest.raises(SpecError) as err:
        splan(*binds, runner_state_dirs=runner, extra=extra)
    assert err.value.field == field
    assert f"through the symlink {link} " in err.value.reason, err.value.reason
    assert f"add {link} to follow_symlinks" in err.value.reason


def test_a_link_in_a_link_target_needs_its_own_opt_in() -> None:
    with pytest.raises(SpecError) as err:
        splan(SandboxBindMount(f"{WS}/deep"), follow_symlinks=(f"{WS}/deep",))
    assert "through the symlink /srv/hop " in err.value.reason
    p = splan(SandboxBindMount(f"{WS}/deep"), follow_symlinks=(f"{WS}/deep", "/srv/hop"))
    assert p.workdir == "/etc"


def test_the_opt_in_follows_the_named_link_and_says_where() -> None:
    p = splan(SandboxBindMount(f"{WS}/sub"), follow_symlinks=(f"{WS}/sub",))
    assert effective(p, "/data/real/file") == "rw"
    assert any(f"{WS}/sub is bound at its resolved location /data/real" in n for n in p.notes)


def test_system_links_are_followed() -> None:
    p = splan(SandboxBindMount("/var/run/state"), SandboxBindMount("/lib", read_only=True))
    assert effective(p, "/run/state/x") == "rw"
    assert effective(p, "/usr/lib/x.so") == "ro"


def test_a_system_directory_link_inside_a_writable_bind_is_not_the_systems() -> None:
    # a writable bind of /var: its links are the sandbox's to plant
    with pytest.raises(SpecError) as err:
        splan(SandboxBindMount("/var"), SandboxBindMount("/var/run/state", read_only=True))
    assert "inside /var, which this sandbox can write" in err.value.reason


def test_every_bind_source_is_pinned_with_what_the_plan_saw() -> None:
    p = splan(SandboxBindMount(f"{WS}/real"), SandboxBindMount("/data/real", read_only=True))
    pinned = {pin.path: (pin.dev, pin.ino) for pin in p.pins}
    host = FakeHost({**BASE_HOST, **PLANTED})
    for m in p.fs.mounts:
        if m.op in ("bind", "ro-bind"):
            st = host.lstat(m.path)
            assert st is not None
            if st.kind == "symlink":  # the base's /bin -> usr/bin: root's, bound by path
                assert m.path in ("/bin", "/lib"), m.path
                continue
            assert pinned[m.path] == (st.dev, st.ino), m.path
    assert f"{WS}/real" in pinned and "/data/real" in pinned and "/usr" in pinned


SERVICE = "/srv/svc"  # a service's $HOME, not the account's home


@pytest.mark.parametrize(
    ("bind", "facts", "hidden"),
    [
        # the account home from the password database, with $HOME elsewhere
        ("/home/u", {"account_home": "/home/u"}, ["/home/u/.ssh", "/home/u/.aws"]),
        # every home of the password database a bind holds
        ("/home", {"homes": ("/home/u", "/home/v2")}, ["/home/u/.ssh", "/home/v2/.ssh"]),
        # a bind inside a home still hides the secrets it holds
        ("/home/v2/.config", {"homes": ("/home/v2",)}, ["/home/v2/.config/gcloud"]),
    ],
)
def test_every_home_a_bind_covers_keeps_its_secrets_hidden(
    bind: str, facts: dict[str, object], hidden: list[str]
) -> None:
    extra = {"/home/v2/.ssh/id_rsa": "file", "/home/v2/.config/gcloud/creds": "file"}
    extra[f"{SERVICE}/x"] = "file"
    p = splan(SandboxBindMount(bind, read_only=True), extra=extra, home=SERVICE, **facts)  # type: ignore[arg-type]
    for path in hidden:
        assert effective(p, path) == "hidden", (path, p.fs.mounts)
    # and without the facts (the bug): shown
    old = splan(SandboxBindMount(bind, read_only=True), extra=extra, home=SERVICE)
    assert any(effective(old, path) == "ro" for path in hidden)


# -- real sandboxes --------------------------------------------------------------

RACE = """
import ctypes, threading
libc = ctypes.CDLL(None, use_errno=True)
c_int, c_str = ctypes.c_int, ctypes.c_char_p
libc.renameat2.argtypes = [c_int, c_str, c_int, c_str, ctypes.c_uint]
AT_FDCWD, RENAME_EXCHANGE = -100, 2

async def main(port):
    ws, decoy = f"{WORK}/ws", f"{WORK}/decoy"
    os.makedirs(f"{ws}/sub"); os.makedirs(decoy); os.makedirs(f"{WORK}/cwd")
    open(f"{ws}/sub/REAL", "w").close()
    open(f"{decoy}/MARKER", "w").close()
    os.symlink(decoy, f"{ws}/alt")
    stop = threading.Event()
    swaps = [0]

    def swap():  # ctypes drops the GIL: the loop runs while the launch runs
        a, b = f"{ws}/sub".encode(), f"{ws}/alt".encode()
        while not stop.is_set():
            libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
            swaps[0] += 1

    t = threading.Thread(target=swap, daemon=True)
    t.start()
    seen, refused, launched, leaked = [], [], 0, []
    deadline = time.monotonic() + LIMIT_S
    try:
        for i in range(LAUNCHES):
            if time.monotonic() > deadline:
                break
            binds = (SandboxBindMount(f"{WORK}/cwd"), SandboxBindMount(f"{ws}/sub", read_only=True))
            s = spec(f"r{i}", bind_mounts=binds)
            try:
                h = await port.launch(s)
            except Exception as exc:  # refused: each must say which path
                refused.append(f"{type(exc).__name__}: {str(exc)[-400:]}")
                continue
            launched += 1
            r = await port.run(h, f"ls {ws}/sub")
            seen.append(r.stdout.decode().split())
            for pid in sandbox_pids(h):  # no pinned fd reached the sandbox
                try:
                    fds = os.listdir(f"/proc/{pid}/fd")
                except OSError:
                    continue
                for fd in fds:
                    try:
                        target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    except OSError:
                        continue
                    if target in (f"{ws}/sub", f"{ws}/alt", decoy, "/usr", "/etc"):
                        leaked.append(target)
            await port.destroy(h)
    finally:
        stop.set()
        t.join()
    OUT.update(seen=seen, refused=refused, launched=launched, swaps=swaps[0], leaked=leaked)
"""


def test_a_source_swapped_between_plan_and_mount_is_never_mounted(world: World) -> None:
    """A RENAME_EXCHANGE loop between a bound directory and a symlink to a decoy,
    while launches repeat: a launch mounts the real directory or fails, naming the
    path; no launch shows the decoy's marker. (Without the pinning the decoy was
    mounted within a handful of launches.)"""
    body = RACE.replace("LIMIT_S", "12").replace("LAUNCHES", "40")
    out = drive(world, body, timeout=90)
    seen = out["seen"]
    assert isinstance(seen, list)
    assert not any("MARKER" in names for names in seen), seen
    assert out["leaked"] == [], out["leaked"]
    assert out["launched"], out  # some launches got through, and saw the real one
    assert all(names == ["REAL"] for names in seen), seen
    refused = out["refused"]
    assert isinstance(refused, list) and int(out["swaps"]) > 1000  # type: ignore[call-overload]
    # each refusal names the path, either of its names in the swap (bubblewrap's own
    # after-mount check names none)
    for text in refused:
        named = f"{world.work}/ws/sub" in text or f"{world.work}/ws/alt" in text
        assert named or "Race condition binding dirfd" in text, text


def test_a_planted_workspace_symlink_never_redirects_a_later_bind(world: World) -> None:
    """Session 1 replaces ws/sub with a link to a host directory; session 2 binding
    ws/sub writable (or as a runner state dir) is refused, naming the link and
    follow_symlinks; with the opt-in it is bound where the link points."""
    world.mkdir("work/ws/sub")
    world.mkfile("work/target/keep.txt", "host")
    out = drive(
        world,
        """
        async def main(port):
            ws, target = f"{WORK}/ws", f"{WORK}/target"
            h = await port.launch(spec("s1", bind_mounts=(SandboxBindMount(ws),)))
            r = await port.run(h, f"rmdir {ws}/sub && ln -s {target} {ws}/sub && echo planted")
            OUT["planted"] = r.stdout.decode().strip()
            await port.destroy(h)
            for name, kw in {
                "bind": dict(bind_mounts=(SandboxBindMount(f"{ws}/sub"),)),
                "runner": dict(runner_state_dirs=(f"{ws}/sub",), guest_workdir="/tmp"),
            }.items():
                try:
                    h = await port.launch(spec(f"s2{name}", **kw))
                    r = await port.run(h, f"echo x > {ws}/sub/written")
                    OUT[name] = "launched"
                    await port.destroy(h)
                except SpecError as exc:
                    OUT[name] = [exc.field, exc.reason]
            kw = dict(bind_mounts=(SandboxBindMount(f"{ws}/sub"),), follow_symlinks=(f"{ws}/sub",))
            h = await port.launch(spec("s3", **kw))
            r = await port.run(h, f"cat {target}/keep.txt")
            OUT["opt_in"] = r.stdout.decode()
            await port.destroy(h)
        """,
    )
    assert out["planted"] == "planted"
    link = f"{world.work}/ws/sub"
    for name, field in (("bind", "bind_mounts[0].host_path"), ("runner", "runner_state_dirs[0]")):
        got = out[name]
        assert isinstance(got, list), got
        assert got[0] == field
        assert f"through the symlink {link} " in got[1] and "follow_symlinks" in got[1], got
    assert not (world.work / "target/written").exists()
    assert out["opt_in"] == "host"


def test_a_service_home_does_not_expose_the_account_homes_secrets(world: World) -> None:
    """$HOME is a service directory; the bind is the account's home (as the user) or
    /home (both identities): the account's and every user's secret locations stay
    hidden. The key is world-readable, so that only the hiding keeps it from root's
    sandbox too (its capabilities are dropped: a 0700 directory would stop it anyway)."""
    user = pwd.getpwnam("sandhold-test")
    secret = Path(user.pw_dir) / ".kube"  # a SECRET_READ_DENY location
    made = not secret.exists()
    secret.mkdir(mode=0o755, exist_ok=True)
    key = secret / f"issue21-{os.getpid()}-{world.ident.name}"
    key.write_text("ACCOUNT-KEY")
    os.chmod(key, 0o644)
    for p in (secret, key) if made else (key,):
        os.chown(p, user.pw_uid, user.pw_gid)
    try:
        out = drive(
            world,
            f"""
            async def main(port):
                cases = {{"home": "/home"}}
                if os.getuid() != 0:
                    cases["account"] = {user.pw_dir!r}
                for name, bind in cases.items():
                    s = spec(name, bind_mounts=(SandboxBindMount(bind, read_only=True),))
                    h = await port.launch(s)
                    r = await port.run(h, "cat {key}; ls -a {secret}")
                    OUT[name] = r.stdout.decode()
                    await port.destroy(h)
            """,
        )
    finally:
        key.unlink()
        if made:
            with contextlib.suppress(OSError):
                secret.rmdir()
    cases = ["home"] + (["account"] if world.ident.name != "root" else [])
    for name in cases:
        assert "ACCOUNT-KEY" not in str(out[name]) and key.name not in str(out[name]), out


def test_the_agent_refuses_to_start_when_a_mount_is_not_what_was_pinned(tmp_path: Path) -> None:
    """PIN_CHECK, the first code the sandbox runs: a pinned path showing another
    object (or none) ends it with status 125, naming the path; the right one passes."""
    import subprocess
    import sys

    from sandhold.backends.linux.launcher import AgentBoot, agent_argv
    from sandhold.policy.specplan import Pin

    st = os.lstat(tmp_path)
    boot = AgentBoot(sys.executable, str(tmp_path / "sandhold"), sys.prefix, b"")
    good = Pin(str(tmp_path), st.st_dev, st.st_ino)
    for pins, status in (
        ([good, Pin("/etc", st.st_dev, st.st_ino)], 125),
        ([Pin(f"{tmp_path}/gone", 1, 2)], 125),
        ([good], 1),  # passed the check; then no agent package here
    ):
        argv = agent_argv(boot, 9, -1, (), pins)
        r = subprocess.run(argv, capture_output=True, timeout=30, check=False)
        assert r.returncode == status, (pins, r.returncode, r.stderr)
        if status == 125:
            assert f"sandhold: {pins[-1].path} is not what the plan bound".encode() in r.stderr


def test_hiding_mounts_are_checked_where_they_land(tmp_path: Path) -> None:
    """The launcher's checks cover every pin and every cover-file or 0000 cover-dir
    mount (a hidden path swapped for a symlink would take the cover elsewhere)."""
    from sandhold._record import replace
    from sandhold.backends.linux.launcher import _landed
    from sandhold.policy.fsplan import Mount
    from sandhold.policy.specplan import Pin

    (tmp_path / "hidden").write_text("")
    (tmp_path / "hidden-dir").mkdir()

    class Session:
        hidden_file = str(tmp_path / "hidden")
        hidden_dir = str(tmp_path / "hidden-dir")

    mounts = (
        Mount("ro-bind", "/w", "bind"),
        Mount("hide-dir", "/w/.ssh", "secret"),
        Mount("hide-dir", "/w/.aws", "secret, with a hole", "0111"),
        Mount("hide-file", "/w/.netrc", "secret"),
    )
    plan = splan()
    fs = replace(plan.fs, mounts=mounts)
    plan = replace(plan, fs=fs, pins=(Pin("/w", 1, 2),))
    got = {p.path: (p.dev, p.ino) for p in _landed(plan, Session())}  # type: ignore[arg-type]
    hd, hf = os.lstat(Session.hidden_dir), os.lstat(Session.hidden_file)
    assert got == {
        "/w": (1, 2),
        "/w/.ssh": (hd.st_dev, hd.st_ino),
        "/w/.netrc": (hf.st_dev, hf.st_ino),
    }


def test_a_link_swapped_in_and_out_between_two_walks_is_refused() -> None:
    """realpath went through a link that a second walk no longer finds (the other
    links it finds, /var/run, are the system's): the plan cannot tell what it bound."""

    class Swapping(FakeHost):
        def realpath(self, path: str) -> str:
            if path == "/var/run/state":  # as if run/state was a link to /data/real then
                return "/data/real"
            return super().realpath(path)

    host = Swapping({**BASE_HOST, **PLANTED})
    spec = SandboxSpec("s1", "w1", bind_mounts=(SandboxBindMount("/var/run/state"),))
    with pytest.raises(SpecError) as err:
        plan_spec(spec, SpecHost(HOME, TMP, PRIV, (PKG,)), host)
    assert "changed while the plan was made" in err.value.reason, err.value.reason
    assert "/data/real, then to /run/state" in err.value.reason
