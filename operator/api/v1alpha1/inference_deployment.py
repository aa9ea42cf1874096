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
)
from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.api.v1alpha1.enums import (
    Backend,
    Phase,
    Precision,
    RolloutStrategy,
)
from kubeinfer.operator.api.v1alpha1.gpu_fleet import GpuFleetSpec
from kubeinfer.operator.api.v1alpha1.metadata import ObjectMeta
from kubeinfer.operator.api.v1alpha1.monitoring import (
    MonitoringSpec,
    PrometheusSpec,
    QueryOverrides,
    SloSpec,
)
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
from kubeinfer.operator.api.v1alpha1.rollout import RolloutSpec, ShadowSpec, ShadowThresholds
from kubeinfer.operator.api.v1alpha1.status import (
    CandidateStatus,
    EngineBatchingStatus,
    EngineStatus,
    InferenceDeploymentStatus,
    MetricsStatus,
    VersionStatus,
)
from kubeinfer.operator.api.v1alpha1.topology_spread import TopologySpreadSpec
from pydantic import Field

# The enums, metadata, status models and the spec's larger sections live in their own
# modules; they are re-exported here, the module that describes a whole InferenceDeployment.
__all__ = [
    "AutoscalingSpec",
    "Backend",
    "CandidateStatus",
    "EngineBatchingStatus",
    "EngineStatus",
    "InferenceDeploymentStatus",
    "MetricsStatus",
    "MonitoringSpec",
    "ObjectMeta",
    "Phase",
    "Precision",
    "PrometheusSpec",
    "QualityWatchSpec",
    "QueryOverrides",
    "RolloutSpec",
    "RolloutStrategy",
    "ShadowSpec",
    "ShadowThresholds",
    "SloSpec",
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


class KnownAnswersSpec(ApiModel):
    """The operator's known-answer checks, on when set (`knownAnswers: {}` for the
    defaults): each serving pod carries the readiness gate `kubeinfer.io/answers-correct`
    and takes traffic only once the operator saw it answer its engine's known-answer set;
    it is asked again on this schedule (docs/known-answers.md), and a pod that fails it,
    or whose answers differ from its peers' on the same engine and hardware, is taken out
    of its Service and replaced."""

    interval_seconds: int = Field(default=300, ge=30, le=86_400)
    """Seconds between two checks of one serving pod (a new pod is checked once it
    started, before it serves)."""


FLEET = (
    "self.engine.backend == 'tensorrt' && !has(self.engine.pin) && !has(self.runtime.gpuProduct)"
)
"""CEL: the spec runs on a mixed GPU fleet (`in_fleet_mode`'s predicate)."""

FLEET_RULES = (
    CrossFieldRule(
        cel="!has(self.runtime.gpuFleet) || self.engine.backend == 'tensorrt'",
        message="runtime.gpuFleet needs engine.backend tensorrt: an ONNX Runtime engine "
        "runs on any node",
        field="runtime.gpuFleet",
        holds=lambda s: s.runtime.gpu_fleet is None or s.engine.backend == "tensorrt",
    ),
    CrossFieldRule(
        cel="!has(self.runtime.gpuFleet) || "
        "(!has(self.runtime.gpuProduct) && !has(self.engine.pin))",
        message="runtime.gpuFleet excludes runtime.gpuProduct and engine.pin, which serve "
        "one engine on one GPU product",
        field="runtime.gpuFleet",
        holds=lambda s: (
            s.runtime.gpu_fleet is None or (s.runtime.gpu_product is None and s.engine.pin is None)
        ),
    ),
    CrossFieldRule(
        cel=f"!({FLEET}) || self.rollout.strategy != 'Shadow'",
        message="rollout.strategy Shadow with backend tensorrt needs runtime.gpuProduct or "
        "engine.pin: a mixed GPU fleet (one engine per product) rolls out Rolling",
        field="rollout.strategy",
        holds=lambda s: not in_fleet_mode(s) or s.rollout.strategy != "Shadow",
    ),
    CrossFieldRule(
        cel=f"!({FLEET}) || !self.qualityWatch.enabled",
        message="qualityWatch with backend tensorrt needs runtime.gpuProduct or engine.pin: "
        "a mixed GPU fleet (one engine per product) has no quality watch yet",
        field="qualityWatch.enabled",
        holds=lambda s: not in_fleet_mode(s) or not s.quality_watch.enabled,
    ),
)
"""The InferenceDeployment spec's rules about mixed GPU fleets."""


def in_fleet_mode(spec: InferenceDeploymentSpec) -> bool:
    """Whether the spec runs on a mixed GPU fleet: backend tensorrt, no pinned engine and
    no single gpuProduct (one engine per eligible GPU product)."""
    engine, runtime = spec.engine, spec.runtime
    return engine.backend == "tensorrt" and engine.pin is None and runtime.gpu_product is None


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

    known_answers: KnownAnswersSpec | None = None
    """The operator's checks of the serving pods' answers (unset: off)."""
    # Off by default: with it on, a pod is Ready only once the operator checked it, so
    # every rollout's availability would hang on the operator (docs/known-answers.md).


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
