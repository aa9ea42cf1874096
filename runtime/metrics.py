"""Every Prometheus metric of the runtime, defined in one place.

Each app gets its own `CollectorRegistry` (tests start several servers in one process),
and every series is labelled with the served model's name and version. Seconds are the
unit of every duration; counters end in `_total`. The operator's autoscaler and the
dashboards read these names, so they are a public interface:

| name | type | labels |
|---|---|---|
| kubeinfer_queue_depth | gauge | model, version |
| kubeinfer_inflight_batches | gauge | model, version |
| kubeinfer_inflight_requests | gauge (requests in the running batches) | model, version |
| kubeinfer_requests_in_progress | gauge (received, not yet answered) | model, version |
| kubeinfer_request_duration_seconds | histogram | model, version |
| kubeinfer_queue_duration_seconds | histogram | model, version |
| kubeinfer_compute_duration_seconds | histogram | model, version |
| kubeinfer_batch_size | histogram (rows per batch) | model, version |
| kubeinfer_requests_total | counter | model, version, code |
| kubeinfer_requests_cancelled_total | counter (client left first) | model, version, stage |
| kubeinfer_engine_stuck_batches | gauge (running past deadlines) | model, version |
| kubeinfer_batch_output_row_mismatches_total | counter (outputs not the rows) | model, version |
| kubeinfer_slo_p99_latency_seconds | gauge (only with an SLO) | model, version |
| kubeinfer_batching_queue_delay_seconds | gauge (Adaptive's delay) | model, version |
| kubeinfer_batching_preferred_batch_size | gauge (Adaptive's size) | model, version |
| kubeinfer_batching_concurrent_batches | gauge (Adaptive's batches at once) | model, version |
| kubeinfer_engine_buffer_bytes | gauge (the slots' buffers, set at start) | model, version |
| kubeinfer_known_answer_checks_total | counter (known-answer runs) | model, version, result |
| kubeinfer_known_answers_failing | gauge (1: the latest run failed) | model, version |
| kubeinfer_known_answer_error_ratio | gauge (worst error / tolerance) | model, version, output |
| kubeinfer_known_answer_seconds_total | counter (compute on probes) | model, version |
| kubeinfer_gpu_memory_used_bytes | gauge (only where a GPU exists) | device, name |
| kubeinfer_gpu_memory_total_bytes | gauge (only where a GPU exists) | device, name |

`stage` is where a request was when its client left: `reading` (its body: an abandoned
upload), `waiting` (decoding or queued: it is not executed) or `running` (its batch was
on the engine). A request refused at admission (503) is never counted in progress.

The GPU gauges come from `kubeinfer.runtime.gpu_memory` (NVML), read at scrape time.

While this runtime mirrors requests to a shadow candidate or a quality watch's reference
(`kubeinfer.runtime.shadow`), it also exports what it compared. Every series is labelled
`model`, `serving_version`, `candidate_version`, `candidate_digest` and `role` (`shadow`
for a candidate, `quality` for a watch's reference, whose version and digest fill the
candidate labels), and exists from the moment the target is read (the max gauge from the
first comparison, the per class and per slice series from their first row) until the
target changes or goes; the operator reads these names:

| name | type | meaning |
|---|---|---|
| kubeinfer_shadow_requests_total | counter | sampled requests by `outcome` (below) |
| kubeinfer_shadow_mismatches_total | counter | compared requests whose outputs disagree in kind |
| kubeinfer_shadow_max_abs_difference | gauge | largest element difference so far |
| kubeinfer_shadow_abs_difference | histogram | per request, max abs difference over outputs |
| kubeinfer_shadow_cosine_similarity | histogram | per request, the worst row's cosine |
| kubeinfer_shadow_top1_rows_total | counter | rows of outputs with classes compared |
| kubeinfer_shadow_top1_agreements_total | counter | of those, rows whose argmax agreed |
| kubeinfer_shadow_class_top1_rows_total | counter | top-1 rows by `reference_class` |
| kubeinfer_shadow_class_top1_agreements_total | counter | of those, rows that agreed |
| kubeinfer_shadow_slice_top1_rows_total | counter | top-1 rows by `slice` (quality only) |
| kubeinfer_shadow_slice_top1_agreements_total | counter | of those, rows that agreed |
| kubeinfer_shadow_kl_divergence | histogram | per request, mean KL(trusted ‖ other), nats |
| kubeinfer_shadow_serving_duration_seconds | histogram | this runtime's server time |
| kubeinfer_shadow_candidate_duration_seconds | histogram | the candidate's server time |

`outcome` is `compared`, `dropped` (no room in the mirror's queue), `candidate_error` (a
refused connection, an error status, an unreadable answer) or `timeout`. Outputs disagree
in kind when one is missing, or differs in shape or datatype, or holds NaN or an infinity
where the other holds a number. Both duration histograms cover the same compared
requests, each side's own server time (`Server-Timing`), in `SHADOW_LATENCY_BUCKETS`.

`reference_class` is the trusted side's top-1 class of a row: the serving engine's for a
shadow, the reference's for a quality watch. `slice` is the watch's slice header's value,
sanitized, the first maxSlices values by name and the rest (and a missing header) as
`other`; a shadow has no slices.

Mismatched requests are counted as compared and as mismatches only: they are observed in
neither the difference nor the cosine histograms, nor in top-1, per class, per slice or
KL. `histogram_quantile` is
Prometheus' estimator, for the runtime's `/v2/shadow` and for the operator reading
scraped buckets, so every reader of these histograms gets the same p99.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kubeinfer.contract import metrics as series
from kubeinfer.contract.metrics import Series
from kubeinfer.runtime.gpu_memory import GpuMemory
from kubeinfer.runtime.known_answers.comparison import Verdict
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# `GpuMemoryReader.read` from kubeinfer.runtime.gpu_memory: None where there is no GPU.
GpuMemoryReader = Callable[[], Iterable[GpuMemory] | None]


def family(spec: Series, registry: CollectorRegistry) -> Any:
    """The prometheus_client family of a contract `Series`, registered in `registry`."""
    kind = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}[spec.kind]
    extra = {"buckets": spec.buckets} if spec.kind == "histogram" else {}
    return kind(spec.name, spec.help, list(spec.labels), registry=registry, **extra)


class _GpuMemoryCollector(Collector):
    """Reads NVML at scrape time (never on the request path)."""

    def __init__(self, read: GpuMemoryReader) -> None:
        self._read = read

    def collect(self) -> Iterable[GaugeMetricFamily]:
        used, total = (
            GaugeMetricFamily(s.name, s.help, labels=list(s.labels))
            for s in (series.GPU_MEMORY_USED, series.GPU_MEMORY_TOTAL)
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
        values = (model, version)
        r = self.registry
        self._queue_depth = family(series.QUEUE_DEPTH, r).labels(*values)
        self._inflight = family(series.INFLIGHT_BATCHES, r).labels(*values)
        self._inflight_requests = family(series.INFLIGHT_REQUESTS, r).labels(*values)
        self._in_progress = family(series.REQUESTS_IN_PROGRESS, r).labels(*values)
        self._request = family(series.REQUEST_DURATION, r).labels(*values)
        self._queue = family(series.QUEUE_DURATION, r).labels(*values)
        self._compute = family(series.COMPUTE_DURATION, r).labels(*values)
        self._batch_size = family(series.BATCH_SIZE, r).labels(*values)
        self._requests = family(series.REQUESTS, r)
        self._cancelled = family(series.REQUESTS_CANCELLED, r)
        self._stuck_batches = family(series.ENGINE_STUCK_BATCHES, r).labels(*values)
        self._row_mismatches = family(series.BATCH_OUTPUT_ROW_MISMATCHES, r).labels(*values)
        self._slo = family(series.SLO_P99_LATENCY, r)  # a series only once there is an SLO
        self._queue_delay = family(series.BATCHING_QUEUE_DELAY, r)  # under Adaptive only
        self._preferred_size = family(series.BATCHING_PREFERRED_BATCH_SIZE, r)
        self._concurrent_batches = family(series.BATCHING_CONCURRENT_BATCHES, r)
        self._buffer_bytes = family(series.ENGINE_BUFFER_BYTES, r).labels(*values)
        self._known_answer_checks = family(series.KNOWN_ANSWER_CHECKS, r)
        self._known_answers_failing = family(series.KNOWN_ANSWERS_FAILING, r)
        self._known_answer_ratio = family(series.KNOWN_ANSWER_ERROR_RATIO, r)
        self._known_answer_seconds = family(series.KNOWN_ANSWER_SECONDS, r)
        self._values = values
        self._by_code: dict[int, Counter] = {}
        if gpu_memory is not None:
            self.registry.register(_GpuMemoryCollector(gpu_memory))

    # BatchObserver
    def queue_depth(self, depth: int) -> None:
        self._queue_depth.set(depth)

    def inflight_batches(self, count: int) -> None:
        self._inflight.set(count)

    def inflight_requests(self, count: int) -> None:
        self._inflight_requests.set(count)

    def batch_started(self, rows: int, queue_seconds: Sequence[float]) -> None:
        self._batch_size.observe(rows)
        for seconds in queue_seconds:
            self._queue.observe(seconds)

    def batch_finished(self, compute_seconds: float) -> None:
        self._compute.observe(compute_seconds)

    def stuck_batches(self, count: int) -> None:
        self._stuck_batches.set(count)

    def output_rows_mismatched(self) -> None:
        self._row_mismatches.inc()

    def slo_p99_latency(self, seconds: float) -> None:
        self._slo.labels(*self._values).set(seconds)

    def engine_buffers(self, total_bytes: int) -> None:
        self._buffer_bytes.set(total_bytes)

    def batching_setting(
        self, queue_delay_seconds: float, preferred_batch_size: int, concurrent_batches: int
    ) -> None:
        self._queue_delay.labels(*self._values).set(queue_delay_seconds)
        self._preferred_size.labels(*self._values).set(preferred_batch_size)
        self._concurrent_batches.labels(*self._values).set(concurrent_batches)

    def known_answers_checked(self, verdict: Verdict) -> None:
        """A run of the known-answer set: counted by result; a run that checked sets
        the failing gauge and each output's error ratio, and adds its compute."""
        self._known_answer_checks.labels(*self._values, verdict.result).inc()
        if not verdict.checked:
            return
        self._known_answers_failing.labels(*self._values).set(0 if verdict.passed else 1)
        self._known_answer_seconds.labels(*self._values).inc(verdict.seconds)
        for output in verdict.outputs:
            self._known_answer_ratio.labels(*self._values, output.name).set(output.error_ratio)

    # Data plane
    def request_started(self) -> None:
        self._in_progress.inc()

    def request_finished(self) -> None:
        self._in_progress.dec()

    def request_cancelled(self, stage: str) -> None:
        self._cancelled.labels(*self._values, stage).inc()

    def request_answered(self, code: int, seconds: float) -> None:
        counter = self._by_code.get(code)
        if counter is None:
            counter = self._by_code[code] = self._requests.labels(*self._values, str(code))
        counter.inc()
        self._request.observe(seconds)
