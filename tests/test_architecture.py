"""The layers hold: import-linter's contracts in `.importlinter` (the runtime never imports
the operator; serving and the engine build never import each other; pure decisions import
no I/O; only engines import engine libraries)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_module_grows_past_500_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {lines} lines"
        for folder in ("operator", "runtime", "contract", "cluster", "cli")
        for path in (ROOT / folder).rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > 500
    ]
    assert not long, long


def imports_of(source: Path) -> set[str]:
    """Every module `source` imports, lazily inside functions too."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def package_graph(folder: Path, package: str) -> dict[str, set[str]]:
    """For each part of `package` (a subpackage or module directly in `folder`), the other
    parts it imports."""
    parts = {
        p.name.removesuffix(".py") for p in folder.iterdir() if p.suffix == ".py" or p.is_dir()
    }
    graph: dict[str, set[str]] = {}
    for source in folder.rglob("*.py"):
        node = source.relative_to(folder).parts[0].removesuffix(".py")
        edges = graph.setdefault(node, set())
        for module in imports_of(source):
            if module.startswith(f"{package}."):
                target = module.removeprefix(f"{package}.").split(".")[0]
                if target in parts and target != node:
                    edges.add(target)
    return graph


def test_no_package_cycle() -> None:
    """The top-level packages, and the operator's and the runtime's parts, form no import
    cycle: import-linter's contracts say which way each import may go; this says there is
    no loop at all."""
    from graphlib import CycleError, TopologicalSorter

    top: dict[str, set[str]] = {}
    for name in ("operator", "runtime", "contract", "cluster", "cli"):
        top[name] = {
            module.split(".")[1]
            for source in (ROOT / name).rglob("*.py")
            for module in imports_of(source)
            if module.startswith("kubeinfer.") and module.split(".")[1] != name
        }
    graphs = {
        "kubeinfer": top,
        "kubeinfer.operator": package_graph(ROOT / "operator", "kubeinfer.operator"),
        "kubeinfer.runtime": package_graph(ROOT / "runtime", "kubeinfer.runtime"),
    }
    for name, graph in graphs.items():
        try:
            list(TopologicalSorter(graph).static_order())
        except CycleError as error:
            raise AssertionError(f"{name}: import cycle {' -> '.join(error.args[1])}") from None
