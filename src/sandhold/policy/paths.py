"""Path entries of the settings file: spelling, globs and matching.

Rules (F-SET-1, F-SET-6):
- An entry is absolute, ``~``/``~/…`` (the user's home), or relative to the
  working directory. ``~user`` is refused rather than guessed.
- An entry with ``*``, ``?`` or ``[`` is a glob: ``*`` and ``?`` stay inside one
  path segment, ``**`` (a whole segment) spans any number of segments, ``[…]``
  is a character class (``[!…]`` negated) that never matches ``/``, whatever its
  ranges or negation say. ``*`` matches leading dots too: a
  deny rule must not miss ``.env``. Globs are matched, never symlink-resolved.
- A literal entry is enforced as written and as symlink-resolved; resolving is
  the caller's job (a host fact), this module only spells and matches.
"""

from __future__ import annotations

import posixpath

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

GLOB_CHARS = frozenset("*?[")


def is_glob(entry: str) -> bool:
    return not GLOB_CHARS.isdisjoint(entry)  # in C: the plan asks of every path it sees


def validate_pattern(entry: str) -> None:
    """Raise ``ValueError`` with a reason if ``entry`` is not a usable path entry."""
    if not entry:
        raise ValueError("path is empty")
    if "\0" in entry:
        raise ValueError("path contains a NUL character")
    if entry.startswith("~") and not (entry == "~" or entry.startswith("~/")):
        raise ValueError("only '~' and '~/…' are supported, not '~user'")
    if is_glob(entry):
        _glob_regex(entry)  # raises on bad syntax


def absolute(entry: str, cwd: str, home: str) -> str:
    """The absolute, lexically normalised spelling of ``entry``."""
    if entry == "~" or entry.startswith("~/"):
        entry = home + entry[1:]
    elif not entry.startswith("/"):
        entry = f"{cwd}/{entry}"
    normal = posixpath.normpath(entry)
    return "/" + normal.lstrip("/")  # normpath keeps a leading '//'


def static_prefix(pattern: str) -> str:
    """The longest leading directory of an absolute glob that has no glob characters."""
    parts = pattern.split("/")
    fixed: list[str] = []
    for part in parts[:-1]:
        if is_glob(part):
            break
        fixed.append(part)
    return "/".join(fixed) or "/"


def _class(segment: str, i: int) -> tuple[str, int]:
    """Translate the ``[...]`` class starting at ``segment[i]``; returns (regex, next index).

    A class stands for one character of a name, so it never matches ``/`` (as in
    gitignore and ``fnmatch`` with ``FNM_PATHNAME``): not negated (``[!_]``), not
    through a range that spans it (``[+-9]``). Each character is escaped, so nothing
    in the body reaches the regex as syntax (``[[``, ``&&``, ``^``).
    """
    j = i + 1
    negate = j < len(segment) and segment[j] in "!^"
    if negate:
        j += 1
    start = j
    if j < len(segment) and segment[j] == "]":
        j += 1  # a leading ']' is literal
    while j < len(segment) and segment[j] != "]":
        j += 1
    if j >= len(segment):
        raise ValueError(f"unclosed '[' in glob segment {segment!r}")
    body = segment[start:j]
    if not body:
        raise ValueError(f"empty character class in glob segment {segment!r}")
    items: list[str] = []
    k = 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            low, high = body[k], body[k + 2]
            if low > high:
                raise ValueError(f"range {low}-{high} is reversed in glob segment {segment!r}")
            items.append(f"{_escape(low)}-{_escape(high)}")
            k += 3
        else:
            items.append(_escape(body[k]))
            k += 1
    # the lookahead keeps '/' out whatever the class says
    return "(?!/)" + ("[^" if negate else "[") + "".join(items) + "]", j + 1


def _segment_regex(segment: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(segment):
        c = segment[i]
        if c == "*":
            if segment.startswith("**", i):
                raise ValueError(f"'**' must be a whole path segment, not part of {segment!r}")
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            rx, i = _class(segment, i)
            out.append(rx)
        else:
            out.append(_escape(c))
            i += 1
    return "".join(out)


def _collapse(segments: list[str]) -> list[str]:
    """``**/**`` means what ``**`` means."""
    out: list[str] = []
    for seg in segments:
        if not (seg == "**" and out and out[-1] == "**"):
            out.append(seg)
    return out


def _glob_regex(pattern: str) -> str:
    segments = _collapse(pattern.split("/"))
    out: list[str] = []
    for idx, seg in enumerate(segments):
        last = idx == len(segments) - 1
        if seg == "**":
            # '**' spans zero or more whole segments
            out.append("(?:[^/]+/)*" if not last else "(?:[^/]+(?:/[^/]+)*)?")
        else:
            out.append(_segment_regex(seg) + ("" if last else "/"))
    rx = "".join(out)
    if rx.endswith("/(?:[^/]+(?:/[^/]+)*)?"):
        rx = rx[: -len("/(?:[^/]+(?:/[^/]+)*)?")] + "(?:/.*)?"
    return rx


def _escape(c: str) -> str:
    """``re.escape`` for one character, without importing ``re`` (5 ms at CLI start)."""
    return c if c.isalnum() or c == "_" else "\\" + c


class _StarGlob:
    """A glob of ``*`` and ``**`` only, matched segment by segment: the same answers as
    its regex (``glob_regex``), without importing ``re`` (~5 ms of a CLI start)."""

    __slots__ = ("segments",)

    def __init__(self, pattern: str) -> None:
        self.segments = _collapse(pattern.split("/"))

    def fullmatch(self, text: str) -> bool:
        parts = text.split("/")
        last = self.segments[-1]
        # a last segment other than "**" takes exactly the last name: checked first,
        # it turns away nearly every path of a walk (``**/.env``) at once
        if last != "**" and not star_match(last, parts[-1]):
            return False
        return _segments_match(self.segments, 0, parts, 0)


def _segments_match(pat: list[str], i: int, parts: list[str], j: int) -> bool:
    while i < len(pat):
        if pat[i] == "**":
            if i == len(pat) - 1:
                return True  # any number of trailing segments, none included
            # zero or more whole, non-empty segments, then the rest of the pattern
            return any(
                _segments_match(pat, i + 1, parts, k)
                for k in range(j, len(parts) + 1)
                if all(parts[j:k])
            )
        if j >= len(parts) or not star_match(pat[i], parts[j]):
            return False
        i, j = i + 1, j + 1
    return j == len(parts)


def may_match_below(pattern: str, rel_dir: str) -> bool:
    """Whether relative ``pattern`` can match some path strictly below ``rel_dir``
    (relative to the same base; "" is the base itself).

    A walk looking for matches needs to list only such directories, and a directory
    it cannot list matters only if this holds for it. Never false when a match below
    exists; a segment is assumed to match some name.
    """
    segments = _collapse(pattern.split("/"))
    parts = rel_dir.split("/") if rel_dir else []

    def can(i: int, j: int) -> bool:
        if j == len(parts):
            return i < len(segments)  # some of the pattern is left for deeper names
        if i == len(segments):
            return False
        if segments[i] == "**":  # spans this part too, or none
            return can(i, j + 1) or can(i + 1, j)
        return bool(glob_matcher(segments[i]).fullmatch(parts[j])) and can(i + 1, j + 1)

    return can(0, 0)


if TYPE_CHECKING:
    from typing import Protocol

    class Matcher(Protocol):
        def fullmatch(self, text: str) -> object: ...


_COMPILED: dict[str, Matcher] = {}


def glob_regex(pattern: str) -> str:
    """The regex source that fully matches what ``pattern`` matches."""
    return _glob_regex(pattern)


def glob_matcher(pattern: str) -> Matcher:
    """An object whose ``fullmatch(path)`` is truthy for the paths (or names) ``pattern``
    matches: a regex, or for ``*``/``**``-only patterns a plain segment matcher."""
    matcher = _COMPILED.get(pattern)
    if matcher is None:
        if not any(c in pattern for c in "?[\\"):
            _glob_regex(pattern)  # the same validation (a '**' inside a segment)
            matcher = _StarGlob(pattern)
        else:
            import re  # character classes and '?': the regex

            matcher = re.compile(_glob_regex(pattern), re.DOTALL)
        _COMPILED[pattern] = matcher
    return matcher


def glob_match(pattern: str, path: str) -> bool:
    return bool(glob_matcher(pattern).fullmatch(path))


def star_match(pattern: str, text: str) -> bool:
    """Match ``text`` against a pattern whose only wildcard is ``*`` (any run of characters).

    For names (credential globs, environment variable patterns) this is all that
    is needed, and it costs no regex compilation at start-up.
    """
    pieces = pattern.split("*")
    if len(pieces) == 1:
        return pattern == text
    first, last = pieces[0], pieces[-1]
    if len(text) < len(first) + len(last) or not (text.startswith(first) and text.endswith(last)):
        return False
    pos, end = len(first), len(text) - len(last)
    for piece in pieces[1:-1]:
        found = text.find(piece, pos, end)
        if found < 0:
            return False
        pos = found + len(piece)
    return True


class StarNames:
    """Whether a name matches any of some ``*``-only patterns (``star_match``), for
    checking every name of a large tree: a name none could match is turned away by
    one set lookup and two C-level prefix/suffix tests."""

    def __init__(self, patterns: Iterable[str]) -> None:
        pats = tuple(dict.fromkeys(patterns))
        self.exact = frozenset(p for p in pats if "*" not in p)
        self.starred = tuple(p for p in pats if "*" in p)
        heads = [p.split("*", 1)[0] for p in self.starred]
        tails = [p.rsplit("*", 1)[1] for p, h in zip(self.starred, heads, strict=True) if not h]
        # a pattern with neither a head nor a tail ("*", "*x*") may match anything
        self.sieve = None if "" in tails else (tuple(h for h in heads if h), tuple(tails))

    def __call__(self, name: str) -> bool:
        if name in self.exact:
            return True
        if self.sieve is not None and not (
            name.startswith(self.sieve[0]) or name.endswith(self.sieve[1])
        ):
            return False
        return any(star_match(p, name) for p in self.starred)


def is_within(path: str, root: str) -> bool:
    """``path`` is ``root`` or below it (both absolute and normalised)."""
    return root in (path, "/") or path.startswith(root + "/")


def ancestors(path: str) -> list[str]:
    """Proper ancestors of an absolute path, nearest first, ending with '/'."""
    out: list[str] = []
    while path != "/":
        path = posixpath.dirname(path)
        out.append(path)
    return out


def depth(path: str) -> int:
    return 0 if path == "/" else path.count("/")


def first_missing(path: str, exists: Callable[[str], bool]) -> str:
    """The shallowest ancestor of ``path`` (or ``path``) that does not exist: making it
    is the first step to making ``path``, by ``mkdir``, a symlink or a rename."""
    for anc in reversed([path, *ancestors(path)]):
        if not exists(anc):
            return anc
    return path


def has_surrogate(text: str) -> bool:
    """``text`` holds a lone surrogate (``\\ud800``-``\\udfff``): not text a path can be."""
    return any("\ud800" <= c <= "\udfff" for c in text)
