"""The layers hold: import-linter's contracts in `.importlinter` (the runtime never imports
the operator; serving and the engine build never import each other; pure decisions import
no I/O; only engines import engine libraries), and they cover a module added to a package
as well as those there now. No import cycle, between packages or between modules (not even
under `TYPE_CHECKING`). The tests wait through their one helper (`tests/support/waiting.py`):
no polling helper of their own, no sleep without `# not a wait: why`."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("operator", "runtime", "contract", "cluster", "cli")


def test_import_contracts_are_kept() -> None:
    result = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("operator/reconcile/new_part.py", "import requests", "pure-core"),
        ("operator/state/new_part.py", "import asyncio", "pure-core"),
        ("operator/rollout/new_part.py", "import kopf", "kopf-at-the-edge"),
        ("operator/metrics_sources/new_part.py", "import math", "metrics-sources-on-top"),
        ("operator/metrics_sources/queries.py", "import requests", "pure-core"),
        ("operator/new_part.py", "import math", "operator-layers"),
        ("operator/commands/new_part.py", "import math", "commands-layers"),
        ("operator/telemetry/new_part.py", "import math", "telemetry-layers"),
        (
            "operator/kube/new_part.py",
            "import kubeinfer.operator.telemetry.exporter",
            "exporter-is-read-from-above",
        ),
        ("runtime/shadow/comparison.py", "import asyncio", "pure-cores"),
        ("runtime/protocol/new_part.py", "import onnxruntime", "protocol-is-thin"),
        ("runtime/shadow/new_part.py", "import math", "shadow-mechanism-on-top"),
        ("runtime/new_part.py", "import math", "runtime-layers"),
        ("runtime/serve_command.py", "import kubeinfer.runtime.building", "runtime-layers"),
        (
            "runtime/building/x.py",
            "import kubeinfer.runtime.rust_dataplane",
            "building-does-not-serve",
        ),
        ("runtime/new_part.py", "import kubeinfer.operator", "planes-meet-only-in-the-contract"),
    ],
)
def test_a_new_module_is_checked_too(tmp_path: Path, module: str, line: str, contract: str) -> None:
    """The contracts name whole packages (and the few I/O modules inside them), and the
    layers contracts are exhaustive, so a module added to a package is held to its
    contracts without a line in `.importlinter`: each contract, run over a copy of the
    sources with one module added or changed, is broken."""
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package,
            tmp_path / "kubeinfer" / package,
            ignore=lambda folder, names: [
                n for n in names if not n.endswith(".py") and not Path(folder, n).is_dir()
            ],
        )
    shutil.copy(ROOT / ".importlinter", tmp_path)

    def lint() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(LINT_IMPORTS), "--no-cache", "--contract", contract],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=120,
        )

    kept = lint()
    assert kept.returncode == 0, kept.stdout + kept.stderr
    target = tmp_path / "kubeinfer" / module
    target.write_text((target.read_text() if target.exists() else "") + f"\n{line}\n")
    broken = lint()
    assert broken.returncode == 1 and "1 broken" in broken.stdout, broken.stdout + broken.stderr


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


def module_level_imports(source: Path) -> set[str]:
    """Every module `source` imports when it is imported itself, or when a type checker
    reads it: its top-level imports, those under `if TYPE_CHECKING:` and in class bodies,
    not those inside functions (a lazy import that keeps a backend unloaded)."""
    import ast

    found: set[str] = set()
    pending: list[ast.AST] = list(ast.parse(source.read_text()).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            pending.extend(ast.iter_child_nodes(node))
    return found


def module_graph() -> dict[str, set[str]]:
    """Each module of the five packages (a package is its `__init__`), and the modules of
    theirs it imports at module level."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for source in (ROOT / package).rglob("*.py"):
            parts = source.relative_to(ROOT).with_suffix("").parts
            modules[".".join(("kubeinfer", *parts)).removesuffix(".__init__")] = source
    return {
        name: {m for m in module_level_imports(source) if m in modules and m != name}
        for name, source in modules.items()
    }


def test_no_module_imports_itself_through_others() -> None:
    """No two modules import each other at module level, through any chain, not even
    under `TYPE_CHECKING`: a cycle kept only for the type checker still means two modules
    that cannot be read, or moved, one without the other. Where a module needs only the
    shape of another's type, it names that shape itself (a Protocol)."""
    from graphlib import CycleError, TopologicalSorter

    try:
        list(TopologicalSorter(module_graph()).static_order())
    except CycleError as error:
        raise AssertionError(f"import cycle {' -> '.join(error.args[1])}") from None


def test_a_library_whose_private_modules_are_imported_is_pinned_to_the_minor_tested() -> None:
    """A private module (`kopf._cogs...`) may move in any release: each library the sources
    import one from is declared, everywhere it is, as `>=X.Y,<X.Y+1` around the version
    installed here (the one the tests run)."""
    import importlib.metadata
    import re
    import tomllib

    private: dict[str, set[str]] = {}
    for folder in PACKAGES:
        for source in (ROOT / folder).rglob("*.py"):
            for module in imports_of(source):
                top, *rest = module.split(".")
                if top in sys.stdlib_module_names or top == "kubeinfer":
                    continue
                if any(part.startswith("_") and not part.startswith("__") for part in rest):
                    private.setdefault(top, set()).add(str(source.relative_to(ROOT)))
    assert "kopf" in private, "kube/client's Vault import is gone: loosen kopf's pin too"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        requirements += extra
    distributions = importlib.metadata.packages_distributions()
    for top, files in private.items():
        (distribution,) = distributions[top]
        major, minor = importlib.metadata.version(distribution).split(".")[:2]
        declared = [
            r for r in requirements if re.match(rf"{re.escape(distribution)}\b", r, re.IGNORECASE)
        ]
        assert declared, f"{distribution} is imported by {sorted(files)} but not declared"
        pin = f">={major}.{minor},<{major}.{int(minor) + 1}"
        for requirement in declared:
            assert requirement.replace(" ", "").endswith(pin), (
                f"{sorted(files)} import private modules of {distribution}: declare it as "
                f"{distribution}{pin} (the minor installed and tested), not {requirement!r}"
            )


TESTS = ROOT / "tests"
NOT_A_WAIT = "# not a wait:"
WAITING_NAME = re.compile(r"_?(wait|until|eventually|poll|block_until)(_\w+)?")


def _is_sleep(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return (
            func.attr == "sleep"
            and isinstance(func.value, ast.Name)
            and (func.value.id in ("time", "asyncio"))
        )
    return isinstance(func, ast.Name) and func.id == "sleep"


def _marked(lines: list[str], call: ast.Call) -> bool:
    """The marker on the call's own lines, or on a comment line right above it."""
    own = lines[call.lineno - 1 : call.end_lineno]
    above = lines[call.lineno - 2].strip() if call.lineno > 1 else ""
    return any(NOT_A_WAIT in line for line in own) or (
        above.startswith("#") and NOT_A_WAIT in above
    )


def _sleeps_and_polling_helpers(source: str) -> tuple[list[int], list[str]]:
    """The lines of the sleeps without the marker, and the functions named as a waiting
    helper that sleep in a loop (their own polling helper, marker or not)."""
    tree, lines = ast.parse(source), source.splitlines()
    bare = [n.lineno for n in ast.walk(tree) if _is_sleep(n) and not _marked(lines, n)]
    helpers = [
        f"{function.name} (line {function.lineno})"
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        and WAITING_NAME.fullmatch(function.name)
        for loop in ast.walk(function)
        if isinstance(loop, ast.For | ast.AsyncFor | ast.While)
        and any(_is_sleep(n) for n in ast.walk(loop))
    ]
    return bare, sorted(set(helpers))


def test_tests_wait_on_conditions_through_the_one_helper() -> None:
    """Tests wait for what they need through `tests/support/waiting.py` (`wait_for`,
    `eventually`), which hold on a busy machine where a sleep that was long enough on an
    idle one does not. So outside tests/support no function named as a waiting helper
    (`wait...`, `until...`, `eventually`, `poll...`) sleeps in a loop, and in the tests
    (the benchmarks, scripts that pace load and settle measurements, aside) each
    `time.sleep`/`asyncio.sleep` that remains is the thing under test (a slow client,
    paced load, an absence window) and says so: `# not a wait: why`, on its line or on a
    comment line right above it."""
    bare: dict[str, list[int]] = {}
    helpers: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        name = str(path.relative_to(ROOT))
        if path.is_relative_to(TESTS / "support"):
            continue
        sleeps, defined = _sleeps_and_polling_helpers(path.read_text())
        if sleeps and not path.is_relative_to(TESTS / "benchmarks"):
            bare[name] = sleeps
        if defined:
            helpers[name] = defined
    assert helpers == {}, f"polling helpers of their own (use tests/support/waiting): {helpers}"
    assert bare == {}, f"sleeps without {NOT_A_WAIT!r} (wait on the condition instead): {bare}"


@pytest.mark.parametrize(
    ("source", "bare", "helpers"),
    [
        ("import time\ntime.sleep(1)\n", [2], []),
        ("import time\ntime.sleep(1)  # not a wait: a slow client\n", [], []),
        ("import time\n# not a wait: a slow client\ntime.sleep(\n    1\n)\n", [], []),
        ("import time\n# settles\ntime.sleep(1)\n", [3], []),
        ("from asyncio import sleep\nasync def f():\n    await sleep(0)\n", [3], []),
        (
            "import time\ndef until(ok):\n    while not ok():\n"
            "        time.sleep(0.01)  # not a wait: honest?\n",
            [],
            ["until (line 2)"],
        ),
        ("def wait_ready(ps):\n    for p in ps:\n        p.wait()\n", [], []),
        ("s = 'time.sleep(60)'\n", [], []),
    ],
)
def test_the_waiting_check_finds_bare_sleeps_and_polling_helpers(
    source: str, bare: list[int], helpers: list[str]
) -> None:
    assert _sleeps_and_polling_helpers(source) == (bare, helpers)
