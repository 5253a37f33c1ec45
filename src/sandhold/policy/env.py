"""Which environment variables a sandboxed process receives.

Rules (F-BE-3, issue "secret-free environment"):
- A variable passes when its name is on ``ALLOWED_NAMES``, starts with one of
  ``ALLOWED_PREFIXES``, or matches a settings ``env.passthrough`` pattern.
- Among those, a variable that looks like a credential (``credential_reason``)
  is dropped anyway, unless ``env.passthrough`` names it exactly: only an
  explicit name lets a secret in.
- ``credentials.envVars`` names are always withheld, even with ``inherit``.
- ``inherit`` (``--inherit-env``) passes everything else; the caller warns.
- The result lists every dropped name with its reason, for ``--debug``/``--explain``.
"""

from __future__ import annotations

import re

from sandhold._record import record

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

# Name shapes that hold secrets; checked on the upper-cased name.
_CREDENTIAL_NAME = re.compile(
    r"TOKEN|SECRET|PASSW(OR)?D|CREDENTIAL|PRIVATE|APIKEY|API_KEY|_KEY$|_KEYS$|^KEY$|_PAT$"
    r"|COOKIE|(^|_)AUTH($|_)|AUTHORIZATION|^AWS_|^AZURE_|^ARM_|^GCLOUD_|^CLOUDSDK_|^GOOGLE_|^GH_|^GITHUB_"
    r"|^GITLAB_|^GL_|^BITBUCKET_|^HF_|^HUGGING|^OPENAI_|^ANTHROPIC_|^CLAUDE_|^NPM_CONFIG__"
    r"|^SSH_AUTH_SOCK$|^SSH_AGENT|^GPG_AGENT|^VAULT_|^DOCKER_AUTH|^KUBECONFIG$|^PGPASS"
)
# A URL with a password in it: scheme://user:password@host
_URL_WITH_PASSWORD = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/@\s:]*:[^/@\s]+@")


def credential_reason(name: str, value: str) -> str | None:
    """Why ``name=value`` looks like a credential, or None if it does not."""
    if _CREDENTIAL_NAME.search(name.upper()):
        return "credential-looking name"
    if _URL_WITH_PASSWORD.search(value):
        return "value is a URL with a password"
    return None


def _pattern_matches(pattern: str, name: str) -> bool:
    if "*" not in pattern:
        return pattern == name
    rx = "".join(".*" if c == "*" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, name) is not None


@record
class EnvDecision:
    """The sandbox's environment and what was left out, with reasons."""

    passed: tuple[tuple[str, str], ...]
    dropped: tuple[tuple[str, str], ...]  # (name, reason)
    inherited_credentials: tuple[str, ...] = ()  # credential-looking names passed by inherit

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
        listed = explicit or any(_pattern_matches(p, name) for p in patterns)
        allowed = listed or name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)
        if not allowed:
            dropped.append((name, secret or "not on the allow-list"))
        elif secret and not explicit:
            dropped.append((name, secret))
        else:
            passed.append((name, value))
    return EnvDecision(tuple(passed), tuple(dropped), tuple(inherited))
