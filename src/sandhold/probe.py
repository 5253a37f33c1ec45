"""What this host offers for sandboxing, found once per process (F-BE-2).

``quick_probe`` is what every launch consults: the platform and whether the
tools the native backend needs are installed. ``full_probe`` adds what
``sandhold probe`` reports: a real bubblewrap trial run, user namespaces,
seccomp user notification, the Landlock ABI and cgroup v2 delegation.
"""

from __future__ import annotations

import os
import sys

from sandhold._record import record, replace

INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: sudo apt-get install bubblewrap)"
FRONT_MISSING = (  # issue 14: the build hook (hatch_build.py) found no C compiler
    "not built, or off with SANDHOLD_EXEC_HELPER=0; supervised starts use the Python "
    "supervisor, ~15 ms slower each; install gcc "
    "(Debian/Ubuntu: apt-get install gcc libc6-dev linux-libc-dev) and reinstall sandhold"
)


@record
class Probe:
    platform: str  # "linux", "wsl2", "macos" or the raw sys.platform
    available: bool
    requires_install: bool
    default_backend: str
    note: str
    hint: str = ""
    bwrap: str | None = None
    details: tuple[tuple[str, str], ...] = ()


def _executable(path: str) -> bool:
    return os.access(path, os.X_OK) and not os.path.isdir(path)


def which(name: str, path: str | None = None) -> str | None:
    """The first executable ``name`` on ``path`` (default: $PATH)."""
    found = find_command(name, path)
    return found if found and _executable(found) else None


def find_command(name: str, path: str | None = None) -> str | None:
    """Where a shell would run ``name`` from: the first executable match on
    ``path``, else the first match that exists but cannot be run, else None."""
    if "/" in name:
        return name if os.path.exists(name) else None
    first_found = None
    for d in (path if path is not None else os.environ.get("PATH", "")).split(":"):
        cand = f"{d or '.'}/{name}"
        if _executable(cand):
            return cand
        if first_found is None and os.path.exists(cand):
            first_found = cand
    return first_found


def _platform() -> str:
    if sys.platform == "darwin":
        return "macos"
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/version", "rb") as f:  # bytes: no codec to import
                if b"microsoft" in f.read().lower():
                    return "wsl2"
        except OSError:
            pass
        return "linux"
    return sys.platform


_QUICK: dict[str | None, Probe] = {}


def quick_probe(bwrap_path: str | None = None) -> Probe:
    """Platform and installed tools; cached for the life of the process."""
    if bwrap_path in _QUICK:
        return _QUICK[bwrap_path]
    plat = _platform()
    if plat in ("linux", "wsl2"):
        bwrap = which(bwrap_path or "bwrap")
        if bwrap:
            probe = Probe(
                plat,
                True,
                False,
                "native",
                "bubblewrap: namespace isolation, no kernel boundary",
                bwrap=bwrap,
            )
        else:
            probe = Probe(
                plat, False, True, "none", "bubblewrap is not installed", hint=INSTALL_HINT
            )
    elif plat == "macos":
        probe = Probe(
            plat,
            False,
            False,
            "none",
            "the macOS Seatbelt backend is not implemented in sandhold yet",
            hint="run sandhold on Linux, or use --backend none explicitly",
        )
    else:
        probe = Probe(
            plat, False, False, "none", "no OS-native sandbox is offered on this platform"
        )
    _QUICK[bwrap_path] = probe
    return probe


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def _supervisor_front() -> str:
    from sandhold.backends.linux.hostprobe import yama_ptrace_scope
    from sandhold.backends.linux.supervisor.front import compiled_front

    if compiled_front() is not None:
        return "yes (compiled front for the CLI and SandboxPort: scripts/setup built it)"
    scope = yama_ptrace_scope()
    if scope >= 1:
        return (
            f"yes (Python only: Yama ptrace_scope={scope} lets only an ancestor read a "
            "process's calls, and only the Python supervisor is the command's ancestor)"
        )
    return "yes (Python only: no compiled front; install gcc and rerun scripts/setup)"


def _landlock_abi() -> str:
    import ctypes  # probe only: ctypes costs start-up time

    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": 444, "aarch64": 444}.get(os.uname().machine)
    if nr is None:
        return "unknown (unsupported machine)"
    abi = libc.syscall(nr, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 0:
        return f"unavailable ({os.strerror(ctypes.get_errno())})"
    return str(abi)


def _trial_run(bwrap: str) -> str:
    import subprocess

    try:
        out = subprocess.run(
            [
                bwrap,
                "--unshare-all",
                "--unshare-user",
                "--disable-userns",
                "--die-with-parent",
                "--ro-bind",
                "/",
                "/",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "true",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"failed: {exc}"
    return "ok" if out.returncode == 0 else f"failed: {out.stderr.strip() or out.returncode}"


def full_probe(bwrap_path: str | None = None) -> Probe:
    """``quick_probe`` plus a trial sandbox and kernel features, for ``sandhold probe``."""
    probe = quick_probe(bwrap_path)
    if probe.platform not in ("linux", "wsl2"):
        return probe
    details: list[tuple[str, str]] = [("kernel", os.uname().release)]
    if probe.bwrap:
        import subprocess

        version = subprocess.run(
            [probe.bwrap, "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        details.append(("bubblewrap", f"{probe.bwrap} ({version})"))
        trial = _trial_run(probe.bwrap)
        details.append(("trial sandbox", trial))
        if trial != "ok":
            probe = replace(
                probe,
                available=False,
                default_backend="none",
                note=f"bubblewrap is installed but cannot create a sandbox: {trial}",
                hint="enable unprivileged user namespaces (sysctl "
                "kernel.unprivileged_userns_clone=1, or on Ubuntu "
                "kernel.apparmor_restrict_unprivileged_userns=0)",
            )
    details.append(("user namespaces", f"max {_read('/proc/sys/user/max_user_namespaces')}"))
    from sandhold.backends.linux.hostprobe import seccomp_actions, supervisor_blocker

    actions = seccomp_actions()
    details.append(("seccomp", "yes" if actions else "no"))
    notif = b"user_notif" in actions
    details.append(("seccomp user notification", "yes" if notif else "no"))

    blocker = supervisor_blocker() if notif else "no user notification"
    details.append(
        ("creation-time supervisor", _supervisor_front() if blocker is None else f"no: {blocker}")
    )
    from sandhold.backends.linux.supervisor.front import confining_front as front  # issue 14

    details.append(("compiled front", front() or f"missing: {FRONT_MISSING}"))
    details.append(("landlock ABI", _landlock_abi()))
    from sandhold.backends.linux.cgroups import probe as cgroup_probe

    cg = cgroup_probe()
    details.append(("cgroups", f"{cg.layout}; delegated to sandhold: {cg.base or 'no'}"))
    details.append(
        (
            "cgroup freezer",
            "yes (suspend freezes the tree)"
            if cg.freezer
            else "no: suspend stops each process with SIGSTOP instead",
        )
    )
    details.append(
        (
            "SandboxPort limits",
            f"{', '.join(cg.controllers)} via cgroup v2"
            if cg.controllers
            else "not delegated to sandhold (memory/pids/cpu limits unavailable): "
            + (cg.reason or "no controllers enabled for children"),
        )
    )
    from sandhold.backends.linux.cgroups import limit_facts
    from sandhold.policy.limits import choose

    facts = limit_facts()
    lines = choose(
        root=os.geteuid() == 0, processes=None, memory_mib=None, cgroups=facts
    ).describe()
    details.append(("CLI sandbox limits", "; ".join(lines)))
    return replace(probe, details=tuple(details))
