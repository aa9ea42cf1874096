"""The runtime's typed configuration: what `kubeinfer serve` runs with.

`BatchingPolicy` is the single definition of the dynamic batcher's knobs: the operator's
InferenceDeployment spec embeds it (so the CRD schema is generated from it) and renders
it into the runtime's ConfigMap, and `kubeinfer serve` validates it at start. Field
docstrings become the CRD's descriptions, which `kubectl explain` prints. Every model here
is an `ApiModel` (`kubeinfer.contract.api_model`), with its cross-field rules.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from kubeinfer.contract.api_model import ApiModel, CrossFieldRule
from pydantic import Field, ValidationInfo, field_validator

BatchSize = Annotated[int, Field(ge=1, le=1024)]

UNSIZED_REQUEST_BYTES = 16 * 1024 * 1024
"""The request limit of a model whose largest request has no size in bytes (a string
input), unless maxRequestBytes sets one."""
JSON_BYTES_PER_TENSOR_BYTE = 8
"""Headroom for JSON in `request_bytes_limit`: the most text a tensor byte becomes (an
INT8 `-128, ` or a BOOL `false, ` is 6-7 characters per byte, an FP32 as Python writes it
`0.12345678901234568, ` about 5 per byte)."""
REQUEST_HEADER_BYTES = 64 * 1024
"""Room for the rest of a request besides its tensors: names, shapes, parameters."""


def request_bytes_limit(input_bytes_per_row: int, max_batch_size: int) -> int:
    """The body limit for a model whose inputs take at most `input_bytes_per_row` bytes per
    row in binary (at each input's largest allowed shape): a full batch of them as JSON,
    plus room for the request's other fields. `kubeinfer serve` derives its default from
    the loaded model with it, and the operator from the build's report, so both agree."""
    return max(
        1024,
        input_bytes_per_row * max_batch_size * JSON_BYTES_PER_TENSOR_BYTE + REQUEST_HEADER_BYTES,
    )


MAX_RANK = 8
"""Most axes an input may have besides the batch one (`InputShape`)."""

Shape = Annotated[list[Annotated[int, Field(ge=0, le=1_000_000)]], Field(max_length=MAX_RANK)]


class InputShape(ApiModel):
    """The shapes one model input may take, its batch dimension left out (the batch is
    bounded by maxBatchSize): what a TensorRT optimization profile states, and what bounds
    the runtime's buffers. Axes the model fixes take the model's size; each axis the model
    leaves variable (`sequence_length`) needs its range here."""

    cross_field_rules = (
        CrossFieldRule(
            cel="size(self.minShape) == size(self.maxShape) && "
            "size(self.optShape) == size(self.maxShape)",
            message="minShape, optShape and maxShape must have one entry per axis each",
            field="maxShape",
            holds=lambda s: len(s.min_shape) == len(s.opt_shape) == len(s.max_shape),
        ),
        CrossFieldRule(
            cel="[0, 1, 2, 3, 4, 5, 6, 7].all(i, i >= size(self.maxShape) || "
            "i >= size(self.minShape) || i >= size(self.optShape) || "
            "(self.minShape[i] <= self.optShape[i] && self.optShape[i] <= self.maxShape[i]))",
            message="each axis needs minShape <= optShape <= maxShape",
            field="optShape",
            holds=lambda s: all(
                a <= b <= c for a, b, c in zip(s.min_shape, s.opt_shape, s.max_shape, strict=False)
            ),
        ),
    )

    name: str = Field(min_length=1, max_length=256)
    """The model input's name."""

    min_shape: Shape
    """The smallest extent of each axis after the batch one (e.g. [1] for token ids of at
    least one token)."""

    opt_shape: Shape
    """The extents the engine is tuned for (TensorRT's optimization profile); requests of
    any shape in range are served."""

    max_shape: Shape
    """The largest extent of each axis after the batch one; larger requests are refused
    with 400, and the runtime's buffers and request size limit are sized from it."""

    pad_value: float | None = None
    """With shapeBatching PadToBuckets, what fills this input where a request is padded
    (0 for token ids, attention masks and token types); unset, the input is never padded,
    so requests share a batch only when they agree on its variable axes (a decoder's past
    key/values, which no mask hides)."""


class ShapeBatching(StrEnum):
    """How requests whose inputs differ in a variable axis (a sequence length) share
    batches."""

    EQUAL_SHAPES = "EqualShapes"
    """Only requests of the same shape share a batch: no padding and no wasted compute, but
    with many distinct lengths in flight, batches are small."""
    PAD_TO_BUCKETS = "PadToBuckets"
    """Each padded axis is rounded up to the next of shapeBuckets and requests of the same
    rounded shape share a batch, padded with each input's padValue; every output axis named
    like a padded input axis is cut back to the request's own extent. Larger batches, at
    the cost of computing the padding."""


class BatchingPolicyKind(StrEnum):
    """Who sets the batcher's queue delay and preferred batch size."""

    STATIC = "Static"
    """The configured maxQueueDelayMicroseconds and preferredBatchSizes, always."""
    ADAPTIVE = "Adaptive"
    """The runtime, online, from its measured compute time per batch size and arrival
    rate, to keep p99 under the SLO less sloMarginPercent at the highest throughput (and
    how many batches run at once, within executionSlots)."""


class BatchingPolicy(ApiModel):
    """How the runtime's dynamic batcher forms batches."""

    cross_field_rules = (
        CrossFieldRule(
            cel="self.preferredBatchSizes.all(s, s <= self.maxBatchSize)",
            message="every preferredBatchSizes entry must be at most maxBatchSize",
            field="preferredBatchSizes",
            holds=lambda p: all(s <= p.max_batch_size for s in p.preferred_batch_sizes),
        ),
    )

    max_batch_size: int = Field(default=32, ge=1, le=1024)
    """Largest batch (in items along the first dimension) the batcher sends to the engine."""

    max_queue_delay_microseconds: int = Field(default=2000, ge=0, le=1_000_000)
    """Longest a request waits for others to join its batch. The batcher waits only when a
    larger batch can help (a preferred size is not yet reached); a lone request on an idle
    server runs at once."""

    preferred_batch_sizes: list[Annotated[int, Field(ge=1, le=1024)]] = Field(
        default_factory=list, max_length=16
    )
    """Batch sizes the engine runs best at (e.g. its optimisation profile's sizes); the
    batcher flushes as soon as one is reached. Each must be at most maxBatchSize."""

    @field_validator("preferred_batch_sizes")
    @classmethod
    def _sorted_sizes(cls, sizes: list[int]) -> list[int]:
        # Sorted once here, so the batcher's per-decision lookup needs no sort.
        return sorted(set(sizes))

    execution_slots: int | None = Field(default=None, ge=1, le=16)
    """Batches run concurrently. Each slot owns buffers preallocated for maxBatchSize (and a
    CUDA stream on GPU), so a second slot overlaps copies with the first slot's compute.
    When unset, the engine's own choice: 2 for TensorRT, 1 for ONNX Runtime on CPU, whose
    threads already use every core (a second slot there halves the batches and costs more
    CPU per request)."""

    max_queue_size: int = Field(default=1024, ge=1, le=1_000_000)
    """Most requests waiting in the queue; beyond it requests are refused at once with 503
    and Retry-After, so latency never grows without bound."""

    default_timeout_milliseconds: int = Field(default=10_000, ge=1, le=3_600_000)
    """Deadline of a request that sets no `timeout` parameter; a request still queued at its
    deadline is answered with a timeout error and never executed."""

    policy: BatchingPolicyKind = BatchingPolicyKind.STATIC
    """Static: the queue delay and preferred batch sizes above, always. Adaptive (needs
    slo.p99LatencyMilliseconds): the runtime chooses its queue delay, one preferred batch
    size, and whether batches run side by side on the execution slots, online, from its
    own measured compute time per batch size (alone and beside another batch) and the
    arrival rate, for the highest throughput whose predicted p99 stays under the SLO less
    sloMarginPercent; maxQueueDelayMicroseconds and preferredBatchSizes apply until its
    first batch is measured. Adaptive acts where a batch can wait for a free slot: with one
    execution slot, batches form only while that slot is busy, under either policy."""

    shape_batching: ShapeBatching = ShapeBatching.EQUAL_SHAPES
    """For models with variable axes besides the batch (a sequence length): EqualShapes
    batches only requests of one shape together; PadToBuckets pads requests up to the next
    of shapeBuckets along the axes of inputs that have a padValue, and batches those of
    one padded shape together. Models whose inputs have no variable axis ignore it."""

    shape_buckets: list[Annotated[int, Field(ge=1, le=1_000_000)]] = Field(
        default_factory=list, max_length=64
    )
    """With PadToBuckets, the extents a padded axis is rounded up to (e.g. [16, 32, 64,
    128]); an extent past the last goes up to the axis' maxShape. Empty: powers of two
    (and the axis' maxShape)."""

    @field_validator("shape_buckets")
    @classmethod
    def _sorted_buckets(cls, sizes: list[int]) -> list[int]:
        return sorted(set(sizes))

    slo_margin_percent: int = Field(default=20, ge=0, le=90)
    """With policy Adaptive, the share of the SLO kept out of the batcher's aim, in percent:
    the batcher sees its queue and compute time only, not reading, decoding and answering
    a request, nor the network; and its predictions err. A share of the SLO keeps the
    same meaning whatever the SLO."""


class EngineSource(ApiModel):
    """Which engine a runtime serves: an ONNX file as it is, or an engine from the
    content-addressed cache by digest (verified against its manifest before serving)."""

    cross_field_rules = (
        CrossFieldRule(
            cel="has(self.onnxPath) != has(self.digest)",
            message="set exactly one of onnxPath and digest",
            field="digest",
            holds=lambda s: (s.onnx_path is None) != (s.digest is None),
        ),
        CrossFieldRule(
            cel="!has(self.digest) || has(self.cacheDirectory)",
            message="an engine digest needs cacheDirectory",
            field="cacheDirectory",
            holds=lambda s: s.digest is None or s.cache_directory is not None,
        ),
    )

    onnx_path: str | None = None
    """An ONNX model file served with ONNX Runtime as it is (no build)."""

    digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    """An engine in the cache, by digest (sha256:<64 hex>)."""

    cache_directory: str | None = None
    """The engine cache's root directory (the mounted cache volume)."""


class RuntimeConfig(ApiModel):
    """Everything `kubeinfer serve` needs: the operator renders this model, serialized,
    into the runtime's ConfigMap; flags override it field by field."""

    cross_field_rules = (
        CrossFieldRule(
            cel="self.batching.policy != 'Adaptive' || has(self.sloP99LatencyMilliseconds)",
            message="batching policy Adaptive needs sloP99LatencyMilliseconds",
            field="batching.policy",
            holds=lambda c: (
                c.batching.policy != BatchingPolicyKind.ADAPTIVE
                or c.slo_p99_latency_milliseconds is not None
            ),
        ),
    )

    model_name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    """The served model's name (the {name} in /v2/models/{name}/infer)."""

    model_version: str = Field(default="1", max_length=63)
    """The served model's version, reported in metadata and metric labels."""

    engine: EngineSource
    """The engine to serve."""

    batching: BatchingPolicy = Field(default_factory=BatchingPolicy)
    """The dynamic batcher's policy."""

    input_shapes: list[InputShape] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """The shape range of each model input with a variable axis besides the batch (inputs
    the model fixes need no entry)."""

    slo_p99_latency_milliseconds: float | None = Field(default=None, gt=0, le=3_600_000)
    """The p99 latency objective (the InferenceDeployment's slo.p99LatencyMilliseconds):
    exported as kubeinfer_slo_p99_latency_seconds, and held by batching policy Adaptive."""

    host: str = "0.0.0.0"
    """Address the HTTP server listens on."""

    http_port: int = Field(default=8000, ge=1, le=65535)
    """Port of the v2 inference API and /metrics."""

    grpc_port: int | None = Field(default=None, ge=1, le=65535)
    """Port of the Open Inference Protocol's gRPC service (`inference.GRPCInferenceService`)
    beside the HTTP API, on the same data plane; none: no gRPC."""

    @field_validator("grpc_port")
    @classmethod
    def _grpc_port_apart(cls, port: int | None, info: ValidationInfo) -> int | None:
        if port is not None and port == info.data.get("http_port"):
            raise ValueError(f"grpcPort {port} is the httpPort; each needs its own port")
        return port

    max_request_bytes: int | None = Field(default=None, ge=1024)
    """Largest request body accepted, after inflation when compressed; larger ones are
    refused with 413 (gRPC: RESOURCE_EXHAUSTED) before their body is read, or as soon as
    it passes the limit. Unset: the model's largest allowed request, maxBatchSize rows of
    each input at its largest shape, as JSON (`request_bytes_limit`; 16 MiB for a model
    with a string input, whose size no shape bounds)."""

    header_read_timeout_seconds: float = Field(default=10, gt=0, le=3600)
    """A connection that has not delivered a complete request head this long after it
    opened or after its last answer is closed: a stalled head and an idle keep-alive
    connection alike (aiohttp's keep-alive timeout; keep a gateway's upstream idle
    timeout below it, so that the gateway is the one to close idle connections)."""

    body_read_timeout_seconds: float = Field(default=10, gt=0, le=3600)
    """Longest pause between two parts of a request body; a stalled upload is answered
    408 and its connection closed. The request's deadline bounds the whole body too."""

    engine_stuck_liveness_seconds: float = Field(default=30, gt=0, le=86400)
    """A batch still running past the deadlines of all its requests makes the runtime
    unready at once; if it has not returned this long after that, liveness fails too, so
    Kubernetes restarts the pod."""

    drain_grace_period_seconds: float = Field(default=30, ge=0, le=3600)
    """After SIGTERM, how long queued and in-flight requests may take to be answered
    before the process exits anyway."""

    intra_op_threads: int | None = Field(default=None, ge=1, le=256)
    """ONNX Runtime intra-op threads of the one thread pool the execution slots share
    (slots share one session); ONNX Runtime's default when unset."""

    mirror_target_file: str | None = None
    """A file holding a `MirrorFile` (YAML or JSON) that the runtime re-reads every
    mirrorPollIntervalMilliseconds: a shadow candidate and a quality watch's reference to
    mirror live requests to. A
    missing or empty file means no mirroring; an invalid one is logged and leaves the
    previous target in place."""

    mirror_poll_interval_milliseconds: int = Field(default=1000, ge=10, le=600_000)
    """How often the mirror target file is re-read."""


class MirrorPolicy(ApiModel):
    """How a serving runtime mirrors live requests to a shadow candidate. The mirror sits
    beside the request path, never in it: a request is answered first, then offered to the
    mirror's bounded queue; what does not fit is dropped and counted, so a dead, slow or
    erroring candidate changes nothing for the caller."""

    max_concurrency: int = Field(default=4, ge=1, le=256)
    """Mirrored requests in flight to the candidate at once."""

    max_queue_size: int = Field(default=64, ge=1, le=100_000)
    """Mirrored requests waiting for a free slot; beyond it they are dropped."""

    max_queued_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, le=16 * 1024**3)
    """Bytes of input and output tensors held by waiting mirrored requests; beyond it they
    are dropped, so a mirror never holds more memory than this."""

    timeout_milliseconds: int = Field(default=2000, ge=1, le=600_000)
    """Longest the serving runtime waits for the candidate's answer to one mirrored request."""


class MirrorTarget(ApiModel):
    """The candidate a serving runtime mirrors to, and which share of its requests."""

    url: str = Field(pattern=r"^https?://[^/\s]+$", max_length=2048)
    """The candidate's base URL (scheme, host and port; e.g. its Service)."""

    model_name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    """The model name the candidate serves (requests go to /v2/models/{name}/infer)."""

    candidate_version: str = Field(max_length=63)
    """The candidate's model version (a metric label)."""

    candidate_digest: str = Field(default="", max_length=71)
    """The candidate's engine digest (a metric label), so the aggregates of one candidate
    are never mixed with another's."""

    traffic_percent: int = Field(default=10, ge=1, le=100)
    """Share of answered requests mirrored, in percent (deterministic: exactly this share
    of every hundred)."""

    policy: MirrorPolicy = Field(default_factory=MirrorPolicy)
    """Queue, concurrency and timeout of the mirror."""


class QualityWatch(ApiModel):
    """The quality watch of a serving runtime: a share of its answered requests mirrored to
    its own model version's reference-precision engine (the `reference`, through the same
    mirror as a shadow candidate), compared request by request, and tallied overall, per
    reference top-1 class and per slice, under the role `quality`."""

    reference: MirrorTarget
    """The reference engine's runtime; its `trafficPercent` is the watch's samplePercent,
    its `candidateVersion` and `candidateDigest` name the reference engine."""

    slice_header: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$", max_length=128
    )
    """A request header whose value names the sub-population a request belongs to (a
    tenant, a locale); none: no slices."""

    max_slices: int = Field(default=16, ge=1, le=256)
    """Distinct slice values tallied under their own name; later ones count as `other`, so
    a header nobody controls cannot grow the series without bound."""

    window_seconds: int = Field(default=3600, ge=30, le=7 * 86400)
    """The sliding window the exemplars are kept over (the verdict's window)."""

    max_exemplars: int = Field(default=16, ge=0, le=1024)
    """Inputs kept that disagreed most with the reference in the window."""

    max_exemplar_bytes: int = Field(default=8 * 1024 * 1024, ge=0, le=1024**3)
    """Bytes of input tensors the exemplars may hold, in all."""


class MirrorFile(ApiModel):
    """The content of the mirror target file a serving runtime re-reads while it runs (the
    operator renders it into a ConfigMap of its own, mounted as a directory, so a shadow
    or a quality watch starts and ends without restarting the serving pods)."""

    target: MirrorTarget | None = None
    """The shadow candidate to mirror to; none: no shadow."""

    quality_watch: QualityWatch | None = None
    """The quality watch; none: no watch. It runs beside a shadow, with a mirror of its own."""
