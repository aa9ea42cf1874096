"""Every Prometheus metric of the runtime, as `kubeinfer.contract.metric_series` names them.

The Rust data plane exports the serving series at `/metrics` from its own registry
(runtime/native/crates/server/src/metrics, whose table the contract's is checked
against); every series is labelled with the served model's name and version. Seconds are the
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

The GPU gauges come from `kubeinfer.runtime.engines.gpu_memory` (NVML), read on a thread of their
own and set in the server's registry (`rust_dataplane.GpuMemoryGauges`); the known-answer
series are set by `rust_dataplane.publish_verdict` after each run.

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

from typing import Any

from kubeinfer.contract.metric_series import Series
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


def family(spec: Series, registry: CollectorRegistry) -> Any:
    """The prometheus_client family of a contract `Series`, registered in `registry`."""
    kind = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}[spec.kind]
    extra = {"buckets": spec.buckets} if spec.kind == "histogram" else {}
    return kind(spec.name, spec.help, list(spec.labels), registry=registry, **extra)
