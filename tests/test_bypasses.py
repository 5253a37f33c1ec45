"""Attacks on the native sandbox that the other test files do not already cover.

Racing threads that swap symlinks and directories under a reader or writer,
raw and packet sockets, odd spellings of the host's loopback, nested namespaces
and bubblewrap inside the sandbox, and the sandbox's init through /proc/1/root.
Every test runs as root and as an unprivileged user.
"""

from __future__ import annotations

import json
import os
import socket
import textwrap
from pathlib import Path

import pytest

from conftest import World
from portdriver import drive

RACE_READ = textwrap.dedent(
    """
    import os, sys, threading, time
    secret, public = sys.argv[1], "public.txt"
    stop = time.monotonic() + 2.0
    leaked, reads, errors = [], 0, 0

    def swapper():
        i = 0
        while time.monotonic() < stop:
            for target in (public, secret):
                tmp = f"tmp-link-{i}"
                i += 1
                os.symlink(target, tmp)
                os.rename(tmp, "link")  # atomic swap of what "link" points at
                os.makedirs("dir-real", exist_ok=True)
                tmpd = f"tmp-dir-{i}"
                os.symlink(os.path.dirname(secret) if target == secret else "dir-real", tmpd)
                os.rename(tmpd, "dir")

    t = threading.Thread(target=swapper)
    t.start()
    while time.monotonic() < stop:
        for path in ("link", "dir/" + os.path.basename(secret)):
            try:
                with open(path) as f:
                    data = f.read()
                reads += 1
                if "PRIVATE" in data:
                    leaked.append(path)
            except OSError:
                errors += 1
    t.join()
    print(json.dumps({"leaked": leaked, "reads": reads, "errors": errors}))
    """
).replace("import os, sys", "import json, os, sys")

RACE_WRITE = textwrap.dedent(
    """
    import json, os, threading, time
    stop = time.monotonic() + 2.0
    wrote = 0

    def swapper():
        i = 0
        while time.monotonic() < stop:
            for target in ("scratch.txt", ".git/config", ".bashrc"):
                tmp = f"tmp-{i}"
                i += 1
                os.symlink(target, tmp)
                os.rename(tmp, "out")

    t = threading.Thread(target=swapper)
    t.start()
    while time.monotonic() < stop:
        try:
            with open("out", "w") as f:
                f.write("EVIL")
            wrote += 1
        except OSError:
            pass
    t.join()
    print(json.dumps({"wrote": wrote}))
    """
)


def _run_py(world: World, code: str, *args: str, settings: dict[str, object]) -> dict[str, object]:
    script = world.mkfile("attack.py", code)
    s = world.settings(settings)
    r = world.sandhold("-s", str(s), "--", "python3", str(script), *args, timeout=60)
    assert r.returncode == 0, r.stderr
    result: dict[str, object] = json.loads(r.stdout)
    return result


def test_racing_symlink_and_directory_swaps_never_read_a_denied_file(world: World) -> None:
    secret = world.mkfile("home/.ssh/id_rsa", "PRIVATE KEY")
    world.mkfile("work/public.txt", "public")
    res = _run_py(
        world,
        RACE_READ,
        str(secret),
        settings={"filesystem": {"denyRead": ["~/.ssh"], "allowWrite": ["."]}},
    )
    assert res["leaked"] == []
    assert isinstance(res["reads"], int) and res["reads"] > 100  # the race really ran


def test_racing_symlink_swaps_never_write_a_protected_file(world: World) -> None:
    cfg = world.mkfile("work/.git/config", "[core]\n")
    rc = world.mkfile("work/.bashrc", "# mine\n")
    world.mkfile("work/scratch.txt", "")
    res = _run_py(world, RACE_WRITE, settings={"filesystem": {"allowWrite": ["."]}})
    assert isinstance(res["wrote"], int) and res["wrote"] > 100
    assert cfg.read_text() == "[core]\n" and rc.read_text() == "# mine\n"


SOCKETS = textwrap.dedent(
    """
    import errno, json, socket
    def attempt(*args):
        try:
            socket.socket(*args).close()
            return "ok"
        except OSError as e:
            return errno.errorcode.get(e.errno, str(e.errno))
    print(json.dumps({
        "raw_icmp": attempt(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
        "raw_tcp": attempt(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP),
        "raw6": attempt(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
        "packet": attempt(socket.AF_PACKET, socket.SOCK_RAW, 0),
        "unix_dgram": attempt(socket.AF_UNIX, socket.SOCK_DGRAM),
        "vsock": attempt(socket.AF_VSOCK, socket.SOCK_STREAM),
        "alg": attempt(socket.AF_ALG, socket.SOCK_SEQPACKET),
        "netlink": attempt(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE),
    }))
    """
)


def test_raw_and_packet_sockets_are_refused(world: World) -> None:
    res = _run_py(world, SOCKETS, settings={})
    for kind in ("raw_icmp", "raw_tcp", "raw6", "packet", "unix_dgram"):
        assert res[kind] in ("EPERM", "EACCES", "EAFNOSUPPORT"), (kind, res)
    # vsock reaches the hypervisor past the network namespace: the filter refuses the
    # family itself (so EPERM, even on a kernel that has it); netlink stays usable
    assert res["vsock"] == res["alg"] == "EPERM", res
    assert res["netlink"] == "ok", res


DGRAM_PAIR = textwrap.dedent(
    """
    import errno, json, socket, sys
    out = {}
    try:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        a.sendto(b"from the sandbox", sys.argv[1])
        out["dgram_pair"] = "sent"
    except OSError as e:
        out["dgram_pair"] = errno.errorcode.get(e.errno, str(e.errno))
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        a.sendto(b"from the sandbox", sys.argv[1])  # the kernel ignores the address
        out["seqpacket_pair"] = "sent: " + b.recv(100).decode()
    except OSError as e:
        out["seqpacket_pair"] = errno.errorcode.get(e.errno, str(e.errno))
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize(
    "network", [{}, {"allowUnixSockets": ["/nowhere.sock"]}], ids=["no-unix", "some-unix"]
)
def test_a_socket_pair_sends_to_no_host_socket(world: World, network: dict[str, object]) -> None:
    """A datagram pair's sendto names any path: only pairs that take no address are made."""
    path = world.root / "host-dgram.sock"
    host = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        host.bind(str(path))
        os.chmod(path, 0o777)
        res = _run_py(world, DGRAM_PAIR, str(path), settings={"network": network})
        host.setblocking(False)
        with pytest.raises(BlockingIOError):
            host.recv(100)
    finally:
        host.close()
    assert res == {"dgram_pair": "EPERM", "seqpacket_pair": "sent: from the sandbox"}


LOOPBACK = textwrap.dedent(
    """
    import errno, json, socket, sys
    port = int(sys.argv[1])
    out = {}
    for host in ("127.0.0.1", "127.1", "2130706433", "0x7f000001", "0177.0.0.1", "localhost",
                 "::ffff:127.0.0.1", "::1", sys.argv[2]):
        try:
            fam = socket.AF_INET6 if ":" in host else socket.AF_INET
            addr = socket.getaddrinfo(host, port, fam, socket.SOCK_STREAM)[0][4]
            s = socket.socket(fam, socket.SOCK_STREAM)
            s.settimeout(2)
            s.connect(addr)
            s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
            out[host] = "connected:" + s.recv(20).decode(errors="replace")
        except OSError as e:
            out[host] = errno.errorcode.get(e.errno, type(e).__name__)
    print(json.dumps(out))
    """
)


def test_no_spelling_of_an_address_reaches_a_host_server(world: World) -> None:
    import http.server
    import socket
    import threading

    class Quiet(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"HOST SERVER")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host_ip = socket.gethostbyname(socket.gethostname())
        res = _run_py(world, LOOPBACK, str(server.server_address[1]), host_ip, settings={})
    finally:
        server.shutdown()
    assert res and all(not str(v).startswith("connected") for v in res.values()), res


NAMESPACES = textwrap.dedent(
    """
    import json, subprocess
    out = {}
    for name, argv in {
        "unshare_user": ["unshare", "-U", "true"],
        "unshare_root": ["unshare", "-r", "true"],
        "unshare_mount": ["unshare", "-m", "true"],
        "unshare_net": ["unshare", "-n", "true"],
        "unshare_pid": ["unshare", "-p", "-f", "true"],
        "nested_bwrap": ["bwrap", "--ro-bind", "/", "/", "true"],
        "nested_bwrap_userns": ["bwrap", "--unshare-user", "--ro-bind", "/", "/", "true"],
        "mount_tmpfs": ["mount", "-t", "tmpfs", "none", "/mnt"],
        "remount_rw": ["mount", "-o", "remount,rw", "/"],
    }.items():
        try:
            out[name] = subprocess.run(argv, capture_output=True).returncode
        except FileNotFoundError:
            out[name] = "missing"
    print(json.dumps(out))
    """
)


def test_no_new_namespaces_mounts_or_nested_sandboxes(world: World) -> None:
    res = _run_py(world, NAMESPACES, settings={})
    for name, code in res.items():
        assert code not in (0, "missing"), (name, res)


def test_sandbox_init_root_is_the_same_restricted_view(world: World) -> None:
    secret = world.mkfile("home/.ssh/id_rsa", "PRIVATE KEY")
    s = world.settings({"filesystem": {"denyRead": ["~/.ssh"]}})
    r = world.sandhold(
        "-s",
        str(s),
        "--",
        "sh",
        "-c",
        f"cat /proc/1/root{secret}; cat /proc/$$/root{secret}; "
        f"cat /proc/1/cwd/../{secret.relative_to(world.root)}; echo done",
    )
    assert "PRIVATE" not in r.stdout
    assert r.stdout.strip().endswith("done")


TAMPER = textwrap.dedent(
    """
    import json, os, sys
    pkg = sys.argv[1]
    out = {}

    def attempt(key, fn):
        try:
            fn()
            out[key] = "ok"
        except OSError as e:
            out[key] = type(e).__name__

    def patch():  # the Python supervisor would then allow every name
        with open(f"{pkg}/sandhold/policy/creation.py", "a") as f:
            f.write("\\nDecider.denied = lambda *a, **k: None\\n")

    def plant():  # shadows the standard library if the package's parent is on sys.path
        with open(f"{pkg}/json.py", "w") as f:
            f.write(f"open({os.getcwd() + '/PLANTED-RAN'!r}, 'w').close()\\n")

    def move():  # the supervisor, started later, would load a tree put in its place
        os.rename(f"{pkg}/sandhold", f"{pkg}/moved")

    attempt("patch", patch)
    attempt("plant", plant)
    attempt("move", move)
    # the C front hands these to the Python supervisor, which starts now
    for name in (".env", ".env"):
        attempt("env", lambda: open(name, "w").close())
    os.makedirs(".git/hooks", exist_ok=True)  # a repo made now may have hooks/*.sample
    attempt("hooks", lambda: open(".git/hooks/pre-commit", "w").close())
    print(json.dumps(out))
    """
)


def test_the_supervisor_code_cannot_be_changed_from_inside(world: World) -> None:
    """sandhold installed inside a writable root (a project's .venv, its own checkout):
    the sandbox can neither edit the supervisor's package, nor plant a module its
    interpreter would load instead of the standard library, nor swap the tree."""
    import shutil
    from pathlib import Path

    import sandhold

    pkg = world.work / "src"
    shutil.copytree(Path(sandhold.__file__).parent, pkg / "sandhold", symlinks=True)
    for p in (pkg, *pkg.rglob("*")):
        world.ident.chown(p)
    script = world.mkfile("work/attack.py", TAMPER)
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    boot = (
        f"import sys;sys.path.insert(0,{str(pkg)!r});from sandhold.cli import main;sys.exit(main())"
    )
    r = world.ident.run(
        [world.ident.python, "-c", boot, "-s", str(s), "--", "python3", str(script), str(pkg)],
        cwd=world.work,
        env=world.env(),
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # EROFS: the package, and the directory sandhold imports it from (sys.path)
    # its code paths are refused names too (EACCES), besides being read-only mounts
    assert out["patch"] == out["plant"] == out["move"] == "PermissionError", out
    assert out["env"] == out["hooks"] == "PermissionError", out
    assert not (world.work / ".env").exists()
    assert not (world.work / ".git/hooks/pre-commit").exists()
    assert "Decider.denied" not in (pkg / "sandhold/policy/creation.py").read_text()
    assert not (world.work / "PLANTED-RAN").exists() and not (pkg / "json.py").exists()


EDIT_EXISTING = textwrap.dedent(
    """
    import json, os
    out = {}
    try:
        os.chmod("hidden", 0o700)  # its owner could make it listable again
    except OSError as e:
        out["chmod"] = type(e).__name__
    for rel in ("remote.git/config", "remote.git/hooks/post-receive",
                ".git/config.worktree", ".git/modules/logs/config",
                ".git/modules/sub/config", ".git/modules/sub/hooks/pre-commit",
                ".git/modules/a/modules/b/config", ".git/worktrees/w/commondir",
                ".git/worktrees/w/config.worktree", "hidden/.env", "hidden/.git/config",
                "fx/config", "fx/commondir"):
        try:  # no O_CREAT: an open of an existing file is not the supervisor's to see
            fd = os.open(rel, os.O_WRONLY | os.O_APPEND)
            os.write(fd, b"[core]\\n\\tfsmonitor = touch /tmp/pwned\\n")
            os.close(fd)
            out[rel] = "written"
        except OSError as e:
            out[rel] = type(e).__name__
    print(json.dumps(out))
    """
)


def test_existing_git_internals_and_unlistable_directories_stay_read_only(world: World) -> None:
    """Submodule and worktree git dirs hold a config git obeys and hooks it runs, at any
    depth below .git; a directory its owner cannot list holds names nobody checked."""
    rels = [
        "work/remote.git/HEAD",  # an existing bare repository: hooks run on a push
        "work/remote.git/config",
        "work/remote.git/hooks/post-receive",
        "work/remote.git/objects/info/packs",
        "work/remote.git/refs/heads/main",
        "work/.git/config.worktree",
        "work/.git/modules/logs/HEAD",
        "work/.git/modules/logs/config",
        "work/.git/modules/sub/config",
        "work/.git/modules/sub/hooks/pre-commit",
        "work/.git/modules/a/modules/b/config",
        "work/.git/worktrees/w/commondir",
        "work/.git/worktrees/w/config.worktree",
        "work/hidden/.env",
        "work/hidden/.git/config",
        # a git directory by the supervisor's test (HEAD and refs, no objects/)
        "work/fx/HEAD",
        "work/fx/refs/heads/main",
        "work/fx/config",
        "work/fx/commondir",
    ]
    files = [world.mkfile(rel, "orig\n") for rel in rels]
    for mode in (0o000, 0o644):  # not listable; listable but not searchable
        os.chmod(world.work / "hidden", mode)
        try:
            res = _run_py(world, EDIT_EXISTING, settings={"filesystem": {"allowWrite": ["."]}})
        finally:
            os.chmod(world.work / "hidden", 0o755)
        assert "written" not in res.values(), (oct(mode), res)
        assert [f.read_text() for f in files] == ["orig\n"] * len(files)


def test_a_bare_repository_stays_one_from_one_run_to_the_next(world: World) -> None:
    """Run 1 renames a local remote's HEAD away so that run 2 would not take it for a
    repository and would let it write the hooks; the host's push then ran them."""
    mark = world.root / "PWNED"
    remote = world.work / "remote.git"
    seed = world.root / "seed"

    def host(*argv: str, cwd: Path) -> None:
        r = world.ident.run(["git", *argv], cwd=cwd, env=world.env())
        assert r.returncode == 0, r.stderr

    host("init", "-q", "--bare", str(remote), cwd=world.root)
    host("init", "-q", str(seed), cwd=world.root)
    host("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "--allow-empty",
         "-m", "i", cwd=seed)  # fmt: skip
    host("push", "-q", str(remote), "HEAD:main", cwd=seed)
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    hook = f"#!/bin/sh\\ntouch {mark}\\n"
    runs = [
        "mv remote.git/HEAD remote.git/HEAD.bak; echo head=$?; "
        "mv remote.git/refs remote.git/refs.bak; echo refs=$?; "
        "mv remote.git/objects remote.git/o; echo objects=$?; "
        "rm -f remote.git/HEAD; echo rm=$?",
        f"printf '{hook}' > remote.git/hooks/pre-receive; echo hook=$?",
    ]
    outs = []
    for script in runs:
        r = world.sandhold("-s", str(s), "--", "sh", "-c", script, cwd=world.work)
        assert r.returncode == 0, r.stderr
        outs += r.stdout.split()
    assert outs == ["head=1", "refs=1", "objects=1", "rm=1", "hook=2"], outs
    names = set(os.listdir(remote))
    assert {"HEAD", "objects", "refs"} <= names and not {"HEAD.bak", "refs.bak", "o"} & names
    host("push", "-q", str(remote), "HEAD:other", cwd=seed)
    assert not mark.exists(), "the host's push ran a hook the sandbox wrote"


def test_a_bare_repository_without_hooks_gets_none(world: World) -> None:
    """A bare repository with no hooks directory (or commondir) at launch: the
    supervisor knows those names only below a .git, so they are refused by path."""
    remote = world.work / "remote.git"
    r = world.ident.run(
        ["git", "init", "-q", "--bare", str(remote)], cwd=world.root, env=world.env()
    )
    assert r.returncode == 0, r.stderr
    for sample in (remote / "hooks").iterdir():
        sample.unlink()
    (remote / "hooks").rmdir()
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    script = (
        "mkdir remote.git/hooks; echo hooks=$?; "
        "mkdir t && mv t remote.git/hooks; echo moved=$?; "
        "echo /tmp > remote.git/commondir; echo commondir=$?; "
        "echo fine > remote.git/description; echo other=$?"
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, cwd=world.work)
    assert r.stdout.split() == ["hooks=1", "moved=1", "commondir=2", "other=0"], r.stderr
    assert not (remote / "hooks").exists() and not (remote / "commondir").exists()


def test_a_symlink_left_by_one_run_does_not_widen_the_next(world: World) -> None:
    """Run 1 may write the project: it leaves build -> ~. Run 2 lets only ./build be
    written: it must not get the home directory instead."""
    first = world.settings({"filesystem": {"allowWrite": ["."]}}, "first.json")
    r = world.sandhold("-s", str(first), "--", "sh", "-c", f"ln -s {world.home} build")
    assert r.returncode == 0, r.stderr
    second = world.settings({"filesystem": {"allowWrite": ["./build"]}}, "second.json")
    r = world.sandhold("-s", str(second), "--", "sh", "-c", "echo x > build/planted")
    assert r.returncode == 2 and "is a symlink to" in r.stderr, r.stderr
    assert not (world.home / "planted").exists()


READ_ENVS = textwrap.dedent(
    """
    import json
    out = {}
    for rel in (".env", "app/.env", "cfg/.env"):
        try:  # by name: a directory's x bit is enough to open what it holds
            with open(rel) as f:
                out[rel] = f.read()
        except OSError as e:
            out[rel] = type(e).__name__
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("pattern", ["**/.env", "~/**/.env"])
@pytest.mark.parametrize("target", ["cfg", "."])
def test_a_directory_made_unlistable_by_one_run_keeps_its_names_hidden_in_the_next(
    world: World, pattern: str, target: str
) -> None:
    """Run 1 may write the project: it makes a directory searchable but not listable
    (0311). Run 2's denyRead glob cannot list it, yet could open a .env in it by name.
    As the user the directory is hidden whole, or the launch refused when that would
    hide the working directory; root lists any directory, so it sees the names as usual."""
    proj = world.mkdir("home/proj")
    for rel in (".env", "app/.env", "cfg/.env"):
        world.mkfile(f"home/proj/{rel}", "SECRET")
    script = world.mkfile("read_envs.py", READ_ENVS)
    s = world.settings({"filesystem": {"denyRead": [pattern], "allowWrite": ["."]}})
    r = world.sandhold("-s", str(s), "--", "chmod", "0311", target, cwd=proj)
    assert r.returncode == 0, r.stderr
    try:
        assert os.stat(proj / target).st_mode & 0o777 == 0o311
        r = world.sandhold("-s", str(s), "--", "python3", str(script), cwd=proj)
        explain = world.sandhold("-s", str(s), "--explain", "--", "true", cwd=proj)
    finally:
        os.chmod(proj / target, 0o755)
    if not world.ident.is_root and target == ".":
        assert r.returncode == 2 and "cannot be listed" in r.stderr, r.stderr
        assert explain.returncode == 2 and f"{proj} cannot be listed" in explain.stderr
        return
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert set(res.values()) == {"PermissionError"}, res
    if not world.ident.is_root:  # --explain shows the whole directory covered
        assert f"hide-dir 0000  {proj}/cfg " in explain.stdout, explain.stdout


def test_a_deny_write_glob_reaches_a_writable_root_below_an_unlistable_directory(
    world: World,
) -> None:
    """~/a is 0311: the glob's walk from ~ cannot list it, yet ~/a/proj is writable."""
    secret = world.mkfile("home/a/proj/x.secret", "orig")
    s = world.settings({"filesystem": {"allowWrite": ["~/a/proj"], "denyWrite": ["~/**/*.secret"]}})
    os.chmod(world.home / "a", 0o311)
    try:
        # no O_CREAT: an open of an existing file is not the supervisor's to see
        edit = f"import os; os.write(os.open({str(secret)!r}, os.O_WRONLY), b'planted')"
        r = world.sandhold("-s", str(s), "--", "python3", "-c", edit)
    finally:
        os.chmod(world.home / "a", 0o755)
    assert r.returncode != 0 and "Read-only file system" in r.stderr, r.stderr
    assert secret.read_text() == "orig"


def test_a_symlink_left_in_another_writable_root_does_not_widen_the_next(world: World) -> None:
    """Any writable root is the sandbox's to shape: run 1 leaves out -> ~/.local/bin in
    one, and run 2's allowWrite entry for out must not reach the home directory."""
    bin_dir = world.mkdir("home/.local/bin")
    out = world.mkdir("ruw/out")
    ruw = out.parent
    s = world.settings({"filesystem": {"allowWrite": [".", str(ruw), str(out)]}})
    r = world.sandhold("-s", str(s), "--", "sh", "-c", f"rmdir {out} && ln -s {bin_dir} {out}")
    assert r.returncode == 0, r.stderr
    assert out.is_symlink()
    plant = f"printf '#!/bin/sh\\n' > {out}/git && chmod +x {out}/git"
    r = world.sandhold("-s", str(s), "--", "sh", "-c", plant)
    assert r.returncode == 2 and "is a symlink to" in r.stderr, r.stderr
    assert not (bin_dir / "git").exists()


def test_a_pythonpath_entry_that_does_not_exist_yet_cannot_be_made(world: World) -> None:
    """sandhold imports from every sys.path entry after the run too: one that does not
    exist yet, inside a writable root, is a name the sandbox may not create."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    env = world.env()
    entry = str(world.work / "vendor" / "lib")
    env["PYTHONPATH"] = ":".join(filter(None, (entry, env.get("PYTHONPATH"))))
    for attempt in (
        'mkdir -p vendor/lib && echo \'open("PLANTED", "w")\' > vendor/lib/sitecustomize.py',
        # or one level up: a symlink (or a rename) named like the missing ancestor
        "mkdir -p v2/lib && ln -s v2 vendor",
        "mkdir -p v3/lib && mv v3 vendor",
    ):
        r = world.sandhold("-s", str(s), "--", "sh", "-c", attempt, env=env)
        assert r.returncode != 0, (attempt, r.stderr)
        assert not os.path.lexists(world.work / "vendor"), attempt


def test_a_read_denied_file_cannot_be_moved_out_of_its_rule(world: World) -> None:
    """A covered name moves with its directory: renamed in one run, the file would be
    read under no rule in the next. Its writable ancestors cannot be moved."""
    world.mkfile("work/config/secrets.json", "PRIVATE-1")
    world.mkfile("work/cfg/db.json", "PRIVATE-2")
    world.mkfile("home/.docker/config.json", "PRIVATE-3")
    s = world.settings(
        {
            "filesystem": {
                "allowWrite": [".", "~"],
                "denyRead": ["./config/secrets.json", "./cfg/*.json", "~/.docker/config.json"],
            }
        }
    )
    moves = ["mv config config.x", "mv cfg cfg.x", 'mv "$HOME/.docker" "$HOME/.docker.x"']
    script = "; ".join(f"{m} 2>/dev/null && echo moved || echo kept" for m in moves)
    script += "; cat config*/secrets.json cfg*/db.json $HOME/.docker*/config.json 2>/dev/null"
    for _run in range(2):  # the next run finds everything where its rules are
        r = world.sandhold("-s", str(s), "--", "sh", "-c", script)
        assert r.stdout.split() == ["kept"] * 3, (r.stdout, r.stderr)
    assert (world.work / "config/secrets.json").read_text() == "PRIVATE-1"
    assert (world.home / ".docker/config.json").read_text() == "PRIVATE-3"


def test_the_files_sandhold_reads_back_stay_as_they_were(world: World) -> None:
    """The settings file and the --violations file lie in the writable project: the
    next run trusts the one, and this run appends to the other after the command ran.
    Neither can be rewritten, moved or swapped for a symlink from inside."""
    policy = '{"filesystem": {"allowWrite": ["."]}}'
    world.mkfile("work/policy.json", policy)
    target = world.home / ".bashrc"
    attempts = [
        'echo \'{"filesystem": {"allowWrite": ["/"]}}\' > policy.json',
        "mv policy.json p.old",
        "rm v.jsonl",
        "mv v.jsonl v.old",
        f"ln -sf {target} v.jsonl",
    ]
    script = "; ".join(f"({a}) 2>/dev/null && echo done || echo refused" for a in attempts)
    script += "; touch .env"
    args = ("-s", "policy.json", "--violations", "v.jsonl", "--", "sh", "-c", script)
    r = world.sandhold(*args, cwd=world.work)
    assert r.stdout.split() == ["refused"] * len(attempts), r.stderr
    assert (world.work / "policy.json").read_text() == policy
    log = (world.work / "v.jsonl").read_text().splitlines()
    targets = {json.loads(line)["target"] for line in log}
    assert targets == {str(world.work / n) for n in (".env", "policy.json", "v.jsonl")}
    assert not target.exists()
    # one planted before the run: refused, and nothing written through it
    world.symlink("work/v2.jsonl", str(target))
    r = world.sandhold("--violations", "v2.jsonl", "--", "true", cwd=world.work)
    assert r.returncode == 2 and "a symlink (refused)" in r.stderr, r.stderr
    assert not target.exists()


DEEP = """
import os
while len(os.getcwd()) < 3800:
    os.mkdir("d" * 200)
    os.chdir("d" * 200)
open("f" * 250, "w").close()  # its full path is past PATH_MAX
"""


def test_a_tree_deeper_than_the_planner_can_look_stops_the_next_launch(world: World) -> None:
    """A run can build a tree past PATH_MAX in its writable root; the next launch cannot
    check the names in it, so it stops, saying why (it did die with a traceback)."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    r = world.sandhold("-s", str(s), "--", "python3", "-c", DEEP)
    assert r.returncode == 0, r.stderr
    # a protected file with a second name: the plan looks at every file for its twins
    os.link(world.mkfile("work/.env", "K=v"), world.work / "env-copy")
    r = world.sandhold("-s", str(s), "--", "echo", "hi")
    assert r.returncode == 2 and "cannot be checked" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


# Each line: a symlink that would lead the host to a name the supervisor refuses where
# the host finds it (a denyWrite path, sandhold's own code path, names in scratch or in
# allowCredentialWrite), made, moved or hard-linked into place. The last step of each
# is the one refused; the steps before it are allowed.
LEADS = [
    "mv conf conf.orig && mkdir real && echo PLANTED > real/prod.yaml && ln -s real conf",
    "mkdir r2 && echo PLANTED > r2/key.txt && ln -s r2 deploy",
    "mkdir -p r3 sub && echo PLANTED > r3/token && ln -s ../r3 sub/secrets",
    "mkdir -p x/lib && mv vendor vendor.old && ln -s x vendor",
    'mkdir -p "$TMPDIR/x/.git/hooks" && echo evil > "$TMPDIR/x/.git/hooks/pre-commit"'
    ' && ln -s "$TMPDIR/x" app',
    "mkdir -p .venv/app && echo K=planted > .venv/app/.env && ln -s .venv/app app2",
    'ln -s "$TMPDIR/x" "$TMPDIR/lnk" && mv "$TMPDIR/lnk" app3',
    'mkdir "$TMPDIR/d" && ln -s "$TMPDIR/x" "$TMPDIR/d/in" && mv "$TMPDIR/d" app4',
    'ln -s "$PWD/.venv/app" .venv/lnk && ln -P .venv/lnk app5',
    "mv .venv/lnk app6",
    # a target that passes when made, and leads into scratch once b is a symlink
    'rel="${TMPDIR#/}" && ln -s "b/../$rel/x" app8',
    "ln -s / app9",  # above scratch: app9/tmp/... would lead in
    # an O_PATH fd of the symlink itself, linked with AT_EMPTY_PATH
    'ln -s "$PWD/.venv/app" .venv/lnk2 && python3 -c "import ctypes, os; '
    "fd = os.open('.venv/lnk2', os.O_PATH | os.O_NOFOLLOW); "
    "libc = ctypes.CDLL(None, use_errno=True); "
    "raise SystemExit(libc.linkat(fd, b'', -100, b'app7', 0x1000))\"",
]


@pytest.mark.parametrize("helper", ["1", "0"], ids=["with-front", "python-runner"])
def test_symlinks_cannot_lead_the_host_to_refused_names(world: World, helper: str) -> None:
    """The host follows the symlinks a sandbox leaves: one on the way to a denied path,
    or into a tree whose names are not checked, is refused however it is made."""
    world.mkdir("work/conf")
    world.mkdir("work/vendor")
    s = world.settings(
        {
            "filesystem": {
                "allowWrite": ["."],
                "denyWrite": ["./conf/prod.yaml", "./deploy/key.txt", "./**/secrets/*"],
                "allowCredentialWrite": ["./.venv"],
            }
        }
    )
    env = world.env(SANDHOLD_EXEC_HELPER=helper)
    env["PYTHONPATH"] = f"{world.work}/vendor/lib:{env['PYTHONPATH']}"
    script = "; ".join(
        f"({step}) 2>/dev/null && echo {i}:made || echo {i}:refused"
        for i, step in enumerate([*LEADS, "ln -s real conf2", "ln -s conf.orig conf3"])
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, env=env)
    assert r.returncode == 0, r.stderr
    n = len(LEADS)
    assert r.stdout.split() == [*(f"{i}:refused" for i in range(n)), f"{n}:made", f"{n + 1}:made"]
    w = world.work
    for name in ("conf", "deploy", "sub/secrets", "vendor", *(f"app{i}" for i in "23456789")):
        assert not (w / name).is_symlink(), name
    assert not os.path.lexists(w / "app")
    for leaked in ("conf/prod.yaml", "deploy/key.txt", "sub/secrets/token", "vendor/lib"):
        assert not os.path.lexists(w / leaked), leaked


def test_what_sandhold_reads_back_through_a_symlink_cannot_be_swapped(world: World) -> None:
    """A PYTHONPATH entry and the settings file named through a symlink in the writable
    project: the symlink can be removed, but nothing can be made at its name again that
    would lead the next run to other code or settings."""
    world.mkdir("work/vendor/lib")
    world.symlink("work/v", "vendor")
    world.mkfile("work/conf/real.json", '{"filesystem": {"allowWrite": ["."]}}')
    world.symlink("work/s.json", "conf/real.json")
    env = world.env()
    env["PYTHONPATH"] = f"{world.work}/v/lib:{env['PYTHONPATH']}"
    attempts = [
        "rm v && mkdir -p evil/lib && ln -s evil v",
        "mkdir v && mkdir v/lib",
        "rm s.json && echo '{}' > s.json",
        "ln -s conf/other.json s.json",
    ]
    script = "; ".join(f"({a}) 2>/dev/null && echo made || echo refused" for a in attempts)
    r = world.sandhold("-s", "s.json", "--", "sh", "-c", script, env=env, cwd=world.work)
    assert r.stdout.split() == ["refused"] * len(attempts), r.stderr
    assert not (world.work / "v").is_symlink() and not os.path.lexists(world.work / "v/lib")
    assert not os.path.lexists(world.work / "s.json")


def test_own_code_paths_include_the_interpreter_set_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A venv's pyvenv.cfg, bin/ and site dirs made later decide the next start; so do
    a checkout's scripts/ and pyproject.toml when sandhold runs from one."""
    import sys

    from sandhold import wrap

    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\n")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path / "later"), str(tmp_path / "x.zip")])
    got = wrap._code_paths()
    assert str(tmp_path) in got  # the whole installation: pyvenv.cfg, bin/, later site dirs
    checkout = Path(__file__).resolve().parent.parent  # run from this checkout
    assert {str(checkout / n) for n in ("scripts", "bin", "pyproject.toml")} <= set(got)
    assert os.path.realpath(os.path.dirname(sys.executable)) in got
    assert str(tmp_path / "later") in got and str(tmp_path / "x.zip") in got


CRASH = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"


@pytest.mark.parametrize("helper", ["1", "0"], ids=["with-front", "python-runner"])
def test_a_crash_leaves_no_core_file_past_the_supervisor(world: World, helper: str) -> None:
    """The kernel writes a core file itself, under core_pattern's name, in a denied
    place too: the sandbox gets no core dumps, and cannot raise the limit."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    script = "ulimit -Hc; ulimit -c unlimited 2>/dev/null || echo refused; " + (
        f"mkdir -p repo/.git/hooks && cd repo/.git/hooks && python3 -c '{CRASH}'; echo status $?"
    )  # a repository made during the run: its hooks directory may be made, no hook in it
    env = world.env(SANDHOLD_EXEC_HELPER=helper)
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, env=env)
    assert r.stdout.split() == ["0", "refused", "status", "139"], r.stderr
    assert os.listdir(world.work / "repo" / ".git" / "hooks") == []


def test_sandbox_port_execs_get_no_core_dumps_either(world: World) -> None:
    out = drive(
        world,
        """
        async def main(port):
            h = await port.launch(spec())
            r = await port.run(h, "ulimit -Hc; ulimit -c unlimited 2>/dev/null || echo refused")
            OUT["limits"] = r.stdout.decode().split()
            await port.destroy(h)
        """,
    )
    assert out["limits"] == ["0", "refused"]
