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
| kubeinfer_connections_closed_total | counter (stalled heads) | model, version, reason |
| kubeinfer_engine_stuck_batches | gauge (running past deadlines) | model, version |
| kubeinfer_gpu_memory_used_bytes | gauge (only where a GPU exists) | device, name |
| kubeinfer_gpu_memory_total_bytes | gauge (only where a GPU exists) | device, name |

`stage` is where a request was when its client left: `reading` (its body: an abandoned
upload), `waiting` (decoding or queued: it is not executed) or `running` (its batch was
on the engine). A request refused at admission (503) is never counted in progress.

The GPU gauges come from `kubeinfer.runtime.gpu_memory` (NVML), read at scrape time.

While this runtime mirrors requests to a shadow candidate (`kubeinfer.runtime.shadow`),
it also exports what it compared. Every series is labelled `model`, `serving_version`,
`candidate_version`, `candidate_digest`, and exists from the moment the candidate's target
is read (the max gauge from the first comparison) until the target changes or goes; the
operator reads these names:

| name | type | meaning |
|---|---|---|
| kubeinfer_shadow_requests_total | counter | sampled requests by `outcome` (below) |
| kubeinfer_shadow_mismatches_total | counter | compared requests whose outputs disagree in kind |
| kubeinfer_shadow_max_abs_difference | gauge | largest element difference so far |
| kubeinfer_shadow_abs_difference | histogram | per request, max abs difference over outputs |
| kubeinfer_shadow_cosine_similarity | histogram | per request, the worst row's cosine |
| kubeinfer_shadow_top1_rows_total | counter | rows of outputs with classes compared |
| kubeinfer_shadow_top1_agreements_total | counter | of those, rows whose argmax agreed |
| kubeinfer_shadow_primary_duration_seconds | histogram | this runtime's server time |
| kubeinfer_shadow_candidate_duration_seconds | histogram | the candidate's server time |

`outcome` is `compared`, `dropped` (no room in the mirror's queue), `candidate_error` (a
refused connection, an error status, an unreadable answer) or `timeout`. Outputs disagree
in kind when one is missing, or differs in shape or datatype, or holds NaN or an infinity
where the other holds a number. Both duration histograms cover the same compared
requests, each side's own server time (`Server-Timing`), in `SHADOW_LATENCY_BUCKETS`.

Mismatched requests are counted as compared and as mismatches only: they are observed in
neither the difference nor the cosine histograms, nor in top-1. `histogram_quantile` is
Prometheus' estimator, for the runtime's `/v2/shadow` and for the operator reading
scraped buckets, so every reader of these histograms gets the same p99.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence

from kubeinfer.runtime.gpu_memory import GpuMemory
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

# Geometric buckets, ratio 2^(1/6) (12 %), from 2^-12 s (0.24 ms) to 2^4 s (16 s): the
# operator gates a candidate on a 10 % p99 regression, and `histogram_quantile` can only
# interpolate linearly inside a bucket, so a bucket must be about as fine as the gate.
SHADOW_LATENCY_BUCKETS: tuple[float, ...] = tuple(2.0 ** (k / 6) for k in range(-72, 25))
# Per-request largest element difference, in the output's units: 1-2-5 steps over the range
# from float rounding (1e-6) to a different model (100).
SHADOW_DIFFERENCE_BUCKETS = (
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 0.001, 0.002, 0.005, 0.01, 0.02,
    0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0,
)  # fmt: skip
# Per-request worst-row cosine: what matters is how close to 1 it stays. No negative bound:
# prometheus_client leaves `_sum` out of a histogram with one, and the mean needs it (a
# negative cosine lands in the 0 bucket).
SHADOW_COSINE_BUCKETS = (
    0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.998, 0.999, 0.9995, 0.9999, 0.99999,
    1.0,
)  # fmt: skip


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' `histogram_quantile(q, ...)` over classic buckets: `buckets` are (upper
    bound, cumulative count) pairs, in any order, the last bound +Inf (as scraped, or
    summed bucket by bucket over several series). The same linear interpolation inside
    the bucket holding rank q*count, the lowest bucket starting at 0, and a rank in the
    +Inf bucket answered with the highest finite bound. None where Prometheus answers
    NaN: no observations, no +Inf bucket, fewer than two buckets. Counts that decrease
    with the bound (a scrape caught mid-update) are made monotonic, as Prometheus does.
    """
    if q != q:  # NaN
        return None
    if q < 0:
        return float("-inf")
    if q > 1:
        return float("inf")
    ordered = sorted(buckets)
    if len(ordered) < 2 or ordered[-1][0] != float("inf"):
        return None
    bounds, counts = [], []
    for bound, count in ordered:  # coalesce equal bounds, then force monotonic
        if bounds and bound == bounds[-1]:
            counts[-1] += count
            continue
        bounds.append(bound)
        counts.append(float(count))
    for i in range(1, len(counts)):
        counts[i] = max(counts[i], counts[i - 1])
    if len(bounds) < 2:
        return None
    observations = counts[-1]
    if observations == 0:
        return None
    rank = q * observations
    b = bisect.bisect_left(counts, rank, 0, len(counts) - 1)
    if b == len(counts) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    return start + (end - start) * (rank / count)


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
        self._inflight_requests = Gauge(
            "kubeinfer_inflight_requests",
            "Requests in the batches running on execution slots (queued ones not included).",
            labels, registry=r,
        ).labels(*values)  # fmt: skip
        self._in_progress = Gauge(
            "kubeinfer_requests_in_progress",
            "Inference requests received and not yet answered: queued, running, or waiting "
            "to be decoded or answered (the autoscaler's load signal).",
            labels, registry=r,
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
        self._cancelled = Counter(
            "kubeinfer_requests_cancelled",
            "Inference requests whose client left before their answer, by stage.",
            [*labels, "stage"], registry=r,
        )  # fmt: skip
        self._connections_closed = Counter(
            "kubeinfer_connections_closed",
            "Connections the server closed on its own, by reason (header_timeout).",
            [*labels, "reason"], registry=r,
        )  # fmt: skip
        self._stuck_batches = Gauge(
            "kubeinfer_engine_stuck_batches",
            "Batches still running on the engine past the deadlines of all their requests.",
            labels, registry=r,
        ).labels(*values)  # fmt: skip
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

    # Data plane
    def request_started(self) -> None:
        self._in_progress.inc()

    def request_finished(self) -> None:
        self._in_progress.dec()

    def request_cancelled(self, stage: str) -> None:
        self._cancelled.labels(*self._values, stage).inc()

    def connection_closed(self, reason: str) -> None:
        self._connections_closed.labels(*self._values, reason).inc()

    def request_answered(self, code: int, seconds: float) -> None:
        counter = self._by_code.get(code)
        if counter is None:
            counter = self._by_code[code] = self._requests.labels(*self._values, str(code))
        counter.inc()
        self._request.observe(seconds)
