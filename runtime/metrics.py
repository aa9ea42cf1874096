"""Every Prometheus metric of the runtime, defined in one place.

Each app gets its own `CollectorRegistry` (tests start several servers in one process),
and every series is labelled with the served model's name and version. Seconds are the
unit of every duration; counters end in `_total`. The operator's autoscaler and the
dashboards read these names, so they are a public interface:

| name | type | labels |
|---|---|---|
| kubeinfer_queue_depth | gauge | model, version |
| kubeinfer_inflight_batches | gauge | model, version |
| kubeinfer_request_duration_seconds | histogram | model, version |
| kubeinfer_queue_duration_seconds | histogram | model, version |
| kubeinfer_compute_duration_seconds | histogram | model, version |
| kubeinfer_batch_size | histogram (rows per batch) | model, version |
| kubeinfer_requests_total | counter | model, version, code |
| kubeinfer_gpu_memory_used_bytes | gauge (only where a GPU exists) | device, name |
| kubeinfer_gpu_memory_total_bytes | gauge (only where a GPU exists) | device, name |

The GPU gauges come from `kubeinfer.runtime.gpu_memory` (NVML), read at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from kubeinfer.runtime.gpu_memory import GpuMemory
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


# `GpuMemoryReader.read` from kubeinfer.runtime.gpu_memory: None where there is no GPU.
GpuMemoryReader = Callable[[], Iterable[GpuMemory] | None]


class _GpuMemoryCollector(Collector):
    """Reads NVML at scrape time (never on the request path)."""

    def __init__(self, read: GpuMemoryReader) -> None:
        self._read = read

    def collect(self) -> Iterable[GaugeMetricFamily]:
        used = GaugeMetricFamily(
            "kubeinfer_gpu_memory_used_bytes", "GPU memory in use.", labels=["device", "name"]
        )
        total = GaugeMetricFamily(
            "kubeinfer_gpu_memory_total_bytes", "GPU memory in all.", labels=["device", "name"]
        )
        try:
            devices = list(self._read() or ())
        except Exception:  # a failing NVML read must not fail the whole scrape
            devices = []
        for device in devices:
            used.add_metric([str(device.index), device.name], device.used_bytes)
            total.add_metric([str(device.index), device.name], device.total_bytes)
        return [used, total]


class RuntimeMetrics:
    """The metrics of one served model; also the batcher's `BatchObserver`."""

    def __init__(self, model: str, version: str, gpu_memory: GpuMemoryReader | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model", "version"]
        values = (model, version)
        r = self.registry
        self._queue_depth = Gauge(
            "kubeinfer_queue_depth", "Requests waiting in the batch queue.", labels, registry=r
        ).labels(*values)
        self._inflight = Gauge(
            "kubeinfer_inflight_batches", "Batches running on execution slots.", labels,
            registry=r,
        ).labels(*values)  # fmt: skip
        self._request = Histogram(
            "kubeinfer_request_duration_seconds",
            "Time from a request's arrival to its response, inference requests only.",
            labels, buckets=LATENCY_BUCKETS, registry=r,
        ).labels(*values)  # fmt: skip
        self._queue = Histogram(
            "kubeinfer_queue_duration_seconds",
            "Time a request waited in the queue before its batch started.",
            labels, buckets=LATENCY_BUCKETS, registry=r,
        ).labels(*values)  # fmt: skip
        self._compute = Histogram(
            "kubeinfer_compute_duration_seconds",
            "Time a batch took on its execution slot (pack, run, split).",
            labels, buckets=LATENCY_BUCKETS, registry=r,
        ).labels(*values)  # fmt: skip
        self._batch_size = Histogram(
            "kubeinfer_batch_size", "Rows per batch run by the engine.",
            labels, buckets=BATCH_SIZE_BUCKETS, registry=r,
        ).labels(*values)  # fmt: skip
        self._requests = Counter(
            "kubeinfer_requests", "Inference requests answered, by HTTP status code.",
            [*labels, "code"], registry=r,
        )  # fmt: skip
        self._values = values
        self._by_code: dict[int, Counter] = {}
        if gpu_memory is not None:
            self.registry.register(_GpuMemoryCollector(gpu_memory))

    # BatchObserver
    def queue_depth(self, depth: int) -> None:
        self._queue_depth.set(depth)

    def inflight_batches(self, count: int) -> None:
        self._inflight.set(count)

    def batch_started(self, rows: int, queue_seconds: Sequence[float]) -> None:
        self._batch_size.observe(rows)
        for seconds in queue_seconds:
            self._queue.observe(seconds)

    def batch_finished(self, compute_seconds: float) -> None:
        self._compute.observe(compute_seconds)

    # Data plane
    def request_answered(self, code: int, seconds: float) -> None:
        counter = self._by_code.get(code)
        if counter is None:
            counter = self._by_code[code] = self._requests.labels(*self._values, str(code))
        counter.inc()
        self._request.observe(seconds)
