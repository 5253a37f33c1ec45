"""What a git config file makes git read or run from elsewhere: bytes in, paths out.

Rules (F-SET-5): git runs what these name, so the mount plan protects them as it
protects ``.git/config`` and ``.git/hooks`` (``fsplan``):
- ``include.path`` and ``includeIf.<condition>.path``: another config file, read as
  if it stood there (its ``core.fsmonitor``, aliases and hooks run). Every
  ``includeIf`` counts, whatever its condition: whether it holds is git's to decide
  later, in a repository sandhold may not know of.
- ``core.hooksPath``: the directory git runs hooks from instead of ``.git/hooks``.
  The last value wins in git, but every value seen counts: a later file (an
  include, a repository's config) may set another one.
- Programs (``PROGRAM_KEYS``): every setting whose value git runs, or hands to a
  shell it runs: ``core.fsmonitor``, ``core.sshCommand``, ``core.pager`` and
  ``pager.*``, ``core.editor`` and ``sequence.editor``, the ``clean``, ``smudge`` and
  ``process`` of ``filter.*``, ``diff.*.command``/``textconv``, ``merge.*.driver``,
  ``credential.helper`` and ``credential.*.helper``, ``gpg.program`` and
  ``gpg.*.program``, ``alias.*``, and the other keys of the table (askPass, proxies,
  tools, remote helpers, trailers, config hooks, git-lfs agents). From each value the
  words that name a file (``program_words``): the words of the command line (split as
  ``sh`` splits them) that hold a ``/`` and do not start with ``-``, the part after
  ``=`` of a ``NAME=path`` or ``--opt=path`` word, a word with ``$`` or a backquote
  left out (the shell expands it: not a path this module can know), and so is a
  URL (``://``). A word with no
  ``/`` is looked up on ``$PATH`` (whose directories below a writable home the plan
  protects, ``mandatory.home_paths``). ``alias.*`` values not starting with ``!``
  are git's own arguments: what each ``-c <program setting>=value`` names counts
  (``-c core.pager=tools/p``); a
  ``credential.helper`` counts only as ``!command`` or an absolute path (a bare name
  runs ``git credential-<name>``, whose arguments are data), and so does a
  ``submodule.*.update`` only as ``!command``.
- Paths: ``~`` and ``~/…`` are in the home directory; a relative include is
  relative to the directory of the file that holds it, a relative ``core.hooksPath``
  to where hooks run (the work tree's top, or the git dir of a bare repository),
  and a relative program word to where git runs programs (it changes to the work
  tree's top first; the git dir of a bare repository);
  ``%(prefix)/…`` is git's own installation. ``~user/…`` is refused (``expand``):
  another user's home is a host fact this module does not have.
- Syntax, as git's ``config.c`` reads it: section and key names are ASCII and
  case-insensitive, ``[section "subsection"]`` keeps its subsection's case and the
  deprecated ``[section.subsection]`` does not; ``key = value`` or a bare ``key``
  (a boolean, which no path setting takes); values may be quoted, with the escapes
  ``\\"`` ``\\\\`` ``\\n`` ``\\t`` ``\\b``; ``#`` and ``;`` start a comment outside
  quotes; a trailing backslash continues a value on the next line; leading and
  trailing white space of a value is dropped. What git refuses to read
  (``GitConfigError``) stops git before it runs anything, but this parser's view
  may be narrower than git's, so the caller stops the launch rather than guess.
- Includes nest at most ``MAX_DEPTH`` deep (git dies past that, as it does on an
  include cycle), and no file is read past ``MAX_BYTES``.

Pure: no I/O. Tested in tests/test_gitconfig.py.
"""

from __future__ import annotations

from sandhold._record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

MAX_DEPTH = 10
"""git's ``MAX_INCLUDE_DEPTH``: a file included more than this deep makes git die."""

MAX_BYTES = 4 << 20
"""The most of one config file read. Real ones are kilobytes (a monorepo's with
thousands of ``[branch]`` entries, a few hundred); a larger one is refused."""

MAX_FILES = 100
"""The most files one set of configs may include, all told: git has no such
limit, but a plan that reads without end never launches."""

_BOM = b"\xef\xbb\xbf"
_SPACE = frozenset(b" \t\n\r")  # git's isspace (sane_ctype): not \v or \f
_NL = 10


@record
class GitConfig:
    """The settings of one config file that point git elsewhere, in file order."""

    includes: tuple[str, ...] = ()  # include.path and includeIf.*.path values
    hooks_paths: tuple[str, ...] = ()  # core.hooksPath values
    # (setting as git spells it lowered, a word of its value that names a file)
    programs: tuple[tuple[str, str], ...] = ()


SHELL, PROGRAM, ALIAS, BANG = "shell", "program", "alias", "bang"
"""How git runs a setting's value: a shell command line (``SHELL``); one program's
path, no arguments (``PROGRAM``); an alias (``ALIAS``: ``!`` a command line, else
git's own arguments); or only a ``!command`` / an absolute path counts (``BANG``)."""

# (section, subsection: True with one, False without, None either; key, how it runs).
# Sections and keys lowered, as git compares them (git-config(1) for each key).
PROGRAM_KEYS: tuple[tuple[str, bool | None, str, str], ...] = (
    ("core", False, "fsmonitor", SHELL),  # run in the work tree's top (fsmonitor.c)
    ("core", False, "sshcommand", SHELL),
    ("core", False, "pager", SHELL),
    ("core", False, "editor", SHELL),
    ("core", False, "askpass", SHELL),
    ("core", False, "gitproxy", SHELL),
    ("core", False, "alternaterefscommand", SHELL),
    ("pager", False, "*", SHELL),  # pager.<command>
    ("sequence", False, "editor", SHELL),
    ("interactive", False, "difffilter", SHELL),
    ("filter", True, "clean", SHELL),
    ("filter", True, "smudge", SHELL),
    ("filter", True, "process", SHELL),
    ("diff", False, "external", SHELL),
    ("diff", True, "command", SHELL),
    ("diff", True, "textconv", SHELL),
    ("merge", True, "driver", SHELL),
    ("difftool", True, "cmd", SHELL),
    ("difftool", True, "path", PROGRAM),
    ("mergetool", True, "cmd", SHELL),
    ("mergetool", True, "path", PROGRAM),
    ("credential", None, "helper", BANG),
    ("gpg", None, "program", PROGRAM),  # gpg.program, gpg.<format>.program
    ("gpg", True, "defaultkeycommand", SHELL),  # gpg.ssh.defaultKeyCommand
    ("alias", False, "*", ALIAS),
    ("submodule", True, "update", BANG),
    ("remote", True, "uploadpack", SHELL),  # run here for a local remote
    ("remote", True, "receivepack", SHELL),
    ("sendemail", None, "sendmailcmd", SHELL),
    ("sendemail", None, "smtpserver", PROGRAM),
    ("sendemail", None, "tocmd", SHELL),
    ("sendemail", None, "cccmd", SHELL),
    ("sendemail", None, "headercmd", SHELL),
    ("trailer", True, "command", SHELL),
    ("trailer", True, "cmd", SHELL),
    ("hook", True, "command", SHELL),  # config-based hooks (git 2.50+)
    ("uploadpack", False, "packobjectshook", SHELL),
    ("browser", True, "cmd", SHELL),
    ("browser", True, "path", PROGRAM),
    ("man", True, "cmd", SHELL),
    ("man", True, "path", PROGRAM),
    ("guitool", True, "cmd", SHELL),
    ("lfs", True, "path", PROGRAM),  # lfs.customtransfer.<name>.path
    ("lfs", True, "clean", SHELL),  # lfs.extension.<name>.clean/smudge
    ("lfs", True, "smudge", SHELL),
)

_KEYS: dict[tuple[bytes, bool, bytes], str] = {}
for _sec, _sub, _key, _how in PROGRAM_KEYS:
    for _has in (True, False) if _sub is None else (_sub,):
        _KEYS[(_sec.encode(), _has, _key.encode())] = _how
_SECTIONS = tuple({s.encode() for s, _, _, _ in PROGRAM_KEYS} | {b"include", b"core"})


def program_kind(section: bytes, key: bytes) -> str | None:
    """How git runs the value of ``key`` in ``section`` (both lowered, the subsection
    as the parser keeps it), or None: not a program setting."""
    name, dot, _sub = section.partition(b".")
    return _KEYS.get((name, bool(dot), key)) or _KEYS.get((name, bool(dot), b"*"))


def program_words(how: str, value: str) -> tuple[str, ...]:
    """The words of a program setting's ``value`` that name a file (module rules)."""
    if how == BANG:
        if value.startswith("!"):
            return _words(value[1:])
        return (value,) if value.startswith("/") else ()
    if how == PROGRAM:
        return (value,) if "/" in value else ()
    if how == ALIAS and not value.startswith("!"):
        return _git_options(_tokens(value))
    return _words(value[1:] if how == ALIAS else value)


def _tokens(command: str) -> list[str]:
    import shlex

    try:
        lex = shlex.shlex(command, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        return list(lex)
    except ValueError:  # an open quote: sh would refuse it; split on white space
        return command.split()


def _git_options(tokens: list[str]) -> tuple[str, ...]:
    """The file words of the program settings an alias passes to git (``-c key=value``)."""
    found: list[str] = []
    for at, token in enumerate(tokens[:-1]):
        if token != "-c":
            continue
        key, eq, value = tokens[at + 1].partition("=")
        section, _, name = key.lower().rpartition(".")
        how = program_kind(section.encode(), name.encode()) if eq and section else None
        if how is not None:
            found.extend(program_words(how, value))
    return tuple(dict.fromkeys(found))


def _words(command: str) -> tuple[str, ...]:
    found = []
    for word in _tokens(command):
        eq, slash = word.find("="), word.find("/")
        token = word[eq + 1 :] if 0 <= eq < slash else word  # NAME=path, --opt=path
        if "/" in token and token[0] != "-" and "://" not in token and not {"$", "`"} & set(token):
            found.append(token)
    return tuple(dict.fromkeys(found))


class GitConfigError(ValueError):
    """git would refuse this config (or sandhold cannot tell where a path leads)."""

    def __init__(self, line: int, reason: str) -> None:
        self.line, self.reason = line, reason
        super().__init__(f"line {line}: {reason}" if line else reason)


def parse(data: bytes) -> GitConfig:
    """The include and hooks settings of a config file's ``data`` (see module rules).

    Raises:
        GitConfigError: a line git would refuse, or a file larger than ``MAX_BYTES``.
    """
    if len(data) > MAX_BYTES:
        raise GitConfigError(0, f"larger than {MAX_BYTES >> 20} MiB")
    lowered = data.lower()
    if not any(name in lowered for name in _SECTIONS):
        # Section and key names are never escaped nor split across lines: no such
        # setting can be in it. (Lines git would refuse go unnoticed, harmlessly.)
        return GitConfig()
    return _Parser(data[len(_BOM) :] if data.startswith(_BOM) else data).run()


def _alpha(c: int) -> bool:
    return 65 <= c <= 90 or 97 <= c <= 122


def _keychar(c: int) -> bool:
    return _alpha(c) or 48 <= c <= 57 or c == 45  # git's iskeychar: alnum or '-'


def _lower(c: int) -> int:
    return c + 32 if 65 <= c <= 90 else c


class _Parser:
    """git's ``git_parse_source``, one byte at a time, keeping only what matters here."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0
        self.line = 1
        self.eof = False
        self.includes: list[str] = []
        self.hooks: list[str] = []
        self.programs: list[tuple[str, str]] = []

    def char(self) -> int:
        """The next byte; CR LF reads as LF, and the end of the data as LF (``eof``)."""
        data, at = self.data, self.at
        if at >= len(data):
            self.eof = True
            return _NL
        c = data[at]
        self.at = at + 1
        if c == 13 and data[at + 1 : at + 2] == b"\n":
            self.at += 1
            c = _NL
        if c == _NL:
            self.line += 1
        return c

    def fail(self, reason: str, *, at_newline: bool = False) -> GitConfigError:
        """The error, on git's line: the one a newline just ended, with ``at_newline``."""
        return GitConfigError(self.line - at_newline, reason)

    def run(self) -> GitConfig:
        section = b""
        comment = False
        while True:
            c = self.char()
            if c == _NL:
                if self.eof:
                    programs = tuple(dict.fromkeys(self.programs))
                    return GitConfig(tuple(self.includes), tuple(self.hooks), programs)
                comment = False
            elif comment or c in _SPACE:
                continue
            elif c in b"#;":
                comment = True
            elif c == 91:  # '['
                section = self.header()
            elif _alpha(c):
                self.entry(section, c)
            else:
                raise self.fail(f"a name starts with {chr(c)!r}")

    def header(self) -> bytes:
        """``[name]``, ``[name "subsection"]`` or ``[name.subsection]``: the section."""
        name = bytearray()
        while True:
            c = self.char()
            if self.eof:
                raise self.fail("a section header is not closed")
            if c == 93:  # ']'
                break
            if c in _SPACE:
                self.subsection(name, c)
                break
            if not (_keychar(c) or c == 46):
                raise self.fail(f"a section name holds {chr(c)!r}")
            name.append(_lower(c))
        if not name:
            raise self.fail("a section has no name")
        return bytes(name)

    def subsection(self, name: bytearray, c: int) -> None:
        while c in _SPACE:
            if c == _NL:
                raise self.fail("a section header is not closed", at_newline=not self.eof)
            c = self.char()
        if c != 34:
            raise self.fail('a subsection is not quoted ([section "subsection"])')
        name.append(46)
        while True:
            c = self.char()
            if c == 92:  # '\\': the next byte as it is
                c = self.char()
            elif c == 34:
                break
            if c == _NL:
                raise self.fail("a subsection is not closed", at_newline=not self.eof)
            name.append(c)
        if self.char() != 93:
            raise self.fail("a section header does not end after its subsection")

    def entry(self, section: bytes, c: int) -> None:
        key = bytearray((_lower(c),))
        while True:
            c = self.char()
            if self.eof or not _keychar(c):
                break
            key.append(_lower(c))
        while c in b" \t":
            c = self.char()
        if c == _NL:
            return  # a boolean: no path setting takes one (git refuses it there)
        if c != 61:  # '='
            raise self.fail(f"a key is followed by {chr(c)!r}, not '='")
        if key == b"path" and (section == b"include" or section.startswith(b"includeif.")):
            found = self.includes
        elif key == b"hookspath" and section == b"core":
            found = self.hooks
        elif (how := program_kind(section, bytes(key))) is not None:
            setting = f"{section.decode('utf-8', 'surrogateescape')}.{key.decode()}"
            for v in self.value():
                text = v.decode("utf-8", "surrogateescape")
                self.programs.extend((setting, w) for w in program_words(how, text))
            return
        else:
            self.skip_value()
            return
        found.extend(v.decode("utf-8", "surrogateescape") for v in self.value())

    def skip_value(self) -> None:
        """Past the value of a setting of no interest here: in one step where the
        line has no quote or backslash (nothing in it can then be an error)."""
        data, at = self.data, self.at
        end = data.find(b"\n", at)
        end = len(data) if end < 0 else end
        if b'"' in data[at:end] or b"\\" in data[at:end]:
            self.value()
            return
        self.at = end + 1
        self.line += 1
        self.eof = end >= len(data)

    def value(self) -> tuple[bytes, ...]:
        """The value, and where it differs, as git before 2.46 read it: with each
        white space byte inside it (a tab, a CR) read as a space."""
        out = bytearray()
        quote = comment = False
        trim = 0  # where trailing white space starts, once there is some
        spaces: list[int] = []  # where unquoted white space other than ' ' was kept
        while True:
            c = self.char()
            if c == _NL:
                if quote:
                    raise self.fail("a quoted value is not closed", at_newline=not self.eof)
                if trim:
                    del out[trim:]
                spaced = bytearray(out)
                for at in spaces:
                    if at < len(spaced):
                        spaced[at] = 32
                # git keeps a value as a C string: it ends at a NUL byte
                new, old = bytes(out).split(b"\0", 1)[0], bytes(spaced).split(b"\0", 1)[0]
                return (new,) if old == new else (new, old)
            if comment:
                continue
            if c in _SPACE and not quote:
                if not trim:
                    trim = len(out)
                if out:
                    spaces.append(len(out))
                    out.append(c)
                continue
            if c in b"#;" and not quote:
                comment = True
                continue
            trim = 0
            if c == 92:  # '\\'
                c = self.char()
                if c == _NL:
                    continue  # the value goes on on the next line
                if c not in b'tbn\\"':
                    raise self.fail(f"unknown escape \\{chr(c)}")
                out.append({116: 9, 98: 8, 110: 10}.get(c, c))
            elif c == 34:
                quote = not quote
            else:
                out.append(c)


def expand(value: str, base: str, home: str) -> str | None:
    """The absolute path git opens for a path setting's ``value``, spelled as git
    spells it (symlinks and ``..`` are the kernel's to follow); ``base`` is what a
    relative value is relative to. None for ``%(prefix)/…``, git's own files.

    Raises:
        GitConfigError: ``~user/…``, or ``~`` with no home directory.
    """
    if value.startswith("%(prefix)/"):
        return None
    if value == "~" or value.startswith("~/"):
        if not home.startswith("/"):
            raise GitConfigError(0, f"{value}: no home directory to expand ~ in")
        return home.rstrip("/") + value[1:]
    if value.startswith("~"):
        raise GitConfigError(0, f"{value}: another user's home is not looked up; spell it out")
    if value.startswith("/"):
        return value
    return f"{base.rstrip('/')}/{value}"


def pointer(data: bytes, base: str, prefix: bytes = b"") -> str | None:
    """Where a pointer file leads, from its ``data`` and its directory ``base``: a
    ``.git`` file (``prefix`` ``b"gitdir: "``) or a git dir's ``commondir``. None if
    git would not follow it (no ``prefix``, no path, more than one line)."""
    if not data.startswith(prefix):
        return None
    text = data[len(prefix) :].rstrip(b"\r\n").decode("utf-8", "surrogateescape")
    if not text or "\n" in text or "\0" in text:
        return None
    return text if text.startswith("/") else f"{base.rstrip('/')}/{text}"


def host_files(home: str, environ: Mapping[str, str]) -> tuple[str, ...]:
    """git's system and per-user config files, which it reads in every repository:
    ``/etc/gitconfig``, ``~/.gitconfig``, ``git/config`` below ``~/.config`` and
    ``$XDG_CONFIG_HOME``, and ``$GIT_CONFIG_SYSTEM`` and ``$GIT_CONFIG_GLOBAL`` as
    this environment names them (absolute only). All of them, whichever git would
    pick: the host may run git with another environment."""
    from sandhold.policy.mandatory import user_config_paths

    files = ["/etc/gitconfig", f"{home.rstrip('/')}/.gitconfig"]
    xdg = user_config_paths(home, environ.get("XDG_CONFIG_HOME"))
    files += [path for path, _ in xdg if path.endswith("/git/config")]
    files += [
        environ[name]
        for name in ("GIT_CONFIG_SYSTEM", "GIT_CONFIG_GLOBAL")
        if environ.get(name, "").startswith("/")
    ]
    return tuple(dict.fromkeys(files))
