"""The import rule of docs/architecture.md: every module sits on one floor and imports only from its own floor or
below; no module imports itself back through others (no import circles); nothing below the commands sees argparse.

Imports are read from the source (``ast``), lazy ones inside functions included: a lazy import is still a
dependency. ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "lcmoe_recipes"

# Floors, bottom first. A module's floor is that of the longest prefix listed here.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("errors", "catalog", "layout", "ranks", "plan", "metrics")),
    ("cost", ("cost",)),
    ("request", ("request",)),
    ("rules", ("rules",)),
    ("checks", ("checks", "job_paths", "checkpoint_folders")),
    ("planner", ("search", "recipes", "retarget", "compare", "report", "explain", "plots", "calibration")),
    ("emit", ("emit",)),
    ("resolve", ("resolve", "examine")),
    ("launch", ("launch", "executors", "job_checks", "overlay", "kubeflow")),
    ("cli", ("cli", "train", "convert", "check", "calibrate", "plan.__main__", "launch.__main__")),
]
# The package itself is the public facade: it may import anything, and nothing inside the package imports it.
FACADE = PACKAGE


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / PACKAGE).rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith(PACKAGE):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(PACKAGE) and a.name in MODULES)
    found.discard(module)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def floor_of(module: str) -> int:
    """Index in FLOORS of ``module`` (``lcmoe_recipes.x.y``); the facade is above every floor."""
    if module == FACADE:
        return len(FLOORS)
    name = module.removeprefix(PACKAGE + ".")
    best, floor = -1, None
    for index, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), index
    if floor is None:
        raise AssertionError(f"{module} is on no floor: add it to FLOORS (and docs/architecture.md)")
    return floor


def test_every_module_has_a_floor():
    for module in MODULES:
        floor_of(module)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module on a higher floor, as 'a (floor) imports b (floor)'."""
    return [f"{m} ({FLOORS[floor_of(m)][0]}) imports {t} ({FLOORS[floor_of(t)][0] if t != FACADE else 'facade'})"
            for m, targets in graph.items() if m != FACADE for t in sorted(targets) if floor_of(t) > floor_of(m)]


def test_imports_only_run_down():
    assert upward_imports(GRAPH) == []


def test_nothing_imports_the_facade():
    assert [m for m, targets in GRAPH.items() if FACADE in targets and m != FACADE] == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return out


def test_no_import_circles():
    assert _cycles(GRAPH) == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if floor_of(m) < floor_of(f"{PACKAGE}.cli")))
def test_no_argparse_below_the_commands(module):
    text = MODULES[module].read_text(encoding="utf-8")
    assert "argparse" not in text, f"{module} is below the commands and mentions argparse"


def test_the_rules_see_violations():
    """The checkers themselves: an upward import and a circle are reported (so the rules cannot pass vacuously)."""
    checks, cli = f"{PACKAGE}.checks.feasibility", f"{PACKAGE}.cli.launch"
    assert upward_imports({checks: {cli}}) == [f"{checks} (checks) imports {cli} (cli)"]
    assert upward_imports({cli: {checks}}) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_architecture_doc_lists_the_floors():
    text = (SRC.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    for name, prefixes in FLOORS:
        assert f"**{name}**" in text, name
        for prefix in prefixes:
            assert f"`{prefix}`" in text, prefix
