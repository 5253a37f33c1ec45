"""The mount plan of a spec-launched sandbox: an empty root, a read-only system base, the binds.

Rules (SPEC §4, F-SET-5, F-BE-4, F-BE-5):
- The sandbox starts from an empty root, read-only once the mounts are made. It
  sees the system base
  (``SYSTEM_BASE``: ``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/etc``) read-only,
  a private ``/tmp`` (``tmpfs``), its own ``/dev`` and ``/proc``, the spec's bind
  mounts and runner state dirs, and the agent's own files read-only: nothing
  else. The user's home is invisible unless bound.
- ``/etc`` is there without its secrets: every ``ETC_SECRETS`` entry that exists
  is hidden (password hashes, sudoers, host keys, TLS private keys, stored
  network and cloud credentials). The secret locations of a home
  (``mandatory.SECRET_READ_DENY``: ``~/.ssh``, ``~/.aws``, …) are hidden inside
  any bind that contains them (the home directory, or an ancestor of it). A bind
  naming the location itself shows it; a bind or runner state dir inside it shows
  that path alone, through the still hidden location (``~/.ssh/known_hosts``
  does not show ``~/.ssh/id_ed25519``). That holds for every home a bind may
  cover: ``$HOME``, the account's home from the password database
  (``SpecHost.account_home``: a service's ``$HOME`` is often elsewhere) and every
  home of the password database (``SpecHost.homes``: binding ``/home`` hides every
  user's ``~/.ssh``). ``ETC_LINKS`` that point outside the
  base (``/etc/resolv.conf`` → ``/run/…``) get their target bound read-only, so
  they resolve.
- Modes: ``chat`` keeps bind mounts writable unless ``read_only``; ``review``,
  ``plan`` and ``orchestrate`` make every bind read-only. ``runner_state_dirs``
  are writable in every mode (bound if no bind contains them);
  ``protected_paths`` are never writable, in any mode, and beat a runner state
  dir below them. A read-only bind inside a writable one stays read-only. Two
  binds of one resolved path (a symlink and its target, two spellings) that
  disagree on writability, or a ``read_only`` bind that is also a runner state
  dir, are a ``SpecError``: no spelling silently wins.
- Inside writable areas the CLI's write rules apply unchanged, by building an
  ``FsRequest`` and reusing ``plan_filesystem``: mandatory names, ``.git/hooks``
  and ``.git/config``, credential globs, rename guards. Only its
  mounts that fall inside what the sandbox sees are kept.
- The agent's files (interpreter prefix, the sandhold package) are bound
  read-only, even inside a writable bind: the sandbox cannot rewrite the agent.
- The harness imports lazily from its sys.path (``SpecHost.code_paths``): an entry
  inside a writable bind is read-only, one that is a writable root is refused,
  but for the script's own directory (``SpecHost.script_dir``, sys.path[0]): it is
  the bind, so the harness stops importing from it instead
  (``SpecPlan.drop_import_paths``, carried out by ``port.facts``), with a warning.
  A writable root below a code path stays writable, but an import the harness
  would resolve inside it is refused (``SpecPlan.guard_import_roots``).
- On the native backend a bind's guest path is its host path; another guest path
  is refused. Binds are made at their symlink-resolved location (noted), but a
  bind or runner state dir whose path passes through a symlink a sandbox could
  have planted is refused (a link left in a workspace by an earlier session would
  redirect a later writable bind anywhere). Only the system's own links are
  followed: those directly in ``SYSTEM_LINK_DIRS`` (``/lib`` -> ``usr/lib``,
  ``/var/run`` -> ``/run``) and outside every writable bind of the plan. Any other
  link is followed only if the spec names it in ``follow_symlinks``.
- Every source the plan binds is pinned (``SpecPlan.pins``: the path and the
  device and inode the plan saw): the backend opens each without following
  symlinks, checks it is that object, and hands bubblewrap the open file, so a
  path swapped between plan and mount (a ``RENAME_EXCHANGE`` loop) fails the
  launch instead of mounting something else. A bind or runner state dir that
  is a symlink once resolved was swapped while planning: refused. Mounts whose
  path is a symlink as planned (the base's ``/bin`` -> ``usr/bin``, links in
  ``/`` only root can write) are left to bubblewrap to resolve.
  ``protected_paths`` may be absolute globs (``/work/**/.env``) only with the creation-time
  supervisor (F-BE-5: without it a new matching name could not be stopped, and
  the launch is refused). ``exec_grant_roots`` are macOS-only and ignored here
  (noted).
- A bind or runner state dir that resolves into the host's ``/proc``, ``/sys`` or
  ``/dev`` (a symlink to one) is refused as ``spec`` refuses naming them. File
  binds are made like any other, but the working directory (``guest_workdir``,
  else the first bind) must be an existing directory.
- ``spec.credentials`` (F-CRED-1…3): every ``credentials.files`` path and the
  TLS termination CA's key (sandhold's own CA directory, or ``caKeyPath``) is
  hidden wherever a bind or the base shows it; every ``credentials.envVars``
  name is withheld from the environment. ``masking.plan_masks`` mints the
  placeholders (a variable's value is its entry's ``value``, else the
  harness's variable; a file's text is what the port read, ``SpecHost``): a
  masked variable is set to its placeholder, a masked file is shown as its
  copy (``CredentialPlan.masks.files``, bound over the hidden file), and with
  ``tls_terminate`` the trust bundle is bound at ``/tmp/sandhold-ca-bundle.pem``
  and named by ``credentials.TRUST_VARIABLES``. The notes list each
  placeholder and its hosts (``explain``), never a real value.
- Pure: host facts come through ``HostView`` and ``SpecHost``.
"""

from __future__ import annotations

from sandhold._record import record
from sandhold.errors import SpecError, UnenforceablePolicy
from sandhold.policy import mandatory, paths
from sandhold.policy.confinement import check_pinned, confine
from sandhold.policy.creation import (
    SUPERVISOR_MISSING,
    CreationPolicy,
)
from sandhold.policy.env import (
    HTTP_PROXY_PORT,
    SOCKS_PROXY_PORT,
    filter_environment,
    proxy_environment,
)
from sandhold.policy.fsplan import (
    DIR,
    SYMLINK,
    FsPlan,
    FsRequest,
    Mount,
    plan_filesystem,
)
from sandhold.policy.systembase import ETC_SECRETS, SYSTEM_BASE
from sandhold.spec import SandboxSpec, kernel_tree

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from sandhold.policy.credentials import Sigv4Policy, TlsTerminate
    from sandhold.policy.fsplan import HostView, Stat
    from sandhold.policy.masking import MaskPlan
    from sandhold.policy.syscalls import Rule
    from sandhold.settings import CredentialSettings

# /etc entries programs read that are often symlinks to outside the base.
ETC_LINKS: tuple[str, ...] = ("/etc/resolv.conf", "/etc/hosts", "/etc/localtime", "/etc/ssl/certs")

PRIVATE_TMP = "/tmp"

# Directories whose own symlinks are the system's (root-owned, written by packages,
# not by a sandbox): a bind path may pass through them. A link anywhere else may
# have been planted by a sandbox that could write there, and needs follow_symlinks.
SYSTEM_LINK_DIRS: tuple[str, ...] = ("/", "/usr", "/var", "/etc")

FOLLOW_FIELD = "follow_symlinks"


@record
class SpecHost:
    """Host facts the plan needs besides the filesystem (see ``plan_spec``)."""

    home: str  # the host user's home (invisible unless bound)
    tmpdir: str  # the session's private directory on the host (never shown)
    private_root: str  # where sandhold keeps every session's data (hidden if bound)
    agent_paths: tuple[str, ...] = ()  # resolved files/dirs the in-sandbox agent needs
    # where the harness's own Python code comes from (its sys.path): read-only where
    # a writable bind holds it, or the sandbox could plant code the harness runs later
    code_paths: tuple[str, ...] = ()
    # the harness's sys.path[0] when Python put its script's own directory there
    # (resolved; "" when not, or under ``python -P``): if that very directory is a
    # writable root, the port takes it off sys.path (``SpecPlan.drop_import_paths``)
    script_dir: str = ""
    supervisor: bool = False  # seccomp user notification: the creation-time supervisor runs
    supervisor_blocker: str = SUPERVISOR_MISSING  # why it cannot, when it cannot
    landlock: bool = False  # Landlock: every exec writes only where the plan lets it
    xdg_config_home: str = ""  # the harness's $XDG_CONFIG_HOME: git, hg and jj read it too
    jj_config: str = ""  # the harness's $JJ_CONFIG: jj's user config files instead
    path_env: str = ""  # the harness's $PATH: its directories below a writable home
    git_configs: tuple[str, ...] = ()  # git's system and user configs (gitconfig.host_files)
    # (mount point, type) of the host's kernel file systems (``hostfs.kernel_mounts``):
    # a bind holding one would bring it along (bubblewrap binds recursively)
    kernel_mounts: tuple[tuple[str, str], ...] = ()
    # the harness's environment, scrubbed here into the sandbox's (``SpecPlan.environment``)
    environ: tuple[tuple[str, str], ...] = ()
    # the account's home from the password database (``pwd.getpwuid(uid).pw_dir``):
    # with a service's $HOME elsewhere, its ~/.ssh is still hidden inside a bind
    account_home: str = ""
    homes: tuple[str, ...] = ()  # every home directory of the password database
    # (resolved path, text or None): what the port read of each ``credentials.files``
    # entry to mask (None: missing, a symlink, not a regular file, too large, not UTF-8)
    masked_file_texts: tuple[tuple[str, str | None], ...] = ()
    # where placeholders get their randomness (``os.urandom``); None: masked variables
    # are withheld and masked files denied
    entropy: Callable[[int], bytes] | None = None


@record
class Pin:
    """A bind source as the plan saw it: the backend mounts this very object or none."""

    path: str
    dev: int
    ino: int


@record
class CredentialPlan:
    """A spec's masked secrets (``masking.plan_masks``) and how the proxy puts them back.

    The ``masks`` hold the real values (their ``repr`` hides them); ``trust_bundle`` is
    where the sandbox finds the bundle that trusts sandhold's CA (bound read-only),
    ``ca_dir`` sandhold's own CA when ``tls`` names no pair.
    """

    masks: MaskPlan
    tls: TlsTerminate | None = None
    plaintext_inject: bool = False
    sigv4: Sigv4Policy | None = None
    trust_bundle: str = ""
    ca_dir: str = ""


@record
class SpecPlan:
    """What the native backend carries out for one spec (mounts apply in order)."""

    fs: FsPlan  # from an empty root; ``tmpfs`` is a writable private tmpfs
    workdir: str
    visible: tuple[str, ...]  # host paths the sandbox sees, besides /tmp, /dev, /proc
    writable: tuple[str, ...]  # writable roots (before the protections inside them)
    home_visible: bool
    syscalls: tuple[Rule, ...]
    network: str
    notes: tuple[str, ...]
    warnings: tuple[str, ...]
    creation: CreationPolicy | None = None  # what the supervisor refuses; None: no writable root
    landlock: tuple[str, ...] | None = None  # the only paths an exec may write below (Landlock)
    # every exec's base environment: the harness's, scrubbed, with HOME, TMPDIR and the
    # variables that point tools at the sandbox's proxies (``proxy_variables``)
    environment: tuple[tuple[str, str], ...] = ()
    dropped_env: tuple[tuple[str, str], ...] = ()  # (name, why) left out of it
    proxy_variables: tuple[str, ...] = ()  # the names in it that point at the proxies
    pins: tuple[Pin, ...] = ()  # every bind source, to be opened and checked at launch
    # sys.path entries the harness must stop importing from before the sandbox runs:
    # its script's own directory, when that is a writable root (``port.facts``)
    drop_import_paths: tuple[str, ...] = ()
    # writable roots inside the harness's code paths (its script's directory holding
    # a bind): what an import resolves to inside one is refused (``port.facts``)
    guard_import_roots: tuple[str, ...] = ()
    # masked secrets and TLS termination (``spec.credentials``); None: the spec has none
    credentials: CredentialPlan | None = None


def _covering(path: str, roots: list[str] | tuple[str, ...]) -> str | None:
    found = [r for r in roots if paths.is_within(path, r)]
    return max(found, key=len) if found else None


def network_mode(spec: SandboxSpec) -> str:
    """What a native sandbox of ``spec`` can reach, in words (``details``, ``explain``).

    Every native sandbox gets its own pair of proxies as its only way out; with
    ``network_enabled`` false they still run, with nothing allowed (F-NET-3).
    """

    where = (
        f"through this session's own proxies only (HTTP 127.0.0.1:{HTTP_PROXY_PORT}, "
        f"SOCKS5 127.0.0.1:{SOCKS_PROXY_PORT}); no other route, no DNS"
    )
    if not spec.network_enabled:
        return f"{where}; network_enabled is false: every connection is refused and reported"
    extra = ", ".join(spec.egress_allowlist) or "none"
    denied = f"; denied first: {', '.join(spec.egress_denylist)}" if spec.egress_denylist else ""
    if not spec.egress_baseline:
        return f"{where}; allowed: egress_allowlist only, no baseline ({extra}){denied}"
    return f"{where}; allowed: the baseline, GitHub and egress_allowlist ({extra}){denied}"


def plan_spec(spec: SandboxSpec, facts: SpecHost, host: HostView) -> SpecPlan:
    """Compute the native mount plan for ``spec`` (see the module rules).

    Raises:
        SpecError: a bind or runner state dir does not exist (or is a glob),
            resolves into a host kernel tree (``spec.kernel_tree``) or holds a mount
            of a kernel file system (``SpecHost.kernel_mounts``), two of them
            are one path with different writability, a path shown inside a
            hidden secret location has glob characters in its name, or the
            working directory is missing, not a directory, or not inside
            anything the sandbox sees.
        UnenforceablePolicy: a guest path other than the host path, a glob in
            ``protected_paths``, or a hard-linked secret (from ``plan_filesystem``).
    """

    spec = spec.validate()
    notes: list[str] = []
    warnings: list[str] = []
    mode = spec.mode

    followed: list[tuple[str, str, str]] = []  # (field, bind path, symlink on its way)
    seen_at: dict[str, Stat] = {}  # what each bind source was when resolved: it is pinned

    def resolve(field: str, path: str) -> str:
        real = host.realpath(path)
        seen = host.lstat(real)
        if seen is not None and seen.kind == SYMLINK:
            raise SpecError(
                field,
                f"{path} changed while the plan was made (it resolved to {real}, now a "
                "symlink): something is swapping it; nothing was launched",
            )
        if seen is not None:
            seen_at.setdefault(real, seen)
        if seen is None:
            if paths.is_glob(path):
                raise SpecError(
                    field,
                    f"{path} is a glob pattern (*?[), and no such path exists: a bind "
                    "names one path; bind each one, or a directory above them",
                )
            raise SpecError(field, f"{path} does not exist on this host")
        tree = kernel_tree(real)
        if tree is not None:  # named otherwise (a symlink to /proc): what is bound is real
            raise SpecError(field, f"{path} resolves to {real}: {tree}")
        for where, kind in facts.kernel_mounts:
            if paths.is_within(where, real):
                raise SpecError(
                    field,
                    f"{path} holds a mount of the host's {kind} at {where}, which a bind "
                    "brings along (the host's processes, devices or kernel settings): "
                    "bind the directories beside it",
                )
        if paths.is_glob(real):
            # the filesystem plan reads entries as patterns: /p/a[b] would show /p/ab
            raise SpecError(
                field,
                f"{real} has glob characters (*?[) in its name, which the plan would "
                "read as a pattern naming other paths too: bind a directory above it",
            )
        if real != path:
            walked, links = _links_on(path, host)
            if walked != real or not links:  # a second walk went elsewhere: swapped
                raise SpecError(
                    field,
                    f"{path} changed while the plan was made (it resolved to {real}, "
                    f"then to {walked}): something is swapping it; nothing was launched",
                )
            followed.extend((field, path, link) for link in links)
            notes.append(f"{field} {path} is bound at its resolved location {real}")
        return real

    # -- what is bound, and how -------------------------------------------------
    binds: list[tuple[str, bool, str]] = []  # (resolved path, writable, origin)
    for i, b in enumerate(spec.bind_mounts):
        field = f"bind_mounts[{i}]"
        if b.guest_path and b.guest_path != b.host_path:
            raise UnenforceablePolicy(
                f"{field}.guest_path {b.guest_path}",
                "native",
                "the native backend shows a host path at the same path "
                f"({b.host_path}); another guest path needs the microvm backend",
            )
        real = resolve(f"{field}.host_path", b.host_path)
        if b.read_only:
            why = f"{field} (read_only)"
        elif not mode.writes_binds:
            why = f"{field} (read-only in mode {mode.value})"
        else:
            why = f"{field} (writable in mode {mode.value})"
        binds.append((real, not b.read_only and mode.writes_binds, why))
    _refuse_aliases(spec, binds)
    if not mode.writes_binds and spec.bind_mounts:
        notes.append(f"mode {mode.value}: every bind mount is read-only")
    runner_dirs = []
    for i, d in enumerate(spec.runner_state_dirs):
        if paths.is_glob(d):
            raise SpecError(f"runner_state_dirs[{i}]", f"{d} is a glob; name a directory")
        real = resolve(f"runner_state_dirs[{i}]", d)
        explicit = next(
            (j for j, b in enumerate(spec.bind_mounts) if b.read_only and binds[j][0] == real),
            None,
        )
        if explicit is not None:
            raise SpecError(
                f"runner_state_dirs[{i}]",
                f"{d} is {real}, which bind_mounts[{explicit}] "
                f"({spec.bind_mounts[explicit].host_path}) makes read_only, and a runner "
                "state dir is writable: drop one of them",
            )
        runner_dirs.append((real, f"runner_state_dirs[{i}]"))
    writable_now = [p for p, w, _ in binds if w] + [p for p, _ in runner_dirs]
    for field, path, link in followed:
        _refuse_planted(spec, field, path, link, writable_now)
    protected = []
    for i, p in enumerate(spec.protected_paths):
        field = f"protected_paths[{i}]"
        if not p.startswith("/"):
            raise SpecError(field, f"must be an absolute path or glob, got {p!r}")
        if paths.is_glob(p):
            try:
                paths.validate_pattern(p)
            except ValueError as exc:
                raise SpecError(field, f"{p}: {exc}") from None
        if paths.is_glob(p) and not facts.supervisor:
            raise UnenforceablePolicy(
                f"protected_paths[{i}] {p}",
                "native",
                "only the creation-time supervisor can stop new matching names, and "
                f"{facts.supervisor_blocker}; name the paths",
            )
        protected.append((p, f"protected_paths[{i}]"))
    if spec.exec_grant_roots:
        notes.append(
            "exec_grant_roots are ignored on Linux (they only relax the macOS exec rule): "
            + ", ".join(spec.exec_grant_roots)
        )

    base = [p for p in SYSTEM_BASE if host.lstat(p) is not None]
    bind_paths = [p for p, _, _ in binds] + [p for p, _ in runner_dirs]
    writable = [p for p, w, _ in binds if w] + [p for p, _ in runner_dirs]
    writable_origin = [why for _, w, why in binds if w] + [
        f"{why} (writable in every mode)" for _, why in runner_dirs
    ]
    readonly_in_writable = [
        (p, why)
        for p, w, why in binds
        if not w and any(paths.is_within(p, r) and p != r for r in writable)
    ]
    deny_origin = [o for _, o in protected] + [why for _, why in readonly_in_writable]

    # -- secrets to hide ----------------------------------------------------------
    secrets: list[tuple[str, str]] = [
        (e, f"spec base: /etc without {why}") for e, why in ETC_SECRETS
    ]
    # A secret location stays hidden inside any bind that holds it. Only a bind of the
    # location itself shows it whole; a bind (or runner state dir) inside it shows that
    # path and nothing beside it: a hole in the hidden directory, as allowRead makes one.
    bound = [(p, why) for p, _, why in binds]
    bound += [(p, why) for p, why in runner_dirs]
    holes: list[tuple[str, str]] = []
    hidden: set[str] = set()
    unseen: list[tuple[str, str]] = []  # secret locations no bind shows: their links may
    for home in _homes(facts, bind_paths, host):
        for entry in mandatory.SECRET_READ_DENY:
            path = paths.absolute(entry, home, home)
            real = host.realpath(path)
            if real in hidden or real in bind_paths:
                continue  # hidden already, or named exactly
            if not any(paths.is_within(real, b) for b in bind_paths):
                unseen.append((real, f"spec: secret location {entry}"))
                continue  # shown by no bind
            hidden.add(real)
            where = entry if home == facts.home else f"{entry} of {home}"
            secrets.append((real, f"spec: secret location {where} inside a bind"))
            for p, why in bound:
                if paths.is_within(p, real) and p != real:  # no glob: resolve() refused it
                    holes.append((p, f"{why}, inside the hidden {where}"))

    creds = spec.credential_settings() if spec.credentials or spec.tls_terminate else None
    ca_dir = _ca_dir(creds, facts)
    for path, why in _credential_secrets(creds, ca_dir):
        real = host.realpath(path)
        if real not in hidden and any(paths.is_within(real, b) for b in [*base, *bind_paths]):
            hidden.add(real)
            secrets.append((real, why))

    # The script's own directory on sys.path, writable by the sandbox: a module planted
    # there (json.py) would run in the harness, outside the sandbox. It cannot be made
    # read-only (it is the bind), so the harness stops importing from it instead.
    drop_imports = tuple(p for p in (facts.script_dir,) if p and p in writable)
    # A writable root below a code path (a bind ``code`` beside the script) is left
    # writable, but a package planted in it (``code/__init__.py``) would shadow the
    # standard library's ``code`` in the harness: the port refuses such an import.
    code_real = {host.realpath(p) for p in facts.code_paths}
    guard_roots = tuple(
        w for w in writable if any(paths.is_within(w, p) and w != p for p in code_real)
    )
    for p in drop_imports:
        warnings.append(
            f"{p} is the harness script's own directory, on its sys.path, and this "
            "sandbox may write it: sandhold takes it off sys.path so this process never "
            "imports a module planted there (modules imported already stay; import the "
            "script's own modules before launch, or run python -P to keep it off sys.path)"
        )
    workdir_in = spec.guest_workdir or (binds[0][0] if binds else "/")
    workdir = host.realpath(workdir_in) if workdir_in != "/" else "/"
    _check_workdir(spec, workdir, host)
    req = FsRequest(
        cwd=workdir,
        home=facts.home,
        tmpdir=facts.tmpdir,
        private_root=facts.private_root,
        allow_write=tuple(writable),
        deny_write=tuple(p for p, _ in protected) + tuple(p for p, _ in readonly_in_writable),
        extra_deny_write=mandatory.user_config_paths(
            facts.home, facts.xdg_config_home, facts.jj_config
        ),
        home_deny_write=mandatory.home_paths(facts.home, facts.path_env),
        git_configs=facts.git_configs,
        extra_deny_read=tuple(secrets),
        unseen=tuple(unseen),
        allow_read=tuple(p for p, _ in holes),
        supervised=facts.supervisor,
        # an entry holding a bind (the harness script's own directory) is not made
        # read-only whole: only what lies inside the binds is the sandbox's to write.
        # The script's own directory that is itself a writable root is not code any
        # more: the port takes it off sys.path before the sandbox runs.
        extra_read_only=tuple(
            (p, "sandhold: the harness's own code (its sys.path or Python installation)")
            for p in facts.code_paths
            if not any(paths.is_within(w, p) and w != p for w in writable)
            and not (drop_imports and host.realpath(p) in drop_imports)
        ),
    )
    fs = plan_filesystem(req, host)
    warnings.extend(fs.warnings)
    check_pinned(fs, facts.supervisor_blocker)
    # with no writable root, the supervisor still runs: to report writes at read-only paths
    confined = confine(
        req,
        fs,
        host,
        supervise=facts.supervisor,
        scratch=(PRIVATE_TMP,),
        landlock=facts.landlock,
        deny_write=req.deny_write,
    )

    # -- what the sandbox sees ------------------------------------------------------
    visible = list(dict.fromkeys(base + bind_paths))
    agent = []
    for p in facts.agent_paths:
        if host.lstat(p) is None:
            continue  # bwrap would refuse it; the agent then fails to start, loudly
        cover = _covering(p, visible)
        if cover is None or any(paths.is_within(p, w) for w in writable):
            agent.append(p)
    etc_targets = []
    for link in ETC_LINKS:
        if host.lstat(link) is None:
            continue
        target = host.realpath(link)
        if target != link and host.lstat(target) is not None and _covering(target, visible) is None:
            etc_targets.append((target, f"spec base: target of {link}"))
    visible += [p for p in agent if p not in visible] + [t for t, _ in etc_targets]

    # -- the mounts -----------------------------------------------------------------
    # Say which spec field a reused CLI rule came from.
    origins = {f"filesystem.allowWrite[{i}]": o for i, o in enumerate(writable_origin)}
    origins |= {f"filesystem.denyWrite[{i}]": o for i, o in enumerate(deny_origin)}
    origins |= {f"filesystem.allowRead[{i}]": o for i, (_, o) in enumerate(holes)}
    fs_mounts = [
        Mount(m.op, m.path, origins.get(m.reason, m.reason), m.perms)
        for m in fs.mounts
        if _covering(m.path, visible) is not None
    ]
    taken = {m.path for m in fs_mounts if m.op != "remount-ro"}

    # Only the outermost binds need a mount of their own: inside another bind (or
    # the base) a path is already shown, and writability there is the CLI rules'
    # business. A bind at a base path (or at /tmp) wins over the base mount there.
    def outermost(path: str) -> bool:
        others = [*base, *bind_paths]
        return not any(o != path and paths.is_within(path, o) for o in others)

    own: list[Mount] = [Mount("ro-bind", p, why) for p, _w, why in binds if outermost(p)]
    own += [
        Mount("ro-bind", p, f"{why} (writable in every mode)")
        for p, why in runner_dirs
        if outermost(p)
    ]
    own += [Mount("ro-bind", p, "sandhold agent (read-only)") for p in agent]
    own += [Mount("ro-bind", t, why) for t, why in etc_targets]
    own += [Mount("ro-bind", p, "spec base: system directory") for p in base]
    own.append(Mount("tmpfs", PRIVATE_TMP, "spec base: private /tmp", "1777"))
    chosen: dict[str, Mount] = {}
    for m in own:
        if m.path not in taken:
            chosen.setdefault(m.path, m)
    for m in fs_mounts:
        if m.op != "remount-ro":
            chosen[m.path] = m
    ordered = sorted(chosen.values(), key=lambda m: (paths.depth(m.path), m.path))
    ordered += [m for m in fs_mounts if m.op == "remount-ro"]
    # Last: the skeleton bwrap built the mount points in becomes read-only too.
    ordered.append(Mount("remount-ro", "/", "spec base: the root skeleton is read-only"))

    for path, origin in protected:
        real = path if paths.is_glob(path) else host.realpath(path)
        if not paths.is_glob(path) and _covering(real, visible) is None:
            notes.append(f"{origin} {path} is not visible in the sandbox")
    dropped_roots = fs.dropped_roots
    notes.extend(n for n in fs.notes if _mentions_visible(n, visible))
    if dropped_roots:
        notes.append("a protected path covers a writable bind or runner state dir: it is read-only")
    if _covering(workdir, visible) is None and workdir != "/":
        raise SpecError("guest_workdir", f"{workdir} is not inside any bind mount")
    home_visible = _covering(facts.home, visible) is not None and not any(
        m.op in ("hide-dir", "hide-file") and paths.is_within(facts.home, m.path) for m in ordered
    )
    network = network_mode(spec)
    given = spec.credentials.values() if spec.credentials is not None else {}
    cred_plan = _credential_plan(creds, given, facts, host, ca_dir, warnings, notes)
    environment, dropped_env, proxy_variables = _environment(facts, home_visible, creds, cred_plan)
    if cred_plan is not None and cred_plan.masks.injections:
        names = ", ".join(dict.fromkeys(i.name for i in cred_plan.masks.injections))
        network += f"; masked credentials put back by the proxy: {names}"
    pins = []
    for m in ordered:
        if m.op not in ("bind", "ro-bind"):
            continue
        # a bind source as it was when resolved (a second look could see a swap)
        st = seen_at.get(m.path) or host.lstat(m.path)
        if st is not None and st.kind == SYMLINK:
            if m.path in base:
                continue  # /bin -> usr/bin: in /, which only root writes
            raise SpecError(
                "bind_mounts",
                f"{m.path} ({m.reason}) is a symlink now, and was none when planned: "
                "something is swapping it; nothing was launched",
            )
        if st is not None:
            pins.append(Pin(m.path, st.dev, st.ino))
    return SpecPlan(
        fs=FsPlan(
            mounts=tuple(ordered),
            writable_roots=fs.writable_roots,
            unpinned=fs.unpinned,
            notes=fs.notes,
        ),
        workdir=workdir,
        visible=tuple(visible),
        writable=tuple(writable),
        home_visible=home_visible,
        syscalls=confined.syscalls,
        network=network,
        notes=tuple(dict.fromkeys(notes)),
        warnings=tuple(warnings),
        creation=confined.creation,
        landlock=confined.landlock,
        environment=environment,
        dropped_env=dropped_env,
        proxy_variables=proxy_variables,
        pins=tuple(pins),
        drop_import_paths=drop_imports,
        guard_import_roots=guard_roots,
        credentials=cred_plan,
    )


def _ca_dir(creds: CredentialSettings | None, facts: SpecHost) -> str:
    """sandhold's per-install CA (``credentials.default_ca_dir``) when TLS termination
    uses it (no ``caCertPath``/``caKeyPath`` pair), else ""."""
    if creds is None or creds.tls_terminate is None or creds.tls_terminate.ca_key_path:
        return ""
    from sandhold.policy.credentials import default_ca_dir

    return default_ca_dir(facts.home, dict(facts.environ).get("XDG_STATE_HOME"))


def _credential_secrets(creds: CredentialSettings | None, ca_dir: str) -> list[tuple[str, str]]:
    """What a bind must not show: each ``credentials.files`` path (a masked one is shown
    as its copy, bound over the hidden file), and the CA's key."""
    if creds is None:
        return []
    out = [(s.target, f"spec: {s.key} ({s.mode})") for s in creds.sources if s.kind == "file"]
    tls = creds.tls_terminate
    if ca_dir:
        out.append((ca_dir, "sandhold: its TLS termination CA"))
    elif tls is not None and tls.ca_key_path:
        out.append((tls.ca_key_path, "tls_terminate.caKeyPath"))
    return out


def _credential_plan(  # noqa: PLR0917 (private; one call site)
    creds: CredentialSettings | None,
    given: dict[str, str],
    facts: SpecHost,
    host: HostView,
    ca_dir: str,
    warnings: list[str],
    notes: list[str],
) -> CredentialPlan | None:
    """The placeholders of the spec's masked secrets (``masking.plan_masks``): a
    variable's value is the entry's own ``value``, else the harness's variable.

    Raises:
        SpecError: ``onExtractNoMatch: error`` and nothing matched.
    """
    if creds is None:
        return None
    from sandhold.policy.credentials import TRUST_BUNDLE_NAME, CredentialsProblem
    from sandhold.policy.masking import describe, plan_masks

    names = {s.target for s in creds.sources if s.kind == "env"}
    values = {k: v for k, v in facts.environ if k in names}
    try:
        masks = plan_masks(
            creds.sources,
            creds.aws_pairs,
            values={**values, **given},
            file_texts=dict(facts.masked_file_texts),
            entropy=facts.entropy,
            absolute=host.realpath,
        )
    except CredentialsProblem as exc:
        raise SpecError(exc.key, exc.reason) from None
    warnings.extend(masks.warnings)
    notes.extend(masks.notes)
    notes.extend(describe(masks.injections))
    tls = creds.tls_terminate
    bundle = f"{PRIVATE_TMP}/{TRUST_BUNDLE_NAME}" if tls is not None else ""
    if bundle:
        notes.append(
            f"TLS termination for the injection hosts: the sandbox trusts sandhold's CA "
            f"through {bundle} (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, "
            "NODE_EXTRA_CA_CERTS, ...), bound read-only"
        )
    return CredentialPlan(
        masks=masks,
        tls=tls,
        plaintext_inject=creds.allow_plaintext_inject,
        sigv4=creds.sigv4,
        trust_bundle=bundle,
        ca_dir=ca_dir,
    )


def _environment(
    facts: SpecHost,
    home_visible: bool,
    creds: CredentialSettings | None = None,
    cred_plan: CredentialPlan | None = None,
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...], tuple[str, ...]]:
    """Every exec's base environment: the harness's scrubbed (``env.filter_environment``,
    every ``credentials.envVars`` name withheld), each masked variable as its
    placeholder, the private ``/tmp`` as TMPDIR, HOME where it is visible (else
    ``/tmp``), the trust bundle's variables with TLS termination, and the variables
    that point tools at the sandbox's own proxies (every native sandbox has them,
    its only way out)."""
    withheld = tuple(s.target for s in creds.sources if s.kind == "env") if creds else ()
    decision = filter_environment(dict(facts.environ), withheld=withheld)
    env = decision.as_mapping()
    if cred_plan is not None:
        env.update(cred_plan.masks.env)
        if cred_plan.trust_bundle:
            from sandhold.policy.credentials import TRUST_VARIABLES

            env.update(dict.fromkeys(TRUST_VARIABLES, cred_plan.trust_bundle))
    env.update(TMPDIR=PRIVATE_TMP, TMP=PRIVATE_TMP, TEMP=PRIVATE_TMP)
    home = env.get("HOME", "")
    env["HOME"] = home if home_visible and home else PRIVATE_TMP
    proxies = proxy_environment(HTTP_PROXY_PORT, SOCKS_PROXY_PORT)
    env.update(proxies)
    return tuple(sorted(env.items())), decision.dropped, tuple(sorted(proxies))


def _links_on(path: str, host: HostView) -> tuple[str, list[str]]:
    """Where ``path`` resolves, and every symlink on the way, in order (links in link
    targets too), as ``realpath`` follows them; at most 40, as the kernel. The
    caller compares the result with ``realpath``'s: a link swapped in and out
    between the two walks shows as two answers."""
    links: list[str] = []
    todo = [c for c in path.split("/") if c][::-1]
    cur = "/"
    while todo and len(links) <= 40:
        part = todo.pop()
        if part == ".":
            continue
        if part == "..":
            cur = cur.rpartition("/")[0] or "/"
            continue
        cand = f"{cur.rstrip('/')}/{part}"
        st = host.lstat(cand)
        if st is None or st.kind != SYMLINK:
            cur = cand
            continue
        links.append(cand)
        text = host.readlink(cand) or ""
        if text.startswith("/"):
            cur = "/"
        todo.extend(c for c in reversed(text.split("/")) if c)
    return cur, links


def _refuse_planted(
    spec: SandboxSpec, field: str, path: str, link: str, writable: list[str]
) -> None:
    """A bind path through a symlink a sandbox could have planted is refused (see the
    module rules), unless ``follow_symlinks`` names that link.

    Raises:
        SpecError: naming the bind, the link, why, and ``follow_symlinks``.
    """
    if link in spec.follow_symlinks:
        return
    parent = link.rpartition("/")[0] or "/"
    inside = next((w for w in writable if paths.is_within(link, w)), None)
    if parent in SYSTEM_LINK_DIRS and inside is None:
        return
    why = (
        f"inside {inside}, which this sandbox can write"
        if inside is not None
        else f"in {parent}, not a system directory ({', '.join(SYSTEM_LINK_DIRS)})"
    )
    raise SpecError(
        field,
        f"{path} passes through the symlink {link} ({why}): a sandbox that could write "
        "there may have planted it to redirect this bind. Bind the resolved path, or "
        f"add {link} to {FOLLOW_FIELD} if the harness made that link",
    )


def _homes(facts: SpecHost, bind_paths: list[str], host: HostView) -> list[str]:
    """The homes whose secret locations a bind may show: ``$HOME`` and the account's
    home always (a secret there may be a symlink to anywhere), and each home of the
    password database that a bind holds or lies in."""
    out = [h for h in (facts.home, facts.account_home) if h.startswith("/")]
    for home in facts.homes:
        if not home.startswith("/") or home in out:
            continue
        real = host.realpath(home)
        if any(paths.is_within(real, b) or paths.is_within(b, real) for b in bind_paths):
            out.append(home)
    return list(dict.fromkeys(out))


def _check_workdir(spec: SandboxSpec, workdir: str, host: HostView) -> None:
    """The working directory (``guest_workdir``, else the first bind) is a directory:
    bubblewrap would otherwise fail to start the sandbox, saying little of why.

    Raises:
        SpecError: naming ``guest_workdir``, or the first bind.
    """
    if workdir == "/":
        return
    stat = host.lstat(workdir)
    if spec.guest_workdir is not None:
        field, what = "guest_workdir", f"{spec.guest_workdir}"
    else:
        field = "bind_mounts[0].host_path"
        what = f"{spec.bind_mounts[0].host_path}, the first bind (the default working directory),"
    if stat is None:
        raise SpecError(field, f"{what} does not exist on this host")
    if stat.kind != DIR:
        fix = "name a directory" if spec.guest_workdir is not None else "set guest_workdir"
        raise SpecError(
            field, f"{what} is not a directory; the working directory must be one: {fix}"
        )


def _refuse_aliases(spec: SandboxSpec, binds: list[tuple[str, bool, str]]) -> None:
    """Two binds of one place (a symlink and its target, two spellings) that disagree on
    writability: which one the caller meant cannot be known, and the writable one would
    win silently, so the spec is refused.

    Raises:
        SpecError: naming both binds.
    """
    first: dict[str, int] = {}
    for j, (real, writable, _why) in enumerate(binds):
        i = first.setdefault(real, j)
        if binds[i][1] != writable:
            ro, rw = (i, j) if writable else (j, i)
            raise SpecError(
                f"bind_mounts[{j}].host_path",
                f"bind_mounts[{ro}] ({spec.bind_mounts[ro].host_path}, read-only) and "
                f"bind_mounts[{rw}] ({spec.bind_mounts[rw].host_path}, writable) are both "
                f"{real}: bind it once, read-only or not",
            )


def _mentions_visible(note: str, visible: list[str]) -> bool:
    return any(v in note for v in visible if v != "/")
