"""The quality watch section of the InferenceDeployment spec (`spec.qualityWatch`)."""

from __future__ import annotations

from kubeinfer.contract.api_model import ApiModel, CrossFieldRule
from kubeinfer.operator.api.v1alpha1.enums import DriftAction, Precision
from pydantic import Field


class QualityWatchSpec(ApiModel):
    """The quality watch: the serving pods keep sending a sample of their answered
    requests to the same model version built at `referencePrecision` (a reference runtime
    of one pod on CPU with ONNX Runtime, whatever the serving backend), compare the two
    answers request by request, and the operator judges the agreement over a sliding
    window, overall, per reference top-1 class and per slice, against the build's own
    accuracy report, so quantisation's expected disagreement is not taken for drift."""

    cross_field_rules = (
        CrossFieldRule(
            cel="self.referencePrecision != 'int8'",
            message="referencePrecision must be fp32 or fp16: int8 is never a reference",
            field="referencePrecision",
            holds=lambda q: q.reference_precision != Precision.INT8,
        ),
    )

    enabled: bool = False
    """Run the watch (it needs a reduced-precision engine: precision int8 or fp16)."""

    sample_percent: int = Field(default=5, ge=1, le=100)
    """Share of answered requests sent to the reference, in percent (exactly this share of
    every hundred, per serving pod). What the reference cannot keep up with is dropped and
    counted; the effective rate is in the status."""

    window_seconds: int = Field(default=3600, ge=30, le=604_800)
    """The sliding window the agreement is judged over."""

    min_samples: int = Field(default=200, ge=10, le=10_000_000)
    """Compared rows a group (overall, a class, a slice) needs in the window before it is
    judged at all."""

    min_top1_agreement: float = Field(default=0.95, ge=0, le=1)
    """Floor of the overall top-1 agreement with the reference (0..1)."""

    max_mean_absolute_difference: float | None = Field(default=None, gt=0)
    """Ceiling of the mean absolute difference from the reference over the window: the
    mean over compared requests of each one's largest absolute element difference, in the
    outputs' units (status.qualityWatch.meanAbsoluteDifference); unset: not checked."""

    min_class_agreement: float = Field(default=0.9, ge=0, le=1)
    """Floor of the top-1 agreement within each reference top-1 class and each slice."""

    slice_header: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$", max_length=128
    )
    """A request header whose value names the sub-population a request belongs to (a
    tenant, a locale), e.g. X-Kubeinfer-Slice. Its first distinct values are judged as
    slices of their own; later values, and requests without it, count as `other`."""

    reference_precision: Precision = Precision.FP32
    """The precision of the reference engine (fp32 or fp16), more precise than the engine
    served."""

    on_drift: DriftAction = DriftAction.ALERT
    """What drift does: Alert (Degraded=True, reason QualityDrift, a Warning Event), or
    Fallback (as Alert, and serving rolls to the served model built at
    referencePrecision by the serving backend: on ONNX Runtime the reference engine
    itself, on TensorRT a build of its own). A fallback holds, whatever the watch reads
    meanwhile, until the drifted engine's inputs change (a new calibration set, a new model
    version) or onDrift is set back to Alert: it never flaps between the two engines."""
