"""A runtime pod's /metrics text rendered from the contract (`kubeinfer.contract.metric_series`
names every series: its type, labels, help and buckets), for the operator's tests that
need a scrape in a state they choose (a queue of 3, 90 fast answers and 10 slow ones, two
GPUs' memory) without a server to drive into it. Tests that can drive one scrape a real
Rust server instead (`rust_served`, `prometheus_harness.start_runtime`).

A fresh `ContractExposition` holds what a runtime exports at start, as the Rust server
does (its metrics tests: `the_series_python_makes_at_start_are_exported...`): every
series labelled by the model alone, at zero; series with labels of their own (a status
code, a stage, a GPU) appear once a test sets them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kubeinfer.contract import metric_series as series
from kubeinfer.contract.metric_series import MODEL_LABELS, Series
from kubeinfer.runtime.engines.gpu_memory import GpuMemory
from kubeinfer.runtime.exported_series import family
from prometheus_client import CollectorRegistry, generate_latest

AT_START = (
    series.QUEUE_DEPTH, series.INFLIGHT_BATCHES, series.INFLIGHT_REQUESTS,
    series.REQUESTS_IN_PROGRESS, series.REQUEST_DURATION, series.QUEUE_DURATION,
    series.COMPUTE_DURATION, series.BATCH_SIZE, series.ENGINE_STUCK_BATCHES,
    series.BATCH_OUTPUT_ROW_MISMATCHES, series.ENGINE_BUFFER_BYTES,
)  # fmt: skip
"""The serving series a runtime exports at zero from its start."""

OPERATOR_PREFIXES = ("kubeinfer_operator_", "kubeinfer_inferencedeployment_")
"""The operator's own series (its exporter's, not a runtime pod's)."""
ACTIVATOR_PREFIX = "kubeinfer_activator_"
"""The activator's own series (its /metrics, not a runtime pod's)."""

RUNTIME_SERIES = tuple(
    value
    for value in vars(series).values()
    if isinstance(value, Series)
    and not value.name.startswith((*OPERATOR_PREFIXES, ACTIVATOR_PREFIX))
)


class ContractExposition:
    """The series of one served model (`model`, `version`) in a registry of their own."""

    def __init__(self, model: str, version: str = "1") -> None:
        self.model, self.version = model, version
        self.registry = CollectorRegistry(auto_describe=True)
        self._families: dict[str, Any] = {
            spec.name: family(spec, self.registry) for spec in RUNTIME_SERIES
        }
        for spec in AT_START:
            self._series(spec)

    def _series(self, spec: Series, **labels: str) -> Any:
        values = {"model": self.model, "version": self.version, **labels}
        names = [name for name in spec.labels if name not in MODEL_LABELS]
        assert set(labels) == set(names), f"{spec.name} takes {names}, not {sorted(labels)}"
        return self._families[spec.name].labels(*(values[name] for name in spec.labels))

    def set(self, spec: Series, value: float, **labels: str) -> None:
        """A gauge's value."""
        assert spec.kind == "gauge", spec.name
        self._series(spec, **labels).set(value)

    def add(self, spec: Series, amount: float = 1.0, **labels: str) -> None:
        """A counter's increase."""
        assert spec.kind == "counter", spec.name
        self._series(spec, **labels).inc(amount)

    def observe(self, spec: Series, value: float, **labels: str) -> None:
        """A histogram's observation."""
        assert spec.kind == "histogram", spec.name
        self._series(spec, **labels).observe(value)

    def answered(self, seconds: float, code: int = 200) -> None:
        """An inference request answered: counted by code, its duration observed."""
        self.add(series.REQUESTS, code=str(code))
        self.observe(series.REQUEST_DURATION, seconds)

    def gpu_memory(self, readings: Iterable[GpuMemory]) -> None:
        """The GPU memory gauges (no model labels: the pod's devices)."""
        for device in readings:
            labels = (str(device.index), device.name)
            self._families[series.GPU_MEMORY_USED.name].labels(*labels).set(device.used_bytes)
            self._families[series.GPU_MEMORY_TOTAL.name].labels(*labels).set(device.total_bytes)

    def text(self) -> str:
        """The exposition a scrape reads (Prometheus' text format)."""
        return generate_latest(self.registry).decode()
