"""Which new names the creation-time supervisor refuses: the decision, with no I/O.

A name is "created" when ``open(O_CREAT)``, ``creat``, ``mkdir*``, ``mknod*``,
``symlink*``, ``bind`` (AF_UNIX) make it, or when it becomes a name as the
destination of ``rename*`` or ``link*``. ``denied(policy, path)`` answers for the
absolute, normalised path of that name (its parent resolved by the supervisor).

Rules (F-SET-5, F-BE-5), first match wins:
1. A path in private scratch (the session's TMPDIR) is never refused: nothing on
   the host trusts it and it is removed with the session. A scratch directory
   that holds a writable root (a host directory bound below a private /tmp) is
   no scratch: its names follow the rules below.
2. A path that is, or lies below, a ``denyWrite`` entry is refused. Literal
   entries count in both spellings (as written and symlink-resolved; resolving is
   the caller's host fact, F-SET-6); a glob refuses what it matches and
   everything below a match, as the mount plan does.
3. Below a writable root (the outermost one holding the path), looking only at
   the components below that root:
   - a component named like an agent/editor configuration directory
     (``mandatory.MANDATORY_DIRS``) is refused at any depth, so are the names
     inside it;
   - a component inside a ``.git`` directory named ``hooks``, ``config``
     (``mandatory.GIT_PROTECTED``) or ``commondir``/``config.worktree`` (they make
     git read another directory's config and hooks) is refused, at any depth
     below the ``.git`` (submodule and worktree git dirs live there too); this
     covers repositories created during the run, which exist only as names.
     So are git's lock files for its configs, ``config.lock`` and
     ``config.worktree.lock`` (``mandatory.GIT_CONFIG_LOCKS``): git fails at the lock
     and says so, where a refused rename after it may read as success; the lock of a
     config the run writes as its private copy (``config_copies``,
     ``git.allowConfig``) is allowed.
     One exception keeps ``git init`` and ``git clone`` working: in a ``.git``
     directory made during this run (``fresh``, a fact only the supervisor
     knows), its own ``config`` file and ``hooks`` directory may be made, and
     in that ``hooks`` directory only inert ``*.sample`` files: git never runs
     those, and renaming one to a hook's name is a refused creation;
   - a component inside a ``.hg`` directory named ``hgrc``, ``hgrc-not-shared``
     or ``sharedpath`` (``mandatory.HG_PROTECTED``) is refused, at any depth below
     the ``.hg``, with no exception for a ``.hg`` made during the run: ``hg init``
     makes none of them (only ``hg clone`` and ``hg share`` do), so a repository the
     sandbox makes runs nothing when hg is used in it on the host;
   - a component inside a ``.jj`` directory named ``config.toml``, ``config-id``,
     ``workspace-config.toml`` or ``workspace-config-id`` (``mandatory.JJ_PROTECTED``)
     is refused, at any depth below the ``.jj``, in one made during the run too
     (``jj git init`` makes none of them), and so is a ``repo`` directly inside a
     ``.jj`` made as anything but a directory (a secondary workspace's pointer to
     another repository, ``mandatory.JJ_POINTERS``: ``jj workspace add`` works into
     private scratch only);
   - the last component refused when it is a mandatory file name
     (``mandatory.MANDATORY_FILES``), matches a credential glob
     (``mandatory.CREDENTIAL_GLOBS``; not at or below a ``credential_exempt``
     entry, ``filesystem.allowCredentialWrite``, nor inside a recognised
     environment tree, ``mandatory.environment_tree``: a fact of the disk the caller passes in
     as ``exists``), or is ``.git``, ``.hg`` or ``.jj``
     and what is created is not a directory (a ``.git`` file or symlink points git
     at another repository; hg and jj follow a ``.hg`` or ``.jj`` symlink to another
     directory and read the config there).
   - (the supervisor's part, for it looks at the disk) inside the work tree of a
     repository that existed before the run, outside every ``.git``: a name in
     ``GIT_DIR_NAMES`` whose creation leaves its directory a git directory
     (``git_directory``: ``HEAD`` and ``refs`` or ``commondir``, over the names that
     directory holds), or gives one a ``config``, ``hooks``, ``commondir`` or
     ``config.worktree``, is refused: git takes such a directory for a repository (a
     bare one), and a shell prompt's ``git status`` there would use it and run its
     config. Decided by ``bare_repository_denied``; ``Decider.git_dir_name`` says
     when to ask.
   - (issue 16) a path that is one of mise's config spellings, or lies in one
     (``mandatory.mise_config``: ``mise/config.toml``, ``.config/mise/``,
     ``mise.<env>.toml`` ...), is refused;
   - (issue 16) directly in a writable home (``home_dots``, both spellings), a new
     name starting with ``.`` is refused unless ``home_grants`` names it
     (``mandatory.HOME_GRANTED`` and the user's ``allowWrite`` entries there):
     start-up files and tools' config live there, and a list of them would
     miss one (``git init ~`` included).
4. A symlink is also refused (the host follows it later, to names no rule
   checked there) when its path is on the way to a ``denyWrite`` entry: a proper
   ancestor of a literal one, or a match of a glob's leading components that end
   in a literal or ``*``-style component (``conf`` for ``conf/prod.yaml``,
   ``**/secrets`` for ``**/secrets/*``); or when it points (as written, or as
   resolved when made; the caller gives both) into a tree where rules are
   lifted and the link is not: private scratch, or an ``allowCredentialWrite``
   entry. Moving or hard-linking a symlink counts as making it there.
5. Anything else is allowed: outside the writable roots the mount plan keeps the
   tree read-only, and the kernel answers there.

The decision never looks at the disk: an existing file at a refused name is
refused too (the mount plan already made it read-only). The one disk fact rule 3
needs (does an environment tree's marker exist) comes in as a callback.

A credential refusal names the setting that lifts it, with the path to put there
(``mandatory.credential_reason``). Every refusal is a ``policy.refusal.Refusal``: its
``kind`` says which rule decided (code branches on it), its ``rule`` says it in words.
"""

from __future__ import annotations

import errno

from sandhold._record import record
from sandhold.policy import git, mandatory, paths
from sandhold.policy.git import GIT_DIR_CONFIG, git_directory
from sandhold.policy.mandatory import credential_reason, environment_tree
from sandhold.policy.refusal import (
    CREDENTIAL,
    DENY_PATH,
    HOME_DOT,
    MANDATORY,
    SYMLINK,
    UNIX_SOCKET,
    Refusal,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable

    from sandhold.policy.fsplan import FsPlan, FsRequest

GIT_DIR_NAMES = git.GIT_DIR_NAMES  # named through this module by the supervisor

SUPERVISOR_MISSING = "it needs seccomp user notification (Linux 5.9+); this kernel has none"
"""Why the supervisor cannot run, on a kernel without user notification (F-BE-5)."""

ACTION = "file-write-create"
"""The ``SandboxViolation.action`` of a refused creation."""

READ_ONLY_ACTION = "file-write-readonly"
"""The action of a trapped call that failed because the sandbox may not write there:
``EROFS`` (the mount plan's read-only tree), or ``EACCES`` where the sandbox may make
no name (Landlock). The kernel refused it, not these rules; see ``read_only``."""


def bare_repository_denied(name: str, names: Collection[str], *, moved: bool = False) -> bool:
    """Making ``name`` in a directory that holds ``names`` leaves a git directory there
    (``git_directory``), or gives one a config or hooks.

    ``names`` are what the directory holds before the call (``name`` among them when it
    is replaced or moved away), or, with ``moved``, what it brings along: a directory
    moved to a new place, ``name`` one of its own entries, is new there with all of them.
    Creation order does not matter: whichever of ``HEAD`` and ``refs`` (or
    ``commondir``) comes last completes it, and a config made first or last is refused
    with it. A directory that was a git directory already (a bare repository that
    existed before the run, whose ``config`` and ``hooks`` the mount plan keeps
    read-only) may get a new ``HEAD`` or ``refs`` (git's own work in it), never a name of
    ``GIT_DIR_CONFIG``.
    """
    if name not in GIT_DIR_NAMES or not git_directory({*names, name}):
        return False
    return moved or name in GIT_DIR_CONFIG or not git_directory(names)


@record
class CreationPolicy:
    """What the supervisor refuses (see the module rules). Paths are absolute and normal.

    ``deny_paths`` holds ``(pattern, origin)`` pairs: a literal path or an absolute
    glob, and where it came from (``filesystem.denyWrite[3]``) for the violation.
    """

    writable_roots: tuple[str, ...]
    deny_paths: tuple[tuple[str, str], ...] = ()
    scratch: tuple[str, ...] = ()
    file_names: tuple[str, ...] = mandatory.MANDATORY_FILES
    dir_names: tuple[str, ...] = mandatory.MANDATORY_DIRS
    git_names: tuple[str, ...] = (
        *(name for name, _ in mandatory.GIT_PROTECTED),
        *mandatory.GIT_POINTERS,
        *mandatory.GIT_CONFIG_LOCKS,
    )
    hg_names: tuple[str, ...] = mandatory.HG_PROTECTED
    jj_names: tuple[str, ...] = mandatory.JJ_PROTECTED
    credential_globs: tuple[str, ...] = mandatory.CREDENTIAL_GLOBS
    # filesystem.allowCredentialWrite: absolute paths or globs below which the credential
    # globs (only they) do not apply
    credential_exempt: tuple[str, ...] = ()
    # F-NET-5: the unix socket paths ``connect`` may reach (absolute, both spellings);
    # None: the supervisor does not see connects (unix sockets are all or nothing)
    unix_sockets: tuple[str, ...] | None = None
    # sandhold's private directories (every session's data and scratch): no symlink
    # may lead into one (rule 4)
    private: tuple[str, ...] = ()
    # host fact: the writable roots and their ancestors that held a .git, .hg or .jj at
    # launch (repositories a denyRead may hide from the sandbox's view)
    work_trees: tuple[str, ...] = ()
    # rule 3, a writable home: where new dot names are refused, and those granted
    home_dots: tuple[str, ...] = ()
    home_grants: tuple[str, ...] = ()
    # git.allowConfig: the repositories' ``.git/config`` files the run writes as its
    # private copy (bound there): their ``config.lock`` may be made, and its rename
    # over the config is carried out as a copy into the bound file (the supervisor)
    config_copies: tuple[str, ...] = ()


def creation_policy(
    *,
    writable_roots: Iterable[str],
    deny_write: Iterable[str] = (),
    scratch: Iterable[str] = (),
    cwd: str,
    home: str,
    realpath: Callable[[str], str] | None = None,
    unix_sockets: Iterable[str] | None = None,
    credential_exempt: Iterable[str] = (),
    extra_deny: Iterable[tuple[str, str]] = (),
    private: Iterable[str] = (),
    work_trees: Iterable[str] = (),
    home_dots: Iterable[str] = (),
    home_grants: Iterable[str] = (),
    config_copies: Iterable[str] = (),
) -> CreationPolicy:
    """Build the policy from settings-style entries.

    Args:
        writable_roots: absolute, resolved writable roots (``FsPlan.writable_roots``).
        deny_write: ``filesystem.denyWrite`` entries as written (relative, ``~``, globs).
        scratch: the session's private directories (its TMPDIR), absolute.
        cwd, home: what relative and ``~`` entries mean.
        realpath: the host fact for literal entries' second spelling (F-SET-6);
            ``None`` keeps the spelling as written only.
        unix_sockets: ``network.allowUnixSockets`` entries (literal paths), or None
            when unix sockets are not decided per path.
        credential_exempt: ``filesystem.allowCredentialWrite`` entries (as written).
        extra_deny: (absolute path, origin) pairs sandhold adds (its own code's
            places that do not exist yet).
        private: sandhold's private directories, absolute (rule 4).
        work_trees: the writable roots and ancestors that hold a repository on the
            host (``fsplan.work_trees``), for the supervisor's nested-repository rule.
        home_dots, home_grants: a writable home's spellings and the dot names
            granted there (``FsPlan.home_dots``, ``FsPlan.home_grants``; rule 3).
        config_copies: the ``.git/config`` files the run writes as its private copy
            (``git.allowConfig``), absolute and resolved.

    Returns:
        The policy; pure data, cheap to compare and to send to another process.
    """
    denies: list[tuple[str, str]] = []
    for i, entry in enumerate(deny_write):
        origin = f"filesystem.denyWrite[{i}]"
        path = paths.absolute(entry, cwd, home)
        denies.append((path, origin))
        if not paths.is_glob(path) and realpath is not None:
            resolved = realpath(path)
            if resolved != path:
                denies.append((resolved, origin))
    denies.extend(extra_deny)
    sockets = None
    if unix_sockets is not None:
        spelled = [paths.absolute(entry, cwd, home) for entry in unix_sockets]
        both = [realpath(p) for p in spelled] if realpath is not None else []
        sockets = tuple(sorted({*spelled, *both}))
        # an allowed socket's name may not be made by the sandbox (a bind, or a hard
        # link to another socket there), or the allowance would cover its socket
        for i, entry in enumerate(spelled):
            origin = f"network.allowUnixSockets[{i}]"
            denies.extend((p, origin) for p in dict.fromkeys((entry, *both[i : i + 1])))
    return CreationPolicy(
        writable_roots=tuple(sorted({paths.absolute(r, "/", home) for r in writable_roots})),
        deny_paths=tuple(denies),
        scratch=tuple(sorted({paths.absolute(s, "/", home) for s in scratch})),
        credential_exempt=tuple(paths.absolute(e, cwd, home) for e in credential_exempt),
        unix_sockets=sockets,
        private=tuple(sorted({paths.absolute(p, "/", home) for p in private})),
        work_trees=tuple(sorted(set(work_trees))),
        home_dots=tuple(sorted(set(home_dots))),
        home_grants=tuple(sorted(set(home_grants))),
        config_copies=tuple(sorted(set(config_copies))),
    )


def both_spellings(
    entries: Iterable[tuple[str, str]],
    realpath: Callable[[str], str],
    roots: Iterable[str] | None = None,
) -> tuple[tuple[str, str], ...]:
    """Each literal (path, origin) as written and, where it differs, symlink-resolved:
    ``extra_deny`` entries in the two spellings ``deny_write`` gets here (F-SET-6).

    ``roots``: keep only the spellings that lie in one of these writable roots or hold
    one; nowhere else can a name be made, so the rules stay short."""
    kept = None if roots is None else tuple(roots)
    out: list[tuple[str, str]] = []
    for path, origin in entries:
        resolved = realpath(path)
        for spelling in (path, resolved) if resolved != path else (path,):
            if kept is None or any(
                paths.is_within(spelling, r) or paths.is_within(r, spelling) for r in kept
            ):
                out.append((spelling, origin))
    return tuple(out)


def plan_denies(
    req: FsRequest, fs: FsPlan, realpath: Callable[[str], str]
) -> tuple[tuple[str, str], ...]:
    """The ``extra_deny`` entries for what a filesystem plan protects by path beyond the
    settings: the request's mandatory paths (``extra_deny_write``) and the places below
    a writable home it keeps (``home_deny_write``, ``fsplan.ungranted``), in both
    spellings, where a name could be made (in or around a writable root)."""
    from sandhold.policy.fsplan import ungranted

    roots = fs.writable_roots
    home = ungranted(req.home_deny_write, roots, realpath(req.home), realpath, around_roots=False)
    return (
        *both_spellings(req.extra_deny_write, realpath, roots),
        *both_spellings(home, realpath, roots),
    )


UNIX_ACTION = "unix-socket-connect"
"""The ``SandboxViolation.action`` of a refused unix socket connect (F-NET-5)."""


def unix_socket_denied(policy: CreationPolicy, path: str) -> Refusal | None:
    """Why ``connect`` may not reach the unix socket at ``path``, or None (F-NET-5).

    ``path`` is the socket's absolute, symlink-free path in the sandbox's view, as
    the supervisor found it; only the literal entries of ``allowUnixSockets`` (in
    both spellings) are reachable.
    """
    if policy.unix_sockets is not None and path in policy.unix_sockets:
        return None
    return Refusal(UNIX_SOCKET, "network.allowUnixSockets: not listed")


class Decider:
    """A policy compiled for the supervisor's hot path: one regex per rule kind.

    ``denied`` is the same decision as the module-level ``denied``; build one per
    policy and keep it (compiling costs about a millisecond).
    """

    __slots__ = (
        "_barriers",
        "_config_locks",
        "_cred",
        "_cred_exempt",
        "_denies",
        "_deny",
        "_dirs",
        "_files",
        "_git",
        "_hg",
        "_home_dots",
        "_home_grants",
        "_jj",
        "_private",
        "_roots",
        "_scratch",
        "_way_globs",
        "_ways",
    )

    def __init__(self, policy: CreationPolicy) -> None:
        import re  # the supervisor's side only: the CLI's start does not pay for it

        self._scratch = _free_scratch(policy)
        self._roots = _outermost(policy.writable_roots)
        self._denies = tuple(
            (re.compile(_subtree_regex(pattern), re.DOTALL), pattern, origin)
            for pattern, origin in policy.deny_paths
        )
        self._deny = (
            re.compile("|".join(f"(?:{rx.pattern})" for rx, _, _ in self._denies), re.DOTALL)
            if self._denies
            else None
        )
        self._files = frozenset(policy.file_names)
        self._dirs = frozenset(policy.dir_names)
        self._git = frozenset(policy.git_names)
        self._hg = frozenset(policy.hg_names)
        self._jj = frozenset(policy.jj_names)
        self._home_dots = frozenset(policy.home_dots)
        self._home_grants = frozenset(policy.home_grants)
        self._config_locks = frozenset(f"{c}.lock" for c in policy.config_copies)
        self._cred = tuple((paths.glob_matcher(g), g) for g in policy.credential_globs)
        exempt = "|".join(f"(?:{_subtree_regex(p)})" for p in policy.credential_exempt)
        self._cred_exempt = re.compile(exempt, re.DOTALL) if exempt else None
        # rule 4: where no symlink may lead, nor to a directory above (a later symlink
        # there could otherwise turn a target that passed into one that leads in)
        self._private = policy.private
        self._barriers = (
            *self._scratch,
            *policy.private,
            *(e for e in policy.credential_exempt if not paths.is_glob(e)),
        )
        # rule 4: the paths a symlink may not take, on the way to a deny entry
        self._ways: dict[str, str] = {}
        way_globs: dict[str, str] = {}
        for pattern, origin in policy.deny_paths:
            parts = pattern.split("/")
            for k in range(2, len(parts)):
                prefix = "/".join(parts[:k])
                if not paths.is_glob(prefix):
                    self._ways.setdefault(prefix, f"{origin}: {pattern}")
                elif parts[k - 1] != "**":  # '**' alone would take every directory
                    way_globs.setdefault(prefix, f"{origin}: {pattern}")
        self._way_globs = tuple(
            (re.compile(paths.glob_regex(g), re.DOTALL), reason) for g, reason in way_globs.items()
        )

    def denied(
        self,
        path: str,
        *,
        directory: bool = False,
        fresh: bool = False,
        link_to: tuple[str, ...] | None = None,
        exists: Callable[[str], bool] | None = None,
    ) -> Refusal | None:
        """Why ``path`` may not be created (see the module rules), or None.

        Args:
            path: absolute and normalised (no ``.``/``..``, no double or trailing slash).
            directory: what is created is a directory (``mkdir``, or the rename of one).
            fresh: the directory that would hold the new name is a ``.git`` made during
                this run, or the ``hooks`` directory made inside one (rule 3).
            link_to: what is created is a symlink: where it points, absolute and
                normalised, in each spelling the caller found (rule 4).
            exists: the host fact of rule 3's environment trees (does this path
                exist); None: no tree is recognised (every credential name refused).
        """
        if self.exempt(path):
            return None
        if self._deny is not None and self._deny.fullmatch(path):
            for rx, pattern, origin in self._denies:
                if rx.fullmatch(path):
                    return Refusal(DENY_PATH, f"{origin}: {pattern}")
        if link_to is not None:
            reason = self._link_denied(path, link_to)
            if reason is not None:
                return reason
        rel = self._below_root(path)
        if rel is None or path in self._config_locks:
            return None
        if self._home_dots:
            parent, _, name = path.rpartition("/")
            if name[:1] == "." and parent in self._home_dots and name not in self._home_grants:
                return Refusal(HOME_DOT, mandatory.HOME_DOT_REASON)
        if (mise := mandatory.mise_config(path.split("/"))) is not None:
            return Refusal(MANDATORY, mise)
        parts = rel.split("/")
        name_rule = self._names(parts, directory, fresh)
        if name_rule is not None:
            return Refusal(MANDATORY, name_rule)
        if self._cred_exempt and self._cred_exempt.fullmatch(path):
            return None
        glob = next((g for rx, g in self._cred if rx.fullmatch(parts[-1])), None)
        if glob is None:
            return None
        root = path[: len(path) - len(rel) - 1] or "/"
        if exists is not None and environment_tree(path, root, exists) is not None:
            return None
        return Refusal(CREDENTIAL, credential_reason(glob, path))

    def git_dir_name(self, path: str) -> bool:
        """Making ``path`` may leave its directory a git directory, or give one a config
        (rule 3, the supervisor's part): its last name is one of ``GIT_DIR_NAMES``, below a
        writable root and outside every ``.git`` there. In a ``.git`` the names that
        matter are refused anyway (rule 3), and git makes its own ``HEAD`` and ``refs``
        there (``logs/HEAD`` beside ``logs/refs``). Whether that directory lies in a
        work tree, and what else it holds, the supervisor looks up."""
        rel = self._below_root(path)
        if rel is None or self.exempt(path):
            return False
        parts = rel.split("/")
        return parts[-1] in GIT_DIR_NAMES and ".git" not in parts

    def _below_root(self, path: str) -> str | None:
        """``path`` relative to the outermost writable root holding it, or None."""
        for root in self._roots:
            if path.startswith(root + "/") or (root == "/" and path != "/"):
                return path[len(root) + 1 :] if root != "/" else path[1:]
        return None

    def exempt(self, path: str) -> bool:
        """``path`` is in private scratch, where every name may be created (rule 1)."""
        return any(path == s or path.startswith(s + "/") or s == "/" for s in self._scratch)

    def read_only(self, path: str, error: int) -> bool:
        """A call on ``path`` that failed with ``error`` was a write the sandbox may not
        make there. ``EACCES`` inside a writable root is the file's own permissions."""
        return error == errno.EROFS or (error == errno.EACCES and not self.may_make(path))

    def may_make(self, path: str) -> bool:
        """The sandbox may make names at ``path``: private scratch, or a writable root."""
        return self.exempt(path) or any(paths.is_within(path, r) for r in self._roots)

    def _link_denied(self, path: str, targets: tuple[str, ...]) -> Refusal | None:
        rule = self._link_rule(path, targets)
        return None if rule is None else Refusal(SYMLINK, rule)

    def _link_rule(self, path: str, targets: tuple[str, ...]) -> str | None:
        way = self._ways.get(path)
        if way is None:
            way = next((reason for rx, reason in self._way_globs if rx.fullmatch(path)), None)
        if way is not None:
            return f"{way} (a symlink on the way to it)"
        lifted = self._cred_exempt
        for target in targets:
            if self.exempt(target):
                return "a symlink into private scratch, where names are not checked"
            if lifted is not None and lifted.fullmatch(target) and not lifted.fullmatch(path):
                return (
                    "a symlink into filesystem.allowCredentialWrite, where credential "
                    "names are not checked"
                )
            for barrier in self._barriers:
                inside = paths.is_within(path, barrier) and paths.is_within(target, barrier)
                if paths.is_within(barrier, target) and not inside:
                    return (
                        f"a symlink to {target}, which holds {barrier}, where names are not checked"
                    )
            if any(paths.is_within(target, p) for p in self._private):
                return f"a symlink into sandhold's private data at {target}"
        return None

    def _names(self, parts: list[str], directory: bool, fresh: bool = False) -> str | None:
        last = len(parts) - 1
        in_git = in_hg = in_jj = False
        for i, name in enumerate(parts):
            if name in self._dirs:
                return f"mandatory: {name} (agent/editor configuration)"
            if (
                in_git
                and name in self._git
                and not (fresh and _fresh_repo_part(parts, i, directory))
            ):
                if name == "config.lock" and parts[i - 1] == ".git":
                    return (
                        f"mandatory: .git/{name} (git writes its config through it; "
                        'git.allowConfig, e.g. ["remote.*", "branch.*"], lets a run change '
                        "chosen keys of a repository's config, applied after the run)"
                    )
                if name in mandatory.GIT_CONFIG_LOCKS:
                    return (
                        f"mandatory: .git/{'/'.join(parts[parts.index('.git') + 1 : i + 1])} "
                        "(git writes a config through it; git.allowConfig covers a "
                        "repository's own .git/config only, not a worktree's or a "
                        "submodule's)"
                    )
                return f"mandatory: .git/{name} (git runs or trusts it)"
            if in_hg and name in self._hg:
                return f"mandatory: .hg/{name} (hg reads it as config)"
            if in_jj and name in self._jj:
                return f"mandatory: .jj/{name} (jj reads it as config)"
            if name == "repo" and 0 < i == last and not directory and parts[i - 1] == ".jj":
                return "mandatory: .jj/repo that is no directory (points jj at another repository)"
            if name == ".git":
                in_git = True
                if i == last and not directory:
                    return "mandatory: .git file (points git at another repository)"
            elif name == ".hg":
                in_hg = True
                if i == last and not directory:
                    return "mandatory: .hg that is no directory (a symlink points hg elsewhere)"
            elif name == ".jj":
                in_jj = True
                if i == last and not directory:
                    return "mandatory: .jj that is no directory (a symlink points jj elsewhere)"
        name = parts[last]
        if name in self._files:
            return f"mandatory: {name} (file run or trusted by the host)"
        return None


def link_text_denied(target: str) -> Refusal | None:
    """Why a symlink may not hold ``target`` as its text, whatever its path (rule 4).

    A ``..`` after a name climbs from wherever that name leads once a later symlink
    stands there, so the target could not be judged when the link is made; ``/proc``
    means another process's view on the host. A leading ``../`` is judged from the
    link's own directory (and again wherever the link is moved).
    """
    parts = target.split("/")
    names = [p for p in parts if p not in ("", ".")]
    first = next((i for i, p in enumerate(names) if p != ".."), len(names))
    if ".." in names[first:]:
        return Refusal(
            SYMLINK, f"a symlink to {target}: '..' after a name (write the target without it)"
        )
    if target.startswith("/") and names[:1] == ["proc"]:
        return Refusal(
            SYMLINK, f"a symlink to {target}: /proc means another process's view on the host"
        )
    return None


def _outermost(roots: Iterable[str]) -> tuple[str, ...]:
    """The roots no other root holds: the outermost root decides (more components are
    checked below it)."""
    unique = sorted(set(roots))
    return tuple(r for r in unique if not any(o != r and paths.is_within(r, o) for o in unique))


def fastpath_rules(policy: CreationPolicy) -> bytes:
    """The rules of the compiled supervisor's fast path (``_helper/fastpath.c``).

    The fast path performs a creation itself only when its test clears the new name,
    and hands every other call to the Python supervisor, which decides with
    ``denied``. So its test may be stricter than ``denied`` but never looser; it
    needs no regexes and no state (``fresh``):

    - ``S`` scratch: at or below, allowed (rule 1, exact);
    - ``D`` at or below a ``denyWrite`` entry, or below the literal directories a
      glob entry starts with: handed over (rule 2, widened for globs); for a glob
      whose last segment other than ``**`` is ``*``-only, an ``E`` record after it
      with that segment: only paths with a component below the directories that
      matches it are handed over (a match of the glob, or anything below one, has
      such a component);
    - a writable home's dot names (``home_dots``): as the glob ``<home>/.*`` would;
    - mise's config spellings: ``N`` ``mise`` and ``.config``, ``G`` its name globs;
    - ``R`` the outermost writable roots: outside them allowed (rule 5, exact);
    - ``N`` any component below the root named like ``MANDATORY_DIRS``, ``.git``,
      ``HG_PROTECTED`` or ``JJ_PROTECTED`` (inside a ``.hg`` or ``.jj`` or not),
      ``F`` a last component in ``MANDATORY_FILES``, ``.hg``, ``.jj`` or ``repo``
      (a new ``.hg`` or ``.jj``: its kind, and the repository around it, are
      Python's to judge; ``repo``: a secondary jj workspace's pointer), ``G`` a
      last component matching a
      credential glob (``*``-only globs; any other one is sent as ``*``): handed
      over (rule 3, widened: exemptions and fresh repositories are not known here);
      ``F`` also for ``GIT_DIR_NAMES`` (whether one completes a git directory in a
      work tree, only the supervisor looks up on disk).
      Unlike ``.git``, a ``.hg`` or ``.jj`` is no ``N``: rule 3 refuses only those
      few names in it, with no exception to know, so hg's and jj's own writes to
      their stores stay here.

    Symlinks (rule 4) are not made there at all: a symlink, or the move of one, is
    always handed over.

    Returns:
        NUL-terminated records, each a kind letter and a value.
    """
    records = [f"S{s}" for s in _free_scratch(policy)]
    for pattern, _origin in policy.deny_paths:
        records += _deny_records(pattern)
    for home in policy.home_dots:  # a writable home's dot names (rule 3): as a glob
        records += _deny_records(f"{home.rstrip('/')}/.*")
    records += [f"R{root}" for root in _outermost(policy.writable_roots)]
    records += [
        f"N{name}" for name in (*policy.dir_names, ".git", *policy.hg_names, *policy.jj_names)
    ]
    records += [f"F{name}" for name in (*policy.file_names, ".hg", ".jj", "repo", *GIT_DIR_NAMES)]
    records += ["Nmise", "N.config", *(f"G{g}" for g in mandatory.MISE_NAME_GLOBS)]  # mise's
    records += [
        f"G{glob}" if not any(c in glob for c in "?[]\\") else "G*"
        for glob in policy.credential_globs
    ]
    return "".join(f"{r}\0" for r in records).encode()


def _free_scratch(policy: CreationPolicy) -> tuple[str, ...]:
    """The scratch directories rule 1 exempts: those holding no writable root. A host
    directory bound below a private /tmp (a spec's bind of /tmp/x) is the user's tree,
    with the rules of any writable root."""
    return tuple(
        s
        for s in policy.scratch
        if not any(paths.is_within(root, s) for root in policy.writable_roots)
    )


def _deny_records(pattern: str) -> list[str]:
    if not paths.is_glob(pattern):
        return [f"D{pattern}"]
    parts = pattern.split("/")
    literal = next(i for i, part in enumerate(parts) if paths.is_glob(part))
    records = [f"D{'/'.join(parts[:literal]) or '/'}"]
    last = next((part for part in reversed(parts[literal:]) if part != "**"), None)
    if last is not None and not any(c in last for c in "?["):
        records.append(f"E{last}")
    return records


def _fresh_repo_part(parts: list[str], i: int, directory: bool) -> bool:
    """``parts[i]`` is what ``git init`` makes in a new ``.git``: its ``config`` file
    (and its lock), its ``hooks`` directory, or a ``*.sample`` file directly inside that."""
    last = len(parts) - 1
    if i == 0 or parts[i - 1] != ".git":
        return False
    if parts[i] in ("config", "config.lock"):  # git writes the one through the other
        return i == last and not directory
    if parts[i] == "hooks":
        if i == last:
            return directory
        return i == last - 1 and not directory and parts[last].endswith(".sample")
    return False


def _subtree_regex(pattern: str) -> str:
    """A regex for ``pattern`` (literal or glob) and every path below a match."""
    if pattern == "/":
        return "/.*"
    import re

    body = paths.glob_regex(pattern) if paths.is_glob(pattern) else re.escape(pattern)
    return f"(?:{body})(?:/.*)?"


_DECIDERS: dict[CreationPolicy, Decider] = {}


def denied(
    policy: CreationPolicy,
    path: str,
    *,
    directory: bool = False,
    fresh: bool = False,
    link_to: tuple[str, ...] | None = None,
    exists: Callable[[str], bool] | None = None,
) -> Refusal | None:
    """Why the name at absolute, normalised ``path`` may not be created, or None.

    Args:
        policy: the rules (see the module doc).
        path: the name about to be created or to become a name.
        directory: the new name is a directory (``.git``, ``.hg``, ``.jj`` and a
            ``.jj``'s ``repo`` care).
        fresh: its directory is a ``.git`` made during the run, or its ``hooks``.
        link_to: the new name is a symlink to these (absolute, normalised) paths.
        exists: the host fact for environment trees (rule 3); None recognises none.

    Returns:
        A ``Refusal``: its ``kind`` (``policy.refusal.KINDS``) says which rule, its
        ``rule`` is the one-line text of the violation record (``origin: pattern``,
        ``mandatory: …``, ``credential: …`` ...); None when the creation may go ahead.
    """
    decider = _DECIDERS.get(policy)
    if decider is None:
        if len(_DECIDERS) > 16:
            _DECIDERS.clear()
        decider = _DECIDERS[policy] = Decider(policy)
    return decider.denied(path, directory=directory, fresh=fresh, link_to=link_to, exists=exists)


def describe(policy: CreationPolicy) -> list[str]:
    """What the creation-time supervisor refuses, in words (``--explain``)."""
    out = ["names refused when they are made (creation-time supervisor, F-BE-5):"]
    out.append("  in: " + ", ".join(policy.writable_roots))
    out.extend(f"  {pattern} and below    <- {origin}" for pattern, origin in policy.deny_paths)
    out.append("  at any depth: " + ", ".join((*policy.file_names, *policy.credential_globs)))
    if policy.credential_exempt:
        out.append(
            "  credential names allowed below: "
            + ", ".join(policy.credential_exempt)
            + "    <- filesystem.allowCredentialWrite"
        )
    out.append(
        "  credential names allowed inside environment trees (issue 15): "
        + "; ".join(
            f"{what} ({'any directory' if name == '*' else name} holding {marker})"
            for name, marker, _depth, what in mandatory.ENVIRONMENT_TREES
        )
    )
    out.append("  directories at any depth: " + ", ".join(policy.dir_names))
    out.append(
        "  in a .git: " + ", ".join(policy.git_names) + " (a .git made during the run may "
        "get its own config and hooks/*.sample)"
    )
    out.append("  in a .hg: " + ", ".join(policy.hg_names) + " (a .hg made during the run too)")
    out.append(
        "  in a .jj: " + ", ".join(policy.jj_names) + ", and repo as anything but a directory "
        "(a .jj made during the run too)"
    )
    out.append(
        "  in the work tree of a repository that existed before the run: "
        + ", ".join(GIT_DIR_NAMES)
        + " where they would make a git directory (a bare repository) or give one a config"
    )
    if _free_scratch(policy):
        out.append("  never refused in: " + ", ".join(_free_scratch(policy)))
    if policy.unix_sockets is not None:
        out.append(
            "unix sockets a connect may reach (network.allowUnixSockets): "
            + (", ".join(policy.unix_sockets) or "none")
        )
    return out
