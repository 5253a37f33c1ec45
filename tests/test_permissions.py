"""No loosening of permissions the host relies on (issue 16).

``chmod 0777 .git`` inside a sandbox landed on the host; another local user then
replaced ``.git/config``, and root's next ``git status`` ran their command. The rule
(``policy.syscalls``): no ``chmod``, ``fchmod``, ``fchmodat`` or ``fchmodat2`` may add
group or world write or a set-id bit, on any path (a filter sees the mode, not the
path), and no extended attribute is set or removed (a POSIX ACL, a file
capability). Tried on a repository's ``.git``, its config, the writable root and a
plain file, by path, on an fd, through ``/proc/self/fd`` and as an ACL, as root and
unprivileged; the modes are read on the host afterwards.
"""

from __future__ import annotations

import os
import stat

import pytest

from conftest import World

pytestmark = pytest.mark.sandbox

ACL = (
    "b'\\\\x02\\\\0\\\\0\\\\0\\\\x01\\\\0\\\\x07\\\\0\\\\xff\\\\xff\\\\xff\\\\xff'"  # one ACL entry
)


def test_no_chmod_loosens_what_the_host_relies_on(world: World) -> None:
    proj = world.mkdir("work/proj")
    r = world.ident.run(["git", "init", "-q", "."], cwd=proj, env=world.env())
    assert r.returncode == 0, r.stderr
    world.mkfile("work/proj/a.txt", "a\n")
    before = {
        p: stat.S_IMODE(os.stat(proj / p).st_mode) for p in (".git", ".git/config", ".", "a.txt")
    }
    py = "python3 -c"
    attempts = {
        "dotgit": "chmod 0777 .git",
        "config": "chmod o+w .git/config",
        "root": "chmod g+w .",
        "setgid_dir": "chmod g+s .git",
        "plain": "chmod 0666 a.txt",
        "fchmod": f"{py} 'import os; os.fchmod(os.open(\".git\", os.O_RDONLY), 0o777)'",
        "procfd": f'{py} \'import os; fd = os.open(".git", os.O_RDONLY); '
        'os.chmod("/proc/self/fd/%d" % fd, 0o777)\'',
        "acl": f'{py} \'import os; os.setxattr(".git", "system.posix_acl_access", {ACL})\'',
        "acl_default": f'{py} \'import os; os.setxattr(".git", "system.posix_acl_default", '
        f"{ACL})'",
        "ok": "chmod 0700 a.txt && chmod 0644 a.txt && chmod +x a.txt && chmod -x a.txt",
    }
    script = "; ".join(f"({cmd}) 2>/dev/null; echo {n}=$?" for n, cmd in attempts.items())
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, cwd=proj)
    got = dict(line.split("=") for line in r.stdout.split())
    assert got.pop("ok") == "0", (r.stdout, r.stderr)
    assert set(got) == set(attempts) - {"ok"} and "0" not in got.values(), got
    after = {p: stat.S_IMODE(os.stat(proj / p).st_mode) for p in before}
    assert after == before
    assert not os.listxattr(proj / ".git")


def test_no_chown_gives_a_file_to_another_user(world: World) -> None:
    """No ownership change lands either: the sandbox's root has no capabilities and only
    uid 0 mapped in its user namespace, so the kernel refuses another uid (as it does
    to an unprivileged user): checked here so a change to that set-up shows."""
    proj = world.mkdir("work/proj")
    r = world.ident.run(["git", "init", "-q", "."], cwd=proj, env=world.env())
    assert r.returncode == 0, r.stderr
    world.mkfile("work/proj/a.txt", "a\n")
    other = 4242 if world.ident.uid == 0 else 0
    before = {p: os.lstat(proj / p).st_uid for p in (".git", ".git/config", ".", "a.txt")}
    py = "python3 -c"
    attempts = {
        "dotgit": f"chown {other} .git",
        "config": f"chown -h {other} .git/config",
        "fchown": f"{py} 'import os; os.fchown(os.open(\".git\", os.O_RDONLY), {other}, -1)'",
        "fchownat": f"{py} 'import os; os.chown(\"a.txt\", {other}, -1, follow_symlinks=False)'",
        "ok": f"{py} 'import os; os.chown(\"a.txt\", -1, -1)'",
    }
    script = "; ".join(f"({cmd}) 2>/dev/null; echo {n}=$?" for n, cmd in attempts.items())
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, cwd=proj)
    got = dict(line.split("=") for line in r.stdout.split())
    assert got.pop("ok") == "0", (r.stdout, r.stderr)
    assert set(got) == set(attempts) - {"ok"} and "0" not in got.values(), got
    assert {p: os.lstat(proj / p).st_uid for p in before} == before
