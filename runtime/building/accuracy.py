"""What a lower precision cost: an engine's outputs against the fp32 reference's.

Pure: it takes the reference's and the candidate's outputs on the same validation
samples (numpy arrays by output name) and returns an `AccuracyReport` that goes into the
engine's manifest; `gate_violations` turns the build's gates into messages. Nothing here
runs a model, so the numbers are tested on arrays whose answer is known. The report's
models are part of the manifest's format and live beside it
(`kubeinfer.runtime.engine_manifest`), where serving reads them too.

The statistics themselves are `kubeinfer.runtime.output_statistics`, the one definition
the shadow comparison of a rollout uses too. Per output (samples along dimension 0):

- `maxAbsDiff`, `meanAbsDiff`: over every element, in the output's units.
- `cosineSimilarity`: the mean over samples of the cosine between the candidate's and the
  reference's flattened sample; `minCosineSimilarity` the worst sample. Cosine is scale
  free, so one threshold fits models whose outputs have different magnitudes.
- `top1Agreement`: for outputs whose last axis has 2 or more classes, the fraction of rows
  (every position of the leading dimensions: a sample of `[samples, classes]`, a token of
  `[samples, tokens, vocab]`) whose argmax over the last axis is the reference's. There
  are no labels at build time, so "top-1 drop" is `1 - top1Agreement`: the share of rows
  whose predicted class the lower precision changed. It bounds the fall in top-1
  accuracy against any labels.

A candidate producing NaN or an infinity where the reference does not is an error, not a
difference to report.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from kubeinfer.runtime.engine_manifest import AccuracyReport, OutputAccuracy
from kubeinfer.runtime.output_statistics import compare_arrays


def compare_output(name: str, reference: np.ndarray, candidate: np.ndarray) -> OutputAccuracy:
    """Compares one output; both arrays are `[samples, ...]` of the same shape."""
    if reference.shape != candidate.shape:
        raise ValueError(
            f"output {name!r}: the candidate's shape {candidate.shape} differs from the "
            f"reference's {reference.shape}"
        )
    if reference.ndim == 0 or reference.shape[0] == 0:
        raise ValueError(f"output {name!r}: no validation samples")
    statistics = compare_arrays(reference, candidate)
    if not statistics.finite:
        raise ValueError(
            f"output {name!r}: the candidate has NaN or infinite values where the reference has not"
        )
    top1 = None if statistics.top1 is None else float(np.mean(statistics.top1))
    return OutputAccuracy(
        name=name,
        max_abs_diff=statistics.max_abs_difference,
        mean_abs_diff=statistics.mean_abs_difference,
        cosine_similarity=float(statistics.cosines.mean()),
        min_cosine_similarity=float(statistics.cosines.min()),
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
    model without an output that has classes is a violation too: the gate cannot be
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
                "--max-top1-drop was given but no output has a last axis of 2 or more "
                "classes ([samples, ..., classes]), so top-1 agreement cannot be measured"
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
