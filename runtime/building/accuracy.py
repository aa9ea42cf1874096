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
  accuracy against any labels. `top1Rows` is how many rows that is, and `top1ByClass`
  the same rows per reference top-1 class (the decimal index of the fp32 reference's
  argmax): `{"3": {"rows": 40, "agreements": 39}, ...}`, the rows adding up to
  `top1Rows`. Quantisation rarely costs every class alike; the quality watch takes
  these counts, through the build's termination message (`termination_accuracy`), as
  its baseline per class, so the disagreement the build already showed is not drift.

Label outputs (integers, strings) are compared by equality (`output_statistics`): their
`top1Agreement` is the share of equal labels, grouped by the reference's label.

The gates judge the outputs that hold the scores, the others being compared and reported
only (`gated` on each output): a decoder's logits, not its key/value caches or hidden
states, whose elements say nothing about the answer and drift most under quantisation.
They are the outputs named by `--gate-outputs` (the spec's `engine.accuracy.gateOutputs`)
or, by default, those whose name says they are scores (`SCORE_NAMES`: logits,
probabilities, scores), or every output when no name does (`gated_output_names`).

A candidate producing NaN or an infinity where the reference does not is an error, not a
difference to report.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from kubeinfer.runtime.engine_manifest import AccuracyReport, ClassAgreement, OutputAccuracy
from kubeinfer.runtime.output_statistics import compare_arrays, top1_by_reference_class

SCORE_NAMES = re.compile(r"logit|prob|score", re.IGNORECASE)
"""Output names that say the output holds the scores (`logits`, `probabilities`,
`output_probability`, `scores`...): gated by default."""


def gated_output_names(outputs: Sequence[str], chosen: Sequence[str] | None = None) -> list[str]:
    """The outputs the gates judge, in the model's order: `chosen` when given (each one
    an output of the model, else ValueError naming the outputs), else those named like
    scores (`SCORE_NAMES`), else every output."""
    if chosen:
        unknown = sorted(set(chosen) - set(outputs))
        if unknown:
            raise ValueError(
                f"the gate outputs {unknown} are not outputs of the model; its outputs are "
                f"{list(outputs)}"
            )
        return [name for name in outputs if name in chosen]
    return [name for name in outputs if SCORE_NAMES.search(name)] or list(outputs)


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
    by_class = top1_by_reference_class(reference, candidate)
    return OutputAccuracy(
        name=name,
        max_abs_diff=statistics.max_abs_difference,
        mean_abs_diff=statistics.mean_abs_difference,
        cosine_similarity=float(statistics.cosines.mean()),
        min_cosine_similarity=float(statistics.cosines.min()),
        top1_agreement=top1,
        top1_rows=None if statistics.top1 is None else int(statistics.top1.size),
        top1_by_class=None
        if by_class is None
        else {
            str(label): ClassAgreement(rows=rows, agreements=agreements)
            for label, (rows, agreements) in by_class.items()
        },
    )


def compare_outputs(
    reference: Mapping[str, np.ndarray],
    candidate: Mapping[str, np.ndarray],
    validation_source: str,
    gate_outputs: Sequence[str] | None = None,
) -> AccuracyReport:
    """The report over every reference output, each marked gated or compared only
    (`gated_output_names`); the candidate must produce each of them."""
    missing = sorted(set(reference) - set(candidate))
    if missing:
        raise ValueError(f"the candidate engine does not produce outputs {missing}")
    gated = set(gated_output_names(list(reference), gate_outputs))
    outputs = [
        compare_output(name, reference[name], candidate[name]).model_copy(
            update={"gated": name in gated}
        )
        for name in reference
    ]
    samples = next(iter(reference.values())).shape[0]
    return AccuracyReport(validation_source=validation_source, samples=samples, outputs=outputs)


def gate_violations(
    report: AccuracyReport,
    max_top1_drop: float | None = None,
    min_cosine: float | None = None,
    gate_outputs: Sequence[str] | None = None,
) -> list[str]:
    """Messages for each gate the report fails (empty when it passes), judged on the
    gated outputs (`gated_output_names` of `gate_outputs`). A top-1 gate where no gated
    output has classes or labels is a violation too: the gate cannot be checked, and
    passing it silently would publish an engine nobody verified."""
    names = gated_output_names([o.name for o in report.outputs], gate_outputs)
    judged = [o for o in report.outputs if o.name in names]
    violations = []
    if min_cosine is not None:
        for output in judged:
            if output.cosine_similarity < min_cosine:
                violations.append(
                    f"output {output.name!r}: cosine similarity {output.cosine_similarity:.6f}"
                    f" is below --min-cosine {min_cosine}"
                )
    if max_top1_drop is not None:
        checked = [o for o in judged if o.top1_agreement is not None]
        if not checked:
            violations.append(
                f"--max-top1-drop was given but no gated output ({', '.join(names)}) has a "
                "last axis of 2 or more classes ([samples, ..., classes]) or labels, so "
                "top-1 agreement cannot be measured; name the output that holds the scores "
                "with --gate-outputs"
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


TERMINATION_ACCURACY_BUDGET_BYTES = 3000
"""Most bytes the termination message's `accuracy` object takes as compact JSON: the
rest of the message is a few hundred bytes, and Kubernetes keeps at most 4096."""


def compact_json(value: Any) -> str:
    """The termination message's JSON form (sorted keys, no spaces): what the accuracy
    object's budget is measured in."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def measures_quantisation(precision: str, report: AccuracyReport | None) -> bool:
    """Whether the report is a baseline for the quality watch: a reduced precision
    measured on real inputs (validation or held-out calibration samples). An fp32 engine
    compared with the fp32 reference measures nothing a watch would judge, and seeded
    synthetic inputs (no data given) have a class mix no traffic has."""
    return report is not None and precision != "fp32" and report.validation_source != "synthetic"


def termination_accuracy(
    report: AccuracyReport | None, budget_bytes: int = TERMINATION_ACCURACY_BUDGET_BYTES
) -> dict[str, Any] | None:
    """The top-1 agreement of the report's first output with classes, bounded for a
    termination message: `{"output": name, "rows": N, "agreements": A, "byClass":
    {"3": [rows, agreements], ...}}`, at most `budget_bytes` as `compact_json`.

    Classes go in by their row count, most rows first (ties by class index), for as
    long as they fit the budget; a class left out (a model with thousands of classes)
    falls back to the overall figure wherever the object is read. None without a
    report, without an output with classes, for a report written before per-class
    counts were recorded, or when even the overall figure would not fit. A gated output
    comes before the others (the one that holds the scores)."""
    if report is None:
        return None
    ranked = sorted(report.outputs, key=lambda o: o.gated is False)
    output = next((o for o in ranked if o.top1_by_class is not None), None)
    if output is None or output.top1_by_class is None or output.top1_rows is None:
        return None
    classes = output.top1_by_class
    accuracy: dict[str, Any] = {
        "output": output.name,
        "rows": output.top1_rows,
        "agreements": sum(c.agreements for c in classes.values()),
        "byClass": {},
    }
    size = len(compact_json(accuracy))
    if size > budget_bytes:
        return None
    for label in sorted(classes, key=lambda name: (-classes[name].rows, len(name), name)):
        entry = [classes[label].rows, classes[label].agreements]
        # `"label":[rows,agreements]`, and a comma before every entry but the first.
        cost = len(compact_json({label: entry})) - 2 + (1 if accuracy["byClass"] else 0)
        if size + cost > budget_bytes:
            break
        accuracy["byClass"][label] = entry
        size += cost
    return accuracy
