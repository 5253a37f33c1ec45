"""The filesystem plan: from path rules and host facts to an ordered list of mounts.

Rules (F-SET-4, F-SET-5, F-SET-6, F-BE-4):
- Everything is readable and nothing writable, unless a rule says otherwise.
- Read: the most specific rule covering a path decides; at the same path
  ``allowRead`` beats ``denyRead``. So ``allowRead`` carves a readable hole in a
  denied directory, and a ``denyRead`` more specific than that hole still holds.
- Write: a path is writable when an ``allowWrite`` entry covers it, it is
  readable, and no write deny covers it. Write denies are ``denyWrite``, the
  mandatory names and the credential globs, at any depth of every writable root;
  a write deny beats any ``allowWrite``, however specific.
- Literal entries are enforced at their symlink-resolved location (a mount
  follows symlinks); glob entries are matched against what exists at launch.
- A write-protected name must keep its place: each directory between it and a
  writable parent becomes a mount point too ("rename guard"), because a mount
  point cannot be renamed or removed, so ``mv .git .git2`` cannot free the name.
- A protected name that does not exist yet, and every name only known by
  pattern, can only be kept from being made by the creation-time supervisor.
  With ``supervised`` that is its job; without, they are listed in
  ``FsPlan.unpinned`` and the caller refuses the launch (F-BE-5). Nothing is
  ever created in the user's tree.
- What a git config points git at is protected as ``.git/config`` is, where it lies
  in a writable root (``protect_git_pointers``): the files it includes, its
  ``core.hooksPath``, and each file a program setting names (``core.fsmonitor``,
  filters, drivers, pagers, editors, helpers, aliases: ``gitconfig.PROGRAM_KEYS``).
- Under a writable home, every top-level dot entry stays read-only and no new one
  is made (``mandatory.HOME_GRANTED``), but the data places tools write and what
  the user names in ``allowWrite``.
- A read-denied file with other hard links is refused (``UnenforceablePolicy``):
  its other names would stay readable. So is a file inside a read-denied
  directory with more links than the denied trees hold names of it (a name in an
  ``allowRead`` hole is a readable one). The denied trees are walked for them up
  to ``MAX_LINK_WALK`` entries in all; trees beyond that, or listed in
  ``skip_link_check``, go unchecked, and the plan warns (``FsPlan.warnings``),
  naming them: a deficit found then may lie in them, so it is warned, not refused.
  A write-protected file's other names in writable roots are protected with it.

The host is only seen through the ``HostView`` passed in; this module does no I/O.
"""

from __future__ import annotations

from sandhold._record import record
from sandhold.errors import UnenforceablePolicy
from sandhold.policy import mandatory, paths
from sandhold.policy.repository import REPOSITORY_DIRS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Container, Iterable, Iterator
    from typing import Protocol

    from sandhold.policy.gitconfig import GitConfig

    class HostView(Protocol):
        """Host facts the plan needs; a dict-backed fake in tests."""

        def realpath(self, path: str) -> str: ...

        def lstat(self, path: str) -> Stat | None: ...

        def readlink(self, path: str) -> str | None:
            """The text of the symlink at ``path``; None if it is none."""
            ...

        def read_bytes(self, path: str, limit: int) -> bytes | None:
            """At most ``limit`` bytes of the regular file at ``path`` (symlinks
            followed); None if nothing is there. Never blocks (a FIFO is not read).

            Raises:
                UnenforceablePolicy: something else is there, or it cannot be read:
                    what it holds cannot be checked.
            """
            ...

        def walk(
            self, root: str, unreadable: list[str] | None = None
        ) -> Iterator[tuple[str, list[str], list[str]]]:
            """Like ``os.walk(root)`` without following symlinks (symlinks are in files);
            directories that cannot be listed are skipped, and appended to ``unreadable``."""
            ...

        def scan_links(self, root: str, skip: Container[str], limit: int) -> LinkScan:
            """The regular files below the directory ``root`` with more than one hard
            link, looking at no more than ``limit`` entries (each name in a directory
            is one) and not at the paths in ``skip`` or below them. Symlinks are not
            followed; directories that cannot be listed are skipped."""
            ...


DIR, FILE, SYMLINK, OTHER = "dir", "file", "symlink", "other"
HOOKS_PATH = "core.hooksPath"

_GIT_INERT = ("objects", "refs", "logs", "lfs")  # no config or hooks are read below these
_UNCHECKED = "unreadable at launch: its names were not checked"

MAX_LINK_WALK = 2_000
"""The most entries of the read-denied trees looked at for hard links
(``_check_denied_trees``): about 3 ms of ``lstat`` calls on a loaded 2-core machine.
Every entry costs a system call (the link count is in the inode), so a bigger bound
is paid on every launch; beyond it the plan warns."""

# Trees the sandbox gets fresh copies of; host rules below them are moot.
PRIVATE_TREES = ("/dev", "/proc")


@record
class Stat:
    kind: str  # DIR, FILE, SYMLINK or OTHER
    dev: int = 0
    ino: int = 0
    nlink: int = 1


@record
class LinkScan:
    """What ``HostView.scan_links`` found below one directory."""

    linked: tuple[tuple[str, int, int, int], ...]  # (path, dev, ino, nlink), nlink > 1
    entries: int  # the entries looked at
    complete: bool  # False: it stopped at the limit, the rest is not looked at


@record
class FsRequest:
    """What the filesystem plan is computed from. Entries are as written in settings."""

    cwd: str
    home: str
    tmpdir: str  # the session's private TMPDIR on the host (writable, not walked)
    private_root: str  # where sandhold keeps every session's data (hidden)
    deny_read: tuple[str, ...] = ()
    allow_read: tuple[str, ...] = ()
    allow_write: tuple[str, ...] = ()
    deny_write: tuple[str, ...] = ()
    # (absolute literal path, origin) denied like a denyWrite entry (mandatory paths)
    extra_deny_write: tuple[tuple[str, str], ...] = ()
    # (path, origin) write-denied like extra_deny_write where the home is writable
    # (``ungranted``): the places below a writable home the host runs from
    home_deny_write: tuple[tuple[str, str], ...] = ()
    deny_read_origin: str = "filesystem.denyRead"
    extra_deny_read: tuple[tuple[str, str], ...] = ()  # (entry, origin) added by callers
    extra_allow_read: tuple[tuple[str, str], ...] = ()  # sandhold's own files it must read
    # sandhold's own code run inside the sandbox (the supervisor's interpreter and
    # package): read-only even inside a writable root, or the sandbox could edit it
    extra_read_only: tuple[tuple[str, str], ...] = ()
    credential_exempt: tuple[str, ...] = ()  # allowCredentialWrite: no credential globs below
    # git's system and user config files (``gitconfig.host_files``): what they point
    # git at, in every repository, is protected where the sandbox could write it
    git_configs: tuple[str, ...] = ()
    supervised: bool = False  # the creation-time supervisor guards names made later
    # (path, origin): secret places the sandbox does not see at all (no bind shows
    # them), whose files' hard links it might (``check_links``)
    unseen: tuple[tuple[str, str], ...] = ()
    # filesystem.skipHardLinkCheck: read-denied trees whose files' hard links the user
    # accepts are not checked (entries as written)
    skip_link_check: tuple[str, ...] = ()
    # sandhold's own directories beside the TMPDIR that the sandbox may write, exempt as
    # it is (the package managers' cache of sandboxed runs, cliplan.PACKAGE_CACHES)
    scratch: tuple[tuple[str, str], ...] = ()  # (absolute path, origin)


@record
class Mount:
    """One step of the plan. ``op`` is bind, ro-bind, hide-dir, hide-file or remount-ro."""

    op: str
    path: str
    reason: str
    # hide-dir only: 0000 (read-only as mounted), or 0111 when carve-outs lie below
    # (then writable until the remount-ro that follows the carve-outs' mounts)
    perms: str = ""


@record
class FsPlan:
    mounts: tuple[Mount, ...]
    writable_roots: tuple[str, ...]
    unpinned: tuple[str, ...]  # patterns/names only enforced for what exists at launch
    notes: tuple[str, ...]
    # (path, origin): names inside a writable root that must not be made (again), the
    # supervisor's to refuse like denyWrite paths: sandhold's own code that does not
    # exist yet (as the first missing name on the way to it), and what git config
    # points git at that is missing or is a symlink (``protect_git_pointers``)
    unmade: tuple[tuple[str, str], ...] = ()
    # allowWrite roots a write deny covers whole: they stay read-only (said in ``notes``)
    dropped_roots: tuple[str, ...] = ()
    # the work trees the walk found in the writable roots (the directories holding a
    # .git, .hg or .jj, and bare repositories): host facts for the supervisor's
    # repository rules, which hold even once their metadata is moved away
    work_trees: tuple[str, ...] = ()
    # a writable home (``mandatory.HOME_GRANTED``): its spellings, where no dot name
    # is made but those granted (the supervisor's rule, ``creation``)
    home_dots: tuple[str, ...] = ()
    home_grants: tuple[str, ...] = ()
    # the ``config`` files (regular files, resolved) of the ``.git`` directories found
    # in the writable roots: what ``git.allowConfig`` gives the run a private copy of
    repo_configs: tuple[str, ...] = ()
    # what the user must be told on every launch: read-denied trees whose hard links
    # were not all checked (``_check_denied_trees``)
    warnings: tuple[str, ...] = ()


@record
class _Rule:
    path: str  # resolved, absolute
    allow: bool
    origin: str


def work_trees(roots: Iterable[str], host: HostView) -> tuple[str, ...]:
    """The writable ``roots`` and their ancestors that hold a ``.git``, ``.hg`` or ``.jj``
    on the host: the repositories whose work tree a root lies in, even where a
    ``denyRead`` hides them from the sandbox (the supervisor refuses a repository made
    inside)."""
    found: set[str] = set()
    for root in roots:
        for at in (root, *paths.ancestors(root)):
            if at in found:
                break  # and its ancestors were looked at already
            if any(host.lstat(f"{at.rstrip('/')}/{name}") for name in (".git", ".hg", ".jj")):
                found.add(at)
    return tuple(sorted(found))


def _entries(entries: Iterable[str], origin: str) -> list[tuple[str, str]]:
    return [(e, f"{origin}[{i}]") for i, e in enumerate(entries)]


class _Planner:
    def __init__(self, req: FsRequest, host: HostView) -> None:
        self.req = req
        self.host = host
        self.notes: list[str] = []
        self.warnings: list[str] = []  # FsPlan.warnings
        self.unpinned: list[str] = []
        self.read_rules: list[_Rule] = []
        self.write_roots: list[tuple[str, str]] = []  # (path, origin)
        self.write_denied: dict[str, str] = {}  # path -> origin
        self.guards: dict[str, str] = {}  # writable paths kept in place -> what for
        self.home_denied: set[str] = set()  # write_denied paths of home_deny_write
        self.code_dirs: list[str] = []  # sandhold's own code, read-only in a writable root
        self.unmade: list[tuple[str, str]] = []  # FsPlan.unmade
        self.dropped_roots: list[str] = []  # FsPlan.dropped_roots
        self.git_dirs: list[str] = []  # the git dirs the walk found (bare ones too)
        self.git_files: list[str] = []  # the .git files and symlinks it found
        self.repo_configs: list[str] = []  # <work tree>/.git/config, regular files
        self.found_trees: list[str] = []  # FsPlan.work_trees
        self.home_dots: tuple[str, ...] = ()  # FsPlan.home_dots
        self.home_grants: tuple[str, ...] = ()  # FsPlan.home_grants
        self.kinds: dict[str, str] = {}
        self.git_parsed: dict[str, GitConfig] = {}  # by resolved path
        self.hooks_done: set[str] = set()
        self._read_index: dict[str, _Rule] | None = None  # built once read rules are final
        # The backend creates both before launch; --explain plans without creating them.
        self.kinds[req.private_root] = DIR
        self.kinds[req.tmpdir] = DIR
        for path, _origin in req.scratch:
            self.kinds[path] = DIR

    # -- expansion ---------------------------------------------------------

    def _refuse_planted_link(self, literal: str, origin: str) -> None:
        """A symlink on the way to a write entry below the working directory, the
        home directory (where sandboxes are routinely let write) or any writable root
        of this launch (an earlier run with the same settings could write there)
        may be one an earlier sandbox left, ``build -> ~`` or ``out -> ~/.local/bin``:
        it would silently make its target writable, so the entry must name the target
        itself. Call it once every writable root is known. Each component is looked
        at where it physically is, so no spelling of the entry, the cwd or ``HOME``
        (``//``, ``/.``, a symlinked ancestor) walks around the check."""
        tops = {self.host.realpath(t) for t in (self.req.cwd, self.req.home) if t}
        tops.update(root for root, _ in self.write_roots)
        at = "/"
        for part in (p for p in literal.split("/") if p):
            here = self.host.realpath(at).rstrip("/")
            at = f"{here}/{part}"
            inside = any(paths.is_within(at, t) and at != t for t in tops)
            if inside and self._kind(at) == SYMLINK:
                raise UnenforceablePolicy(
                    f"{origin} {literal}",
                    "native",
                    f"{at} is a symlink to {self.host.realpath(at)}: write access would "
                    "go to its target, which a sandbox could have chosen. Name the "
                    "target itself if that is what you mean",
                )

    def _abs(self, entry: str) -> str:
        return paths.absolute(entry, self.req.cwd, self.req.home)

    def _kind(self, path: str) -> str | None:
        if path not in self.kinds:
            st = self.host.lstat(path)
            if st is None:
                return None
            self.kinds[path] = st.kind
        return self.kinds[path]

    def _private(self, path: str) -> bool:
        return any(paths.is_within(path, t) for t in PRIVATE_TREES) or paths.is_within(
            path, self.req.private_root
        )

    def expand(
        self, entry: str, origin: str, *, pin: bool = False, unlisted: list[str] | None = None
    ) -> list[str]:
        """Concrete, resolved, existing-or-not paths an entry names.

        ``pin``: the entry protects names from being written, so a glob's matches
        created after launch are a gap to report. ``unlisted``: see ``_glob_matches``.
        """
        pattern = self._abs(entry)
        if not paths.is_glob(pattern):
            return [self.host.realpath(pattern)]
        found = [self.host.realpath(p) for p in self._glob_matches(pattern, unlisted)]
        if pin:
            self.unpinned.append(f"{entry} ({origin})")
        return found

    def _glob_matches(self, pattern: str, unlisted: list[str] | None = None) -> list[str]:
        """What an absolute glob matches now, as found (a matching symlink unresolved).

        ``unlisted`` gets each directory that may hold a match but cannot be listed:
        its names were not checked, though one known by name may still be opened.
        """
        prefix = paths.static_prefix(pattern)
        base = self.host.realpath(prefix)
        if self._kind(base) != DIR:
            return []
        return self._matches_from(base, pattern[len(prefix) :].lstrip("/"), base, unlisted)

    def _matches_from(
        self, base: str, rest: str, top: str, unlisted: list[str] | None = None
    ) -> list[str]:
        """Matches of ``rest`` (relative to ``base``) at or below ``top``, a directory
        in ``base``; ``top`` itself is not matched."""
        matcher = paths.glob_matcher(rest)
        found: list[str] = []
        locked: list[str] = []

        def rel(path: str) -> str:
            return path[len(base) :].lstrip("/")

        for dirpath, dirnames, filenames in self.host.walk(top, locked):
            rel_dir = rel(dirpath)
            for name in (*dirnames, *filenames):
                if matcher.fullmatch(f"{rel_dir}/{name}" if rel_dir else name):
                    found.append(f"{dirpath}/{name}")
            # nothing below these can match: no need to list them
            below = f"{rel_dir}/" if rel_dir else ""
            dirnames[:] = [d for d in dirnames if paths.may_match_below(rest, below + d)]
        if unlisted is not None:
            unlisted.extend(d for d in locked if paths.may_match_below(rest, rel(d)))
        return found

    # -- rule collection -----------------------------------------------------

    def _refuse_glob_spelled_bases(self) -> None:
        """Rule paths are read as patterns: relative and ``~`` entries under a cwd or home
        named ``x[1]``, or sandhold's own files there, would name other paths (``x1``)
        and miss these. Such a base stops the launch instead."""
        req = self.req
        bases = [("the working directory", req.cwd), ("the home directory", req.home)]
        bases += [(what, self.host.realpath(p)) for what, p in bases]
        bases += [
            ("filesystem.denyWrite", self.host.realpath(self._abs(e)))
            for e in req.deny_write
            if not paths.is_glob(e)
        ]
        bases += [
            (origin, p)
            for p, origin in (*req.extra_read_only, *req.extra_allow_read, *req.extra_deny_write)
        ]
        bases += [(origin, self.host.realpath(p)) for p, origin in req.extra_deny_write]
        for what, path in bases:
            if paths.is_glob(path):
                raise UnenforceablePolicy(
                    f"{what} {path}",
                    "native",
                    "its path has glob characters (*?[), and sandhold reads rule paths "
                    "as patterns: a rule there would name other paths and miss this one. "
                    "Run sandhold from, or install it in, a directory without them",
                )

    def collect(self) -> None:
        req = self.req
        self._refuse_glob_spelled_bases()
        self.read_rules.append(_Rule(req.private_root, False, "sandhold: every session's data"))
        self.read_rules.append(_Rule(req.tmpdir, True, "sandhold: this session's TMPDIR"))
        self.read_rules.extend(_Rule(path, True, origin) for path, origin in req.scratch)
        reads = _entries(req.deny_read, req.deny_read_origin) + list(req.extra_deny_read)
        unlisted: list[tuple[str, str, str]] = []  # (directory, entry, origin)
        for entry, origin in reads:
            locked: list[str] = []
            for path in self.expand(entry, origin, unlisted=locked):
                if not self._private(path):
                    self.read_rules.append(_Rule(path, False, origin))
            unlisted.extend((d, entry, origin) for d in locked if not self._private(d))
        for entry, origin in _entries(req.allow_read, "filesystem.allowRead"):
            for path in self.expand(entry, origin):
                if not self._private(path):
                    self.read_rules.append(_Rule(path, True, origin))
        for entry, origin in req.extra_allow_read:  # sandhold's own: private ones too
            self.read_rules.extend(_Rule(p, True, origin) for p in self.expand(entry, origin))
        writes = _entries(req.allow_write, "filesystem.allowWrite")
        for entry, origin in writes:
            for path in self.expand(entry, origin):
                if self._private(path):
                    self.notes.append(f"{origin} {entry}: inside a private tree, left as is")
                elif self._kind(path) is None:
                    self.notes.append(f"{origin} {entry}: does not exist, nothing to allow")
                else:
                    self.write_roots.append((path, origin))
        # once every root is known: a link in any of them may be an earlier run's
        for entry, origin in writes:
            literal = self._abs(entry)
            if paths.is_glob(literal):
                self._refuse_planted_link(paths.static_prefix(literal), origin)
                for match in self._glob_matches(literal):
                    self._refuse_planted_link(match, origin)
            else:
                self._refuse_planted_link(literal, origin)
        self._hide_unlisted(unlisted)
        for entry, origin in _entries(req.deny_write, "filesystem.denyWrite"):
            if paths.is_glob(entry):
                pin = bool(self.write_roots) and not req.supervised
                locked = []
                for path in self.expand(entry, origin, pin=pin, unlisted=locked):
                    if self._touches_writable(path):
                        self._protect_existing(path, origin)
                for path in self._matches_in_roots_below(entry, locked):
                    self._protect_existing(path, origin)
                continue
            self._deny_literal(self._abs(entry), origin)
        for literal, origin in req.extra_deny_write:
            self._deny_literal(literal, origin)
        for entry, origin in req.extra_read_only:
            for path in self.expand(entry, origin):
                if not self._touches_writable(path):
                    continue
                if self._kind(path) is None:
                    # made later it would be code too: refused, as is a symlink or a
                    # rename at its first missing ancestor
                    first = paths.first_missing(path, lambda a: self._kind(a) is not None)
                    self.unmade.append((first, origin))
                    self._missing(path)
                    continue
                if not self._writable_region(path) or any(r == path for r, _ in self.write_roots):
                    raise UnenforceablePolicy(
                        f"{origin} {path}",
                        "native",
                        "it holds a writable root: the sandbox could plant code there "
                        "that sandhold runs later, outside the sandbox. Install sandhold "
                        "elsewhere, or take that directory off PYTHONPATH",
                    )
                self.write_denied.setdefault(path, origin)
                if self._kind(path) == DIR:
                    self.code_dirs.append(path)

    def _hide_unlisted(self, unlisted: list[tuple[str, str, str]]) -> None:
        """A read-deny glob could not check the names in these directories, yet a
        name known in one (``chmod 0311`` leaves it searchable) can still be opened:
        each is hidden whole, or the launch stops if that would hide what the
        policy lets the sandbox use."""
        keep = [
            (self.host.realpath(self.req.cwd), "the working directory"),
            *self.write_roots,
            *((r.path, r.origin) for r in self.read_rules if r.allow),
        ]
        for path, entry, origin in unlisted:
            for kept, why in keep:
                if paths.is_within(kept, path):
                    raise UnenforceablePolicy(
                        f"{origin} {entry}",
                        "native",
                        f"{path} cannot be listed, so the names in it cannot be checked, "
                        f"and hiding it whole would hide {kept} ({why}). Fix its "
                        f"permissions (chmod u+rx {path}) and run again",
                    )
            self.read_rules.append(_Rule(path, False, f"{origin}: {_UNCHECKED}"))

    def _matches_in_roots_below(self, entry: str, unlisted: list[str]) -> list[str]:
        """A glob's matches in writable roots inside directories its walk could not
        list: the roots' own walks can (one inside a root is read-only whole)."""
        pattern = self._abs(entry)
        prefix = paths.static_prefix(pattern)
        base, rest = self.host.realpath(prefix), pattern[len(prefix) :].lstrip("/")
        found: list[str] = []
        for root, _origin in self.write_roots:
            if not any(paths.is_within(root, d) and root != d for d in unlisted):
                continue
            # the root, or a directory holding it, may be a match the walk missed
            found.extend(
                path
                for path in (root, *paths.ancestors(root))
                if path != base
                and paths.is_within(path, base)
                and paths.glob_match(rest, path[len(base) :].lstrip("/"))
            )
            if self._kind(root) == DIR:
                found.extend(self._matches_from(base, rest, root))
        return [self.host.realpath(p) for p in found]

    def _drop_denied_roots(self) -> None:
        """A write deny covers its whole subtree, allowWrite entries below it included."""
        kept = []
        for root, origin in self.write_roots:
            deny = next((d for d in self.write_denied if paths.is_within(root, d)), None)
            if deny is None:
                kept.append((root, origin))
            else:
                self.notes.append(
                    f"{origin} {root} stays read-only: {self.write_denied[deny]} denies {deny}"
                )
                self.dropped_roots.append(root)
        self.write_roots = kept

    def _deny_literal(self, literal: str, origin: str) -> None:
        resolved = self.host.realpath(literal)
        if not self._touches_writable(resolved):
            return  # read-only already
        if self._kind(resolved) is None:
            self._missing(resolved)
        else:
            self._protect_existing(literal, origin)

    def _touches_writable(self, path: str) -> bool:
        """``path`` lies in a writable root or contains one."""
        return self._writable_region(path) or any(
            paths.is_within(root, path) for root, _ in self.write_roots
        )

    def _writable_region(self, path: str) -> bool:
        roots = {root for root, _ in self.write_roots}
        return _covered(path, roots) is not None

    def _missing(self, path: str) -> None:
        """A protected name that does not exist: only the supervisor can keep it unmade."""
        if self.req.supervised:
            return  # refused when it is created
        parent = path
        for anc in paths.ancestors(path):
            parent = anc
            if self._kind(anc) is not None:
                break
        if self._writable_region(parent) and self.visible(parent):
            self.unpinned.append(path)

    def scan_writable_roots(self) -> None:
        """Mandatory names and credential globs at any depth of every writable root."""

        cred = mandatory.CREDENTIAL_GLOBS  # '*' only: matched without regexes
        assert not any(c in g for g in cred for c in "?["), "star_match needs '*'-only globs"
        credential = paths.StarNames(cred)  # asked of every file name in the roots
        roots = sorted({r for r, _ in self.write_roots if self._kind(r) == DIR})
        outermost = [r for r in roots if not any(r != o and paths.is_within(r, o) for o in roots)]
        locked: list[str] = []
        for root in outermost:
            for dirpath, dirnames, filenames in self.host.walk(root, locked):
                # a bare repository (HEAD, objects/, refs/ and no .git: a local remote)
                # runs its hooks on a push to it, and git reads its config
                if _bare_repository(dirnames, filenames):
                    self.found_trees.append(dirpath)
                    self._protect_git_dir(dirpath)
                    # what makes git take it for a repository stays: renamed away
                    # by one run, the next would not know it, and write its hooks
                    if "HEAD" in filenames:
                        self._protect_existing(
                            f"{dirpath}/HEAD", "mandatory: a bare repository's HEAD"
                        )
                    for name in ("objects", "refs"):
                        if name in dirnames:
                            self.guards.setdefault(f"{dirpath}/{name}", f"{dirpath}/HEAD")
                    dirnames[:] = []
                # unlike a .git, a .hg or .jj is walked like any directory (an mq queue
                # in .hg/patches has its own .hg, hg-git keeps a bare repository in
                # .hg/git, jj its git backend's in .jj/repo/store/git): the names hg
                # and jj read as config, at any depth in it
                hg = _below(dirpath, root, ".hg")
                jj = _below(dirpath, root, ".jj")
                for name in dirnames:
                    path = f"{dirpath}/{name}"
                    if name in REPOSITORY_DIRS:
                        self.found_trees.append(dirpath)
                    if name == ".git":
                        self._protect_git_dir(path)
                    elif name == ".hg":
                        self._pin_missing(path, mandatory.HG_PROTECTED)
                    elif name == ".jj":
                        self._pin_missing(path, mandatory.JJ_CONFIG_PATHS)
                    elif name in mandatory.MANDATORY_DIRS:
                        self.write_denied.setdefault(path, f"mandatory: {name}")
                    elif mandatory.mise_config((dirpath.rsplit("/", 1)[-1], name)):
                        self.write_denied.setdefault(path, mandatory.MISE_REASON)
                    if hg is not None and name in mandatory.HG_PROTECTED:
                        self._protect_existing(path, f"mandatory: .hg/{hg}{name}")
                    if jj is not None and name in mandatory.JJ_PROTECTED:
                        self._protect_existing(path, f"mandatory: .jj/{jj}{name}")
                # .git is handled above (objects need not be walked); private trees are ours
                dirnames[:] = [
                    d for d in dirnames if d != ".git" and not self._private(f"{dirpath}/{d}")
                ]
                for name in filenames:
                    reason = mandatory.mandatory_reason(name) or mandatory.mise_config(
                        (dirpath.rsplit("/", 1)[-1], name)
                    )
                    if name in REPOSITORY_DIRS:
                        self.found_trees.append(dirpath)
                    if name == ".git":
                        reason = "mandatory: .git file (points git at a repository)"
                        self.git_files.append(f"{dirpath}/{name}")
                    elif name == ".hg":
                        reason = "mandatory: .hg symlink (points hg at another directory)"
                    elif name == ".jj":
                        reason = "mandatory: .jj symlink (points jj at another directory)"
                    elif hg is not None and name in mandatory.HG_PROTECTED:
                        reason = f"mandatory: .hg/{hg}{name}"
                    elif jj is not None and (
                        name in mandatory.JJ_PROTECTED or jj + name in mandatory.JJ_POINTERS
                    ):
                        reason = f"mandatory: .jj/{jj}{name}"
                    elif (
                        reason is None
                        and credential(name)
                        and not self._credential_exempt(f"{dirpath}/{name}")
                        # a package's file in a venv or node_modules (issue 15)
                        and mandatory.environment_tree(f"{dirpath}/{name}", root, self._exists)
                        is None
                    ):
                        glob = next(g for g in cred if paths.star_match(g, name))
                        reason = mandatory.credential_reason(glob, f"{dirpath}/{name}")
                    if reason is not None:
                        self._protect_existing(f"{dirpath}/{name}", reason)
        # Not listable now, but its owner can chmod it inside the sandbox and then write
        # to whatever protected names it holds: kept read-only whole.
        for path in locked:
            if not self._private(path):
                self.write_denied.setdefault(path, _UNCHECKED)
        if outermost and not self.req.supervised:
            self.unpinned.extend(
                [
                    *(f"**/{n}" for n in mandatory.MANDATORY_FILES),
                    *(f"**/{n}/" for n in mandatory.MANDATORY_DIRS),
                    "**/.git/hooks/",
                    "**/.git/config",
                    *(f"**/.hg/{n}" for n in mandatory.HG_PROTECTED),
                    *(f"**/.jj/{n}" for n in mandatory.JJ_CONFIG_PATHS),
                    *(f"**/{g}" for g in mandatory.CREDENTIAL_GLOBS),
                ]
            )

    def _exists(self, path: str) -> bool:
        return self._kind(path) is not None

    def _credential_exempt(self, path: str) -> bool:
        """``path`` lies at or below an ``allowCredentialWrite`` entry."""
        for entry in self.req.credential_exempt:
            pattern = self._abs(entry)
            if paths.is_glob(pattern):
                if any(paths.glob_match(pattern, p) for p in (path, *paths.ancestors(path))):
                    return True
            elif paths.is_within(path, pattern):
                return True
        return False

    def _protect_existing(self, path: str, reason: str) -> None:
        """Write-protect an existing name; ``path`` as spelled (the last part may be a link)."""
        if self._kind(path) == SYMLINK:
            target = self.host.realpath(path)
            if not self.req.supervised:
                self.notes.append(
                    f"{path} is a symlink: its target {target} is protected, but the name "
                    "itself can be replaced without the creation-time supervisor"
                )
                self.unpinned.append(path)
            if self._kind(target) is not None and self._writable_region(target):
                self.write_denied.setdefault(target, reason)
            return
        self.write_denied.setdefault(self.host.realpath(path), reason)

    def _protect_git_dir(self, git_dir: str) -> None:
        self.git_dirs.append(git_dir)
        # the supervisor knows these names only below a ".git": a bare repository's
        # missing ones (a hooks directory, a commondir leading to another's config)
        # are refused by path
        bare = not git_dir.endswith("/.git")
        for name in (
            *(n for n, _ in mandatory.GIT_PROTECTED),
            *(mandatory.GIT_POINTERS if bare else ()),
        ):
            path = f"{git_dir}/{name}"
            if self._kind(path) is None:
                self._missing(path)
                if bare and self._writable_region(path):
                    self.unmade.append((path, f"mandatory: a bare repository's {name}"))
            elif name in mandatory.GIT_POINTERS:
                continue  # the walk below protects an existing one
            else:
                if name == "config" and not bare and self._kind(path) == FILE:
                    self.repo_configs.append(self.host.realpath(path))
                self._protect_existing(path, f"mandatory: .git/{name}")
        # Submodule and worktree git dirs (modules/<name>/..., worktrees/<name>/) have
        # their own config, hooks and pointers to a config, at any depth: git runs them
        # as it runs the top ones (config.worktree at the top too, once
        # extensions.worktreeConfig is on). A git dir's object store, refs and logs hold
        # none of them; a submodule may be named "logs", so only a git dir's own
        # (it has a HEAD) are skipped.
        names = {*(n for n, _ in mandatory.GIT_PROTECTED), *mandatory.GIT_POINTERS}
        locked: list[str] = []
        for dirpath, dirnames, filenames in self.host.walk(git_dir, locked):
            for name in (*dirnames, *filenames):
                if name in names:
                    rel = f"{dirpath}/{name}"[len(git_dir) + 1 :]
                    self._protect_existing(f"{dirpath}/{name}", f"mandatory: .git/{rel}")
            if "HEAD" in filenames and dirpath != git_dir:
                self.git_dirs.append(dirpath)  # a submodule's or a worktree's
            inert = _GIT_INERT if "HEAD" in filenames or dirpath == git_dir else ()
            dirnames[:] = [d for d in dirnames if d not in (*inert, *names)]
        for path in locked:
            self.write_denied.setdefault(path, _UNCHECKED)

    # -- what git config points git at ---------------------------------------------

    def protect_git_pointers(self) -> None:
        """What git reads or runs because a config says so (``gitconfig`` rules): the
        files each config includes, at any depth, each ``core.hooksPath`` directory,
        where each symlink in a hooks directory leads, and each file a program
        setting names (``core.fsmonitor = tools/fsm.sh``, a filter, an alias). Where that lies in a
        writable root it is protected as ``.git/config`` and ``.git/hooks`` are:
        read-only if it exists, else not to be made; every symlink on the way to it
        is not to be made again. For every repository the walk found, every one a
        writable root lies in (``work_trees``), and git's own configs.

        Raises:
            UnenforceablePolicy: a config git may read that sandhold cannot read as
                git would (unreadable, not a file, too large, a line git refuses, a
                ``~user`` path, more than ``MAX_FILES`` includes), or a hooks
                directory that holds a writable root.
        """
        roots = sorted({r for r, _ in self.write_roots})
        if not roots:
            return
        repos: dict[str, set[str]] = {}  # git dir -> where its hooks run (relative hooksPath)
        for git_dir in self.git_dirs:
            parent, name = git_dir.rsplit("/", 1)
            repos.setdefault(git_dir, set()).add((parent or "/") if name == ".git" else git_dir)
        above = [f"{w.rstrip('/')}/.git" for w in work_trees(roots, self.host)]
        for dotgit in (*self.git_files, *above):
            found = self._git_dir_at(dotgit)
            if found is not None:
                repos.setdefault(found, set()).add(dotgit.rsplit("/", 1)[0] or "/")
        shared = self._git_config_values(self.req.git_configs, "git: its user or system config")
        for git_dir, tops in repos.items():
            common = self._common_dir(git_dir)
            # hooks that a push runs in the receiving repository (pre-receive, update,
            # post-receive ...) run in $GIT_DIR, so a relative hooksPath means a
            # directory there too (githooks(5)), also in a repository with a work tree
            bases = {*tops, git_dir, common}
            own = (f"{common}/config", f"{common}/config.worktree", f"{git_dir}/config.worktree")
            values = self._git_config_values(dict.fromkeys(own), "", f"git: config of {git_dir}")
            if self._kind(f"{common}/hooks") is not None:
                self._protect_hooks(f"{common}/hooks", f"mandatory: hooks of {git_dir}")
            for setting, value, source in (*values, *shared):
                for base in sorted(bases):
                    path = self._git_path(value, base, source)
                    if path is None:
                        continue
                    if setting == HOOKS_PATH:
                        self._protect_hooks(path, f"git: core.hooksPath in {source}")
                    else:  # a program git runs (gitconfig.PROGRAM_KEYS)
                        self._protect_followed(path, f"git: {setting} in {source} runs it")

    def _git_config_values(
        self, tops: Iterable[str], origin: str, existing: str = ""
    ) -> list[tuple[str, str, str]]:
        """(setting, value, file) of the config files ``tops`` and of every file they
        include: each ``core.hooksPath`` (``HOOKS_PATH``) and each word of a program
        setting that names a file (``GitConfig.programs``). Breadth first (so each at
        the least depth git reaches it at), each protected with ``_protect_followed``.
        A top is protected with ``origin`` even if it is missing, or if ``origin`` is
        "" and it exists, with ``existing``."""
        from sandhold.policy import gitconfig

        queue = [(path, 0, "") for path in tops]
        budget = len(queue) + gitconfig.MAX_FILES
        seen: set[str] = set()
        found: list[tuple[str, str, str]] = []
        for path, depth, by in queue:
            # one file by its directory's resolved path: what relative includes in it
            # are relative to (a file reached by two spellings is one file)
            parent, name = path.rsplit("/", 1)
            where = self._follow_links(parent or "/")[1] or parent
            key = f"{where.rstrip('/')}/{name}"
            if key in seen:
                continue
            seen.add(key)
            if len(seen) > budget:
                raise UnenforceablePolicy(
                    f"git config {by}",
                    "native",
                    f"the configs include more than {gitconfig.MAX_FILES} files; "
                    "sandhold stops there, and what the others point git at is unknown",
                )
            if by:
                end = self._protect_followed(path, f"git: included by {by}")
            elif origin:
                end = self._protect_followed(path, origin)
            elif self._kind(path) is not None:
                end = self._protect_followed(path, existing)
            else:
                continue
            if end is None or self._kind(end) in (None, DIR):
                continue  # git reads nothing there (a directory reads as empty)
            parsed = self._git_config(path, end)
            found.extend((HOOKS_PATH, value, path) for value in parsed.hooks_paths)
            found.extend((setting, word, path) for setting, word in parsed.programs)
            if depth < gitconfig.MAX_DEPTH:  # deeper, git dies before it runs anything
                for value in parsed.includes:
                    target = self._git_path(value, where or "/", path)
                    if target is not None:
                        queue.append((target, depth + 1, path))
        return found

    def _git_config(self, path: str, end: str) -> GitConfig:
        """The config file at ``path`` (``end`` where its symlinks lead), read once.

        An unreadable, oversized or unparseable config stops the launch: git refuses
        most such files before it runs anything, but one this parser reads otherwise
        than git could include a file sandhold would leave writable. Guessing wider
        protection cannot help (what it points at is unknown), so it fails closed.
        """
        from sandhold.policy import gitconfig

        cached = self.git_parsed.get(end)
        if cached is None:
            data = self.host.read_bytes(end, gitconfig.MAX_BYTES + 1) or b""
            try:
                cached = self.git_parsed[end] = gitconfig.parse(data)
            except gitconfig.GitConfigError as exc:
                raise UnenforceablePolicy(
                    f"git config {path}",
                    "native",
                    f"{exc}: sandhold cannot tell what it makes git include or run. "
                    f"Fix the file (git config --list --file {path} shows how git reads "
                    "it) or remove it",
                ) from None
        return cached

    def _git_path(self, value: str, base: str, source: str) -> str | None:
        from sandhold.policy import gitconfig

        try:
            return gitconfig.expand(value, base, self.req.home)
        except gitconfig.GitConfigError as exc:
            raise UnenforceablePolicy(f"git config {source}", "native", str(exc)) from None

    def _git_dir_at(self, dotgit: str) -> str | None:
        """The git dir a ``.git`` directory, symlink or file (``gitdir: PATH``) means."""
        from sandhold.policy import gitconfig

        end = self._follow_links(dotgit)[1] if self._kind(dotgit) is not None else None
        if end is None or self._kind(end) is None:
            return None
        if self._kind(end) != DIR:
            data = self.host.read_bytes(end, 1 << 16) or b""
            target = gitconfig.pointer(data, dotgit.rsplit("/", 1)[0] or "/", b"gitdir: ")
            end = self._follow_links(target)[1] if target is not None else None
        return end if end is not None and self._kind(end) == DIR else None

    def _common_dir(self, git_dir: str) -> str:
        """Where a git dir keeps its config and hooks: its ``commondir`` (a worktree's
        points at the main repository's), else itself."""
        from sandhold.policy import gitconfig

        path = f"{git_dir}/commondir"
        if self._kind(path) != FILE:
            return git_dir
        target = gitconfig.pointer(self.host.read_bytes(path, 1 << 16) or b"", git_dir)
        end = self._follow_links(target)[1] if target is not None else None
        return end if end is not None and self._kind(end) == DIR else git_dir

    def _protect_hooks(self, path: str, reason: str) -> None:
        """A directory git runs hooks from: itself, and where each symlink in it leads
        (a hook linked to a project file runs that file), and each hook with other
        hard links (``check_links`` protects them). husky's ``.husky/_`` only holds
        stubs that run the same-named script one level up: ``.husky`` is protected."""
        if path in self.hooks_done:
            return
        self.hooks_done.add(path)
        end = self._follow_links(path)[1]
        held = [r for r, _ in self.write_roots if end is not None and paths.is_within(r, end)]
        if held:
            raise UnenforceablePolicy(
                f"{reason}: {path}",
                "native",
                f"git runs hooks from {end}, which holds the writable root {held[0]}: "
                "any file the sandbox writes there could be one. Point core.hooksPath "
                "at a directory of its own",
            )
        self._protect_followed(path, reason)
        # by the path as spelled too: `.husky/_` is git-ignored, so a clean checkout
        # lacks it until `npm install` makes it again, and its hooks then run
        # whatever the sandbox left in `.husky`
        for spelled in {path, end or path}:
            parent, name = spelled.rsplit("/", 1)
            if name == "_" and parent.endswith("/.husky"):
                self._protect_followed(parent, f"{reason} (husky: its hooks run these)")
        if end is None or self._kind(end) != DIR:
            return
        locked: list[str] = []
        listing = next(iter(self.host.walk(end, locked)), None)
        if locked:
            raise UnenforceablePolicy(
                f"{reason}: {end}",
                "native",
                "sandhold cannot list this hooks directory, so it cannot check where "
                f"its hooks lead. Make it listable (chmod u+rx {end})",
            )
        for hook in listing[2] if listing is not None else ():
            if hook.endswith(".sample"):
                continue  # what git init puts there: git never runs these
            at = f"{end}/{hook}"
            st = self.host.lstat(at)
            if st is not None and st.kind == SYMLINK:
                self._protect_followed(at, f"git: where the hook {at} leads")
            elif st is not None and st.kind == FILE and st.nlink > 1:
                self.write_denied.setdefault(at, f"git: the hook {at}")

    def _protect_followed(self, path: str, reason: str) -> str | None:
        """Protect what the host opens at ``path``, following symlinks, where it lies in
        a writable root: every symlink on the way is not to be made again (once
        removed) and where it ends is read-only, or not to be made. Returns where it
        ends (None: a symlink loop, which opens nothing). A directory holding a
        writable root is left writable: git reads a directory as an empty config,
        and the root's own mount keeps it from being replaced."""
        links, end = self._follow_links(path)
        for link in links:
            self._keep_unmade(link, reason)
        if end is not None and self._writable_region(end):
            if self._kind(end) is None:
                self._keep_unmade(end, reason)
            elif not any(paths.is_within(r, end) for r, _ in self.write_roots):
                self.write_denied.setdefault(end, reason)
        return end

    def _keep_unmade(self, path: str, reason: str) -> None:
        """``path`` is not to be made: the supervisor's to refuse, where it could be
        (not in a directory that is read-only already)."""
        if self._writable_region(path) and _covered(path, self.write_denied) is None:
            self._missing(path)
            self.unmade.append((path, reason))

    def _follow_links(self, path: str) -> tuple[list[str], str | None]:
        """The symlinks the kernel passes through opening absolute ``path`` (each at its
        own resolved place), and the resolved path it reaches (None: too many links).
        Unlike ``realpath``, every link on the way is named, not only the last."""
        links: list[str] = []
        todo = [p for p in reversed(path.split("/")) if p not in ("", ".")]
        at = "/"
        while todo:
            part = todo.pop()
            if part == "..":
                at = at.rsplit("/", 1)[0] or "/"
                continue
            here = f"{at.rstrip('/')}/{part}"
            text = self.host.readlink(here) if self._kind(here) == SYMLINK else None
            if text is None:
                at = here
                continue
            links.append(here)
            if len(links) > 40:  # the kernel's limit: ELOOP
                return links, None
            todo.extend(p for p in reversed(text.split("/")) if p not in ("", "."))
            if text.startswith("/"):
                at = "/"
        return links, at

    def _pin_missing(self, repo_dir: str, names: Iterable[str]) -> None:
        """The names (below a ``.hg`` or ``.jj``) hg or jj would read as this
        repository's config that do not exist yet: only the supervisor can keep them
        unmade (the walk protects existing ones)."""
        for name in names:
            path = f"{repo_dir}/{name}"
            if self._kind(path) is None:
                self._missing(path)

    # -- hard links ----------------------------------------------------------

    def check_links(self) -> None:
        for rule in self.read_rules:
            st = self.host.lstat(rule.path)
            if not rule.allow and st is not None and st.kind == FILE and st.nlink > 1:
                raise UnenforceablePolicy(
                    f"{rule.origin} {rule.path}",
                    "native",
                    f"the file has {st.nlink} hard links; its other names would stay "
                    "readable. Remove the extra links or deny their directories too",
                )
        self._check_denied_trees()
        linked = {}
        for path in self.write_denied:
            st = self.host.lstat(path)
            if st is not None and st.kind == FILE and st.nlink > 1:
                linked[(st.dev, st.ino)] = path
        # sandhold's own code: a package manager's cache (uv) may hard-link the very
        # files it runs into a directory the sandbox can write
        for top in self.code_dirs:
            for dirpath, _dirnames, filenames in self.host.walk(top):
                for name in filenames:
                    path = f"{dirpath}/{name}"
                    st = self.host.lstat(path)
                    if st is not None and st.kind == FILE and st.nlink > 1:
                        linked.setdefault((st.dev, st.ino), path)
        if not linked:
            return
        roots = sorted({r for r, _ in self.write_roots if self._kind(r) == DIR})
        for root in roots:
            for dirpath, _dirnames, filenames in self.host.walk(root):
                for name in filenames:
                    path = f"{dirpath}/{name}"
                    st = self.host.lstat(path)
                    if st is not None and (st.dev, st.ino) in linked:
                        twin = linked[(st.dev, st.ino)]
                        if path != twin:
                            self.write_denied.setdefault(path, f"hard link to {twin}")

    def _check_denied_trees(self) -> None:
        """A file inside a read-denied directory, or in a secret place the sandbox does
        not see (``FsRequest.unseen``), with other hard links: each of its names must
        be hidden too. The denied trees are walked, the ``allowRead`` holes in them
        left out (a name there is a readable one, so it is not counted), and every
        name of such a file counted; one with fewer hidden names than links has a
        name the sandbox could read, so the launch stops.

        The walk looks at ``MAX_LINK_WALK`` entries in all (each costs a system call,
        on every launch). The trees it does not finish, and those the user lists in
        ``skip_link_check``, are named in a warning; a file with too few names found
        may have the rest in them, so it is warned of, not refused. A directory
        sandhold cannot list is not walked (its files' names are not known to it)."""
        unseen = dict(self.req.unseen)
        skipped = [self.host.realpath(self._abs(e)) for e in self.req.skip_link_check]
        denied = {
            r.path: r.origin
            for r in self.read_rules
            if not r.allow
            and not self.visible(r.path)
            and not self._private(r.path)
            and not r.origin.endswith(_UNCHECKED)
            and self._kind(r.path) == DIR
        }
        denied.update((p, o) for p, o in unseen.items() if self._kind(p) in (DIR, FILE))
        holes = [r.path for r in self.read_rules if r.allow]

        def left_out(top: str) -> list[str]:
            """What the walk of ``top`` does not look at: its holes (none in a place no
            bind shows) and the trees the user accepts."""
            out = [] if top in unseen else holes
            return [p for p in (*out, *skipped) if p != top and paths.is_within(p, top)]

        # a tree inside another is walked with it, but where it lies in a hole of it
        tops = [
            d
            for d in sorted(denied)
            if not any(
                o != d
                and paths.is_within(d, o)
                and not any(paths.is_within(d, h) for h in left_out(o))
                for o in denied
            )
        ]
        unchecked = [t for t in tops if any(paths.is_within(t, s) for s in skipped)]
        unfinished: list[str] = []
        budget = MAX_LINK_WALK
        names: dict[tuple[int, int], set[str]] = {}
        links: dict[tuple[int, int], tuple[str, int, str]] = {}
        for top in tops:
            if top in unchecked:
                continue
            origin = denied[top]
            found: Iterable[tuple[str, int, int, int]]
            if self._kind(top) == FILE:
                st = self.host.lstat(top)
                found = [(top, st.dev, st.ino, st.nlink)] if st and st.nlink > 1 else []
            elif budget <= 0:
                unfinished.append(top)
                continue
            else:
                skip = left_out(top)
                unchecked += [s for s in skip if s in skipped]
                scan = self.host.scan_links(top, set(skip), budget)
                budget -= scan.entries
                if not scan.complete:
                    unfinished.append(top)
                found = scan.linked
            for path, dev, ino, nlink in found:
                names.setdefault((dev, ino), set()).add(path)
                links.setdefault((dev, ino), (path, nlink, origin))
        short = [
            (path, nlink, len(names[key]), found_by)
            for key, (path, nlink, found_by) in sorted(links.items(), key=lambda i: i[1])
            if len(names[key]) < nlink
        ]
        if unfinished:
            self.warnings.append(
                f"hard links not checked in {', '.join(unfinished)} (read-denied): "
                f"sandhold looks at {MAX_LINK_WALK:,} entries of the read-denied trees "
                "at most, and a file there with another name elsewhere (git clone, cp -l, "
                "a package store) would show its content through that name. Deny "
                "narrower paths, or list the tree in filesystem.skipHardLinkCheck to "
                "accept the risk"
            )
        if unchecked:
            self.notes.append(
                f"hard links not checked in {', '.join(dict.fromkeys(unchecked))} "
                "(filesystem.skipHardLinkCheck)"
            )
        for path, nlink, hidden, found_by in short:
            if unfinished or unchecked:  # the other names may be in what went unchecked
                self.warnings.append(
                    f"{found_by} {path}: the file has {nlink} hard links, {hidden} of them "
                    "found in read-denied places; any other outside them shows its "
                    "content (find / -samefile PATH lists them)"
                )
                continue
            raise UnenforceablePolicy(
                f"{found_by} {path}",
                "native",
                f"the file has {nlink} hard links, {hidden} of them in "
                "read-denied places: the others would show its content. Remove the "
                "extra links (find / -samefile PATH lists them) or deny their "
                "directories too",
            )

    # -- decisions -------------------------------------------------------------

    def read_rule(self, path: str) -> _Rule | None:
        """The read rule that decides ``path``: the most specific; allow wins a tie."""
        if self._read_index is None:
            index: dict[str, _Rule] = {}
            for rule in self.read_rules:
                if rule.path not in index or (rule.allow and not index[rule.path].allow):
                    index[rule.path] = rule
            self._read_index = index
        found = _covered(path, self._read_index)
        return None if found is None else self._read_index[found]

    def visible(self, path: str) -> bool:
        rule = self.read_rule(path)
        return rule is None or rule.allow

    def writable(self, path: str) -> bool:
        if not self.visible(path):
            return False
        deny = _covered(path, self.write_denied)
        if deny is not None and not self._granted_inside(deny, path):
            return False
        return (
            self._writable_region(path)
            or paths.is_within(path, self.req.tmpdir)
            or any(paths.is_within(path, d) for d, _ in self.req.scratch)
        )

    def _protect_home_dots(self, roots: list[str], home: str) -> None:
        """Under a writable home every top-level dot entry stays read-only, and no new
        one is made (``FsPlan.home_dots``), but those granted: ``HOME_GRANTED`` and what
        the user names in ``allowWrite`` at the top of the home, or inside one (that
        root stays writable on top of the rest, ``_granted_inside``)."""
        if not self._writable_region(home) or home == "/":
            return
        granted = {name for name, _ in mandatory.HOME_GRANTED}
        spellings = {home, self.req.home.rstrip("/") or "/"}
        for entry in self.req.allow_write:
            path = self._abs(entry)
            for spelled in (path, self.host.realpath(path)):
                parent, _, name = spelled.rpartition("/")
                if parent in spellings and not paths.is_glob(name):
                    granted.add(name)
        self.home_dots = tuple(sorted(spellings))
        self.home_grants = tuple(sorted(granted))
        if not self.req.supervised:  # only the supervisor keeps new ones unmade
            self.unpinned.append(f"{home}/.* (a writable home's dot names)")
        listing = next(iter(self.host.walk(home)), None)
        names = (*listing[1], *listing[2]) if listing is not None else ()
        entries = [
            (f"{home}/{name}", mandatory.HOME_DOT_REASON)
            for name in names
            if name.startswith(".") and name not in granted
        ]
        for literal, origin in ungranted(entries, roots, home, self.host.realpath):
            self._deny_literal(literal, origin)
            self.home_denied.add(self.host.realpath(literal))

    def _granted_inside(self, deny: str, path: str) -> bool:
        """``path`` lies in a writable root the user named inside ``deny``, a place
        below a writable home (``home_denied``): that root stays writable on top of
        the read-only rest (``~/.ssh/known_hosts`` in ``~/.ssh``)."""
        return deny in self.home_denied and any(
            root != deny and paths.is_within(root, deny) and paths.is_within(path, root)
            for root, _ in self.write_roots
        )

    def plan(self) -> FsPlan:
        self.collect()
        self._drop_denied_roots()
        # after the other denies' drop: a root named below one of these stays
        # writable on top of it (``_granted_inside``)
        roots = [r for r, _ in self.write_roots]
        home = self.host.realpath(self.req.home)
        for literal, origin in ungranted(self.req.home_deny_write, roots, home, self.host.realpath):
            self._deny_literal(literal, origin)
            self.home_denied.add(self.host.realpath(literal))
        self._protect_home_dots(roots, home)
        self.scan_writable_roots()
        self.protect_git_pointers()
        self.check_links()
        reasons: dict[str, str] = {}
        for rule in self.read_rules:
            reasons.setdefault(rule.path, rule.origin)
        for path, origin in self.write_roots:
            reasons.setdefault(path, origin)
        reasons.update(self.write_denied)
        # A covered name moves with its directory: renamed away, a read-denied file
        # would be found under no rule by the next launch, a write-denied one written.
        guards: set[str] = set()  # the rename guards: pinned wherever they are
        hidden = [r.path for r in self.read_rules if not r.allow and self._kind(r.path)]
        for path in (*self.write_denied, *hidden):
            for anc in paths.ancestors(path):
                parent = anc.rsplit("/", 1)[0] or "/"
                if anc != "/" and self.writable(parent) and anc not in reasons:
                    reasons[anc] = f"rename guard for {path}"
                    guards.add(anc)
        for path, why in self.guards.items():
            if path not in reasons:
                reasons[path] = f"rename guard for {why}"
                guards.add(path)
        mounts, hidden_dirs = self._emit(reasons, guards)
        mounts.extend(Mount("remount-ro", p, "hidden directory stays empty") for p in hidden_dirs)
        return FsPlan(
            mounts=tuple(mounts),
            writable_roots=tuple(sorted({r for r, _ in self.write_roots})),
            unpinned=tuple(dict.fromkeys(self.unpinned)),
            notes=tuple(self.notes),
            unmade=tuple(dict.fromkeys(self.unmade)),
            dropped_roots=tuple(dict.fromkeys(self.dropped_roots)),
            work_trees=tuple(sorted(set(self.found_trees))),
            home_dots=self.home_dots,
            home_grants=self.home_grants,
            repo_configs=tuple(dict.fromkeys(self.repo_configs)),
            warnings=tuple(self.warnings),
        )

    def _emit(self, reasons: dict[str, str], guards: set[str]) -> tuple[list[Mount], list[str]]:
        order = sorted(reasons, key=lambda p: (paths.depth(p), p))
        # what each emitted mount shows below it: None = hidden, else its writability
        emitted: dict[str, bool | None] = {}
        mounts: list[Mount] = []
        hidden_dirs: list[str] = []
        for path in order:
            kind = self._kind(path)
            if kind is None:
                continue  # nothing there to mount over
            inherited: bool | None = False  # the base: the whole host, read-only
            for anc in paths.ancestors(path):
                if anc in emitted:
                    inherited = emitted[anc]
                    break
            reason = reasons[path]
            rule = self.read_rule(path)
            if rule is not None and not rule.allow:
                reason = rule.origin
                if inherited is None:
                    continue  # an enclosing hidden directory already hides it
                if kind == DIR:
                    carve = any(
                        r.allow and r.path != path and paths.is_within(r.path, path)
                        for r in self.read_rules
                    )
                    mounts.append(Mount("hide-dir", path, reason, "0111" if carve else "0000"))
                    if carve:  # mount points are made in it first; an uncarved one is ro already
                        hidden_dirs.append(path)
                else:
                    mounts.append(Mount("hide-file", path, reason))
                emitted[path] = None
                continue
            want = self.writable(path)
            pinned = path in self.write_denied or path in guards
            if inherited is None or inherited != want or (pinned and inherited):
                mounts.append(Mount("bind" if want else "ro-bind", path, reason))
                emitted[path] = want
        return mounts, hidden_dirs


def _covered(path: str, table: Container[str]) -> str | None:
    """The deepest of ``path`` and its ancestors that is in ``table``, or None.

    Walking up the path (a handful of steps) instead of scanning every rule keeps
    planning linear in the number of rules.
    """
    while True:
        if path in table:
            return path
        if path == "/":
            return None
        path = path.rsplit("/", 1)[0] or "/"


def _bare_repository(dirnames: list[str], filenames: list[str]) -> bool:
    """A directory listing is a bare repository's (a local remote, jj's internal git
    repository), whose hooks run on a push to it and whose config git reads: by the
    supervisor's test (``git.git_directory``: ``HEAD`` with ``refs`` or
    ``commondir``, any kind of entry; a ``.git`` in it makes it a work tree instead),
    or a config and hooks/ beside any of HEAD, objects, refs or packed-refs (one
    whose HEAD an earlier run renamed away, to have the next one take it for none)."""
    from sandhold.policy.git import git_directory

    if ".git" in dirnames:
        return False
    names = {*dirnames, *filenames}
    if git_directory(names):
        return True
    return (
        "config" in names
        and "hooks" in names
        and not {"HEAD", "packed-refs", "objects", "refs"}.isdisjoint(names)
    )


def _below(dirpath: str, root: str, repo: str) -> str | None:
    """``dirpath`` is, or lies in, a ``repo`` directory (``.hg``, ``.jj``) below
    ``root``: its part below the innermost one, as a prefix for names in it ("" or
    "patches/"); else None."""
    below = dirpath[len(root) :] if root != "/" else dirpath
    _, found, rest = f"{below}/".rpartition(f"/{repo}/")
    return rest if found else None


def hidden_by(plan: FsPlan, path: str) -> Mount | None:
    """The mount that hides resolved ``path`` in the sandbox, or None if it is visible.

    Mounts are ordered parents first, so the deepest one containing ``path`` wins.
    """
    deciding: Mount | None = None
    for m in plan.mounts:
        if m.op != "remount-ro" and paths.is_within(path, m.path):
            deciding = m
    if deciding is not None and deciding.op in ("hide-dir", "hide-file"):
        return deciding
    return None


def ungranted(
    entries: Iterable[tuple[str, str]],
    roots: Iterable[str],
    home: str,
    realpath: Callable[[str], str],
    *,
    around_roots: bool = True,
) -> tuple[tuple[str, str], ...]:
    """The (path, origin) entries below a writable home that stay write-denied: those
    whose resolved path the home's writable root holds (the innermost root holding
    it holds the (resolved) ``home`` too), unless it is a writable root itself: the
    user named it (``allowWrite: ["~", "~/.local/bin"]``). A root of its own inside
    the home (a project whose ``node_modules/.bin`` is on ``$PATH``) is the user's
    to write. A root the user named *below* one does not lift it: the plan keeps
    that root writable on top of the read-only rest (``~/.ssh/known_hosts`` does not
    open ``~/.ssh/config``). ``around_roots=False`` leaves such entries out: what
    the supervisor may refuse, since its rules cannot except the root inside (the
    place exists, and its mount refuses the rest)."""
    roots = tuple(roots)
    kept = []
    for path, origin in entries:
        real = realpath(path)
        holders = [r for r in roots if paths.is_within(real, r) and r != real]
        if real in roots or not holders or not paths.is_within(home, max(holders, key=len)):
            continue
        if around_roots or not any(paths.is_within(r, real) for r in roots):
            kept.append((path, origin))
    return tuple(kept)


def plan_filesystem(req: FsRequest, host: HostView) -> FsPlan:
    """Compute the mount plan for ``req`` on ``host`` (see the module rules).

    Raises:
        UnenforceablePolicy: a rule cannot be kept with mounts (a hard-linked secret).
    """
    return _Planner(req, host).plan()
