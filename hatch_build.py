"""Hatchling build hook: compiles the supervisor's compiled front, ``sandhold-exec``.

Rules:
- A wheel gets ``sandhold/_helper/sandhold-exec`` built from ``src/sandhold/_helper/*.c``
  with ``$CC`` (default ``cc``), compiled afresh in a temporary directory (never a copy
  left in the tree), and is then tagged ``py3-none-<platform>``: the executable is
  tied to the platform, not to a Python ABI.
- No compiler, or a failed compile, is not a failed build: sandhold works without the
  front (supervised starts take the Python supervisor, ~15 ms slower each). The build
  log gets a warning that says so, the wheel stays ``py3-none-any`` and
  ``sandhold probe`` reports the front as missing.
- ``SANDHOLD_BUILD_HELPER=0`` skips the compile on purpose; ``=require`` makes a
  failed compile fail the build (for packagers who must ship the front).
- An editable install builds the front in place (``src/sandhold/_helper/``) when it is
  missing or older than its sources, as ``scripts/setup`` does, and adds no import hook:
  the editable wheel stays a plain path ``.pth``.
- Only on Linux: the front is Linux code (seccomp, Landlock, namespaces).
- Nothing is downloaded here; the compiler is the host's.
- The page's vendored xterm.js (``src/sandhold/server/static/vendor/``, copied from
  ``web/`` by ``scripts/setup`` and git-ignored, so hatchling would leave it out) goes
  into a wheel when present; without it the wheel builds and the page says that
  terminals need it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

HELPER_DIR = "src/sandhold/_helper"
VENDOR_DIR = "src/sandhold/server/static/vendor"
VENDOR_FILES = ("xterm.js", "xterm.css", "addon-fit.js")
SOURCES = ("exec.c", "fastpath.c", "reap.c")
HEADERS = ("fastpath.h", "reap.h")
NAME = "sandhold-exec"
CFLAGS = ("-O2", "-Wall", "-Wextra")
COST = "supervised starts will use the Python supervisor, about 15 ms slower each"


class HelperBuildHook(BuildHookInterface):  # type: ignore[misc]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        self._tmp: str | None = None
        if self.target_name != "wheel":
            return
        if version != "editable":
            self._vendor(build_data)
        mode = os.environ.get("SANDHOLD_BUILD_HELPER", "1")
        if mode == "0":
            self.app.display_warning(f"sandhold: SANDHOLD_BUILD_HELPER=0: {NAME} not built; {COST}")
            return
        if not sys.platform.startswith("linux"):
            self.app.display_info(f"sandhold: {NAME} is Linux-only; not built on {sys.platform}")
            return
        src = os.path.join(self.root, HELPER_DIR)
        if version == "editable":
            out = os.path.join(src, NAME)
            if not self._stale(src, out):
                return
            self._compile(src, out, mode)
            return
        self._tmp = tempfile.mkdtemp(prefix="sandhold-helper-")
        out = os.path.join(self._tmp, NAME)
        if not self._compile(src, out, mode):
            return
        build_data["force_include"][out] = f"sandhold/_helper/{NAME}"
        build_data["pure_python"] = False
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        build_data["tag"] = f"py3-none-{platform}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def _vendor(self, build_data: dict[str, Any]) -> None:
        found = [f for f in VENDOR_FILES if os.path.isfile(os.path.join(self.root, VENDOR_DIR, f))]
        for f in found:
            build_data["force_include"][os.path.join(self.root, VENDOR_DIR, f)] = (
                f"sandhold/server/static/vendor/{f}"
            )
        if len(found) < len(VENDOR_FILES):
            self.app.display_warning(
                "sandhold: WARNING: xterm.js is not in static/vendor/ (run scripts/setup with "
                "npm); the wheel's page will open no terminal"
            )

    @staticmethod
    def _stale(src: str, out: str) -> bool:
        if not os.access(out, os.X_OK):
            return True
        built = os.stat(out).st_mtime_ns
        return any(os.stat(os.path.join(src, f)).st_mtime_ns > built for f in (*SOURCES, *HEADERS))

    def _compile(self, src: str, out: str, mode: str) -> bool:
        cc = shlex.split(os.environ.get("CC") or "cc")
        argv = [*cc, *CFLAGS, "-o", f"{out}.tmp", *(os.path.join(src, f) for f in SOURCES)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
            why = "" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()}"
        except (OSError, subprocess.SubprocessError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        if not why:
            os.chmod(f"{out}.tmp", 0o755)  # kept by the wheel (hatchling keeps exec bits)
            os.replace(f"{out}.tmp", out)
            self.app.display_info(f"sandhold: built {NAME} with {shlex.join(cc)}")
            return True
        if os.path.lexists(f"{out}.tmp"):
            os.unlink(f"{out}.tmp")
        message = (
            f"sandhold: WARNING: could not build {NAME} ({shlex.join(argv)}: {why}); "
            f"{COST}. Install a C compiler (Debian/Ubuntu: apt-get install gcc libc6-dev "
            "linux-libc-dev) and reinstall sandhold to get it."
        )
        if mode == "require":
            raise RuntimeError(message + " (SANDHOLD_BUILD_HELPER=require)")
        self.app.display_warning(message)
        return False
