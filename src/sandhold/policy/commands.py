"""The server's command policy: which commands a run of a given mode may not start.

Rules (issue 17, "Command policy per mode"; docs/server.md "Command policy"):
- A guard-rail, not a boundary. A program can always push or publish by other means
  (a script, a hook, ``python -c``, its own HTTP client); the sandbox's network rule
  is the boundary. This module only stops the commands a reviewer would not expect
  an agent to type, and says which rule stopped them and what would allow them.
- Rules are data (``CommandRule``): an id, the modes it applies in, the modes in which
  the run's ``push: allow`` lifts it, and word patterns (``git push``, ``npm publish``).
  ``DEFAULT_RULES`` refuse in every mode: git pushes (lifted by ``push: allow`` in
  ``chat``, where only that setting is allowed), GitHub writes such as ``gh pr
  merge`` (likewise), and publishing, releases, repository deletion, registry and
  deploy commands (not lifted by ``push: allow``: they are hard to take back; the
  user lifts one by its id in ``<state-dir>/command-policy.json``). ``orchestrate``
  is treated as ``review`` and ``plan``: it changes the world through the runs it
  starts, never directly.
- A command is an argv list or a shell string (run by ``/bin/sh -c``). A shell string
  is read by a small grammar-aware lexer (quotes, escapes, ``;``, ``&&``, ``||``,
  ``|``, ``&``, newlines, subshells, ``$(...)``, backticks, here-documents,
  redirections); every command found, including those inside substitutions, is
  checked. Wrappers are looked through (``env``, ``sudo``, ``timeout``, ``xargs``,
  ``sh -c``, ``find -exec``, ``python -m``, ``uv run``...), and so are git's global
  options and ``-c alias.*`` aliases.
- Fail closed: what the lexer cannot read with confidence (unbalanced quotes,
  ``eval``, a command name or a matched word decided at run time such as ``$X push``,
  a shell reading its commands from standard input) is refused with rule
  ``unparseable`` in every mode where any rule applies.
- ``check_command`` never raises on any string or list of strings; it raises
  ``ValueError`` only for a mode or push value that is not one of the fixed ones.
  ``CommandRules.from_json`` raises ``ValueError`` naming the field for any
  malformed policy file, and accepts no unknown key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

MODES: tuple[str, ...] = ("chat", "review", "plan", "orchestrate")
"""The run modes of the server (SPEC §4)."""

PUSH_VALUES: tuple[str, ...] = ("allow", "deny")
"""The values of a run's ``push`` setting."""

CONFIG_FILE = "command-policy.json"
"""The file under the server's state dir that ``CommandRules.from_json`` reads."""

UNPARSEABLE = "unparseable"
"""The rule of a command the policy cannot read with confidence."""

_ALL = frozenset(MODES)
_CHAT = frozenset({"chat"})
_MAX_DEPTH = 16  # nested shells, substitutions, wrappers and aliases
_MAX_SHOWN = 160  # characters of the command quoted in a refusal
_RULE_ID = re.compile(r"[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)*\Z")


@dataclass(frozen=True, slots=True)
class CommandRule:
    """One rule: ``match`` patterns refused in ``modes``, unless lifted by ``push: allow``.

    A pattern is a tuple of words: the program's name (its basename: ``/usr/bin/git``
    is ``git``), then the subcommand words in order, each the first non-option word
    after the previous one (``gh -R o/r pr merge`` matches ``("gh", "pr", "merge")``).
    A word ending in ``*`` matches by prefix (``remote-*``). Words starting with ``-``
    are options that must also appear, anywhere after the subcommand
    (``("docker", "buildx", "build", "--push")``).
    """

    id: str
    modes: frozenset[str]
    match: tuple[tuple[str, ...], ...]
    push_lifts: frozenset[str] = frozenset()
    description: str = ""


@dataclass(frozen=True, slots=True)
class CommandRefusal:
    """A command the policy refuses: the rule's id, and a message naming the rule, the
    command and the setting that would allow it."""

    rule: str
    message: str


@dataclass(frozen=True, slots=True)
class CommandRules:
    """A rule set; ``DEFAULT_RULES`` or one read from ``command-policy.json``."""

    rules: tuple[CommandRule, ...]

    def __post_init__(self) -> None:
        ids = [r.id for r in self.rules]
        if len(ids) != len(set(ids)):
            raise ValueError(f"command rules: an id appears twice in {ids}")

    def rule(self, rule_id: str) -> CommandRule | None:
        """The rule with this id, if any."""
        for r in self.rules:
            if r.id == rule_id:
                return r
        return None

    @classmethod
    def from_json(cls, obj: object) -> CommandRules:
        """The rule set a parsed ``command-policy.json`` describes.

        Format (docs/server.md): ``{"version": 1, "defaults": true, "rules": {ID: RULE}}``.
        With ``defaults`` (the default) the file edits ``DEFAULT_RULES``: a RULE under
        an existing id replaces the fields it names (``{"modes": []}`` turns it off);
        a new id adds a rule, which needs ``modes`` and ``match``. RULE's fields:
        ``description`` (string), ``modes`` and ``push_lifts`` (lists of modes,
        ``push_lifts`` within ``modes``), ``match`` (a list of patterns, each a list
        of words).

        Raises:
            ValueError: naming the field, for a missing or unknown key, a wrong type,
                an unknown mode, a bad rule id or pattern.
        """
        top = _object(obj, CONFIG_FILE, required={"version"}, optional={"defaults", "rules"})
        if top["version"] != 1 or isinstance(top["version"], bool):
            raise ValueError(f"{CONFIG_FILE}: version: must be 1, not {top['version']!r}")
        defaults = top.get("defaults", True)
        if not isinstance(defaults, bool):
            raise ValueError(f"{CONFIG_FILE}: defaults: must be true or false")
        rules = {r.id: r for r in DEFAULT_RULES.rules} if defaults else {}
        given = top.get("rules", {})
        if not isinstance(given, dict):
            raise ValueError(f"{CONFIG_FILE}: rules: must be an object of rule id to rule")
        for rule_id, body in given.items():
            where = f"{CONFIG_FILE}: rules.{rule_id}"
            if not _RULE_ID.match(rule_id) or rule_id == UNPARSEABLE:
                raise ValueError(
                    f"{where}: not a rule id (dotted lower-case words such as 'publish.npm'; "
                    f"{UNPARSEABLE!r} is reserved)"
                )
            old = rules.get(rule_id)
            need = set() if old else {"modes", "match"}
            spec = _object(
                body,
                where,
                required=need,
                optional={"description", "modes", "match", "push_lifts"} - need,
            )
            modes = _modes(spec["modes"], f"{where}.modes") if "modes" in spec else None
            lifts = (
                _modes(spec["push_lifts"], f"{where}.push_lifts") if "push_lifts" in spec else None
            )
            match = _patterns(spec["match"], f"{where}.match") if "match" in spec else None
            description = spec.get("description")
            if description is not None and not isinstance(description, str):
                raise ValueError(f"{where}.description: must be a string")
            base = old or CommandRule(rule_id, frozenset(), ())
            new = CommandRule(
                id=rule_id,
                modes=base.modes if modes is None else modes,
                match=base.match if match is None else match,
                # an override that narrows modes narrows the lifts with them
                push_lifts=base.push_lifts & (base.modes if modes is None else modes)
                if lifts is None
                else lifts,
                description=base.description if description is None else description,
            )
            if not new.push_lifts <= new.modes:
                raise ValueError(
                    f"{where}.push_lifts: {sorted(new.push_lifts - new.modes)} not in its modes"
                )
            rules[rule_id] = new
        return cls(tuple(rules.values()))


def _object(
    obj: object, where: str, *, required: set[str], optional: set[str]
) -> dict[str, object]:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: must be a JSON object, not {type(obj).__name__}")
    for key in obj:
        if key not in required and key not in optional:
            known = ", ".join(sorted(required | optional))
            raise ValueError(f"{where}: unknown key {key!r} (known: {known})")
    for key in sorted(required):
        if key not in obj:
            raise ValueError(f"{where}: missing key {key!r}")
    return obj


def _modes(obj: object, where: str) -> frozenset[str]:
    if not isinstance(obj, list):
        raise ValueError(f"{where}: must be a list of modes ({', '.join(MODES)})")
    for i, m in enumerate(obj):
        if m not in MODES or not isinstance(m, str):
            raise ValueError(f"{where}[{i}]: {m!r} is not a mode ({', '.join(MODES)})")
    return frozenset(obj)


def _patterns(obj: object, where: str) -> tuple[tuple[str, ...], ...]:
    if not isinstance(obj, list) or not obj:
        raise ValueError(f"{where}: must be a non-empty list of patterns (lists of words)")
    out = []
    for i, pat in enumerate(obj):
        if not isinstance(pat, list) or not pat:
            raise ValueError(f"{where}[{i}]: must be a non-empty list of words")
        for j, word in enumerate(pat):
            if not isinstance(word, str) or not word or word.strip() != word or " " in word:
                raise ValueError(f"{where}[{i}][{j}]: must be a non-empty word without spaces")
        if "/" in pat[0] or pat[0].startswith("-") or pat[0].endswith("*"):
            raise ValueError(
                f"{where}[{i}][0]: the program is a plain name (no '/', '-' or '*'), not {pat[0]!r}"
            )
        out.append(tuple(pat))
    return tuple(out)


def _rule(
    rule_id: str, description: str, *match: tuple[str, ...], lifts: frozenset[str] = frozenset()
) -> CommandRule:
    return CommandRule(rule_id, _ALL, tuple(match), lifts, description)


DEFAULT_RULES = CommandRules(
    (
        _rule(
            "git.push",
            "sends commits out of the sandbox",
            ("git", "push"),
            ("git", "send-pack"),
            ("git", "http-push"),
            ("git", "remote-*"),
            ("git", "subtree", "push"),
            ("git", "lfs", "push"),
            ("git", "svn", "dcommit"),
            ("git", "p4", "submit"),
            ("git", "send-email"),
            lifts=_CHAT,
        ),
        _rule(
            "github.write",
            "changes pull requests or issues on GitHub",
            *(
                ("gh", "pr", verb)
                for verb in (
                    "merge",
                    "create",
                    "close",
                    "reopen",
                    "edit",
                    "ready",
                    "review",
                    "comment",
                )
            ),
            *(
                ("gh", "issue", verb)
                for verb in ("create", "close", "reopen", "edit", "comment", "delete", "transfer")
            ),
            ("glab", "mr", "merge"),
            ("glab", "mr", "create"),
            lifts=_CHAT,
        ),
        _rule(
            "github.release",
            "publishes or changes a release",
            *(("gh", "release", verb) for verb in ("create", "upload", "delete", "edit")),
            ("glab", "release", "create"),
        ),
        _rule(
            "github.repo",
            "creates, deletes or changes a hosted repository, its secrets or workflows",
            *(
                ("gh", "repo", verb)
                for verb in ("create", "delete", "archive", "rename", "edit", "fork", "sync")
            ),
            ("gh", "secret", "set"),
            ("gh", "secret", "delete"),
            ("gh", "variable", "set"),
            ("gh", "variable", "delete"),
            ("gh", "workflow", "run"),
            ("gh", "run", "rerun"),
            ("gh", "api", "--method"),
            ("gh", "api", "-X"),
        ),
        _rule(
            "publish.npm",
            "publishes a package to an npm registry",
            *(
                (tool, verb)
                for tool in ("npm", "pnpm", "yarn", "bun")
                for verb in ("publish", "unpublish")
            ),
            ("npm", "deprecate"),
            ("npm", "dist-tag", "add"),
            ("yarn", "npm", "publish"),
        ),
        _rule(
            "publish.pypi",
            "uploads a package to a Python package index",
            ("twine", "upload"),
            ("twine", "register"),
            ("poetry", "publish"),
            ("uv", "publish"),
            ("hatch", "publish"),
            ("flit", "publish"),
            ("pdm", "publish"),
            ("setup.py", "upload"),
            ("setup.py", "register"),
        ),
        _rule(
            "publish.cargo",
            "publishes a crate",
            ("cargo", "publish"),
            ("cargo", "yank"),
            ("cargo", "owner"),
        ),
        _rule(
            "publish.gem",
            "publishes a gem",
            ("gem", "push"),
            ("gem", "yank"),
            ("gem", "owner"),
        ),
        _rule(
            "publish.container",
            "pushes an image or chart to a registry",
            *(
                (tool, "push")
                for tool in ("docker", "podman", "buildah", "helm", "oras", "crane", "nerdctl")
            ),
            *((tool, "image", "push") for tool in ("docker", "podman", "nerdctl")),
            ("docker", "manifest", "push"),
            ("podman", "manifest", "push"),
            ("docker", "buildx", "build", "--push"),
            ("helm", "cm-push"),
            ("skopeo", "copy"),
        ),
        _rule(
            "deploy",
            "deploys or changes live infrastructure",
            *(
                (tool, verb)
                for tool in ("terraform", "tofu")
                for verb in ("apply", "destroy", "import")
            ),
            *(("pulumi", verb) for verb in ("up", "destroy")),
            *(
                ("kubectl", verb)
                for verb in (
                    "apply",
                    "create",
                    "delete",
                    "replace",
                    "patch",
                    "edit",
                    "scale",
                    "rollout",
                )
            ),
            *(("helm", verb) for verb in ("install", "upgrade", "uninstall", "rollback")),
            *(
                (tool, "deploy")
                for tool in (
                    "fly",
                    "flyctl",
                    "vercel",
                    "netlify",
                    "firebase",
                    "wrangler",
                    "serverless",
                    "sls",
                )
            ),
        ),
    )
)
"""The default rules, refused in every mode (see the module's Rules)."""


def check_command(
    command: Sequence[str] | str,
    *,
    mode: str,
    push: str,
    rules: CommandRules = DEFAULT_RULES,
) -> CommandRefusal | None:
    """Whether a run of ``mode`` may start ``command``: None, or why not.

    Args:
        command: an argv list (run as is), or a shell string (run by ``/bin/sh -c``).
        mode: the run's mode, one of ``MODES``.
        push: the run's ``push`` setting, ``allow`` or ``deny``.
        rules: the rule set (``DEFAULT_RULES``, or ``CommandRules.from_json``'s).

    Returns:
        None when no rule refuses the command, else a ``CommandRefusal`` whose message
        names the rule, the command, and the setting that would allow it.

    Raises:
        ValueError: ``mode`` or ``push`` is not one of the fixed values. Nothing else:
            a command that cannot be read is refused (rule ``unparseable``).
    """
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    if push not in PUSH_VALUES:
        raise ValueError(f"push: {push!r} is not one of {', '.join(PUSH_VALUES)}")
    active = [
        r for r in rules.rules if mode in r.modes and not (push == "allow" and mode in r.push_lifts)
    ]
    if not active:
        return None
    try:
        if isinstance(command, str):
            commands = _Lexer(command, 0).commands()
        elif all(isinstance(w, str) for w in command):
            commands = [_Cmd(tuple(_Word(w) for w in command))]
        else:
            raise ValueError("command: an argv list holds strings only")
        for cmd in commands:
            for inv in _invocations(cmd.words, cmd.open_tail, 0):
                for rule in active:
                    if _matches(rule, inv):
                        return _refusal(rule, inv, mode)
    except _Unparseable as e:
        return CommandRefusal(
            UNPARSEABLE,
            f"command refused by rule {UNPARSEABLE!r} in a {mode} run: the command policy "
            f"cannot tell what {_show(command)} runs ({e.why}). Send it as an argv list, or "
            "spell it without that construct; the rule holds in every mode where a rule of "
            f"{CONFIG_FILE} applies.",
        )
    except RecursionError:
        # deeper than _MAX_DEPTH guards against cannot happen; refuse, never wave through
        return CommandRefusal(UNPARSEABLE, f"command refused by rule {UNPARSEABLE!r}: too deep")
    return None


def _refusal(rule: CommandRule, inv: _Invocation, mode: str) -> CommandRefusal:
    what = rule.description or "matches " + " or ".join(" ".join(p) for p in rule.match[:3])
    shown = _show(" ".join([inv.program, *(w.text for w in inv.args)]))
    if mode in rule.push_lifts:
        lift = f"start the run with push: allow, or change rule {rule.id!r} in {CONFIG_FILE}"
    else:
        lift = (
            f"remove {mode!r} from the 'modes' of rule {rule.id!r} in {CONFIG_FILE} "
            f"(push: allow does not lift it in a {mode} run)"
        )
    return CommandRefusal(
        rule.id,
        f"command refused by rule {rule.id!r} in a {mode} run: {shown} {what}. "
        f"To allow it, {lift}.",
    )


def _show(command: Sequence[str] | str) -> str:
    text = command if isinstance(command, str) else " ".join(command)
    text = text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."
    return repr(text)


# -- the shell lexer -------------------------------------------------------------------


class _Unparseable(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True, slots=True)
class _Word:
    """A word of a command as the program will see it: its text once quotes are
    removed, or ``dynamic`` saying why the shell decides it at run time."""

    text: str
    dynamic: str | None = None
    assignment: bool = False  # NAME=... with NAME unquoted: the shell assigns it


@dataclass(frozen=True, slots=True)
class _Cmd:
    words: tuple[_Word, ...]
    open_tail: bool = False  # more words may be appended (xargs)


@dataclass(frozen=True, slots=True)
class _Invocation:
    program: str
    args: tuple[_Word, ...]
    open_tail: bool


_BLANK = " \t"
_OPERATOR_CHARS = ";&|()<>\n"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")
# longest first: the lexer takes the first that matches
_OPERATORS = (
    ";;&", "<<-", "<<<", "&>>", ";;", ";&", "&&", "||", "|&", "<<", ">>", "<&", ">&", "<>",
    ">|", "&>", ";", "&", "|", "(", ")", "<", ">", "\n",
)  # fmt: skip
_REDIRECTIONS = {"<", ">", ">>", "<<", "<<-", "<<<", "<&", ">&", "<>", ">|", "&>", "&>>"}


@dataclass(slots=True)
class _Heredoc:
    delimiter: str
    strip_tabs: bool
    expands: bool


@dataclass(slots=True)
class _WordBuilder:
    text: list[str] = field(default_factory=list)
    dynamic: str | None = None
    raw_start: int = 0
    literal_prefix: list[str] = field(default_factory=list)  # unquoted text before any quote
    quoted: bool = False
    started: bool = False

    def add(self, s: str, *, quoted: bool) -> None:
        self.started = True
        if quoted:
            self.quoted = True
        elif not self.quoted and self.dynamic is None:
            self.literal_prefix.append(s)
        self.text.append(s)

    def make_dynamic(self, why: str, raw: str) -> None:
        self.started = True
        self.quoted = True  # what follows is no longer a plain prefix
        if self.dynamic is None:
            self.dynamic = why
        self.text.append(raw)


class _Lexer:
    """Reads a POSIX shell string into its simple commands, including those inside
    substitutions. Anything it cannot read with confidence raises ``_Unparseable``."""

    def __init__(self, s: str, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise _Unparseable("commands nested too deeply")
        self.s = s
        self.i = 0
        self.depth = depth
        self.found: list[_Cmd] = []
        self.heredocs: list[_Heredoc] = []
        self._bracket_seen: tuple[int, bool] = (-1, False)
        self._brace_seen: tuple[int, int] = (-1, -1)

    def commands(self) -> list[_Cmd]:
        self._list(until_paren=False)
        if self.heredocs:
            raise _Unparseable("a here-document without its body")
        return self.found

    # a list of commands up to the end, or up to the ``)`` closing a ``$(``
    def _list(self, *, until_paren: bool) -> None:
        words: list[_Word] = []
        parens = 0
        while True:
            self._blanks()
            if self.i >= len(self.s):
                if until_paren:
                    raise _Unparseable("an unterminated $( or <(")
                if parens:
                    raise _Unparseable("an unbalanced (")
                self._end(words)
                return
            c = self.s[self.i]
            if c == "#":
                # at the start of a word, a comment: it runs to the end of the line
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
                continue
            if c in "<>" and self.s.startswith("(", self.i + 1):
                self.i += 2
                self._list(until_paren=True)
                words.append(_Word(c + "(...)", "a process substitution"))
                continue
            op = self._operator()
            if op is None:
                start = self.i
                w = self._word()
                if self.s[start : self.i].isdigit() and self.s.startswith(("<", ">"), self.i):
                    continue  # the fd number of a redirection such as 2>
                if w is not None:
                    if not words and w.text == "case" and w.dynamic is None:
                        raise _Unparseable("a case statement")
                    words.append(w)
                continue
            if op in _REDIRECTIONS:
                self._blanks()
                if self.i >= len(self.s) or self._peek_operator():
                    raise _Unparseable(f"a redirection {op!r} without its target")
                start = self.i
                target = self._word()
                if op in ("<<", "<<-"):
                    raw = self.s[start : self.i]
                    if target is None or target.dynamic is not None:
                        raise _Unparseable("a here-document whose delimiter is decided at run time")
                    expands = not any(q in raw for q in "'\"\\")
                    self.heredocs.append(_Heredoc(target.text, op == "<<-", expands))
                continue
            if op == "(":
                self._end(words)
                words = []
                parens += 1
                continue
            if op == ")":
                self._end(words)
                words = []
                if parens:
                    parens -= 1
                    continue
                if until_paren:
                    return
                raise _Unparseable("an unbalanced )")
            # ; & && || | |& ;; newline: the end of a simple command
            self._end(words)
            words = []
            if op == "\n":
                self._heredoc_bodies()

    def _end(self, words: list[_Word]) -> None:
        if words:
            self.found.append(_Cmd(tuple(words)))

    def _blanks(self) -> None:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in _BLANK:
                self.i += 1
            elif self.s.startswith("\\\n", self.i):
                self.i += 2  # a line continuation
            else:
                return

    def _operator(self) -> str | None:
        for op in _OPERATORS:
            if self.s.startswith(op, self.i):
                self.i += len(op)
                return op
        return None

    def _peek_operator(self) -> bool:
        return self.s[self.i] in _OPERATOR_CHARS

    def _word(self) -> _Word | None:
        b = _WordBuilder()
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in _BLANK or c in _OPERATOR_CHARS:
                break
            if c == "\\":
                if self.i + 1 >= len(s):
                    b.add("\\", quoted=True)  # sh keeps a backslash that ends the string
                    self.i += 1
                    continue
                if s[self.i + 1] != "\n":
                    b.add(s[self.i + 1], quoted=True)
                self.i += 2
            elif c == "'":
                end = s.find("'", self.i + 1)
                if end < 0:
                    raise _Unparseable("an unbalanced single quote")
                b.add(s[self.i + 1 : end], quoted=True)
                self.i = end + 1
            elif c == '"':
                self.i += 1
                self._double_quoted(b)
            elif c == "$":
                self._dollar(b, in_quotes=False)
            elif c == "`":
                self._backtick(b, in_quotes=False)
            elif c in "*?" or (c == "[" and self._bracket_closes()):
                b.make_dynamic("a glob pattern", c)
                self.i += 1
            elif c == "{" and self._brace_expands():
                # bash's brace expansion ({git,push}) turns one word into several
                b.make_dynamic("a brace expansion", c)
                self.i += 1
            else:
                b.add(c, quoted=False)
                self.i += 1
        if not b.started:
            return None
        return _Word("".join(b.text), b.dynamic, bool(_ASSIGNMENT.match("".join(b.literal_prefix))))

    def _bracket_closes(self) -> bool:
        # [ is a glob only with a ] later in the word ([ -f x ] is the test command).
        # The answer holds up to the char that decided it: kept, so that a run of [
        # is read in linear time
        if self.i < self._bracket_seen[0]:
            return self._bracket_seen[1]
        k = self.i + 1
        while k < len(self.s):
            c = self.s[k]
            if c == "]" or c in _BLANK or c in _OPERATOR_CHARS:
                break
            k += 1
        closes = k < len(self.s) and self.s[k] == "]"
        self._bracket_seen = (k, closes)
        return closes

    def _brace_expands(self) -> bool:
        # {a,b} and {1..3}: a } in the same word, no blank inside. Read up to the next
        # blank or operator char at most, and that end is kept (linear time, as above)
        if self.i < self._brace_seen[0]:
            end = self._brace_seen[1]
        else:
            k = self.i + 1
            while k < len(self.s) and not (self.s[k] in _BLANK or self.s[k] in _OPERATOR_CHARS):
                k += 1
            end = self.s.rfind("}", self.i + 1, k)
            self._brace_seen = (k, end)
        if end < 0:
            return False
        inner = self.s[self.i + 1 : end]
        # quadratic reading of long runs is avoided: a long one counts as an expansion
        return len(inner) > 256 or "," in inner or ".." in inner

    def _double_quoted(self, b: _WordBuilder) -> None:
        s = self.s
        b.add("", quoted=True)
        while True:
            if self.i >= len(s):
                raise _Unparseable("an unbalanced double quote")
            c = s[self.i]
            if c == '"':
                self.i += 1
                return
            if c == "\\":
                if self.i + 1 >= len(s):
                    raise _Unparseable("an unbalanced double quote")
                nxt = s[self.i + 1]
                if nxt in '$`"\\':
                    b.add(nxt, quoted=True)
                elif nxt != "\n":
                    b.add("\\" + nxt, quoted=True)
                self.i += 2
            elif c == "$":
                self._dollar(b, in_quotes=True)
            elif c == "`":
                self._backtick(b, in_quotes=True)
            else:
                b.add(c, quoted=True)
                self.i += 1

    def _dollar(self, b: _WordBuilder, *, in_quotes: bool) -> None:
        s = self.s
        start = self.i
        nxt = s[self.i + 1] if self.i + 1 < len(s) else ""
        if s.startswith("$((", self.i):
            self.i = self._arithmetic(self.i + 3)
            b.make_dynamic("an arithmetic expansion", s[start : self.i])
        elif nxt == "(":
            self.i += 2
            self._list(until_paren=True)
            b.make_dynamic("a command substitution", s[start : self.i])
        elif nxt == "{":
            end = self._braced(self.i + 2)
            b.make_dynamic("a ${...} expansion", s[start:end])
            self.i = end
        elif nxt == "'" and not in_quotes:
            raise _Unparseable("a $'...' string, which shells read differently")
        elif nxt == '"' and not in_quotes:
            raise _Unparseable('a $"..." string, which shells read differently')
        elif nxt and (nxt in "@*#?-$!0123456789"):
            self.i += 2
            b.make_dynamic(f"the parameter ${nxt}", s[start : self.i])
        elif m := _NAME.match(s, self.i + 1):
            self.i = m.end()
            b.make_dynamic(f"the variable ${m.group()}", s[start : self.i])
        else:
            b.add("$", quoted=in_quotes)
            self.i += 1

    def _arithmetic(self, i: int) -> int:
        # only plain arithmetic is read: a substitution or a quote inside is refused
        depth = 0
        s = self.s
        while i < len(s):
            c = s[i]
            if c in "`'\"\\" or (s.startswith("$(", i) and not s.startswith("$((", i)):
                raise _Unparseable("a substitution or quote inside $((...))")
            if c == "(":
                depth += 1
            elif c == ")":
                if depth:
                    depth -= 1
                elif s.startswith("))", i):
                    return i + 2
                else:
                    raise _Unparseable("a $(( not closed by ))")
            i += 1
        raise _Unparseable("an unterminated $((")

    def _braced(self, i: int) -> int:
        # ${...}: its inside may hold substitutions (${x:-$(cmd)}); those are refused
        s = self.s
        while i < len(s):
            c = s[i]
            if c == "}":
                return i + 1
            if c in "`'\"\\$":
                raise _Unparseable("a quote or substitution inside ${...}")
            i += 1
        raise _Unparseable("an unterminated ${")

    def _backtick(self, b: _WordBuilder, *, in_quotes: bool) -> None:
        s = self.s
        start = self.i
        i = self.i + 1
        inner: list[str] = []
        while True:
            if i >= len(s):
                raise _Unparseable("an unbalanced backtick")
            c = s[i]
            if c == "`":
                break
            if (
                c == "\\"
                and i + 1 < len(s)
                and (s[i + 1] in "$`\\" or (in_quotes and s[i + 1] == '"'))
            ):
                inner.append(s[i + 1])
                i += 2
                continue
            inner.append(c)
            i += 1
        self.i = i + 1
        self.found.extend(_Lexer("".join(inner), self.depth + 1).commands())
        b.make_dynamic("a command substitution", s[start : self.i])

    def _heredoc_bodies(self) -> None:
        pending, self.heredocs = self.heredocs, []
        for doc in pending:
            lines = []
            while True:
                if self.i >= len(self.s):
                    raise _Unparseable(f"a here-document not closed by {doc.delimiter!r}")
                end = self.s.find("\n", self.i)
                end = len(self.s) if end < 0 else end
                line = self.s[self.i : end]
                self.i = min(end + 1, len(self.s))
                if (line.lstrip("\t") if doc.strip_tabs else line) == doc.delimiter:
                    break
                lines.append(line)
            if doc.expands:
                self.found.extend(_Lexer("\n".join(lines), self.depth + 1).expansions())

    def expansions(self) -> list[_Cmd]:
        """The commands in the substitutions of an unquoted here-document's body."""
        b = _WordBuilder()
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "\\":
                self.i += 2
            elif c == "$":
                self._dollar(b, in_quotes=True)
            elif c == "`":
                self._backtick(b, in_quotes=True)
            else:
                self.i += 1
        if self.heredocs:
            raise _Unparseable("a here-document inside a here-document")
        return self.found


# -- looking through wrappers ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Wrapper:
    """A program that runs another command from its arguments: its options that take
    a value, how many plain words precede the command (``timeout 5 CMD``), and whether
    it appends words to the command (``xargs``)."""

    value_opts: frozenset[str] = frozenset()
    fixed: int = 0
    open_tail: bool = False
    shell_opts: frozenset[str] = frozenset()  # options whose value is a shell string
    assignments: bool = False  # NAME=value words before the command (env)


def _w(
    opts: str = "",
    fixed: int = 0,
    *,
    open_tail: bool = False,
    shell: str = "",
    assignments: bool = False,
) -> _Wrapper:
    return _Wrapper(
        frozenset(opts.split()), fixed, open_tail, frozenset(shell.split()), assignments
    )


_WRAPPERS: dict[str, _Wrapper] = {
    "env": _w("-u --unset -C --chdir -S --split-string", assignments=True),
    "command": _w(),
    "builtin": _w(),
    "exec": _w("-a"),
    "nice": _w("-n --adjustment"),
    "nohup": _w(),
    "time": _w("-f --format -o --output"),
    "timeout": _w("-s --signal -k --kill-after", 1),
    "sudo": _w(
        "-u --user -g --group -h --host -p --prompt -C --close-from -D --chdir "
        "-r --role -t --type -U --other-user -T --command-timeout -R --chroot"
    ),
    "doas": _w("-u -C"),
    "xargs": _w(
        "-I -n -P -d -E -L -s -a --arg-file --delimiter --max-args --max-procs "
        "--max-lines --max-chars --replace --eof --process-slot-var",
        open_tail=True,
    ),
    "stdbuf": _w("-i -o -e --input --output --error"),
    "setsid": _w(),
    "ionice": _w("-c --class -n --classdata -t"),
    "chrt": _w("", 1),
    "taskset": _w("", 1),
    "flock": _w("-w --timeout -E --conflict-exit-code", 1, shell="-c --command"),
    "chroot": _w("--userspec --groups", 1),
    "unshare": _w("-S --setuid -G --setgid -R --root -w --wd"),
    "nsenter": _w("-t --target -S --setuid -G --setgid"),
    "strace": _w("-e -o -p -s -u -E -a -b -I -O -P -S -X"),
    "ltrace": _w("-e -o -p -s -u -a -n"),
    "su": _w("-s --shell -g --group -G --supp-group", shell="-c --command"),
    "runuser": _w("-u --user -s --shell -g --group -G --supp-group", shell="-c --command"),
    "script": _w(
        "-E --echo -I --log-in -O --log-out -B --log-io -T --log-timing -m --logging-format",
        shell="-c --command",
    ),
    "busybox": _w(),
    "toybox": _w(),
    "npx": _w("-p --package -c --call"),
    "uvx": _w("--with --from --python -p --with-requirements --index --env-file"),
    "bunx": _w("-p --package"),
    "pnpx": _w(),
}
"""Wrappers looked through; ``-c`` of ``npx`` is a shell string too (``shell_opts``)."""

# programs whose subcommand runs the rest as a command (``uv run pytest``)
_RUNNER_VALUE_OPTS = frozenset(
    [
        "--with",
        "--from",
        "--python",
        "-p",
        "--package",
        "--spec",
        "-n",
        "--name",
        "--prefix",
        "-e",
        "--env",
        "--directory",
        "--project",
        "--group",
        "--extra",
        "--index",
        "--env-file",
        "--with-requirements",
        "-C",
        "--cwd",
        "--filter",
        "-F",
        "--workspace",
        "-w",
    ]
)
_RUNNERS: tuple[tuple[str, ...], ...] = (
    ("uv", "run"), ("uv", "tool", "run"), ("pipx", "run"), ("npm", "exec"), ("pnpm", "exec"),
    ("pnpm", "dlx"), ("yarn", "dlx"), ("yarn", "exec"), ("bun", "x"), ("poetry", "run"),
    ("hatch", "run"), ("pdm", "run"), ("rye", "run"), ("conda", "run"), ("mamba", "run"),
    ("pixi", "run"), ("mise", "exec"), ("devbox", "run"),
)  # fmt: skip
_SHELLS = frozenset(
    ["sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "rbash", "yash", "posh", "fish"]
)
_STDIN_PATHS = frozenset(("-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"))
_REFUSED_BUILTINS = {
    "eval": "eval, which runs a string built at run time",
    "alias": "an alias, which renames commands",
    "fc": "fc, which reruns history",
    "hash": "hash, which can rename commands",
    "enable": "enable, which can rename commands",
    "parallel": "GNU parallel, which builds commands from its arguments and input",
}
_RESERVED = frozenset(
    ["{", "}", "!", "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "coproc"]
)
_PYTHON = re.compile(r"(python|pypy)(\d+(\.\d+)*)?[tw]?\Z|py\Z")
# the value options of the programs the default rules name: fewer is still safe, as an
# unknown option is read both as a flag and as taking the next word (``_positions``)
_VALUE_OPTS: dict[str, frozenset[str]] = {
    "gh": frozenset(("-R", "--repo", "--hostname")),
    "glab": frozenset(("-R", "--repo")),
    "npm": frozenset(("--registry", "--prefix", "-w", "--workspace", "--userconfig", "-C")),
    "pnpm": frozenset(("-C", "--dir", "--filter", "-F", "--registry")),
    "yarn": frozenset(("--cwd",)),
    "cargo": frozenset(("-Z", "--config", "--color", "-C")),
    "docker": frozenset(("-H", "--host", "-c", "--context", "--config", "-l", "--log-level")),
    "podman": frozenset(("--url", "-c", "--connection", "--root", "--runroot")),
    "helm": frozenset(("-n", "--namespace", "--kube-context", "--kubeconfig")),
    "kubectl": frozenset(("-n", "--namespace", "--context", "--kubeconfig", "-s", "--server")),
    "terraform": frozenset(),
}
# git's global options that take a value (git.c handle_options); -c is read apart
_GIT_VALUE_OPTS = frozenset(
    ("-C", "--git-dir", "--work-tree", "--namespace", "--super-prefix", "--attr-source")
)
# git config keys whose value git runs as a shell command (a leading "!" for aliases
# and credential helpers); the value is checked like any command
_GIT_COMMAND_KEYS = re.compile(
    r"(core\.(sshcommand|pager|editor|askpass|fsmonitor)|sequence\.editor|diff\.external"
    r"|pager\..*|credential(\..*)?\.helper|gpg(\..*)?\.program|(difftool|mergetool)\..*\.cmd"
    r"|diff\..*\.(textconv|command)|filter\..*\.(clean|smudge|process)|merge\..*\.driver"
    r"|uploadpack\.packobjectshook|remote\..*\.(receivepack|uploadpack))\Z"
)
_GIT_CONFIG_ENV = re.compile(
    r"GIT_CONFIG(_PARAMETERS|_COUNT|_KEY_\d+|_VALUE_\d+|_GLOBAL|_SYSTEM)?\Z"
)


def _invocations(words: Sequence[_Word], open_tail: bool, depth: int) -> Iterator[_Invocation]:
    """The programs a simple command runs, looking through wrappers, shells and aliases."""
    if depth > _MAX_DEPTH:
        raise _Unparseable("commands nested too deeply")
    words = list(words)
    # reserved words and NAME=value assignments before the command
    while words and (
        _is_assignment(words[0]) or (words[0].dynamic is None and words[0].text in _RESERVED)
    ):
        _assignment(words[0])
        words.pop(0)
    if words and words[0].dynamic is None and words[0].text == "function" and len(words) > 1:
        words = words[2:]
        while words and words[0].dynamic is None and words[0].text in _RESERVED:
            words.pop(0)
    if not words:
        return
    first = words[0]
    if first.dynamic is not None:
        raise _Unparseable(f"a command name decided at run time ({first.dynamic})")
    name = first.text.rsplit("/", 1)[-1]
    args = words[1:]
    if name in _REFUSED_BUILTINS:
        raise _Unparseable(_REFUSED_BUILTINS[name])
    if name in ("export", "declare", "typeset", "local", "readonly"):
        for w in args:
            _assignment(w)
    if name in (".", "source") and (
        not args or args[0].dynamic is not None or args[0].text in _STDIN_PATHS
    ):
        raise _Unparseable(f"{name} reading commands that may be its standard input")
    if name == "trap":
        yield from _trap(args, depth)
        return
    if name in _SHELLS:
        yield from _shell(name, args, depth)
        return
    if name == "find":
        yield from _find(args, depth)
        return
    if name == "watch":
        yield from _watch(args, depth)
        return
    if _PYTHON.match(name):
        yield from _python(args, open_tail, depth)
        return
    wrapper = _WRAPPERS.get(name)
    if wrapper is not None:
        yield from _wrapped(name, wrapper, args, open_tail, depth)
        return
    if name.startswith("git-") and len(name) > 4:
        # the dashed form git's exec-path holds: git-push is git push
        name, args = "git", [_Word(name[4:]), *args]
    if name == "git":
        yield from _git(args, open_tail, depth)
        return
    for runner in _RUNNERS:
        if runner[0] == name:
            for rest in _after_path(
                runner[1:], args, open_tail, _VALUE_OPTS.get(name, frozenset())
            ):
                yield from _runner_command(rest, open_tail, depth)
    if name == "yarn":
        # yarn workspace NAME CMD and yarn workspaces foreach [opts] CMD run yarn CMD
        yarn_opts = _VALUE_OPTS["yarn"]
        for rest in _after_path(("workspace",), args, open_tail, yarn_opts):
            if rest:
                yield _Invocation("yarn", tuple(rest[1:]), open_tail)
        for rest in _after_path(("workspaces", "foreach"), args, open_tail, yarn_opts):
            for p in _positions(rest, frozenset(("--include", "--exclude", "-j", "--jobs"))):
                yield _Invocation("yarn", tuple(rest[p:]), open_tail)
    yield _Invocation(name, tuple(args), open_tail)


def _is_assignment(word: _Word) -> bool:
    # an argv word NAME=x is a program name to execve, but reading it as an
    # assignment only ever looks at more words, never fewer
    return word.assignment or (word.dynamic is None and bool(_ASSIGNMENT.match(word.text)))


def _assignment(word: _Word) -> None:
    name = word.text.split("=", 1)[0].split("[", 1)[0].rstrip("+")
    if _GIT_CONFIG_ENV.match(name):
        raise _Unparseable(f"{name} in the environment, which gives git config (and aliases)")


def _positions(args: Sequence[_Word], value_opts: frozenset[str], start: int = 0) -> list[int]:
    """Where the first plain (non-option) word of ``args`` may be, from ``start``.

    An option known to take a value skips the next word; an unknown option without
    ``=`` may be a flag or take the next word, so both readings are kept: the answer
    holds every place the program itself could see its first plain word (``len(args)``
    when there may be none). A dynamic word is a plain word here: comparing it fails
    closed.
    """
    found: set[int] = set()
    todo = [start]
    seen: set[int] = set()
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        if i >= len(args):
            found.add(len(args))
            continue
        w = args[i]
        t = w.text
        if w.dynamic is not None:
            found.add(i)
        elif t == "--":
            found.add(min(i + 1, len(args)))
        elif len(t) > 1 and t[0] in "-+":
            if t.startswith("--") and "=" in t:
                todo.append(i + 1)
            elif t in value_opts:
                todo.append(i + 2)
            elif not t.startswith("--") and t[:2] in value_opts:
                todo.append(i + 1)  # -uroot: the value is attached
            else:
                todo.extend((i + 1, i + 2))
        else:
            found.add(i)
    return sorted(found)


def _word_matches(word: _Word, pattern: str) -> bool:
    if word.dynamic is not None:
        raise _Unparseable(f"a word decided at run time ({word.dynamic}) where {pattern!r} may be")
    if pattern.endswith("*"):
        return word.text.startswith(pattern[:-1])
    return word.text == pattern


def _after_path(
    path: Sequence[str], args: Sequence[_Word], open_tail: bool, value_opts: frozenset[str]
) -> Iterator[list[_Word]]:
    """For each reading in which ``args`` start with the subcommand ``path``, the words
    after it."""
    if not path:
        yield list(args)
        return
    for i in _positions(args, value_opts):
        if i >= len(args):
            if open_tail:
                raise _Unparseable(f"words appended at run time where {path[0]!r} may be")
            continue
        if _word_matches(args[i], path[0]):
            yield from _after_path(path[1:], args[i + 1 :], open_tail, value_opts)


def _matches(rule: CommandRule, inv: _Invocation) -> bool:
    for pattern in rule.match:
        if pattern[0] != inv.program:
            continue
        path = [w for w in pattern[1:] if not w.startswith("-")]
        options = [w for w in pattern[1:] if w.startswith("-")]
        value_opts = _VALUE_OPTS.get(inv.program, frozenset())
        for rest in _after_path(path, inv.args, inv.open_tail, value_opts):
            if not options:
                return True
            literal = [w.text for w in rest if w.dynamic is None]
            if any(t == o or t.startswith(o + "=") for t in literal for o in options):
                return True
            dynamic = [w.dynamic for w in rest if w.dynamic is not None]
            if dynamic:
                raise _Unparseable(
                    f"a word decided at run time ({dynamic[0]}) where an option may be"
                )
            if inv.open_tail:
                raise _Unparseable(f"words appended at run time where {options[0]!r} may be")
    return False


def _shell_string(word: _Word, depth: int) -> Iterator[_Invocation]:
    if word.dynamic is not None:
        raise _Unparseable(f"a shell command decided at run time ({word.dynamic})")
    for cmd in _Lexer(word.text, depth + 1).commands():
        yield from _invocations(cmd.words, cmd.open_tail, depth + 1)


def _shell(name: str, args: Sequence[_Word], depth: int) -> Iterator[_Invocation]:
    has_c = stdin = False
    i = 0
    while i < len(args):
        w = args[i]
        if w.dynamic is not None:
            raise _Unparseable(f"a shell option decided at run time ({w.dynamic})")
        t = w.text
        if t in ("-", "--"):
            i += 1
            stdin = stdin or t == "-"
            break
        if t in ("--rcfile", "--init-file"):
            i += 2
        elif t.startswith("--"):
            i += 1
        elif len(t) > 1 and t[0] in "-+":
            cluster = t[1:]
            if t[0] == "-":
                has_c = has_c or "c" in cluster
                stdin = stdin or "s" in cluster
            i += 1 + cluster.count("o") + cluster.count("O")  # -o NAME, -O NAME take a word
        else:
            break
    rest = args[i:]
    if has_c:
        if rest:
            yield from _shell_string(rest[0], depth)
        return
    if stdin or not rest:
        raise _Unparseable(f"{name} reading its commands from standard input")
    script = rest[0]
    if script.dynamic is not None or script.text in _STDIN_PATHS:
        raise _Unparseable(f"{name} running a script that may be its standard input")
    # a script file: what it runs is beyond this guard-rail (docs/server.md)


def _trap(args: Sequence[_Word], depth: int) -> Iterator[_Invocation]:
    rest = [w for w in args if w.text != "--" or w.dynamic is not None]
    if rest and rest[0].dynamic is None and rest[0].text.startswith("-"):
        return  # trap -l, trap -p: they only print
    if rest:
        yield from _shell_string(rest[0], depth)


def _find(args: Sequence[_Word], depth: int) -> Iterator[_Invocation]:
    i = 0
    while i < len(args):
        if args[i].dynamic is None and args[i].text in ("-exec", "-execdir", "-ok", "-okdir"):
            j = i + 1
            while j < len(args) and not (args[j].dynamic is None and args[j].text in (";", "+")):
                j += 1
            yield from _invocations(args[i + 1 : j], False, depth + 1)
            i = j
        i += 1


def _watch(args: Sequence[_Word], depth: int) -> Iterator[_Invocation]:
    value_opts = frozenset(("-n", "--interval", "-q", "--equexit"))
    for start in _positions(args, value_opts):
        rest = args[start:]
        if not rest:
            continue
        if any(w.dynamic is not None for w in rest):
            raise _Unparseable("a watched command decided at run time")
        # watch runs its arguments joined by spaces through sh -c
        yield from _shell_string(_Word(" ".join(w.text for w in rest)), depth)


def _python(args: Sequence[_Word], open_tail: bool, depth: int) -> Iterator[_Invocation]:
    i = 0
    while i < len(args):
        w = args[i]
        if w.dynamic is not None:
            raise _Unparseable(f"a python option decided at run time ({w.dynamic})")
        t = w.text
        if t == "--" or not t.startswith("-") or t == "-":
            if t == "--":
                i += 1
            break
        if t.startswith("--"):
            i += 1
            continue
        for k, c in enumerate(t[1:], start=1):
            if c in "mcWX":
                value = t[k + 1 :]
                taken = 1 if value else 2
                if not value:
                    if i + 1 >= len(args):
                        return
                    if args[i + 1].dynamic is not None and c == "m":
                        raise _Unparseable("a python module decided at run time")
                    value = args[i + 1].text
                if c == "m":
                    yield _Invocation(value, tuple(args[i + taken :]), open_tail)
                    return
                if c == "c":
                    return  # python code: beyond this guard-rail (docs/server.md)
                i += taken
                break
        else:
            i += 1
    rest = args[i:]
    if rest and rest[0].dynamic is None and rest[0].text.rsplit("/", 1)[-1] == "setup.py":
        yield _Invocation("setup.py", tuple(rest[1:]), open_tail)


def _wrapped(
    name: str, wrapper: _Wrapper, args: Sequence[_Word], open_tail: bool, depth: int
) -> Iterator[_Invocation]:
    # values of options that hold a shell string (flock -c, su -c), wherever they are
    short = "".join(o[1] for o in wrapper.shell_opts if len(o) == 2)
    for k, w in enumerate(args):
        t = w.text
        if w.dynamic is not None or not t.startswith("-"):
            continue
        if t.startswith("--"):
            if t in wrapper.shell_opts and k + 1 < len(args):
                yield from _shell_string(args[k + 1], depth)
            elif t.split("=", 1)[0] in wrapper.shell_opts:
                yield from _shell_string(_Word(t.split("=", 1)[1]), depth)
            continue
        # a cluster of short options: -lc 'cmd', or the string attached: -c'cmd'
        at = next((n for n, c in enumerate(t[1:], start=1) if c in short), None) if short else None
        if at is None:
            continue
        if at + 1 < len(t):
            yield from _shell_string(_Word(t[at + 1 :]), depth)
        elif k + 1 < len(args):
            yield from _shell_string(args[k + 1], depth)
    if name == "env":
        split = _env_split(args)
        if split is not None:
            text, after = split
            for cmd in _Lexer(text, depth + 1).commands():
                yield from _invocations([_Word("env"), *cmd.words, *after], open_tail, depth + 1)
            return
    for p in _positions(args, wrapper.value_opts | wrapper.shell_opts):
        start = p + wrapper.fixed
        rest = list(args[start:])
        if wrapper.assignments:
            while rest and _is_assignment(rest[0]):
                _assignment(rest[0])
                rest.pop(0)
        if rest:  # (xargs with no command runs echo)
            yield from _invocations(rest, open_tail or wrapper.open_tail, depth + 1)


def _env_split(args: Sequence[_Word]) -> tuple[str, list[_Word]] | None:
    """``env -S STRING``'s string and the words after it, if it has one."""
    i = 0
    while i < len(args):
        w = args[i]
        if w.dynamic is not None or not w.text.startswith("-") or w.text == "--":
            return None
        t = w.text
        if t in ("-S", "--split-string"):
            if i + 1 >= len(args):
                return None
            if args[i + 1].dynamic is not None:
                raise _Unparseable(
                    f"env -S with a string decided at run time ({args[i + 1].dynamic})"
                )
            return args[i + 1].text, list(args[i + 2 :])
        if t.startswith("--split-string="):
            return t.split("=", 1)[1], list(args[i + 1 :])
        if not t.startswith("--") and "S" in t:
            # -S in a cluster (-iS'cmd'): the rest of the cluster, else the next word
            rest = t[t.index("S") + 1 :]
            if rest:
                return rest, list(args[i + 1 :])
            if i + 1 >= len(args):
                return None
            if args[i + 1].dynamic is not None:
                raise _Unparseable(
                    f"env -S with a string decided at run time ({args[i + 1].dynamic})"
                )
            return args[i + 1].text, list(args[i + 2 :])
        i += 2 if t in ("-u", "--unset", "-C", "--chdir") else 1
    return None


def _runner_command(rest: Sequence[_Word], open_tail: bool, depth: int) -> Iterator[_Invocation]:
    for p in _positions(rest, _RUNNER_VALUE_OPTS):
        if p < len(rest):
            yield from _invocations(rest[p:], open_tail, depth + 1)


def _git(
    args: Sequence[_Word],
    open_tail: bool,
    depth: int,
    aliases: dict[str, _Word] | None = None,
) -> Iterator[_Invocation]:
    """git's global options, ``-c`` keys that name commands or aliases, then the
    subcommand: ``git -C d -c alias.x=push x`` is ``git push``."""
    # aliases given so far: an alias may name another one (git -c alias.x=y -c alias.y=push x)
    aliases = dict(aliases or {})
    i = 0
    while i < len(args):
        w = args[i]
        if w.dynamic is not None:
            break  # a dynamic word where the subcommand is: compared, it fails closed
        t = w.text
        if t == "--config-env" or t.startswith("--config-env="):
            # the value comes from the environment: refused where it could name a command
            if t == "--config-env":
                value = args[i + 1] if i + 1 < len(args) else _Word("")
                i += 2
            else:
                value = _Word(t.split("=", 1)[1])
                i += 1
            key = value.text.partition("=")[0].lower()
            if (
                value.dynamic is not None
                or key.startswith(("alias.", "include"))
                or (_GIT_COMMAND_KEYS.match(key))
            ):
                raise _Unparseable("git --config-env giving a command, alias or include")
            continue
        if t == "-c":
            if i + 1 >= len(args):
                return
            value = args[i + 1]
            i += 2
            if value.dynamic is not None:
                raise _Unparseable(f"a git -c setting decided at run time ({value.dynamic})")
            key, _, val = value.text.partition("=")
            key_l = key.lower()
            if key_l.startswith(("include.", "includeif.")):
                raise _Unparseable("git -c include.path, which reads config the policy cannot see")
            if key_l.startswith("alias."):
                aliases[key[6:].lower()] = _Word(val)
            elif _GIT_COMMAND_KEYS.match(key_l) and val:
                yield from _shell_string(_Word(val.removeprefix("!")), depth)
            continue
        if t in _GIT_VALUE_OPTS:
            i += 2
        elif t == "--":
            i += 1
            break
        elif t.startswith("-"):
            i += 1  # a flag, or --opt=value; git refuses options it does not know
        else:
            break
    rest = list(args[i:])
    if not rest:
        if open_tail:
            raise _Unparseable("git with its subcommand appended at run time")
        return
    sub = rest[0]
    if sub.dynamic is None and sub.text.lower() in aliases:
        # (an alias loop recurses to _MAX_DEPTH and is refused; git refuses it too)
        expansion = aliases[sub.text.lower()].text
        if expansion.startswith("!"):
            # a shell alias runs with the rest of the words appended
            for cmd in _Lexer(expansion[1:], depth + 1).commands():
                yield from _invocations([*cmd.words, *rest[1:]], True, depth + 1)
            return
        alias_words = _Lexer(expansion, depth + 1).commands()
        if len(alias_words) != 1:
            raise _Unparseable("a git alias the policy cannot read")
        yield from _git([*alias_words[0].words, *rest[1:]], open_tail, depth + 1, aliases)
        return
    if sub.dynamic is None:
        yield from _git_runs(sub.text, rest[1:], depth)
    yield _Invocation("git", tuple(rest), open_tail)


def _git_runs(sub: str, args: Sequence[_Word], depth: int) -> Iterator[_Invocation]:
    """Commands a git subcommand runs through the shell: ``submodule foreach``,
    ``rebase --exec``, ``bisect run``."""
    texts = [w.text if w.dynamic is None else None for w in args]
    if sub == "submodule" and "foreach" in texts:
        cmd = [w for w in args[texts.index("foreach") + 1 :] if w.text != "--recursive"]
        if cmd:
            if any(w.dynamic is not None for w in cmd):
                raise _Unparseable("git submodule foreach with a command decided at run time")
            yield from _shell_string(_Word(" ".join(w.text for w in cmd)), depth)
    elif sub == "rebase":
        for k, w in enumerate(args):
            if w.text in ("-x", "--exec") and k + 1 < len(args):
                yield from _shell_string(args[k + 1], depth)
            elif w.dynamic is None and w.text.startswith("--exec="):
                yield from _shell_string(_Word(w.text[7:]), depth)
    elif sub == "bisect" and texts[:1] == ["run"]:
        yield from _invocations(args[1:], False, depth + 1)
    elif sub == "config":
        # git config alias.p push: the alias is checked as if it ran (git p)
        for k, t in enumerate(texts):
            if t is not None and t.lower().startswith("alias.") and k + 1 < len(args):
                value = args[k + 1]
                if value.dynamic is not None:
                    raise _Unparseable(f"a git alias decided at run time ({value.dynamic})")
                if value.text.startswith("!"):
                    yield from _shell_string(_Word(value.text[1:]), depth)
                else:
                    for alias in _Lexer(value.text, depth + 1).commands():
                        yield from _git(alias.words, False, depth + 1)
                return
