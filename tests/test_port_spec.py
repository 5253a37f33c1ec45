"""What a spec-launched sandbox sees and may write, checked inside real sandboxes (SPEC §4).

The plan itself is table-tested in test_spec_plan.py; these run the commands.
As root and as an unprivileged user.
"""

from __future__ import annotations

from pathlib import Path

from conftest import World
from portdriver import drive

PROBE = r"""
probe() {  # probe PATH: prints "absent", "hidden", "ro" or "rw"
  if [ ! -e "$1" ]; then echo absent
  elif [ -d "$1" ] && ! ls "$1" >/dev/null 2>&1; then echo hidden
  elif [ -f "$1" ] && ! cat "$1" >/dev/null 2>&1; then echo hidden
  elif [ -d "$1" ]; then (touch "$1/.w" 2>/dev/null && rm -f "$1/.w" && echo rw) || echo ro
  else (: >> "$1") 2>/dev/null && echo rw || echo ro
  fi
}
"""


def test_what_the_sandbox_sees(world: World) -> None:
    world.mkfile("home/.ssh/id_ed25519", "PRIVATE")
    world.mkfile("home/notes.txt", "mine")
    world.mkfile("work/proj/src/main.py", "print()")
    world.mkfile("work/proj/.env", "TOKEN=1")
    world.mkdir("work/proj/.git/hooks")
    world.mkfile("work/proj/.git/config", "[core]")
    world.mkfile("work/ref/doc.txt", "ref")
    world.mkfile("work/state/log", "")
    world.mkfile("work/other/secret.txt", "not bound")
    out = drive(
        world,
        f"""
        async def main(port):
            proj, ref, state = f"{{WORK}}/proj", f"{{WORK}}/ref", f"{{WORK}}/state"
            binds = (SandboxBindMount(proj), SandboxBindMount(ref, read_only=True))
            probe = {PROBE!r}
            paths = {{
                "home": HOME, "home_notes": f"{{HOME}}/notes.txt", "other": f"{{WORK}}/other",
                "src": f"{{proj}}/src", "main": f"{{proj}}/src/main.py", "env": f"{{proj}}/.env",
                "hooks": f"{{proj}}/.git/hooks", "gitconfig": f"{{proj}}/.git/config",
                "ref": ref, "state": state, "tmp": "/tmp", "usr": "/usr/bin", "etc": "/etc",
                "shadow": "/etc/shadow", "root": "/root",
                "var_tmp_pkg": os.environ["PYTHONPATH"] + "/sandhold",
            }}
            script = probe + "".join(f'echo "{{k}}=$(probe {{v}})";' for k, v in paths.items())
            results = {{}}
            for mode in ("chat", "review"):
                s = spec(f"s-{{mode}}", bind_mounts=binds, mode=mode,
                         protected_paths=(f"{{proj}}/src",), runner_state_dirs=(state,),
                         guest_workdir=proj)
                h = await port.launch(s)
                r = await port.run(h, script)
                results[mode] = dict(line.split("=", 1) for line in r.stdout.decode().split())
                r = await port.run(h, "pwd; ls /; cat /etc/shadow; stat -c %s /etc/shadow")
                results[mode + "_misc"] = r.stdout.decode().split()
                await port.destroy(h)
            OUT.update(results)
            from sandhold.backends.linux.launcher import agent_boot
            OUT["agent_tops"] = sorted({{p.split("/")[1] for p in agent_boot().paths}})
        """,
    )
    chat, review = out["chat"], out["review"]
    assert isinstance(chat, dict) and isinstance(review, dict)
    for mode in (chat, review):
        assert mode["home"] == "absent" and mode["home_notes"] == "absent"  # home invisible
        assert mode["other"] == "absent"  # unbound siblings too
        assert mode["src"] == "ro" and mode["main"] == "ro"  # protected in every mode
        assert mode["ref"] == "ro"  # read_only bind
        assert mode["state"] == "rw"  # runner state dir: writable in every mode
        assert mode["hooks"] == "ro" and mode["gitconfig"] == "ro" and mode["env"] == "ro"
        assert mode["tmp"] == "rw" and mode["usr"] == "ro" and mode["etc"] == "ro"
        assert mode["shadow"] == "hidden" and mode["root"] == "absent"
        assert mode["var_tmp_pkg"] == "ro"  # the agent's package: visible, read-only
    misc = out["chat_misc"]
    assert isinstance(misc, list)
    assert misc[0] == f"{world.work}/proj"
    top = set(misc[1:-1])
    # Beyond the system dirs and the binds, only the agent's own files (the package and
    # the interpreter, wherever the checkout and venv live) may add a top-level name.
    agent_tops = out["agent_tops"]
    assert isinstance(agent_tops, list)
    assert top - set(agent_tops) <= {
        "bin",
        "dev",
        "etc",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "proc",
        "sbin",
        "tmp",
        "usr",
        "var",
        "work",
        "root",
    }
    assert misc[-1] == "0"  # /etc/shadow is the empty cover file


def test_a_bind_inside_a_secret_location_shows_only_itself(world: World) -> None:
    """Binding ~/.ssh/known_hosts (or a runner state dir in ~/.aws) next to the home
    directory leaves the rest of the secret location hidden, explained as such."""
    world.mkfile("home/.ssh/id_ed25519", "PRIVATE-KEY")
    world.mkfile("home/.ssh/known_hosts", "github.com ssh-ed25519 AAAA")
    world.mkfile("home/.aws/credentials", "AWS-SECRET")
    world.mkfile("home/.aws/runner/state", "s")
    out = drive(
        world,
        """
        async def main(port):
            ssh, aws = f"{HOME}/.ssh", f"{HOME}/.aws"
            binds = (SandboxBindMount(HOME), SandboxBindMount(f"{ssh}/known_hosts", read_only=True))
            for mode in ("review", "chat"):
                s = spec(mode, bind_mounts=binds, mode=mode, runner_state_dirs=(f"{aws}/runner",))
                OUT[mode + "_explain"] = port.explain(s)
                h = await port.launch(s)
                r = await port.run(
                    h,
                    f"cat {ssh}/id_ed25519; ls -a {ssh}; cat {ssh}/known_hosts; "
                    f"cat {aws}/credentials; ls -a {aws}; "
                    f"echo new > {aws}/runner/new && echo wrote; "
                    f"echo x > {ssh}/known_hosts || echo ro",
                )
                OUT[mode] = [r.stdout.decode(), r.stderr.decode()]
                await port.destroy(h)
        """,
    )
    for mode in ("review", "chat"):
        stdout, stderr = out[mode]  # type: ignore[misc]
        assert "PRIVATE-KEY" not in stdout and "AWS-SECRET" not in stdout, stdout
        assert "id_ed25519" not in stdout and "credentials" not in stdout, stdout
        assert "github.com ssh-ed25519" in stdout, (stdout, stderr)
        assert "wrote" in stdout and stdout.rstrip().endswith("ro"), (stdout, stderr)
        explain = " ".join(str(out[mode + "_explain"]).split())
        assert f"hide-dir 0111 {world.home}/.ssh <- spec: secret location ~/.ssh" in explain
        assert f"hide-dir 0111 {world.home}/.aws <- spec: secret location ~/.aws" in explain
        assert f"{world.home}/.ssh/known_hosts <- bind_mounts[1] (read_only)" in explain
    assert (world.home / ".aws/runner/new").read_text() == "new\n"


def test_chat_writes_review_does_not(world: World) -> None:
    world.mkfile("work/proj/file.txt", "v1")
    out = drive(
        world,
        """
        async def main(port):
            proj = f"{WORK}/proj"
            for mode in ("chat", "review", "plan", "orchestrate"):
                h = await port.launch(spec(mode, bind_mounts=(SandboxBindMount(proj),), mode=mode))
                r = await port.run(h, "echo v2 > file.txt && echo wrote; touch new && echo made")
                erofs = "Read-only file system" in r.stderr.decode()
                OUT[mode] = (r.stdout.decode().split(), erofs)
                await port.destroy(h)
            OUT["content"] = open(f"{proj}/file.txt").read().strip()
        """,
    )
    assert out["chat"] == [["wrote", "made"], False]
    for mode in ("review", "plan", "orchestrate"):
        assert out[mode] == [[], True], mode
    assert out["content"] == "v2"


def test_isolation_basics(world: World) -> None:
    world.mkfile("work/marker", "x")
    out = drive(
        world,
        """
        async def main(port):
            open("/tmp/host-only-" + os.environ["USER"], "w").close()
            h = await port.launch(spec())
            async def sh(cmd):
                r = await port.run(h, cmd)
                return r.stdout.decode().strip(), r.exit_code
            OUT["tmp_private"] = await sh('ls /tmp | grep -c host-only || true')
            OUT["uid"] = await sh("id -u")
            # transparent egress takes every connection in the sandbox's namespace and
            # decides it: an address no rule allows gets a 403 or a reset, never the host
            OUT["net"] = await sh(
                "python3 -c \\"import socket\\ntry:\\n"
                " c = socket.create_connection(('1.1.1.1', 80), 2)\\n"
                " c.sendall(b'GET / HTTP/1.0\\\\r\\\\nHost: 1.1.1.1\\\\r\\\\n\\\\r\\\\n')\\n"
                " d = c.recv(100)\\n"
                " print('closed' if not d or b' 403 ' in d else 'open')\\n"
                "except OSError as e: print('closed', e.errno)\\" "
            )
            OUT["loopback"] = await sh(
                "python3 -c \\"import socket; s=socket.socket(); "
                "s.bind(('127.0.0.1', 0)); s.listen(); "
                "c=socket.create_connection(s.getsockname()); print('lo ok')\\""
            )
            OUT["unshare"] = await sh("unshare -U true 2>/dev/null; echo $?")
            OUT["pid1"] = await sh("cat /proc/1/comm /proc/2/comm")
            OUT["ps"] = await sh("ls /proc | grep -c '^[0-9]'")
        """,
    )
    assert out["tmp_private"] == ["0", 0]
    assert out["uid"] == [str(world.ident.uid), 0]
    assert out["net"][0].startswith("closed")  # type: ignore[index]
    assert out["loopback"] == ["lo ok", 0]
    assert out["unshare"][0] != "0"  # type: ignore[index]
    assert str(out["pid1"][0]).startswith("bwrap\npython")  # type: ignore[index]
    # init, agent, its compiled front (the creation-time supervisor's), the exec's
    # reaper, sh, ls, grep, and at times a short-lived helper of the supervisor's: a
    # handful, never the host's hundreds
    assert int(out["ps"][0]) <= 8  # type: ignore[index]


def test_explain_plans_without_launching(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            text = port.explain(spec(mode="review", protected_paths=(f"{WORK}/x",)))
            OUT["text"] = text
            OUT["handles"] = len(port.handles())
        """,
    )
    text = " ".join(str(out["text"]).split())
    assert out["handles"] == 0
    assert f"ro-bind {world.work} <- bind_mounts[0] (read-only in mode review)" in text
    assert "hide-file /etc/shadow" in text and "tmpfs 1777 /tmp" in text
    assert "remount-ro / <- spec base: the root skeleton is read-only" in text


def test_specs_the_sandbox_cannot_use_are_refused_before_anything_starts(world: World) -> None:
    """The host's /proc (every host process's command line), /sys and /dev, or a
    symlink to them; a glob; a file as the working directory; an id with a NUL:
    each a SpecError naming the field, and no sandbox is started."""
    world.mkfile("work/proj/probe.py", "print()")
    out = drive(
        world,
        """
        async def main(port):
            os.symlink("/proc", f"{WORK}/host-proc")
            proj = f"{WORK}/proj"
            cases = {
                "proc": dict(bind_mounts=(SandboxBindMount("/proc", read_only=True),)),
                "proc_link": dict(bind_mounts=(SandboxBindMount(f"{WORK}/host-proc"),)),
                "dev": dict(bind_mounts=(SandboxBindMount(proj), SandboxBindMount("/dev"))),
                "sys": dict(runner_state_dirs=("/sys",)),
                "glob": dict(bind_mounts=(SandboxBindMount(f"{WORK}/pro*"),)),
                "file": dict(bind_mounts=(SandboxBindMount(f"{proj}/probe.py"),)),
            }
            for name, kw in cases.items():
                try:
                    await port.launch(spec(f"s-{name}", **kw))
                    OUT[name] = "launched"
                except SpecError as exc:
                    OUT[name] = [exc.field, exc.reason]
            try:
                await port.launch(spec("bad\\0id"))
            except SpecError as exc:
                OUT["nul_id"] = [exc.field, exc.reason]
            OUT["handles"] = [h.state.value for h in port.handles()]
            binds = (SandboxBindMount(proj), SandboxBindMount(f"{proj}/probe.py"))
            h = await port.launch(spec("ok", bind_mounts=binds))
            OUT["file_bind"] = (await port.run(h, "cat probe.py")).stdout.decode()
        """,
    )
    assert out["proc"][0] == "bind_mounts[0].host_path" and "/proc" in out["proc"][1]  # type: ignore[index]
    assert out["proc_link"][0] == "bind_mounts[0].host_path"  # type: ignore[index]
    assert "resolves to /proc" in out["proc_link"][1]  # type: ignore[index]
    assert out["dev"][0] == "bind_mounts[1].host_path"  # type: ignore[index]
    assert out["sys"][0] == "runner_state_dirs[0]"  # type: ignore[index]
    assert "glob pattern" in out["glob"][1]  # type: ignore[index]
    assert out["file"][0] == "bind_mounts[0].host_path"  # type: ignore[index]
    assert "not a directory" in out["file"][1]  # type: ignore[index]
    assert out["nul_id"][0] == "session_id"  # type: ignore[index]
    assert out["handles"] == []
    assert out["file_bind"] == "print()"


def test_a_bind_holding_the_hosts_proc_is_refused(world: World) -> None:
    """A chroot with the host's /proc mounted in it (made by root here, bound by the
    harness as each identity) would show every host process through a bind."""
    import os
    import subprocess

    import pytest

    if os.geteuid() != 0:
        pytest.skip("mounting proc for the fixture needs root (CI is root)")
    chroot = world.mkdir("work/chroot/proc")
    subprocess.run(["mount", "-t", "proc", "proc", str(chroot)], check=True)
    try:
        out = drive(
            world,
            """
            async def main(port):
                for path in (WORK, WORK + "/chroot"):
                    try:
                        await port.launch(spec(bind_mounts=(SandboxBindMount(path),)))
                        OUT.setdefault("r", []).append("launched")
                    except SpecError as exc:
                        OUT.setdefault("r", []).append(str(exc))
            """,
        )
    finally:
        subprocess.run(["umount", "-l", str(chroot)], check=True)
    assert len(out["r"]) == 2
    assert all("holds a mount of the host's proc" in r for r in out["r"]), out["r"]


def test_kernel_mounts_reads_mountinfo(tmp_path: Path) -> None:
    from sandhold.backends.linux.hostfs import kernel_mounts

    table = tmp_path / "mountinfo"
    table.write_text(
        "22 1 0:21 / /proc rw,nosuid shared:5 - proc proc rw\n"
        "23 1 0:22 / /srv/my\\040chroot/proc rw - proc proc rw\n"
        "24 1 8:1 / /home rw shared:1 master:2 - ext4 /dev/sda1 rw\n"
        "25 1 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
        "not a mountinfo line\n"
    )
    assert kernel_mounts(str(table)) == (
        ("/proc", "proc"),
        ("/srv/my chroot/proc", "proc"),
        ("/sys/fs/cgroup", "cgroup2"),
    )
