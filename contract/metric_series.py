"""The runtime's Prometheus series, and the operator's own, named once: the runtime
registers its series, the operator's named queries read them (through Prometheus or a
pod's /metrics), and the chart's dashboard and alerts (`kubeinfer.cli.monitoring`) quote
them. A `Series` is a family's name, type, labels, help and buckets;
counters are exported with `_total` (`Series.total`), histograms with `_bucket`, `_sum`
and `_count`. Also here: the buckets' reasons, and `histogram_quantile`, which both the
runtime (for /v2/shadow) and the operator's direct read compute as Prometheus does.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

MODEL_LABELS = ("model", "version")
"""Every serving series: the model and version a runtime pod serves."""
SHADOW_LABELS = ("model", "serving_version", "candidate_version", "candidate_digest", "role")
"""Every mirror series: the serving pod's view of one mirror target (its engine digest),
and the target's role, so a shadow candidate and a quality watch's reference running at
once (even on the same engine) are never mixed."""
MIRROR_ROLES = ("shadow", "quality")
"""`role`: a shadow candidate (judged to replace the serving engine), or the quality
watch's reference (the serving version at reference precision, judging the serving
engine)."""
OTHER_SLICE = "other"
"""The `slice` of requests past the watch's maxSlices distinct values, and of requests
without the slice header."""
GPU_LABELS = ("device", "name")

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

# Per-request KL divergence in nats: 1-2-5 steps from what float rounding leaves (1e-6) to
# answers that share nothing (10).
SHADOW_KL_BUCKETS = (
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 0.001, 0.002, 0.005, 0.01, 0.02,
    0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip


@dataclass(frozen=True)
class Series:
    """One metric family."""

    name: str
    kind: Literal["counter", "gauge", "histogram"]
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()

    @property
    def total(self) -> str:
        """A counter's sample name."""
        assert self.kind == "counter", self.name
        return f"{self.name}_total"


# -- serving ------------------------------------------------------------------------------
QUEUE_DEPTH = Series(
    "kubeinfer_queue_depth", "gauge", MODEL_LABELS, "Requests waiting in the batch queue."
)
INFLIGHT_BATCHES = Series(
    "kubeinfer_inflight_batches", "gauge", MODEL_LABELS, "Batches running on execution slots."
)
INFLIGHT_REQUESTS = Series(
    "kubeinfer_inflight_requests",
    "gauge",
    MODEL_LABELS,
    "Requests in the batches running on execution slots (queued ones not included).",
)
REQUESTS_IN_PROGRESS = Series(
    "kubeinfer_requests_in_progress",
    "gauge",
    MODEL_LABELS,
    "Inference requests received and not yet answered: queued, running, or waiting to be "
    "decoded or answered (the autoscaler's load signal).",
)
REQUEST_DURATION = Series(
    "kubeinfer_request_duration_seconds",
    "histogram",
    MODEL_LABELS,
    "Time from a request's arrival to its response, inference requests only.",
    LATENCY_BUCKETS,
)
QUEUE_DURATION = Series(
    "kubeinfer_queue_duration_seconds",
    "histogram",
    MODEL_LABELS,
    "Time a request waited in the queue before its batch started.",
    LATENCY_BUCKETS,
)
COMPUTE_DURATION = Series(
    "kubeinfer_compute_duration_seconds",
    "histogram",
    MODEL_LABELS,
    "Time a batch took on its execution slot (pack, run, split).",
    LATENCY_BUCKETS,
)
BATCH_SIZE = Series(
    "kubeinfer_batch_size",
    "histogram",
    MODEL_LABELS,
    "Rows per batch run by the engine.",
    BATCH_SIZE_BUCKETS,
)
REQUESTS = Series(
    "kubeinfer_requests",
    "counter",
    (*MODEL_LABELS, "code"),
    "Inference requests answered, by HTTP status code.",
)
REQUESTS_CANCELLED = Series(
    "kubeinfer_requests_cancelled",
    "counter",
    (*MODEL_LABELS, "stage"),
    "Inference requests whose client left before their answer, by stage.",
)
ENGINE_STUCK_BATCHES = Series(
    "kubeinfer_engine_stuck_batches",
    "gauge",
    MODEL_LABELS,
    "Batches still running on the engine past the deadlines of all their requests.",
)
BATCH_OUTPUT_ROW_MISMATCHES = Series(
    "kubeinfer_batch_output_row_mismatches",
    "counter",
    MODEL_LABELS,
    "Batches failed (every request of them answered 500) because an output's first axis "
    "did not hold the batch's rows: the model's outputs did not line up with its requests.",
)
SLO_P99_LATENCY = Series(
    "kubeinfer_slo_p99_latency_seconds",
    "gauge",
    MODEL_LABELS,
    "The p99 latency objective this runtime serves under (slo.p99LatencyMilliseconds); "
    "absent without one.",
)
BATCHING_QUEUE_DELAY = Series(
    "kubeinfer_batching_queue_delay_seconds",
    "gauge",
    MODEL_LABELS,
    "Longest a request waits for others to join its batch, as batching policy Adaptive "
    "chose it last (absent under Static: maxQueueDelayMicroseconds applies).",
)
BATCHING_PREFERRED_BATCH_SIZE = Series(
    "kubeinfer_batching_preferred_batch_size",
    "gauge",
    MODEL_LABELS,
    "Rows at which a forming batch is flushed at once, as batching policy Adaptive chose "
    "it last (absent under Static: preferredBatchSizes applies).",
)
BATCHING_CONCURRENT_BATCHES = Series(
    "kubeinfer_batching_concurrent_batches",
    "gauge",
    MODEL_LABELS,
    "Most batches run at once, as batching policy Adaptive chose it last: every execution "
    "slot, or 1 where they were measured not to add up (absent under Static).",
)
ENGINE_BUFFER_BYTES = Series(
    "kubeinfer_engine_buffer_bytes",
    "gauge",
    MODEL_LABELS,
    "Bytes the execution slots reserve for input and output buffers: per slot, a full "
    "batch (maxBatchSize rows) of every tensor at its largest allowed shape (a model with "
    "variable axes maps those pages as its batches reach them).",
)
KNOWN_ANSWER_RESULTS = ("passed", "failed", "skipped")
KNOWN_ANSWER_CHECKS = Series(
    "kubeinfer_known_answer_checks",
    "counter",
    (*MODEL_LABELS, "result"),
    "Runs of the engine's known-answer set (at start and on demand), by result: passed, "
    "failed, or skipped (no set recorded, or probes this configuration cannot run).",
)
KNOWN_ANSWERS_FAILING = Series(
    "kubeinfer_known_answers_failing",
    "gauge",
    MODEL_LABELS,
    "1 when the latest run of the known-answer set failed (an output of a probe beyond its "
    "tolerance, or the engine raised), else 0.",
)
KNOWN_ANSWER_ERROR_RATIO = Series(
    "kubeinfer_known_answer_error_ratio",
    "gauge",
    (*MODEL_LABELS, "output"),
    "The latest known-answer run's worst probe error on this output over its tolerance "
    "(above 1 fails).",
)
KNOWN_ANSWER_SECONDS = Series(
    "kubeinfer_known_answer_seconds",
    "counter",
    MODEL_LABELS,
    "Engine compute seconds spent running the known-answer set.",
)
GPU_MEMORY_USED = Series(
    "kubeinfer_gpu_memory_used_bytes", "gauge", GPU_LABELS, "GPU memory in use."
)
GPU_MEMORY_TOTAL = Series(
    "kubeinfer_gpu_memory_total_bytes", "gauge", GPU_LABELS, "GPU memory in all."
)

# -- shadow -------------------------------------------------------------------------------
SHADOW_OUTCOMES = ("compared", "dropped", "candidate_error", "timeout")
SHADOW_REQUESTS = Series(
    "kubeinfer_shadow_requests",
    "counter",
    (*SHADOW_LABELS, "outcome"),
    "Requests sampled for the shadow candidate, by outcome.",
)
SHADOW_MISMATCHES = Series(
    "kubeinfer_shadow_mismatches",
    "counter",
    SHADOW_LABELS,
    "Compared requests whose outputs differ in name, shape or datatype.",
)
SHADOW_MAX_ABS_DIFFERENCE = Series(
    "kubeinfer_shadow_max_abs_difference",
    "gauge",
    SHADOW_LABELS,
    "Largest element difference, candidate against serving, since the mirror started.",
)
SHADOW_ABS_DIFFERENCE = Series(
    "kubeinfer_shadow_abs_difference",
    "histogram",
    SHADOW_LABELS,
    "Per compared request, the largest element difference over its outputs.",
    SHADOW_DIFFERENCE_BUCKETS,
)
SHADOW_COSINE_SIMILARITY = Series(
    "kubeinfer_shadow_cosine_similarity",
    "histogram",
    SHADOW_LABELS,
    "Per compared request, the cosine similarity of its worst row.",
    SHADOW_COSINE_BUCKETS,
)
SHADOW_TOP1_ROWS = Series(
    "kubeinfer_shadow_top1_rows",
    "counter",
    SHADOW_LABELS,
    "Rows of outputs with classes compared (argmax over the last axis).",
)
SHADOW_TOP1_AGREEMENTS = Series(
    "kubeinfer_shadow_top1_agreements",
    "counter",
    SHADOW_LABELS,
    "Compared rows whose argmax agreed.",
)
SHADOW_CLASS_TOP1_ROWS = Series(
    "kubeinfer_shadow_class_top1_rows",
    "counter",
    (*SHADOW_LABELS, "reference_class"),
    "Compared rows by the trusted side's top-1 class (the serving engine's for a shadow, "
    "the reference's for a quality watch).",
)
SHADOW_CLASS_TOP1_AGREEMENTS = Series(
    "kubeinfer_shadow_class_top1_agreements",
    "counter",
    (*SHADOW_LABELS, "reference_class"),
    "Of those, the rows whose argmax agreed.",
)
SHADOW_SLICE_TOP1_ROWS = Series(
    "kubeinfer_shadow_slice_top1_rows",
    "counter",
    (*SHADOW_LABELS, "slice"),
    "Compared rows by the request's slice (the quality watch's slice header).",
)
SHADOW_SLICE_TOP1_AGREEMENTS = Series(
    "kubeinfer_shadow_slice_top1_agreements",
    "counter",
    (*SHADOW_LABELS, "slice"),
    "Of those, the rows whose argmax agreed.",
)
SHADOW_KL_DIVERGENCE = Series(
    "kubeinfer_shadow_kl_divergence",
    "histogram",
    SHADOW_LABELS,
    "Per compared request whose outputs are probabilities or logits, the mean over its rows "
    "of KL(trusted || other) of their softmax distributions, in nats.",
    SHADOW_KL_BUCKETS,
)
SHADOW_SERVING_DURATION = Series(
    "kubeinfer_shadow_serving_duration_seconds",
    "histogram",
    SHADOW_LABELS,
    "This runtime's own server time of each compared request.",
    SHADOW_LATENCY_BUCKETS,
)
SHADOW_CANDIDATE_DURATION = Series(
    "kubeinfer_shadow_candidate_duration_seconds",
    "histogram",
    SHADOW_LABELS,
    "The candidate's own server time (its Server-Timing) of each compared request.",
    SHADOW_LATENCY_BUCKETS,
)


# -- the activator (`kubeinfer activator`, issue 44) -----------------------------------------
# It holds the requests of an InferenceDeployment scaled to zero until a pod is ready; the
# operator reads held counts to wake it (from /v2/activator, or these). Its own /metrics,
# apart from any runtime pod's: labelled by the InferenceDeployment's public Service.
ACTIVATOR_LABELS = ("namespace", "service")
ACTIVATOR_OUTCOMES = (
    "forwarded",
    "refused_full",
    "refused_hold_timeout",
    "refused_draining",
    "refused_body",
    "cancelled",
    "backend_error",
)
"""How a routed request ended at the activator: sent to a ready pod, refused at once
(its route held maxHeldRequestsPerRoute), refused when holdTimeoutSeconds passed, refused
because the activator stopped before a pod was ready, refused for its body (413, 408),
left by its client while held, or failed by the pod (502)."""
# From a warm start's milliseconds to a cold one's minutes (image pull, engine load), up
# to past the default hold timeout (120 s).
ACTIVATOR_HOLD_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
    300.0,
)  # fmt: skip
ACTIVATOR_HELD_REQUESTS = Series(
    "kubeinfer_activator_held_requests",
    "gauge",
    ACTIVATOR_LABELS,
    "Requests the activator holds for this Service until one of its pods is ready.",
)
ACTIVATOR_REQUESTS = Series(
    "kubeinfer_activator_requests",
    "counter",
    (*ACTIVATOR_LABELS, "outcome"),
    "Requests routed to this Service by the activator, by how they ended: forwarded, "
    "refused_full, refused_hold_timeout, refused_draining, refused_body, cancelled, "
    "backend_error.",
)
ACTIVATOR_HOLD_DURATION = Series(
    "kubeinfer_activator_hold_seconds",
    "histogram",
    ACTIVATOR_LABELS,
    "Time from a request's arrival at the activator to its forwarding to a ready pod.",
    ACTIVATOR_HOLD_BUCKETS,
)
ACTIVATOR_UNROUTED_REQUESTS = Series(
    "kubeinfer_activator_unrouted_requests",
    "counter",
    (),
    "Requests the activator answered 404: no route of its table is for their host or model.",
)


# -- the operator's own series (its /metrics, `kubeinfer operator --metrics-port`) ----------
# Each InferenceDeployment's state as the operator's last pass wrote it, as kube-state-
# metrics exports a Deployment's and Flux its objects' (`gotk_reconcile_condition`): what
# an alert or a dashboard needs of the status without reading the API. Only the replica
# holding the leader Lease exports them. Their `namespace` is the object's: a scrape keeps
# it with `honorLabels` (the chart's PodMonitor sets it).
OBJECT_LABELS = ("namespace", "name")
INFERENCE_DEPLOYMENT_CONDITION = Series(
    "kubeinfer_inferencedeployment_condition",
    "gauge",
    (*OBJECT_LABELS, "type", "status", "reason"),
    "1 for each condition in the InferenceDeployment's status, labelled with its type, "
    "status and reason.",
)
INFERENCE_DEPLOYMENT_REPLICAS = Series(
    "kubeinfer_inferencedeployment_replicas",
    "gauge",
    OBJECT_LABELS,
    "Serving pods desired (status.replicas, what the scale subresource reads).",
)
INFERENCE_DEPLOYMENT_READY_REPLICAS = Series(
    "kubeinfer_inferencedeployment_ready_replicas",
    "gauge",
    OBJECT_LABELS,
    "Serving pods ready (status.readyReplicas).",
)
INFERENCE_DEPLOYMENT_WRONG_ANSWERS = Series(
    "kubeinfer_inferencedeployment_wrong_answers",
    "gauge",
    (*OBJECT_LABELS, "pod", "node", "reason"),
    "1 for each pod the known-answer checks took out of serving that still exists "
    "(status.wrongAnswers), labelled with its node and reason (KnownAnswersFailed or "
    "AnswersDifferFromPeers). A pod taken out leaves its Service and PodMonitor, so its own "
    "kubeinfer_known_answers_failing is no longer scraped; this series stays.",
)
INFERENCE_DEPLOYMENT_SUSPECT_NODE = Series(
    "kubeinfer_inferencedeployment_suspect_node",
    "gauge",
    (*OBJECT_LABELS, "node"),
    "1 for each node where pods of more than one engine of this InferenceDeployment answered "
    "wrong (status.suspectNodes): the node, not an engine, is the likely cause.",
)
INFERENCE_DEPLOYMENT_POD_PRICE_PER_HOUR = Series(
    "kubeinfer_inferencedeployment_pod_price_per_hour",
    "gauge",
    (*OBJECT_LABELS, "pod"),
    "For each serving pod on a node the operator has a price for (settings cost."
    "pricePerNodeHour), what the pod costs per hour: its share of the node (requested GPUs "
    "over the node's, or requested CPU over its allocatable CPU) times the node's price per "
    "hour, in the currency of the prices. Absent while the pod is not on a priced node.",
)
METRICS_READERS = ("shadow", "quality", "scaling", "cost")
"""What the operator reads from the serving pods' metrics: the shadow verdict's aggregates,
the quality watch's window, the autoscaler's signals, the inferences the cost divides."""
INFERENCE_DEPLOYMENT_METRICS_UNAVAILABLE = Series(
    "kubeinfer_inferencedeployment_metrics_unavailable",
    "gauge",
    (*OBJECT_LABELS, "reader"),
    "1 when the operator's last read of the serving pods' metrics for this reader failed "
    "(the decision it feeds waits or holds), 0 when it was read.",
)

# The operator's own activity (`kubeinfer.operator.telemetry.activity`): what its cost per object is
# read from, on every replica (a standby's stay still).
OPERATOR_RECONCILE_DURATION = Series(
    "kubeinfer_operator_reconcile_duration_seconds",
    "histogram",
    (),
    "Seconds from the trigger that queued a reconcile pass to its end, waiting for the "
    "object's turn included.",
    (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
OPERATOR_RECONCILES = Series(
    "kubeinfer_operator_reconciles",
    "counter",
    ("result",),
    "Reconcile passes, by result: ok, gone (the object no longer exists), invalid (a spec "
    "the model refuses), error (a request failed; retried).",
)
OPERATOR_API_REQUESTS = Series(
    "kubeinfer_operator_api_requests",
    "counter",
    ("verb",),
    "The operator's own requests to the API server by verb (kopf's watches not included).",
)
OPERATOR_WATCH_EVENTS = Series(
    "kubeinfer_operator_watch_events",
    "counter",
    ("resource",),
    "Watch events the operator's handlers took, by resource.",
)
OPERATOR_OWNER_READS = Series(
    "kubeinfer_operator_owner_reads",
    "counter",
    ("source",),
    "A reconcile pass's reads of its InferenceDeployment, by source: cache (the watch's "
    "index) or api (a GET, when the index is older than what the operator knows).",
)
OPERATOR_METRICS_QUERIES = Series(
    "kubeinfer_operator_metrics_queries",
    "counter",
    ("kind",),
    "Queries sent to a metrics source: prometheus (one query for one object), "
    "prometheus_grouped (one query for every object it reads), pod (one pod's /metrics).",
)


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
    bounds: list[float] = []
    counts: list[float] = []
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
