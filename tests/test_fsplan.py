"""The filesystem plan as a pure function of rules and host facts (F-SET-4..6, F-BE-4).

Each case builds a fake host tree, plans, and compares the mounts that matter.
The real-sandbox counterparts are in test_sandbox_fs.py.
"""

from __future__ import annotations

import pytest

from fakehost import FakeHost
from sandhold.errors import UnenforceablePolicy
from sandhold.policy import mandatory
from sandhold.policy.fsplan import FsPlan, FsRequest, plan_filesystem, work_trees

HOME = "/home/u"
CWD = "/home/u/proj"
PRIV = "/tmp/sandhold-1000"
TMP = "/tmp/sandhold-1000/s1/tmp"


def plan(
    entries: dict[str, str], links: tuple[tuple[str, ...], ...] = (), **rules: object
) -> FsPlan:
    host = FakeHost({PRIV: "dir", TMP: "dir", CWD: "dir", **entries}, links)
    req = FsRequest(cwd=CWD, home=HOME, tmpdir=TMP, private_root=PRIV, **rules)  # type: ignore[arg-type]
    return plan_filesystem(req, host)


def ops(p: FsPlan) -> list[tuple[str, str]]:
    return [(m.op, m.path) for m in p.mounts]


def op_at(p: FsPlan, path: str) -> str | None:
    found = [m.op for m in p.mounts if m.path == path and m.op != "remount-ro"]
    assert len(found) <= 1, found
    return found[0] if found else None


def test_defaults_hide_private_data_and_bind_only_tmpdir() -> None:  # F-SET-2
    p = plan({})
    assert ops(p) == [("hide-dir", PRIV), ("bind", TMP), ("remount-ro", PRIV)]
    assert p.unpinned == () and p.writable_roots == ()
    assert p.mounts[0].perms == "0111"  # traversable to reach TMPDIR, not listable


@pytest.mark.parametrize(
    ("rules", "path", "expected", "fid"),
    [
        ({"deny_read": ("~/.ssh",)}, "/home/u/.ssh", "hide-dir", "F-SET-4 deny dir"),
        (
            {"deny_read": ("~/.ssh/id_rsa",)},
            "/home/u/.ssh/id_rsa",
            "hide-file",
            "F-SET-4 deny file",
        ),
        # allowRead beats denyRead at the same path
        (
            {"deny_read": ("~/.ssh",), "allow_read": ("~/.ssh",)},
            "/home/u/.ssh",
            None,
            "F-SET-4 tie",
        ),
        # the spec's example: a denyRead more specific than the allowRead still holds
        (
            {"deny_read": ("**/.env",), "allow_read": (".",)},
            "/home/u/proj/.env",
            "hide-file",
            "F-SET-4 .env",
        ),
        ({"deny_read": ("~",), "allow_read": (".",)}, "/home/u/proj", "ro-bind", "F-SET-4 carve"),
        ({"deny_read": ("~",), "allow_read": (".",)}, "/home/u", "hide-dir", "F-SET-4 carve"),
    ],
)
def test_read_precedence(
    rules: dict[str, tuple[str, ...]], path: str, expected: str | None, fid: str
) -> None:
    p = plan(
        {"/home/u/.ssh/id_rsa": "file", "/home/u/proj/.env": "file", "/home/u/proj/a.py": "file"},
        **rules,
    )
    assert op_at(p, path) == expected, (fid, ops(p))


def test_carve_out_inside_denied_dir_keeps_more_specific_deny() -> None:  # F-SET-4
    p = plan(
        {"/home/u/proj/.env": "file", "/home/u/notes": "file"},
        deny_read=("~", "**/.env"),
        allow_read=(".",),
    )
    assert {("hide-dir", HOME), ("hide-dir", PRIV), ("ro-bind", CWD), ("bind", TMP)} <= set(ops(p))
    assert op_at(p, "/home/u/proj/.env") == "hide-file"
    hide_home = next(m for m in p.mounts if m.path == HOME)
    assert hide_home.perms == "0111"  # traversable so the carve-out is reachable
    assert ("remount-ro", HOME) in ops(p)
    assert ops(p)[-2:] == [("remount-ro", HOME), ("remount-ro", PRIV)]


def test_only_a_carved_hidden_dir_is_remounted_read_only() -> None:  # F-SET-4
    # An uncarved one is mounted read-only at once (bwrap: an empty read-only
    # directory); a carved one is a tmpfs that takes the carve-outs' mount points
    # first, so it must be made read-only after them.
    p = plan(
        {"/home/u/.ssh/id": "file", "/data/pub/x": "file"},
        deny_read=("~/.ssh", "/data"),
        allow_read=("/data/pub",),
    )
    perms = {m.path: m.perms for m in p.mounts if m.op == "hide-dir"}
    assert perms["/home/u/.ssh"] == "0000" and perms["/data"] == "0111"
    assert ("remount-ro", "/data") in ops(p)
    assert ("remount-ro", "/home/u/.ssh") not in ops(p)


def test_hidden_dir_without_carve_out_is_closed() -> None:
    p = plan({"/home/u/.aws/credentials": "file"}, deny_read=("~/.aws",))
    m = next(m for m in p.mounts if m.path == "/home/u/.aws")
    assert m.perms == "0000" and m.reason == "filesystem.denyRead[0]"


def test_write_only_where_allowed() -> None:  # F-SET-4 write
    p = plan({"/home/u/proj/src/a.py": "file"}, allow_write=(".",))
    assert op_at(p, CWD) == "bind"
    assert p.writable_roots == (CWD,)
    assert op_at(p, HOME) is None  # stays read-only via the base


def test_empty_allow_write_means_no_writes() -> None:
    p = plan({"/home/u/proj/a": "file"})
    assert [m for m in p.mounts if m.op == "bind"] == [m for m in p.mounts if m.path == TMP]


@pytest.mark.parametrize(
    ("deny_write", "allow_write", "path"),
    [
        (("./build",), (".",), "/home/u/proj/build"),  # deny inside allow
        ((".",), ("./out",), "/home/u/proj/out"),  # allow inside deny: deny still wins
    ],
)
def test_deny_write_beats_allow_write(
    deny_write: tuple[str, ...], allow_write: tuple[str, ...], path: str
) -> None:  # F-SET-4
    p = plan(
        {"/home/u/proj/build/x": "file", "/home/u/proj/out/y": "file"},
        deny_write=deny_write,
        allow_write=allow_write,
    )
    assert op_at(p, path) in (None, "ro-bind")
    assert all(not (m.op == "bind" and m.path == path) for m in p.mounts)


def test_mandatory_names_in_writable_root() -> None:  # F-SET-5
    entries = {
        "/home/u/proj/.bashrc": "file",
        "/home/u/proj/.git/hooks/pre-commit": "file",
        "/home/u/proj/.git/config": "file",
        "/home/u/proj/.git/objects/ab/cdef": "file",
        "/home/u/proj/sub/.git/config": "file",
        "/home/u/proj/sub/.claude/settings.json": "file",
        "/home/u/proj/deep/er/server.key": "file",
        "/home/u/proj/wt/.git": "file",  # a worktree's pointer file
        "/home/u/proj/lib/id_ed25519": "file",
    }
    p = plan(entries, allow_write=(".",))
    for path in (
        "/home/u/proj/.bashrc",
        "/home/u/proj/.git/hooks",
        "/home/u/proj/.git/config",
        "/home/u/proj/sub/.git/config",
        "/home/u/proj/sub/.claude",
        "/home/u/proj/deep/er/server.key",
        "/home/u/proj/wt/.git",
        "/home/u/proj/lib/id_ed25519",
    ):
        assert op_at(p, path) == "ro-bind", (path, ops(p))
    # the nested repo lacks hooks: without the supervisor nothing could keep the name
    # unmade, so the plan says so (the caller refuses it, F-BE-5)...
    assert "/home/u/proj/sub/.git/hooks" in p.unpinned
    assert "**/.env" in p.unpinned and "**/.git/hooks/" in p.unpinned
    # ...and with it there is nothing to pin, and nothing is mounted for missing names
    sp = plan(entries, allow_write=(".",), supervised=True)
    assert sp.unpinned == ()
    assert ops(sp) == ops(p)
    assert all(op_at(sp, f"/home/u/proj/{n}") is None for n in mandatory.PROJECT_FILES)


def test_mercurial_config_in_writable_root() -> None:  # F-SET-5
    """hg reads .hg/hgrc and .hg/hgrc-not-shared as config and follows .hg/sharedpath
    to another repository's: read-only in every .hg, at any depth (an mq queue is a
    repository in .hg/patches); hg's data around them stays writable."""
    entries = {
        "/home/u/proj/.hg/hgrc": "file",
        "/home/u/proj/.hg/requires": "file",
        "/home/u/proj/.hg/store/data/a.i": "file",
        "/home/u/proj/.hg/patches/.hg/hgrc": "file",
        "/home/u/proj/share/.hg/sharedpath": "file",
        "/home/u/proj/share/.hg/hgrc-not-shared": "file",
        "/home/u/proj/odd/.hg/x/hgrc": "file",
        "/home/u/proj/linked/.hg": "-> ../elsewhere",  # hg follows it
        "/home/u/proj/elsewhere/hgrc": "file",
        "/home/u/proj/plain/hgrc": "file",  # no repository's
        "/home/u/proj/bare/.hg/requires": "file",  # hg init's: no config yet
    }
    read_only = (
        "/home/u/proj/.hg/hgrc",
        "/home/u/proj/.hg/patches/.hg/hgrc",
        "/home/u/proj/share/.hg/sharedpath",
        "/home/u/proj/share/.hg/hgrc-not-shared",
        "/home/u/proj/odd/.hg/x/hgrc",
        "/home/u/proj/elsewhere",  # a .hg symlink's target, as a .git symlink's
    )
    writable = ("/home/u/proj/.hg/requires", "/home/u/proj/.hg/store", "/home/u/proj/plain")
    p = _repository_plan(entries, read_only, writable)
    reasons = {m.path: m.reason for m in p.mounts}
    assert reasons["/home/u/proj/.hg/patches/.hg/hgrc"] == "mandatory: .hg/hgrc"
    assert reasons["/home/u/proj/odd/.hg/x/hgrc"] == "mandatory: .hg/x/hgrc"
    # rename guard: `mv .hg .hg-old` would free the name
    assert reasons["/home/u/proj/.hg"].startswith("rename guard")
    # names that do not exist yet: the supervisor's, or the launch is refused (F-BE-5)
    assert {"/home/u/proj/bare/.hg/hgrc", "/home/u/proj/bare/.hg/sharedpath"} <= set(p.unpinned)
    assert {f"**/.hg/{n}" for n in mandatory.HG_PROTECTED} <= set(p.unpinned)


def _repository_plan(
    entries: dict[str, str], read_only: tuple[str, ...], writable: tuple[str, ...]
) -> FsPlan:
    """The plan for a writable project holding ``entries``: ``read_only`` bound so, the
    ``writable`` paths left as they are; the same mounts with the supervisor, which
    keeps the names not there yet unmade (the plan without it lists them)."""
    p = plan(entries, allow_write=(".",))
    for path in read_only:
        assert op_at(p, path) == "ro-bind", (path, ops(p))
    for path in writable:
        assert op_at(p, path) is None, (path, ops(p))
    sp = plan(entries, allow_write=(".",), supervised=True)
    assert sp.unpinned == () and ops(sp) == ops(p)
    return p


def test_jujutsu_config_in_writable_root() -> None:  # F-SET-5
    """jj reads .jj/repo/config.toml and .jj/workspace-config.toml as config (before
    0.38; later ones migrate them), follows .jj/repo/config-id and
    .jj/workspace-config-id to the config it keeps in the user's config directory, a
    secondary workspace's .jj/repo *file* to another repository, and
    .jj/repo/store/git_target to the git repository its backend runs git in:
    read-only in every .jj, at any depth; jj's data around them stays writable."""
    entries = {
        "/home/u/proj/.jj/repo/config.toml": "file",
        "/home/u/proj/.jj/repo/config-id": "file",
        "/home/u/proj/.jj/workspace-config.toml": "file",
        "/home/u/proj/.jj/workspace-config-id": "file",
        "/home/u/proj/.jj/repo/store/git_target": "file",
        "/home/u/proj/.jj/repo/store/type": "file",
        "/home/u/proj/.jj/repo/store/extra/ab12": "file",
        "/home/u/proj/.jj/repo/op_store/operations/cd34": "file",
        "/home/u/proj/.jj/working_copy/tree_state": "file",
        # the git backend's own repository: bare, protected as every bare one is
        "/home/u/proj/.jj/repo/store/git/HEAD": "file",
        "/home/u/proj/.jj/repo/store/git/config": "file",
        "/home/u/proj/.jj/repo/store/git/hooks/pre-push.sample": "file",
        "/home/u/proj/.jj/repo/store/git/objects/pack/p.pack": "file",
        "/home/u/proj/.jj/repo/store/git/refs/heads/main": "file",
        "/home/u/proj/ws/.jj/repo": "file",  # jj workspace add: a path to proj's
        "/home/u/proj/ws/.jj/working_copy/tree_state": "file",
        "/home/u/proj/migrated/.jj/repo/config.toml": "-> ../../../cfg/config.toml",
        "/home/u/proj/cfg/config.toml": "file",
        "/home/u/proj/linked/.jj": "-> ../elsewhere",  # jj follows it
        "/home/u/proj/elsewhere/repo/config.toml": "file",
        "/home/u/proj/plain/config.toml": "file",  # no repository's
        "/home/u/proj/plain/repo": "file",
        "/home/u/proj/fresh/.jj/repo/store/type": "file",  # jj git init's: no config
    }
    read_only = (
        "/home/u/proj/.jj/repo/config.toml",
        "/home/u/proj/.jj/repo/config-id",
        "/home/u/proj/.jj/workspace-config.toml",
        "/home/u/proj/.jj/workspace-config-id",
        "/home/u/proj/.jj/repo/store/git_target",
        "/home/u/proj/.jj/repo/store/git/config",
        "/home/u/proj/.jj/repo/store/git/hooks",
        "/home/u/proj/ws/.jj/repo",
        "/home/u/proj/cfg/config.toml",  # a migrated legacy file's target
        "/home/u/proj/elsewhere",  # a .jj symlink's target, as a .hg symlink's
    )
    writable = (
        "/home/u/proj/.jj/repo/store/type",
        "/home/u/proj/.jj/repo/store/extra",
        "/home/u/proj/.jj/repo/op_store",
        "/home/u/proj/.jj/working_copy",
        "/home/u/proj/ws/.jj/working_copy",
        "/home/u/proj/plain",
    )
    p = _repository_plan(entries, read_only, writable)
    reasons = {m.path: m.reason for m in p.mounts}
    assert reasons["/home/u/proj/.jj/repo/config-id"] == "mandatory: .jj/repo/config-id"
    assert reasons["/home/u/proj/ws/.jj/repo"] == "mandatory: .jj/repo"
    # rename guards: `mv .jj .jj-old` or `mv .jj/repo x` would free the names
    assert reasons["/home/u/proj/.jj"].startswith("rename guard")
    assert reasons["/home/u/proj/.jj/repo"].startswith("rename guard")
    # names that do not exist yet: the supervisor's, or the launch is refused (F-BE-5)
    fresh = {f"/home/u/proj/fresh/.jj/{n}" for n in mandatory.JJ_CONFIG_PATHS}
    assert fresh <= set(p.unpinned)
    assert {f"**/.jj/{n}" for n in mandatory.JJ_CONFIG_PATHS} <= set(p.unpinned)


def test_home_stays_in_place_when_writable() -> None:  # F-SET-5
    p = plan({"/home/u/.bashrc": "file"}, allow_write=("/home",), supervised=True)
    assert op_at(p, "/home/u/.bashrc") == "ro-bind"
    assert op_at(p, "/home/u") == "bind"  # rename guard: ~ cannot be moved aside
    assert p.unpinned == ()


def test_rename_guards_keep_protected_names_in_place() -> None:
    p = plan(
        {"/home/u/proj/sub/.git/config": "file", "/home/u/proj/sub/.git/hooks": "dir"},
        allow_write=(".",),
    )
    # sub and sub/.git become mount points so `mv sub x` or `mv .git y` fail with EBUSY
    assert op_at(p, "/home/u/proj/sub") == "bind"
    assert op_at(p, "/home/u/proj/sub/.git") == "bind"
    guard = next(m for m in p.mounts if m.path == "/home/u/proj/sub")
    assert guard.reason.startswith("rename guard")
    order = [m.path for m in p.mounts]
    assert order.index("/home/u/proj/sub") < order.index("/home/u/proj/sub/.git")
    assert order.index("/home/u/proj/sub/.git") < order.index("/home/u/proj/sub/.git/config")


@pytest.mark.parametrize(
    ("deny", "hidden", "guarded"),
    [
        ("./config/secrets.json", "/home/u/proj/config/secrets.json", ("proj", "proj/config")),
        ("./config/*.json", "/home/u/proj/config/secrets.json", ("proj", "proj/config")),
        # .docker is a dot entry of the writable home: read-only, a mount point itself
        ("~/.docker/config.json", "/home/u/.docker/config.json", ()),
        ("~/.docker", "/home/u/.docker", ()),  # a mount point itself, in the root
    ],
)
def test_rename_guards_keep_read_denied_names_in_place(
    deny: str, hidden: str, guarded: tuple[str, ...]
) -> None:
    """Moved with its directory, a covered name would be found under no rule by the next
    launch: every writable ancestor of a read-denied name is a mount point."""
    entries = {"/home/u/proj/config/secrets.json": "file", "/home/u/.docker/config.json": "file"}
    p = plan(entries, allow_write=("~",), deny_read=(deny,), supervised=True)
    assert op_at(p, hidden) in ("hide-file", "hide-dir")
    guards = {m.path for m in p.mounts if m.reason.startswith("rename guard")}
    assert guards == {f"/home/u/{g}" for g in guarded}, ops(p)
    assert all(op_at(p, g) == "bind" for g in guards)
    # a read-denied name with nothing writable around it needs no guard
    ro = plan(entries, deny_read=(deny,))
    assert not [m for m in ro.mounts if m.reason.startswith("rename guard")]


def test_missing_literal_deny_write_is_the_supervisors() -> None:
    p = plan({}, allow_write=(".",), deny_write=("./secrets/prod.key", "./later.txt"))
    assert {"/home/u/proj/secrets/prod.key", "/home/u/proj/later.txt"} <= set(p.unpinned)
    sp = plan({}, allow_write=(".",), deny_write=("./secrets/prod.key",), supervised=True)
    assert sp.unpinned == () and op_at(sp, "/home/u/proj/secrets") is None


def test_deny_outside_writable_roots_needs_no_mount_or_supervisor() -> None:
    p = plan({"/etc/passwd": "file"}, deny_write=("/etc/passwd", "/etc/missing"))
    assert op_at(p, "/etc/passwd") is None
    assert p.unpinned == ()


def test_symlinked_spelling_is_enforced_at_its_target() -> None:  # F-SET-6
    tree = {
        "/home/u/link": "-> /data/secret",
        "/data/secret/k": "file",
        "/home/u/work": "-> /srv/work",
        "/srv/work/f": "file",
    }
    p = plan(tree, deny_read=("~/link",), allow_write=("/srv/work",))
    assert op_at(p, "/data/secret") == "hide-dir"
    assert op_at(p, "/srv/work") == "bind"
    assert p.writable_roots == ("/srv/work",)
    # a write entry through a link in the home directory, which a sandbox may have
    # left there, must name the target instead
    with pytest.raises(UnenforceablePolicy, match="is a symlink to /srv/work"):
        plan(tree, allow_write=("~/work",))


def test_symlinked_mandatory_name_protects_target_and_says_name_is_not_pinned() -> None:
    p = plan(
        {"/home/u/.bashrc": "-> dotfiles/bashrc", "/home/u/dotfiles/bashrc": "file"},
        allow_write=("~",),
    )
    assert op_at(p, "/home/u/dotfiles/bashrc") == "ro-bind"
    assert "/home/u/.bashrc" in p.unpinned
    assert any("symlink" in n for n in p.notes)


@pytest.mark.parametrize(
    ("pattern", "hidden", "visible"),
    [
        ("/data/**/*.pem", ["/data/a/b.pem", "/data/c.pem", "/data/.x.pem"], ["/data/x.txt"]),
        ("/data/*.pem", ["/data/c.pem"], ["/data/a/b.pem"]),
        ("/data/**", ["/data/a", "/data/c.pem"], []),
        ("/data/[ab]*", ["/data/a"], ["/data/c.pem"]),
        ("/data/?.pem", ["/data/c.pem"], ["/data/.x.pem"]),
    ],
)
def test_globs_expand_against_what_exists(
    pattern: str, hidden: list[str], visible: list[str]
) -> None:
    p = plan(
        {
            "/data/a/b.pem": "file",
            "/data/c.pem": "file",
            "/data/.x.pem": "file",
            "/data/x.txt": "file",
        },
        deny_read=(pattern,),
    )
    for path in hidden:
        assert op_at(p, path) in ("hide-file", "hide-dir") or any(
            m.op == "hide-dir" and path.startswith(m.path + "/") for m in p.mounts
        ), (path, ops(p))
    for path in visible:
        assert op_at(p, path) is None, (path, ops(p))


@pytest.mark.parametrize("pattern", ["/srv/g/a[!_]b", "/srv/g/a[+-9]b", "/srv/g/a?b"])
def test_a_glob_class_never_reaches_into_a_directory(pattern: str) -> None:
    """A class is one character of a name: ``a[!_]b`` names ``a.b``, never ``a/b``."""
    p = plan({"/srv/g/a/b": "file", "/srv/g/a.b": "file"}, allow_write=(pattern,))
    assert p.writable_roots == ("/srv/g/a.b",)
    assert op_at(p, "/srv/g/a/b") is None and op_at(p, "/srv/g/a") is None


def test_relative_glob_is_relative_to_cwd() -> None:
    p = plan({"/home/u/proj/a/.env": "file", "/home/u/other/.env": "file"}, deny_read=("**/.env",))
    assert op_at(p, "/home/u/proj/a/.env") == "hide-file"
    assert op_at(p, "/home/u/other/.env") is None


def test_read_denied_file_with_other_hard_links_is_refused() -> None:
    with pytest.raises(UnenforceablePolicy, match="hard links"):
        plan(
            {"/home/u/.ssh/id_rsa": "file", "/home/u/copy": "file"},
            links=(("/home/u/.ssh/id_rsa", "/home/u/copy"),),
            deny_read=("~/.ssh/id_rsa",),
        )


def test_hard_link_twins_of_protected_files_are_protected() -> None:
    p = plan(
        {"/home/u/proj/.git/config": "file", "/home/u/proj/innocent": "file"},
        links=(("/home/u/proj/.git/config", "/home/u/proj/innocent"),),
        allow_write=(".",),
    )
    assert op_at(p, "/home/u/proj/innocent") == "ro-bind"


def test_unpinned_names_are_reported_only_with_writable_roots() -> None:
    assert plan({}, deny_write=("**/*.lock",)).unpinned == ()
    p = plan({"/home/u/proj/a.lock": "file"}, allow_write=(".",), deny_write=("**/*.lock",))
    assert any(u.startswith("**/*.lock") for u in p.unpinned)
    assert "**/.env" in p.unpinned and "**/.git/hooks/" in p.unpinned
    assert op_at(p, "/home/u/proj/a.lock") == "ro-bind"


def test_private_trees_are_left_alone() -> None:
    p = plan({"/dev/shm": "dir"}, allow_write=("/dev/shm",), deny_read=("/proc/1",))
    assert all(not m.path.startswith(("/dev", "/proc")) for m in p.mounts)
    assert any("private tree" in n for n in p.notes)


def test_missing_allow_write_is_a_note_not_a_mount() -> None:
    p = plan({}, allow_write=("./nope",))
    assert p.writable_roots == ()
    assert any("does not exist" in n for n in p.notes)


def test_mounts_apply_parents_first() -> None:
    p = plan(
        {"/home/u/proj/x/y/.bashrc": "file"},
        allow_write=("~",),
        deny_read=("~/proj/x",),
        allow_read=("~/proj/x/y",),
    )
    seen: list[str] = []
    for m in p.mounts:
        if m.op == "remount-ro":
            continue
        for earlier in seen:
            assert not earlier.startswith(m.path + "/"), (m.path, "after", earlier)
        seen.append(m.path)


def test_allow_credential_write_leaves_existing_credential_names_writable() -> None:
    entries = {
        "/home/u/proj/.venv/lib/certifi/cacert.pem": "file",
        "/home/u/proj/web/node_modules/forge/test.key": "file",
        "/home/u/proj/server.pem": "file",
        "/home/u/proj/.venv/.gitmodules": "file",
    }
    p = plan(entries, allow_write=(".",), supervised=True)
    for path in entries:
        assert op_at(p, path) == "ro-bind", path
    p = plan(
        entries,
        allow_write=(".",),
        supervised=True,
        credential_exempt=("./.venv", "**/node_modules"),
    )
    assert op_at(p, "/home/u/proj/.venv/lib/certifi/cacert.pem") is None
    assert op_at(p, "/home/u/proj/web/node_modules/forge/test.key") is None
    assert op_at(p, "/home/u/proj/server.pem") == "ro-bind"  # not below an exemption
    assert op_at(p, "/home/u/proj/.venv/.gitmodules") == "ro-bind"  # mandatory: stays


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("/home/u/proj/.venv/lib/site", "ro-bind"),  # sandhold in the project's venv
        ("/home/u/proj/src/sandhold", "ro-bind"),  # run from a checkout being worked on
        ("/usr/lib/python3", None),  # outside every writable root: read-only already
        ("/home/u/proj/missing", None),  # nothing there: nothing to bind
    ],
)
def test_own_code_is_read_only_inside_a_writable_root(code: str, expected: str | None) -> None:
    """Code sandhold loads (the supervisor inside, this process after the run) must not
    be editable from the sandbox: a plant there runs with sandhold's rights."""
    tree = {"/home/u/proj/.venv/lib/site": "dir", "/home/u/proj/src/sandhold": "dir"}
    p = plan(tree, allow_write=(".",), extra_read_only=((code, "sandhold: its own code"),))
    assert op_at(p, code) == expected
    assert op_at(p, CWD) == "bind"


@pytest.mark.parametrize("code", [CWD, HOME])
def test_own_code_holding_a_writable_root_stops_the_launch(code: str) -> None:
    """Making it read-only would take the writable root with it: refused, loudly."""
    with pytest.raises(UnenforceablePolicy, match="holds a writable root"):
        plan({}, allow_write=(".",), extra_read_only=((code, "sandhold: its own code"),))


GIT = "/home/u/proj/.git"


def test_git_dirs_of_submodules_and_worktrees_are_protected_at_any_depth() -> None:
    """git runs a submodule's hooks and reads its config as it does the top ones."""
    tree = {
        f"{GIT}/config": "file",
        f"{GIT}/hooks": "dir",
        f"{GIT}/modules/sub/HEAD": "file",  # a git dir: its objects/refs/logs are skipped
        f"{GIT}/modules/sub/config": "file",
        f"{GIT}/modules/sub/hooks/pre-commit.sample": "file",
        f"{GIT}/modules/sub/objects/ab/config": "file",  # an object store holds no config
        f"{GIT}/modules/a/modules/b/config": "file",
        f"{GIT}/worktrees/w/commondir": "file",
        f"{GIT}/worktrees/w/config.worktree": "file",
        f"{GIT}/worktrees/w/HEAD": "file",
        f"{GIT}/refs/heads/config": "file",
        f"{GIT}/config.worktree": "file",  # read once extensions.worktreeConfig is on
        f"{GIT}/modules/logs/HEAD": "file",  # a submodule named like a git dir's own
        f"{GIT}/modules/logs/config": "file",
        f"{GIT}/modules/logs/hooks/pre-commit": "file",
        f"{GIT}/worktrees/objects/commondir": "file",
    }
    p = plan(tree, allow_write=(".",), supervised=True)
    protected = {m.path for m in p.mounts if m.op == "ro-bind"}
    for rel in (
        "config",
        "hooks",
        "modules/sub/config",
        "modules/sub/hooks",
        "modules/a/modules/b/config",
        "worktrees/w/commondir",
        "worktrees/w/config.worktree",
        "config.worktree",
        "modules/logs/config",
        "modules/logs/hooks",
        "worktrees/objects/commondir",
    ):
        assert f"{GIT}/{rel}" in protected, rel
    for rel in ("modules/sub/objects/ab/config", "worktrees/w/HEAD", "refs/heads/config"):
        assert f"{GIT}/{rel}" not in protected, rel


def test_a_directory_that_cannot_be_listed_is_kept_read_only_whole() -> None:
    """Its owner may chmod it inside the sandbox and reach the protected names in it."""
    host = FakeHost({PRIV: "dir", TMP: "dir", CWD: "dir", f"{CWD}/hidden": "dir"})
    host.locked.add(f"{CWD}/hidden")
    req = FsRequest(cwd=CWD, home=HOME, tmpdir=TMP, private_root=PRIV, allow_write=(".",))
    p = plan_filesystem(req, host)
    assert op_at(p, f"{CWD}/hidden") == "ro-bind"


@pytest.mark.parametrize(
    ("entry", "refused"),
    [
        ("./build", True),  # build -> ~, left by an earlier sandbox
        ("./build/sub", True),
        ("~/link", True),  # in the home directory: ~/.cache/pip -> .. is the same trick
        ("./buil[d]", True),  # a glob matching the link
        ("./build*", True),
        ("./build/**", True),  # a glob below it
        ("/home/u/real", False),  # the target named itself
        ("./out", False),
    ],
)
def test_a_symlink_on_the_way_to_a_write_entry_is_refused(entry: str, refused: bool) -> None:
    tree = {
        "/home/u/proj/build": "-> /home/u",
        "/home/u/link": "-> /home/u/real",
        "/home/u/real": "dir",
        "/home/u/proj/out": "dir",
    }
    if refused:
        with pytest.raises(UnenforceablePolicy, match="is a symlink to"):
            plan(tree, allow_write=(entry,))
    else:
        assert plan(tree, allow_write=(entry,)).writable_roots


def test_hard_links_to_own_code_elsewhere_in_a_writable_root_are_protected() -> None:
    """uv hard-links installed files from its cache: editing the cache's name would
    edit the code sandhold runs next."""
    site = "/home/u/proj/.venv/lib/site"
    tree = {f"{site}/x.pth": "file", "/home/u/proj/cache/x": "file", f"{site}/ok.py": "file"}
    p = plan(
        tree,
        links=((f"{site}/x.pth", "/home/u/proj/cache/x"),),
        allow_write=(".",),
        extra_read_only=((site, "sandhold: its own code"),),
    )
    assert op_at(p, site) == "ro-bind"
    assert op_at(p, "/home/u/proj/cache/x") == "ro-bind"


@pytest.mark.parametrize("home", ["/home/u", "/home//u", "/home/u/.", "/home/./u"])
def test_a_planted_link_is_found_whatever_the_spelling_of_home(home: str) -> None:
    host = FakeHost({PRIV: "dir", TMP: "dir", CWD: "dir", "/home/u/.cache/pip": "-> .."})
    req = FsRequest(
        cwd=CWD, home=home, tmpdir=TMP, private_root=PRIV, allow_write=("~/.cache/pip",)
    )
    with pytest.raises(UnenforceablePolicy, match="is a symlink"):
        plan_filesystem(req, host)


def test_a_planted_link_is_found_through_a_symlinked_ancestor_of_the_cwd() -> None:
    """The entry spells the cwd through /L -> /home/u, the cwd itself is physical."""
    host = FakeHost(
        {PRIV: "dir", TMP: "dir", CWD: "dir", "/L": "-> /home/u", f"{CWD}/build": "-> /srv/x"}
    )
    req = FsRequest(
        cwd=CWD, home=HOME, tmpdir=TMP, private_root=PRIV, allow_write=("/L/proj/build",)
    )
    with pytest.raises(UnenforceablePolicy, match="is a symlink"):
        plan_filesystem(req, host)


def test_an_existing_bare_repository_has_its_config_and_hooks_protected() -> None:
    """A local bare repository (a remote to push to) runs its hooks on a push."""
    bare = "/home/u/proj/remote.git"
    tree = {
        f"{bare}/HEAD": "file",
        f"{bare}/config": "file",
        f"{bare}/hooks/post-receive.sample": "file",
        f"{bare}/objects/pack": "dir",
        f"{bare}/refs/heads": "dir",
        "/home/u/proj/notbare/HEAD": "file",  # a file named HEAD alone is nothing
        "/home/u/proj/notbare/config": "file",
    }
    p = plan(tree, allow_write=(".",), supervised=True)
    assert op_at(p, f"{bare}/config") == "ro-bind" and op_at(p, f"{bare}/hooks") == "ro-bind"
    assert op_at(p, "/home/u/proj/notbare/config") is None
    # what makes git take it for a repository stays: HEAD read-only, objects/ and
    # refs/ writable but mount points (no run can rename them away for the next)
    assert op_at(p, f"{bare}/HEAD") == "ro-bind"
    assert op_at(p, f"{bare}/objects") == op_at(p, f"{bare}/refs") == "bind"
    # the supervisor knows hooks, commondir ... only below a .git: a bare
    # repository's missing ones are refused by path
    unmade = {path for path, _ in p.unmade}
    assert {f"{bare}/commondir", f"{bare}/config.worktree"} <= unmade
    assert f"{bare}/hooks" not in unmade  # it exists: read-only
    no_hooks = {k: v for k, v in tree.items() if "/hooks/" not in k}
    p = plan(no_hooks, allow_write=(".",), supervised=True)
    assert f"{bare}/hooks" in {path for path, _ in p.unmade}


@pytest.mark.parametrize(
    ("names", "bare"),
    [
        (("HEAD", "objects/", "refs/"), True),
        (("HEAD", "objects/", "refs/", ".git/"), False),  # a work tree
        # one an earlier run broke (HEAD renamed away): its config and hooks tell
        (("config", "hooks/", "objects/", "refs/", "HEAD.bak"), True),
        (("config", "hooks/", "packed-refs"), True),
        (("config", "hooks/", "HEAD"), True),
        (("config", "hooks/"), False),  # a project's config file and hooks directory
        (("config", "objects/", "refs/"), False),
        (("HEAD", "objects/"), False),
        # as the supervisor judges one (creation.git_directory): no objects needed
        # (GIT_OBJECT_DIRECTORY stands in), refs of any kind, or a commondir
        (("HEAD", "refs/", "config"), True),
        (("HEAD", "refs", "config"), True),
        (("HEAD", "commondir", "config"), True),
    ],
)
def test_what_counts_as_a_bare_repository(names: tuple[str, ...], bare: bool) -> None:
    at = "/home/u/proj/r"
    tree = {f"{at}/{n.rstrip('/')}": "dir" if n.endswith("/") else "file" for n in names}
    p = plan(tree, allow_write=(".",), supervised=True)
    assert (op_at(p, f"{at}/config") == "ro-bind") is (bare and "config" in names), ops(p)
    protected = {m.path for m in p.mounts if m.op == "ro-bind"}
    assert bool(protected & {f"{at}/config", f"{at}/hooks", f"{at}/HEAD"}) is bare, ops(p)


def _plan_locked(entries: dict[str, str], locked: tuple[str, ...], **rules: object) -> FsPlan:
    host = FakeHost({PRIV: "dir", TMP: "dir", CWD: "dir", **entries})
    host.locked.update(locked)
    req = FsRequest(cwd=CWD, home=HOME, tmpdir=TMP, private_root=PRIV, **rules)  # type: ignore[arg-type]
    return plan_filesystem(req, host)


@pytest.mark.parametrize(
    ("deny", "locked", "rules", "hidden"),
    [
        # chmod 0311 cfg: .env in it opens by name, though the walk cannot list it
        ("**/.env", f"{CWD}/cfg", {"allow_write": (".",)}, True),
        ("**/.env", f"{CWD}/cfg", {}, True),
        ("~/**/.env", f"{CWD}/cfg", {"allow_write": (".",)}, True),
        # a root-owned 0700 cache directory in a user's home: hidden, nothing else
        ("~/**/.env", "/home/u/.cache/x", {"allow_read": ("~",)}, True),
        ("~/.cache/**", "/home/u/.cache/x", {}, True),
        # no match can lie below it: left alone
        ("~/*.pem", "/home/u/.cache/x", {}, False),
        ("~/proj/*/.env", "/home/u/proj/a/b", {}, False),
        # sandhold's own data is handled apart
        ("/tmp/**/.env", f"{PRIV}/other", {}, False),
    ],
)
def test_a_deny_read_glob_hides_a_directory_it_cannot_list(
    deny: str, locked: str, rules: dict[str, tuple[str, ...]], hidden: bool
) -> None:
    p = _plan_locked(
        {f"{locked}/.env": "file", f"{CWD}/.env": "file"}, (locked,), deny_read=(deny,), **rules
    )
    m = next((m for m in p.mounts if m.path == locked and m.op != "remount-ro"), None)
    if hidden:
        assert m is not None and m.op == "hide-dir" and m.perms == "0000", ops(p)
        unchecked = "filesystem.denyRead[0]: unreadable at launch: its names were not checked"
        assert m.reason in (unchecked, "filesystem.denyRead[0]")  # the latter: a match itself
    else:
        assert m is None or m.op != "hide-dir", ops(p)


@pytest.mark.parametrize(
    ("deny", "locked", "rules", "kept"),
    [
        ("**/.env", CWD, {"allow_write": (".",)}, "the working directory"),  # chmod 0311 .
        ("**/.env", CWD, {}, "the working directory"),
        ("~/**/.env", "/home/u", {}, "the working directory"),
        ("/srv/**/.env", "/srv/a", {"allow_write": ("/srv/a/b",)}, "filesystem.allowWrite[0]"),
        ("/srv/**/.env", "/srv/a", {"allow_read": ("/srv/a",)}, "filesystem.allowRead[0]"),
        ("/tmp/**/.env", "/tmp", {}, "sandhold: this session's TMPDIR"),
    ],
)
def test_an_unlistable_directory_that_cannot_be_hidden_stops_the_launch(
    deny: str, locked: str, rules: dict[str, tuple[str, ...]], kept: str
) -> None:
    """Hiding it would hide what the policy lets the sandbox use: fail, and say why."""
    with pytest.raises(UnenforceablePolicy, match=f"{locked} cannot be listed") as e:
        _plan_locked({"/srv/a/b/.env": "file"}, (locked,), deny_read=(deny,), **rules)
    assert f"({kept})" in str(e.value) and f"chmod u+rx {locked}" in str(e.value)


def test_a_deny_write_glob_reaches_a_writable_root_below_an_unlistable_directory() -> None:
    """~/a is 0311: the glob's walk from ~ cannot see ~/a/proj, a writable root."""
    tree = {"/home/u/a/proj/x.secret": "file", "/home/u/a/proj/sub/y.secret": "file"}
    p = _plan_locked(tree, ("/home/u/a",), allow_write=("~/a/proj",), deny_write=("~/**/*.secret",))
    assert op_at(p, "/home/u/a/proj") == "bind"
    assert op_at(p, "/home/u/a/proj/x.secret") == "ro-bind"
    assert op_at(p, "/home/u/a/proj/sub/y.secret") == "ro-bind"
    # the root itself matches: it stays read-only whole
    p = _plan_locked(tree, ("/home/u/a",), allow_write=("~/a/proj",), deny_write=("~/*/proj",))
    assert p.writable_roots == () and op_at(p, "/home/u/a/proj") is None
    # ...or a directory between the unlistable one and the root does
    tree = {"/home/u/a/x/proj/f": "file"}
    p = _plan_locked(tree, ("/home/u/a",), allow_write=("~/a/x/proj",), deny_write=("~/a/*",))
    assert p.writable_roots == ()


@pytest.mark.parametrize(
    ("allow_write", "refused"),
    [
        # run 1 could write /tmp/ruw and left out -> ~/.local/bin there
        (("/tmp/ruw", "/tmp/ruw/out"), True),
        (("/tmp/ruw/out", "/tmp/ruw"), True),  # whatever the order of the entries
        ((".", "/tmp/ruw", "/tmp/ruw/out/**"), True),
        (("/tmp/ruw", "/tmp/ruw/o[u]t"), True),
        (("/tmp/ruw/out",), False),  # the link lies in no writable root
        (("/tmp/ruw", "/home/u/.local/bin"), False),  # the target named itself
    ],
)
def test_a_symlink_in_any_writable_root_on_the_way_to_a_write_entry_is_refused(
    allow_write: tuple[str, ...], refused: bool
) -> None:
    tree = {"/tmp/ruw/out": "-> /home/u/.local/bin", "/home/u/.local/bin/x": "file"}
    if refused:
        with pytest.raises(UnenforceablePolicy, match="/tmp/ruw/out is a symlink to"):
            plan(tree, allow_write=allow_write)
    else:
        assert plan(tree, allow_write=allow_write).writable_roots


@pytest.mark.parametrize(
    ("cwd", "home", "own", "links"),
    [
        ("/home/u/p[1]", HOME, (), ()),
        (CWD, "/home/u*", (), ()),
        (CWD, HOME, ("/opt/v?/lib",), ()),
        # spelled plainly, resolved through a symlink to such a name
        (CWD, "/home/hl", (), (("/home/hl", "/home/u[1]"),)),
        (CWD, HOME, (), ((f"{CWD}/secret", "/data/s[1]"),)),
    ],
)
def test_a_base_spelled_like_a_glob_stops_the_launch(
    cwd: str, home: str, own: tuple[str, ...], links: tuple[tuple[str, str], ...]
) -> None:
    """./x under a working directory named p[1] would be the pattern p[1]/x, which names
    p1/x and misses p[1]/x: a deny rule would protect nothing. Refused instead."""
    entries = {PRIV: "dir", TMP: "dir", cwd: "dir", f"{cwd}/secret": "file"}
    entries.update({link: f"-> {target}" for link, target in links})
    entries.update({target: "dir" for _, target in links})
    host = FakeHost(entries)
    req = FsRequest(
        cwd=cwd,
        home=home,
        tmpdir=TMP,
        private_root=PRIV,
        allow_write=(".",),
        deny_write=("./secret",),
        extra_read_only=tuple((p, "sandhold: its own code") for p in own),
    )
    with pytest.raises(UnenforceablePolicy) as err:
        plan_filesystem(req, host)
    assert "glob characters" in str(err.value)


def test_work_trees_are_the_repositories_a_root_lies_in() -> None:
    """git's, hg's and jj's: the supervisor refuses a repository made inside them,
    even where a denyRead hides them from the sandbox."""
    host = FakeHost(
        {
            "/w/jj/.jj/repo/store/type": "file",
            "/w/jj/svc/src": "dir",
            "/w/hg/.hg/requires": "file",
            "/w/plain/src": "dir",
        }
    )
    roots = ("/w/jj/svc/src", "/w/hg", "/w/plain/src")
    assert work_trees(roots, host) == ("/w/hg", "/w/jj")


@pytest.mark.parametrize(
    ("roots", "entry", "kept"),
    [
        (("/h",), "/h/.ssh", True),  # a writable home
        (("/",), "/h/.ssh", True),
        (("/h/proj",), "/h/.ssh", False),  # read-only anyway
        # named by the user below it: the rest stays read-only (the root on top)
        (("/h", "/h/.ssh/keys"), "/h/.ssh", True),
        (("/h", "/h/.local/bin"), "/h/.local/bin", False),  # ... or at it
        (("/h/.local",), "/h/.local/bin", False),  # a root of its own, not the home
        # a project's own directory on $PATH: the project's to write
        (("/h", "/h/proj"), "/h/proj/node_modules/.bin", False),
        (("/h/proj",), "/h/proj/node_modules/.bin", False),
    ],
)
def test_what_a_writable_home_keeps(roots: tuple[str, ...], entry: str, kept: bool) -> None:
    from sandhold.policy.fsplan import ungranted

    got = ungranted([(entry, "home: x")], roots, "/h", lambda p: p)
    assert bool(got) is kept
    # what the supervisor gets leaves out a place with a root inside: its rules cannot
    # except the root, and the place's mount refuses the rest
    inside = any(r != entry and r.startswith(entry + "/") for r in roots)
    narrow = ungranted([(entry, "home: x")], roots, "/h", lambda p: p, around_roots=False)
    assert bool(narrow) is (kept and not inside)


def test_a_root_named_inside_a_home_place_is_writable_on_top_of_it() -> None:
    known = "/home/u/.ssh/known_hosts"
    tree = {known: "file", "/home/u/.ssh/config": "file"}
    req = FsRequest(
        cwd=CWD,
        home=HOME,
        tmpdir=TMP,
        private_root=PRIV,
        allow_write=("~", "~/.ssh/known_hosts"),
        home_deny_write=(("/home/u/.ssh", "home: ssh"),),
        supervised=True,
    )
    p = plan_filesystem(req, FakeHost({PRIV: "dir", TMP: "dir", CWD: "dir", **tree}))
    assert op_at(p, "/home/u/.ssh") == "ro-bind" and op_at(p, known) == "bind"
    assert known in p.writable_roots


def test_a_root_a_deny_covers_is_dropped_as_data() -> None:
    """Code that needs to know a root stayed read-only reads ``dropped_roots``, not the
    note's words."""
    p = plan(
        {f"{CWD}/sub/a.txt": "file", f"{CWD}/other/b.txt": "file"},
        allow_write=("./sub", "./other"),
        deny_write=(".",),
    )
    assert set(p.dropped_roots) == {f"{CWD}/sub", f"{CWD}/other"}
    assert p.writable_roots == ()
    assert plan({f"{CWD}/sub/a.txt": "file"}, allow_write=("./sub",)).dropped_roots == ()


def test_a_rename_guard_is_pinned_whatever_its_reason_says() -> None:
    """The guard of a write-denied name is a read-only mount point even where its
    parent is writable; the guard is known as such, not by its reason's first words."""
    p = plan(
        {f"{CWD}/a/b/secret.txt": "file"},
        allow_write=(".",),
        deny_write=("./a/b/secret.txt",),
    )
    guards = [m for m in p.mounts if m.path in (f"{CWD}/a", f"{CWD}/a/b")]
    assert guards and all(m.reason.startswith("rename guard") for m in guards)
    assert all(m.op in ("bind", "ro-bind") for m in guards)
