"""Which changes a run made to its private copy of a repository's git config the host
applies afterwards (``git.allowConfig``): lists of (key, value) in, decisions out.

Rules:
- A run never writes the real ``.git/config``. With ``git.allowConfig`` set, it writes
  a private copy bound in its place; after the run the host compares the copy with
  what it started as, key by key (``changes``), and applies a changed key only when
  ``decide`` allows it. A sandhold that dies mid-run applies nothing.
- A key is applied only when (1) it is on ``INERT_KEYS``, the short list of keys
  sandhold knows run nothing and point git at nothing it would run (remotes' URLs and
  refspecs, branches' upstreams, who commits), (2) a ``git.allowConfig`` pattern
  names it (``*`` matches any run of characters, dots included; section and key
  names compare without case, as git's do), and (3) its values pass that key's
  check. Everything else is refused, whatever the patterns say: ``core.*`` (``core.fsmonitor``,
  ``core.hooksPath``, ``core.sshCommand``), ``*.helper``, ``filter.*``, ``alias.*``,
  ``include*``, ``url.*.insteadOf``, ``protocol.*.allow``, ``remote.*.vcs``,
  ``remote.*.uploadpack``, ``remote.*.receivepack``, ``remote.*.proxy`` ...: a list of
  what is dangerous would miss the next key git adds, a list of what is inert cannot.
- A URL (``remote.*.url``, ``remote.*.pushurl``, a branch's ``remote``) may not name a
  remote helper: no ``<transport>::address`` (``ext::`` runs any command) and no
  ``scheme://`` other than git's own transports (an unknown scheme runs
  ``git-remote-<scheme>``), nor start with ``-`` or name a host starting with ``-``
  (an option to ssh). No value holds a control character but tab.
- Keys come as git prints them (``git config --list -z``): section and key name in
  lower case, the subsection as written.

Pure: no I/O. Tested in tests/test_git_config_changes.py.
"""

from __future__ import annotations

from sandhold._record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

URL = "url"
PLAIN = "plain"

INERT_KEYS: dict[tuple[str, bool, str], str] = {
    # (section, has a subsection, key name): the check its values get
    ("remote", True, "url"): URL,
    ("remote", True, "pushurl"): URL,
    ("remote", True, "fetch"): PLAIN,
    ("remote", True, "push"): PLAIN,
    ("remote", True, "mirror"): PLAIN,
    ("remote", True, "prune"): PLAIN,
    ("remote", True, "prunetags"): PLAIN,
    ("remote", True, "tagopt"): PLAIN,
    ("remote", True, "skipdefaultupdate"): PLAIN,
    ("remote", True, "skipfetchall"): PLAIN,
    ("branch", True, "remote"): URL,  # a remote's name, or a URL git fetches from
    ("branch", True, "pushremote"): URL,
    ("branch", True, "merge"): PLAIN,
    ("branch", True, "rebase"): PLAIN,
    ("branch", True, "description"): PLAIN,
    ("user", False, "name"): PLAIN,
    ("user", False, "email"): PLAIN,
    ("push", False, "default"): PLAIN,
    ("push", False, "autosetupremote"): PLAIN,
    ("pull", False, "rebase"): PLAIN,
    ("pull", False, "ff"): PLAIN,
    ("fetch", False, "prune"): PLAIN,
}
"""The keys a run may change (when a ``git.allowConfig`` pattern names them)."""

TRANSPORTS = frozenset({"http", "https", "ssh", "git", "file", "git+ssh", "ssh+git"})
"""The ``scheme://`` URLs git handles itself; any other scheme runs a remote helper."""

NOT_INERT = (
    "not on sandhold's list of keys that run nothing (it may run a program or point git "
    "at one); no setting lets a sandbox set it: if you trust it, set it on the host"
)


@record
class Change:
    """One key a run changed: its values after the run, in order (none: removed)."""

    key: str
    values: tuple[str, ...]


@record
class Decision:
    change: Change
    applied: bool
    reason: str = ""  # why it was refused, naming the rule and the setting


def listed(data: bytes) -> list[tuple[str, str]]:
    """(key, value) pairs of ``git config --list -z`` output, in file order. A key with
    no value (``[s] flag``) reads as git prints it: no newline, an empty value."""
    out = []
    for entry in data.split(b"\0"):
        if not entry:
            continue
        key, _, value = entry.decode("utf-8", "surrogateescape").partition("\n")
        out.append((key, value))
    return out


def changes(before: Sequence[tuple[str, str]], after: Sequence[tuple[str, str]]) -> list[Change]:
    """The keys whose values differ between two listings (``listed``), in the order the
    run's copy holds them, removed keys last."""

    def grouped(pairs: Iterable[tuple[str, str]]) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {}
        for key, value in pairs:
            out.setdefault(key, []).append(value)
        return {k: tuple(v) for k, v in out.items()}

    old, new = grouped(before), grouped(after)
    made = [Change(k, v) for k, v in new.items() if old.get(k) != v]
    return made + [Change(k, ()) for k in old if k not in new]


def split_key(key: str) -> tuple[str, str | None, str] | None:
    """(section, subsection or None, name) of a key, or None if git's grammar has no
    such key: a section of letters, digits, ``-`` and ``.``; a name of letters, digits
    and ``-`` starting with a letter; a subsection of anything but newline and NUL."""
    section, dot, rest = key.partition(".")
    if not dot:
        return None
    sub, inner, name = rest.rpartition(".")
    ok_section = section != "" and all(c.isascii() and (c.isalnum() or c in "-.") for c in section)
    ok_name = (
        name[:1].isascii()
        and name[:1].isalpha()
        and all(c.isascii() and (c.isalnum() or c == "-") for c in name)
    )
    if not (ok_section and ok_name) or "\n" in sub or "\0" in sub:
        return None
    return section.lower(), (sub if inner else None), name.lower()


def pattern_matches(pattern: str, key: str) -> bool:
    """A ``git.allowConfig`` pattern names ``key`` (``*``: any characters, dots too)."""
    import fnmatch

    return fnmatch.fnmatchcase(key.lower(), pattern.lower().replace("[", "[[]"))


def url_problem(value: str) -> str | None:
    """Why a URL value would make git run a program, or None."""
    import re

    if re.match(r"[A-Za-z0-9][A-Za-z0-9+.-]*::", value):
        return "a <transport>::address URL runs a remote helper program (ext:: runs any command)"
    scheme, sep, rest = value.partition("://")
    if sep and scheme.lower() not in TRANSPORTS:
        return f"a {scheme}:// URL runs the remote helper git-remote-{scheme}"
    if value.startswith("-"):
        return "a URL starting with '-' reads as an option"
    host = rest.rpartition("@")[2] if sep else value.partition(":")[0].rpartition("@")[2]
    if host.startswith("-"):
        return "a host starting with '-' reads as an option to ssh"
    return None


def decide(change: Change, patterns: Sequence[str]) -> Decision:
    """Whether the host applies ``change`` (see the module rules)."""
    parts = split_key(change.key)
    if parts is None:
        return Decision(change, False, "not a key in git's grammar")
    section, sub, name = parts
    check = INERT_KEYS.get((section, sub is not None, name))
    if check is None:
        return Decision(change, False, NOT_INERT)
    if not any(pattern_matches(p, change.key) for p in patterns):
        return Decision(
            change,
            False,
            f"git.allowConfig names no pattern for it; to let a run change it, add "
            f'"{section}.*" to git.allowConfig',
        )
    for value in change.values:
        if any(ord(c) < 32 and c != "\t" for c in value):
            return Decision(change, False, "a value with a control character")
        problem = url_problem(value) if check == URL else None
        if problem is not None:
            return Decision(change, False, f"{problem}; no setting lets a sandbox set it")
    return Decision(change, True)


def describe(change: Change) -> str:
    """The change as one short phrase: ``key=value`` (values joined), or ``unset key``."""
    if not change.values:
        return f"unset {change.key}"
    shown = ", ".join(v if len(v) <= 120 else v[:117] + "..." for v in change.values)
    return f"{change.key}={shown}"
