"""Mutation testing of the pure cores with mutmut: `make mutate`.

The cores are the decisions that are pure by design (docs/STYLE: gather → decide → apply):
the reconcile decisions, the shadow verdict and rollout plan, the autoscaler's
recommendation and the quality watch's verdict. Each is mutated and its fast,
server-free tests run against every mutant. (The batcher's flush policy, assembly and
admission rules are the Rust data plane's, runtime/native/crates/core: not mutated here.)

Why a staging folder: mutmut names a mutant by its file's path (`operator/x.py` →
`operator.x`) while the code runs as `kubeinfer.operator.x` (pyproject.toml's
package-dir remaps the folders), so mutmut would find no test for any mutant. The
folder `.mutmut/` lays the sources out as they are imported (`kubeinfer/operator`,
`kubeinfer/runtime`) beside copies of tests/, crds/, examples/ and helm/, and mutmut
runs there; mutants/ inside it puts the mutated copy first on sys.path.

    python tests/mutation/run_mutmut.py            # stage, run, print the survivors
    python tests/mutation/run_mutmut.py --report   # print the last run's survivors again
    python tests/mutation/run_mutmut.py --only 'kubeinfer/operator/scaling/*.py'
        # only the cores matching the glob (repeatable): one module's score in minutes
"""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGE = ROOT / ".mutmut"

CORES = [
    "kubeinfer/operator/reconcile/*.py",
    "kubeinfer/operator/rollout/verdict.py",
    "kubeinfer/operator/rollout/shadow.py",
    "kubeinfer/operator/state/*.py",
    "kubeinfer/operator/scaling/*.py",
    "kubeinfer/operator/quality/*.py",
]
"""What is mutated: the pure decision modules (globs in the staged layout)."""

NOT_CORES = [
    "kubeinfer/operator/state/observed.py",  # the observed state's data classes
    "kubeinfer/operator/state/decision.py",  # the decision's data classes
    "*/__init__.py",
]

FAST_TESTS = [
    "tests/operator/reconcile/test_decide_build.py",
    "tests/operator/reconcile/test_decide_build_attempt.py",
    "tests/operator/reconcile/test_decide_cache_claim.py",
    "tests/operator/reconcile/test_decide_children.py",
    "tests/operator/reconcile/test_decide_drift.py",
    "tests/operator/reconcile/test_decide_engine_image.py",
    "tests/operator/reconcile/test_decide_names.py",
    "tests/operator/reconcile/test_decide_properties.py",
    "tests/operator/reconcile/test_decide_request_limit.py",
    "tests/operator/scaling/test_decide_scaling.py",
    "tests/operator/reconcile/test_decide_situation.py",
    "tests/operator/reconcile/test_decide_status.py",
    "tests/operator/commands/test_render.py",
    "tests/operator/reconcile/test_rollout_progress.py",
    "tests/operator/scaling/test_scaling_parts.py",
    "tests/operator/scaling/test_scaling_properties.py",
    "tests/operator/scaling/test_scaling_recommend.py",
    "tests/operator/scaling/test_scaling_report.py",
    "tests/operator/scaling/test_scaling_serving_pods.py",
    "tests/operator/scaling/test_scaling_startup.py",
    "tests/operator/scaling/test_scaling_trace_replay.py",
    "tests/operator/rollout/test_shadow_candidate_children.py",
    "tests/operator/rollout/test_shadow_promotion.py",
    "tests/operator/rollout/test_shadow_rollout.py",
    "tests/operator/rollout/test_shadow_verdict.py",
    "tests/operator/quality/test_quality_verdict.py",
    "tests/operator/quality/test_quality_verdict_bounds.py",
    "tests/operator/quality/test_quality_watch_children.py",
    "tests/api/test_conditions.py",
]
"""The tests run against each mutant: the cores' own tests, none of which starts a
server or the operator (mutmut runs only those that reach the mutated function)."""

COPIED = ["tests", "crds", "examples", "helm"]

PACKAGES = ["operator", "runtime", "contract", "cluster", "cli"]
"""The folders staged as `kubeinfer.<folder>`: the cores import the contract, and the
fast tests import the command line and the local cluster."""


def selected_cores(only: list[str]) -> list[str]:
    """CORES, or with `--only` the staged core files that match one of its globs (matched
    as mutmut does, `*` spanning folders). An empty selection is an error: mutmut reads
    an empty `only_mutate` as "mutate everything"."""
    if not only:
        return CORES
    staged = sorted(
        path.relative_to(STAGE).as_posix() for path in (STAGE / "kubeinfer").rglob("*.py")
    )
    selected = [
        path
        for path in staged
        if any(fnmatch.fnmatch(path, core) for core in CORES)
        and not any(fnmatch.fnmatch(path, other) for other in NOT_CORES)
        and any(fnmatch.fnmatch(path, glob) for glob in only)
    ]
    if not selected:
        raise SystemExit(f"--only {' '.join(only)} matches none of the cores: {CORES}")
    return selected


def mutmut_config(cores: list[str]) -> str:
    def toml_list(items: list[str]) -> str:
        return "[" + ", ".join(f'"{item}"' for item in items) + "]"

    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["kubeinfer"]\n'
        f"only_mutate = {toml_list(cores)}\n"
        f"do_not_mutate = {toml_list(NOT_CORES)}\n"
        f"pytest_add_cli_args_test_selection = {toml_list(FAST_TESTS)}\n"
        # The tests read these relative to their own folder (mutants/tests/..).
        f"also_copy = {toml_list(COPIED[1:])}\n"
        # Hypothesis's example database would let one mutant's failure steer the next
        # mutant's examples; each run draws its examples afresh, deterministically.
        'pytest_add_cli_args = ["-p", "no:cacheprovider", '
        '"--hypothesis-seed=0", "-x", "-q"]\n'
        "use_git_change_detection = false\n"
    )


def stage(only: list[str]) -> None:
    """Rebuild .mutmut/ from the working tree (the previous run's results are dropped)."""
    shutil.rmtree(STAGE, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.onnx", ".hypothesis")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, STAGE / "kubeinfer" / package, ignore=ignore)
    for folder in COPIED:
        shutil.copytree(ROOT / folder, STAGE / folder, ignore=ignore)
    pyproject = (ROOT / "pyproject.toml").read_text() + mutmut_config(selected_cores(only))
    (STAGE / "pyproject.toml").write_text(pyproject)


def mutmut(*args: str) -> subprocess.CompletedProcess[str]:
    executable = Path(sys.executable).with_name("mutmut")
    return subprocess.run([str(executable), *args], cwd=STAGE, text=True, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", action="store_true", help="only print the last results")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="GLOB",
        help="mutate only the cores matching GLOB (repeatable), e.g. "
        "'kubeinfer/operator/scaling/*.py'",
    )
    parser.add_argument(
        "--max-children",
        type=int,
        help="mutants run at once (mutmut's default: one per core)",
    )
    arguments = parser.parse_args()
    if not arguments.report:
        stage(arguments.only)
        children = (
            [] if arguments.max_children is None else [f"--max-children={arguments.max_children}"]
        )
        mutmut("run", *children)
    return mutmut("results").returncode


if __name__ == "__main__":
    sys.exit(main())
