"""What a lower precision cost: an engine's outputs against the fp32 reference's.

Pure: it takes the reference's and the candidate's outputs on the same validation
samples (numpy arrays by output name) and returns an `AccuracyReport` that goes into the
engine's manifest; `gate_violations` turns the build's gates into messages. Nothing here
runs a model, so the numbers are tested on arrays whose answer is known.

Definitions, per output (all samples along dimension 0):

- `maxAbsDiff`, `meanAbsDiff`: over every element, in the output's units.
- `cosineSimilarity`: the mean over samples of the cosine between the candidate's and the
  reference's flattened sample; `minCosineSimilarity` the worst sample. Cosine is scale
  free, so one threshold fits models whose outputs have different magnitudes.
- `top1Agreement`: for classification-shaped outputs only (`[samples, classes]` with more
  than one class), the fraction of samples whose argmax is the reference's. There are no
  labels at build time, so "top-1 drop" is `1 - top1Agreement`: the share of samples
  whose predicted class the lower precision changed. It bounds the fall in top-1
  accuracy against any labels.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from kubeinfer.runtime.config import ApiModel
from pydantic import Field


class OutputAccuracy(ApiModel):
    """The candidate against the reference on one output."""

    name: str
    """The output's name."""

    max_abs_diff: float = Field(ge=0)
    """Largest absolute difference over every element."""

    mean_abs_diff: float = Field(ge=0)
    """Mean absolute difference over every element."""

    cosine_similarity: float
    """Mean over samples of the per-sample cosine similarity."""

    min_cosine_similarity: float
    """The worst sample's cosine similarity."""

    top1_agreement: float | None = None
    """Share of samples whose argmax matches the reference (classification-shaped only)."""


class AccuracyReport(ApiModel):
    """The engine's outputs against the fp32 reference on held-out validation samples."""

    reference: str = "fp32 ONNX model on ONNX Runtime CPU"
    """What the candidate was compared with."""

    validation_source: str
    """Where the validation samples came from: `held-out` (the calibration file's last
    samples, never used to calibrate), `given` (a validation file) or `synthetic` (seeded
    normal inputs, when no data was given)."""

    samples: int = Field(ge=1)
    """Number of validation samples."""

    outputs: list[OutputAccuracy]
    """One entry per model output."""

    @property
    def worst_cosine(self) -> float:
        return min(o.cosine_similarity for o in self.outputs)

    @property
    def worst_top1_drop(self) -> float | None:
        drops = [1.0 - o.top1_agreement for o in self.outputs if o.top1_agreement is not None]
        return max(drops) if drops else None


def _is_classification_shaped(array: np.ndarray) -> bool:
    return array.ndim == 2 and array.shape[1] > 1


def _per_sample_cosine(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    ref = reference.reshape(reference.shape[0], -1).astype(np.float64)
    cand = candidate.reshape(candidate.shape[0], -1).astype(np.float64)
    dot = np.sum(ref * cand, axis=1)
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
    # Two all-zero samples are identical; one zero against a non-zero one shares nothing.
    both_zero = norms == 0
    same = np.all(ref == cand, axis=1)
    safe = np.where(both_zero, 1.0, norms)
    return np.where(both_zero, np.where(same, 1.0, 0.0), dot / safe)


def compare_output(name: str, reference: np.ndarray, candidate: np.ndarray) -> OutputAccuracy:
    """Compares one output; both arrays are `[samples, ...]` of the same shape."""
    if reference.shape != candidate.shape:
        raise ValueError(
            f"output {name!r}: the candidate's shape {candidate.shape} differs from the "
            f"reference's {reference.shape}"
        )
    if reference.shape[0] == 0:
        raise ValueError(f"output {name!r}: no validation samples")
    diff = np.abs(reference.astype(np.float64) - candidate.astype(np.float64))
    cosine = _per_sample_cosine(reference, candidate)
    top1 = None
    if _is_classification_shaped(reference):
        top1 = float(np.mean(reference.argmax(axis=1) == candidate.argmax(axis=1)))
    return OutputAccuracy(
        name=name,
        max_abs_diff=float(diff.max()),
        mean_abs_diff=float(diff.mean()),
        cosine_similarity=float(cosine.mean()),
        min_cosine_similarity=float(cosine.min()),
        top1_agreement=top1,
    )


def compare_outputs(
    reference: Mapping[str, np.ndarray],
    candidate: Mapping[str, np.ndarray],
    validation_source: str,
) -> AccuracyReport:
    """The report over every reference output; the candidate must produce each of them."""
    missing = sorted(set(reference) - set(candidate))
    if missing:
        raise ValueError(f"the candidate engine does not produce outputs {missing}")
    outputs = [compare_output(name, reference[name], candidate[name]) for name in reference]
    samples = next(iter(reference.values())).shape[0]
    return AccuracyReport(validation_source=validation_source, samples=samples, outputs=outputs)


def gate_violations(
    report: AccuracyReport,
    max_top1_drop: float | None = None,
    min_cosine: float | None = None,
) -> list[str]:
    """Messages for each gate the report fails (empty when it passes). A top-1 gate on a
    model without classification-shaped outputs is a violation too: the gate cannot be
    checked, and passing it silently would publish an engine nobody verified."""
    violations = []
    if min_cosine is not None:
        for output in report.outputs:
            if output.cosine_similarity < min_cosine:
                violations.append(
                    f"output {output.name!r}: cosine similarity {output.cosine_similarity:.6f}"
                    f" is below --min-cosine {min_cosine}"
                )
    if max_top1_drop is not None:
        checked = [o for o in report.outputs if o.top1_agreement is not None]
        if not checked:
            violations.append(
                "--max-top1-drop was given but no output is classification-shaped "
                "([samples, classes]), so top-1 agreement cannot be measured"
            )
        for output in checked:
            assert output.top1_agreement is not None
            drop = 1.0 - output.top1_agreement
            if drop > max_top1_drop:
                violations.append(
                    f"output {output.name!r}: top-1 drop {drop:.4f} (agreement "
                    f"{output.top1_agreement:.4f}) exceeds --max-top1-drop {max_top1_drop}"
                )
    return violations
