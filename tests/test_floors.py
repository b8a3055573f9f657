"""The floors of docs/architecture.md, held against the code: every import (lazy and type-only ones
included) points to the importer's own floor or one below it, no modules import each other in a
circle, and every module of the package stands on a floor the diagram names. The floors are read from
the diagram itself, so the picture a newcomer reads is the one this test enforces."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "batchgen"
DIAGRAM = ROOT / "docs" / "architecture.md"


def read_floors(text: str) -> list[tuple[str, list[str]]]:
    """(floor, module prefixes) from the top floor down: the diagram's fenced block that opens with
    ``floors``, one floor a line (``name  batchgen/part/  batchgen/file.py ...``), arrows between them."""
    block = re.search(r"```floors\n(.*?)```", text, re.S)
    assert block, f"{DIAGRAM} lost its ```floors block"
    floors = []
    for line in block.group(1).splitlines():
        words = line.split()
        paths = [w for w in words if w.startswith("batchgen/")]
        if paths:
            floors.append((words[0], [p.removesuffix(".py").rstrip("/").replace("/", ".") for p in paths]))
    return floors


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``path`` imports anywhere in it; ``from a.b import c`` names the
    module ``a.b.c`` where that is a module, else ``a.b``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                for a in node.names
            ]
        else:
            continue
        found.update(n for n in names if n in known)
    return found


def floor_of(module: str, floors: list[tuple[str, list[str]]]) -> int | None:
    """Index of the floor (0 = top) that holds ``module``."""
    for index, (_, prefixes) in enumerate(floors):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return index
    return None


@pytest.fixture(scope="module")
def layout():
    known = modules()
    graph = {name: imports_of(path, known) - {name} for name, path in known.items()}
    return read_floors(DIAGRAM.read_text()), graph


def test_every_module_stands_on_a_floor_of_the_diagram(layout):
    floors, graph = layout
    unplaced = sorted(m for m in graph if m != "batchgen" and floor_of(m, floors) is None)
    assert len(floors) >= 5 and len(graph) > 100  # the diagram and the package were both read
    assert not unplaced, f"modules on no floor of {DIAGRAM.name}: {unplaced}"


def test_imports_only_point_down(layout):
    floors, graph = layout
    upward = []
    for module, targets in graph.items():
        here = floor_of(module, floors)
        for target in targets:
            there = floor_of(target, floors)
            if here is not None and there is not None and there < here:
                upward.append(f"{module} ({floors[here][0]}) -> {target} ({floors[there][0]})")
    assert not upward, "imports that point up a floor:\n" + "\n".join(sorted(upward))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_modules_import_each_other_in_a_circle(layout):
    _, graph = layout
    graph = {m: targets - {"batchgen"} for m, targets in graph.items()}
    assert not circles(graph), f"import circles: {circles(graph)}"


def test_the_circle_finder_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def top_level_statements(body: list[ast.stmt]):
    """The statements that bind module-level names, inside ``if`` (``TYPE_CHECKING``) and ``try``
    (optional imports) blocks too."""
    for node in body:
        if isinstance(node, ast.If | ast.Try):
            handlers = [s for h in getattr(node, "handlers", []) for s in h.body]
            finals = getattr(node, "finalbody", [])
            yield from top_level_statements(node.body + node.orelse + handlers + finals)
        else:
            yield node


def top_level_names(path: Path) -> set[str]:
    """What ``from module import name`` can take from ``path``: its top-level definitions and imports,
    and the names its ``__all__`` lists (a lazy ``__getattr__`` serves those)."""
    names = set()
    for item in top_level_statements(ast.parse(path.read_text()).body):
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(item.name)
        elif isinstance(item, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in item.names)
        elif isinstance(item, ast.Assign | ast.AnnAssign):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            bound = {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
            names |= bound
            if "__all__" in bound and isinstance(item.value, ast.List):
                names.update(e.value for e in item.value.elts if isinstance(e, ast.Constant))
    return names


def test_every_import_of_the_package_names_what_exists():
    """Each ``from batchgen.x import y`` and ``from tests.x import y`` anywhere in the package, the tests
    and the scripts, lazy ones included, names a module that exists and a name it defines: the GPU-only
    tests and scripts, which never run here, break at a move as loudly as the rest."""
    files = [p for folder in ("batchgen", "tests", "scripts") for p in (ROOT / folder).rglob("*.py")]
    missing = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and not node.level):
                continue
            if node.module.split(".")[0] not in ("batchgen", "tests"):
                continue
            base = ROOT / node.module.replace(".", "/")
            source = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if not source.exists() and not base.is_dir():
                missing.append(f"{where}: no module {node.module}")
                continue
            defined = top_level_names(source) if source.exists() else set()
            for alias in node.names:
                submodule = base / alias.name
                if (
                    alias.name not in defined
                    and not submodule.is_dir()
                    and not submodule.with_suffix(".py").exists()
                ):
                    missing.append(f"{where}: {node.module} has no {alias.name}")
    assert len(files) > 300  # the walk found the package, the tests and the scripts
    assert not missing, "imports of what does not exist:\n" + "\n".join(missing)
