"""docs/architecture.md stays the map: every module it names exists, and every module
and package of sandhold's top two levels is named on it."""

from __future__ import annotations

import re

from conftest import REPO

DOC = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "src" / "sandhold"
NAMED = re.compile(r"`((?:[a-z_]+/)*[a-z_]+(?:\.py|/))`")


def _named() -> set[str]:
    found = set(NAMED.findall(DOC.read_text()))
    return {n for n in found if not n.startswith(("tests/", "docs/"))}


def test_every_module_named_exists() -> None:
    named = _named()
    assert len(named) >= 30
    supervisor = PACKAGE / "backends" / "linux" / "supervisor"
    missing = sorted(
        n for n in named if not (PACKAGE / n).exists() and not (supervisor / n).exists()
    )
    assert missing == []


def test_every_module_is_on_the_map() -> None:
    named = _named()
    top = {p.name for p in PACKAGE.glob("*.py") if not p.name.startswith("_")}
    top |= {f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    second = {
        f"{p.parent.name}/{p.name}"
        for p in PACKAGE.glob("*/*.py")
        if p.parent.name in ("policy", "port", "backends") and not p.name.startswith("_")
    }
    absent = sorted(n for n in top | second if n not in named)
    assert absent == []
