"""A run's changes to a repository's git config (issue 15, ``git.allowConfig``).

The decision is a table (``policy.gitchanges``); through the real CLI, as root and
unprivileged: ``git remote add`` and ``push -u`` to a local bare repository are
applied after the run; keys that run programs are refused, named in one line each,
and absent from the host's config, and the host's ``git status`` afterwards runs
nothing planted; without the setting git fails visibly at its lock file (no
"set up to track" having written nothing).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import World
from sandhold.policy import creation
from sandhold.policy.gitchanges import (
    NOT_INERT,
    Change,
    changes,
    decide,
    listed,
    split_key,
    url_problem,
)

PATTERNS = ("remote.*", "branch.*")

DECISIONS: list[tuple[str, tuple[str, ...], str | None]] = [
    # (key, values, None: applied, else the start of the refusal)
    ("remote.o.url", ("/srv/x.git",), None),
    ("remote.o.url", ("https://example.com/x.git",), None),
    ("remote.o.url", ("git@example.com:x.git",), None),
    ("remote.O.pushurl", ("ssh://git@example.com/x",), None),
    ("remote.o.fetch", ("+refs/heads/*:refs/remotes/o/*", "+refs/tags/*:refs/tags/*"), None),
    ("branch.main.remote", ("o",), None),
    ("branch.main.merge", ("refs/heads/main",), None),
    ("branch.feat/x.y.merge", ("refs/heads/feat/x.y",), None),  # dots in a subsection
    ("remote.o.url", (), None),  # unset: git remote remove
    # URLs that run a program
    ("remote.o.url", ("ext::sh -c touch% /tmp/p",), "a <transport>::address"),
    ("remote.o.pushurl", ("fd::3",), "a <transport>::address"),
    ("remote.o.url", ("evil://x/y",), "a evil:// URL runs the remote helper"),
    ("remote.o.url", ("-uhelp",), "a URL starting with '-'"),
    ("remote.o.url", ("ssh://-oProxyCommand=x/y",), "a host starting with '-'"),
    ("branch.main.remote", ("ext::sh",), "a <transport>::address"),
    ("remote.o.url", ("/a\nb",), "a value with a control character"),
    # keys that run or point at programs: refused whatever the patterns say
    ("remote.o.vcs", ("x",), NOT_INERT),
    ("remote.o.uploadpack", ("touch /tmp/p",), NOT_INERT),
    ("remote.o.receivepack", ("touch /tmp/p",), NOT_INERT),
    ("remote.o.proxy", ("http://h",), NOT_INERT),
    ("core.fsmonitor", ("touch /tmp/p",), NOT_INERT),
    ("core.hookspath", ("/tmp",), NOT_INERT),
    ("core.sshcommand", ("touch /tmp/p",), NOT_INERT),
    ("credential.helper", ("!touch /tmp/p",), NOT_INERT),
    ("credential.https://h.helper", ("x",), NOT_INERT),
    ("alias.x", ("!touch /tmp/p",), NOT_INERT),
    ("filter.x.clean", ("touch /tmp/p",), NOT_INERT),
    ("include.path", ("/tmp/c",), NOT_INERT),
    ("includeif.gitdir:/.path", ("/tmp/c",), NOT_INERT),
    ("url.ext::sh.insteadof", ("https://h",), NOT_INERT),
    ("protocol.ext.allow", ("always",), NOT_INERT),
    ("remote.url", ("x",), NOT_INERT),  # remote's keys have a subsection
    ("user.o.name", ("x",), NOT_INERT),
    # inert but not named by a pattern: the setting to add
    (
        "user.name",
        ("me",),
        'git.allowConfig names no pattern for it; to let a run change it, add "user.*"',
    ),
    ("1bad.key", ("x",), NOT_INERT),
    ("nodot", ("x",), "not a key in git's grammar"),
    ("remote.o.9url", ("x",), "not a key in git's grammar"),
]


@pytest.mark.parametrize(("key", "values", "refused"), DECISIONS)
def test_decisions(key: str, values: tuple[str, ...], refused: str | None) -> None:
    d = decide(Change(key, values), PATTERNS)
    if refused is None:
        assert d.applied, d.reason
    else:
        assert not d.applied and d.reason.startswith(refused), d.reason


def test_patterns_select_among_the_inert_keys_only() -> None:
    assert decide(Change("user.name", ("me",)), ("user.name",)).applied
    assert decide(Change("remote.o.url", ("/x",)), ("remote.*.url",)).applied
    assert not decide(Change("remote.o.fetch", ("+a:b",)), ("remote.*.url",)).applied
    assert not decide(Change("core.fsmonitor", ("x",)), ("*",)).applied
    assert decide(Change("Remote.o.URL", ("/x",)), ("remote.*",)).applied  # no case


def test_changes_and_listing() -> None:
    before = listed(b"core.bare\nfalse\0remote.a.url\n/a\0remote.a.fetch\nx\0flag\0")
    assert before[-1] == ("flag", "")
    after = [
        ("core.bare", "false"),
        ("remote.b.url", "/b"),
        ("remote.a.fetch", "x"),
        ("remote.a.fetch", "y"),
        ("flag", ""),
    ]
    assert changes(before, after) == [
        Change("remote.b.url", ("/b",)),
        Change("remote.a.fetch", ("x", "y")),
        Change("remote.a.url", ()),
    ]
    assert split_key("remote.a.b.url") == ("remote", "a.b", "url")
    assert split_key("User.Name") == ("user", None, "name")
    assert url_problem("file:///srv/x") is None


def test_the_lock_of_a_config_copy_may_be_made() -> None:
    policy = creation.creation_policy(
        writable_roots=["/w"], cwd="/w", home="/h", config_copies=["/w/.git/config"]
    )
    assert creation.denied(policy, "/w/.git/config.lock") is None
    assert creation.denied(policy, "/w/.git/config") is not None  # only through the copy
    assert creation.denied(policy, "/w/.git/config.worktree.lock") is not None
    assert creation.denied(policy, "/w/sub/.git/config.lock") is not None


# -- through the real CLI ------------------------------------------------------


def _git(world: World, cwd: Path, *argv: str) -> str:
    r = world.ident.run(["git", *argv], cwd=cwd, env=world.env())
    assert r.returncode == 0, r.stderr
    return r.stdout


def _repo(world: World) -> Path:
    repo = world.mkdir("work/repo")
    _git(world, repo, "init", "-q", "-b", "main")
    _git(
        world,
        repo,
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@e",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "a",
    )
    _git(world, world.work, "init", "-q", "--bare", "bare.git")
    return repo


def _settings(world: World, allow: bool) -> Path:
    bare = str(world.work / "bare.git")  # a local remote, pushed to
    data: dict[str, object] = {"filesystem": {"allowWrite": [".", bare]}}
    if allow:
        data["git"] = {"allowConfig": list(PATTERNS)}
    return world.settings(data)


def test_remote_add_and_push_u_are_applied(world: World) -> None:
    repo = _repo(world)
    s = _settings(world, allow=True)
    script = (
        f"git remote add o {world.work}/bare.git && git push -q -u o main && "
        "git config --get remote.o.url"  # the run reads its own change back
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, cwd=repo)
    assert r.returncode == 0 and r.stdout == f"{world.work}/bare.git\n", r.stderr
    config = f"{repo}/.git/config"
    assert f"git config of {config}: applied remote.o.url={world.work}/bare.git" in r.stderr
    assert f"git config of {config}: applied branch.main.merge=refs/heads/main" in r.stderr
    assert _git(world, repo, "config", "--get", "branch.main.remote") == "o\n"
    assert _git(world, repo, "rev-parse", "--abbrev-ref", "main@{upstream}") == "o/main\n"
    assert _git(world, world.work / "bare.git", "rev-parse", "main")
    assert not Path(f"{config}.lock").exists()
    r = world.sandhold("-s", str(s), "--explain", "--", "true", cwd=repo)
    assert f"git config:  {config} is the run's private copy" in r.stdout, r.stdout


def test_keys_that_run_programs_are_refused_and_the_host_runs_nothing(world: World) -> None:
    repo = _repo(world)
    s = _settings(world, allow=True)
    mark = world.root / "PLANTED"  # outside the writable root: only the host could make it
    sets = [
        ("core.fsmonitor", f"touch {mark}.fsmonitor"),
        ("core.hooksPath", str(world.work / "hooks")),
        ("credential.helper", f"!touch {mark}.credential"),
        ("alias.x", f"!touch {mark}.alias"),
        ("filter.x.clean", f"touch {mark}.filter"),
        ("include.path", str(world.work / "evil.cfg")),
        ("remote.o.vcs", "evil"),
        ("remote.o.uploadpack", f"touch {mark}.uploadpack"),
        ("remote.p.url", f"ext::sh -c touch% {mark}.ext"),
    ]
    script = " && ".join(f"git config '{k}' '{v}'" for k, v in sets)
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, cwd=repo)
    assert r.returncode == 0, r.stderr
    refused = [x for x in r.stderr.splitlines() if ": refused " in x and "git config of" in x]
    assert len(refused) == len(sets), r.stderr
    for key, _ in sets:
        assert any(f"refused {key.lower()}=" in line for line in refused), (key, r.stderr)
    assert "applied" not in r.stderr
    host = _git(world, repo, "config", "--list", "--local")
    for key, _ in sets:
        assert key.lower() not in host.lower(), host
    world.mkfile("work/repo/a.txt", "x\n")
    world.mkfile("work/repo/.gitattributes", "*.txt filter=x\n")
    _git(world, repo, "status", "--short")
    _git(world, repo, "add", "a.txt")
    assert not list(world.root.glob("PLANTED*"))


def test_without_the_setting_git_says_it_failed(world: World) -> None:
    repo = _repo(world)
    _git(world, repo, "remote", "add", "origin", f"{world.work}/bare.git")
    _git(world, repo, "push", "-q", "origin", "main")
    before = (repo / ".git/config").read_text()
    s = _settings(world, allow=False)
    r = world.sandhold(
        "-s", str(s), "--", "git", "branch", "--set-upstream-to=origin/main", cwd=repo
    )
    assert r.returncode != 0, r.stderr
    assert "could not lock config file" in r.stderr and "set up to track" not in r.stdout
    assert "git.allowConfig" in r.stderr  # the refusal line names the setting
    r = world.sandhold("-s", str(s), "--", "git", "remote", "add", "o", "x", cwd=repo)
    assert r.returncode != 0, r.stderr
    assert (repo / ".git/config").read_text() == before


@pytest.mark.parametrize("pattern", ["remote", "remote.", ".url", "remote.[a].url", "a.b\n"])
def test_a_pattern_that_names_no_key_is_a_settings_error(pattern: str) -> None:
    import json

    from sandhold.errors import SettingsError
    from sandhold.settings import parse_settings

    text = json.dumps({"git": {"allowConfig": ["remote.*", pattern]}})
    with pytest.raises(SettingsError, match=r"git\.allowConfig\[1\]"):
        parse_settings(text, "s.json")
    assert parse_settings(
        json.dumps({"git": {"allowConfig": ["remote.*.url"]}}), "s"
    ).git_allow_config


def test_a_worktree_config_is_refused_at_its_lock_with_the_setting_too(world: World) -> None:
    repo = _repo(world)
    _git(world, repo, "config", "extensions.worktreeConfig", "true")
    s = _settings(world, allow=True)
    r = world.sandhold(
        "-s", str(s), "--", "git", "config", "--worktree", "user.name", "x", cwd=repo
    )
    assert r.returncode != 0 and "could not lock config file" in r.stderr, r.stderr
    assert "covers a repository's own .git/config only" in r.stderr
    assert not (repo / ".git/config.worktree").exists()
