"""docs/server.md's examples run against a real server, as root and as a user."""

from __future__ import annotations

import re

from conftest import REPO, World
from serverkit import git_repo, served

DOC = REPO / "docs" / "server.md"


def example(kind: str) -> tuple[str, str]:
    """The code block after ``<!-- server-example: KIND -->`` and the output block after it."""
    text = DOC.read_text()
    m = re.search(
        rf"<!-- server-example: {kind} -->\n```\w+\n(.*?)```\n\nprints\n\n```\n(.*?)```",
        text,
        re.S,
    )
    assert m, f"docs/server.md has no {kind} example"
    return m.group(1), m.group(2)


def test_the_curl_and_python_examples_print_what_the_doc_says(world: World) -> None:
    repo = git_repo(world, "repo")
    with served(world) as s:
        env = world.env(SANDHOLD_URL=s.url, SANDHOLD_TOKEN=s.token, REPO=str(repo))
        code, expected = example("curl")
        out = world.ident.run(["bash", "-euo", "pipefail", "-c", code], cwd=world.work, env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout == expected
        code, expected = example("python")
        out = world.ident.run([world.ident.python, "-c", code], cwd=world.work, env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout == expected
