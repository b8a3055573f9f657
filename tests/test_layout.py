"""Guards on the code's shape, the house rules made checks: the host-side scheduling modules never
import torch, and no module (package, tests, scripts) outgrows ~400 lines. Checked on the source, so a
violation fails here, in CI, rather than in a review."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "batchgen"
# The engine's CPU side: requests, scheduling, KV block bookkeeping, the persistent batch and the
# numpy step arrays. They run once per step on the engine thread beside the GPU and must stay free of
# torch (and so of torch.cuda): the runner is the one place that turns them into tensors.
HOST_SIDE = ["request", "scheduler", "block_manager", "rows", "batch", "stops", "completions", "batch_width"]
MAX_LINES = 400


def _source(module: str) -> Path:
    return PACKAGE.parent / (module.replace(".", "/") + ".py")


def _imported_modules(path: Path) -> set[str]:
    """Every module an import statement in ``path`` names, at any depth (lazy imports included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def _closure(module: str) -> set[str]:
    """``module`` and the batchgen modules it imports, transitively."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if _source(name).exists():
            todo += [m for m in _imported_modules(_source(name)) if m.startswith("batchgen.")]
    return seen


@pytest.mark.parametrize("name", HOST_SIDE)
def test_host_side_scheduling_never_imports_torch(name):
    module = f"batchgen.engine.{name}"
    for dep in sorted(_closure(module)):
        if not _source(dep).exists():
            continue
        torch_imports = {m for m in _imported_modules(_source(dep)) if m == "torch" or m.startswith("torch.")}
        assert not torch_imports, f"{module} reaches torch through {dep}: {sorted(torch_imports)}"


def test_no_module_outgrows_the_limit():
    """The package, its tests and its scripts alike."""
    root = PACKAGE.parent
    files = [p for folder in (PACKAGE, root / "tests", root / "scripts") for p in folder.rglob("*.py")]
    sizes = {p.relative_to(root): len(p.read_text().splitlines()) for p in files}
    assert len(sizes) > 150  # the walk found the package and the tests
    too_long = {str(p): n for p, n in sizes.items() if n > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines (split them by responsibility): {too_long}"


def test_tests_share_helpers_through_helper_modules_not_other_tests():
    """A test module imports no other test module: what tests share lives in a helper module of its folder
    (``*_cases.py``, ``helpers.py``, ``tests/support/``), so a test file can move or go alone."""
    root = PACKAGE.parent
    found = []
    for path in (root / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            if module and module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_"):
                found.append(f"{path.relative_to(root)}:{node.lineno} imports {module}")
    assert not found, "tests that import other tests:\n" + "\n".join(found)
