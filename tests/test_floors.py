"""Imports point down the floors (README, "How we write code"): a module imports only from its own floor
or the ones below it, lazy and type-only imports included. Checked on the source, so an upward import
fails here rather than in a review."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "batchgen"
# Top to bottom. A module's floor is that of its first part under batchgen/; parts not named here are the
# lowest floor (distributed primitives, kernels, io, config, threads, allocator, outputs, ...).
FLOORS = [
    {"cli", "cli_options", "__main__"},
    {"app", "bench"},
    {"llm", "llm_inputs", "llm_results"},
    {"tensor_parallel"},  # launches ranks and drives them: started by llm, drives the engine
    {"engine"},
    {"model"},
]
LOWEST = len(FLOORS)
# Outside the floors: the package's public face (it re-exports the Python API) and test support.
OUTSIDE = {"__init__", "testing"}


def _part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "__init__"


def _floor(module: str) -> int:
    """0 is the top floor."""
    part = _part(module)
    return next((i for i, names in enumerate(FLOORS) if part in names), LOWEST)


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "batchgen":  # from batchgen import x: the module x
                found += [(node.lineno, f"batchgen.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name.startswith("batchgen.")]


def test_every_import_points_down_the_floors():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if _part(module) in OUTSIDE:
            continue
        for line, name in _imports(path):
            if _part(name) not in OUTSIDE and _floor(name) < _floor(module):
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    assert not upward, "imports that point up the floors:\n" + "\n".join(upward)


def test_the_floors_are_where_the_check_looks():
    """Every named floor part exists, so a rename cannot leave the check guarding nothing."""
    for names in FLOORS:
        for name in names:
            assert (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").exists(), name
