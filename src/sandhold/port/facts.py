"""Host facts a launch reads at its edge (home, kernel mounts, what the kernel offers),
the egress wiring of a native sandbox, and launch-failure descriptions.

Rules:
- The harness (this process) never imports a module a sandbox could have written:
  its sys.path is a fact of the plan (``code_paths``, ``script_dir``), and the
  script's own directory that a sandbox may write is taken off sys.path before
  the sandbox runs (``drop_import_paths``, as the plan says). Submodules of
  packages already loaded from there, and the script's own modules, are then
  refused by a meta path finder that names the directory and the fix, rather
  than failing as "not found"; nothing is ever put back.
- A writable root below a sys.path entry (``guard_import_roots``: a bind beside
  the script) stays on the path, but an import that would resolve inside it (a
  planted ``code/__init__.py`` shadowing the standard library's ``code``) is
  refused by the same finder, which looks only at the names such a root could
  supply (its first component below an entry).
"""

from __future__ import annotations

import os

from sandhold.errors import LaunchError, SandholdError, SpecError
from sandhold.spec import SandboxSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping
    from typing import Any

    from sandhold.backends.linux.launcher import (
        EgressNetwork,
        SandboxProcess,
    )
    from sandhold.backends.linux.session import Session
    from sandhold.net.outbound import Asker
    from sandhold.policy.domains import Decision, DomainPolicy
    from sandhold.policy.specplan import CredentialPlan
    from sandhold.port.sandbox import Sandbox


def egress_policy(spec: SandboxSpec) -> DomainPolicy:
    """The session's allowlist: baseline + GitHub (unless ``egress_baseline``
    is false) + ``egress_allowlist``, with ``egress_denylist`` beating them all.

    Raises:
        SpecError: an ``egress_allowlist`` or ``egress_denylist`` entry is not a
            valid domain pattern.
    """
    from sandhold.policy.domains import DomainPolicy

    try:
        return DomainPolicy.for_spec(
            spec.egress_allowlist,
            spec.network_enabled,
            baseline=spec.egress_baseline,
            denylist=spec.egress_denylist,
        )
    except ValueError as exc:
        field = "egress_denylist" if str(exc).startswith("egress_denylist") else "egress_allowlist"
        raise SpecError(field, str(exc)) from None


def code_paths() -> tuple[str, ...]:
    import sys

    from sandhold.backends.linux.native import own_code_paths

    # "" on sys.path (python -c, the REPL) is the working directory, searched at
    # every import: as much the harness's code as any other entry
    found = own_code_paths()
    if "" in sys.path:
        found += (os.path.abspath(""), os.path.realpath(""))
    return tuple(dict.fromkeys(found))


def script_dir() -> str:
    """The harness's ``sys.path[0]``, resolved, when Python put the script's own
    directory (or, for ``-m`` and ``-c``, the working directory) there; "" when not
    (``python -P``, or an entry the program put first itself)."""
    import sys

    if sys.flags.safe_path or not sys.path:
        return ""
    cwd = os.path.realpath("")
    first = os.path.realpath(sys.path[0] or cwd)
    own = {cwd}
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if isinstance(main_file, str):
        own.add(os.path.dirname(os.path.realpath(main_file)))
    return first if first in own else ""


class _WritableImports:
    """A meta path finder that refuses imports from directories a sandbox may write.

    In front of ``sys.meta_path`` it looks only at names of packages loaded from such
    a directory before launch (their submodules would come from it); at the end, only
    at names nothing else found, to say why the script's own module is gone.
    """

    def __init__(self, front: bool) -> None:
        self.front = front
        self.dirs: set[str] = set()
        self.names: set[str] = set()

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        from importlib.machinery import PathFinder

        if self.front:
            if fullname.partition(".")[0] not in self.names:
                return None
            found = PathFinder.find_spec(fullname, path)  # type: ignore[arg-type]
        elif path is None:
            found = PathFinder.find_spec(fullname, sorted(self.dirs))
        else:
            return None
        where = _spec_location(found, self.dirs) if found is not None else None
        if where is not None:
            raise ImportError(
                f"sandhold: not importing {fullname} from {where}: a sandbox may write "
                "there (a writable bind, or the harness script's own directory, which "
                "sandhold took off sys.path at launch), and this process runs outside "
                "the sandbox. Import it before SandboxPort.launch, or keep the harness's "
                "code apart from the sandbox's writable binds (save the script "
                "elsewhere, or run python -P)",
                name=fullname,
            )
        return None


def _spec_location(spec: Any, dirs: set[str]) -> str | None:
    places = [spec.origin, *(spec.submodule_search_locations or ())]
    for place in places:
        if isinstance(place, str) and place.startswith("/"):
            real = os.path.realpath(place)
            if any(_within(real, d) for d in dirs):
                return real
    return None


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


_GUARDS: list[_WritableImports] = []


def _guards() -> tuple[_WritableImports, _WritableImports]:
    import sys

    if not _GUARDS:
        _GUARDS.extend((_WritableImports(front=True), _WritableImports(front=False)))
        sys.meta_path.insert(0, _GUARDS[0])
        sys.meta_path.append(_GUARDS[1])
    return _GUARDS[0], _GUARDS[1]


def guard_import_roots(roots: tuple[str, ...]) -> None:
    """Refuse, for good, imports that would resolve inside ``roots`` (resolved writable
    roots below sys.path entries; see the module rules)."""
    import sys

    if not roots:
        return
    front, _end = _guards()
    front.dirs |= set(roots)
    cwd = os.path.realpath("")
    for entry in {os.path.realpath(p or cwd) for p in sys.path}:
        for root in roots:
            if root != entry and _within(root, entry):
                front.names.add(root[len(entry.rstrip("/")) + 1 :].split("/")[0].split(".")[0])


def drop_import_paths(dirs: tuple[str, ...]) -> None:
    """Take ``dirs`` (resolved) off this process's sys.path for good, and refuse, loudly,
    imports that would still reach into them (see the module rules)."""
    import sys

    if not dirs:
        return
    front, end = _guards()
    gone = set(dirs)
    front.dirs |= gone
    end.dirs |= gone
    cwd = os.path.realpath("")
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or cwd) not in gone]
    for name, module in list(sys.modules.items()):
        try:
            where = [os.path.realpath(p) for p in getattr(module, "__path__", None) or ()]
        except TypeError:  # an odd __path__: guard the name (refusing is the safe side)
            where = list(gone)
        if any(_within(w, d) for w in where for d in gone):
            front.names.add(name.partition(".")[0])


_CONFINEMENT: dict[str, Any] = {}


def launch_facts() -> dict[str, Any]:
    """The ``SpecHost`` facts read at each launch (mounts come and go): the harness's
    environment (``$XDG_CONFIG_HOME``, ``$JJ_CONFIG`` and ``$PATH`` too, for the rules)
    and git config files, the host's kernel file system mounts and the homes of the
    password database."""
    from sandhold.backends.linux.hostfs import home_facts, kernel_mounts
    from sandhold.policy.gitconfig import host_files

    return {
        "xdg_config_home": os.environ.get("XDG_CONFIG_HOME", ""),
        "jj_config": os.environ.get("JJ_CONFIG", ""),
        "path_env": os.environ.get("PATH", ""),
        "git_configs": host_files(host_home(), os.environ),
        "kernel_mounts": kernel_mounts(),
        "environ": tuple(os.environ.items()),
        "script_dir": script_dir(),
        **home_facts(),  # the account's home and every home of the password database
    }


def confinement_facts() -> dict[str, Any]:
    """What the kernel offers the creation-time supervisor and Landlock (probed once)."""
    if not _CONFINEMENT:
        from sandhold.backends.linux.hostprobe import supervisor_blocker
        from sandhold.backends.linux.supervisor.landlock import landlock_abi

        blocker = supervisor_blocker()
        _CONFINEMENT["supervisor"] = blocker is None
        if blocker is not None:
            _CONFINEMENT["supervisor_blocker"] = blocker
        _CONFINEMENT["landlock"] = landlock_abi() > 0
    return dict(_CONFINEMENT)


def egress_network(
    sb: Sandbox,
    policy: DomainPolicy,
    ask: Callable[[str, int], Awaitable[bool]] | None = None,
    credential_hooks: Mapping[str, object] | None = None,
) -> EgressNetwork:
    """The sandbox's own proxies, reporting refusals into its event stream; with
    ``credential_hooks`` (``prepare_credentials``) they put masked secrets back."""
    from sandhold.backends.linux.launcher import EgressNetwork

    asker: Asker | None = None
    if ask is not None:
        chosen = ask

        async def asker(decision: Decision) -> bool:
            return await chosen(decision.host, decision.port)

    return EgressNetwork(
        policy,
        on_decision=sb.on_egress,
        budget=sb.port._connections.session(),
        label=f"sandbox {sb.spec.session_id}",
        resolver=sb.port._lookup_threads().resolver(),
        ask=asker,
        credential_hooks=credential_hooks,
    )


def masked_file_texts(spec: SandboxSpec) -> tuple[tuple[str, str | None], ...]:
    """What the plan masks of each masked ``credentials.files`` entry (the I/O edge):
    its text, or None when it is unreadable (``hostfs.read_masked_file``) or its path
    passes through a symlink (one a sandbox planted in a bind would have the harness
    read, and show, some other file)."""
    if spec.credentials is None:
        return ()
    from sandhold.backends.linux.hostfs import read_masked_file

    out: list[tuple[str, str | None]] = []
    for src in spec.credential_settings().masked:
        if src.kind == "file":
            path = src.target
            text = read_masked_file(path) if os.path.realpath(path) == path else None
            out.append((path, text))
    return tuple(out)


def load_ca(spec: SandboxSpec) -> tuple[Any, bytes] | None:
    """The CA a spec's sandbox terminates TLS with, and the bundle it will trust
    (``net.ca.prepare``): the ``caCertPath``/``caKeyPath`` pair, else sandhold's
    per-install CA, made on first use. Called before the plan, so that the plan
    sees (and hides) a CA directory made just now. None without ``tls_terminate``.

    Raises:
        LaunchError: the CA cannot be read, made or trusted.
    """
    tls = spec.tls_terminate
    if tls is None:
        return None
    import logging

    from sandhold.net.ca import prepare
    from sandhold.policy.credentials import default_ca_dir

    ca_dir = default_ca_dir(host_home(), os.environ.get("XDG_STATE_HOME"))
    ca, bundle, notes = prepare(tls.ca_cert_path, tls.ca_key_path, ca_dir, tls.extra_ca_cert_paths)
    for note in notes:
        logging.getLogger("sandhold").warning("%s", note)
    return ca, bundle


def prepare_credentials(
    plan: CredentialPlan, session: Session, loaded: tuple[Any, bytes] | None
) -> tuple[tuple[tuple[str, str], ...], dict[str, object]]:
    """The host side of a spec's masked secrets, before the sandbox starts: the masked
    files' copies and the trust bundle (``load_ca``'s) written for bwrap to bind
    (``Session.write_copies``), and the proxy's hooks (``tls_terminate.credential_hooks``).

    Raises:
        LaunchError: a copy could not be written.
    """
    from sandhold.net.tls_terminate import credential_hooks

    files = [(path, text.encode()) for path, text in plan.masks.files]
    ca = None
    if plan.tls is not None and loaded is not None:
        ca, bundle = loaded
        files.append((plan.trust_bundle, bundle))
    binds = session.write_copies(files)
    hooks = credential_hooks(
        plan.masks.injections,
        ca=ca,
        tls=plan.tls,
        plaintext=plan.plaintext_inject,
        aws_keys=plan.masks.aws_keys,
        sigv4=plan.sigv4,
    )
    return binds, dict(hooks)


def host_home() -> str:
    home = os.environ.get("HOME", "")
    if home.startswith("/"):
        return home.rstrip("/") or "/"
    import pwd

    return pwd.getpwuid(os.getuid()).pw_dir


def diag_tail(proc: SandboxProcess) -> str:
    text = proc.diag.decode("utf-8", "replace").strip()
    return f": {text[-1000:]}" if text else ""


def describe(exc: BaseException, sb: Sandbox) -> str:
    proc = sb.proc
    if proc is not None:
        proc.read_diag()
        tail = diag_tail(proc)
    else:
        tail = ""
    if isinstance(exc, LaunchError):
        text = exc.detail or exc.step
    elif isinstance(exc, SandholdError):
        text = exc.render()
    else:
        text = str(exc)
    return text + tail
