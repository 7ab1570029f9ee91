"""The house's layering, read from the code with ast (nothing is imported): every import between the packages
runs down the floors, no two modules import each other in a loop, and the pure packages leave mpi4py and
cupy out of their module level.

    floor 5  benchmarks   figures against targets; runs the others, as a user would
    floor 4  reports      figures and reports, and the `commcal` front door (reports/cli.py) on top of it all
    floor 3  analysis     SBP algebra, pricing, search, ranking; the validation harness (under MPI)
    floor 2  calib        fitting and the calibration file
    floor 1  microbench   the shared vocabulary (errors, atomic writes, sizes, link classes, the op table,
                          records, statistics) and the measuring that runs under MPI

An import counts wherever it stands (a lazy one inside a function ties the modules as much as one at the
top), and so does a string that names a module of the house: the front door loads its subcommands by name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FLOORS = {"microbench": 1, "calib": 2, "analysis": 3, "reports": 4, "benchmarks": 5}
MPI_MODULES = {"analysis.harness", "analysis.harness_comm", "analysis.harness_exec", "analysis.harness_pipeline",
               "analysis.validate_run", "analysis.validate_training", "analysis.kernel_profile_run"}
"""The part of analysis that runs on every rank of an MPI job; the rest of analysis, calib and reports is pure."""
PURE = ("calib", "analysis", "reports")


def _modules() -> dict[str, Path]:
    out = {}
    for package in FLOORS:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(tree: ast.AST, module: str) -> set[str]:
    """The house's modules that `module` names: by import statement anywhere in it, or as a string constant."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return {name for name in names if name in MODULES and name != module}


GRAPH = {module: _imports(ast.parse(path.read_text(), str(path)), module) for module, path in MODULES.items()}


def _package(module: str) -> str:
    return module.split(".")[0]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_package_is_read():
    assert {_package(m) for m in MODULES} == set(FLOORS)
    assert "reports.cli" in MODULES and "microbench.cli" not in MODULES
    assert "calib.peers" in MODULES and "calib.peers.osu" in MODULES


def test_no_two_modules_import_each_other_in_a_loop():
    assert _cycles(GRAPH) == []


def test_no_two_packages_import_each_other_in_a_loop():
    packages: dict[str, set[str]] = {p: set() for p in FLOORS}
    for module, targets in GRAPH.items():
        packages[_package(module)].update(_package(t) for t in targets if _package(t) != _package(module))
    assert _cycles(packages) == []


def test_imports_between_packages_run_down_the_floors():
    up = sorted(f"{module} -> {target}" for module, targets in GRAPH.items() for target in targets
                if FLOORS[_package(target)] > FLOORS[_package(module)])
    assert up == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _module_level_imports(tree: ast.Module) -> set[str]:
    """Top-level names imported by the module body itself (under if/try too), not inside functions or classes."""
    names, todo = set(), list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo.extend(ast.iter_child_nodes(node))
        elif isinstance(node, ast.ExceptHandler):
            todo.extend(node.body)
    return names


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _package(m) in PURE and m not in MPI_MODULES))
def test_pure_modules_leave_mpi4py_and_cupy_out_of_their_module_level(module):
    assert _module_level_imports(ast.parse(MODULES[module].read_text())) & {"mpi4py", "cupy"} == set()
