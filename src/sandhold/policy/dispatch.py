"""Dispatch: what sandbox a server run gets, decided from the request and the boot probe.

Rules:
- A run's only writable bind is its own checkout (made by the server under its
  state dir). In ``chat`` it is writable; ``review``, ``plan`` and
  ``orchestrate`` make it read-only (as every bind of those modes is).
- Every registered checkout of the workspace is bound read-only (the run's
  clone borrows its objects) and is a protected path: never writable, in any
  mode, whatever else is bound.
- Network: ``allow`` is the baseline, GitHub and the run's ``egress_allowlist``,
  everything else refused; ``ask`` is the same lists, and a target none of them
  decides is put to the client; ``deny`` is no network at all (the proxies stay
  up, refusing). ``deny`` with a non-empty ``egress_allowlist`` is an error (the
  list would mean nothing).
- ``push`` defaults to ``deny``; ``push: allow`` outside ``chat`` is an error.
- Backend: no request, or a request for ``native``, gives ``native`` when the
  boot probe found it and the sandbox switch is on; no request gives ``none``
  otherwise (scrubbed environment, shown as such). An explicit ``native`` that
  the host or the switch cannot give, and any ``microvm`` (there is no microVM
  backend), are refused: nothing ever runs natively under another name.
- The repo of a run is one of the workspace's paths, as registered; the default
  is the first.

Everything here is a plain function over data: the server does the I/O.
"""

from __future__ import annotations

from sandhold._record import record

MODES = ("chat", "review", "plan", "orchestrate")
NETWORKS = ("allow", "ask", "deny")
BACKENDS = ("native", "none", "microvm")


class DispatchError(Exception):
    """A run request that cannot be honoured: ``code`` for clients, ``message`` for people."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


@record
class RunRequest:
    """A run as a client asked for it (types already checked)."""

    mode: str
    network: str
    repo: str | None = None
    backend: str | None = None
    egress_allowlist: tuple[str, ...] = ()
    push: str = "deny"


@record
class HostOffer:
    """What the boot probe found, and the sandbox switch."""

    native_available: bool
    native_note: str
    native_hint: str = ""
    switch: str = "on"  # "on" or "off" (``--sandbox`` / ``SANDHOLD_SANDBOX``)


@record
class RunPlan:
    """The sandbox a run gets (``plan_run``)."""

    backend: str  # "native" or "none"
    repo: str  # the registered checkout the run's own checkout is cloned from
    checkout_writable: bool
    read_only_binds: tuple[str, ...]  # the registered checkouts
    protected_paths: tuple[str, ...]
    network_enabled: bool
    egress_allowlist: tuple[str, ...]
    ask: bool
    push: bool


def choose_run_backend(requested: str | None, offer: HostOffer) -> str:
    """``native`` or ``none`` for a run (rules in the module doc).

    Raises:
        DispatchError: the explicit backend cannot be given here.
    """
    if requested == "microvm":
        raise DispatchError(
            "backend_unavailable",
            "backend 'microvm' is not offered: sandhold has no microVM backend yet "
            "(ask for 'native' or 'none', or leave 'backend' out)",
        )
    if requested == "native":
        if offer.switch == "off":
            raise DispatchError(
                "backend_unavailable",
                "backend 'native' was asked for, but the server runs with the agent "
                "sandbox DISABLED (--sandbox off / SANDHOLD_SANDBOX=off)",
            )
        if not offer.native_available:
            hint = f"; {offer.native_hint}" if offer.native_hint else ""
            raise DispatchError(
                "backend_unavailable",
                f"backend 'native' is not available on this host: {offer.native_note}{hint}",
            )
        return "native"
    if requested == "none":
        return "none"
    if requested is not None:
        raise DispatchError(
            "invalid_body", f"backend must be one of {', '.join(BACKENDS)}, not {requested!r}"
        )
    return "native" if offer.native_available and offer.switch == "on" else "none"


def plan_run(request: RunRequest, repos: tuple[str, ...], offer: HostOffer) -> RunPlan:
    """The plan of a run in a workspace whose registered checkouts are ``repos``.

    Raises:
        DispatchError: the request contradicts itself, names a repo the
            workspace does not have, or asks for a backend the host cannot give.
    """
    if request.mode not in MODES:
        raise DispatchError("invalid_body", f"mode must be one of {', '.join(MODES)}")
    if request.network not in NETWORKS:
        raise DispatchError("invalid_body", f"network must be one of {', '.join(NETWORKS)}")
    if request.push not in ("allow", "deny"):
        raise DispatchError("invalid_body", "push must be 'allow' or 'deny'")
    if not repos:
        raise DispatchError("invalid_body", "the workspace has no repository")
    repo = repos[0] if request.repo is None else request.repo
    if repo not in repos:
        raise DispatchError(
            "unknown_repo",
            f"repo {request.repo!r} is not one of the workspace's repositories "
            f"({', '.join(repos)}); name one exactly as registered",
        )
    if request.network == "deny" and request.egress_allowlist:
        raise DispatchError(
            "invalid_body",
            "network 'deny' turns the network off: an egress_allowlist would mean "
            "nothing (use network 'allow' or 'ask' with it)",
        )
    if request.push == "allow" and request.mode != "chat":
        raise DispatchError(
            "invalid_body",
            f"push 'allow' is for chat runs only; a {request.mode} run never pushes",
        )
    backend = choose_run_backend(request.backend, offer)
    return RunPlan(
        backend=backend,
        repo=repo,
        checkout_writable=request.mode == "chat",
        read_only_binds=repos,
        protected_paths=repos,
        network_enabled=request.network != "deny",
        egress_allowlist=request.egress_allowlist,
        ask=request.network == "ask",
        push=request.push == "allow",
    )


def repo_path_problem(path: str) -> str | None:
    """Why ``path`` cannot name a registered checkout by its spelling alone, or None.

    A registered path is absolute, in its one plain spelling (no ``.``, ``..``,
    empty or trailing components), so that a protected path and a bind name the
    same directory. Symlinks and the ``.git`` directory are the server's check.
    """
    if not isinstance(path, str) or not path.startswith("/"):
        return "is not an absolute path"
    if "\0" in path or any(ord(c) < 0x20 for c in path):
        return "has a control character in it"
    if path == "/":
        return "is the root directory"
    parts = path[1:].split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "is not in its plain spelling (no '.', '..', '//' or trailing '/')"
    return None


def run_credentials_problem(block: object, network: str) -> str | None:
    """Why a run's ``credentials`` block (srt's shape) cannot be given to a run, or None.

    The server is a deputy: a block may name only values its client sends. An
    ``envVars`` entry without its ``value`` would take the *server's* own variable,
    and a ``files`` entry the server's file, and either would be put into requests
    to hosts the client chose; so each entry carries its value, and ``files`` is
    refused. The rest (modes, hosts covered by the allowlist, ...) is the spec's to
    check. A run without network has nowhere to send a credential.
    """
    if not isinstance(block, dict):
        return "'credentials' is an object (srt's credentials block)"
    if network == "deny":
        return "'credentials' needs a network ('allow' or 'ask'): a 'deny' run sends nothing"
    if block.get("files"):
        return (
            "'credentials.files' names files of the server's host: a run's credentials "
            "carry their values ('envVars' entries with 'value')"
        )
    entries = block.get("envVars")
    if not isinstance(entries, list) or not entries:
        return "'credentials.envVars' is a non-empty list of {name, value, mode, ...}"
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("value"), str):
            return (
                f"'credentials.envVars[{i}]' needs its 'value' (a string): without one the "
                "server's own environment variable would be used"
            )
    return None
