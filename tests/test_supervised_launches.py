"""The creation-time supervisor in real launches: the CLI and SandboxPort (F-BE-5).

As root and as an unprivileged user: names refused as they are made, in every way
of making them; refusals reported (``--violations``/``--debug`` for the CLI,
``violation`` events attributed to their exec for the port); the Landlock domain
around every supervised command; nothing left in the user's tree.
The races and each call's emulation are tested in test_supervisor_*.py.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

import sandhold
from conftest import World
from portdriver import assert_out_of_reach, drive
from sandhold.backends.linux.supervisor.landlock import landlock_abi
from sandhold.policy.refusal import CREDENTIAL, MANDATORY

MAKE_ALL = (
    "echo x > .env; "  # openat(O_CREAT)
    "echo y > ok.txt; mv ok.txt server.pem; "  # rename onto a credential name
    "ln ok2.txt .bashrc 2>/dev/null || (echo z > ok2.txt; ln ok2.txt .bashrc); "  # link
    "ln -s /etc/passwd id_rsa; "  # symlink
    "mkdir -p a/b/c && mkdir a/b/c/.claude; "  # mkdir of a protected directory name
    "mkdir repo && git init -q repo 2>/dev/null; "  # a repository made during the run
    "echo hook > repo/.git/hooks/pre-commit; "
    "ls -A; true"
)
DENIED = (".env", "server.pem", ".bashrc", "id_rsa", "a/b/c/.claude", "repo/.git/hooks/pre-commit")


def test_cli_refuses_every_way_of_making_a_denied_name_and_reports_it(world: World) -> None:
    w = world.work
    log = world.root / "decisions.jsonl"
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    r = world.sandhold("-s", str(s), "-d", "--violations", str(log), "--", "sh", "-c", MAKE_ALL)
    assert r.returncode == 0, r.stderr
    for name in DENIED:
        assert not (w / name).exists() and not (w / name).is_symlink(), name
    assert (w / "ok.txt").read_text() == "y\n" and (w / "ok2.txt").exists()
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    made = [e for e in entries if e["action"] == "file-write-create"]
    assert {e["target"] for e in made} >= {f"{w}/{n}" for n in DENIED}
    assert all(e["allowed"] is False and e["rule"] and e["syscall"] for e in made)
    calls = {e["target"].rsplit("/", 1)[1]: e["syscall"] for e in made}
    assert calls["server.pem"].startswith("rename") and calls["id_rsa"].startswith("symlink")
    # each line names its rule's kind (policy.refusal), which code reads, not the words
    kinds = {e["target"].rsplit("/", 1)[1]: e["kind"] for e in made}
    assert kinds[".env"] == kinds["server.pem"] == kinds["id_rsa"] == CREDENTIAL
    assert kinds[".bashrc"] == kinds[".claude"] == kinds["pre-commit"] == MANDATORY
    assert calls[".bashrc"].startswith("link") and calls[".claude"].startswith("mkdir")
    assert "refused" in r.stderr and "file creation(s)" in r.stderr


def test_a_refusal_is_named_on_stderr_without_debug(world: World) -> None:
    """The command often says only "Permission denied" (or nothing: venv's ensurepip):
    one line says what was refused and by which rule."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    r = world.sandhold("-s", str(s), "--", "sh", "-c", "echo k > a.pem; echo k > .env; true")
    assert r.returncode == 0
    lines = [x for x in r.stderr.splitlines() if x.startswith("sandhold:")]
    assert lines == [
        "sandhold: refused a.pem (and 1 more): credential: *.pem (to allow it: "
        '"filesystem": {"allowCredentialWrite": ["./a.pem"]}) (-d lists every refusal)'
    ], r.stderr
    r = world.sandhold("-s", str(s), "--", "sh", "-c", "echo fine > ok.txt")
    assert r.returncode == 0 and r.stderr == ""


GIT_ENV = (
    "export HOME=$TMPDIR GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@example.invalid "
    "GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@example.invalid; "
)


def test_cli_git_init_commit_and_clone_work_but_hooks_stay_inert(world: World) -> None:
    """A repository made during the run gets git's own config and *.sample templates;
    no hook git would run can be made, in it or in a repository that existed before."""
    w = world.work
    world.mkdir("work/old/.git")  # an existing repository without a hooks directory
    world.mkfile("work/old/.git/HEAD", "ref: refs/heads/main\n")
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    script = GIT_ENV + (
        "git init -q new && cd new && echo a > a && git add a && git commit -qm first && "
        "git config core.editor true && cd .. && git clone -q new copy && echo git-ok; "
        "echo evil > new/.git/hooks/pre-commit; "
        "mv new/.git/hooks/pre-commit.sample new/.git/hooks/pre-commit; "
        "ln -s /bin/true copy/.git/hooks/post-checkout; "
        "mkdir old/.git/hooks; echo > old/.git/config; true"
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script)
    assert r.stdout == "git-ok\n", r.stderr
    assert (w / "copy/a").read_text() == "a\n"
    assert "editor = true" in (w / "new/.git/config").read_text()
    hooks = sorted(p.name for p in (w / "new/.git/hooks").iterdir())
    assert hooks and all(h.endswith(".sample") for h in hooks)
    assert all(p.name.endswith(".sample") for p in (w / "copy/.git/hooks").iterdir())
    assert not (w / "old/.git/hooks").exists() and not (w / "old/.git/config").exists()
    assert r.stderr.count("Permission denied") == 5, r.stderr


def test_cli_command_runs_under_landlock_as_well(world: World) -> None:
    """Defence in depth: even where the mounts would let it, nothing is written outside
    the writable roots, TMPDIR and the usual devices (bwrap's /dev is a writable tmpfs)."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    script = (
        "touch /dev/made 2>/dev/null && echo dev-made || echo dev-refused; "
        "echo > /dev/null && echo null-ok; mkdir /dev/shm/d && echo shm-ok; "
        'echo > "$TMPDIR/t" && echo tmp-ok; echo > f && echo root-ok'
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script)
    assert r.stdout.split() == ["dev-refused", "null-ok", "shm-ok", "tmp-ok", "root-ok"], r.stderr


def test_cli_without_writable_roots_needs_no_supervisor(world: World) -> None:
    r = world.sandhold("--", "sh", "-c", "cat /proc/self/status | grep Seccomp_filters")
    assert r.returncode == 0 and r.stdout.split() == ["Seccomp_filters:", "1"]  # bwrap's only
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    r = world.sandhold("-s", str(s), "--", "sh", "-c", "grep Seccomp_filters /proc/self/status")
    assert r.stdout.split() == ["Seccomp_filters:", "2"]  # and the notifying one


def test_the_violations_file_is_the_one_named_at_launch(world: World) -> None:
    """The sandbox tries to swap --violations FILE (in a writable root) for a symlink to
    a file a shell later runs: the file stays in place, and gets the refusals."""
    target = world.mkfile("home/.bashrc_demo", "# mine\n")
    v = world.mkfile("work/v.jsonl", "")
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    swap = f"rm -f v.jsonl; ln -sf {target} v.jsonl; touch x.pem; true"
    r = world.sandhold("-s", str(s), "--violations", str(v), "--", "sh", "-c", swap)
    assert r.returncode == 0, r.stderr
    assert target.read_text() == "# mine\n"
    assert not v.is_symlink()
    assert [json.loads(line)["target"] for line in v.read_text().splitlines()] == [
        str(v),  # the symlink, refused: sandhold's own file
        str(world.work / "x.pem"),
    ]


def test_cli_status_signals_and_stdio_pass_through_the_runner(world: World) -> None:
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    r = world.sandhold("-s", str(s), "--", "sh", "-c", "cat; exit 7", input="piped\n")
    assert (r.returncode, r.stdout) == (7, "piped\n")
    r = world.sandhold("-s", str(s), "--", "sh", "-c", "kill -TERM $$")
    assert r.returncode == 128 + 15
    r = world.sandhold("-s", str(s), "--", "no-such-command-here")
    assert r.returncode == 127 and "no-such-command-here" in r.stderr


def test_port_violations_are_events_of_the_exec_that_made_them(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            quiet = await port.exec(h, ["sh", "-c", f"sleep 0.3; echo fine > {WORK}/fine.txt"])
            a = await port.exec(h, ["sh", "-c", f"cd {WORK} && sh -c 'echo > .env'; true"])
            b = await port.exec(h, ["sh", "-c", f"cd {WORK} && mkdir d && mv d .vscode; true"])
            results = {}
            for name, ex in (("quiet", quiet), ("a", a), ("b", b)):
                evs = [e async for e in ex]
                results[name] = [
                    [e.exec_id == ex.exec_id, e.violation.action, e.violation.target,
                     e.violation.rule]
                    for e in evs if e.type == "violation"
                ]
            OUT.update(results)
            r = await port.run(h, f"touch /dev/made 2>&1; ls -A {WORK}")
            OUT["after"] = r.stdout.decode()
            OUT["confinement"] = h.detail("confinement")
            await port.destroy(h)
        """,
    )
    w = world.work
    assert out["quiet"] == []
    cred = f'credential: .env (to allow it: "filesystem": {{"allowCredentialWrite": ["{w}/.env"]}})'
    assert out["a"] == [[True, "file-write-create", f"{w}/.env", cred]]
    vscode = "mandatory: .vscode (agent/editor configuration)"
    assert out["b"] == [[True, "file-write-create", f"{w}/.vscode", vscode]]
    after = str(out["after"])
    assert "Permission denied" in after  # Landlock: /dev is not a place to write
    assert ".env" not in after and ".vscode" not in after and "fine.txt" in after
    assert sorted(p.name for p in w.iterdir()) == ["d", "fine.txt"]
    assert out["confinement"] == "creation-time supervisor, landlock"


def test_port_bind_below_tmp_keeps_every_rule(world: World) -> None:
    """The private /tmp is scratch; a host directory bound below it (mkdtemp, pytest's
    tmp_path) is the user's tree: its names are refused like anywhere else."""
    import shutil
    import tempfile

    proj = Path(tempfile.mkdtemp(prefix="sandhold-bind-", dir="/tmp"))
    try:
        os.chmod(proj, 0o755)
        world.ident.chown(proj)
        out = drive(
            world,
            f"""
            async def main(port):
                h = await port.launch(spec(bind_mounts=(SandboxBindMount({str(proj)!r}),)))
                ex = await port.exec(h, ["sh", "-c", "cd {proj} && (echo > .env; "
                                         "echo > k.pem; mkdir .claude; echo > /tmp/.env; "
                                         "echo > ok.txt) 2>/dev/null; true"])
                OUT["refused"] = sorted(e.violation.target for e in [e async for e in ex]
                                        if e.type == "violation")
                await port.destroy(h)
            """,
        )
        assert out["refused"] == [f"{proj}/.claude", f"{proj}/.env", f"{proj}/k.pem"]
        assert sorted(p.name for p in proj.iterdir()) == ["ok.txt"]
    finally:
        shutil.rmtree(proj, ignore_errors=True)


def test_port_agent_is_out_of_reach_of_what_it_runs(world: World) -> None:
    """With the supervisor in the agent, its fds (the listeners) and memory are not for the
    sandbox: it is non-dumpable before its first exec starts."""
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            r = await port.run(h, REAPER_AND_AGENT)
            OUT["r"] = r.stdout.decode()
            await port.destroy(h)
        """,
    )
    assert_out_of_reach(str(out["r"]))


FRONTS = (
    'for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = sandhold-exec ] && '
    "echo front ${p#/proc/} $(awk '/^PPid/ {print $2}' $p/status); done; true"
)


def test_port_compiled_front_serves_execs_and_fails_closed_when_killed(world: World) -> None:
    """The agent starts the compiled front beside its supervisor thread: one process,
    the agent's child, out of the sandbox's reach (its fds, its memory, and with
    Landlock scopes its signals). Killed (from the host here), the execs it served
    can make no name; later execs are served by the thread alone."""
    out = drive(
        world,
        f"""
        async def main(port):
            h = await port.launch(spec())
            r = await port.run(h, f"cd {{WORK}} && mkdir -p a/b && echo x > a/b/f && "
                                  "echo agent $(cut -d' ' -f4 /proc/$PPID/stat); " + {FRONTS!r})
            OUT["first"] = r.stdout.decode()
            front = [l.split()[1] for l in OUT["first"].splitlines() if l.startswith("front")]
            front_pid = find(h, "sandhold-exec --serve")
            # one exec: tries to reach the front, then waits while the host kills it
            run = asyncio.create_task(port.run(h,
                f"readlink -v /proc/{{front[0]}}/fd/0 2>&1; "
                f"head -c1 /proc/{{front[0]}}/mem 2>&1 | head -1; "
                f"kill -9 {{front[0]}} 2>&1; echo kill $?; cd {{WORK}}; : > reached; "
                "while [ ! -e killed ]; do sleep 0.02; done; sleep 0.2; "
                "echo y > g; echo status $?"))
            while not os.path.exists(os.path.join(WORK, "reached")):
                await asyncio.sleep(0.02)
            try:
                os.kill(front_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # the exec killed it (no Landlock scopes here)
            open(os.path.join(WORK, "killed"), "w").close()
            r = await run
            OUT["kill"] = r.stdout.decode() + r.stderr.decode()
            ex = await port.exec(h, ["sh", "-c", f"cd {{WORK}} && echo z > h; echo > .env; "
                                                 + {FRONTS!r}])
            events = [e async for e in ex]
            OUT["after"] = b"".join(e.data for e in events if e.type == "stdout").decode()
            OUT["violations"] = [e.violation.target for e in events if e.type == "violation"]
            await port.destroy(h)
        """,
    )
    w = world.work
    lines = str(out["first"]).splitlines()
    agent = lines[0].split()[1]
    fronts = [line.split() for line in lines[1:]]
    assert len(fronts) == 1 and fronts[0][2] == agent, out["first"]  # the agent's child
    assert (w / "a" / "b" / "f").read_text() == "x\n"
    killed = str(out["kill"])
    assert killed.count("Permission denied") == 2, killed  # its fds, its memory
    if landlock_abi() >= 6:  # its signals
        assert "Operation not permitted" in killed and "kill 1" in killed, killed
    assert "status 2" in killed or "Function not implemented" in killed, killed
    assert not (w / "g").exists()  # the exec it served: nothing made without it
    assert "front" not in str(out["after"])  # not restarted: the thread serves
    assert (w / "h").read_text() == "z\n" and not (w / ".env").exists()
    assert out["violations"] == [f"{w}/.env"]


def test_port_fifo_opens_wait_off_the_serving_path(world: World) -> None:
    """A writer waiting at a FIFO holds up nothing else, whether the compiled front opens
    it (an ordinary name) or the supervisor thread does (a name the front passes on,
    with a listener it gets for that one call)."""
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            for where in (".", "r/.git/x"):
                r = await port.run(h, f"cd {WORK} && mkdir -p {where} && mkfifo {where}/p && "
                                      f"(echo hello > {where}/p &) ; sleep 0.3; "
                                      f"wc -c > out < {where}/p; cat out; rm out",
                                   timeout=20)
                OUT[where] = [r.stdout.decode().split(), r.exit_code, r.killed]
            await port.destroy(h)
        """,
    )
    assert out["."] == [["6"], 0, None]
    assert out["r/.git/x"] == [["6"], 0, None]


def test_port_review_mode_still_gets_landlock(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec(mode="review"))
            r = await port.run(h, "touch /dev/made; echo > /tmp/t && echo tmp-ok")
            OUT["r"] = [r.stdout.decode(), r.stderr.decode()]
            await port.destroy(h)
        """,
    )
    stdout, stderr = out["r"]
    assert stdout == "tmp-ok\n" and "Permission denied" in stderr


def test_a_venv_in_the_work_tree_works_without_allow_credential_write(world: World) -> None:
    """pip's CA bundle (certifi's cacert.pem) is a credential-glob name, but inside a
    venv (a recognised environment tree, issue 15) it is a package's file: ``venv``
    works under ``allowWrite: ["."]`` alone; allowCredentialWrite still lifts the
    globs where it says, and only there."""
    base = {"allowWrite": ["."]}
    s = world.settings({"filesystem": base})
    log = world.root / "refused.jsonl"
    r = world.sandhold(
        "-s", str(s), "--violations", str(log), "--", "python3", "-m", "venv", ".venv",
        timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert not any(
        json.loads(line).get("action") == "file-write-create"
        for line in log.read_text().splitlines()
    )
    assert list((world.work / ".venv").rglob("cacert.pem"))
    s = world.settings({"filesystem": {**base, "allowCredentialWrite": ["./env"]}})
    world.mkfile(
        "work/proj/pyproject.toml",
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "tinyproj"\nversion = "1.0"\n',
    )
    world.mkfile("work/proj/tinyproj/__init__.py", "ANSWER = 42\n")
    world.ident.chown(world.work / "proj")
    script = (
        "/usr/bin/python3 -m venv env && "
        "/usr/bin/python3 -m pip wheel -q --no-index --no-build-isolation --no-deps "
        "-w dist ./proj && env/bin/python -m pip install -q --no-index "
        "dist/tinyproj-1.0-py3-none-any.whl && "
        "env/bin/python -c 'import tinyproj; print(\"pip ok\", tinyproj.ANSWER)'; "
        "echo k > server.key"
    )
    env = {**world.env(), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, env=env, timeout=300)
    assert r.stdout.strip() == "pip ok 42", r.stderr
    assert "server.key: Permission denied" in r.stderr  # outside .venv: still refused
    assert list((world.work / "env").rglob("cacert.pem"))


def test_port_glob_protected_paths_hold_for_names_made_later(world: World) -> None:
    """F-BE-5: a spec whose protected paths are globs runs natively and holds them."""
    world.mkfile("work/cfg/old.secret", "v1")
    out = drive(
        world,
        """
        async def main(port):
            s = spec(protected_paths=(f"{WORK}/**/*.secret",))
            h = await port.launch(s)
            ex = await port.exec(h, ["sh", "-c", f"cd {WORK} && mkdir -p a/b && "
                                 "echo x > a/b/new.secret; echo y >> cfg/old.secret; "
                                 "echo z > a/b/fine.txt; true"])
            evs = [e async for e in ex]
            OUT["violations"] = [e.violation.target for e in evs if e.type == "violation"]
            await port.destroy(h)
        """,
    )
    w = world.work
    assert not (w / "a/b/new.secret").exists() and (w / "a/b/fine.txt").exists()
    assert (w / "cfg/old.secret").read_text() == "v1"
    assert out["violations"] == [f"{w}/a/b/new.secret", f"{w}/cfg/old.secret"]


def test_explain_says_what_the_supervisor_refuses(world: World) -> None:
    s = world.settings(
        {
            "filesystem": {"allowWrite": ["."], "denyWrite": ["**/*.lock"]},
            "network": {"allowUnixSockets": ["/run/app.sock"]},
        }
    )
    r = world.sandhold("-s", str(s), "--explain", "--", "true")
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "names refused when they are made (creation-time supervisor" in text
    assert f"in: {world.work}" in text and "**/*.lock and below" in text
    assert "*.pem" in text and "hooks/*.sample" in text
    assert "HEAD, refs, config, config.worktree, hooks, commondir where they would" in text
    assert "unix sockets a connect may reach (network.allowUnixSockets): /run/app.sock" in text
    assert "landlock (where the kernel has it)" in text
    r = world.sandhold("--explain", "--", "true")  # nothing writable: nothing to refuse
    assert "creation-time supervisor" not in r.stdout


PARENT = (
    "cat /proc/$PPID/comm; {make}"
    "cat /proc/$PPID/comm; readlink -v /proc/$PPID/fd/0 2>&1; "
    "head -c1 /proc/$PPID/exe 2>&1 | head -1; "
    # the Python supervisor, if started: a child of the front, as unreachable
    "for p in /proc/[0-9]*; do case $(cat $p/comm 2>/dev/null) in python*) "
    "echo supervisor $(awk '/^PPid/ {{print $2}}' $p/status); readlink -v $p/fd/0 2>&1; "
    "head -c1 $p/exe 2>&1 | head -1; head -c1 $p/mem 2>&1 | head -1;; esac; done; true"
)


def test_cli_compiled_front_hands_over_to_an_unreachable_supervisor(world: World) -> None:
    """With the helper built (scripts/setup), the command's parent is the small C front.
    It performs ordinary creations itself and starts the Python supervisor as its child
    at the first call it does not clear: neither can be read or traced by the command,
    not even the interpreter file itself."""
    helper = Path(sandhold.__file__).parent / "_helper" / "sandhold-exec"
    assert os.access(helper, os.X_OK), "scripts/setup builds it; the suite runs with it"
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    r = world.sandhold(
        "-s", str(s), "--", "sh", "-c", PARENT.format(make="mkdir -p a/b; echo > .env; ")
    )
    lines = r.stdout.splitlines()
    assert lines[:2] == ["sandhold-exec", "sandhold-exec"], r.stdout
    assert "Permission denied" in lines[2] and "Permission denied" in lines[3], r.stdout
    front = r.stdout.count("supervisor ")
    assert front == 1 and lines[4].startswith("supervisor "), r.stdout  # it started once
    assert all("Permission denied" in line for line in lines[5:8]), r.stdout
    assert len(lines) == 8, r.stdout
    assert "cannot create .env: Permission denied" in r.stderr
    assert (world.work / "a" / "b").is_dir() and not (world.work / ".env").exists()
    r = world.sandhold("-s", str(s), "--", "sh", "-c", PARENT.format(make="mkdir -p c/d; "))
    assert r.stdout.splitlines()[:2] == ["sandhold-exec", "sandhold-exec"]
    assert "supervisor" not in r.stdout  # ordinary calls only: no Python at all
    assert (world.work / "c" / "d").is_dir()


def test_cli_python_runner_when_the_helper_is_off(world: World) -> None:
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    log = world.root / "refused.jsonl"
    env = {**world.env(), "SANDHOLD_EXEC_HELPER": "0"}
    script = PARENT.format(make="echo > .env; mkdir -p a && echo > a/x.pem; ")
    r = world.sandhold("-s", str(s), "--violations", str(log), "--", "sh", "-c", script, env=env)
    lines = r.stdout.splitlines()
    assert lines[0].startswith("python") and lines[1].startswith("python"), r.stdout
    assert "Permission denied" in lines[2], r.stdout
    targets = [json.loads(line)["target"] for line in log.read_text().splitlines()]
    assert targets == [f"{world.work}/.env", f"{world.work}/a/x.pem"]
    r = world.sandhold("-s", str(s), "--", "sh", "-c", "exit 9", env=env)
    assert r.returncode == 9


@pytest.mark.parametrize("helper", ["1", "0"])
def test_cli_supervised_command_inherits_only_stdio(world: World, helper: str) -> None:
    """The supervisor's setup, report and listener fds never reach the command."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    env = {**world.env(), "SANDHOLD_EXEC_HELPER": helper}
    r = world.sandhold("-s", str(s), "--", "ls", "/proc/self/fd", env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == ["0", "1", "2", "3"]  # 3: ls's own directory


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a noexec tmpfs needs root (CI is root)")
def test_exec_helper_falls_back_where_its_interpreter_cannot_run(tmp_path: Path) -> None:
    """A noexec private directory must not leave the supervisor unable to start mid-run:
    the execute-only interpreter is tried once when it is made, else the Python runner."""
    import subprocess

    from sandhold.backends.linux.native import exec_helper

    base = tmp_path / "noexec"
    base.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec", "tmpfs", str(base)], check=True)
    try:
        assert exec_helper(str(base)) is None
        assert list((base / "bin").iterdir()) == []  # nothing half-made left behind
    finally:
        subprocess.run(["umount", str(base)], check=True)
    helper = exec_helper(str(tmp_path))
    assert helper is not None and os.stat(helper.python).st_mode & 0o777 == 0o111
    assert exec_helper(str(tmp_path)) == helper  # made once, then reused


def test_the_session_sweep_keeps_the_execute_only_interpreters(tmp_path: Path) -> None:
    """A new session sweeps dead sessions' directories, never the shared bin/ beside them
    (a concurrent launch may be about to run the supervisor from it)."""
    from sandhold.backends.linux import session as sessions

    base = tmp_path / "sandhold-base"
    base.mkdir(mode=0o700)
    (base / "bin").mkdir()
    (base / "bin" / "python3.11-x").write_bytes(b"ELF")
    dead = base / "1-0badf00d"  # a dead owner's session, older than the grace period
    (dead / "tmp").mkdir(parents=True)
    (dead / "owner").write_text("1 0\n")
    for p in (base / "bin", dead):
        os.utime(p, (1, 1))
    sessions._sweep(str(base))
    assert (base / "bin" / "python3.11-x").exists()
    assert not dead.exists()


def test_allow_credential_write_is_not_reached_through_a_symlink(world: World) -> None:
    """The exemption is for the real place: a symlink under an exempt name that leads
    elsewhere in the work tree does not carry the exemption there, nor does `..`."""
    world.mkdir("work/keys")
    world.ident.chown(world.work / "keys")
    (world.work / "env").symlink_to(world.work / "keys")
    world.mkdir("work/real-env")
    world.ident.chown(world.work / "real-env")
    s = world.settings(
        {"filesystem": {"allowWrite": ["."], "allowCredentialWrite": ["./env", "./real-env"]}}
    )
    script = (
        "echo k > env/server.key; echo k > real-env/../keys/other.key; "
        "echo k > real-env/ok.key && echo exempt-ok"
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script)
    assert r.stdout.strip() == "exempt-ok", r.stderr
    assert r.stderr.count("Permission denied") == 2, r.stderr
    assert not (world.work / "keys/server.key").exists()
    assert not (world.work / "keys/other.key").exists()


NO_LANDLOCK = """\
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
ENOSYS = 0x50000 | 38  # SECCOMP_RET_ERRNO | ENOSYS
insns = [(0x20, 0, 0, 0)]  # landlock_create_ruleset, _add_rule, _restrict_self: 444-446
for nr in (444, 445, 446):
    insns += [(0x15, 0, 1, nr), (0x06, 0, 0, ENOSYS)]
insns += [(0x06, 0, 0, 0x7FFF0000)]
buf = ctypes.create_string_buffer(b"".join(struct.pack("<HBBI", *i) for i in insns))
prog = Fprog(len(insns), ctypes.addressof(buf))
assert libc.prctl(38, 1, 0, 0, 0) == 0  # no_new_privs
assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0  # PR_SET_SECCOMP, FILTER
os.execv(sys.argv[1], sys.argv[1:])
"""


@pytest.mark.parametrize("helper", ["1", "0"], ids=["with-front", "python-runner"])
def test_a_kernel_without_landlock_is_said_not_hidden(world: World, helper: str) -> None:
    """Landlock is a second layer: without it the launch goes on, and says so."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    wrapper = world.mkfile("nolandlock.py", NO_LANDLOCK)
    env = {**world.env(), "SANDHOLD_EXEC_HELPER": helper}
    cmd = ["-s", str(s), "--", "sh", "-c", "echo x > ok.txt; echo y > .env || echo refused"]
    r = world.ident.run(
        [world.ident.python, str(wrapper), world.ident.python, "-P", "-m", "sandhold", *cmd],
        cwd=world.work,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "no Landlock on this kernel" in r.stderr
    assert r.stdout.strip() == "refused" and (world.work / "ok.txt").exists()
    assert not (world.work / ".env").exists()
    r = world.sandhold(*cmd, env=env)  # with Landlock: nothing to say
    assert r.returncode == 0 and "Landlock" not in r.stderr, r.stderr


FIFO_WAITER = """\
import os, sys, threading, time
os.chdir(sys.argv[1])
os.mkfifo("p")
threading.Thread(target=lambda: os.open("p", os.O_WRONLY | os.O_CREAT), daemon=True).start()
open("waiting", "w").close()
time.sleep(30)
"""


def test_a_fifo_worker_of_the_port_front_holds_nothing_past_it(world: World) -> None:
    """The front's worker waiting at a FIFO keeps only the pinned FIFO and the listener:
    no copy of the creation lock's open file (the lock would stay held after a killed
    front) nor of the agent's control socket; and it dies with the front. Its fds are
    read from here, as root (it is not dumpable)."""
    script = world.mkfile("work/fifowait.py", FIFO_WAITER)
    pid_file, seen = world.work / "worker.pid", world.work / "inspected"
    result: dict[str, object] = {}

    def run() -> None:
        result.update(
            drive(
                world,
                f"""
            async def main(port):
                h = await port.launch(spec())
                ex = await port.exec(h, ["python3", {str(script)!r}, WORK])
                while not os.path.exists(os.path.join(WORK, "waiting")):
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.2)
                serving = [p for p in sandbox_pids(h) if "sandhold-exec --serve" in cmdline(p)]
                parents = {{p: int(stat_fields(p)[1]) for p in serving}}
                front = [p for p in serving if parents[p] not in serving]
                workers = [p for p in serving if parents[p] in serving]
                OUT["counts"] = (len(front), len(workers))
                with open({str(pid_file)!r} + ".tmp", "w") as f:
                    f.write(str(workers[0]))
                os.rename({str(pid_file)!r} + ".tmp", {str(pid_file)!r})
                while not os.path.exists({str(seen)!r}):
                    await asyncio.sleep(0.02)
                os.kill(front[0], signal.SIGKILL)
                deadline = time.monotonic() + 5
                def alive(w):
                    return os.path.exists(f"/proc/{{w}}") and stat_fields(w)[0] != "Z"
                while any(alive(w) for w in workers) and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                OUT["workers_left"] = [w for w in workers if alive(w)]
                await port.destroy(h)
            """,
            )
        )

    thread = threading.Thread(target=run)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists():
            assert thread.is_alive() and time.monotonic() < deadline, result
            time.sleep(0.02)
        worker = pid_file.read_text()
        fds = sorted(
            os.readlink(f"/proc/{worker}/fd/{fd}")
            for fd in os.listdir(f"/proc/{worker}/fd")
            if int(fd) > 2
        )
    finally:
        seen.touch()
        thread.join(timeout=120)
    assert result["counts"] == [1, 1], result
    assert len(fds) == 2 and str(world.work / "p") in fds, fds  # the pin
    assert any("seccomp" in fd for fd in fds), fds  # the listener
    assert not any("creation.lock" in fd or "socket" in fd for fd in fds), fds
    assert result["workers_left"] == []


READ_ONLY_WRITES = (
    "echo x > ../out.txt; mkdir ../d; ln -s x ../sl; mv ../existing.txt ../moved.txt; "
    "touch /dev/made; mkdir ro && chmod 555 ro && echo > ro/x; echo ok > fine.txt; "
    "mkdir sub; true"
)


@pytest.mark.parametrize("helper", ["1", "0"])
def test_cli_reports_writes_to_read_only_paths(world: World, helper: str) -> None:
    """A trapped call the kernel refuses for want of write access there (a read-only
    mount, Landlock) is a ``file-write-readonly`` record; allowed writes and a file's
    own permissions inside a writable root are not."""
    world.mkfile("existing.txt", "keep\n")
    out = world.root
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    log = world.root / "refused.jsonl"
    env = {**world.env(), "SANDHOLD_EXEC_HELPER": helper}
    r = world.sandhold(
        "-s", str(s), "-d", "--violations", str(log), "--", "sh", "-c", READ_ONLY_WRITES, env=env
    )
    assert r.returncode == 0, r.stderr
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    got = {e["target"]: e for e in entries if e["action"] == "file-write-readonly"}
    assert set(got) == {
        f"{out}/out.txt",
        f"{out}/d",
        f"{out}/sl",
        f"{out}/moved.txt",
        "/dev/made",
    }, entries
    assert got[f"{out}/d"]["syscall"].startswith("mkdir")
    assert got[f"{out}/sl"]["syscall"].startswith("symlink")
    assert got[f"{out}/moved.txt"]["syscall"].startswith("rename")
    assert got[f"{out}/out.txt"]["rule"] == "read-only in the sandbox"
    assert got["/dev/made"]["rule"] == "not writable in the sandbox"  # Landlock
    assert all(e["allowed"] is False for e in entries)
    assert "refused 5 write(s) to read-only paths" in r.stderr
    assert (world.work / "fine.txt").read_text() == "ok\n" and (world.work / "sub").is_dir()
    assert (out / "existing.txt").read_text() == "keep\n" and not (out / "out.txt").exists()


def test_port_reports_writes_to_a_read_only_bind(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec(mode="review"))
            ex = await port.exec(h, ["sh", "-c", f"echo x > {WORK}/new.txt; mkdir {WORK}/d"])
            OUT["v"] = [
                [e.exec_id == ex.exec_id, e.violation.action, e.violation.target]
                for e in [e async for e in ex] if e.type == "violation"
            ]
            await port.destroy(h)
        """,
    )
    w = world.work
    assert out["v"] == [
        [True, "file-write-readonly", f"{w}/new.txt"],
        [True, "file-write-readonly", f"{w}/d"],
    ]
    assert sorted(p.name for p in w.iterdir()) == []


def test_cli_with_violations_records_writes_even_with_no_writable_root(world: World) -> None:
    """Default settings write nowhere but TMPDIR: asked for a record, the supervisor
    runs anyway, and scratch stays free."""
    log = world.root / "refused.jsonl"
    script = 'echo x > here.txt; mkdir d; echo y > "$TMPDIR/a" && cat "$TMPDIR/a"'
    r = world.sandhold("--violations", str(log), "--", "sh", "-c", script)
    assert r.stdout == "y\n", r.stderr
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["action"], e["target"]) for e in entries] == [
        ("file-write-readonly", f"{world.work}/here.txt"),
        ("file-write-readonly", f"{world.work}/d"),
    ]


SET_ID = r"""
import ctypes, errno, os, stat
libc = ctypes.CDLL(None, use_errno=True)

def t(name, f):
    try:
        f()
        print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode[e.errno])

def flink(mode):
    fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, mode)
    if libc.linkat(fd, b"", -100, b"named_%o" % mode, 0x1000):  # AT_EMPTY_PATH
        raise OSError(ctypes.get_errno(), "linkat")

t("open_excl", lambda: os.close(os.open("a", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o4755)))
t("open", lambda: os.close(os.open("b", os.O_CREAT | os.O_WRONLY, 0o2755)))
t("mknod", lambda: os.mknod("c", stat.S_IFREG | 0o4755))
t("plain", lambda: os.close(os.open("p", os.O_CREAT | os.O_WRONLY, 0o755)))
t("existing", lambda: os.close(os.open("p", os.O_CREAT | os.O_WRONLY, 0o4755)))
t("chmod", lambda: os.chmod("p", 0o4755))
t("fchmod", lambda: os.fchmod(os.open("p", os.O_RDONLY), 0o2711))
t("chmod_plain", lambda: os.chmod("p", 0o700))
t("tmpfile", lambda: flink(0o4755))
t("tmpfile_plain", lambda: flink(0o644))
scratch = os.environ["TMPDIR"] + "/s"
t("scratch", lambda: os.close(os.open(scratch, os.O_CREAT | os.O_WRONLY, 0o6755)))
t("mkdir", lambda: os.mkdir("d", 0o2775))
"""


@pytest.mark.parametrize("helper", ["1", "0"])
def test_no_set_id_file_can_be_made(world: World, helper: str) -> None:
    """A set-user-ID or set-group-ID file in a writable root (or behind an inherited
    stdio fd) would run with its owner's rights on the host, root's when sandhold runs
    as root: neither made with those bits nor given them later."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    env = {**world.env(), "SANDHOLD_EXEC_HELPER": helper}
    r = world.sandhold("-s", str(s), "--", "python3", "-c", SET_ID, env=env)
    got = dict(line.split() for line in r.stdout.splitlines())
    assert got == {
        "open_excl": "EPERM",
        "open": "EPERM",
        "mknod": "EPERM",
        "plain": "ok",
        "existing": "ok",  # an open of a file that exists makes nothing: mode unused
        "chmod": "EPERM",
        "fchmod": "EPERM",
        "chmod_plain": "ok",
        "tmpfile": "EPERM",  # its mode is checked when linkat names it
        "tmpfile_plain": "ok",
        "scratch": "EPERM",
        "mkdir": "ok",  # mkdir ignores the bits (the kernel keeps only a parent's setgid)
    }, r.stderr
    for path in world.work.rglob("*"):
        assert not path.lstat().st_mode & 0o6000, path
    assert sorted(p.name for p in world.work.iterdir()) == ["d", "named_644", "p"]


def test_set_id_bits_cannot_be_put_on_a_file_handed_over_as_stdio(world: World) -> None:
    """stdout redirected to a host file is the host's own file, outside every mount
    rule: the filter still refuses making it set-user-ID."""
    import subprocess

    out = world.root / "build.log"
    code = (
        "import os\n"
        "for change in (lambda: os.fchmod(1, 0o4755), lambda: os.fchmod(1, 0o2755),\n"
        "               lambda: os.chmod('/proc/self/fd/1', 0o6777)):\n"
        "    try: change(); print('changed')\n"
        "    except OSError as e: print(e.errno)\n"
        "os.fchmod(1, 0o640)  # its other bits are the command's to set\n"
    )
    with open(out, "w") as f:
        world.ident.chown(out)
        proc = world.popen("--", "python3", "-c", code, stdout=f, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.read_text() == "1\n1\n1\n"  # EPERM, each way
    assert out.stat().st_mode & 0o7777 == 0o640


def test_proc_sys_is_read_only_even_without_landlock(world: World) -> None:
    """Without Landlock (an older kernel, simulated) only the mount keeps host root's
    sandbox from the host's sysctls: the value is written back unchanged."""
    out = drive(
        world,
        """
        import sandhold.port.facts as sp
        sp.confinement_facts()
        sp._CONFINEMENT["landlock"] = False  # as on a kernel without it

        async def main(port):
            h = await port.launch(spec())
            OUT["confinement"] = h.detail("confinement")
            r = await port.run(
                h, "v=$(cat /proc/sys/kernel/printk_ratelimit) && "
                "echo $v > /proc/sys/kernel/printk_ratelimit && echo WROTE")
            OUT["out"] = r.stdout.decode() + r.stderr.decode()
            await port.destroy(h)
        """,
    )
    assert "landlock" not in str(out["confinement"])
    assert "WROTE" not in str(out["out"])
    assert "Read-only file system" in str(out["out"]) or not world.ident.is_root


@pytest.mark.skipif(landlock_abi() < 6, reason="signal scoping needs Landlock ABI 6")
def test_port_commands_cannot_stop_or_kill_the_agent_but_signal_each_other(
    world: World,
) -> None:
    """The agent forks the execs from a thread inside their domain while its own pid
    (its main thread) stays outside: a SIGSTOP from a command would hang every exec."""
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            bg = await port.exec(h, ["sleep", "30"])
            r = await asyncio.wait_for(port.run(h, (
                # $PPID is the exec's reaper (its own to kill); its parent is the agent
                "A=$(cut -d' ' -f4 /proc/$PPID/stat); "
                "kill -STOP $A; echo stop=$?; kill -KILL $A; echo kill=$?; "
                "until pgrep -x sleep >/dev/null; do :; done; "  # exec'd yet?
                "kill -TERM $(pgrep -x sleep); echo sleep=$?")), 20)
            OUT["r"] = r.stdout.decode()
            OUT["bg"] = (await asyncio.wait_for(bg.wait(), 20)).exit_code
            OUT["after"] = (await asyncio.wait_for(port.run(h, "echo alive"), 20)).stdout.decode()
            await port.destroy(h)
        """,
    )
    assert out["r"] == "stop=1\nkill=1\nsleep=0\n"  # the agent
    assert out["bg"] == 128 + 15
    assert out["after"] == "alive\n"


def test_other_agents_project_config_cannot_be_made_or_changed(world: World) -> None:
    """Cursor's, Gemini CLI's, Codex's ... project directories name MCP servers and
    hooks, commands their tools run on the host: refused like .claude and .vscode."""
    world.mkfile("work/.gemini/settings.json", "{}\n")
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    script = (
        "mkdir -p .cursor; echo cursor=$?; mkdir -p sub/.codex; echo codex=$?; "
        "echo '{\"mcpServers\": {}}' > .gemini/settings.json; echo gemini=$?; "
        "mkdir tmpdir && mv tmpdir .kiro; echo kiro=$?; mkdir .cursorx; echo other=$?"
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script)
    assert r.stdout.split() == ["cursor=1", "codex=1", "gemini=2", "kiro=1", "other=0"], r.stderr
    assert (world.work / ".gemini/settings.json").read_text() == "{}\n"
    assert sorted(p.name for p in world.work.iterdir()) == [".cursorx", ".gemini", "sub", "tmpdir"]


def test_other_agents_project_files_cannot_be_made_or_changed(world: World) -> None:
    """opencode's plugins (.opencode/plugins) and config, Crush's, aider's lint and
    test commands, Zed's tasks: commands their tools run on the host."""
    world.mkfile("work/opencode.json", "{}\n")
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    script = (
        "echo '{\"mcp\": {}}' > opencode.json; echo opencode=$?; "
        "mkdir -p .opencode/plugins; echo plugins=$?; "
        "echo 'lint-cmd: sh x' > .aider.conf.yml; echo aider=$?; "
        "echo '{}' > sub.json && mv sub.json .crush.json; echo crush=$?; "
        "mkdir -p deep/down && ln -s /etc deep/down/.zed; echo zed=$?; "
        "mkdir .roo .kilocode .qwen .trae .junie .crush .factory .devcontainer .mise; "
        "echo others=$?; "
        "echo '[hooks]' > mise.toml; echo mise=$?; "
        "echo '{}' > .devcontainer.json; echo devcontainer=$?; "
        "echo '{}' > opencode.json.bak; echo other=$?"
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script)
    assert r.stdout.split() == [
        "opencode=2",
        "plugins=1",
        "aider=2",
        "crush=1",
        "zed=1",
        "others=1",
        "mise=2",
        "devcontainer=2",
        "other=0",
    ], r.stderr
    assert (world.work / "opencode.json").read_text() == "{}\n"
    assert sorted(p.name for p in world.work.iterdir()) == [
        "deep",
        "opencode.json",
        "opencode.json.bak",
        "sub.json",
    ]
    assert list((world.work / "deep/down").iterdir()) == []
