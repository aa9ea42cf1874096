"""Writes the Argo CD customization's testdata from a run of the real operator:

    .venv/bin/python tests/gitops/capture_statuses.py

starts a control plane of its own (`cluster_harness`), runs every situation of
`operator_statuses` (quality drift included: a few minutes on two cores), and writes
`testdata/<situation>.yaml` (the object as the API server held it, see `as_testdata`),
`testdata/progressing_readyConditionBehind.yaml` (derived from the newGeneration capture,
see below) and the actions' testdata: the shadowing object, and what it becomes with the
patch `kubeinfer promote|abort` would send (`commands.gate.gate_patch`).
`tests/gitops/test_health_on_the_control_plane.py` checks, on every `make test`, that the
operator still writes what these files hold.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

TESTS = Path(__file__).resolve().parents[1]
OPERATOR_TESTS = [
    TESTS / "operator",
    *sorted(p for p in (TESTS / "operator").iterdir() if p.is_dir()),
]
sys.path[:0] = [str(TESTS / "support"), *map(str, OPERATOR_TESTS), str(TESTS / "gitops")]

from cluster_harness import start_local_cluster  # noqa: E402
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp  # noqa: E402
from kubeinfer.operator.commands.gate import gate_patch  # noqa: E402
from operator_harness import Model, World, grant_operator_role  # noqa: E402
from operator_statuses import CUSTOMIZATION, as_testdata, capture  # noqa: E402

CAPTURED = (
    "# Captured from the real operator on the real control plane by\n# {script}: do not edit.\n"
)
DERIVED = (
    "# Derived by {script} from progressing_newGeneration.yaml: status.observedGeneration\n"
    "# set to metadata.generation, the Ready condition's left behind (the operator writes\n"
    "# both in one patch, so only a status written by hand or by another controller\n"
    "# looks like this).\n"
)
SCRIPT = "tests/gitops/capture_statuses.py"


def write(path: Path, header: str, obj: dict[str, Any]) -> None:
    text = yaml.safe_dump(obj, sort_keys=False, width=100, allow_unicode=True)
    path.write_text(header.format(script=SCRIPT) + text)
    print(f"Wrote {path.relative_to(TESTS.parent)}")


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = apply_merge_patch(merged.get(key), value)
    return merged


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="kubeinfer-capture-") as temporary:
        cluster_directory = Path(temporary) / "cluster"
        models = Path(tempfile.mkdtemp(prefix="kubeinfer-capture-", dir="/var/tmp"))
        models.chmod(0o755)
        tiny = Model(build_tiny_mlp(models / "tiny.onnx"))
        clusters = start_local_cluster(cluster_directory)
        cluster = next(clusters)
        try:
            namespace = cluster.new_namespace("capture")
            world = World(cluster, cluster.admin(namespace))
            grant_operator_role(world)
            captured, _ = asyncio.run(capture(world, tiny, models, quality=True))
        finally:
            clusters.close()
            shutil.rmtree(models, ignore_errors=True)

    testdata = CUSTOMIZATION / "testdata"
    for name, obj in sorted(captured.items()):
        write(testdata / f"{name}.yaml", CAPTURED, as_testdata(obj))
    behind = as_testdata(captured["progressing_newGeneration"])
    behind["status"]["observedGeneration"] = behind["metadata"]["generation"]
    write(testdata / "progressing_readyConditionBehind.yaml", DERIVED, behind)

    actions = CUSTOMIZATION / "actions" / "testdata"
    shadowing = as_testdata(captured["progressing_shadowing"])
    write(actions / "shadowing.yaml", CAPTURED, shadowing)
    for action in ("promote", "abort"):
        patch, _ = gate_patch(shadowing, action, None)
        after = (
            "# progressing_shadowing.yaml with the patch `kubeinfer {action}` sends\n"
            "# (commands.gate.gate_patch), written by {script}.\n"
        ).replace("{action}", action)
        write(actions / f"shadowing_{action}.yaml", after, apply_merge_patch(shadowing, patch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
