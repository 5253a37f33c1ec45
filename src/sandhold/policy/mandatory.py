"""Names that are never writable inside a writable root, whatever the settings say.

Rules (F-SET-5): in every writable root, at any depth, these names are
write-denied: shell start-up files and other files the host executes or trusts
(``MANDATORY_FILES``), agent and editor config directories
(``MANDATORY_DIRS``), inside every ``.git`` directory its ``hooks`` and
``config`` (``GIT_PROTECTED``), inside every ``.hg`` directory what Mercurial
reads as config or follows to another repository's (``HG_PROTECTED``), and inside
every ``.jj`` directory what Jujutsu reads as config or follows to it
(``JJ_PROTECTED``, ``JJ_POINTERS``). Credential globs (``CREDENTIAL_GLOBS``) are
write-denied by default.

Names that do not exist yet are pinned where the host will look for them: the
project names (``PROJECT_FILES``, ``AGENT_DIRS``, ``.git``) at the top of
every writable root, and the home-directory files (``HOME_FILES``) in the
home directory when it is writable, and so are the per-user config files and
directories of git, hg and jj (``user_config_paths``). Tested in
tests/test_policy_tables.py and tests/test_user_config.py.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

# Files whose content a host shell, git or agent will run or trust later. The
# first group is read from the home directory; the rest from a project as well.
HOME_FILES: tuple[str, ...] = (
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
    ".hgrc",  # hg's user config: its [hooks] and [extensions] run in every repository
    ".jjconfig.toml",  # jj's user config (its ui.pager, aliases, fix.tools run commands)
    ".ripgreprc",
    ".sandhold-settings.json",
    ".srt-settings.json",
    # sourced or run at login or by what a login starts: Debian's stock .bashrc
    # sources .bash_aliases; X sessions run these; pam_env sets the variables of every
    # login (LD_PRELOAD); vim, tmux and emacs run commands from their start-up files;
    # Claude Code's user file names MCP servers for every project
    ".bash_aliases",
    ".xprofile",
    ".xsessionrc",
    ".xinitrc",
    ".xsession",
    ".pam_environment",
    ".vimrc",
    ".gvimrc",
    ".tmux.conf",
    ".emacs",
    ".emacs.el",
    ".exrc",  # vim's, read when there is no .vimrc
    ".lesskey",  # its #env section sets LESSOPEN, a command less runs (git's pager)
    ".claude.json",
)
# Project files other agents and tools read as config that names commands:
# opencode's (MCP servers, plugins), Crush's (MCP servers, LSP commands), aider's
# (its lint and test commands, run after each edit by default), a dev container's
# (its initializeCommand runs on the host when the folder is opened in one), and
# mise's ([hooks] run when a shell enters the directory; mise trusts a config by
# its path, not its content).
OTHER_AGENT_FILES: tuple[str, ...] = (
    "opencode.json",
    "opencode.jsonc",
    ".crush.json",
    "crush.json",
    ".aider.conf.yml",
    ".devcontainer.json",
    "mise.toml",
    ".mise.toml",
    "mise.local.toml",
    ".mise.local.toml",
    "rtx.toml",  # mise's former name, still read
    ".rtx.toml",
    "rtx.local.toml",
    ".rtx.local.toml",
)
PROJECT_FILES: tuple[str, ...] = (".gitmodules", ".mcp.json", *OTHER_AGENT_FILES)
MANDATORY_FILES: tuple[str, ...] = HOME_FILES + PROJECT_FILES

# Directories holding agent, sandbox or editor configuration (tasks, hooks, MCP servers).
# The agent ones are pinned even before they exist; editors ask before trusting a
# folder's settings, so theirs are protected when they exist. Other coding agents' and
# AI editors' project directories name MCP servers, hooks, plugins or tasks
# (commands) too: Cursor, Gemini CLI, Codex, Windsurf, Kiro, Continue, Amazon Q,
# opencode (plugins it loads from .opencode/plugins), Roo Code, Kilo Code, Zed
# (tasks, context servers), Qwen Code, Trae, Junie, Crush, Factory (hooks); and
# dev containers' and mise's directories (see OTHER_AGENT_FILES).
AGENT_DIRS: tuple[str, ...] = (".claude", ".sandhold")
OTHER_AGENT_DIRS: tuple[str, ...] = (
    ".cursor",
    ".gemini",
    ".codex",
    ".windsurf",
    ".kiro",
    ".continue",
    ".amazonq",
    ".opencode",
    ".roo",
    ".kilocode",
    ".zed",
    ".qwen",
    ".trae",
    ".junie",
    ".crush",
    ".factory",
    ".devcontainer",
    ".mise",
)
MANDATORY_DIRS: tuple[str, ...] = (*AGENT_DIRS, ".vscode", ".idea", *OTHER_AGENT_DIRS)

# Inside each ``.git`` directory: (name, is_directory).
GIT_PROTECTED: tuple[tuple[str, bool], ...] = (("hooks", True), ("config", False))
# Files in a git dir that point git at another config besides those: a worktree's or
# submodule's ``commondir`` (the repository whose config and hooks it uses), and
# ``config.worktree`` (read once ``extensions.worktreeConfig`` is on). Read-only where
# they exist (``fsplan``) and refused when made (``creation``).
GIT_POINTERS: tuple[str, ...] = ("commondir", "config.worktree")
# git's lock files for those configs: git writes ``config.lock`` and renames it over
# ``config``. Refused when made (``creation``), so that git fails at the lock and says
# so: a rename refused after it, git 2.39 reports as success for some commands
# (``git branch --set-upstream-to``: config.c's CONFIG_NO_WRITE is positive, branch.c
# tests ``< 0``), having written nothing. ``git.allowConfig`` allows the one of a
# repository whose config the run writes as its private copy.
GIT_CONFIG_LOCKS: tuple[str, ...] = ("config.lock", "config.worktree.lock")

# Inside each ``.hg`` directory, at any depth (an mq patch queue is a repository in
# .hg/patches): the files Mercurial reads as the repository's config, whose
# ``[hooks]``, ``[extensions]``, aliases and merge tools run commands at the next
# ``hg status`` (a shell prompt runs one), and the pointer a share follows to
# another repository's ``.hg`` and reads its ``hgrc`` there (share-safe). The rest
# runs nothing: ``requires`` only names features (hg refuses one it does not know;
# those that load an extension load one shipped with hg, and the share ones act only
# through ``sharedpath``), and ``store``, ``cache``, ``wcache``, ``dirstate`` and
# the journal files hold data. Mercurial has no hooks directory.
HG_PROTECTED: tuple[str, ...] = ("hgrc", "hgrc-not-shared", "sharedpath")

# Inside each ``.jj`` directory (a Jujutsu workspace), at any depth: the files jj reads
# as the repository's and the workspace's config, whose ui.pager, ui.editor,
# ui.diff-editor, merge-tools.*.program, fix.tools.*.command, signing.program and
# aliases (``util exec``) run commands at the next ``jj log`` or ``jj fix``, and the
# ids that pick that config out of the user's config directory. jj before 0.38 reads
# ``.jj/repo/config.toml`` and ``.jj/workspace-config.toml``; 0.38 and later keep the
# config in ``<config dir>/jj/repos/<id>/`` and ``workspaces/<id>/`` (protected whole,
# ``USER_CONFIG_FILES``) named by ``.jj/repo/config-id`` and
# ``.jj/workspace-config-id``, and migrate (read) a legacy file found without an id
# (jj-vcs/jj lib/src/secure_config.rs ``SecureConfig::new_repo``/``new_workspace``,
# ``maybe_migrate_legacy_config``; docs/design/secure-config.md; CHANGELOG 0.38.0).
# jj writes none of them in ``jj git init`` or in its work (store, op_store,
# working_copy), only ``jj config set/edit --repo`` does.
# Where a ``.jj`` holds them: a repository's, and a workspace's.
JJ_CONFIG_PATHS: tuple[str, ...] = (
    "repo/config.toml",
    "repo/config-id",
    "workspace-config.toml",
    "workspace-config-id",
)
# Their names, refused at any depth of a ``.jj``.
JJ_PROTECTED: tuple[str, ...] = tuple(p.rsplit("/", 1)[-1] for p in JJ_CONFIG_PATHS)
# Paths below a ``.jj`` that point jj at another directory (read-only where they exist;
# the supervisor refuses a ``.jj/repo`` made as anything but a directory): a secondary
# workspace's ``.jj/repo`` is a *file* holding the path of another workspace's
# ``.jj/repo``, whose config jj then reads (lib/src/workspace.rs
# ``DefaultWorkspaceLoader::new``), and ``repo/store/git_target`` names the git
# repository jj's git backend uses, whose config and hooks ``jj git fetch``/``push``
# (git run as a subprocess) obey. The internal one (``store/git``, made with HEAD,
# config and hooks/) is a bare repository, protected as any bare repository is.
JJ_POINTERS: tuple[str, ...] = ("repo", "repo/store/git_target")

# Per-user config files the host's git, hg and jj read in every repository, besides
# ~/.gitconfig, ~/.hgrc and ~/.jjconfig.toml (HOME_FILES): their hooks,
# core.fsmonitor, aliases, extensions and tools run commands. Paths below ~/.config
# and below $XDG_CONFIG_HOME (when set), protected by path where the home is writable
# (see ``user_config_paths``). jj's is a whole directory: config.toml, conf.d/*.toml,
# and the per-repository and per-workspace config of jj 0.38 and later in repos/ and
# workspaces/ (jj-vcs/jj cli/src/config.rs ``UnresolvedConfigEnv``: the config dir is
# etcetera's XDG one, $XDG_CONFIG_HOME when absolute, else ~/.config).
USER_CONFIG_FILES: tuple[tuple[str, str], ...] = (
    ("git/config", "git's user config"),
    ("hg/hgrc", "hg's user config"),
    ("jj", "jj's user config and per-repository config"),
    # what the session, the shell, editors and agents run from the config dir
    ("autostart", "programs the desktop session starts"),
    ("systemd", "user services systemd starts"),
    ("environment.d", "variables of the user's services and session"),
    ("fish", "fish's start-up files"),
    ("nvim", "neovim's start-up files"),
    ("Code/User", "VS Code's user settings and tasks"),
    ("gh", "gh's aliases (shell commands)"),
    ("opencode", "opencode's user config and plugins"),
    ("crush", "Crush's user config (MCP servers, LSP commands)"),
    ("zed", "Zed's user settings and tasks"),
    ("tmux", "tmux's start-up file"),
    ("emacs", "emacs's start-up files"),
    ("vim", "vim's start-up files"),
    ("lesskey", "less's key file (its #env section sets LESSOPEN, a command)"),
    ("husky", "husky's init.sh, which its hook stubs source"),
)

# Below the home directory itself, protected by path where the home is writable:
# places whose files the host runs, sources or trusts later. Programs on PATH
# (Debian's stock .profile puts ~/bin and ~/.local/bin first), the Python user site
# (a .pth file there runs in every Python start), shell plugin trees, editors'
# start-up trees, ssh's config (ProxyCommand runs at the next ssh or git push),
# authorized_keys and rc, and the tools whose config runs commands for credentials
# (aws credential_process, kubeconfig exec plugins, docker credHelpers, gpg-agent's
# pinentry-program) or builds (cargo's rustc-wrapper, npm's script-shell).
HOME_PATHS: tuple[tuple[str, str], ...] = (
    ("bin", "programs on PATH"),
    (".local/bin", "programs on PATH"),
    (".local/lib", "the Python user site (.pth files run at every start)"),
    (".cargo/bin", "programs on PATH"),
    (".cargo/env", "a file rustup has the shell's start-up source"),
    (".cargo/config.toml", "cargo's config (build wrappers run at every build)"),
    (".cargo/config", "cargo's config (build wrappers run at every build)"),
    (".bashrc.d", "files bash's start-up sources"),
    (".oh-my-zsh", "files zsh's start-up sources"),
    (".vim", "vim's start-up files"),
    (".emacs.d", "emacs's start-up files"),
    (".ipython", "IPython's start-up files"),
    (".nvm", "nvm's script, which the shell's start-up sources, and node on PATH"),
    (".pyenv", "pyenv's shims on PATH"),
    (".rbenv", "rbenv's shims on PATH"),
    (".asdf", "asdf's script and shims on PATH"),
    (".sdkman", "SDKMAN's script, which the shell's start-up sources"),
    (".local/share/nvim", "neovim's site plugins"),
    (".local/share/systemd", "user services systemd starts"),
    (".local/share/dbus-1", "services D-Bus starts"),
    (".vscode-server", "VS Code's remote server and its extensions"),
    (".ssh", "ssh's config, authorized_keys and rc"),
    (".gnupg", "gpg's config (gpg-agent runs its pinentry-program)"),
    (".aws", "aws's config (credential_process runs commands)"),
    (".kube", "kubeconfig (exec plugins run commands)"),
    (".docker", "docker's config (credential helpers run)"),
    (".npmrc", "npm's user config (script-shell, node-options)"),
    (".yarnrc", "yarn's user config"),
    (".yarnrc.yml", "yarn's user config (yarnPath runs)"),
    # inside the granted data directories (HOME_GRANTED): what runs from them
    (".cache/pre-commit", "pre-commit's hook environments, which git commit runs"),
    (".npm/_npx", "the packages npx runs"),
)

# A writable home is full of start-up files, and a list of their names will always
# miss one (issue 16): every top-level dot entry of a writable home stays read-only,
# and no new one is made, unless the user names it in allowWrite or it is one of
# these data places tools write in their ordinary work (their parts that run are in
# HOME_PATHS). A name is a top-level entry of the home; nothing below it is granted
# by this table that HOME_PATHS or the mandatory names protect.
HOME_GRANTED: tuple[tuple[str, str], ...] = (
    (".cache", "caches (XDG_CACHE_HOME's default)"),
    (".npm", "npm's cache and logs"),
    (".cargo", "cargo's registry and git checkouts"),
    (".bash_history", "bash's history"),
    (".zsh_history", "zsh's history"),
    (".python_history", "Python's REPL history"),
    (".node_repl_history", "node's REPL history"),
    (".lesshst", "less's history"),
    (".wget-hsts", "wget's HSTS cache"),
)
HOME_DOT_REASON = (
    "home: a dot entry of a writable home (start-up files and tools' config live "
    "there); name it in filesystem.allowWrite to make it writable"
)


def user_config_paths(
    home: str, xdg_config_home: str | None, jj_config: str | None = None
) -> tuple[tuple[str, str], ...]:
    """(absolute path, origin) of every ``USER_CONFIG_FILES`` entry the host reads:
    below ``~/.config`` and, if it is an absolute path, below ``$XDG_CONFIG_HOME``;
    then each absolute path in ``$JJ_CONFIG`` (``:``-separated files or directories
    jj reads instead of its user config, cli/src/config.rs ``resolve_user``)."""
    bases = [home.rstrip("/") + "/.config"]
    xdg = _plain_absolute(xdg_config_home or "")
    if xdg is not None:
        bases.append(xdg)
    found = {
        f"{base}/{rel}": f"mandatory: {why}" for base in bases for rel, why in USER_CONFIG_FILES
    }
    for entry in (jj_config or "").split(":"):
        path = _plain_absolute(entry)
        if path is not None and path != "/":
            found.setdefault(path, "mandatory: jj's user config ($JJ_CONFIG)")
    return tuple(found.items())


def home_paths(home: str, path_env: str | None = None) -> tuple[tuple[str, str], ...]:
    """(absolute path, origin) of every ``HOME_PATHS`` entry below ``home``, and of
    every directory of ``path_env`` (``$PATH`` as sandhold was started with) below it:
    a program planted there runs in place of the one the host meant. Unlike the
    config files above, these count only where the home itself is writable, and
    the user lifts one by naming a writable root at or below it (``fsplan.ungranted``):
    ``allowWrite: ["~", "~/.local/bin"]`` means it."""
    top = home.rstrip("/")
    found = {f"{top}/{rel}": f"home: {why}" for rel, why in HOME_PATHS}
    for entry in (path_env or "").split(":"):
        # as a shell finds programs there: a leading ~ is the home (bash expands it);
        # every absolute one counts, since where it leads (a symlinked spelling of
        # the home, a "..") is the plan's to resolve, and only one below a writable
        # home is kept (``fsplan.ungranted``); the home itself never is
        path = top + entry[1:] if entry == "~" or entry.startswith("~/") else entry
        if path.startswith("/") and "\0" not in path and path.rstrip("/") != top:
            found.setdefault(path, "home: a directory on $PATH")
    return tuple(found.items())


def _plain_absolute(path: str) -> str | None:
    """``path`` normalised, if it is absolute and has no ``..`` (a spelling the host
    resolves otherwise: not guessed at); else None."""
    if not path.startswith("/"):
        return None
    parts = [p for p in path.split("/") if p and p != "."]
    return None if ".." in parts else "/" + "/".join(parts)


# Credential files: write-denied by default (F-SET-5), matched against the name.
CREDENTIAL_GLOBS: tuple[str, ...] = (".env", ".env.*", "*.pem", "*.key", "id_*")

# Recognised environment trees (issue 15): the trees a package installer fills with other
# people's files, where a name matching a credential glob is a package's (certifi's
# cacert.pem in every venv's pip, test keys shipped in npm packages and crates), not a key
# the user owns; the credential globs (only they) do not apply inside one. Decided by
# structure, never by a name alone: each row is (the tree's top directory name, "*" for
# any; a marker, relative to that top, that must exist for it to be one; how deep below
# the top a file must lie; what it is). The top lies strictly below the writable root (a
# project holding a pyvenv.cfg is no virtualenv to sandhold), and the file lies in a
# directory of the tree (depth 2 or more: a package's own directory), never beside the
# marker. A directory merely named ``node_modules`` (no package.json beside it) or
# ``site-packages`` (in no virtualenv or conda environment) is no tree. The sandbox can
# make a tree itself (that is what ``python -m venv`` does): what lies in one is code the
# agent wrote or installed, to be trusted no more than a ``.git`` made in the run.
ENVIRONMENT_TREES: tuple[tuple[str, str, int, str], ...] = (
    ("*", "pyvenv.cfg", 2, "a Python virtual environment"),
    ("*", "conda-meta", 2, "a conda environment"),
    ("node_modules", "../package.json", 2, "a node_modules beside a package.json"),
    ("registry", "index", 2, "cargo's registry"),
    ("mod", "cache/download", 2, "Go's module cache"),
)


def environment_tree(path: str, root: str, exists: Callable[[str], bool]) -> str | None:
    """What recognised environment tree (``ENVIRONMENT_TREES``) below the
    writable ``root`` holds ``path``, as "<what> at <top>", or None.

    ``exists`` is the host fact: whether a path exists (a marker). Only the ancestors
    of ``path`` strictly below ``root`` can be a tree's top, and the marker must lie
    in ``root`` (a ``../package.json`` beside a top-level ``node_modules`` is the
    root's own).
    """
    top = root.rstrip("/")
    if not path.startswith(top + "/"):
        return None
    parts = path[len(top) + 1 :].split("/")
    for k in range(len(parts) - 1):  # parts[k] a directory holding the path
        below = len(parts) - 1 - k
        for name, marker, depth, what in ENVIRONMENT_TREES:
            if below < depth or name not in ("*", parts[k]):
                continue
            here = "/".join((top, *parts[: k + 1]))
            at = here.rsplit("/", 1)[0] + marker[2:] if marker.startswith("../") else None
            if exists(at if at is not None else f"{here}/{marker}"):
                return f"{what} at {here}"
    return None


def credential_reason(glob: str, path: str) -> str:
    """The refusal of a credential name ``path`` (matching ``glob``): the rule, and the
    setting that lifts it with the path to put there."""
    return f'credential: {glob} (to allow it: "filesystem": {{"allowCredentialWrite": ["{path}"]}})'


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


# mise reads a project's config in every spelling below, in each directory from the
# one a shell enters up to / (mise.jdx.dev/configuration.html; its [hooks] and [env]
# _.source run commands): besides the names above, ``mise.<env>.toml`` and the local
# and rtx variants (``MISE_NAME_GLOBS``, a file's name), ``mise/config.toml``,
# ``mise/config.<env>.toml``, ``mise/conf.d/*.toml``, ``.config/mise.toml`` and the
# whole ``.config/mise`` (its config.toml, mise.toml, conf.d, tasks). ``.mise`` is a
# protected directory already (``OTHER_AGENT_DIRS``).
MISE_NAME_GLOBS: tuple[str, ...] = ("mise.*.toml", ".mise.*.toml", "rtx.*.toml", ".rtx.*.toml")
_MISE_IN_DIR = ("config.toml", "mise.toml", "config.local.toml", "conf.d")
MISE_REASON = "mandatory: mise's config (its hooks run when a shell enters the directory)"


def _star_name(glob: str, name: str) -> bool:
    head, _, tail = glob.partition("*")
    return len(name) > len(head) + len(tail) and name.startswith(head) and name.endswith(tail)


def mise_config(parts: tuple[str, ...] | list[str]) -> str | None:
    """Why the path of components ``parts`` (absolute, split on ``/``) is one of mise's
    config spellings or lies inside one (``.config/mise``, ``mise/conf.d``), or None."""
    for i in range(1, len(parts)):
        prev, name = parts[i - 1], parts[i]
        toml = name.endswith(".toml")
        if prev == ".config" and (name == "mise" or (toml and name.startswith("mise."))):
            return MISE_REASON
        if prev == "mise" and (name in _MISE_IN_DIR or (toml and name.startswith("config."))):
            return MISE_REASON
    last = parts[-1] if parts else ""
    if any(_star_name(g, last) for g in MISE_NAME_GLOBS):
        return MISE_REASON
    return None


def mandatory_reason(name: str) -> str | None:
    """Why a directory entry called ``name`` is always write-denied, or None."""
    if name in MANDATORY_FILES:
        return "mandatory: file run or trusted by the host"
    if name in MANDATORY_DIRS:
        return "mandatory: agent/editor configuration"
    return None
