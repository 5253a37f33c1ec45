"""From settings and a command to a launch plan: every decision, none of the doing.

Rules: the plan is a value. It names the backend, the command, the working
directory, the exact environment (and what was dropped), the filesystem plan,
the syscall rules and the network mode, each with where it came from, plus the
warnings the user must see. Backends carry a plan out without deciding
anything; ``--explain`` prints it. Host facts arrive through ``HostView``.
"""

from __future__ import annotations

from sandhold._record import record, replace
from sandhold.policy.confinement import check_pinned, confine
from sandhold.policy.creation import SUPERVISOR_MISSING
from sandhold.policy.env import (
    HTTP_PROXY_PORT,
    SOCKS_PROXY_PORT,
    EnvDecision,
    filter_environment,
    proxy_environment,
)
from sandhold.policy.fsplan import FsPlan, FsRequest, plan_filesystem
from sandhold.policy.limits import CgroupFacts, Limits
from sandhold.policy.limits import choose as choose_limits

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from sandhold.policy.creation import CreationPolicy
    from sandhold.policy.credentials import Sigv4Policy, TlsTerminate
    from sandhold.policy.fsplan import HostView
    from sandhold.policy.masking import MaskPlan
    from sandhold.policy.placeholders import AwsKeys, Injection
    from sandhold.policy.syscalls import Rule
    from sandhold.settings import Settings

BACKENDS = ("native", "none")


@record
class EgressPlan:
    """The session's proxies: where they listen inside the sandbox and what they allow.

    The domain lists are as written in settings; the proxies build their
    ``DomainPolicy`` from them (and from each live ``--control-fd`` update).
    """

    allowed_domains: tuple[str, ...]
    denied_domains: tuple[str, ...]
    allow_all_domains: bool = False
    http_port: int = HTTP_PROXY_PORT
    socks_port: int = SOCKS_PROXY_PORT
    transparent: bool = True  # issue 20: every TCP connection and DNS query goes through them
    # masked credentials: each placeholder, its real value and its hosts (their repr
    # hides the value); the TLS termination settings and the plaintext opt-in
    injections: tuple[Injection, ...] = ()
    tls: TlsTerminate | None = None
    plaintext_inject: bool = False
    sigv4: Sigv4Policy | None = None
    # masked AWS pairs (net/sigv4.AwsKeys, built here from the injections): the
    # proxy re-signs requests signed with their placeholder key id
    aws_keys: tuple[AwsKeys, ...] = ()
    trust_bundle: str = ""  # where the runner writes the bundle the sandbox trusts
    ca_dir: str = ""  # sandhold's own CA, when tls has no caCertPath


@record
class LaunchRequest:
    """What the caller asked for, with the host facts the decision needs."""

    command: tuple[str, ...]
    cwd: str
    home: str
    environ: tuple[tuple[str, str], ...]
    settings: Settings
    backend: str
    tmpdir: str  # the session's private TMPDIR
    private_root: str  # where all sessions' private data lives
    inherit_env: bool = False
    egress_wanted: bool = False  # proxies up even with nothing allowed (live control, audit)
    # --violations: the supervisor runs even with nothing to refuse, to record the
    # writes the kernel refuses at read-only paths (it sees only the calls it traps)
    record_writes: bool = False
    supervisor: bool = False  # the creation-time supervisor can run here (F-BE-5)
    supervisor_blocker: str = SUPERVISOR_MISSING  # why it cannot, when it cannot
    runner_paths: tuple[str, ...] = ()  # what sandhold's front reads in the sandbox
    # where Python code sandhold runs is loaded from (the runner's, and this process's
    # sys.path, which it imports from lazily after the command ran): read-only inside
    # writable roots, or the sandbox could plant code that runs outside it
    code_paths: tuple[str, ...] = ()
    # (path, origin): files sandhold itself reads or writes on the host around the run
    # (the settings file, --violations): read-only inside writable roots, and not to be
    # made when missing, or the sandbox could make the next run trust what it wrote
    host_files: tuple[tuple[str, str], ...] = ()
    # (mount point, type) of the host's kernel file systems (hostfs.kernel_mounts): the
    # read-only view of the host shows them; those outside /proc, /sys and /dev (a
    # chroot's /proc) are hidden, as the sandbox's own /proc and /dev hide the host's
    kernel_mounts: tuple[tuple[str, str], ...] = ()
    root: bool = False  # sandhold runs as root (limits: RLIMIT_NPROC does not bind root)
    # what the host offers for the limits (``cgroups.limit_facts``); None: no cgroup
    cgroups: CgroupFacts | None = None
    # the package managers' cache of sandboxed runs on the host (``PACKAGE_CACHES``;
    # made and checked by the caller: a directory of this user's, mode 0700, reached
    # through no symlink), or "" for none
    package_cache: str = ""
    # where placeholders for masked credentials get their randomness (os.urandom);
    # None: masked variables are withheld instead
    entropy: Callable[[int], bytes] | None = None
    # (absolute path, text or None): what the caller read of each masked credential
    # file (None: missing, not a regular file, a symlink, too large or not UTF-8)
    masked_file_texts: tuple[tuple[str, str | None], ...] = ()


@record
class LaunchPlan:
    backend: str
    command: tuple[str, ...]
    cwd: str
    env: EnvDecision
    environment: tuple[tuple[str, str], ...]  # exactly what the child gets
    fs: FsPlan | None  # None: no isolation (backend none)
    syscalls: tuple[Rule, ...]
    network: str
    egress: EgressPlan | None
    settings_source: str
    warnings: tuple[str, ...]
    notes: tuple[str, ...]
    creation: CreationPolicy | None = None  # names the supervisor refuses; None: no supervisor
    # where the command may write (Landlock, beside the usual devices, where the kernel
    # has it; every native launch, supervised or not); None: backend none
    landlock: tuple[str, ...] | None = None
    # the sandbox's process and memory limits (``policy.limits``); None: backend none
    limits: Limits | None = None
    # (path, text): masked credential files as the sandbox sees them (placeholders
    # only), bound over the hiding mount of the real file
    masked_files: tuple[tuple[str, str], ...] = ()
    # git.allowConfig: the repositories' .git/config files the run writes as a private
    # copy bound in their place; the host applies the allowed changes after the run
    config_copies: tuple[str, ...] = ()
    # the network is off: the sandbox's resolver asks 127.0.0.1:53 in its namespace,
    # where sandhold answers REFUSED and notes the names (``backends.linux.offline``)
    offline_dns: bool = False


_RUNNER_CODE = "sandhold: its code in front of the command (Landlock, creation-time supervisor)"
_OWN_CODE = "sandhold: its own code"


# Caches the tools keep below the home by default, which is read-only unless it is a
# writable root: (variable that moves it, where it is otherwise, below $TMPDIR
# instead). npm and pip fail without theirs (npm install, pip building an sdist).
CACHES: tuple[tuple[str, str, str], ...] = (
    ("XDG_CACHE_HOME", ".cache", ".cache"),  # pip, go, yarn, and most XDG tools
    ("npm_config_cache", ".npm", ".npm"),  # npm's cache and logs
)


# Package managers' caches (issue 15): (the variable that moves one, its directory
# below ``LaunchRequest.package_cache``, ``pkg-cache`` in sandhold's private base).
# That directory belongs to sandboxed runs only, never the host's own caches (~/.npm,
# ~/.cache/pip), which a sandbox could poison for the host; it persists across runs
# (npx and uvx start without a download the second time) and is writable like the
# TMPDIR, where no name is refused: nothing on the host runs from it. It lies in the
# private base, which every sandbox's view hides, so no sandbox can swap it for a
# symlink, and no symlink may lead there (creation rule 4) nor to a directory above
# (a link to the home stays allowed, which a cache below the home would forbid).
# Every sandboxed run of this user shares it, whatever its settings: a package one run
# fetched, another runs. A variable the user passed through wins.
PACKAGE_CACHES: tuple[tuple[str, str], ...] = (
    ("npm_config_cache", "npm"),  # npm's cache, npx's installs (_npx) and logs
    # pnpm: up to 10 its store is $PNPM_HOME/store (it reads store-dir only as
    # npm_config_store_dir, on which every npm run warns "Unknown env config"), and
    # $PNPM_HOME is its global-dir and global-bin-dir; later ones read pnpm_config_*
    ("PNPM_HOME", "pnpm"),
    ("pnpm_config_store_dir", "pnpm/store"),
    ("YARN_CACHE_FOLDER", "yarn"),  # yarn 1
    ("YARN_GLOBAL_FOLDER", "yarn-berry"),  # yarn 2+ (its global cache)
    ("PIP_CACHE_DIR", "pip"),
    ("UV_CACHE_DIR", "uv/cache"),  # uv's cache, uvx's tool environments
    ("UV_TOOL_DIR", "uv/tools"),  # uv tool install (uv's data dir, read-only in ~)
    ("UV_TOOL_BIN_DIR", "uv/bin"),
    ("UV_PYTHON_INSTALL_DIR", "uv/python"),
    ("CARGO_HOME", "cargo"),  # registry and git checkouts; ~/.cargo/config.toml unread
    ("GOMODCACHE", "go/mod"),
    ("GOCACHE", "go/build"),
    ("GOPATH", "go/path"),  # go install's bin/ (and the module cache, but for GOMODCACHE)
)
_PACKAGE_CACHE = "sandhold: the package managers' cache of sandboxed runs"


# With the network off every lookup and connect fails at once in the sandbox's own
# network namespace, but package managers retry a failed fetch: npm for about 70 s
# (fetch-retries 2, 10 s then 60 s apart) before it says why (issue 15). These make
# them run offline instead, from their caches, and fail at once on what is not there;
# a variable the user passed through wins.
NETWORK_OFF_ENV: tuple[tuple[str, str], ...] = (
    ("npm_config_offline", "true"),  # npm, npx and pnpm: the cache only, no retries
    ("npm_config_fetch_retries", "0"),
    ("YARN_ENABLE_OFFLINE_MODE", "1"),  # yarn 2+
    ("PIP_RETRIES", "0"),  # pip's five retries with backoff
    ("UV_OFFLINE", "1"),  # uv and uvx: the cache only
    ("CARGO_NET_OFFLINE", "true"),
    ("GOPROXY", "off"),  # go: no module download
)


def _caches(req: LaunchRequest, env: dict[str, str], fs: FsPlan | None) -> dict[str, str]:
    """Where the sandbox's caches go: below the session's $TMPDIR for each cache whose
    place is read-only in the plan and that no passed variable moved elsewhere."""
    from sandhold.policy import paths

    if fs is None:
        return {}
    home = req.home.rstrip("/")
    return {
        name: f"{req.tmpdir}/{scratch}"
        for name, default, scratch in CACHES
        if name not in env
        and not any(paths.is_within(f"{home}/{default}", r) for r in fs.writable_roots)
    }


def _session_env(
    req: LaunchRequest,
    base: dict[str, str],
    egress: EgressPlan | None,
    fs: FsPlan | None,
    cache: str = "",
) -> dict[str, str]:
    env = dict(base)
    if egress is not None:
        env.update(proxy_environment(egress.http_port, egress.socks_port))
        if egress.trust_bundle:
            from sandhold.policy.credentials import TRUST_VARIABLES

            env.update(dict.fromkeys(TRUST_VARIABLES, egress.trust_bundle))
    if req.backend == "native":
        for name in ("TMPDIR", "TMP", "TEMP"):
            env[name] = req.tmpdir
        if cache:
            for name, sub in PACKAGE_CACHES:
                env.setdefault(name, f"{cache}/{sub}")
        env.update(_caches(req, env, fs))
        if egress is None:
            for name, value in NETWORK_OFF_ENV:
                env.setdefault(name, value)
    env["PWD"] = req.cwd
    safe = req.settings.git_safe_directories
    if safe:
        count = int(env.get("GIT_CONFIG_COUNT", "0") or "0")
        for i, d in enumerate(safe, start=count):
            env[f"GIT_CONFIG_KEY_{i}"] = "safe.directory"
            env[f"GIT_CONFIG_VALUE_{i}"] = d
        env["GIT_CONFIG_COUNT"] = str(count + len(safe))
    return env


def _package_cache(
    fs_req: FsRequest, fs: FsPlan, host: HostView, cache: str, notes: list[str]
) -> tuple[FsRequest, FsPlan, str]:
    """The plan with the package cache (``PACKAGE_CACHES``), or, when it lies in or
    holds a writable root (a writable /tmp), the plan again without it, said in a
    note: the cache is no writable root's, where the rules of names would apply."""
    from sandhold.policy import paths

    if not any(paths.is_within(cache, r) or paths.is_within(r, cache) for r in fs.writable_roots):
        return fs_req, fs, cache
    notes.append(
        f"the package cache {cache} lies in a writable root: not used this run (the "
        "caches are per run, below $TMPDIR)"
    )
    fs_req = replace(fs_req, scratch=())
    return fs_req, plan_filesystem(fs_req, host), ""


def _elsewhere(mounts: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The kernel file system mounts to hide: those outside the trees the sandbox has
    of its own (/proc, /dev) or shows whole on purpose (/sys)."""
    from sandhold.policy import paths

    return tuple(
        (where, f"sandhold: the host's {kind} mounted here")
        for where, kind in mounts
        if not any(paths.is_within(where, tree) for tree in ("/proc", "/sys", "/dev"))
    )


def _git_configs(req: LaunchRequest, environ: Mapping[str, str]) -> tuple[str, ...]:
    """git's system and user config files, for the plan to follow; only where the
    sandbox may write (the module is not loaded otherwise)."""
    if not req.settings.filesystem.allow_write:
        return ()
    from sandhold.policy.gitconfig import host_files

    return host_files(req.home, environ)


def _masks(
    req: LaunchRequest, environ: Mapping[str, str], env: EnvDecision, warnings: list[str]
) -> tuple[EnvDecision, MaskPlan]:
    """Each masked variable set on the host gets its placeholder, and (native) each
    masked file its copy (``masking.plan_masks``, F-CRED-2). Every
    ``credentials.envVars`` name was withheld by ``filter_environment`` already, so a
    failure here can only leave one out.

    Raises:
        SettingsError: ``onExtractNoMatch: error`` and nothing matched.
    """
    from sandhold.policy import paths
    from sandhold.policy.credentials import CredentialsProblem
    from sandhold.policy.masking import plan_masks

    creds = req.settings.credentials
    try:
        masks = plan_masks(
            creds.sources,
            creds.aws_pairs,
            values=environ,
            file_texts=dict(req.masked_file_texts),
            entropy=req.entropy,
            absolute=lambda p: paths.absolute(p, req.cwd, req.home),
            files=req.backend == "native",
        )
    except CredentialsProblem as exc:
        from sandhold.errors import SettingsError

        raise SettingsError(req.settings.source, exc.key, exc.reason) from None
    warnings.extend(masks.warnings)
    if not masks.env:
        return env, masks
    given = dict(masks.env)
    passed = tuple(sorted((*env.passed, *given.items())))
    dropped = tuple(d for d in env.dropped if d[0] not in given)
    return EnvDecision(passed, dropped, env.inherited_credentials), masks


def plan_launch(req: LaunchRequest, host: HostView) -> LaunchPlan:
    """Decide everything about running ``req.command`` (see module rules).

    Raises:
        UnenforceablePolicy: a rule cannot be enforced on the chosen backend.
    """
    s = req.settings
    warnings = list(s.warnings)
    notes = list(s.notes)
    environ: Mapping[str, str] = dict(req.environ)
    env = filter_environment(
        environ, passthrough=s.env_passthrough, withheld=s.env_deny, inherit=req.inherit_env
    )
    config_copies: tuple[str, ...] = ()
    offline_dns = False
    masks: MaskPlan | None = None
    if s.credentials.masked:
        env, masks = _masks(req, environ, env, warnings)
        notes.extend(masks.notes)
    injections = masks.injections if masks is not None else ()
    masked_files = masks.files if masks is not None else ()
    if req.inherit_env:
        leaked = ", ".join(env.inherited_credentials) or "none found"
        warnings.append(
            "--inherit-env: the sandbox gets the whole environment; "
            f"credential-looking variables passed: {leaked}"
        )
    fs: FsPlan | None = None
    egress: EgressPlan | None = None
    syscalls: tuple[Rule, ...] = ()
    network = "host network (no isolation)"
    creation: CreationPolicy | None = None
    landlock: tuple[str, ...] | None = None
    cache = req.package_cache if req.backend == "native" else ""
    if req.backend == "native":
        from sandhold.policy.mandatory import home_paths, user_config_paths

        tls = s.credentials.tls_terminate
        ca_dir = ""
        ca_hidden: tuple[tuple[str, str], ...] = ()
        if tls is not None:
            from sandhold.policy.credentials import default_ca_dir

            if tls.ca_key_path is None:
                ca_dir = default_ca_dir(req.home, environ.get("XDG_STATE_HOME"))
                ca_hidden = ((ca_dir, "sandhold: its TLS termination CA"),)
            else:
                ca_hidden = ((tls.ca_key_path, "network.tlsTerminate.caKeyPath"),)

        fs_req = FsRequest(
            cwd=req.cwd,
            home=req.home,
            tmpdir=req.tmpdir,
            private_root=req.private_root,
            deny_read=s.filesystem.deny_read,
            extra_deny_read=(*_elsewhere(req.kernel_mounts), *ca_hidden),
            allow_read=s.filesystem.allow_read,
            allow_write=s.filesystem.allow_write,
            deny_write=s.filesystem.deny_write,
            extra_deny_write=user_config_paths(
                req.home, environ.get("XDG_CONFIG_HOME"), environ.get("JJ_CONFIG")
            ),
            home_deny_write=home_paths(req.home, environ.get("PATH")),
            git_configs=_git_configs(req, environ),
            supervised=req.supervisor,
            credential_exempt=s.filesystem.allow_credential_write,
            skip_link_check=s.filesystem.skip_hard_link_check,
            extra_allow_read=tuple((p, _RUNNER_CODE) for p in req.runner_paths),
            extra_read_only=(
                *((p, _OWN_CODE) for p in dict.fromkeys((*req.runner_paths, *req.code_paths))),
                *req.host_files,
            ),
            scratch=((cache, _PACKAGE_CACHE),) if cache else (),
        )
        fs = plan_filesystem(fs_req, host)
        if cache:
            fs_req, fs, cache = _package_cache(fs_req, fs, host, cache, notes)
        notes.extend(fs.notes)
        warnings.extend(fs.warnings)
        check_pinned(fs, req.supervisor_blocker)
        net = s.network
        per_path_sockets = bool(net.allow_unix_sockets) and not net.allow_all_unix_sockets
        if per_path_sockets and not req.supervisor:
            from sandhold.errors import UnenforceablePolicy

            raise UnenforceablePolicy(
                "network.allowUnixSockets",
                "native",
                "unix sockets are reached by path only through the supervisor, and "
                f"{req.supervisor_blocker}",
            )
        supervise = req.supervisor and bool(
            fs.writable_roots or per_path_sockets or req.record_writes
        )
        if s.git_allow_config and fs.repo_configs:
            if not supervise:
                from sandhold.errors import UnenforceablePolicy

                raise UnenforceablePolicy(
                    "git.allowConfig",
                    "native",
                    "a run writes its copy of a repository's config through the "
                    f"creation-time supervisor, and {req.supervisor_blocker}",
                )
            config_copies = fs.repo_configs
        confined = confine(
            fs_req,
            fs,
            host,
            supervise=supervise,
            scratch=(req.tmpdir, *((cache,) if cache else ())),
            landlock=True,  # applied where the kernel has it (the front asks it)
            deny_write=s.filesystem.deny_write,
            # a PYTHONPATH entry not there yet, say; and every spelling of what
            # sandhold reads back, so that no name (a symlink, a directory) on the
            # way to one that passes through a symlink can be made anew
            extra_deny=(*((p, _OWN_CODE) for p in req.code_paths), *req.host_files),
            unix_sockets=net.allow_unix_sockets if per_path_sockets else None,
            credential_exempt=s.filesystem.allow_credential_write,
            allow_unix_sockets=net.allow_all_unix_sockets,
            config_copies=config_copies,
        )
        creation, landlock, syscalls = confined.creation, confined.landlock, confined.syscalls
        if net.allowed_domains or net.allow_all_domains or req.egress_wanted:
            from sandhold.policy.credentials import TRUST_BUNDLE_NAME

            creds = s.credentials
            egress = EgressPlan(
                net.allowed_domains,
                net.denied_domains,
                net.allow_all_domains,
                injections=injections,
                tls=creds.tls_terminate,
                plaintext_inject=creds.allow_plaintext_inject,
                sigv4=creds.sigv4,
                aws_keys=masks.aws_keys if masks is not None else (),
                trust_bundle=f"{req.tmpdir}/{TRUST_BUNDLE_NAME}" if tls is not None else "",
                ca_dir=ca_dir,
            )
            allowed = (
                "every domain"
                if net.allow_all_domains
                else (", ".join(net.allowed_domains) or "nothing yet")
            )
            network = (
                f"through sandhold's proxies only (HTTP 127.0.0.1:{egress.http_port}, "
                f"SOCKS5 127.0.0.1:{egress.socks_port}); allowed: {allowed}"
            )
            if net.denied_domains:
                network += f"; denied: {', '.join(net.denied_domains)}"
            if injections:
                names = ", ".join(dict.fromkeys(i.name for i in injections))
                network += f"; masked credentials put back by the proxy: {names}"
        else:
            offline_dns = req.backend == "native"
            network = (
                "off: own network namespace, loopback only (connects fail at once; "
                "lookups are answered REFUSED at once from 127.0.0.1:53 there and their "
                "names said in one line; npm, pip, uv, cargo and go run offline: "
                + ", ".join(f"{n}={v}" for n, v in NETWORK_OFF_ENV)
                + "; network.allowedDomains opens hosts)"
            )
    else:
        notes.append("backend none: no filesystem or network isolation; environment scrubbed")
    return LaunchPlan(
        backend=req.backend,
        command=req.command,
        cwd=req.cwd,
        env=env,
        environment=tuple(sorted(_session_env(req, env.as_mapping(), egress, fs, cache).items())),
        fs=fs,
        syscalls=syscalls,
        network=network,
        egress=egress,
        settings_source=s.source,
        warnings=tuple(warnings),
        notes=tuple(notes),
        creation=creation,
        landlock=landlock,
        limits=None
        if fs is None
        else choose_limits(
            root=req.root,
            processes=s.limit_processes,
            memory_mib=s.limit_memory_mib,
            cgroups=req.cgroups,
        ),
        masked_files=masked_files,
        config_copies=config_copies,
        offline_dns=offline_dns,
    )
