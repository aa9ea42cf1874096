"""The Rust data plane registers the runtime's Prometheus series from a listing generated
from `kubeinfer.contract.metric_series` (`runtime/native/crates/server/src/metrics/contract.tsv`,
written by `contract_tsv.py` beside it), so it exports the names, types, labels, help and
buckets the operator reads; the activator's own series likewise (`activator.tsv`, written by
`contract_tsv.py --activator`). A contract change that does not regenerate a listing fails
here, before a Rust server exports stale names; and a scrape of a Rust server serving a
model, after a request, is OpenMetrics (as its Content-Type says) of contract series only,
each with its contract type, help and labels."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from kubeinfer.contract import metric_series
from kubeinfer.contract.runtime_config import EngineSource, RuntimeConfig
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from rust_served import rust_served

LISTING = Path(__file__).resolve().parents[2] / "runtime/native/crates/server/src/metrics"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("contract_tsv", LISTING / "contract_tsv.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def listed(name: str = "contract.tsv") -> list[str]:
    return (LISTING / name).read_text().splitlines()


def test_the_rust_servers_listing_is_what_the_contract_declares() -> None:
    assert generator().rows(metric_series) == listed(), "regenerate contract.tsv (contract_tsv.py)"


def test_the_rust_activators_listing_is_what_the_contract_declares() -> None:
    rows = generator().rows(metric_series, activator=True)
    assert rows == listed("activator.tsv"), "regenerate activator.tsv (contract_tsv.py --activator)"
    assert all(row.startswith("kubeinfer_activator_") for row in rows)


def test_a_served_models_scrape_exports_contract_series_only(tiny_model: Path) -> None:
    members = vars(metric_series).values()
    contract = {v.name: v for v in members if isinstance(v, metric_series.Series)}
    config = RuntimeConfig(
        model_name="tiny", engine=EngineSource(onnx_path=str(tiny_model)), host="127.0.0.1"
    )
    engine = OnnxRuntimeEngine(tiny_model, 8, intra_op_threads=1)
    body = b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [%s]}]}'
    try:
        with rust_served(config, engine) as served:
            assert (
                served.request("POST", served.infer_path, body % b",".join([b"0.5"] * 16))[0] == 200
            )
            _, headers, scraped = served.request("GET", "/metrics")
    finally:
        engine.close()
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    families = list(text_string_to_metric_families(scraped.decode()))  # strict: # EOF too
    names = {f.name for f in families}
    assert names >= {"kubeinfer_requests", "kubeinfer_request_duration_seconds"}
    for family in families:
        series = contract.get(family.name)
        assert series is not None, f"{family.name} is not a contract series"
        assert (family.type, family.documentation) == (series.kind, series.help), family.name
        for sample in family.samples:
            labels = set(sample.labels) - {"le"}
            assert labels == set(series.labels), (sample.name, sample.labels)
