"""The package managers' cache of sandboxed runs (issue 15), through the real CLI as
root and unprivileged: a locally served npm package run twice with ``npx`` and a
locally served Python tool run twice with ``uvx`` (and installed twice with pip), the
second start with no download, and a third with the network off, from the cache.
The registry runs on the host at 127.0.0.2 (the sandbox's NO_PROXY names only
127.0.0.1, so the sandbox reaches it through sandhold's proxy, as a real one)."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import World

HOST = "127.0.0.2"


def npm_tarball(name: str, js: str) -> bytes:
    """An ``npm pack`` tarball of package ``name`` whose one bin runs ``js``."""
    files = {
        "package/package.json": json.dumps(
            {"name": name, "version": "1.0.0", "bin": {name.rsplit("/", 1)[-1]: "index.js"}}
        ).encode(),
        "package/index.js": ("#!/usr/bin/env node\n" + js).encode(),
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def wheel(project: str, script: str, code: str) -> tuple[str, bytes]:
    """(file name, bytes) of a wheel of ``project`` whose console script ``script``
    runs ``main()`` of ``code``."""
    dist = project.replace("-", "_")
    info = f"{dist}-1.0.dist-info"
    files = {
        f"{dist}/__init__.py": code.encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: 1.0\n".encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{info}/entry_points.txt": f"[console_scripts]\n{script} = {dist}:main\n".encode(),
    }
    record = io.StringIO()
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{name},sha256={digest},{len(data)}\n")
    record.write(f"{info}/RECORD,,\n")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{info}/RECORD", record.getvalue())
    return f"{dist}-1.0-py3-none-any.whl", out.getvalue()


class Registry:
    """An npm registry and a PyPI simple index in one, counting the downloads."""

    def __init__(self, npm: dict[str, bytes], wheels: dict[str, tuple[str, bytes]]) -> None:
        self.downloads: list[str] = []
        self.npm = npm
        self.wheels = wheels
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:  # uv asks before a wheel's download
                self._answer(head=True)

            def do_GET(self) -> None:
                self._answer(head=False)

            def _answer(self, head: bool) -> None:
                # a ranged GET reads a wheel's metadata (uv does, before it downloads)
                ranged = self.headers.get("Range") is not None
                body, kind = registry.answer(self.path, count=not head and not ranged)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "max-age=600")
                self.end_headers()
                if not head:
                    self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        self.url = f"http://{HOST}:{self.server.server_address[1]}"

    def answer(self, path: str, count: bool = True) -> tuple[bytes | None, str]:
        from urllib.parse import unquote

        path = unquote(path)
        for name, tarball in self.npm.items():
            file = f"/{name}/-/{name.rsplit('/', 1)[-1]}-1.0.0.tgz"
            if path == f"/{name}":
                sha512 = base64.b64encode(hashlib.sha512(tarball).digest()).decode()
                version = {
                    "name": name,
                    "version": "1.0.0",
                    "bin": {name.rsplit("/", 1)[-1]: "index.js"},
                    "dist": {"tarball": self.url + file, "integrity": f"sha512-{sha512}"},
                }
                doc = {
                    "name": name,
                    "dist-tags": {"latest": "1.0.0"},
                    "versions": {"1.0.0": version},
                }
                return json.dumps(doc).encode(), "application/json"
            if path == file:
                if count:
                    self.downloads.append(path)
                return tarball, "application/octet-stream"
        for project, (filename, data) in self.wheels.items():
            if path.rstrip("/") == f"/simple/{project}":
                sha = hashlib.sha256(data).hexdigest()
                link = f'<a href="/files/{filename}#sha256={sha}">{filename}</a>'
                return f"<html><body>{link}</body></html>".encode(), "text/html"
            if path == f"/files/{filename}":
                if count:
                    self.downloads.append(path)
                return data, "application/octet-stream"
        return None, ""

    def __enter__(self) -> Registry:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def registry() -> Iterator[Registry]:
    npm = {"tinymcp": npm_tarball("tinymcp", 'console.log("tiny mcp ok");\n')}
    tool = wheel("tinytool", "tinytool", "def main():\n    print('tiny tool ok')\n")
    with Registry(npm, {"tinytool": tool}) as reg:
        yield reg


def private_base(world: World) -> Path:
    """sandhold's private base for this test's runs (``TMPDIR`` is the test's own, see
    the tests pass), where the package cache lives."""
    return world.root / f"sandhold-{world.ident.uid}"


def _settings(world: World, registry: Registry) -> Path:
    return world.settings(
        {
            "network": {"allowedDomains": [HOST]},
            "env": {"passthrough": ["npm_config_registry", "UV_INDEX_URL", "PIP_INDEX_URL"]},
        }
    )


@pytest.mark.skipif(shutil.which("npx") is None, reason="npx is not installed")
def test_npx_twice_downloads_once_and_runs_offline_from_the_cache(
    world: World, registry: Registry
) -> None:
    s = _settings(world, registry)
    env = world.env(TMPDIR=str(world.root), npm_config_registry=registry.url + "/")
    for _ in range(2):
        r = world.sandhold("-q", "-s", str(s), "--", "npx", "-y", "tinymcp", env=env, timeout=120)
        assert r.returncode == 0 and r.stdout == "tiny mcp ok\n", r.stderr
    assert registry.downloads == ["/tinymcp/-/tinymcp-1.0.0.tgz"]
    # the network off: npm runs offline, from the same cache
    off = world.settings({"env": {"passthrough": ["npm_config_registry"]}}, "off.json")
    r = world.sandhold("-q", "-s", str(off), "--", "npx", "-y", "tinymcp", env=env, timeout=60)
    assert r.returncode == 0 and r.stdout == "tiny mcp ok\n", r.stderr
    cache = private_base(world) / "pkg-cache"
    assert (cache / "npm/_npx").is_dir()
    assert not (world.home / ".npm").exists()  # never the host's own cache
    assert os.stat(cache).st_mode & 0o777 == 0o700


def find_uv() -> str | None:
    """uv, installed once with pip into a world-readable venv (None: not installable)."""
    venv = Path("/var/tmp/sandhold-test-uv")
    uv = venv / "bin" / "uv"
    if not (venv / ".complete").exists():
        shutil.rmtree(venv, ignore_errors=True)
        try:
            subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=120)
            subprocess.run(
                [str(venv / "bin/pip"), "install", "-q", "uv"],
                check=True,
                timeout=300,
                capture_output=True,
            )
        except (subprocess.SubprocessError, OSError):
            return None
        for d, _dirs, files in os.walk(venv):
            os.chmod(d, 0o755)
            for f in files:
                full = os.path.join(d, f)
                if not os.path.islink(full):
                    os.chmod(full, os.stat(full).st_mode | 0o444)
        (venv / ".complete").touch()
    return str(uv) if uv.exists() else None


def test_uvx_twice_downloads_once_and_runs_offline_from_the_cache(
    world: World, registry: Registry
) -> None:
    uv = find_uv()
    if uv is None:
        pytest.skip("uv is not installable here (pip's cache is tested below)")
    uvx = str(Path(uv).with_name("uvx"))
    s = _settings(world, registry)
    env = world.env(TMPDIR=str(world.root), UV_INDEX_URL=registry.url + "/simple")
    argv = ("--", uvx, "--python", "/usr/bin/python3", "tinytool")
    seen = []
    for _ in range(2):
        r = world.sandhold("-q", "-s", str(s), *argv, env=env, timeout=120)
        assert r.returncode == 0 and r.stdout == "tiny tool ok\n", r.stderr
        seen.append(len(registry.downloads))
    # the first start downloads (uv reads the wheel twice: metadata, then the wheel)
    assert seen[0] >= 1 and seen[1] == seen[0], seen
    off = world.settings({"env": {"passthrough": ["UV_INDEX_URL"]}}, "off.json")
    r = world.sandhold("-q", "-s", str(off), *argv, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout == "tiny tool ok\n", r.stderr
    assert (private_base(world) / "pkg-cache/uv/cache").is_dir()


def test_pip_twice_downloads_once(world: World, registry: Registry) -> None:
    s = world.settings(
        {
            "network": {"allowedDomains": [HOST]},
            "filesystem": {"allowWrite": ["."]},
            "env": {"passthrough": ["PIP_INDEX_URL", "PIP_TRUSTED_HOST"]},
        }
    )
    # pip caches plain-HTTP answers only from a trusted host
    env = world.env(
        TMPDIR=str(world.root), PIP_INDEX_URL=registry.url + "/simple", PIP_TRUSTED_HOST=HOST
    )
    for i in range(2):
        script = (
            f"/usr/bin/python3 -m venv --without-pip v{i} && /usr/bin/python3 -m pip "
            f"--python v{i}/bin/python install -q --disable-pip-version-check tinytool "
            f"&& v{i}/bin/tinytool"
        )
        r = world.sandhold("-q", "-s", str(s), "--", "sh", "-c", script, env=env, timeout=180)
        assert r.returncode == 0 and r.stdout == "tiny tool ok\n", r.stderr
    assert registry.downloads == ["/files/tinytool-1.0-py3-none-any.whl"]
    assert (private_base(world) / "pkg-cache/pip").is_dir()


def test_the_cache_is_hidden_from_a_writable_tmp_and_links_to_home_stay_allowed(
    world: World,
) -> None:
    """The cache lies in sandhold's private base, which no sandbox sees (a symlink to a
    directory above a cache in the home would have to be refused): a link to the home
    is made, and with the private base in a writable root the cache is not used."""
    s = world.settings({"filesystem": {"allowWrite": ["."]}})
    r = world.sandhold("-s", str(s), "--", "sh", "-c", "ln -s ~ build && ls build/")
    assert r.returncode == 0, r.stderr
    tmp = world.mkdir("work/tmp")
    env = world.env(TMPDIR=str(tmp))
    r = world.sandhold("-s", str(s), "--explain", "--", "true", env=env)
    assert "lies in a writable root: not used this run" in r.stdout, r.stdout


def test_a_cache_that_is_a_symlink_is_not_used(world: World) -> None:
    target = world.mkdir("elsewhere")
    base = private_base(world)
    world.mkdir(str(base.relative_to(world.root)))
    os.chmod(base, 0o700)
    world.symlink(str((base / "pkg-cache").relative_to(world.root)), str(target))
    r = world.sandhold(
        "--", "sh", "-c", 'echo "${PIP_CACHE_DIR:-unset}"', env=world.env(TMPDIR=str(world.root))
    )
    assert r.stdout == "unset\n", r.stderr
    assert "sandhold: warning: package cache not used:" in r.stderr
    assert list(target.iterdir()) == []


def test_explain_names_the_cache_and_its_variables(world: World) -> None:
    r = world.sandhold("--explain", "--", "true", env=world.env(TMPDIR=str(world.root)))
    cache = private_base(world) / "pkg-cache"
    assert f"bind           {cache}    <- sandhold: the package managers' cache" in r.stdout
    passed = next(x for x in r.stdout.splitlines() if x.startswith("environment (")).split()
    assert {"npm_config_cache", "PIP_CACHE_DIR", "UV_CACHE_DIR", "GOMODCACHE"} <= set(passed)


NODE_TOOLS = Path(__file__).resolve().parents[1] / ".venv/node-tools/node_modules/.bin"
"""yarn 1 and pnpm, which ``scripts/setup --test`` installs from the npm registry."""


@pytest.mark.parametrize(("tool", "cache"), [("yarn", "yarn"), ("pnpm", "pnpm/store")])
def test_yarn_and_pnpm_install_twice_download_once(
    world: World, registry: Registry, tool: str, cache: str
) -> None:
    exe = NODE_TOOLS / tool
    assert exe.exists(), f"scripts/setup --test installs {tool} into {NODE_TOOLS}"
    s = world.settings(
        {
            "network": {"allowedDomains": [HOST]},
            "filesystem": {"allowWrite": ["."]},
            "env": {"passthrough": ["npm_config_registry"]},
        }
    )
    env = world.env(TMPDIR=str(world.root), npm_config_registry=registry.url + "/")
    manifest = '{"name": "p", "version": "1.0.0", "dependencies": {"tinymcp": "1.0.0"}}'
    for i in range(2):
        script = (
            f"mkdir p{i} && cd p{i} && printf '%s' '{manifest}' > package.json && "
            f"{exe} install >/dev/null && node_modules/.bin/tinymcp"
        )
        r = world.sandhold("-q", "-s", str(s), "--", "sh", "-c", script, env=env, timeout=120)
        assert r.returncode == 0 and r.stdout == "tiny mcp ok\n", r.stdout + r.stderr
    assert registry.downloads == ["/tinymcp/-/tinymcp-1.0.0.tgz"]
    store = private_base(world) / "pkg-cache" / cache
    assert store.is_dir() and any(store.iterdir())
    # never the host's own caches (~/.cache/yarn, ~/.local/share/pnpm, ~/.yarn)
    assert sorted(p.name for p in world.home.iterdir()) == []


CACHE_VARIABLES = {
    # variable: its directory below pkg-cache (cargo and go are not installed here:
    # apt's cargo needs ~210 MB with rustc and its std, golang-go ~335 MB)
    "CARGO_HOME": "cargo",
    "GOMODCACHE": "go/mod",
    "GOCACHE": "go/build",
    "GOPATH": "go/path",
    "YARN_CACHE_FOLDER": "yarn",
    "YARN_GLOBAL_FOLDER": "yarn-berry",
    "PNPM_HOME": "pnpm",
    "pnpm_config_store_dir": "pnpm/store",
}


def test_cargo_go_yarn_and_pnpm_caches_persist_and_spare_the_host(world: World) -> None:
    """Each variable points into the sandboxed runs' cache; what one run writes there
    the next one reads, and the host's own caches (~/.cargo, ~/go, ~/.cache, ~/.yarn,
    ~/.local/share/pnpm) stay unwritten."""
    env = world.env(TMPDIR=str(world.root))
    names = sorted(CACHE_VARIABLES)
    write = " && ".join(f'mkdir -p "${n}/x" && echo {n} > "${n}/x/mark"' for n in names)
    r = world.sandhold("-q", "--", "sh", "-c", write, env=env)
    assert r.returncode == 0, r.stderr
    read = "; ".join(f'echo "${n}" && cat "${n}/x/mark"' for n in names)
    r = world.sandhold("-q", "--", "sh", "-c", read, env=env)
    cache = private_base(world) / "pkg-cache"
    expected = "".join(f"{cache}/{CACHE_VARIABLES[n]}\n{n}\n" for n in names)
    assert r.returncode == 0 and r.stdout == expected, r.stdout + r.stderr
    assert list(world.home.iterdir()) == []
