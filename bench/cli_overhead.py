"""Measure what ``sandhold -- true`` costs in wall time next to bare bubblewrap and srt.

Every command runs ``true`` inside its sandbox, so what is timed is start-up and
tear-down: argument and settings parsing, planning, the bwrap launch and the exit.
The commands are warmed up, then run round-robin (one of each per round, the
starting point rotating) so that drift in the machine's load hits all of them
alike, and every ratio is taken against bare bwrap measured in the same run.

Rules:
- The run is a report: it exits 0 even when sandhold misses its budget. It exits 1
  when sandhold fails to run ``true`` at all (the exact command and its output are
  printed), and 2 when the bench cannot run here (no bwrap, no venv).
- srt and srt-py are optional. Without ``--install-references`` they are used only
  if already in ``bench/.scratch/`` or on PATH; a missing one gets a "not installed"
  row and one that cannot run ``true`` gets its failure reason, never a time.
- Nothing outside ``bench/.scratch/`` and ``bench/results/`` is written, except
  the packages ``--install-references`` installs with apt-get (socat, ripgrep).
- Only the standard library; sandhold itself is only ever run as a subprocess.

Usage: .venv/bin/python bench/cli_overhead.py [--rounds N] [--install-references]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SCRATCH = BENCH / ".scratch"
WORK = SCRATCH / "cli_overhead"
RESULTS = BENCH / "results"
VENV_BIN = REPO / ".venv" / "bin"
SANDHOLD = VENV_BIN / "sandhold"
VENV_PYTHON = VENV_BIN / "python"

SRT_NPM_PACKAGE = "@anthropic-ai/sandbox-runtime"
SRT_PYPI_PACKAGE = "sandbox-runtime"
SRT_NPM_PREFIX = SCRATCH / "npm"
SRT_BIN = SRT_NPM_PREFIX / "node_modules" / ".bin" / "srt"
SRT_PY_VENV = SCRATCH / "srt-py"
SRT_PY_BIN = SRT_PY_VENV / "bin" / "srt-py"
# srt refuses to start on Linux without these; the apt package that provides each.
SRT_HOST_TOOLS = {"bwrap": "bubblewrap", "socat": "socat", "rg": "ripgrep"}

BUDGET_MS = 35.0
NETWORK_BUDGET_MS = 80.0  # issue 3: with the network allowed (proxies up)
BUDGET_TEXT = (
    "sandhold <= 35 ms median on a 2-core machine (reference CLI ~320 ms, bare bwrap ~5 ms); "
    "with the network allowed (egress proxies up) <= 80 ms (srt ~320 ms)"
)
BARE_BWRAP = (
    "--unshare-all",
    "--unshare-user",
    "--disable-userns",
    "--die-with-parent",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "true",
)
# srt's settings shape with nothing allowed: what each reference gets as "default".
EMPTY_SRT_SETTINGS: dict[str, object] = {
    "network": {"allowedDomains": [], "deniedDomains": []},
    "filesystem": {"denyRead": [], "allowWrite": [], "denyWrite": []},
}
# The big project: how start-up grows with the tree in the writable roots, which
# sandhold walks whole for protected names (no budget: context).
BIG_DIRS = 2000
BIG_FILES_PER_DIR = 12
BIG_FILES = BIG_DIRS * BIG_FILES_PER_DIR
WARMUP = 3
DEFAULT_ROUNDS = 40
RUN_TIMEOUT_S = 120.0
IMPORTTIME_REPEATS = 5


@dataclass
class Case:
    """One command to time, and how to read its result."""

    name: str
    argv: tuple[str, ...]
    cwd: Path
    env: dict[str, str]
    kind: str  # "floor", "context", "sandhold" or "reference"
    budget_ms: float = 35.0  # sandhold rows only
    unavailable: str | None = None  # set: not run, this is shown instead of a time
    samples_ms: list[float] = field(default_factory=list)
    failures: int = 0
    reason: str | None = None  # the first failure, as "exit N: last stderr line"
    output: str = ""  # full output of the first failure, for sandhold's report

    @property
    def runnable(self) -> bool:
        return self.unavailable is None and self.reason is None


@dataclass
class Workspace:
    """The files the realistic case needs, all under ``WORK``."""

    empty_home: Path
    home: Path
    project: Path
    scratch: Path
    realistic: Path
    network: Path
    srt_default: Path
    big_project: Path
    big: Path


# --- setting up ----------------------------------------------------------------


def _log(message: str) -> None:
    sys.stderr.write(f"cli_overhead: {message}\n")
    sys.stderr.flush()


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _git_init(path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    subprocess.run(
        ["git", "init", "-q", str(path)],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def _make_project(project: Path) -> None:
    """A small Python project with a nested repo: a few dozen files, two .env files."""
    _write(project / "README.md", "# demo\n\nA project for the sandhold start-up bench.\n")
    _write(project / "pyproject.toml", '[project]\nname = "demo"\nversion = "0.1.0"\n')
    _write(project / ".gitignore", ".env\n__pycache__/\n")
    _write(project / ".env", "API_TOKEN=not-a-real-token\n")
    _write(project / "secrets" / "deploy.key", "not a real key\n")
    _write(project / "src" / "demo" / "__init__.py", '"""demo."""\n')
    for i in range(20):
        _write(project / "src" / "demo" / f"module_{i:02d}.py", f"VALUE = {i}\n")
    for i in range(8):
        _write(project / "tests" / f"test_{i:02d}.py", f"def test_{i}() -> None:\n    pass\n")
    for name in ("index", "usage", "design"):
        _write(project / "docs" / f"{name}.md", f"# {name}\n")
    vendor = project / "vendor" / "lib"
    _write(vendor / "README.md", "# vendored lib\n")
    _write(vendor / ".env", "LIB_TOKEN=not-a-real-token\n")
    for i in range(5):
        _write(vendor / "lib" / f"part_{i}.py", f"PART = {i}\n")
    _git_init(project)
    _git_init(vendor)


def _make_big_project(project: Path) -> None:
    """A project whose dependencies fill a tree as installs do: BIG_DIRS directories of
    BIG_FILES_PER_DIR files, one vendored package a git checkout with a .env."""
    _write(project / "package.json", '{"name": "big"}\n')
    modules = project / "node_modules"
    for a in range(BIG_DIRS // 40):
        for b in range(40):
            d = modules / f"pkg{a:02d}" / f"lib{b:02d}"
            d.mkdir(parents=True)
            for c in range(BIG_FILES_PER_DIR):
                (d / f"f{c:02d}.js").write_text("")
    _write(modules / "pkg00" / ".env", "TOKEN=not-a-real-token\n")
    _git_init(project)
    _git_init(modules / "pkg01")


def _prepare_workspace() -> Workspace:
    """Lay out fresh homes, the project, and both settings files under ``WORK``."""
    if WORK.exists():
        shutil.rmtree(WORK)
    home = WORK / "home"
    empty_home = WORK / "empty-home"
    empty_home.mkdir(parents=True)
    _write(home / ".ssh" / "id_ed25519", "not a real key\n")
    _write(home / ".aws" / "credentials", "[default]\naws_access_key_id = AKIAEXAMPLE\n")
    # ~/src is a denied region; the project inside it is read (and written) again.
    _write(home / "src" / "other-client" / "notes.txt", "private\n")
    project = home / "src" / "project"
    _make_project(project)
    scratch = WORK / "scratch"
    scratch.mkdir()
    realistic: dict[str, object] = {
        "filesystem": {
            "denyRead": ["~/.ssh", "~/.aws", "**/.env", "~/src"],
            "allowRead": ["~/src/project"],
            "allowWrite": ["~/src/project", str(scratch)],
            "denyWrite": ["~/src/project/secrets", "~/src/project/pyproject.toml"],
        },
        # The network stays off in this row (srt's shape needs both lists); the
        # budget for a run with egress proxies up is a separate row (80 ms).
        "network": {"allowedDomains": [], "deniedDomains": []},
    }
    settings = WORK / "settings"
    _write(settings / "realistic.json", json.dumps(realistic, indent=2) + "\n")
    network = dict(realistic)
    network["network"] = {
        "allowedDomains": ["github.com", "*.github.com", "pypi.org", "files.pythonhosted.org"],
        "deniedDomains": ["gist.github.com"],
    }
    _write(settings / "network.json", json.dumps(network, indent=2) + "\n")
    _write(settings / "srt-default.json", json.dumps(EMPTY_SRT_SETTINGS, indent=2) + "\n")
    big_project = home / "src" / "big"
    _make_big_project(big_project)
    big = json.loads(json.dumps(realistic))
    big["filesystem"]["allowRead"] = ["~/src/big"]
    big["filesystem"]["allowWrite"] = ["~/src/big", str(scratch)]
    big["filesystem"]["denyWrite"] = ["~/src/big/package.json"]
    _write(settings / "big.json", json.dumps(big, indent=2) + "\n")
    return Workspace(
        empty_home=empty_home,
        home=home,
        project=project,
        scratch=scratch,
        realistic=settings / "realistic.json",
        network=settings / "network.json",
        srt_default=settings / "srt-default.json",
        big_project=big_project,
        big=settings / "big.json",
    )


def _install(argv: list[str], log: list[str], env: dict[str, str] | None = None) -> bool:
    """Run one install command, logging it; False (and the reason) if it failed."""
    log.append(" ".join(argv))
    _log("installing: " + " ".join(argv))
    try:
        proc = subprocess.run(argv, env=env, check=False, capture_output=True, text=True)
    except OSError as exc:
        log.append(f"  failed: {exc}")
        return False
    if proc.returncode != 0:
        tail = _last_line(proc.stderr or proc.stdout)
        log.append(f"  failed: exit {proc.returncode}: {tail}")
        _log(f"  failed: exit {proc.returncode}: {tail}")
        return False
    return True


def _install_references() -> list[str]:
    """Install srt, srt-py and the host tools srt needs; return the commands run."""
    log: list[str] = []
    missing = sorted({pkg for tool, pkg in SRT_HOST_TOOLS.items() if not shutil.which(tool)})
    if missing:
        if os.geteuid() == 0 and shutil.which("apt-get"):
            apt_env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            if _install(["apt-get", "update", "-qq"], log, apt_env):
                install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends"]
                _install([*install, *missing], log, apt_env)
        else:
            log.append(f"not root or no apt-get: install {' '.join(missing)} by hand")
    SCRATCH.mkdir(parents=True, exist_ok=True)
    if shutil.which("npm"):
        npm = ["npm", "install", "--prefix", str(SRT_NPM_PREFIX), "--no-audit", "--no-fund"]
        _install([*npm, SRT_NPM_PACKAGE], log)
    else:
        log.append(f"npm not found: {SRT_NPM_PACKAGE} not installed")
    venv_ok = (SRT_PY_VENV / "bin" / "python").exists() or _install(
        [sys.executable, "-m", "venv", str(SRT_PY_VENV)], log
    )
    if venv_ok:
        pip = [str(SRT_PY_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
        _install([*pip, "--disable-pip-version-check", SRT_PYPI_PACKAGE], log)
    return log


def _find(scratch_bin: Path, name: str) -> str | None:
    if os.access(scratch_bin, os.X_OK):
        return str(scratch_bin)
    return shutil.which(name)


def _version(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    text = (proc.stdout or proc.stderr).strip()
    return text.splitlines()[0] if text else f"unknown (exit {proc.returncode})"


def _env(home: Path) -> dict[str, str]:
    """A small, fixed environment: the same for every command, HOME set per case."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
    }
    for name in ("USER", "LOGNAME"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _build_cases(ws: Workspace, bwrap: str) -> tuple[list[Case], dict[str, str]]:
    """Every row of the table, in display order, and the reference versions found."""
    default_env = _env(ws.empty_home)
    real_env = _env(ws.home)
    cases = [
        Case("bare bwrap (floor)", (bwrap, *BARE_BWRAP), ws.empty_home, default_env, "floor"),
        Case(
            "python -c pass (venv interpreter start)",
            (str(VENV_PYTHON), "-c", "pass"),
            ws.empty_home,
            default_env,
            "context",
        ),
        Case(
            "sandhold -- true (default settings)",
            (str(SANDHOLD), "--", "true"),
            ws.empty_home,
            default_env,
            "sandhold",
        ),
        Case(
            "sandhold -s realistic.json -- true",
            (str(SANDHOLD), "-s", str(ws.realistic), "--", "true"),
            ws.project,
            real_env,
            "sandhold",
        ),
        Case(
            "sandhold -s network.json -- true (egress proxies up)",
            (str(SANDHOLD), "-s", str(ws.network), "--", "true"),
            ws.project,
            real_env,
            "sandhold",
            budget_ms=NETWORK_BUDGET_MS,
        ),
        Case(
            f"sandhold -s big.json -- true ({BIG_FILES:,}-file node_modules)",
            (str(SANDHOLD), "-s", str(ws.big), "--", "true"),
            ws.big_project,
            real_env,
            "context",
        ),
    ]
    versions: dict[str, str] = {}
    refs = (
        ("srt", _find(SRT_BIN, "srt"), f"npm {SRT_NPM_PACKAGE}"),
        ("srt-py", _find(SRT_PY_BIN, "srt-py"), f"PyPI {SRT_PYPI_PACKAGE}"),
    )
    for name, exe, origin in refs:
        missing = None if exe else f"not installed ({origin}; see --install-references)"
        if exe:
            versions[name] = f"{_version([exe, '--version'])} at {exe}"
        cmd = exe or name
        runs = (
            ("-s empty.json true (default settings)", ws.srt_default, ws.empty_home, default_env),
            ("-s realistic.json true", ws.realistic, ws.project, real_env),
            (
                f"-s big.json true ({BIG_FILES:,}-file node_modules)",
                ws.big,
                ws.big_project,
                real_env,
            ),
        )
        cases += [
            Case(
                f"{name} {label}",
                (cmd, "-s", str(settings), "true"),
                cwd,
                env,
                "reference",
                unavailable=missing,
            )
            for label, settings, cwd, env in runs
        ]
    return cases, versions


# --- measuring -----------------------------------------------------------------


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:160] if lines else "(no output)"


def _diagnose(case: Case) -> None:
    """Run a failing case once more with its output captured, to say why it failed."""
    try:
        proc = subprocess.run(
            case.argv,
            cwd=case.cwd,
            env=case.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        case.reason = f"timed out after {RUN_TIMEOUT_S:.0f} s"
        return
    except OSError as exc:
        case.reason = str(exc)
        return
    case.output = proc.stdout + proc.stderr
    if proc.returncode == 0:
        case.reason = "failed once, then passed when run again"
    else:
        case.reason = f"exit {proc.returncode}: {_last_line(proc.stderr or proc.stdout)}"


class _Hung(Exception):
    """Raised by the SIGALRM watchdog in the middle of a timed run."""


def _on_alarm(_signum: int, _frame: object) -> None:
    raise _Hung


def _time_once(case: Case) -> float | None:
    """Wall time of one run in ms, or None (counted as a failure) if it did not exit 0.

    No ``timeout=``: with one, ``Popen.wait`` polls with sleeps doubling from
    0.5 ms to 50 ms, which rounds every time up to 32, 64, 114, 164... ms. A
    SIGALRM watchdog (armed outside the timed span) stops a hung command instead;
    ``subprocess.run`` kills the child when the alarm's exception reaches it.
    """
    signal.setitimer(signal.ITIMER_REAL, RUN_TIMEOUT_S)
    try:
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                case.argv,
                cwd=case.cwd,
                env=case.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )
        except (OSError, _Hung):
            ok = False
        else:
            ok = proc.returncode == 0
        elapsed_ms = (time.perf_counter() - start) * 1000.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if ok:
        return elapsed_ms
    case.failures += 1
    if case.reason is None:
        _diagnose(case)
    return None


def _measure(cases: list[Case], rounds: int) -> None:
    for case in cases:
        if case.unavailable is not None:
            continue
        for _ in range(WARMUP):
            if _time_once(case) is None:
                _log(f"{case.name}: {case.reason} (dropped from the rounds)")
                break
    active = [c for c in cases if c.runnable]
    for r in range(rounds):
        shift = r % len(active) if active else 0
        for case in active[shift:] + active[:shift]:
            elapsed = _time_once(case)
            if elapsed is not None:
                case.samples_ms.append(elapsed)
        if (r + 1) % 10 == 0 or r + 1 == rounds:
            _log(f"round {r + 1}/{rounds}")


def _stats(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    if len(samples) == 1:
        return {"median": samples[0], "p10": samples[0], "p90": samples[0]}
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    return {"median": statistics.median(samples), "p10": deciles[0], "p90": deciles[8]}


# --- import cost ---------------------------------------------------------------


def _importtime(argv: list[str], env: dict[str, str], cwd: Path) -> list[tuple[int, int, str]]:
    """``-X importtime`` rows as (nesting level, cumulative us, module name)."""
    proc = subprocess.run(
        [str(VENV_PYTHON), "-X", "importtime", *argv],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {_last_line(proc.stderr)}")
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "imported package" in line:
            continue
        _, cumulative, name = line[len("import time:") :].split("|", 2)
        level = (len(name) - len(name.lstrip(" ")) - 1) // 2
        rows.append((level, int(cumulative), name.strip()))
    return rows


def _import_cost(argv: list[str], env: dict[str, str], cwd: Path) -> dict[str, object]:
    """Modules loaded and time spent importing them, beyond interpreter start-up.

    Runs each command ``IMPORTTIME_REPEATS`` times and keeps the median total.
    """
    baseline = {name for _, _, name in _importtime(["-c", "pass"], env, cwd)}
    totals: list[int] = []
    rows: list[tuple[int, int, str]] = []
    for _ in range(IMPORTTIME_REPEATS):
        rows = [r for r in _importtime(argv, env, cwd) if r[2] not in baseline]
        totals.append(sum(cum for level, cum, _ in rows if level == 0))
    heaviest = sorted(
        (r for r in rows if r[2] not in ("sandhold", "sandhold.cli")),
        key=lambda r: r[1],
        reverse=True,
    )[:5]
    return {
        "command": "python -X importtime " + " ".join(argv),
        "modules": len(rows),
        "total_ms": statistics.median(totals) / 1000.0,
        "heaviest_ms": {name: cum / 1000.0 for _, cum, name in heaviest},
    }


# --- reporting -----------------------------------------------------------------


def _machine(bwrap: str, versions: dict[str, str]) -> dict[str, str]:
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "src"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    info = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "kernel": platform.release(),
        "nproc": str(len(os.sched_getaffinity(0))),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "bwrap": _version([bwrap, "--version"]),
        "sandhold": f"{REPO.name}@{commit or '?'}" + (" (src/ modified)" if dirty else ""),
        # the realistic rows need the creation-time supervisor: which front starts it
        "supervisor front": "sandhold-exec (compiled)"
        if os.access(REPO / "src/sandhold/_helper/sandhold-exec", os.X_OK)
        else "Python runner (no compiled helper)",
    }
    node = shutil.which("node")
    if node:
        info["node"] = _version([node, "--version"])
    info.update(versions)
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _verdict(case: Case, median: float | None) -> str:
    if case.unavailable is not None:
        return case.unavailable
    if median is None:
        return f"failed: {case.reason}" if case.reason else "not measured"
    note = ""
    if case.failures:
        note = f"; {case.failures} failed runs, first: {case.reason}"
    if case.kind == "sandhold":
        verdict = "PASS" if median <= case.budget_ms else "FAIL"
        return f"{verdict} (budget {case.budget_ms:.0f} ms){note}"
    return {"floor": "floor", "context": "context", "reference": "reference"}[case.kind] + note


def _render(
    cases: list[Case],
    machine: dict[str, str],
    rounds: int,
    imports: list[dict[str, object]],
    install_log: list[str],
) -> str:
    floor = _stats(cases[0].samples_ms).get("median")
    lines = [
        "# sandhold CLI start-up overhead",
        "",
        f"Run by `bench/cli_overhead.py` on {machine['date']}: {WARMUP} warm-up runs each, "
        f"then {rounds} interleaved rounds; wall time of `subprocess.run` in ms.",
        "",
        "- " + "; ".join(f"{k}: {v}" for k, v in machine.items() if k != "date"),
        f"- budget (from the issue): {BUDGET_TEXT}",
        "",
        "| command | n | median | p10 | p90 | x bwrap | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for case in cases:
        st = _stats(case.samples_ms)
        median = st.get("median")
        if median is None:
            nums = ["-", "-", "-", "-"]
        else:
            ratio = f"{median / floor:.1f}" if floor else "-"
            nums = [f"{st['median']:.1f}", f"{st['p10']:.1f}", f"{st['p90']:.1f}", ratio]
        row = [case.name, str(len(case.samples_ms)), *nums, _verdict(case, median)]
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    lines.append("")
    for cost in imports:
        heaviest = cost["heaviest_ms"]
        assert isinstance(heaviest, dict)
        top = ", ".join(f"{name} {ms:.1f}" for name, ms in heaviest.items())
        lines.append(
            f"- `{cost['command']}`: {cost['modules']} modules beyond interpreter start-up, "
            f"{cost['total_ms']:.1f} ms (median of {IMPORTTIME_REPEATS}); "
            f"heaviest (cumulative ms): {top}"
        )
    lines.append("")
    lines.append(
        "Default rows run with HOME and cwd an empty directory (no settings file); "
        "realistic rows with HOME a fake home and cwd the git project in it. "
        "References get srt's settings shape with nothing allowed "
        f"(`{json.dumps(EMPTY_SRT_SETTINGS, separators=(',', ':'))}`) or the same "
        "realistic.json. big.json is realistic.json for a second project in the same "
        f"home, `~/src/big`, whose `node_modules` holds {BIG_FILES:,} files in "
        f"{BIG_DIRS:,} directories (one package a git checkout, one with a `.env`): "
        "sandhold walks every writable root whole for protected names, so this row "
        "shows how start-up grows with the tree (context, no budget). "
        "Commands and raw samples: `cli_overhead.json`."
    )
    if install_log:
        lines.append("")
        lines.append("Installed with `--install-references`:")
        lines.extend(f"- `{entry}`" for entry in install_log)
    return "\n".join(lines) + "\n"


def _to_json(
    cases: list[Case],
    machine: dict[str, str],
    rounds: int,
    imports: list[dict[str, object]],
    install_log: list[str],
) -> dict[str, object]:
    floor = _stats(cases[0].samples_ms).get("median")
    rows = []
    for case in cases:
        st = _stats(case.samples_ms)
        median = st.get("median")
        rows.append(
            {
                "name": case.name,
                "kind": case.kind,
                "argv": list(case.argv),
                "cwd": str(case.cwd),
                "home": case.env["HOME"],
                "n": len(case.samples_ms),
                "failures": case.failures,
                "unavailable": case.unavailable,
                "failure_reason": case.reason,
                "stats_ms": st,
                "ratio_to_bwrap": median / floor if median is not None and floor else None,
                "verdict": _verdict(case, median),
                "samples_ms": [round(s, 3) for s in case.samples_ms],
            }
        )
    return {
        "machine": machine,
        "method": {"warmup": WARMUP, "rounds": rounds, "timer": "time.perf_counter"},
        "budget": {"text": BUDGET_TEXT, "sandhold_median_ms": BUDGET_MS},
        "rows": rows,
        "imports": imports,
        "install_log": install_log,
    }


# --- main ----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--rounds", type=int, default=DEFAULT_ROUNDS, help="interleaved rounds (default 40)"
    )
    parser.add_argument(
        "--install-references",
        action="store_true",
        help="install srt (npm), srt-py (PyPI) and socat/ripgrep (apt) into bench/.scratch/",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        _log("bwrap not found: install bubblewrap first (scripts/setup)")
        return 2
    if not (os.access(SANDHOLD, os.X_OK) and os.access(VENV_PYTHON, os.X_OK)):
        _log(f"{SANDHOLD} not found: run scripts/setup --test first")
        return 2

    signal.signal(signal.SIGALRM, _on_alarm)
    install_log = _install_references() if args.install_references else []
    ws = _prepare_workspace()
    cases, versions = _build_cases(ws, bwrap)
    _measure(cases, args.rounds)
    imports = []
    for cmd, cost_env, cost_cwd in (
        (["-c", "import sandhold.cli"], _env(ws.empty_home), ws.empty_home),
        ([str(SANDHOLD), "--", "true"], _env(ws.empty_home), ws.empty_home),
    ):
        try:
            imports.append(_import_cost(cmd, cost_env, cost_cwd))
        except RuntimeError as exc:
            _log(f"python -X importtime {' '.join(cmd)} failed: {exc}")
    machine = _machine(bwrap, versions)

    RESULTS.mkdir(parents=True, exist_ok=True)
    report = _render(cases, machine, args.rounds, imports, install_log)
    (RESULTS / "cli_overhead.md").write_text(report)
    data = _to_json(cases, machine, args.rounds, imports, install_log)
    (RESULTS / "cli_overhead.json").write_text(json.dumps(data, indent=2) + "\n")
    sys.stdout.write(report)

    broken = [c for c in cases if c.kind == "sandhold" and (c.reason or not c.samples_ms)]
    for case in broken:
        sys.stdout.write(
            f"\nsandhold failed ({case.reason}): cd {shlex.quote(str(case.cwd))} && "
            f"env -i {shlex.join(f'{k}={v}' for k, v in case.env.items())} "
            f"{shlex.join(case.argv)}\n{case.output}"
        )
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
