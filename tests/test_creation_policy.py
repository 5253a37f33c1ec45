"""The creation policy's decision table (F-SET-5, F-BE-5): pure, no OS.

Each row is (path, directory, expected reason prefix or None, F-id). The policy
has one writable root /w (with a nested /w/sub), scratch /w/tmp, and denyWrite
entries of every form: a literal file, a literal directory, a relative glob, an
absolute glob and a ``~`` entry.
"""

from __future__ import annotations

import errno
import itertools

import pytest

from sandhold.policy import mandatory
from sandhold.policy.creation import (
    GIT_DIR_CONFIG,
    CreationPolicy,
    Decider,
    bare_repository_denied,
    creation_policy,
    denied,
    git_directory,
    unix_socket_denied,
)
from sandhold.policy.refusal import (
    CREDENTIAL,
    DENY_PATH,
    HOME_DOT,
    KINDS,
    MANDATORY,
    SYMLINK,
    UNIX_SOCKET,
    Refusal,
)


def _rule(refusal: Refusal | None) -> str | None:
    return None if refusal is None else refusal.rule


POLICY = creation_policy(
    writable_roots=["/w", "/w/sub", "/home/u"],
    deny_write=["secret.txt", "/w/locked", "**/*.sqlite", "/w/out/*.log", "~/notes"],
    scratch=["/w/tmp"],
    cwd="/w",
    home="/home/u",
    realpath=lambda p: {"/w/locked": "/data/locked"}.get(p, p),
)

ROWS: list[tuple[str, bool, str | None, str]] = [
    # mandatory files at any depth (F-SET-5)
    *((f"/w/{n}", False, "mandatory", "F-SET-5") for n in mandatory.MANDATORY_FILES),
    ("/w/a/b/c/.bashrc", False, "mandatory", "F-SET-5"),
    ("/home/u/.zshrc", False, "mandatory", "F-SET-5"),
    ("/w/.bashrc", True, "mandatory", "F-SET-5"),  # a directory of that name too
    # agent/editor dirs, and anything inside them
    *((f"/w/{n}", True, "mandatory", "F-SET-5") for n in mandatory.MANDATORY_DIRS),
    ("/w/x/y/.claude/settings.json", False, "mandatory", "F-SET-5"),
    ("/w/.vscode/tasks.json", False, "mandatory", "F-SET-5"),
    # git: hooks and config at any depth, repos made during the run included
    ("/w/.git/hooks", True, "mandatory", "F-SET-5"),
    ("/w/.git/hooks/pre-commit", False, "mandatory", "F-SET-5"),
    ("/w/.git/config", False, "mandatory", "F-SET-5"),
    # git's lock files for its configs: refused, so git fails at the lock and says so
    ("/w/.git/config.lock", False, "mandatory: .git/config.lock (git writes", "F-SET-5"),
    ("/w/.git/config.worktree.lock", False, "mandatory: .git/config.worktree.lock", "F-SET-5"),
    (
        "/w/.git/worktrees/wt/config.worktree.lock",
        False,
        "mandatory: .git/worktrees/wt/config.worktree.lock (git writes a config through it; "
        "git.allowConfig covers a repository's own .git/config only",
        "F-SET-5",
    ),
    ("/w/.git/modules/m/config.lock", False, "mandatory: .git/modules/m/config.lock", "F-SET-5"),
    ("/w/new/repo/.git/config", False, "mandatory", "F-SET-5"),
    ("/w/a/b/c/.git/hooks/post-checkout", False, "mandatory", "F-SET-5"),
    ("/w/.git/modules/sub/hooks/pre-commit", False, "mandatory", "F-SET-5"),
    ("/w/.git/commondir", False, "mandatory", "F-SET-5"),
    ("/w/.git/worktrees/t/config.worktree", False, "mandatory", "F-SET-5"),
    ("/w/.git", False, "mandatory", "F-SET-5"),  # a .git file points elsewhere
    ("/w/.git", True, None, "F-SET-5"),  # a repository directory may be made
    ("/w/.git/HEAD", False, None, "F-SET-5"),
    ("/w/.git/objects/ab/cdef", False, None, "F-SET-5"),
    ("/w/hooks", True, None, "F-SET-5"),  # only inside .git
    ("/w/config", False, None, "F-SET-5"),
    # hg: the config it reads and the share pointer, in every .hg at any depth
    ("/w/.hg/hgrc", False, "mandatory", "F-SET-5"),
    ("/w/.hg/hgrc-not-shared", False, "mandatory", "F-SET-5"),
    ("/w/.hg/sharedpath", False, "mandatory", "F-SET-5"),
    ("/w/a/b/.hg/hgrc", False, "mandatory", "F-SET-5"),
    ("/w/.hg/patches/.hg/hgrc", False, "mandatory", "F-SET-5"),  # an mq queue
    ("/w/.hg/x/sharedpath", False, "mandatory", "F-SET-5"),
    ("/w/.hg/hgrc", True, "mandatory", "F-SET-5"),
    ("/w/.hg/hgrc/inner", False, "mandatory", "F-SET-5"),
    ("/w/sub/.hg/hgrc", False, "mandatory", "F-SET-5"),
    ("/w/.hg", False, "mandatory", "F-SET-5"),  # a .hg symlink leads hg elsewhere
    ("/w/.hg", True, None, "F-SET-5"),  # hg init
    ("/w/.hg/requires", False, None, "F-SET-5"),
    ("/w/.hg/store", True, None, "F-SET-5"),
    ("/w/.hg/store/data/hgrc.i", False, None, "F-SET-5"),
    ("/w/.hg/wcache/checklink", False, None, "F-SET-5"),
    ("/w/hgrc", False, None, "F-SET-5"),  # only inside .hg
    ("/w/sharedpath", False, None, "F-SET-5"),
    ("/w/hg/hgrc", False, None, "F-SET-5"),
    # jj: the repository's and the workspace's config, the ids that pick it out of the
    # user's config directory, in every .jj at any depth; a workspace's repo pointer
    *((f"/w/.jj/{p}", False, "mandatory", "F-SET-5") for p in mandatory.JJ_CONFIG_PATHS),
    ("/w/a/b/.jj/repo/config.toml", False, "mandatory", "F-SET-5"),
    ("/w/.jj/repo/config.toml", True, "mandatory", "F-SET-5"),
    ("/w/.jj/repo/config.toml/inner", False, "mandatory", "F-SET-5"),
    ("/w/.jj/x/config-id", False, "mandatory", "F-SET-5"),
    ("/w/sub/.jj/workspace-config-id", False, "mandatory", "F-SET-5"),
    ("/w/.jj/repo", False, "mandatory", "F-SET-5"),  # a secondary workspace's pointer
    ("/w/.jj", False, "mandatory", "F-SET-5"),  # a .jj symlink leads jj elsewhere
    ("/w/.jj", True, None, "F-SET-5"),  # jj git init
    ("/w/.jj/repo", True, None, "F-SET-5"),
    ("/w/.jj/repo/store/git_target", False, None, "F-SET-5"),  # jj git init writes it
    ("/w/.jj/repo/store/type", False, None, "F-SET-5"),
    ("/w/.jj/repo/store/extra/ab12", False, None, "F-SET-5"),
    ("/w/.jj/repo/op_store/operations/cd34", False, None, "F-SET-5"),
    ("/w/.jj/repo/op_heads/heads/ef56", False, None, "F-SET-5"),
    ("/w/.jj/working_copy/tree_state", False, None, "F-SET-5"),
    ("/w/.jj/repo/store/repo", False, None, "F-SET-5"),  # only directly in a .jj
    ("/w/repo", False, None, "F-SET-5"),
    ("/w/config.toml", False, None, "F-SET-5"),  # only inside .jj
    ("/w/jj/config.toml", False, None, "F-SET-5"),
    ("/w/.cargo/config.toml", False, None, "F-SET-5"),
    # credential globs on the last component (F-SET-5 default)
    ("/w/.env", False, "credential", "F-SET-5"),
    ("/w/app/.env.local", False, "credential", "F-SET-5"),
    ("/w/tls/server.pem", False, "credential", "F-SET-5"),
    ("/w/deep/a/b/c/private.key", False, "credential", "F-SET-5"),
    ("/w/id_ed25519", False, "credential", "F-SET-5"),
    ("/w/.envrc", False, None, "F-SET-5"),
    ("/w/keys.pem.d/readme", False, None, "F-SET-5"),  # globs look at the last name only
    ("/w/environment", False, None, "F-SET-5"),
    # denyWrite: literal file, literal dir (both spellings), globs, ~ (F-SET-1, F-SET-6)
    ("/w/secret.txt", False, "filesystem.denyWrite[0]", "F-SET-1"),
    ("/w/locked", True, "filesystem.denyWrite[1]", "F-SET-6"),
    ("/w/locked/new.txt", False, "filesystem.denyWrite[1]", "F-SET-6"),
    ("/data/locked/new.txt", False, "filesystem.denyWrite[1]", "F-SET-6"),
    ("/w/db.sqlite", False, "filesystem.denyWrite[2]", "F-SET-1"),
    ("/w/a/b/db.sqlite", False, "filesystem.denyWrite[2]", "F-SET-1"),
    ("/w/out/run.log", False, "filesystem.denyWrite[3]", "F-SET-1"),
    ("/w/out/sub/run.log", False, None, "F-SET-1"),  # * stays in one segment
    ("/home/u/notes/todo", False, "filesystem.denyWrite[4]", "F-SET-1"),
    # the nested root changes nothing: the outermost decides
    ("/w/sub/.bashrc", False, "mandatory", "F-SET-5"),
    ("/w/sub/ok.txt", False, None, "F-BE-5"),
    # ordinary names
    ("/w/main.py", False, None, "F-BE-5"),
    ("/w/src/pkg/__init__.py", False, None, "F-BE-5"),
    ("/w/build", True, None, "F-BE-5"),
    # scratch is exempt, whatever the name
    ("/w/tmp/.env", False, None, "F-BE-5"),
    ("/w/tmp/clone/.git/config", False, None, "F-BE-5"),
    ("/w/tmp/clone/.git/hooks", True, None, "F-BE-5"),
    ("/w/tmp/clone/.hg/hgrc", False, None, "F-BE-5"),
    ("/w/tmp/ws/.jj/repo", False, None, "F-BE-5"),  # jj workspace add into $TMPDIR
    # outside the writable roots only denyWrite applies (the mount plan does the rest)
    ("/etc/.bashrc", False, None, "F-BE-5"),
    ("/dev/shm/.env", False, None, "F-BE-5"),
    ("/w", True, None, "F-BE-5"),  # the root itself is no name below a root
]


@pytest.mark.parametrize(
    ("path", "directory", "expected"),
    [pytest.param(p, d, e, id=f"{fid}:{p}{'/' if d else ''}") for p, d, e, fid in ROWS],
)
def test_denied(path: str, directory: bool, expected: str | None) -> None:
    reason = denied(POLICY, path, directory=directory)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and reason.rule.startswith(expected), reason
        assert reason.kind in KINDS
    assert Decider(POLICY).denied(path, directory=directory) == reason


def test_reasons_name_the_rule() -> None:
    assert _rule(denied(POLICY, "/w/.env")) == (
        'credential: .env (to allow it: "filesystem": {"allowCredentialWrite": ["/w/.env"]})'
    )
    assert (
        _rule(denied(POLICY, "/w/x/.bashrc"))
        == "mandatory: .bashrc (file run or trusted by the host)"
    )
    assert _rule(denied(POLICY, "/w/.git/hooks", directory=True)) == (
        "mandatory: .git/hooks (git runs or trusts it)"
    )
    assert _rule(denied(POLICY, "/w/db.sqlite")) == "filesystem.denyWrite[2]: /w/**/*.sqlite"
    assert _rule(denied(POLICY, "/w/r/.hg/hgrc")) == "mandatory: .hg/hgrc (hg reads it as config)"
    assert _rule(denied(POLICY, "/w/r/.jj/repo/config-id")) == (
        "mandatory: .jj/config-id (jj reads it as config)"
    )
    assert _rule(denied(POLICY, "/w/r/.jj/repo")) == (
        "mandatory: .jj/repo that is no directory (points jj at another repository)"
    )


KIND_ROWS = [
    # (path, directory, link_to, kind): each rule's refusal says which rule it is by its
    # kind, whatever its words (a denyWrite origin named on a symlink's way is rule 4)
    ("/w/secret.txt", False, None, DENY_PATH),
    ("/w/db.sqlite", False, None, DENY_PATH),
    ("/data/locked/new.txt", False, None, DENY_PATH),
    ("/w/x/.bashrc", False, None, MANDATORY),
    ("/w/.claude", True, None, MANDATORY),
    ("/w/.git/hooks", True, None, MANDATORY),
    ("/w/.git", False, None, MANDATORY),
    ("/w/r/.hg/hgrc", False, None, MANDATORY),
    ("/w/r/.jj/repo", False, None, MANDATORY),
    ("/w/mise/config.toml", False, None, MANDATORY),
    ("/w/.env", False, None, CREDENTIAL),
    ("/w/tls/server.pem", False, None, CREDENTIAL),
    ("/w/locked", False, ("/w/x",), DENY_PATH),  # the path itself is denied first
    ("/w/lnk", False, ("/w/tmp/x",), SYMLINK),
    ("/w/lnk", False, None, None),
]


@pytest.mark.parametrize(("path", "directory", "link_to", "kind"), KIND_ROWS)
def test_refusals_carry_their_kind(
    path: str, directory: bool, link_to: tuple[str, ...] | None, kind: str | None
) -> None:
    got = denied(POLICY, path, directory=directory, link_to=link_to)
    assert (got and got.kind) == kind, got


def test_the_other_refusals_carry_their_kind() -> None:
    from sandhold.policy import repository, symlinks
    from sandhold.policy.creation import link_text_denied
    from sandhold.policy.refusal import READ_ONLY, REPOSITORY

    home = creation_policy(
        writable_roots=["/home/u"], cwd="/home/u", home="/home/u", home_dots=["/home/u"]
    )
    sockets = creation_policy(writable_roots=["/w"], cwd="/w", home="/h", unix_sockets=[])
    got = [
        denied(home, "/home/u/.inputrc"),
        unix_socket_denied(sockets, "/run/x.sock"),
        link_text_denied("/proc/1/root"),
        symlinks.kernel_tree_denied(["/w/x", "/sys/kernel"]),
        repository.nested_repository_reason("/w/app"),
        repository.bare_repository_reason("/w/app"),
        repository.above_work_tree_reason("/w", "/w/app"),
        repository.repository_link_denied("/w/app", ["/w/x"], lambda _p: True),
    ]
    kinds = [g.kind if g is not None else None for g in got]
    assert kinds == [HOME_DOT, UNIX_SOCKET, SYMLINK, SYMLINK, *[REPOSITORY] * 4]
    assert set(KINDS) == {DENY_PATH, MANDATORY, CREDENTIAL, *kinds, READ_ONLY}
    with pytest.raises(ValueError, match="unknown refusal kind"):
        Refusal("mandatory:", "a kind spelled as the words of a rule")


def test_builder_spells_entries_like_the_settings() -> None:
    assert POLICY.writable_roots == ("/home/u", "/w", "/w/sub")
    assert POLICY.scratch == ("/w/tmp",)
    assert POLICY.deny_paths == (
        ("/w/secret.txt", "filesystem.denyWrite[0]"),
        ("/w/locked", "filesystem.denyWrite[1]"),
        ("/data/locked", "filesystem.denyWrite[1]"),
        ("/w/**/*.sqlite", "filesystem.denyWrite[2]"),
        ("/w/out/*.log", "filesystem.denyWrite[3]"),
        ("/home/u/notes", "filesystem.denyWrite[4]"),
    )


def test_a_root_deny_refuses_everything() -> None:
    policy = CreationPolicy(writable_roots=("/w",), deny_paths=(("/", "test"),))
    assert _rule(denied(policy, "/w/anything")) == "test: /"


def test_policy_is_a_value() -> None:
    again = creation_policy(
        writable_roots=["/w/sub", "/w", "/home/u"],
        deny_write=["secret.txt", "/w/locked", "**/*.sqlite", "/w/out/*.log", "~/notes"],
        scratch=["/w/tmp"],
        cwd="/w",
        home="/home/u",
        realpath=lambda p: {"/w/locked": "/data/locked"}.get(p, p),
    )
    assert again == POLICY and hash(again) == hash(POLICY)


def test_the_policy_module_touches_no_os() -> None:
    """STYLE §5.1: policy imports nothing that reaches the host."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import sandhold

    code = (
        "import sys, sandhold.policy.creation; "
        "print(sorted({'subprocess', 'socket', 'asyncio', 'ctypes', 'fcntl', 'select', 'shutil'}"
        " & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(sandhold.__file__).parents[1])},
    )
    assert out.stdout.strip() == "[]"


FRESH_ROWS: list[tuple[str, bool, str | None]] = [
    # what git init and git clone make in a .git created during the run (creation rule 3)
    ("/w/new/.git/config", False, None),
    ("/w/new/.git/config.lock", False, None),  # git init writes config through it
    ("/w/new/.git/hooks", True, None),
    ("/w/new/.git/hooks/pre-commit.sample", False, None),
    # never a hook git would run, nor anything else under hooks, nor config as a dir
    ("/w/new/.git/hooks/pre-commit", False, "mandatory"),
    ("/w/new/.git/hooks/sub", True, "mandatory"),
    ("/w/new/.git/hooks/sub/x.sample", False, "mandatory"),
    ("/w/new/.git/config", True, "mandatory"),
    ("/w/new/.git/hooks", False, "mandatory"),  # a hooks *file* is no template dir
    ("/w/new/.git/commondir", False, "mandatory"),
    ("/w/new/.git/config.worktree", False, "mandatory"),
    ("/w/new/.git/config.worktree.lock", False, "mandatory"),
    ("/w/new/.git/modules/m/config.lock", False, "mandatory"),
    ("/w/new/.git/modules/m/config", False, "mandatory"),  # not git init's own
    # the other rules still hold inside a fresh repository
    ("/w/new/.git/hooks/.env.sample", False, "credential"),
    ("/w/new/.git/hooks/id_x.sample", False, "credential"),
    ("/w/new/.git/.claude", True, "mandatory"),
    # hg init makes no config: a fresh .hg (or its mention) lifts nothing
    ("/w/new/.hg/hgrc", False, "mandatory"),
    ("/w/new/.hg/hgrc-not-shared", False, "mandatory"),
    ("/w/new/.hg/sharedpath", False, "mandatory"),
    ("/w/new/.git/.hg/hgrc", False, "mandatory"),
    # jj git init makes no config either
    *((f"/w/new/.jj/{p}", False, "mandatory") for p in mandatory.JJ_CONFIG_PATHS),
    ("/w/new/.jj/repo", False, "mandatory"),
]


@pytest.mark.parametrize(("path", "directory", "expected"), FRESH_ROWS)
def test_fresh_repository_rows(path: str, directory: bool, expected: str | None) -> None:
    got = denied(POLICY, path, directory=directory, fresh=True)
    if expected is None:
        assert got is None, got
    else:
        assert got is not None and got.rule.startswith(expected), got
    # without the supervisor's word that the repository is new: refused, every row
    assert denied(POLICY, path, directory=directory) is not None


def test_allow_credential_write_lifts_the_credential_globs_only() -> None:
    policy = creation_policy(
        writable_roots=["/w"],
        deny_write=["**/*.lock"],
        credential_exempt=["./.venv", "**/node_modules"],
        cwd="/w",
        home="/home/u",
    )
    assert policy.credential_exempt == ("/w/.venv", "/w/**/node_modules")
    # pip's CA bundle in a venv, a package's test key: allowed where the user said so
    assert denied(policy, "/w/.venv/lib/site-packages/certifi/cacert.pem") is None
    assert denied(policy, "/w/app/node_modules/forge/test/server.key") is None
    assert denied(policy, "/w/.venv") is None
    # elsewhere, and for everything that is not a credential glob, nothing changes
    assert denied(policy, "/w/server.pem") is not None
    assert denied(policy, "/w/.venvx/cacert.pem") is not None
    assert denied(policy, "/w/.venv/.bashrc") is not None  # mandatory names stay
    assert denied(policy, "/w/.venv/.git/hooks/x", directory=False) is not None
    assert denied(policy, "/w/node_modules/x.lock") is not None  # denyWrite stays


def test_a_writable_root_below_scratch_is_no_scratch() -> None:
    """SandboxPort's private /tmp is scratch, but a host directory bound below it
    (mkdtemp, pytest's tmp_path) is the user's tree: its names keep every rule."""
    policy = CreationPolicy(writable_roots=("/tmp/proj",), scratch=("/tmp",))
    assert denied(policy, "/tmp/proj/.env") is not None
    assert denied(policy, "/tmp/proj/x/.git/hooks/pre-commit") is not None
    assert denied(policy, "/tmp/elsewhere/.env") is None  # the private /tmp itself
    assert denied(policy, "/tmp/proj/notes.txt") is None


LINKS = creation_policy(
    writable_roots=["/w"],
    deny_write=["conf/prod.yaml", "/w/**/secrets/*", "/w/**/*.lock"],
    scratch=["/w/tmp", "/tmp/s"],
    cwd="/w",
    home="/home/u",
    credential_exempt=["./.venv"],
    extra_deny=[("/w/vendor/lib", "sandhold: code path")],
    private=["/tmp/sandhold-1000"],
)


@pytest.mark.parametrize(
    ("path", "link_to", "expected"),
    [
        # on the way to a deny entry: a symlink there would lead the host past it
        ("/w/conf", ("/w/real",), "filesystem.denyWrite[0]: /w/conf/prod.yaml"),
        ("/w/vendor", ("/w/x",), "sandhold: code path"),
        ("/w/a/b/secrets", ("/w/r3",), "filesystem.denyWrite[1]"),
        ("/w/secrets", ("/w/r3",), "filesystem.denyWrite[1]"),
        ("/w/a/b", ("/w/r3",), None),  # '**' alone: every directory, not a way
        ("/w/a/conf", ("/w/real",), None),
        ("/w/other", ("/w/real",), None),
        # into a tree whose names are not checked, from one where they are
        ("/w/app", ("/tmp/s/x",), "a symlink into private scratch"),
        ("/w/app", ("/w/app2", "/w/tmp/x"), "a symlink into private scratch"),  # resolved
        ("/w/app", ("/w/.venv/app",), "a symlink into filesystem.allowCredentialWrite"),
        ("/w/app", ("/w/.venv",), "a symlink into filesystem.allowCredentialWrite"),
        ("/w/app", ("/etc/hosts",), None),  # read-only there
        ("/w/.venv/bin/py", ("/w/.venv/bin/python3",), None),  # within the lifted tree
        ("/tmp/s/a", ("/tmp/s/b",), None),  # scratch may link anywhere
        ("/tmp/s/a", ("/w/conf",), None),
        # to a directory above such a tree: a later symlink there could lead in
        ("/w/t", ("/tmp",), "a symlink to /tmp, which holds /tmp/s"),
        ("/w/t", ("/",), "a symlink to /, which holds"),
        ("/w/sub/up", ("/w",), "a symlink to /w, which holds /w/tmp"),
        ("/w/.venv/self", ("/w/.venv",), None),  # from inside the lifted tree to it
        # sandhold's private data, every session's
        ("/w/x", ("/tmp/sandhold-1000/other-session/tmp/repo",), "a symlink into sandhold's"),
    ],
)
def test_symlinks_cannot_lead_the_host_past_a_rule(
    path: str, link_to: tuple[str, ...], expected: str | None
) -> None:
    reason = Decider(LINKS).denied(path, link_to=link_to)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and reason.rule.startswith(expected), reason
        assert reason.kind == SYMLINK
    assert denied(LINKS, path, link_to=link_to) == reason
    # only a symlink: a directory or a file of that name is checked by what it holds
    assert Decider(LINKS).denied(path, directory=True) is None
    assert Decider(LINKS).denied(path) is None


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("b/../tmp/x", True),  # '..' after a name: a later symlink at b decides
        ("a/b/../../c", True),
        ("../../lib/x", False),  # leading: judged from the link's own directory
        ("../x/./y", False),
        ("/proc/self/root/tmp/x", True),
        ("/proc", True),
        ("proc/x", False),
        ("/usr/bin/python3", False),
        (".", False),
    ],
)
def test_symlink_texts_that_cannot_be_judged_when_made(text: str, refused: bool) -> None:
    from sandhold.policy.creation import link_text_denied

    got = link_text_denied(text)
    assert (got is not None) == refused
    assert got is None or got.kind == SYMLINK


@pytest.mark.parametrize(
    ("path", "error", "expected"),
    [
        ("/etc/passwd", errno.EROFS, True),  # the mount plan's read-only tree
        ("/w/a.txt", errno.EROFS, True),  # a writable root on a read-only filesystem
        ("/dev/made", errno.EACCES, True),  # outside every writable root: Landlock
        ("/w/ro/x", errno.EACCES, False),  # inside one: the file's own permissions
        ("/home/u/x", errno.EACCES, False),
        ("/w/tmp/x", errno.EACCES, False),  # scratch
        ("/etc/x", errno.ENOENT, False),  # other failures are no refused write
        ("/etc/x", errno.EPERM, False),
    ],
)
def test_read_only_tells_a_refused_write_from_other_failures(
    path: str, error: int, expected: bool
) -> None:
    assert Decider(POLICY).read_only(path, error) is expected


# (names the directory holds, the name made, refused): creation rule 3's bare
# repositories. Refused when the directory would be a git directory (HEAD with refs or
# commondir) and was none, or when one gets a config, hooks or a pointer to another's
GIT_DIR_ROWS: list[tuple[set[str], str, bool]] = [
    # whichever name completes it, in any order; objects do not count
    ({"refs", "config"}, "HEAD", True),
    ({"HEAD", "config"}, "refs", True),
    ({"HEAD", "objects"}, "refs", True),
    ({"HEAD"}, "refs", True),  # no config yet: one could come later
    ({"refs"}, "HEAD", True),
    ({"HEAD"}, "commondir", True),  # its config, hooks, objects and refs are elsewhere
    ({"commondir"}, "HEAD", True),
    ({"HEAD", "refs"}, "config", True),  # a git directory cannot get a config
    ({"HEAD", "refs"}, "hooks", True),
    ({"HEAD", "refs"}, "config.worktree", True),
    ({"HEAD", "refs", "config"}, "config", True),  # replaced, or moved away
    # a git directory that existed before the run: git's own HEAD and refs
    ({"HEAD", "refs", "config", "hooks"}, "HEAD", False),
    ({"HEAD", "refs", "config"}, "refs", False),
    ({"HEAD", "commondir"}, "HEAD", False),
    # no git directory
    (set(), "config", False),
    ({"config", "hooks"}, "HEAD", False),
    ({"refs", "hooks", "config.worktree"}, "config", False),
    ({"HEAD"}, "config", False),
    ({"HEAD", "config"}, "hooks", False),
    ({"objects"}, "HEAD", False),
    ({"HEAD", "refs"}, "objects", False),  # a name git's test does not need
    ({"HEAD", "refs"}, "packed-refs", False),
    ({"HEAD", "refs"}, "HEAD.lock", False),
]


@pytest.mark.parametrize(("names", "name", "refused"), GIT_DIR_ROWS)
def test_bare_repository_rows(names: set[str], name: str, refused: bool) -> None:
    assert bare_repository_denied(name, names) is refused


@pytest.mark.parametrize(
    ("names", "name", "refused"),
    [
        ({"HEAD", "refs", "objects"}, "HEAD", True),  # new there, with all its names
        ({"HEAD", "refs", "config"}, "refs", True),
        ({"HEAD", "commondir"}, "commondir", True),
        ({"refs", "config", "hooks"}, "config", False),
        ({"HEAD", "objects", "config"}, "HEAD", False),
    ],
)
def test_a_moved_directory_brings_its_names_along(
    names: set[str], name: str, refused: bool
) -> None:
    assert bare_repository_denied(name, names, moved=True) is refused


def test_no_creation_order_makes_a_git_directory() -> None:
    """Made one by one from an empty directory, in every order, a set of names is
    refused at some step exactly when it would be a git directory."""
    pool = ("HEAD", "refs", "objects", *GIT_DIR_CONFIG)
    for k in range(len(pool) + 1):
        for chosen in itertools.combinations(pool, k):
            for order in itertools.permutations(chosen):
                made: set[str] = set()
                for name in order:
                    if bare_repository_denied(name, made):
                        break
                    made.add(name)
                assert not git_directory(made), order
                assert (made != set(chosen)) is git_directory(chosen), order


@pytest.mark.parametrize(
    ("path", "asked"),
    [
        ("/w/docs/HEAD", True),
        ("/w/refs", True),
        ("/w/a/b/config.worktree", True),
        ("/w/sub/x/commondir", True),  # a nested root: the outermost one decides
        ("/home/u/hooks", True),
        ("/w/docs/objects", False),  # git's test needs no objects
        ("/w/docs/HEAD.lock", False),
        ("/w/.git/HEAD", False),  # inside a .git: its own names are rule 3's
        ("/w/x/.git/worktrees/t/commondir", False),
        ("/w/x/.git/logs/refs", False),  # beside logs/HEAD: git's own
        ("/w/x/.hg/git/HEAD", True),  # a symlink in the work tree could lead git there
        ("/w/tmp/b.git/config", False),  # scratch
        ("/elsewhere/HEAD", False),  # outside the writable roots: the mounts answer
    ],
)
def test_the_supervisor_asks_about_a_directorys_names_only_for_git_dir_names(
    path: str, asked: bool
) -> None:
    assert Decider(POLICY).git_dir_name(path) is asked


def test_a_git_directory_s_config_names_are_the_ones_protected_in_a_git_dir() -> None:
    """The bare repository rule's names (kept in their own order for --explain) are
    the names refused and kept read-only in every .git: one list in two orders (and
    git's lock files for the configs, refused there too)."""
    assert {*GIT_DIR_CONFIG, *mandatory.GIT_CONFIG_LOCKS} == {*POLICY.git_names}
