"""The ``sandhold`` command: parse the command line, then hand over. Nothing else.

Arguments are parsed by hand: argparse costs about 5 ms of a 35 ms start-up
budget, and the grammar is small (options, then ``--`` and a command, ``-c`` and
a shell string, or one quoted shell string).
"""

from __future__ import annotations

import os
import sys

import sandhold
from sandhold._record import record, replace
from sandhold.errors import SandholdError, UsageError, is_fd_number

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import NoReturn


SHELL = "/bin/sh"

HELP = """\
usage: sandhold [options] -- COMMAND [ARGS...]
       sandhold [options] -c 'SHELL COMMAND' [ARG0 ARGS...]
       sandhold [options] 'SHELL COMMAND'
       sandhold probe [--json]
       sandhold serve [--listen HOST:PORT] [--unix PATH] [--sandbox on|off]
                      [--state-dir DIR] [--add-client NAME]
                      (the agent sandbox server; see sandhold serve --help)
       sandhold proxy (--listen-fd N | --listen HOST:PORT) (--decider-fd N | ...)
                      (HTTP proxy only, decided by an external process;
                       see sandhold proxy --help)

Run a command with OS-level filesystem and network restrictions.

options:
  -s, --settings FILE  settings file (srt's format; default ~/.sandhold-settings.json,
                       built-in defaults when that does not exist)
  -d, --debug          report dropped variables, notes and every refusal on stderr
                       (without it, one line each names the first refused creation,
                       the refused hosts and the variables kept out)
  -q, --quiet          no such lines and notices (warnings and errors still show)
      --explain        print the effective policy (every mount and rule, and where
                       it came from) and exit without running anything
      --backend NAME   native (bubblewrap; the default where available) or none
                       (no isolation, environment still scrubbed)
      --inherit-env    pass the whole environment, credentials included (warned)
      --control-fd N   read new configs from fd N, one JSON object a line; the
                       network lists change live (the command never sees the fd)
      --violations FILE  append every network decision, refused file creation and
                         refused write to a read-only path to FILE as JSON lines
  -h, --help           show this help
      --version        show the version

examples:
  sandhold -- curl https://example.com        # argv form; network is off
  sandhold 'ls ~/.ssh && echo hi > x'         # one quoted string runs in /bin/sh
  sandhold -s ~/.srt-settings.json -- npm test
  sandhold --explain -s policy.json -- make   # what would be mounted, and why
  sandhold probe --json                        # what this host offers

exit status: the command's own; 128+N if signal N killed it; 2 for bad usage,
bad settings or a policy that cannot be enforced; 125 if the sandbox failed to
start; 127 if the command does not exist; 126 if it cannot be run or the policy
hides it.
"""


@record
class Options:
    command: tuple[str, ...] = ()
    settings: str | None = None
    debug: bool = False
    quiet: bool = False
    explain: bool = False
    backend: str | None = None
    inherit_env: bool = False
    control_fd: int | None = None
    violations: str | None = None
    probe: bool = False
    probe_json: bool = False
    proxy_args: tuple[str, ...] | None = None
    help: bool = False
    version: bool = False


_VALUE_OPTS = {
    "-s": "settings",
    "--settings": "settings",
    "--backend": "backend",
    "--control-fd": "control_fd",
    "--violations": "violations",
}
_FLAG_OPTS = {
    "-d": "debug",
    "--debug": "debug",
    "-q": "quiet",
    "--quiet": "quiet",
    "--explain": "explain",
    "--inherit-env": "inherit_env",
    "-h": "help",
    "--help": "help",
    "--version": "version",
}


def parse_args(args: Sequence[str]) -> Options:
    """Parse sandhold's arguments.

    Raises:
        UsageError: unknown option, missing value, or no command.
    """
    values: dict[str, object] = {}
    i = 0
    shell: str | None = None
    rest: list[str] = []
    dashdash = False
    while i < len(args):
        arg = args[i]
        if arg == "--":
            dashdash = True
            rest = list(args[i + 1 :])
            break
        if arg == "-c":
            if i + 1 >= len(args):
                raise UsageError("-c needs a shell command string")
            shell = args[i + 1]
            rest = list(args[i + 2 :])
            break
        name, eq, inline = arg.partition("=")
        if name in _VALUE_OPTS:
            if eq:
                value = inline
            elif i + 1 < len(args):
                i += 1
                value = args[i]
            else:
                raise UsageError(f"{arg} needs a value")
            key = _VALUE_OPTS[name]
            if key == "control_fd":
                if not is_fd_number(value):
                    raise UsageError(f"--control-fd needs a file descriptor number, got {value!r}")
                values[key] = int(value)
            else:
                values[key] = value
        elif arg in _FLAG_OPTS:
            values[_FLAG_OPTS[arg]] = True
        elif arg.startswith("-") and arg != "-":
            raise UsageError(f"unknown option {arg!r}{_did_you_mean(name)} (see sandhold --help)")
        else:
            rest = list(args[i:])
            break
        i += 1
    opts = Options(**values)  # type: ignore[arg-type]
    if opts.help or opts.version:
        return opts
    if shell is not None:
        return replace(opts, command=(SHELL, "-c", shell, *rest))
    if not dashdash and rest and rest[0] == "proxy":
        return replace(opts, proxy_args=tuple(rest[1:]))
    if not dashdash and rest and rest[0] == "probe":
        extra = rest[1:]
        if any(a != "--json" for a in extra):
            raise UsageError("usage: sandhold probe [--json]")
        return replace(opts, probe=True, probe_json=bool(extra))
    if not rest:
        raise UsageError("no command given (see sandhold --help)")
    if not dashdash and len(rest) == 1:
        # srt-style: one quoted string is a shell command line
        return replace(opts, command=(SHELL, "-c", rest[0]))
    return replace(opts, command=tuple(rest))


# other tools' spellings of what sandhold calls otherwise
_ALIASES = {
    "--verbose": "--debug",
    "-v": "--debug",
    "--silent": "--quiet",
    "--config": "--settings",
    "--dry-run": "--explain",
    "--env": "--inherit-env",
}


def _did_you_mean(name: str) -> str:
    """A "did you mean" for an unknown option (only on this error path: difflib's cost
    is no start-up's)."""
    import difflib

    if name in _ALIASES:
        return f"; did you mean {_ALIASES[name]}?"
    known = [*_VALUE_OPTS, *_FLAG_OPTS, "-c"]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if not close and not name.startswith("--"):  # -settings, -debug
        close = difflib.get_close_matches("-" + name, known, n=1, cutoff=0.8)
    return f"; did you mean {close[0]}?" if close else ""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sandhold`` command; returns the exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["serve"]:
        # the server's imports (uvicorn, FastAPI) load only here: the CLI never pays them
        from sandhold.server.main import main as serve

        return serve(args[1:])
    try:
        opts = parse_args(args)
        if opts.help:
            sys.stdout.write(HELP)
            return 0
        if opts.version:
            sys.stdout.write(f"sandhold {sandhold.__version__}\n")
            return 0
        if opts.probe:
            from sandhold.wrap import print_probe

            return print_probe(opts.probe_json, opts.settings)
        if opts.proxy_args is not None:
            from sandhold.net.proxy_mode import run_proxy

            return run_proxy(opts.proxy_args, debug=opts.debug)
        from sandhold.wrap import run

        return run(opts)
    except SandholdError as exc:
        sys.stderr.write(f"sandhold: {exc.render()}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def exit_with(code: int) -> NoReturn:
    """End the process with ``code`` without the interpreter's teardown (freeing
    every module and object: about 2 ms of each sandboxed command). By the time
    ``main`` returns, everything it made is closed and removed (its ``finally``
    blocks); only the standard streams may still hold output. Where one cannot be
    flushed, the ordinary exit reports it, as it always would."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    exit_with(main())
