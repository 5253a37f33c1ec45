"""``policy.repository``: the repository rules the supervisor looks up, as tables (F-BE-5).

The supervisor's side (which names it finds, which the run made) is tested through
real runs in test_bare_repositories.py, test_mercurial.py and test_jujutsu.py.
"""

from __future__ import annotations

import pytest

from sandhold.policy import repository

# directories that hold a repository the run did not make (the supervisor's lookup)
HELD = {"/w/app", "/w/app/vendor/lib", "/"}


@pytest.mark.parametrize(
    ("start", "known", "expected"),
    [
        ("/w/app/src/x", (), "/w/app"),  # the nearest ancestor holding one
        ("/w/app", (), "/w/app"),  # the start itself
        ("/w/app/vendor/lib/a", (), "/w/app/vendor/lib"),  # nearest wins
        ("/w/other", (), "/"),
        ("/w/other/a", ("/w/other",), "/w/other"),  # seen by the host at launch
        ("/w/app/src", ("/w",), "/w/app"),
    ],
)
def test_the_work_tree_is_the_nearest_holder(
    start: str, known: tuple[str, ...], expected: str
) -> None:
    assert repository.work_tree(start, known, HELD.__contains__) == expected


def test_no_work_tree_when_nothing_holds_one() -> None:
    assert repository.work_tree("/a/b", (), lambda _at: False) is None


@pytest.mark.parametrize(
    ("path", "directory", "expected"),
    [
        ("/w/.git", True, True),
        ("/w/.hg", True, True),
        ("/w/.jj", True, True),
        ("/w/.git", False, False),  # a gitfile: creation rule 3 refuses it on its own
        ("/w/git", True, False),
        ("/w/.github", True, False),
    ],
)
def test_which_new_directories_make_a_repository(
    path: str, directory: bool, expected: bool
) -> None:
    assert repository.makes_repository(path, directory=directory) is expected


@pytest.mark.parametrize(
    ("name", "in_fresh_git", "expected"),
    [
        (".git", False, ".git"),
        (".hg", False, ".hg"),
        (".jj", True, ".jj"),
        ("hooks", True, "hooks"),
        ("hooks", False, None),  # hooks of a .git the run did not make
        ("refs", True, None),
    ],
)
def test_what_the_run_remembers_as_its_own(
    name: str, in_fresh_git: bool, expected: str | None
) -> None:
    assert repository.fresh_kind(name, in_fresh_git=in_fresh_git) == expected


def test_a_symlink_out_of_a_work_tree_to_where_names_may_be_made_is_refused() -> None:
    writable = ("/w", "/tmp/s")

    def may_make(path: str) -> bool:
        return any(path == r or path.startswith(r + "/") for r in writable)

    assert repository.repository_link_denied("/w/app", ["/w/app/x"], may_make) is None
    assert repository.repository_link_denied("/w/app", ["/usr/lib"], may_make) is None
    reason = repository.repository_link_denied("/w/app", ["/w/app/x", "/tmp/s/r"], may_make)
    assert reason is not None and "/tmp/s/r" in reason.rule and "/w/app" in reason.rule
    assert "/w/app" in repository.nested_repository_reason("/w/app").rule
    assert "/w/app" in repository.bare_repository_reason("/w/app").rule
