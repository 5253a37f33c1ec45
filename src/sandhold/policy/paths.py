"""Path entries of the settings file: spelling, globs and matching.

Rules (F-SET-1, F-SET-6):
- An entry is absolute, ``~``/``~/…`` (the user's home), or relative to the
  working directory. ``~user`` is refused rather than guessed.
- An entry with ``*``, ``?`` or ``[`` is a glob: ``*`` and ``?`` stay inside one
  path segment, ``**`` (a whole segment) spans any number of segments, ``[…]``
  is a character class (``[!…]`` negated). ``*`` matches leading dots too: a
  deny rule must not miss ``.env``. Globs are matched, never symlink-resolved.
- A literal entry is enforced as written and as symlink-resolved; resolving is
  the caller's job (a host fact), this module only spells and matches.
"""

from __future__ import annotations

import posixpath

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re

GLOB_CHARS = frozenset("*?[")


def is_glob(entry: str) -> bool:
    return any(c in GLOB_CHARS for c in entry)


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
    """Translate the ``[...]`` class starting at ``segment[i]``; returns (regex, next index)."""
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
    body = body.replace("\\", "\\\\").replace("^", "\\^")
    return ("[^" if negate else "[") + body + "]", j + 1


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


def _glob_regex(pattern: str) -> str:
    segments = pattern.split("/")
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


_COMPILED: dict[str, re.Pattern[str]] = {}


def glob_matcher(pattern: str) -> re.Pattern[str]:
    """A compiled regex that fully matches the paths (or names) ``pattern`` matches."""
    rx = _COMPILED.get(pattern)
    if rx is None:
        import re  # only when there is a glob to match: not on every CLI start

        rx = re.compile(_glob_regex(pattern), re.DOTALL)
        _COMPILED[pattern] = rx
    return rx


def glob_match(pattern: str, path: str) -> bool:
    return glob_matcher(pattern).fullmatch(path) is not None


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
