"""Table tests of the small pure pieces: path spelling and globs, the environment
filter, mandatory names, the bubblewrap command line and the CLI grammar."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandhold._record import record, replace
from sandhold.backends.linux.bwrap import BwrapFds, bwrap_argv
from sandhold.cli import SHELL, parse_args
from sandhold.errors import UsageError
from sandhold.policy import mandatory, paths
from sandhold.policy.env import credential_reason, filter_environment
from sandhold.policy.fsplan import FsPlan, Mount


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("~", "/home/u"),
        ("~/.ssh", "/home/u/.ssh"),
        ("~/.ssh/", "/home/u/.ssh"),
        (".", "/w"),
        ("./a/../b", "/w/b"),
        ("src", "/w/src"),
        ("/abs//x/", "/abs/x"),
        ("//double", "/double"),
        ("**/.env", "/w/**/.env"),
    ],
)
def test_absolute(entry: str, expected: str) -> None:  # F-SET-1
    assert paths.absolute(entry, "/w", "/home/u") == expected


@pytest.mark.parametrize(
    ("pattern", "path", "match"),
    [
        ("/w/**/.env", "/w/.env", True),
        ("/w/**/.env", "/w/a/b/.env", True),
        ("/w/**/.env", "/w/a/.envrc", False),
        ("/w/*.pem", "/w/.hidden.pem", True),  # deny globs must not skip dotfiles
        ("/w/*.pem", "/w/a/x.pem", False),
        ("/w/?.key", "/w/a.key", True),
        ("/w/?.key", "/w/ab.key", False),
        ("/w/[!a]*", "/w/b", True),
        ("/w/[!a]*", "/w/a", False),
        # a class is one character of a name: never '/', negated or through a range
        ("/w/a[!_]b", "/w/a/b", False),
        ("/w/a[!_]b", "/w/a.b", True),
        ("/w/a[^_]b", "/w/a/b", False),
        ("/w/a[+-9]b", "/w/a/b", False),
        ("/w/a[+-9]b", "/w/a.b", True),
        ("/w/a[--0]b", "/w/a/b", False),
        ("/w/**/a[!x]b", "/w/c/a/b", False),
        ("/w/[!x]*", "/w/a/b", False),
        # the body is characters, never regex syntax
        ("/w/a[]x]b", "/w/a]b", True),
        ("/w/a[!]x]b", "/w/a]b", False),
        ("/w/a[[x]b", "/w/a[b", True),
        ("/w/a[&&x]b", "/w/a&b", True),
        ("/w/a[x-]b", "/w/a-b", True),
        ("/w/a[\\]b", "/w/a\\b", True),
        ("/w/a/**", "/w/a", True),
        ("/w/a/**", "/w/a/b/c", True),
        ("/w/a/**", "/w/ab", False),
        (".env.*", ".env.local", True),
        ("id_*", "id_ed25519", True),
    ],
)
def test_glob_match(pattern: str, path: str, match: bool) -> None:
    assert paths.glob_match(pattern, path) is match


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("", "empty"),
        ("a\0b", "NUL"),
        ("~bob/x", "~user"),
        ("a**", "whole path segment"),
        ("x/[", "unclosed"),
        ("x/[]", "unclosed"),
        ("x/[z-a]", "reversed"),
    ],
)
def test_validate_pattern_rejects(entry: str, problem: str) -> None:  # F-SET-3
    with pytest.raises(ValueError, match=problem):
        paths.validate_pattern(entry)


def test_static_prefix() -> None:
    assert paths.static_prefix("/w/a/**/b*.c") == "/w/a"
    assert paths.static_prefix("/*.pem") == "/"


@pytest.mark.parametrize(
    ("name", "value", "secret"),
    [
        ("AWS_SECRET_ACCESS_KEY", "x", True),
        ("AWS_REGION", "eu-west-1", True),  # the whole AWS_ family is withheld
        ("GITHUB_TOKEN", "x", True),
        ("GH_TOKEN", "x", True),
        ("OPENAI_API_KEY", "x", True),
        ("ANTHROPIC_API_KEY", "x", True),
        ("NPM_CONFIG__AUTHTOKEN", "x", True),
        ("DB_PASSWORD", "x", True),
        ("STRIPE_KEY", "x", True),
        ("SSH_AUTH_SOCK", "/run/ssh", True),
        ("DATABASE_URL", "postgres://me:hunter2@db/app", True),
        ("DATABASE_URL", "postgres://db/app", False),
        ("GIT_AUTHOR_NAME", "A", False),
        ("PATH", "/usr/bin", False),
        ("KEYBOARD", "us", False),
    ],
)
def test_credential_shapes(name: str, value: str, secret: bool) -> None:
    assert (credential_reason(name, value) is not None) is secret


def test_environment_filter() -> None:
    env = {
        "PATH": "/usr/bin",
        "HOME": "/h",
        "LC_ALL": "C",
        "XDG_CONFIG_HOME": "/h/.config",
        "AWS_SECRET_ACCESS_KEY": "s",
        "MY_VAR": "1",
        "NODE_FOO": "2",
        "NODE_AUTH_TOKEN": "t",
        "RANDOM_THING": "r",
        "WITHHELD": "w",
    }
    d = filter_environment(env, passthrough=("MY_VAR", "NODE_*"), withheld=("WITHHELD",))
    assert dict(d.passed) == {
        "PATH": "/usr/bin",
        "HOME": "/h",
        "LC_ALL": "C",
        "XDG_CONFIG_HOME": "/h/.config",
        "MY_VAR": "1",
        "NODE_FOO": "2",
    }
    dropped = dict(d.dropped)
    assert dropped["AWS_SECRET_ACCESS_KEY"] == "credential-looking name"
    assert dropped["NODE_AUTH_TOKEN"] == (  # a glob never lets a secret in, and says so
        "credential-looking name; env.passthrough 'NODE_*' passes no credential: name it"
    )
    assert dropped["RANDOM_THING"] == "not on the allow-list"
    assert "withholds" in dropped["WITHHELD"]
    exact = filter_environment(env, passthrough=("NODE_AUTH_TOKEN",))
    assert "NODE_AUTH_TOKEN" in dict(exact.passed)  # an exact name does
    inherited = filter_environment(env, withheld=("WITHHELD",), inherit=True)
    assert "AWS_SECRET_ACCESS_KEY" in dict(inherited.passed)
    assert "WITHHELD" not in dict(inherited.passed)
    assert set(inherited.inherited_credentials) == {"AWS_SECRET_ACCESS_KEY", "NODE_AUTH_TOKEN"}


@pytest.mark.parametrize(
    ("name", "protected"),
    [
        (".bashrc", True),
        (".zshenv", True),
        (".mcp.json", True),
        (".hgrc", True),
        (".jjconfig.toml", True),
        ("config.toml", False),
        (".claude", True),
        (".sandhold-settings.json", True),
        ("opencode.json", True),
        (".crush.json", True),
        (".aider.conf.yml", True),
        (".opencode", True),
        (".zed", True),
        ("opencode", False),
        ("bashrc", False),
        ("README.md", False),
    ],
)
def test_mandatory_names(name: str, protected: bool) -> None:  # F-SET-5
    assert (mandatory.mandatory_reason(name) is not None) is protected


def test_jj_config_paths_are_the_protected_names() -> None:  # F-SET-5
    """The mount plan pins where jj looks; the creation rules refuse the same names."""
    names = {p.rsplit("/", 1)[-1] for p in mandatory.JJ_CONFIG_PATHS}
    assert names == set(mandatory.JJ_PROTECTED)


def test_credential_globs_match_spec() -> None:  # F-SET-5
    assert mandatory.CREDENTIAL_GLOBS == (".env", ".env.*", "*.pem", "*.key", "id_*")


def test_bwrap_argv_golden() -> None:
    plan = FsPlan(
        mounts=(
            Mount("hide-dir", "/p", "r", "0111"),
            Mount("bind", "/w", "r"),
            Mount("ro-bind", "/w/.git/config", "r"),
            Mount("hide-file", "/h/.env", "r"),
            Mount("hide-dir", "/h/.ssh", "r", "0000"),
            Mount("remount-ro", "/p", "r"),
        ),
        writable_roots=("/w",),
        unpinned=(),
        notes=(),
    )
    argv = bwrap_argv(
        "/usr/bin/bwrap", plan, BwrapFds(5, 6, "/p/s/hidden", "/p/s/hidden-dir"), "/w", ["ls", "-l"]
    )
    assert argv == [
        "/usr/bin/bwrap",
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--json-status-fd",
        "6",
        "--seccomp",
        "5",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--remount-ro",
        "/proc",
        "--perms",
        "0111",
        "--tmpfs",
        "/p",
        "--bind",
        "/w",
        "/w",
        "--ro-bind",
        "/w/.git/config",
        "/w/.git/config",
        "--ro-bind",
        "/p/s/hidden",
        "/h/.env",
        "--ro-bind",
        "/p/s/hidden-dir",
        "/h/.ssh",
        "--remount-ro",
        "/p",
        "--chdir",
        "/w",
        "--",
        "ls",
        "-l",
    ]


@pytest.mark.parametrize(
    ("args", "command"),
    [
        (["--", "ls", "-la"], ("ls", "-la")),
        (["echo hi"], (SHELL, "-c", "echo hi")),  # one quoted string is a shell line
        (["-c", "echo $0", "zero"], (SHELL, "-c", "echo $0", "zero")),
        (["ls", "-la"], ("ls", "-la")),
        (["--", "echo hi"], ("echo hi",)),  # after -- it is argv, even alone
        (["-s", "f.json", "-d", "--", "x"], ("x",)),
        (["--settings=f.json", "x", "y"], ("x", "y")),
    ],
)
def test_parse_args_commands(args: list[str], command: tuple[str, ...]) -> None:
    assert parse_args(args).command == command


def test_parse_args_options() -> None:
    o = parse_args(
        ["-s", "f.json", "-d", "--explain", "--backend", "none", "--inherit-env", "--", "x"]
    )
    assert (o.settings, o.debug, o.explain, o.backend, o.inherit_env) == (
        "f.json",
        True,
        True,
        "none",
        True,
    )
    assert parse_args(["probe", "--json"]).probe_json
    assert parse_args(["--", "probe"]).command == ("probe",)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--bogus", "x"],
        ["-s"],
        ["-c"],
        ["--backend"],
        ["probe", "--yaml"],
        # str.isdigit takes these: int() reads the first as 3, fails on the next two
        ["--control-fd", "\u0663", "--", "true"],
        ["--control-fd", "\u00b2", "--", "true"],
        ["--control-fd", "9" * 20, "--", "true"],
    ],
)
def test_parse_args_errors(args: list[str]) -> None:
    with pytest.raises(UsageError):
        parse_args(args)


@record
class _Point:
    x: int
    y: int = 0


def test_record_behaves_like_a_frozen_dataclass() -> None:
    p = _Point(1)
    assert p == _Point(1, 0) and hash(p) == hash(_Point(1, 0)) and p != _Point(2)
    assert repr(p) == "_Point(x=1, y=0)"
    assert replace(p, y=5) == _Point(1, 5)
    with pytest.raises(AttributeError):
        p.x = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        replace(p, z=1)


@pytest.mark.parametrize(
    ("pattern", "text", "match"),
    [
        ("*.pem", "a.pem", True),
        ("*.pem", ".pem", True),
        ("*.pem", "a.pem.bak", False),
        (".env.*", ".env.local", True),
        (".env.*", ".env", False),
        ("id_*", "id_", True),
        ("a*b*c", "abc", True),
        ("a*b*c", "aXbYc", True),
        ("a*b*c", "acb", False),
        ("ab*ba", "aba", False),  # the two ends must not overlap
        ("NODE_*", "NODE_FOO", True),
        ("exact", "exact", True),
        ("exact", "exactly", False),
    ],
)
def test_star_match(pattern: str, text: str, match: bool) -> None:
    assert paths.star_match(pattern, text) is match
    assert paths.glob_match(pattern, text) is match  # agrees with the full glob grammar


@settings(max_examples=2000)
@given(
    st.lists(st.text(alphabet="ab.*", min_size=0, max_size=4), min_size=0, max_size=4),
    st.text(alphabet="ab.", max_size=5),
)
def test_star_names_answers_as_star_match(patterns: list[str], name: str) -> None:
    """The sieve in front of ``StarNames`` never turns away a name a pattern matches."""
    expected = any(paths.star_match(p, name) for p in patterns)
    assert paths.StarNames(patterns)(name) is expected


def test_star_names_for_the_credential_globs() -> None:
    cred = paths.StarNames(mandatory.CREDENTIAL_GLOBS)
    hits = (".env", ".env.local", "a.pem", ".pem", "x.key", "id_rsa", "id_")
    misses = ("env", ".envrc", "a.pem.bak", "key", "xid_rsa", "index.js", "")
    assert all(cred(n) for n in hits) and not any(cred(n) for n in misses)


_SEGMENT = st.one_of(
    st.just("**"), st.text(alphabet="ab*.", min_size=1, max_size=4).filter(lambda s: "**" not in s)
)


_CLASS = st.builds(
    lambda neg, body: "[" + neg + body + "]",
    st.sampled_from(["", "!", "^"]),
    st.text(alphabet="a_+-9.^&[\\", min_size=1, max_size=4).filter(lambda b: "]" not in b),
)


@settings(max_examples=2000)
@given(
    st.lists(st.one_of(_CLASS, st.sampled_from(["a", "?", "*", ".", "-"])), min_size=1, max_size=4)
    .map("".join)
    .filter(lambda p: "**" not in p),
    st.text(alphabet="a_+-9./[&\\b", max_size=6),
)
def test_one_segment_never_matches_a_slash(pattern: str, text: str) -> None:
    """No class, wildcard or range of one segment lets a glob reach into a subdirectory."""
    try:
        matcher = paths.glob_matcher(pattern)
    except ValueError:
        return  # a reversed range: refused, not matched
    if "/" in text:
        assert not matcher.fullmatch(text), (pattern, text)


@settings(max_examples=2000)
@given(
    st.lists(_SEGMENT, min_size=1, max_size=4).map("/".join),
    st.lists(st.text(alphabet="ab.", min_size=1, max_size=3), max_size=5).map("/".join),
)
def test_star_globs_match_like_their_regex(pattern: str, path: str) -> None:
    """The regex-free matcher of '*'/'**' globs answers exactly as the regex does."""
    import re

    expected = re.fullmatch(paths.glob_regex(pattern), path, re.DOTALL) is not None
    assert bool(paths.glob_matcher(pattern).fullmatch(path)) == expected


@pytest.mark.parametrize(
    ("pattern", "rel_dir", "expected"),
    [
        ("**/.env", "", True),
        ("**/.env", "a/b", True),
        ("*.pem", "", True),
        ("*.pem", "a", False),  # '*' stays in one segment: nothing below a can match
        ("a/*/x", "a", True),
        ("a/*/x", "a/b", True),
        ("a/*/x", "a/b/c", False),
        ("a/*/x", "b", False),
        ("[ab]/x", "b", True),
        ("[ab]/x", "c", False),
        ("a/**", "a/b/c", True),
        ("a/**", "b", False),
        (".cache/**/.env", ".cache/x", True),
        (".cache/**/.env", ".local", False),
    ],
)
def test_may_match_below(pattern: str, rel_dir: str, expected: bool) -> None:
    assert paths.may_match_below(pattern, rel_dir) is expected


@settings(max_examples=2000)
@given(
    st.lists(_SEGMENT, min_size=1, max_size=4).map("/".join),
    st.lists(st.text(alphabet="ab.", min_size=1, max_size=3), min_size=1, max_size=5),
    st.integers(min_value=0, max_value=4),
)
def test_may_match_below_never_misses_a_match(pattern: str, parts: list[str], cut: int) -> None:
    """A walk prunes and ignores unlistable directories by it: a 'no' must be right."""
    rel_dir = "/".join(parts[: min(cut, len(parts) - 1)])
    if paths.glob_match(pattern, "/".join(parts)):
        assert paths.may_match_below(pattern, rel_dir)
