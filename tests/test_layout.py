"""The package's shape (issue #49): modules a newcomer can read in one sitting, functions that fit on a screen,
imports that follow the flow (model -> ingest/store -> analysis -> diagnosis -> report -> cli) with no loops,
and no module reaching into another's private names. Read from the source with `ast`: nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

import flightrec

ROOT = Path(flightrec.__file__).parent
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
# The compiled opcode walker is one loop over the pickle's opcodes: numba compiles one function, and cutting it
# into calls per opcode would cost a call an opcode (and hide the dispatch a reader has to see whole).
LONG_ON_PURPOSE = {"flightrec.ingest.fastpickle.walker._walk_one_py"}

# Which parts of the package each part may import (besides itself and the leaf modules errors and model).
MAY_IMPORT = {
    "model": set(),
    "store": set(),
    "ingest": {"store"},
    "analysis": set(),
    "diagnosis": {"analysis", "report"},   # (report: the Finding it makes, `report.model`)
    "report": {"analysis", "diagnosis"},   # (what it renders: matching's frames, each finding's action)
    "testing": set(),
    "api": {"ingest", "store", "analysis", "diagnosis", "report"},
    "history": {"flightrec", "api", "ingest", "report"},   # (its version; a backfill lists and analyses; pyplot)
    "plots": {"report", "history"},          # (the notebook module kept at its old name)
    "distributed": {"api", "ingest", "store", "report"},   # (tasks convert and read; the driver runs `analyze`'s engine)
    "cli": {"flightrec", "ingest", "store", "analysis", "diagnosis", "report", "api", "history", "distributed"},
}
LEAVES = {"errors", "model"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _runtime_imports(tree: ast.Module) -> list[ast.ImportFrom | ast.Import]:
    """Imports that run: those under `if TYPE_CHECKING:` only name types."""
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in skip]


def _imported(module: str, node: ast.ImportFrom | ast.Import) -> list[tuple[str, str | None]]:
    """(flightrec module, name taken from it or None) for each flightrec import of `node`."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names if a.name.startswith("flightrec")]
    base = node.module or ""
    if node.level:
        package = module.split(".")[: len(module.split(".")) - node.level + (MODULES[module].name == "__init__.py")]
        base = ".".join(package + ([base] if base else []))
    if not base.startswith("flightrec"):
        return []
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out.append((sub, None) if sub in MODULES else (base, alias.name))
    return out


def _graph() -> tuple[nx.DiGraph, list[tuple[str, str, str]]]:
    graph, private = nx.DiGraph(), []
    for module, path in MODULES.items():
        graph.add_node(module)
        for node in _runtime_imports(ast.parse(path.read_text())):
            for target, name in _imported(module, node):
                if target == module:
                    continue
                graph.add_edge(module, target)
                if name and name.startswith("_") and not name.startswith("__"):
                    private.append((module, target, name))
    return graph, private


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "flightrec"


def test_every_module_is_short_enough_to_read():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these modules (over {MAX_MODULE_LINES} lines): {long}"


def test_every_function_fits_on_a_screen():
    long = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and f"{module}.{node.name}" not in LONG_ON_PURPOSE:
                    long[f"{module}.{node.name}"] = n
    assert not long, f"split these functions (over {MAX_FUNCTION_LINES} lines): {long}"


def test_the_exceptions_still_exist():
    """An exception left for a function that was split or renamed would let its successor grow unchecked."""
    for qualified in LONG_ON_PURPOSE:
        module, name = qualified.rsplit(".", 1)
        assert f"def {name}(" in MODULES[module].read_text(), qualified


def test_no_import_loops():
    graph, _ = _graph()
    loops = list(nx.simple_cycles(graph))
    assert not loops, loops


def test_imports_follow_the_flow():
    graph, _ = _graph()
    against = []
    for module, target in graph.edges:
        mine, theirs = _part(module), _part(target)
        if module == "flightrec" or mine == theirs or theirs in LEAVES or mine in ("views", "__main__"):
            continue
        if mine in LEAVES or theirs not in MAY_IMPORT.get(mine, set()):
            against.append((module, target))
    assert not against, against


def test_no_module_reaches_into_another_ones_private_names():
    _, private = _graph()
    assert not private, private


def test_the_synthetic_generator_is_outside_the_runtime_path():
    graph, _ = _graph()
    runtime = {m for m in MODULES if _part(m) not in ("testing",)}
    reaching = {m for m in runtime if any(_part(t) == "testing" for t in graph.successors(m))}
    assert not reaching, reaching


@pytest.mark.parametrize("name", ["analyze", "load", "LoadOptions", "Trace", "Report", "Finding"])
def test_the_public_api_is_where_the_readme_says(name):
    assert hasattr(flightrec, name)


def test_the_notebook_modules_keep_their_names():
    import flightrec.plots
    import flightrec.views

    assert flightrec.views.check_ranks and flightrec.views.as_json and flightrec.plots.__all__


def test_this_check_sees_the_package():
    """(guards the checks above: an empty walk would pass them all)"""
    graph, _ = _graph()
    assert len(MODULES) > 40 and graph.number_of_edges() > 100
    assert ("flightrec.diagnosis.verdict", "flightrec.analysis.matching") in graph.edges


def _aliases(tree: ast.Module, module: str | None = None) -> dict[str, str]:
    """Names bound to flightrec modules by the imports of `tree` (`module`: its own name, for relative ones)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("flightrec") and a.asname:
                    out[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flightrec"):
            for a in node.names:
                if f"{node.module}.{a.name}" in MODULES:
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _patches() -> list[tuple[str, str, str]]:
    """(test file, module, name) for every `monkeypatch.setattr` of a flightrec module's name in the tests."""
    out = []
    for path in sorted((ROOT.parent / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        aliases = _aliases(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "setattr" and node.args):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith("flightrec."):
                module, name = first.value.rsplit(".", 1)
                out.append((path.name, module, name))
            elif (isinstance(first, ast.Name) and first.id in aliases and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant)):
                out.append((path.name, aliases[first.id], node.args[1].value))
    return out


def _read_through_the_module(module: str, name: str) -> bool:
    """Whether a patch of `module.name` changes what runs: the module's own code reads it as a global, or
    another module reads it as `module.name`. (A module that took it with `from module import name` keeps the
    original: patching it there tests nothing.)"""
    own = ast.parse(MODULES[module].read_text())
    for fn in ast.walk(own):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in ast.walk(fn)):
            return True
    for path in MODULES.values():
        tree = ast.parse(path.read_text())
        aliases = {alias for alias, target in _aliases(tree).items() if target == module}
        if aliases and any(isinstance(n, ast.Attribute) and n.attr == name and isinstance(n.value, ast.Name)
                           and n.value.id in aliases for n in ast.walk(tree)):
            return True
    return False


def test_every_patch_in_the_tests_changes_what_runs():
    patches = _patches()
    assert len(patches) > 20, patches   # (the scan sees them)
    idle = [p for p in patches if p[1] in MODULES and not _read_through_the_module(p[1], p[2])]
    unknown = [p for p in patches if p[1] not in MODULES]
    assert not idle and not unknown, {"read by nothing through the module": idle, "no such module": unknown}
