"""What a process inside a native sandbox can and cannot reach (F-BE-4, F-NET-1, §9).

Each test runs a small probe inside ``sandhold`` (real bubblewrap, real seccomp)
as root and as the unprivileged ``sandhold-test`` user and checks the kernel's
answer, not sandhold's description of it: the PID namespace hides the host's
processes; no capabilities, ``no_new_privs`` and a seccomp filter hold for the
whole tree; the network namespace has only loopback, so neither a host server
(on 127.0.0.1 or the host's own address) nor DNS is reachable; nested user
namespaces, mounts, ``socket(AF_UNIX)`` (unless the settings allow it) and
io_uring are refused; ``/proc/<pid>/fd`` and ``/proc/self/root`` do not get
around read-only mounts or a ``denyRead``; TMPDIR is private to one run and gone
afterwards; the minimal ``/dev`` works. Where a refusal could be an accident of
the host (a server that is down, a host without DNS), a control run under
``--backend none`` shows the probe itself works.
"""

from __future__ import annotations

import errno
import http.server
import json
import os
import secrets
import select
import signal
import subprocess
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import World

pytestmark = pytest.mark.sandbox

TIMEOUT = 10.0


def _probe(world: World, code: str, *args: str, sandhold_opts: tuple[str, ...] = ()) -> object:
    """Run ``code`` with Python inside sandhold; it prints one JSON value, returned here."""
    r = world.sandhold(*sandhold_opts, "--", world.ident.python, "-c", textwrap.dedent(code), *args)
    assert r.returncode == 0, f"probe failed ({r.returncode}): {r.stderr}"
    return json.loads(r.stdout)


# --- namespaces and privileges -------------------------------------------------------


def test_pid_namespace_shows_only_the_sandbox(world: World) -> None:
    code = """\
        import json, os, sys
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        comms = {}
        for p in pids:
            with open(f"/proc/{p}/comm") as f:
                comms[p] = f.read().strip()
        print(json.dumps({
            "pids": pids,
            "comms": comms,
            "self": os.getpid(),
            "host_pid_visible": os.path.exists(f"/proc/{sys.argv[1]}"),
        }))
    """
    result = _probe(world, code, str(os.getpid()))
    assert isinstance(result, dict)
    assert result["host_pid_visible"] is False
    assert result["self"] in result["pids"]
    # bubblewrap's init (pid 1) and the probe: nothing of the host
    assert len(result["pids"]) <= 3, result
    assert result["comms"]["1"] == "bwrap"


@pytest.mark.parametrize("depth", ["child", "grandchild"])
def test_no_capabilities_no_new_privs_seccomp(world: World, depth: str) -> None:
    read = "grep -E '^(Cap|NoNewPrivs|Seccomp:)' /proc/self/status"
    args = ("--", "sh", "-c", read) if depth == "grandchild" else ("--", "cat", "/proc/self/status")
    r = world.sandhold(*args)
    assert r.returncode == 0, r.stderr
    fields = dict(line.split(":\t", 1) for line in r.stdout.splitlines() if ":\t" in line)
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[cap].strip(), 16) == 0, (cap, fields[cap])
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"  # SECCOMP_MODE_FILTER


def test_nested_user_namespace_refused(world: World) -> None:
    r = world.sandhold("--", "unshare", "-r", "true")
    assert r.returncode != 0
    r = world.sandhold("--", "unshare", "--user", "--net", "true")
    assert r.returncode != 0


def test_mount_refused(world: World) -> None:
    r = world.sandhold("-c", "mount -t tmpfs none /tmp && touch /tmp/mounted-here")
    assert r.returncode != 0
    assert not Path("/tmp/mounted-here").exists()


PROC_CHANGES = """\
    import json, os, stat
    out = {}
    for name, change in (
        ("chmod", lambda: os.chmod("/proc/timer_list", 0o444)),
        ("chown", lambda: os.chown("/proc/timer_list", os.getuid(), os.getgid())),
        ("sysctl", lambda: open("/proc/sys/kernel/printk_ratelimit", "w").write("5")),
        ("oom", lambda: open("/proc/self/oom_score_adj", "w").write("0")),
    ):
        try:
            change()
            out[name] = "changed"
        except OSError as exc:
            out[name] = exc.errno
    print(json.dumps(out))
"""


def test_proc_is_read_only(world: World) -> None:
    # The global /proc entries belong to host root: as root, a chmod in the
    # sandbox's own proc mount would change them for the whole host until reboot.
    before = os.stat("/proc/timer_list").st_mode
    try:
        result = _probe(world, PROC_CHANGES)
    finally:
        if os.stat("/proc/timer_list").st_mode != before:
            os.chmod("/proc/timer_list", before & 0o7777)
    assert isinstance(result, dict)
    assert "changed" not in result.values(), result
    if world.ident.is_root:  # otherwise the owner check refuses first
        assert result["chmod"] == result["chown"] == errno.EROFS, result
    assert os.stat("/proc/timer_list").st_mode == before


def test_io_uring_refused(world: World) -> None:
    code = """\
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        params = ctypes.create_string_buffer(120)  # struct io_uring_params
        fd = libc.syscall(425, 4, params)  # io_uring_setup, same number on x86_64/arm64
        print(json.dumps({"fd": fd, "errno": ctypes.get_errno()}))
    """
    result = _probe(world, code)
    assert result == {"fd": -1, "errno": errno.EPERM}


# --- network -------------------------------------------------------------------------


def test_only_loopback_interface(world: World) -> None:
    r = world.sandhold("--", "cat", "/proc/net/dev")
    assert r.returncode == 0, r.stderr
    names = [line.split(":", 1)[0].strip() for line in r.stdout.splitlines()[2:] if ":" in line]
    assert names == ["lo"]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[int]:
    """An HTTP server on the host, on every address; yields its port."""
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), _Quiet)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _host_ipv4_addresses() -> list[str]:
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines() if len(line.split()) > 3]


CONNECT = """\
    import json, socket, sys
    try:
        s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
        s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
        print(json.dumps({"connected": True, "reply": s.recv(12).decode()}))
    except OSError as exc:
        print(json.dumps({"connected": False, "error": f"{type(exc).__name__}: {exc}"}))
"""


@pytest.mark.parametrize("where", ["loopback", "host-address"])
def test_tcp_to_host_server_fails(world: World, http_server: int, where: str) -> None:
    if where == "loopback":
        address = "127.0.0.1"
    else:
        addresses = _host_ipv4_addresses()
        if not addresses:
            pytest.skip("this host has no non-loopback IPv4 address")
        address = addresses[0]
    control = _probe(world, CONNECT, address, str(http_server), sandhold_opts=("--backend", "none"))
    assert control == {"connected": True, "reply": "HTTP/1.0 200"}, "the probe itself must work"
    result = _probe(world, CONNECT, address, str(http_server))
    assert isinstance(result, dict)
    assert result["connected"] is False, result


def test_dns_resolution_fails(world: World) -> None:
    code = """\
        import json, socket
        try:
            socket.getaddrinfo("example.com", 443)
            print(json.dumps("resolved"))
        except OSError as exc:
            print(json.dumps(f"{type(exc).__name__}: {exc}"))
    """
    result = _probe(world, code)
    assert result != "resolved"
    assert isinstance(result, str) and result.startswith("gaierror")
    r = world.sandhold("--", "getent", "hosts", "example.com")
    assert r.returncode != 0
    assert r.stdout == ""


UNIX_SOCKET = """\
    import json, os, socket
    out = {}
    try:
        a, b = socket.socketpair()
        a.sendall(b"pair")
        out["socketpair"] = b.recv(4).decode()
    except OSError as exc:
        out["socketpair"] = f"{type(exc).__name__}: {exc.errno}"
    try:
        path = os.path.join(os.environ["TMPDIR"], "s.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(path)
        conn, _ = server.accept()
        client.sendall(b"unix")
        out["socket"] = conn.recv(4).decode()
    except OSError as exc:
        out["socket"] = exc.errno
    print(json.dumps(out))
"""


def test_unix_socket_refused_by_default(world: World) -> None:
    result = _probe(world, UNIX_SOCKET)
    assert result == {"socketpair": "pair", "socket": errno.EPERM}


def test_unix_socket_allowed_by_settings(world: World) -> None:
    settings = world.settings({"network": {"allowAllUnixSockets": True}})
    result = _probe(world, UNIX_SOCKET, sandhold_opts=("-s", str(settings)))
    assert result == {"socketpair": "pair", "socket": "unix"}


# --- filesystem escapes through /proc --------------------------------------------------

PROC_FD_REOPEN = """\
    import json, os, sys, time
    path = sys.argv[1]
    out = {}

    def attempt(target, flags):
        try:
            fd = os.open(target, flags)
        except OSError as exc:
            return exc.errno
        try:
            os.write(fd, b"PWNED")
        except OSError as exc:
            return f"opened, write failed: {exc.errno}"
        finally:
            os.close(fd)
        return "written"

    out["direct"] = attempt(path, os.O_WRONLY)
    fd = os.open(path, os.O_RDONLY)
    out["self_fd"] = attempt(f"/proc/self/fd/{fd}", os.O_WRONLY)
    out["self_fd_rdwr"] = attempt(f"/proc/{os.getpid()}/fd/{fd}", os.O_RDWR)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        os.write(w, b"x")
        time.sleep(30)
        os._exit(0)
    os.close(w)
    os.read(r, 1)  # the child holds the read-only fd now
    out["child_fd"] = attempt(f"/proc/{child}/fd/{fd}", os.O_WRONLY | os.O_TRUNC)
    os.kill(child, 9)
    os.waitpid(child, 0)
    print(json.dumps(out))
"""


def test_proc_pid_fd_cannot_reopen_read_only_file_for_writing(world: World) -> None:
    target = world.mkfile("home/readonly.txt", "original\n")
    result = _probe(world, PROC_FD_REOPEN, str(target))
    assert isinstance(result, dict)
    refused = (errno.EROFS, errno.EACCES)
    for key in ("direct", "self_fd", "self_fd_rdwr", "child_fd"):
        assert result[key] in refused, (key, result)
    assert target.read_text() == "original\n"


READ_ATTEMPTS = """\
    import json, os, sys
    out = {}
    for path in sys.argv[1:]:
        try:
            with open(path) as f:
                out[path] = "READ: " + f.read()
        except OSError as exc:
            out[path] = exc.errno
    print(json.dumps(out))
"""


def test_proc_self_root_does_not_bypass_deny_read(world: World) -> None:
    secret = secrets.token_hex(8)
    world.mkfile("home/secret/key.txt", secret)
    world.mkfile("home/single-secret.txt", secret)
    settings = world.settings({"filesystem": {"denyRead": ["~/secret", "~/single-secret.txt"]}})
    paths = [
        f"{world.home}/secret/key.txt",
        f"{world.home}/single-secret.txt",
        f"/proc/self/root{world.home}/secret/key.txt",
        f"/proc/self/root{world.home}/single-secret.txt",
        f"/proc/1/root{world.home}/secret/key.txt",
        f"/proc/self/root/proc/self/root{world.home}/secret/key.txt",
        "/proc/self/cwd/../home/secret/key.txt",
    ]
    r = world.sandhold(
        "-s", str(settings), "--", world.ident.python, "-c", textwrap.dedent(READ_ATTEMPTS), *paths
    )
    assert r.returncode == 0, r.stderr
    assert secret not in r.stdout
    result = json.loads(r.stdout)
    for path in paths:
        assert isinstance(result[path], int), (path, result[path])
    r = world.sandhold(
        "-s", str(settings), "-c", f"ls -la {world.home}/secret; cat {world.home}/secret/*"
    )
    assert secret not in r.stdout


LEAKED_FDS = """\
    import json, os, sys
    dir_fd, file_fd = int(sys.argv[1]), int(sys.argv[2])
    out = {"open": []}
    for name in os.listdir("/proc/self/fd"):
        try:
            out["open"].append([int(name), os.readlink(f"/proc/self/fd/{name}")])
        except OSError:
            pass  # the descriptor listdir used, closed by now
    try:
        out["via_dir"] = open(f"/proc/self/fd/{dir_fd}/secret/key.txt").read()
    except OSError as exc:
        out["via_dir"] = exc.errno
    try:
        out["via_file"] = os.pread(file_fd, 100, 0).decode()
    except OSError as exc:
        out["via_file"] = exc.errno
    try:
        open(f"/proc/self/fd/{dir_fd}/PWNED", "w").close()
        out["create"] = "created"
    except OSError as exc:
        out["create"] = exc.errno
    print(json.dumps(out))
"""


def test_descriptors_inherited_by_sandhold_do_not_reach_the_sandbox(world: World) -> None:
    # A harness may start sandhold with stray inheritable descriptors. Any of them
    # reaching the sandbox is a handle on the host's mounts: a directory fd walks
    # around every denyRead and writes where nothing is writable.
    secret = secrets.token_hex(8)
    world.mkfile("home/secret/key.txt", secret)
    settings = world.settings({"filesystem": {"denyRead": ["~/secret"]}})
    dir_fd = os.open(world.home, os.O_RDONLY | os.O_DIRECTORY)
    file_fd = os.open(world.home / "secret" / "key.txt", os.O_RDONLY)
    try:
        proc = world.popen(
            "-s",
            str(settings),
            "--",
            world.ident.python,
            "-c",
            textwrap.dedent(LEAKED_FDS),
            str(dir_fd),
            str(file_fd),
            pass_fds=(dir_fd, file_fd),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        os.close(dir_fd)
        os.close(file_fd)
    assert proc.returncode == 0, err.decode()
    assert secret.encode() not in out
    result = json.loads(out)
    assert not (world.home / "PWNED").exists()
    assert result["create"] != "created"
    assert [fd for fd, _target in result["open"]] == [0, 1, 2], result["open"]


# --- TMPDIR ----------------------------------------------------------------------------

TMPDIR_PROBE = """\
    import json, os, stat
    tmp = os.environ["TMPDIR"]
    name = os.path.join(tmp, "probe.txt")
    with open(name, "w") as f:
        f.write("private")
    st = os.stat(tmp)
    try:
        open("/tmp/sandhold-probe-" + str(os.getpid()), "w").close()
        host_tmp = "writable"
    except OSError as exc:
        host_tmp = exc.errno
    bookkeeping = {}
    for entry in ("owner", "hidden", "new-file", "hidden-dir/new-file"):
        try:
            with open(os.path.join(tmp, "..", entry), "a") as f:
                f.write("f /etc/passwd\\n")
            bookkeeping[entry] = "written"
        except OSError as exc:
            bookkeeping[entry] = exc.errno
    print(json.dumps({
        "tmpdir": tmp,
        "bookkeeping": bookkeeping,
        "realpath": os.path.realpath(tmp),
        "is_dir": stat.S_ISDIR(st.st_mode),
        "mode": stat.S_IMODE(st.st_mode),
        "uid": st.st_uid,
        "readback": open(name).read(),
        "env_tmp": [os.environ.get("TMP"), os.environ.get("TEMP")],
        "host_tmp": host_tmp,
    }))
"""


def test_tmpdir_is_private_writable_and_removed(world: World) -> None:
    result = _probe(world, TMPDIR_PROBE)
    assert isinstance(result, dict)
    tmp = result["tmpdir"]
    assert result["is_dir"] is True
    assert result["readback"] == "private"
    assert tmp.rstrip("/") != "/tmp" and result["realpath"] != "/tmp"
    assert result["mode"] & 0o077 == 0, oct(result["mode"])
    assert result["uid"] == world.ident.uid
    assert result["env_tmp"] == [tmp, tmp]
    assert result["host_tmp"] == errno.EROFS  # the host's /tmp stays read-only
    # the session's owner file and hiding places are out of the sandbox's reach
    # (the hiding directory is not even there: ENOENT)
    assert set(result["bookkeeping"].values()) <= {errno.EROFS, errno.EACCES, errno.ENOENT}, result
    assert not os.path.exists(tmp), "TMPDIR must be removed after the run"


def test_caches_are_writable_while_the_home_is_not(world: World) -> None:
    """npm install and pip building an sdist write a cache below the home, read-only
    in the sandbox: theirs are moved below the session's $TMPDIR, or into the package
    managers' cache of sandboxed runs (sandhold's private base), instead."""
    script = (
        'for v in "$XDG_CACHE_HOME/pip/http" "$npm_config_cache/_cacache/tmp"; do '
        'case "$v" in "$TMPDIR"/*|*/sandhold-[0-9]*/pkg-cache/*) ;; '
        '*) echo "outside: $v"; exit 1;; esac; '
        'mkdir -p "$v" && touch "$v/entry" || exit 1; done; '
        "mkdir -p ~/.cache/pip 2>/dev/null && echo home-writable; echo ok"
    )
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script)
    assert r.returncode == 0 and r.stdout == "ok\n", (r.stdout, r.stderr)
    assert not (world.home / ".cache").exists()


def test_tmpdir_of_one_run_is_invisible_to_another(world: World) -> None:
    secret = secrets.token_hex(8)
    first = world.popen(
        "-c",
        f'echo {secret} > "$TMPDIR/secret"; echo "$TMPDIR"; read _ || true',
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert first.stdout is not None and first.stdin is not None
        ready, _, _ = select.select([first.stdout], [], [], TIMEOUT)
        assert ready, "first sandbox never printed its TMPDIR"
        tmp = first.stdout.readline().decode().strip()
        assert tmp.startswith("/")
        assert Path(tmp, "secret").read_text().strip() == secret  # from the host: it is there
        r = world.sandhold("-c", f"cat {tmp}/secret; ls {tmp}; ls {os.path.dirname(tmp)}/..")
        assert secret not in r.stdout
        assert "secret" not in r.stdout
        first.stdin.close()
        first.wait(timeout=TIMEOUT)
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=TIMEOUT)
    assert first.returncode == 0
    assert not os.path.exists(tmp)


def test_tmpdir_removed_when_sandhold_is_signalled(world: World) -> None:
    proc = world.popen(
        "-c",
        'echo kept > "$TMPDIR/file"; echo "$TMPDIR"; exec sleep 30',
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT)
        assert ready, "the sandbox never printed its TMPDIR"
        tmp = proc.stdout.readline().decode().strip()
        assert Path(tmp, "file").exists()
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
    assert proc.returncode == 128 + signal.SIGTERM
    assert not os.path.exists(tmp)


# --- /dev ------------------------------------------------------------------------------

DEV_PROBE = """\
    import json, multiprocessing, os, stat, sys
    out = {}
    with open("/dev/null", "wb") as f:
        out["null_write"] = f.write(b"discarded")
    out["null_read"] = open("/dev/null", "rb").read().decode()
    out["zero"] = list(open("/dev/zero", "rb").read(8))
    rnd = open("/dev/urandom", "rb").read(32)
    out["urandom_len"] = len(rnd)
    out["urandom_distinct"] = len(set(rnd)) > 4
    shm = f"/dev/shm/{sys.argv[1]}"
    try:
        with open(shm, "w") as f:
            f.write("shm")
        out["shm"] = open(shm).read()
    except OSError as exc:
        out["shm"] = exc.errno
    out["block_devices"] = [
        n for n in os.listdir("/dev") if stat.S_ISBLK(os.lstat(f"/dev/{n}").st_mode)
    ]
    lock = multiprocessing.Lock()
    with lock:
        out["lock"] = True
    with multiprocessing.Pool(2) as pool:
        out["pool"] = pool.map(abs, [-1, -2, -3])
    queue = multiprocessing.Queue()
    proc = multiprocessing.Process(target=queue.put, args=("from-child",))
    proc.start()
    out["queue"] = queue.get(timeout=5)
    proc.join()
    print(json.dumps(out))
"""


def test_dev_is_minimal_and_usable(world: World) -> None:
    name = f"sandhold-shm-{secrets.token_hex(6)}"
    result = _probe(world, DEV_PROBE, name)
    assert result == {
        "null_write": 9,
        "null_read": "",
        "zero": [0] * 8,
        "urandom_len": 32,
        "urandom_distinct": True,
        "shm": "shm",
        "block_devices": [],
        "lock": True,
        "pool": [1, 2, 3],
        "queue": "from-child",
    }
    assert not Path("/dev/shm", name).exists(), "the sandbox's /dev/shm is private"
