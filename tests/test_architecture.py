"""The import rule of docs/architecture.md: every module sits in one room (a folder) on one floor and imports only from
its own room or a lower floor -- never from a room beside it on the same floor; no module imports itself back through
others (no import circles, of modules or of rooms); nothing below the commands sees argparse; torch, megatron, nemo_run
and Transformer Engine are imported only in ``emit/`` and ``jobs/``, and importing the package, the planner or the
report loads none of them.

Imports are read from the source (``ast``), lazy ones inside functions included: a lazy import is still a
dependency. ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "lcmoe_recipes"

DOORS = ("launch", "plan", "check", "calibrate", "train", "convert")  # root modules in the cli room
# Floors, bottom first; a floor may hold several rooms (folders), which never import each other. A module's room is
# that of the longest prefix listed here. The command doors at the package root (``python -m lcmoe_recipes.launch``,
# ``.plan``, ``.check``, ``.calibrate``, ``.train``, ``.convert``) are on the commands' floor.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("errors", ("errors",)),
    ("catalog", ("catalog",)),
    ("core", ("core",)),
    ("cost", ("cost",)),
    ("rules, calibration", ("rules", "calibration")),
    ("checks", ("checks",)),
    ("emit", ("emit",)),
    ("planner", ("planner",)),
    ("report, jobs", ("report", "jobs")),
    ("cli", ("cli",) + DOORS),
]
# The package itself is the public facade: it may import anything, and nothing inside the package imports it.
FACADE = PACKAGE
# Where torch, megatron, nemo_run and Transformer Engine may be imported (inside functions: importing the package loads
# none of them).
HEAVY = ("torch", "megatron", "nemo_run", "transformer_engine")
HEAVY_ROOMS = ("emit", "jobs")


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


def room_of(module: str) -> tuple[int, str]:
    """(index in FLOORS, room prefix) of ``module`` (``lcmoe_recipes.x.y``); the facade is above every floor."""
    if module == FACADE:
        return len(FLOORS), FACADE
    name = module.removeprefix(PACKAGE + ".")
    best, found = -1, None
    for index, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), (index, prefix)
    if found is None:
        raise AssertionError(f"{module} is on no floor: add it to FLOORS (and docs/architecture.md)")
    return (found[0], "cli") if found[1] in DOORS else found


def floor_of(module: str) -> int:
    """Index in FLOORS of ``module``; the facade is above every floor."""
    return room_of(module)[0]


def test_every_module_has_a_floor():
    for module in MODULES:
        floor_of(module)


def _where(module: str) -> str:
    return "facade" if module == FACADE else f"{room_of(module)[1]} on floor {FLOORS[floor_of(module)][0]}"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module on a higher floor, or in another room of the same floor, as 'a (room) imports b
    (room)'."""
    out = []
    for m, targets in graph.items():
        if m == FACADE:
            continue
        for t in sorted(targets):
            (fm, rm), (ft, rt) = room_of(m), room_of(t)
            if ft > fm or (ft == fm and rt != rm):
                out.append(f"{m} ({_where(m)}) imports {t} ({_where(t)})")
    return out


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
    """The checkers themselves: an upward import, an import between the rooms of one floor, a circle and a heavy
    import are reported (so the rules cannot pass vacuously)."""
    checks, cli = f"{PACKAGE}.checks.feasibility", f"{PACKAGE}.cli.launch"
    report, jobs = f"{PACKAGE}.report.text", f"{PACKAGE}.jobs.submit"
    assert upward_imports({checks: {cli}}) == [f"{checks} (checks on floor checks) imports {cli} (cli on floor cli)"]
    assert upward_imports({cli: {checks}}) == []
    assert upward_imports({report: {jobs}}) == [f"{report} (report on floor report, jobs) imports {jobs} (jobs on "
                                                "floor report, jobs)"]
    assert upward_imports({f"{PACKAGE}.launch": {jobs}}) == []  # a command door calls the library below it
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert heavy_imports({f"{PACKAGE}.cost.step": "def f():\n    import torch.distributed\n"}) == [
        f"{PACKAGE}.cost.step imports torch.distributed"]
    assert heavy_imports({f"{PACKAGE}.emit.stack": "import megatron.bridge\n"}) == []


def rooms_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The imports between rooms (folders): room -> the rooms its modules import."""
    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        if m == FACADE:
            continue
        room = room_of(m)[1]
        out.setdefault(room, set()).update(room_of(t)[1] for t in targets if t != FACADE and room_of(t)[1] != room)
    return out


def test_no_circles_between_rooms():
    """Folders too: no room imports a room that imports it back (through any path)."""
    assert _cycles(rooms_graph(GRAPH)) == []


def heavy_imports(sources: dict[str, str]) -> list[str]:
    """Every import of torch, megatron, nemo_run or Transformer Engine outside emit/ and jobs/, as 'module imports
    name' (``sources``: module -> its text)."""
    out = []
    for module, text in sources.items():
        room = module.removeprefix(PACKAGE + ".").split(".")[0]
        if room in HEAVY_ROOMS:
            continue
        for node in ast.walk(ast.parse(text)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            out += [f"{module} imports {n}" for n in names if n.split(".")[0] in HEAVY]
    return out


def test_heavy_packages_only_in_emit_and_jobs():
    assert heavy_imports({m: p.read_text(encoding="utf-8") for m, p in MODULES.items()}) == []


def test_importing_the_package_planner_and_report_loads_no_heavy_package():
    """In a fresh interpreter: the facade, every module of the planner and of the report, and a plan made and
    explained, leave torch, megatron, nemo_run and Transformer Engine unimported."""
    light = sorted(m for m in MODULES if room_of(m)[1] in ("planner", "report") or m == FACADE)
    code = ("import importlib, sys\n"
            f"for m in {light!r}:\n    importlib.import_module(m)\n"
            "from lcmoe_recipes import recipe_plan\n"
            "from lcmoe_recipes.report.explain import explain_text\n"
            "explain_text(recipe_plan('qwen3_next_8k_gb200'))\n"
            f"print(sorted(h for h in {HEAVY!r} if h in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_importing_emit_changes_no_import_machinery():
    code = ("import sys\nbefore = list(sys.meta_path)\nimport lcmoe_recipes.emit, lcmoe_recipes.jobs.prepare\n"
            "print(sys.meta_path == before)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


def test_architecture_doc_lists_the_floors():
    text = (SRC.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    for name, prefixes in FLOORS:
        assert f"**{name}**" in text, name
        for prefix in prefixes:
            assert f"`{prefix}`" in text, prefix


def test_package_root_keeps_the_public_api_and_the_command_doors():
    """The root holds the facade, the errors and one door per command (each only runs its cli module)."""
    doors = set(DOORS)
    root = {p.stem for p in (SRC / PACKAGE).glob("*.py")}
    assert root == doors | {"__init__", "errors"}
    for door in doors - {"launch"}:
        assert GRAPH[f"{PACKAGE}.{door}"] == {f"{PACKAGE}.cli.{door}"}, door
    import lcmoe_recipes

    # importing a door sets the package attribute of its name: a facade name equal to a door would be replaced
    assert not doors & set(lcmoe_recipes.__all__), doors & set(lcmoe_recipes.__all__)
    assert {m.rsplit(".", 1)[0] for m in GRAPH[f"{PACKAGE}.launch"]} <= {f"{PACKAGE}.cli", f"{PACKAGE}.jobs",
                                                                        f"{PACKAGE}.jobs.executors"}


def test_init_files_hold_no_code():
    """A package's ``__init__`` holds its docstring and re-exports, nothing that runs (the facade aside)."""
    for module, path in MODULES.items():
        if path.name != "__init__.py" or module == FACADE:
            continue
        body = ast.parse(path.read_text(encoding="utf-8")).body
        kinds = {type(node).__name__ for node in body[1:]}
        assert kinds <= {"ImportFrom", "Import", "Assign"}, (module, kinds)
        for node in body:
            if isinstance(node, ast.Assign):
                assert [t.id for t in node.targets] == ["__all__"], module


def test_only_the_resolver_calls_the_search():
    """One door to the search: only lcmoe_recipes.planner.resolve imports search_layouts (so a calibration profile
    holds for every search)."""
    callers = sorted(m for m, p in MODULES.items() if m != f"{PACKAGE}.planner.search"
                     for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                     if isinstance(node, ast.ImportFrom) and any(a.name == "search_layouts" for a in node.names))
    assert callers == [f"{PACKAGE}.planner.resolve"]
