"""The README's examples run, as root and as an unprivileged user.

Every ```console block in README.md is a transcript: a line starting with ``$ ``
is a command (run with bash, in a scratch directory holding docs/examples, with
``sandhold`` on PATH) and the lines after it are its expected standard output.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, World

BLOCK = re.compile(r"```console\n(.*?)```", re.S)


def transcripts() -> list[tuple[str, str]]:
    steps: list[tuple[str, str]] = []
    for block in BLOCK.findall((REPO / "README.md").read_text()):
        for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, _, expected = chunk.partition("\n")
            steps.append((command, expected))
    return steps


def test_readme_has_examples() -> None:
    assert len(transcripts()) >= 8


def test_readme_examples_run(world: World) -> None:
    shutil.copytree(REPO / "docs" / "examples", world.work / "docs" / "examples")
    bindir = world.mkdir("bin")
    wrapper = world.mkfile(
        "bin/sandhold", f'#!/bin/sh\nexec {world.ident.python} -P -m sandhold "$@"\n', mode=0o755
    )
    assert wrapper.exists()
    world.mkfile("home/.ssh/id_ed25519", "PRIVATE KEY")
    for d, _dirs, files in __import__("os").walk(world.work):
        world.ident.chown(d)
        for f in files:
            world.ident.chown(Path(d) / f)
    env = world.env(PATH=f"{bindir}:/usr/local/bin:/usr/bin:/bin")
    for command, expected in transcripts():
        r = world.ident.run(["bash", "-c", command], cwd=world.work, env=env)
        assert r.stdout == expected, (command, r.stdout, r.stderr)


@pytest.mark.parametrize("doc", ["README.md", "docs/linux-sandbox.md", "bench/README.md"])
def test_doc_links_resolve(doc: str) -> None:
    text = (REPO / doc).read_text()
    for target in re.findall(r"\]\(([^)#:]+)\)", text):
        assert (REPO / doc).parent.joinpath(target).exists(), (doc, target)


def test_mcp_example_is_valid_python() -> None:
    subprocess.run(
        ["python3", "-m", "py_compile", str(REPO / "docs/examples/mcp_echo.py")], check=True
    )
