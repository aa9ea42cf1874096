"""A mixed GPU fleet: one TensorRT engine per GPU product, and how the runtime pods are
split across the products: the spec's `runtime.gpuFleet` and the status' `engines`. Pure.
Which specs run on a mixed fleet, and the rules that keep the two modes apart, are the
spec's own (`inference_deployment.in_fleet_mode`, `FLEET_RULES`).

A TensorRT engine runs only on the GPU model it was built on. An InferenceDeployment with
backend tensorrt, no `engine.pin` and no single `runtime.gpuProduct` runs on every
eligible GPU product of the cluster (the `nvidia.com/gpu.product` label GPU feature
discovery writes on nodes): one engine, build Job and runtime Deployment per product.
See docs/gpu-fleets.md.
"""

from __future__ import annotations

from enum import StrEnum

from kubeinfer.contract.api_model import ApiModel, CrossFieldRule
from kubeinfer.operator.api.v1alpha1.patterns import LABEL_VALUE
from pydantic import Field


class ReplicaSplit(StrEnum):
    """How the runtime pods are split across the GPU products that have an engine."""

    GPUS = "GPUs"
    """In proportion to the GPUs (allocatable nvidia.com/gpu) of each product's eligible
    nodes that are Ready and schedulable."""

    WEIGHTS = "Weights"
    """In proportion to each product's replicaWeightPercent."""


class GpuProductShare(ApiModel):
    """One eligible GPU product, and with replicaSplit Weights its share of the pods."""

    name: str = Field(pattern=LABEL_VALUE, max_length=63)
    """The nvidia.com/gpu.product node label value (e.g. NVIDIA-H100-80GB-HBM3)."""

    replica_weight_percent: int | None = Field(default=None, ge=0, le=100)
    """With replicaSplit Weights: this product's share of the runtime pods, in percent of
    the total (the weights sum to 100; the shares of products without an engine or a
    node yet go to the others in proportion). Not set with replicaSplit GPUs."""


class GpuFleetSpec(ApiModel):
    """Which GPU products an engine is built for, and how the pods are split across them."""

    cross_field_rules = (
        CrossFieldRule(
            cel="self.replicaSplit != 'Weights' || (size(self.products) > 0 && "
            "self.products.all(p, has(p.replicaWeightPercent)) && "
            "self.products.map(p, has(p.replicaWeightPercent) ? p.replicaWeightPercent : 0)"
            ".sum() == 100)",
            message="replicaSplit Weights needs products, each with a replicaWeightPercent, "
            "summing to 100",
            field="products",
            holds=lambda f: (
                f.replica_split != ReplicaSplit.WEIGHTS
                or (
                    bool(f.products)
                    and all(p.replica_weight_percent is not None for p in f.products)
                    and sum(p.replica_weight_percent or 0 for p in f.products) == 100
                )
            ),
        ),
        CrossFieldRule(
            cel="self.replicaSplit == 'Weights' || "
            "self.products.all(p, !has(p.replicaWeightPercent))",
            message="replicaWeightPercent applies only with replicaSplit Weights",
            field="products",
            holds=lambda f: (
                f.replica_split == ReplicaSplit.WEIGHTS
                or all(p.replica_weight_percent is None for p in f.products)
            ),
        ),
    )

    products: list[GpuProductShare] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """The eligible GPU products; empty: every product found among the cluster's GPU nodes
    that match runtime.nodeSelector and whose taints runtime.tolerations tolerate. A
    listed product without such a node gets nothing until one appears."""

    replica_split: ReplicaSplit = ReplicaSplit.GPUS
    """GPUs (default) or Weights: how the runtime pods (runtime.replicas, or the
    autoscaler's count) are split across the products whose engine is built."""


class ProductEnginePhase(StrEnum):
    BUILT = "Built"
    BUILDING = "Building"
    FAILED = "Failed"


class ProductEngineStatus(ApiModel):
    """One GPU product of a mixed fleet: its engine, its nodes and its pods."""

    gpu_product: str = Field(max_length=63)
    """The nvidia.com/gpu.product label value."""

    phase: ProductEnginePhase
    """Built, Building or Failed: the current spec's engine for this product."""

    digest: str | None = Field(default=None, max_length=71)
    """The engine's content digest (sha256:...), once built."""

    target: str | None = Field(default=None, max_length=64)
    """What the build reported the engine was built for."""

    build_key: str | None = Field(default=None, max_length=64)
    """Hash of the engine inputs the digest was built from (the product is one)."""

    nodes: int = Field(default=0, ge=0)
    """Eligible nodes of this product."""

    gpus: int = Field(default=0, ge=0)
    """Allocatable GPUs of those nodes that are Ready and schedulable."""

    replicas: int = Field(default=0, ge=0)
    """Runtime pods wanted on this product."""

    ready_replicas: int = Field(default=0, ge=0)
    """Runtime pods ready on this product."""

    message: str = Field(default="", max_length=1024)
    """Where the engine stands, for humans."""
