"""Names that are never writable inside a writable root, whatever the settings say.

Rules (F-SET-5): in every writable root, at any depth, these names are
write-denied: shell start-up files and other files the host executes or trusts
(``MANDATORY_FILES``), agent and editor config directories
(``MANDATORY_DIRS``), and inside every ``.git`` directory its ``hooks`` and
``config`` (``GIT_PROTECTED``). Credential globs (``CREDENTIAL_GLOBS``) are
write-denied by default. Each table is tested row by row in
tests/test_policy_mandatory.py.
"""

from __future__ import annotations

# Files whose content a host shell, git or agent will run or trust later.
MANDATORY_FILES: tuple[str, ...] = (
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zprofile",
    ".zshenv",
    ".zlogin",
    ".zlogout",
    ".kshrc",
    ".cshrc",
    ".tcshrc",
    ".gitconfig",
    ".gitmodules",
    ".mcp.json",
    ".ripgreprc",
    ".sandhold-settings.json",
    ".srt-settings.json",
)

# Directories holding agent, sandbox or editor configuration (tasks, hooks, MCP servers).
MANDATORY_DIRS: tuple[str, ...] = (".claude", ".sandhold", ".vscode", ".idea")

# Inside each ``.git`` directory: (name, is_directory).
GIT_PROTECTED: tuple[tuple[str, bool], ...] = (("hooks", True), ("config", False))

# Credential files: write-denied by default (F-SET-5), matched against the name.
CREDENTIAL_GLOBS: tuple[str, ...] = (".env", ".env.*", "*.pem", "*.key", "id_*")

# Secret locations a terminal or spec-launched sandbox never reads (SPEC §7, F-BE-4).
SECRET_READ_DENY: tuple[str, ...] = (
    "~/.ssh",
    "~/.aws",
    "~/.gnupg",
    "~/.config/gh",
    "~/.config/gcloud",
    "~/.azure",
    "~/.kube",
    "~/.docker/config.json",
    "~/.netrc",
    "~/.git-credentials",
    "~/.npmrc",
    "~/.pypirc",
)


def mandatory_reason(name: str) -> str | None:
    """Why a directory entry called ``name`` is always write-denied, or None."""
    if name in MANDATORY_FILES:
        return "mandatory: file run or trusted by the host"
    if name in MANDATORY_DIRS:
        return "mandatory: agent/editor configuration"
    return None
