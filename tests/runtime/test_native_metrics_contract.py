"""The Rust data plane registers the runtime's Prometheus series from a listing generated
from `kubeinfer.contract.metrics` (`runtime/native/crates/server/src/metrics/contract.tsv`,
written by `contract_tsv.py` beside it), so it exports the names, types, labels, help and
buckets the operator reads. A contract change that does not regenerate the listing fails
here, before a Rust server exports stale names; the listing holds every series the Python
runtime registers."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from kubeinfer.contract import metrics
from kubeinfer.runtime.metrics import RuntimeMetrics

LISTING = Path(__file__).resolve().parents[2] / "runtime/native/crates/server/src/metrics"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("contract_tsv", LISTING / "contract_tsv.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def listed() -> list[str]:
    return (LISTING / "contract.tsv").read_text().splitlines()


def test_the_rust_servers_listing_is_what_the_contract_declares() -> None:
    assert generator().rows(metrics) == listed(), "regenerate contract.tsv (contract_tsv.py)"


def test_the_listing_holds_every_series_the_python_runtime_registers() -> None:
    registered = {family.name for family in RuntimeMetrics("m", "1").registry.collect()}
    names = {line.split("\t")[0] for line in listed()}
    assert registered and registered <= names, registered - names
