"""Writes `contract.tsv`: the runtime's Prometheus series as `kubeinfer/contract/metric_series.py`
names them (every `Series` but the operator's and the activator's own), which the Rust
server registers as they are; with `--activator`, `activator.tsv`: the activator's series,
which the Rust activator registers (`crate::activator::metrics`). Run from the repository
root after changing the contract:

    python runtime/native/crates/server/src/metrics/contract_tsv.py > \
        runtime/native/crates/server/src/metrics/contract.tsv
    python runtime/native/crates/server/src/metrics/contract_tsv.py --activator > \
        runtime/native/crates/server/src/metrics/activator.tsv

Columns: name, kind, labels (comma-separated), buckets (Python's repr, comma-separated),
help. Reads the contract module by path, so it needs nothing installed (the module imports
only the standard library)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parents[6]
OPERATOR_PREFIXES = ("kubeinfer_operator_", "kubeinfer_inferencedeployment_")
ACTIVATOR_PREFIX = "kubeinfer_activator_"


def contract_module() -> ModuleType:
    """`kubeinfer/contract/metric_series.py`, loaded from this checkout."""
    path = ROOT / "contract/metric_series.py"
    spec = importlib.util.spec_from_file_location("contract_metric_series", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up
    spec.loader.exec_module(module)
    return module


def rows(module: ModuleType, activator: bool = False) -> list[str]:
    """One line per runtime series of the contract `module` (`activator`: per activator
    series instead), in its order."""
    lines = []
    for value in vars(module).values():
        if not isinstance(value, module.Series) or value.name.startswith(OPERATOR_PREFIXES):
            continue
        if value.name.startswith(ACTIVATOR_PREFIX) != activator:
            continue
        fields = (
            value.name,
            value.kind,
            ",".join(value.labels),
            ",".join(repr(float(b)) for b in value.buckets),
            value.help,
        )
        assert not any("\t" in f or "\n" in f for f in fields), value.name
        lines.append("\t".join(fields))
    return lines


if __name__ == "__main__":
    print("\n".join(rows(contract_module(), activator="--activator" in sys.argv[1:])))
