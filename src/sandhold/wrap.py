"""The CLI's pipeline, once the command line is parsed: settings → plan → backend → report.

Rules: this module gathers host facts (the home, the working directory, the
kernel's offers, the session's private directory) and hands them to the pure plan
(``policy/cliplan.py``), then hands the plan to a backend (``backends/linux/native``
or ``backends/none``) and reports what it refused. It decides nothing itself: the
backend is ``policy.backend``'s choice, every rule is the plan's.
"""

from __future__ import annotations

import os
import sys

from sandhold.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TextIO

    from sandhold.cli import Options
    from sandhold.policy.cliplan import LaunchPlan
    from sandhold.policy.limits import CgroupFacts
    from sandhold.settings import Settings


def _home() -> str:
    home = os.environ.get("HOME")
    if home and home.startswith("/"):
        return home.rstrip("/") or "/"
    import pwd

    return pwd.getpwuid(os.getuid()).pw_dir


def choose_backend(requested: str | None, settings: Settings) -> tuple[str, str | None]:
    """The backend to use and, for native, the bwrap executable (``policy.backend``).

    Raises:
        BackendUnavailable: the requested (or only sensible) backend is not here.
        UsageError: an unknown backend name.
    """
    from sandhold.policy.backend import choose_backend as choose
    from sandhold.probe import quick_probe

    if requested == "none":  # no probe: nothing to ask the host
        return "none", None
    choice = choose(requested, quick_probe(settings.bwrap_path))
    return choice.backend, choice.bwrap


def _check_command(plan: LaunchPlan) -> tuple[int, str] | str:
    """The executable to run, or (exit status, message) when a shell would refuse it.

    127: nothing of that name; 126: it exists but cannot be run, or the policy
    hides it from the sandbox.
    """
    from sandhold.probe import find_command

    name = plan.command[0]
    path = find_command(name, dict(plan.environment).get("PATH", "/usr/bin:/bin"))
    if path is None:
        return 127, f"{name}: command not found"
    if plan.fs is not None:
        from sandhold.policy.fsplan import hidden_by

        cover = hidden_by(plan.fs, os.path.realpath(os.path.join(plan.cwd, path)))
        if cover is not None:
            return 126, f"{name}: permission denied: hidden by {cover.reason}"
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        return 126, f"{name}: permission denied (not an executable file)"
    return path


def print_probe(as_json: bool, settings_path: str | None) -> int:
    from sandhold.probe import full_probe

    bwrap_path = None
    if settings_path:
        from sandhold.settings import load_settings

        bwrap_path = load_settings(settings_path, _home()).bwrap_path
    probe = full_probe(bwrap_path)
    if as_json:
        import json

        data = {
            "platform": probe.platform,
            "available": probe.available,
            "requires_install": probe.requires_install,
            "default_backend": probe.default_backend,
            "note": probe.note,
            "hint": probe.hint,
            "bwrap": probe.bwrap,
            "details": dict(probe.details),
        }
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        state = "available" if probe.available else "not available"
        lines = [f"native sandbox: {state} on {probe.platform} — {probe.note}"]
        if probe.hint:
            lines.append(f"hint: {probe.hint}")
        lines.extend(f"{k}: {v}" for k, v in probe.details)
        sys.stdout.write("\n".join(lines) + "\n")
    return 0


def run(opts: Options) -> int:
    """Wrap ``opts.command``: settings, plan, backend, report; returns the exit status."""
    from sandhold.settings import load_settings

    _check_control_fd(opts.control_fd)
    if not opts.explain:
        from sandhold.backends.linux.cgroups import warm_moves

        warm_moves()  # as early as can be: it overlaps reading the settings and the plan
    home = _home()
    settings = load_settings(opts.settings, home)
    backend, bwrap = choose_backend(opts.backend, settings)
    from sandhold.backends.linux.hostfs import OsHostView
    from sandhold.backends.linux.session import open_session, private_base
    from sandhold.policy.cliplan import LaunchRequest, plan_launch

    cwd = os.getcwd()
    from sandhold.backends.linux.hostprobe import supervisor_blocker

    blocker = supervisor_blocker() if backend == "native" else None
    supervised = backend == "native" and blocker is None
    session = None
    helper = None
    if backend == "native" and not opts.explain:
        session = open_session()
        tmpdir, private_root = session.tmpdir, session.base
        if supervised:
            from sandhold.backends.linux.native import exec_helper

            helper = exec_helper(private_root)
    else:
        private_root = private_base()
        tmpdir = f"{private_root}/<session>/tmp"
    # Opened before planning, so that the plan finds it and keeps it in place: the file
    # may lie in a writable root, and a name opened later could be a symlink the
    # sandbox put there, or gone
    violations = None
    try:
        if opts.violations is not None and not opts.explain:
            violations = _open_violations(opts.violations)
        plan = plan_launch(
            LaunchRequest(
                command=opts.command,
                cwd=cwd,
                home=home,
                environ=tuple(os.environ.items()),
                settings=settings,
                backend=backend,
                tmpdir=tmpdir,
                private_root=private_root,
                inherit_env=opts.inherit_env,
                egress_wanted=opts.control_fd is not None or opts.violations is not None,
                record_writes=opts.violations is not None,
                supervisor=supervised,
                **({"supervisor_blocker": blocker} if blocker is not None else {}),
                runner_paths=(
                    (*_runner_paths(), *((helper.python,) if helper is not None else ()))
                    if backend == "native"
                    else ()
                ),
                code_paths=_code_paths(),
                host_files=_host_files(settings.source, opts.violations),
                kernel_mounts=_kernel_mounts() if backend == "native" else (),
                root=os.geteuid() == 0,
                cgroups=_limit_facts() if backend == "native" else None,
                package_cache=(
                    _package_cache(private_root, opts.explain) if backend == "native" else ""
                ),
                entropy=os.urandom,
                masked_file_texts=_masked_file_texts(settings, cwd, home),
            ),
            OsHostView(),
        )
        if opts.explain:
            from sandhold.explain import render_plan

            sys.stdout.write(render_plan(plan))
            return 0
        _report(plan, opts.debug)
        if not opts.quiet:
            _notices(plan, settings, home, opts.debug)
        exe = _check_command(plan)
        if isinstance(exe, tuple):
            sys.stderr.write(f"sandhold: {exe[1]}\n")
            return exe[0]
        if backend == "none":
            from sandhold.backends.none import run_none

            return run_none(plan, exe)
        from sandhold.backends.linux.native import run_native

        assert session is not None and bwrap is not None
        egress = None
        refused: list[dict[str, object]] = []
        lookups: list[str] = []
        try:
            if plan.egress is not None:
                from sandhold.net.egress_runner import EgressRunner

                egress = EgressRunner(
                    plan.egress,
                    settings.filesystem,
                    control_fd=opts.control_fd,
                    violations=violations,
                    launch_network=settings.network,
                )
            return run_native(
                plan,
                session,
                bwrap,
                egress=egress,
                on_refused=refused.extend,
                helper=helper,
                on_lookups=lookups.extend,
            )
        finally:
            if egress is not None and opts.debug:
                sys.stderr.write(f"sandhold: {egress.summary()}\n")
            elif egress is not None and not opts.quiet:
                line = egress.refusal_line()
                if line is not None:
                    sys.stderr.write(f"sandhold: {line}\n")
            if lookups and not opts.quiet:
                from sandhold.policy.domains import offline_lookup_line

                sys.stderr.write(f"sandhold: {offline_lookup_line(lookups)}\n")
            if refused and not opts.quiet:
                _report_refused(refused, violations, opts.debug, cwd)
            if plan.config_copies:
                from sandhold.gitapply import apply_changes

                def say(line: str) -> None:
                    if not opts.quiet:
                        sys.stderr.write(f"sandhold: {line}\n")

                apply_changes(plan.config_copies, session.path, settings.git_allow_config, say)
    finally:
        if violations is not None:
            violations.close()
        if session is not None:
            session.close()


def _package_cache(private_root: str, explain: bool) -> str:
    """The package managers' cache of sandboxed runs (``cliplan.PACKAGE_CACHES``):
    ``pkg-cache`` in sandhold's private base (``$TMPDIR/sandhold-<uid>``, mode 0700,
    hidden from every sandbox but through this bind), made mode 0700 when missing;
    "" when it cannot be used, said on stderr (the run goes on with per-run caches).
    It must be a directory of this user's, not a symlink: what is bound writable into
    the sandbox is exactly it."""
    import stat

    path = f"{private_root}/pkg-cache"
    if explain:
        return path
    try:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(f"{path} is not a directory of uid {os.geteuid()} (a symlink?)")
        if st.st_mode & 0o077:
            os.chmod(path, 0o700)
    except OSError as exc:  # not used: per-run caches, which weakens no rule
        sys.stderr.write(f"sandhold: warning: package cache not used: {exc}\n")
        return ""
    return path


def _masked_file_texts(
    settings: Settings, cwd: str, home: str
) -> tuple[tuple[str, str | None], ...]:
    """Read each masked credential file for the plan to mask (the I/O edge,
    ``hostfs.read_masked_file``)."""
    from sandhold.backends.linux.hostfs import read_masked_file
    from sandhold.policy import paths

    out: list[tuple[str, str | None]] = []
    for src in settings.credentials.masked:
        if src.kind == "file":
            path = paths.absolute(src.target, cwd, home)
            out.append((path, read_masked_file(path)))
    return tuple(out)


def _host_files(settings_source: str, violations: str | None) -> tuple[tuple[str, str], ...]:
    from sandhold.settings import DEFAULTS_SOURCE

    files = []
    if settings_source != DEFAULTS_SOURCE:
        files.append((os.path.abspath(settings_source), "sandhold: this run's settings file"))
    if violations is not None:
        files.append((os.path.abspath(violations), "sandhold: this run's --violations file"))
    return tuple(files)


def _open_violations(path: str) -> TextIO:
    """The ``--violations`` file, for appending: a regular file with one name, never
    reached through a symlink (an earlier sandbox may have left one there)."""
    import stat

    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        import errno

        why = "a symlink (refused)" if exc.errno == errno.ELOOP else exc.strerror
        raise UsageError(f"--violations {path}: {why}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise UsageError(f"--violations {path}: not a regular file with a single name")
    os.set_blocking(fd, True)
    return open(fd, "a", encoding="utf-8")


def _kernel_mounts() -> tuple[tuple[str, str], ...]:
    from sandhold.backends.linux.hostfs import kernel_mounts

    try:
        return kernel_mounts()
    except OSError as exc:  # no mount table: what the view shows cannot be told
        raise UsageError(f"cannot read /proc/self/mountinfo: {exc.strerror}") from None


def _limit_facts() -> CgroupFacts:
    from sandhold.backends.linux.cgroups import limit_facts

    return limit_facts()


def _code_paths() -> tuple[str, ...]:
    from sandhold.backends.linux.native import own_code_paths

    return own_code_paths()


def _runner_paths() -> tuple[str, ...]:
    """The interpreter installation and the sandhold package, which the front in the
    sandbox runs from (the Landlock front or the supervisor's runner)."""
    from sandhold.backends.linux.native import runner_paths

    python, package_parent = runner_paths()
    prefix = os.path.dirname(os.path.dirname(python))
    return (prefix, f"{package_parent}/sandhold")


def _report_refused(
    refused: list[dict[str, object]], violations: TextIO | None, debug: bool, cwd: str = "/"
) -> None:
    """The supervisor's refusals: into the ``--violations`` file, summed up with
    ``--debug``; without it, one line on the first refused creation, since the
    command itself often says only "Permission denied", or nothing."""
    if violations is not None:
        import json

        violations.writelines(json.dumps(entry) + "\n" for entry in refused)
    made = [e for e in refused if e.get("action") in ("file-write-create", "unix-socket-connect")]
    if made and not debug:
        first = made[0]
        target = str(first.get("target"))
        if target.startswith(cwd.rstrip("/") + "/"):  # as the command spelled it, mostly
            target = target[len(cwd.rstrip("/")) + 1 :]
        more = f" (and {len(made) - 1} more)" if len(made) > 1 else ""
        reason = str(first.get("rule") or first.get("reason") or "the policy")[:400]
        # the setting a refusal names, spelled as the target is: relative to here
        reason = reason.replace(f'"{cwd.rstrip("/")}/', '"./')
        sys.stderr.write(f"sandhold: refused {target}{more}: {reason} (-d lists every refusal)\n")
    if debug:
        for action, what in (
            ("file-write-create", "file creation(s)"),
            ("file-write-readonly", "write(s) to read-only paths"),
            ("unix-socket-connect", "unix socket connect(s)"),
        ):
            these = [e for e in refused if e.get("action") == action]
            if these:
                names = sorted({str(e.get("target")) for e in these})
                more = f" and {len(names) - 5} more" if len(names) > 5 else ""
                shown = ", ".join(names[:5]) + more
                sys.stderr.write(f"sandhold: refused {len(these)} {what}: {shown}\n")


def _notices(plan: LaunchPlan, settings: Settings, home: str, debug: bool) -> None:
    """The default lines of a run (issue 15; ``-q`` silences them): the variables kept
    out (``--debug`` lists them with reasons instead), and an srt settings file that is
    not read."""
    from sandhold.policy.env import kept_out_line
    from sandhold.settings import DEFAULTS_SOURCE

    line = None if debug else kept_out_line(plan.env)
    if line is not None:
        sys.stderr.write(f"sandhold: {line}\n")
    srt = f"{home.rstrip('/')}/.srt-settings.json"
    if settings.source == DEFAULTS_SOURCE and os.path.exists(srt):
        sys.stderr.write(
            f"sandhold: note: {srt} is not read (sandhold reads ~/.sandhold-settings.json, "
            f"absent here, so the built-in defaults apply); use it with -s {srt}\n"
        )


def _check_control_fd(fd: int | None) -> None:
    if fd is None:
        return
    if fd <= 2:
        raise UsageError(f"--control-fd {fd} is standard input/output/error")
    try:
        os.fstat(fd)
    except OSError:
        raise UsageError(f"--control-fd {fd} is not an open file descriptor") from None


def _report(plan: LaunchPlan, debug: bool) -> None:
    for warning in plan.warnings:
        sys.stderr.write(f"sandhold: warning: {warning}\n")
    if debug:
        from sandhold.explain import render_dropped_env

        sys.stderr.write(render_dropped_env(plan))
        for note in plan.notes:
            sys.stderr.write(f"sandhold: note: {note}\n")
        if plan.fs is not None:
            sys.stderr.write(
                f"sandhold: {len(plan.fs.mounts)} mounts, creation-time supervisor "
                f"{'on' if plan.creation is not None else 'not needed'} (see --explain)\n"
            )
