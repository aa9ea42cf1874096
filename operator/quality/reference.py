"""The quality watch's reference: the served model version built at the watch's
referencePrecision, run as one pod beside the serving ones. Pure.

The reference always runs ONNX Runtime on CPU, whatever the serving backend: the watch
then costs no GPU, and a reference built by another backend than the serving engine's
also shows what the serving backend's kernels change, not only what the precision does.
Its build is an ordinary engine build (its own key, its own Job, the same cache), so
everything that applies to builds (back-off, the cache, the accuracy report) applies to it.
"""

from __future__ import annotations

from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.api.v1alpha1.enums import Backend
from kubeinfer.operator.api.v1alpha1.inference_deployment import (
    InferenceDeploymentSpec,
    RolloutSpec,
)
from kubeinfer.operator.api.v1alpha1.quality_watch import QualityWatchSpec


def reference_spec(spec: InferenceDeploymentSpec) -> InferenceDeploymentSpec:
    """The spec whose engine and runtime are the reference's: the same model, batching
    and placement, built at referencePrecision by ONNX Runtime (no calibration, no pin,
    no accuracy gate: it is the full-precision side), one pod without a GPU. The image is
    the object's own only where it already runs ONNX Runtime; a TensorRT image is the
    operator's CPU default's business."""
    on_cpu = spec.engine.backend == Backend.ONNXRUNTIME
    engine = spec.engine.model_copy(
        update={
            "backend": Backend.ONNXRUNTIME,
            "precision": spec.quality_watch.reference_precision,
            "calibration": None,
            "pin": None,
            "accuracy": None,
        }
    )
    runtime = spec.runtime.model_copy(
        update={
            "image": spec.runtime.image if on_cpu else None,
            "replicas": 1,
            "resources": spec.runtime.resources.model_copy(update={"gpus": 0}),
            "gpu_product": None,
        }
    )
    return spec.model_copy(
        update={
            "engine": engine,
            "runtime": runtime,
            "rollout": RolloutSpec(),
            "autoscaling": AutoscalingSpec(),
            "quality_watch": QualityWatchSpec(),
        }
    )
