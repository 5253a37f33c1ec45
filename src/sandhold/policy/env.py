"""Which environment variables a sandboxed process receives.

Rules (F-BE-3, issue "secret-free environment"):
- A variable passes when its name is on ``ALLOWED_NAMES``, starts with one of
  ``ALLOWED_PREFIXES``, or matches a settings ``env.passthrough`` pattern.
- Among those, a variable that looks like a credential (``credential_reason``)
  is dropped anyway, unless ``env.passthrough`` names it exactly: only an
  explicit name lets a secret in.
- ``credentials.envVars`` names are always withheld, even with ``inherit``.
- ``inherit`` (``--inherit-env``) passes everything else; the caller warns.
- A ``*`` pattern in ``env.passthrough`` is a pattern (``GITHUB_*`` passes
  ``GITHUB_REPOSITORY``), but never for a credential-looking name: the dropped
  reason then names the pattern and says to name the variable exactly.
- The result lists every dropped name with its reason, for ``--debug``/``--explain``;
  ``kept_out_line`` is the one line the CLI prints by default (issue 15).
"""

from __future__ import annotations

from sandhold._record import record
from sandhold.policy.paths import star_match

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

ALLOWED_NAMES: frozenset[str] = frozenset(
    [
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "HOSTNAME",
        "TZ",
        "LANG",
        "LANGUAGE",
        "TERM",
        "COLORTERM",
        "TERM_PROGRAM",
        "TERM_PROGRAM_VERSION",
        "COLUMNS",
        "LINES",
        "NO_COLOR",
        "FORCE_COLOR",
        "CLICOLOR",
        "CLICOLOR_FORCE",
        "EDITOR",
        "VISUAL",
        "PAGER",
        "LESS",
        "MANPATH",
        "INFOPATH",
        "DISPLAY",
        "WAYLAND_DISPLAY",
        "CI",
        "DEBIAN_FRONTEND",
        "TMPDIR",
        "TMP",
        "TEMP",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "CONDA_DEFAULT_ENV",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONUNBUFFERED",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "PYTHONWARNINGS",
        "UV_CACHE_DIR",
        "PIP_CACHE_DIR",
        "JAVA_HOME",
        "GOPATH",
        "GOROOT",
        "GOFLAGS",
        "GOCACHE",
        "GOMODCACHE",
        "GOTOOLCHAIN",
        "CARGO_HOME",
        "RUSTUP_HOME",
        "RUSTUP_TOOLCHAIN",
        "RUSTFLAGS",
        "NVM_DIR",
        "NODE_PATH",
        "NODE_ENV",
        "PNPM_HOME",
        "BUN_INSTALL",
        "DENO_DIR",
        "GEM_HOME",
        "GEM_PATH",
        "RBENV_ROOT",
        "PYENV_ROOT",
        "SDKMAN_DIR",
        "PKG_CONFIG_PATH",
        "LD_LIBRARY_PATH",
        "CC",
        "CXX",
        "CFLAGS",
        "CXXFLAGS",
        "CPPFLAGS",
        "LDFLAGS",
        "MAKEFLAGS",
        "CMAKE_PREFIX_PATH",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "GIT_AUTHOR_NAME",
        "GIT_AUTHOR_EMAIL",
        "GIT_COMMITTER_NAME",
        "GIT_COMMITTER_EMAIL",
        "GIT_EDITOR",
        "GIT_PAGER",
    ]
)

ALLOWED_PREFIXES: tuple[str, ...] = ("LC_", "XDG_")

# Name shapes that hold secrets, checked on the upper-cased name. Plain string
# tests rather than one big regex: compiling that costs ~2 ms on every start.
SECRET_PARTS: tuple[str, ...] = (
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "PRIVATE",
    "APIKEY",
    "API_KEY",
    "COOKIE",
    "AUTHORIZATION",
)
SECRET_PREFIXES: tuple[str, ...] = (
    "AWS_",
    "AZURE_",
    "ARM_",
    "GCLOUD_",
    "CLOUDSDK_",
    "GOOGLE_",
    "GH_",
    "GITHUB_",
    "GITLAB_",
    "GL_",
    "BITBUCKET_",
    "HF_",
    "HUGGING",
    "OPENAI_",
    "ANTHROPIC_",
    "CLAUDE_",
    "NPM_CONFIG__",
    "SSH_AGENT",
    "GPG_AGENT",
    "VAULT_",
    "DOCKER_AUTH",
    "PGPASS",
)
SECRET_SUFFIXES: tuple[str, ...] = ("_KEY", "_KEYS", "_PAT")
SECRET_NAMES: frozenset[str] = frozenset({"KEY", "SSH_AUTH_SOCK", "KUBECONFIG"})


def _url_has_password(value: str) -> bool:
    """``scheme://user:password@host...``"""
    scheme, sep, rest = value.partition("://")
    if (
        not sep
        or not scheme
        or not (
            scheme[0].isalpha()
            and scheme.replace("+", "").replace("-", "").replace(".", "").isalnum()
        )
    ):
        return False
    userinfo, at, _host = rest.split("/", 1)[0].rpartition("@")
    return bool(at) and ":" in userinfo and not userinfo.endswith(":")


def credential_reason(name: str, value: str) -> str | None:
    """Why ``name=value`` looks like a credential, or None if it does not."""
    upper = name.upper()
    if (
        upper in SECRET_NAMES
        or upper.startswith(SECRET_PREFIXES)
        or upper.endswith(SECRET_SUFFIXES)
        or any(part in upper for part in SECRET_PARTS)
        or "AUTH" in upper.split("_")
    ):
        return "credential-looking name"
    if "://" in value and _url_has_password(value):
        return "value is a URL with a password"
    return None


@record
class EnvDecision:
    """The sandbox's environment and what was left out, with reasons."""

    passed: tuple[tuple[str, str], ...]
    dropped: tuple[tuple[str, str], ...]  # (name, reason)
    inherited_credentials: tuple[str, ...] = ()  # credential-looking names passed by inherit
    # credential-looking names an env.passthrough pattern (not their exact name) matched
    pattern_secrets: tuple[str, ...] = ()

    def as_mapping(self) -> dict[str, str]:
        return dict(self.passed)


def filter_environment(
    environ: Mapping[str, str],
    *,
    passthrough: Iterable[str] = (),
    withheld: Iterable[str] = (),
    inherit: bool = False,
) -> EnvDecision:
    """Decide the sandbox environment from the caller's (see module rules)."""
    patterns = tuple(passthrough)
    withheld_set = frozenset(withheld)
    passed: list[tuple[str, str]] = []
    dropped: list[tuple[str, str]] = []
    inherited: list[str] = []
    by_pattern: list[str] = []
    for name in sorted(environ):
        value = environ[name]
        if name in withheld_set:
            dropped.append((name, "credentials.envVars withholds it"))
            continue
        secret = credential_reason(name, value)
        if inherit:
            passed.append((name, value))
            if secret:
                inherited.append(name)
            continue
        explicit = name in patterns
        pattern = None if explicit else next((p for p in patterns if star_match(p, name)), None)
        listed = explicit or pattern is not None
        allowed = listed or name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)
        if not allowed:
            dropped.append((name, secret or "not on the allow-list"))
        elif secret and pattern is not None:
            by_pattern.append(name)
            dropped.append(
                (name, f"{secret}; env.passthrough {pattern!r} passes no credential: name it")
            )
        elif secret and not explicit:
            dropped.append((name, secret))
        else:
            passed.append((name, value))
    return EnvDecision(tuple(passed), tuple(dropped), tuple(inherited), tuple(by_pattern))


# kept out, but not worth a line: what the calling shell sets for every command ($_)
_UNREPORTED = frozenset({"_"})


def kept_out_line(decision: EnvDecision, limit: int = 8) -> str | None:
    """The one line naming the variables kept out of the sandbox and how to pass one
    (printed by default once per run; ``-q`` silences it), or None."""
    names = [name for name, _ in decision.dropped if name not in _UNREPORTED]
    if not names:
        return None
    shown = ", ".join(names[:limit]) + (
        f" and {len(names) - limit} more" if len(names) > limit else ""
    )
    by_pattern = decision.pattern_secrets
    hint = f'"env": {{"passthrough": ["{by_pattern[0] if by_pattern else names[0]}"]}}'
    pattern = " (a credential needs its exact name, a pattern passes none)" if by_pattern else ""
    return (
        f"environment: kept out {shown}; to pass one, name it exactly: {hint}{pattern} "
        "(-d says why for each)"
    )


# Where the session's proxies listen inside every sandbox's own network namespace
# (``backends/linux/netns.py`` binds them; the plans and the variables name them).
HTTP_PROXY_PORT = 3128
SOCKS_PROXY_PORT = 1080


def proxy_environment(http_port: int, socks_port: int) -> dict[str, str]:
    """The variables that point tools at the session's proxies (and nowhere else).

    Only proxy variables: the standard names and the ones npm, yarn, cargo and
    pip read instead. Programs that ignore them (Node's ``fetch`` before Node 24,
    the JVM, ssh, Go, gRPC...) need no workaround here (no ``NODE_USE_ENV_PROXY``,
    no ``JAVA_TOOL_OPTIONS`` properties, no ``GIT_SSH_COMMAND`` through SOCKS5):
    every sandbox that has these proxies (the native backend with a network, CLI
    or port) also has transparent egress (issue 20, ``policy.transparent``), which
    decides their TCP connections by the same policy. A user's own
    ``JAVA_TOOL_OPTIONS`` or ``GIT_SSH_COMMAND``, passed through, is theirs again.
    """
    http = f"http://127.0.0.1:{http_port}"
    socks = f"socks5h://127.0.0.1:{socks_port}"
    no_proxy = "localhost,127.0.0.1,::1"
    env = {}
    for name, value in (
        ("HTTP_PROXY", http),
        ("HTTPS_PROXY", http),
        ("ALL_PROXY", socks),
        ("NO_PROXY", no_proxy),
    ):
        env[name] = env[name.lower()] = value
    env.update(
        {
            # npm, yarn, cargo and pip read their own names for the same thing
            "npm_config_proxy": http,
            "npm_config_https_proxy": http,
            "npm_config_noproxy": no_proxy,
            "YARN_HTTP_PROXY": http,
            "YARN_HTTPS_PROXY": http,
            "CARGO_HTTP_PROXY": http,
            "PIP_PROXY": http,
        }
    )
    return env
