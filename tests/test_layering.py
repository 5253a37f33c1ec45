"""The layout keeps its rules: no import cycle inside sandhold, and policy/ does no I/O.

STYLE §5.1: policy is plain functions over data, so every module under
``sandhold/policy/`` (walked, not listed: a new module is checked too) imports
nothing that reaches the OS and calls no built-in that does I/O. The check reads
the source (``ast``), so an import inside a function counts as much as one at
the top; only ``if TYPE_CHECKING:`` blocks are left out, as they never run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "sandhold"
# Modules whose import means the OS: files, processes, sockets, users, signals, time.
OS_MODULES = {
    "asyncio", "ctypes", "fcntl", "glob", "grp", "io", "mmap", "os", "pathlib", "pwd",
    "resource", "select", "selectors", "shutil", "signal", "socket", "sqlite3", "ssl",
    "subprocess", "tempfile", "threading", "time", "importlib", "sys",
}  # fmt: skip
IO_BUILTINS = {"open", "input", "print", "exec", "eval", "compile", "__import__", "breakpoint"}


def _modules() -> dict[str, Path]:
    found = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = f
    return found


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in (
        "TYPE_CHECKING",
        "typing.TYPE_CHECKING",
    )


def _nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node that can run: ``if TYPE_CHECKING:`` bodies are skipped."""
    for child in ast.iter_child_nodes(tree):
        if _type_checking(child):
            assert isinstance(child, ast.If)
            for other in child.orelse:
                yield other
                yield from _nodes(other)
            continue
        yield child
        yield from _nodes(child)


def _imports(tree: ast.AST) -> set[str]:
    names = set()
    for node in _nodes(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"relative import at line {node.lineno}: spell it out")
    return names


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {
        name: {dep for dep in _imports(ast.parse(path.read_text())) if dep in mods and dep != name}
        for name, path in mods.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": set()}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ],
)
def test_the_cycle_finder_finds_cycles(graph: dict[str, set[str]], expected: list[str]) -> None:
    assert _cycles(graph) == expected


def test_a_function_level_import_counts_and_type_checking_does_not() -> None:
    tree = ast.parse(
        "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    import os\n"
        "def f():\n    from sandhold.spec import X\n"
    )
    assert _imports(tree) == {"sandhold.spec", "sandhold.spec.X"}


def test_no_import_cycle_inside_sandhold() -> None:
    graph = _graph()
    assert "sandhold.port.api" in graph and "sandhold.policy.fsplan" in graph
    assert _cycles(graph) == []


def test_policy_modules_do_no_io() -> None:
    policy = {n: p for n, p in _modules().items() if n.startswith("sandhold.policy")}
    assert len(policy) >= 10, sorted(policy)
    offences = []
    for name, path in sorted(policy.items()):
        tree = ast.parse(path.read_text())
        for imported in _imports(tree):
            if imported.split(".")[0] in OS_MODULES:
                offences.append(f"{name} imports {imported}")
        for node in _nodes(tree):
            call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            if call and node.func.id in IO_BUILTINS:  # type: ignore[attr-defined]
                offences.append(f"{name}:{node.lineno} calls {node.func.id}()")  # type: ignore[attr-defined]
    assert offences == []


def test_the_io_check_sees_an_offence() -> None:
    tree = ast.parse("def f():\n    import os\n    return open('x')\n")
    assert "os" in _imports(tree)
    calls = [n.func.id for n in _nodes(tree) if isinstance(n, ast.Call)]  # type: ignore[attr-defined]
    assert "open" in calls
