"""The InferenceDeployment spec and status: what an SRE writes and what kubectl reads.

These models are the API. The CRD in `crds/` is generated from them (`kubeinfer crds`),
their field docstrings are what `kubectl explain` prints, and `kubeinfer validate` and the
operator validate manifests with them. Units are part of field names.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from kubeinfer.contract.api_model import ApiModel, CrossFieldRule
from kubeinfer.contract.runtime_config import (
    BatchingPolicy,
    BatchingPolicyKind,
    InputShape,
    MirrorPolicy,
)
from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.api.v1alpha1.enums import (
    Backend,
    Phase,
    Precision,
    RolloutStrategy,
)
from kubeinfer.operator.api.v1alpha1.gpu_fleet import FLEET_RULES, GpuFleetSpec
from kubeinfer.operator.api.v1alpha1.metadata import ObjectMeta
from kubeinfer.operator.api.v1alpha1.patterns import (
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    ENGINE_DIGEST,
    LABEL_VALUE,
    MODEL_URI,
    PVC_URI_RULE,
    QUANTITY,
    SHA256_HEX,
)
from kubeinfer.operator.api.v1alpha1.quality_watch import QualityWatchSpec
from kubeinfer.operator.api.v1alpha1.status import (
    CandidateStatus,
    EngineStatus,
    InferenceDeploymentStatus,
    MetricsStatus,
    VersionStatus,
)
from kubeinfer.operator.api.v1alpha1.topology_spread import TopologySpreadSpec
from pydantic import Field

# The enums, metadata and status models live in their own modules; they are re-exported
# here, the module that describes a whole InferenceDeployment.
__all__ = [
    "AutoscalingSpec",
    "Backend",
    "CandidateStatus",
    "EngineStatus",
    "InferenceDeploymentStatus",
    "MetricsStatus",
    "ObjectMeta",
    "Phase",
    "Precision",
    "QualityWatchSpec",
    "RolloutStrategy",
    "VersionStatus",
]

Quantity = Annotated[str, Field(pattern=QUANTITY, max_length=64)]


class SecretReference(ApiModel):
    """A Secret in the InferenceDeployment's namespace."""

    name: str = Field(pattern=DNS1123_LABEL, max_length=253)
    """The Secret's name. Its keys are passed to the model fetcher as environment variables
    (e.g. AWS_ACCESS_KEY_ID for s3://)."""


class ModelSource(ApiModel):
    """Where the ONNX model is fetched from."""

    cross_field_rules = (PVC_URI_RULE,)

    uri: str = Field(pattern=MODEL_URI, max_length=2048)
    """The model's location: file://, https://, http:// (a server inside the cluster; give
    sha256), s3://, gs:// or pvc://CLAIM/PATH (CLAIM a PersistentVolumeClaim in the same
    namespace, mounted read-only by the build Job; PATH the file inside it, relative,
    without '.' or '..' segments). It names the .onnx file,
    whose external data files (torch's model.onnx.data) are fetched from beside it, or a
    folder holding one .onnx file (an https folder ends with / and lists its files)."""

    sha256: str | None = Field(default=None, pattern=SHA256_HEX)
    """The .onnx file's expected sha256 (64 lowercase hex digits); a download that does not
    match is refused."""

    secret_ref: SecretReference | None = None
    """Credentials for the source, if it needs any."""


class ModelSpec(ApiModel):
    """The model being served."""

    name: str = Field(pattern=DNS1123_LABEL, max_length=63)
    """The name clients use in /v2/models/{name}/infer (a DNS-1123 label)."""

    version: str = Field(pattern=LABEL_VALUE, max_length=63)
    """The model's version; changing it rolls out a new engine. Must be a valid label
    value, since it labels every child object."""

    source: ModelSource
    """Where the ONNX model comes from."""


class CalibrationSpec(ApiModel):
    """INT8 calibration data: an .npz file with one array per model input, each of shape
    [samples, ...input shape without batch]."""

    cross_field_rules = (PVC_URI_RULE,)

    uri: str = Field(pattern=MODEL_URI, max_length=2048)
    """Location of the .npz calibration file (same schemes as the model source)."""

    sha256: str | None = Field(default=None, pattern=SHA256_HEX)
    """The calibration file's expected sha256."""


class CacheSpec(ApiModel):
    """The content-addressed engine cache: a PersistentVolumeClaim shared by the build Job
    and the runtime pods. Either the operator creates a claim (size, storageClassName) or
    an existing claim is named (existingClaim)."""

    cross_field_rules = (
        CrossFieldRule(
            cel="!(has(self.existingClaim) && has(self.storageClassName))",
            message="storageClassName applies only to a claim the operator creates; "
            "leave it out with existingClaim",
            field="storageClassName",
            holds=lambda c: not (c.existing_claim and c.storage_class_name),
        ),
    )

    existing_claim: str | None = Field(default=None, pattern=DNS1123_SUBDOMAIN, max_length=253)
    """An existing PersistentVolumeClaim to use as the cache; the operator creates none."""

    size: Quantity = "10Gi"
    """Capacity of the claim the operator creates (a Kubernetes quantity)."""

    storage_class_name: str | None = Field(default=None, max_length=253)
    """StorageClass of the claim the operator creates; the cluster default when unset."""

    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] = "ReadWriteOnce"
    """Access mode of the claim the operator creates, fixed when it is created.
    ReadWriteOnce works on every storage class but attaches to one node: pods on another
    node wait (Multi-Attach), so with more than one runtime pod the CacheAttachRisk
    condition warns. ReadWriteMany, where the class supports it, lets pods on several
    nodes share one cache."""


OutputName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[^,]+$")]
"""A model output's name, as the model has it (no comma: the build's flag lists them)."""


class AccuracyGate(ApiModel):
    """Limits on what a lower precision may cost, checked against the fp32 reference when
    the engine is built; an engine that fails them is not published."""

    max_top1_drop: float | None = Field(default=None, ge=0, le=1)
    """Largest acceptable fall in top-1 agreement with fp32 (0.01 is one point)."""

    min_cosine: float | None = Field(default=None, ge=-1, le=1)
    """Smallest acceptable cosine similarity between the engine's outputs and fp32's."""

    gate_outputs: list[OutputName] | None = Field(default=None, min_length=1, max_length=64)
    """The outputs that hold the scores (a classifier's logits or probabilities), which the
    gates judge; the others (hidden states, key/value caches) are compared and reported
    only. Unset: the outputs whose name contains logit, prob or score, else every
    output."""


class EngineSpec(ApiModel):
    """How the model becomes an engine: built once per set of inputs into the cache, or
    pinned to a known-good engine by digest."""

    cross_field_rules = (
        CrossFieldRule(
            cel="self.precision != 'int8' || has(self.calibration) || has(self.pin)",
            message="precision int8 needs calibration data unless the engine is pinned",
            field="calibration",
            holds=lambda e: (
                e.precision != Precision.INT8 or e.calibration is not None or e.pin is not None
            ),
        ),
        CrossFieldRule(
            cel="self.backend != 'tensorrt' || !has(self.inputShapes) || "
            "size(self.inputShapes) == 0",
            message="inputShapes needs backend onnxruntime: TensorRT plans are served with "
            "fixed shapes besides the batch",
            field="inputShapes",
            holds=lambda e: e.backend != Backend.TENSORRT or not e.input_shapes,
        ),
        CrossFieldRule(
            cel="!has(self.pin) || self.pin.matches('^sha256:[0-9a-f]{64}$')",
            message="pin must be sha256: followed by 64 lowercase hex digits",
            field="pin",
            holds=lambda e: e.pin is None or re.fullmatch(ENGINE_DIGEST, e.pin) is not None,
        ),
    )

    backend: Backend = Backend.ONNXRUNTIME
    """tensorrt (GPU nodes) or onnxruntime (CPU)."""

    precision: Precision = Precision.FP32
    """fp32, fp16 or int8 (int8 needs calibration unless pinned)."""

    max_batch_size: int = Field(default=32, ge=1, le=1024)
    """Largest batch the engine is built for (its optimisation profile spans 1..this)."""

    calibration: CalibrationSpec | None = None
    """INT8 calibration data; required for int8 unless the engine is pinned."""

    pin: str | None = Field(default=None, max_length=71)
    """Serve exactly this engine from the cache (sha256:<64 hex>) and build nothing."""

    cache: CacheSpec = Field(default_factory=CacheSpec)
    """Where engines are stored."""

    accuracy: AccuracyGate | None = None
    """Accuracy gates for reduced-precision builds."""

    input_shapes: list[InputShape] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """The shape range of each model input with a variable axis besides the batch (a
    sequence length): minShape, optShape and maxShape of the axes after the batch one, as
    a TensorRT optimization profile states them, and the padValue that
    runtime.batching.shapeBatching PadToBuckets pads with. The runtime refuses requests
    outside the range (400) and sizes its buffers and request limit from maxShape; inputs
    the model fixes need no entry."""


class Toleration(ApiModel):
    """A pod toleration (core/v1 Toleration)."""

    key: str | None = Field(default=None, max_length=317)
    """The taint key; empty with operator Exists matches every taint."""

    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists or Equal."""

    value: str | None = Field(default=None, max_length=63)
    """The taint value, for operator Equal."""

    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """The taint effect to match; all effects when unset."""

    toleration_seconds: int | None = Field(default=None, ge=0)
    """For NoExecute, how long the pod stays bound after the taint appears."""


class ResourceSpec(ApiModel):
    """Compute resources of each runtime pod."""

    gpus: int = Field(default=0, ge=0, le=16)
    """NVIDIA GPUs (nvidia.com/gpu) per pod; tensorrt needs at least one."""

    cpu: Quantity | None = None
    """CPU request and limit per pod, e.g. "2"."""

    memory: Quantity | None = None
    """Memory request and limit per pod, e.g. "4Gi"."""


class RuntimeSpec(ApiModel):
    """The runtime pods: dynamic-batching inference servers."""

    cross_field_rules = (
        CrossFieldRule(
            cel="!has(self.grpcPort) || (self.grpcPort != 8000 && self.grpcPort != 9090)",
            message="grpcPort must differ from the runtime's HTTP port (8000) and the "
            "Service's metrics port (9090)",
            field="grpcPort",
            holds=lambda r: r.grpc_port not in (8000, 9090),
        ),
    )

    image: str | None = Field(default=None, max_length=512)
    """Runtime container image; the operator's default image when unset."""

    replicas: int = Field(default=1, ge=0, le=1000)
    """Pods to run while autoscaling is off (`kubectl scale` sets this)."""

    resources: ResourceSpec = Field(default_factory=ResourceSpec)
    """Per-pod GPUs, CPU and memory."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the pods (and engine builds) must match."""

    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Taints the pods (and engine builds) tolerate."""

    topology_spread: TopologySpreadSpec = Field(default_factory=TopologySpreadSpec)
    """How the runtime pods spread over zones and nodes (by default both, as a
    preference), so a node or a zone lost takes as few of them as the cluster allows."""

    gpu_product: str | None = Field(default=None, pattern=LABEL_VALUE, max_length=63)
    """The nvidia.com/gpu.product node label value (e.g. NVIDIA-H100-80GB-HBM3) that both
    engine builds and runtime pods must match, since a TensorRT engine only runs on the
    GPU it was built for."""

    gpu_fleet: GpuFleetSpec | None = None
    """With backend tensorrt and neither gpuProduct nor engine.pin, the engine is built
    once per eligible GPU product and each product's pods run its own engine (a mixed
    fleet, docs/gpu-fleets.md): which products are eligible (default: every product found
    among the cluster's GPU nodes) and how the pods are split across them (default: in
    proportion to their GPUs)."""

    batching: BatchingPolicy = Field(default_factory=BatchingPolicy)
    """The dynamic batcher's policy."""

    grpc_port: int | None = Field(default=None, ge=1, le=65535)
    """Port of the Open Inference Protocol over gRPC (inference.GRPCInferenceService) on
    the runtime pods and their Services, beside HTTP on 8000 (Triton's clients use 8001);
    unset: HTTP only."""


class ShadowThresholds(ApiModel):
    """When a shadowed candidate is good enough to promote. Each is checked on the
    aggregates of every mirrored request compared so far, over all serving pods."""

    max_absolute_output_difference: float = Field(default=0.01, ge=0)
    """Largest acceptable absolute difference between one element of the candidate's output
    and the serving engine's, over every compared request. A request whose outputs differ
    in name, shape or datatype breaks it whatever its value. Broken at any time, the
    candidate fails at once (the largest difference can only grow)."""

    min_top1_agreement: float = Field(default=0.99, ge=0, le=1)
    """Smallest acceptable share of compared rows whose top-1 class (argmax over the last
    axis of outputs with at least 2 classes) agrees with the serving engine's (0..1).
    Checked once minSamples requests are compared; not applicable to models without such
    outputs."""

    max_p99_latency_regression_percent: float = Field(default=10, ge=0, le=1000)
    """Largest acceptable increase of the candidate's p99 latency over the serving
    engine's on the same mirrored requests, in percent. Both are the servers' own time
    for a request; the candidate receives only the mirrored share of the traffic, so its
    batches are smaller than serving's. Checked once minSamples requests are compared."""


class ShadowSpec(ApiModel):
    """Shadow testing: the serving pods mirror a share of their live requests to the
    candidate, compare its answers with their own, and the operator promotes it or rolls it
    back on the thresholds."""

    traffic_percent: int = Field(default=10, ge=1, le=100)
    """Share of live requests mirrored to the candidate, in percent."""

    replicas: int = Field(default=1, ge=1, le=100)
    """Candidate pods; fixed for the shadow's duration (autoscaling never changes it)."""

    min_samples: int = Field(default=1000, ge=1, le=10_000_000)
    """Mirrored requests compared before a verdict."""

    max_duration_seconds: int = Field(default=3600, ge=1, le=604_800)
    """Longest a shadow test runs, from the candidate's start; a candidate without
    minSamples compared requests by then fails (and is rolled back)."""

    thresholds: ShadowThresholds = Field(default_factory=ShadowThresholds)
    """Promotion thresholds."""

    mirror: MirrorPolicy = Field(default_factory=MirrorPolicy)
    """How the serving pods mirror: queue, concurrency and timeout. Mirrored work never
    delays or fails a live request; what does not fit is dropped and counted."""


class RolloutSpec(ApiModel):
    """How a new model version or engine replaces the serving one."""

    strategy: RolloutStrategy = RolloutStrategy.ROLLING
    """Rolling (replace pods as soon as the new engine is ready) or Shadow (run the new
    engine as a candidate beside the serving one, mirror live traffic to it, compare the
    answers request by request, then promote or roll back on the thresholds). The first
    engine of an InferenceDeployment has nothing to be compared with and is deployed
    directly."""

    shadow: ShadowSpec = Field(default_factory=ShadowSpec)
    """Shadow test settings, used with strategy Shadow."""


class PrometheusSpec(ApiModel):
    """A Prometheus server that scrapes the runtime pods."""

    url: str | None = Field(default=None, pattern=r"^https?://.+$", max_length=2048)
    """Prometheus base URL; the operator's default (Helm value prometheus.url) when unset."""


class QueryOverrides(ApiModel):
    """PromQL that replaces one of the operator's named queries for this object, when the
    figures come from Prometheus (e.g. where a recording rule or other labels serve
    better). `$namespace` and `$pods` stand for the object's namespace and a regex of its
    serving pods' names, escaped as the inside of a double-quoted string, so write them
    in double quotes: `{namespace="$namespace", pod=~"$pods"}` (`$$` is a literal `$`).
    Each query must answer one series or a scalar (aggregate with `avg`, `max`...); no
    series reads as no figure. A query Prometheus refuses, or one answering several
    series, makes the autoscaler hold the count, with the field named in the status.
    Without Prometheus (the pods' own /metrics), the built-in definitions apply."""

    requests_in_progress_per_replica: str | None = Field(
        default=None, min_length=1, max_length=4096
    )
    """Replaces `requests_in_progress_per_replica`: requests received and not yet answered per
    pod. The built-in is `avg(sum by (namespace, pod)
    (kubeinfer_requests_in_progress{...}))`, over every pod Prometheus scrapes; with
    kube-state-metrics, `avg((<the same sum>) and on (namespace, pod)
    (kube_pod_status_ready{condition="true"} == 1))` averages over the ready ones only."""

    gpu_memory_used_ratio: str | None = Field(default=None, min_length=1, max_length=4096)
    """Replaces `gpu_memory_used_ratio`: the highest used/total ratio over the pods' GPUs
    (built-in: `max(kubeinfer_gpu_memory_used_bytes{...} /
    (kubeinfer_gpu_memory_total_bytes{...} > 0))`)."""


class MonitoringSpec(ApiModel):
    """Where the operator reads the runtime pods' metrics: shadow verdicts and the
    autoscaler read them. From Prometheus when a URL is set here or in the operator's
    settings; otherwise the operator reads each runtime pod's /metrics itself."""

    prometheus: PrometheusSpec = Field(default_factory=PrometheusSpec)
    """The Prometheus to query."""

    queries: QueryOverrides = Field(default_factory=QueryOverrides)
    """PromQL overrides of the named queries, for this object."""


class SloSpec(ApiModel):
    """Service level objectives: the status reports the serving pods' p99 against them
    (`status.slo`, the SLOMet condition), and the autoscaler may scale up on a sustained
    miss (autoscaling.scaleUpOnSloMissAfterSeconds)."""

    p99_latency_milliseconds: float | None = Field(default=None, gt=0, le=3_600_000)
    """Objective for the serving pods' p99 request latency (arrival to response), in
    milliseconds."""


class InferenceDeploymentSpec(ApiModel):
    """The desired state of a model served on Kubernetes."""

    cross_field_rules = (
        CrossFieldRule(
            cel="self.runtime.batching.maxBatchSize <= self.engine.maxBatchSize",
            message="runtime.batching.maxBatchSize must be at most engine.maxBatchSize",
            field="runtime.batching.maxBatchSize",
            holds=lambda s: s.runtime.batching.max_batch_size <= s.engine.max_batch_size,
        ),
        CrossFieldRule(
            cel="self.engine.backend != 'tensorrt' || self.runtime.resources.gpus >= 1",
            message="backend tensorrt needs runtime.resources.gpus of at least 1",
            field="runtime.resources.gpus",
            holds=lambda s: s.engine.backend != Backend.TENSORRT or s.runtime.resources.gpus >= 1,
        ),
        CrossFieldRule(
            cel="self.runtime.batching.policy != 'Adaptive' || "
            "has(self.slo.p99LatencyMilliseconds)",
            message="runtime.batching.policy Adaptive needs slo.p99LatencyMilliseconds",
            field="runtime.batching.policy",
            holds=lambda s: (
                s.runtime.batching.policy != BatchingPolicyKind.ADAPTIVE
                or s.slo.p99_latency_milliseconds is not None
            ),
        ),
        CrossFieldRule(
            cel="!self.qualityWatch.enabled || self.engine.precision == 'int8' || "
            "(self.engine.precision == 'fp16' && self.qualityWatch.referencePrecision == 'fp32')",
            message="qualityWatch needs a served precision below its referencePrecision: "
            "the engine already serves at the reference's precision, there is nothing to watch",
            field="qualityWatch.enabled",
            holds=lambda s: (
                not s.quality_watch.enabled
                or s.engine.precision == Precision.INT8
                or (
                    s.engine.precision == Precision.FP16
                    and s.quality_watch.reference_precision == Precision.FP32
                )
            ),
        ),
        CrossFieldRule(
            cel="!has(self.autoscaling.scaleUpOnSloMissAfterSeconds) || "
            "has(self.slo.p99LatencyMilliseconds)",
            message="autoscaling.scaleUpOnSloMissAfterSeconds needs an objective: "
            "slo.p99LatencyMilliseconds",
            field="autoscaling.scaleUpOnSloMissAfterSeconds",
            holds=lambda s: (
                s.autoscaling.scale_up_on_slo_miss_after_seconds is None
                or s.slo.p99_latency_milliseconds is not None
            ),
        ),
        *FLEET_RULES,
    )

    model: ModelSpec
    """The model to serve."""

    engine: EngineSpec = Field(default_factory=EngineSpec)
    """How the model becomes an engine."""

    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    """The runtime pods."""

    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """How new versions replace the serving one."""

    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    """Autoscaling on requests in progress and GPU memory pressure."""

    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    """Where the operator reads the runtime pods' metrics."""

    slo: SloSpec = Field(default_factory=SloSpec)
    """Latency objective reported in status."""

    quality_watch: QualityWatchSpec = Field(default_factory=QualityWatchSpec)
    """Watch a reduced-precision engine against its reference on live traffic."""


class InferenceDeployment(ApiModel):
    """A whole InferenceDeployment document, as read from a manifest or the API."""

    api_version: Literal["kubeinfer.io/v1alpha1"]
    """kubeinfer.io/v1alpha1."""

    kind: Literal["InferenceDeployment"]
    """InferenceDeployment."""

    metadata: ObjectMeta
    """Standard object metadata."""

    spec: InferenceDeploymentSpec
    """The desired state."""

    status: InferenceDeploymentStatus | None = None
    """The observed state."""
