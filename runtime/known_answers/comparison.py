"""The known-answer comparison: how far an engine's answers to the probes are from the
expected ones, the tolerance of each output, and the verdict. Pure numpy, no I/O, so the
build that sets the tolerances and serving that checks them use the same definitions.

Per output, along dimension 0 (the probes), each probe's row flattened:

- numbers (`relativeError`): the L2 distance between the answer and the expected answer
  over the expected answer's L2 norm. Scale free, as the build gate's cosine is, so one
  tolerance fits logits and probabilities alike; unlike the cosine, an answer scaled by
  two is an error. Where both sides hold the same value (the same infinity, both NaN) the
  difference is 0; a NaN or an infinity where the expected answer has none makes the
  error infinite. An expected row of zeros is measured against a share of the set's mean
  norm (`ZERO_ROW_SHARE`), and a set that is all zeros in absolute terms.
- labels, token ids, text (`equal`: integer, boolean and BYTES outputs, as the accuracy
  report and the shadow compare them): a probe answers otherwise when any element of its
  row differs; the error is how many probes did.

The tolerance of each output follows from the engine's precision and its gate
(`tolerance_for`), and is never tighter than a margin over what the engine itself showed
on the same probes when it was built:

- relativeError: the largest of `PRECISION_FLOOR` (what healthy engines of that precision
  differ by between CPUs, batch sizes and kernels: int8 on ONNX Runtime rounds otherwise
  with and without VNNI), `BUILD_ERROR_MARGIN` times the engine's own worst error on the
  probes at build, and, for an output the gate judged with a minimum cosine c, the error
  that cosine allows, sqrt(2 (1 - c)) (for answers of the expected norm, a cosine c is
  that relative distance): an answer the gate would have let through is not called wrong.
- equal: the probes that answered otherwise at build, plus `MISMATCH_SHARE` of the probes
  (at least one) for a reduced precision, or the gate's top-1 drop where it sets one: an
  fp32 engine answers every label as its reference does.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from kubeinfer.runtime.engine_manifest import KnownAnswerComparison, KnownAnswerTolerance
from kubeinfer.runtime.output_statistics import is_discrete

PRECISION_FLOOR = {"fp32": 1e-3, "fp16": 1e-2, "int8": 5e-2}
"""The least relative error tolerated, per precision."""
BUILD_ERROR_MARGIN = 3.0
"""The tolerance is at least this many times the engine's own worst error at build: the
engine on another CPU (other kernels, other rounding) is as far from its build-node self
as quantisation put it from fp32, and the two add up at most."""
MISMATCH_SHARE = {"fp32": 0.0, "fp16": 0.05, "int8": 0.05}
"""The share of probes a label output may answer otherwise than at build, per precision."""
ZERO_ROW_SHARE = 1e-3
"""An expected row of zeros is measured against this share of the set's mean row norm."""


def comparison_of(expected: np.ndarray) -> KnownAnswerComparison:
    """How an output is compared: by equality for labels, token ids and text."""
    return "equal" if is_discrete(expected) else "relativeError"


def _rows(array: np.ndarray) -> np.ndarray:
    return array.reshape(array.shape[0], -1)


def _check_shapes(expected: np.ndarray, answered: np.ndarray) -> None:
    if expected.shape != answered.shape:
        raise ValueError(
            f"the answer's shape {list(answered.shape)} is not the expected {list(expected.shape)}"
        )


def relative_errors(expected: np.ndarray, answered: np.ndarray) -> np.ndarray:
    """Each probe's relative L2 error (see the module), in float64."""
    _check_shapes(expected, answered)
    want = _rows(expected).astype(np.float64)
    got = _rows(answered).astype(np.float64)
    same = (want == got) | (np.isnan(want) & np.isnan(got))
    with np.errstate(invalid="ignore", over="ignore"):
        difference = np.where(same, 0.0, got - want)
        difference = np.where(np.isfinite(difference), difference, np.inf)
        distance = np.sqrt(np.sum(difference * difference, axis=1))
    finite = np.where(np.isfinite(want), want, 0.0)
    norms = np.sqrt(np.sum(finite * finite, axis=1))
    scale = float(norms.mean()) if norms.size else 0.0
    floor = scale * ZERO_ROW_SHARE if scale > 0 else 1.0
    return np.asarray(distance / np.maximum(norms, floor), dtype=np.float64)


def as_bytes(item: object) -> bytes:
    """A string element as bytes (ONNX Runtime gives `str`, the wire and the known-answer
    file `bytes`: the same text compares equal whichever it is)."""
    if isinstance(item, bytes):
        return item
    return str(item).encode()


def _comparable(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind not in "OSU":
        return array
    flat = np.empty(array.size, dtype=object)
    flat[:] = [as_bytes(item) for item in array.ravel()]
    return flat.reshape(array.shape)


def mismatched(expected: np.ndarray, answered: np.ndarray) -> np.ndarray:
    """Per probe, whether any element of its answer differs from the expected one."""
    _check_shapes(expected, answered)
    if expected.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    equal = np.asarray(_rows(_comparable(expected)) == _rows(_comparable(answered)), dtype=bool)
    return np.asarray(~equal.all(axis=1), dtype=bool)


def probe_errors(
    comparison: KnownAnswerComparison, expected: np.ndarray, answered: np.ndarray
) -> np.ndarray:
    """Per probe: its relative error, or 1.0 where a label answer differs (0.0 where not)."""
    if comparison == "equal":
        return mismatched(expected, answered).astype(np.float64)
    return relative_errors(expected, answered)


def gate_relative_error(min_cosine: float) -> float:
    """The relative L2 error a cosine of `min_cosine` amounts to, for answers of the
    expected norm: |a - b|^2 = 2 (1 - cos) |a|^2."""
    return math.sqrt(max(0.0, 2.0 * (1.0 - min_cosine)))


def tolerance_for(
    name: str,
    precision: str,
    expected: np.ndarray,
    built: np.ndarray,
    *,
    gated: bool,
    min_cosine: float | None = None,
    max_top1_drop: float | None = None,
) -> KnownAnswerTolerance:
    """The tolerance of output `name` (see the module), from the expected answers and the
    engine's own answers to the same probes at build (`built`)."""
    comparison = comparison_of(expected)
    errors = probe_errors(comparison, expected, built)
    if not np.all(np.isfinite(errors)):
        raise ValueError(f"output {name!r}: the engine answered a probe with NaN or infinity")
    if comparison == "equal":
        build_error = float(errors.sum())
        gate_share = max_top1_drop if gated else None
        share = MISMATCH_SHARE[precision] if gate_share is None else gate_share
        slack = math.ceil(share * expected.shape[0])
        tolerance = build_error + (slack if precision == "fp32" else max(1, slack))
    else:
        build_error = float(errors.max(initial=0.0))
        allowed = [PRECISION_FLOOR[precision], BUILD_ERROR_MARGIN * build_error]
        if gated and min_cosine is not None:
            allowed.append(gate_relative_error(min_cosine))
        tolerance = max(allowed)
    return KnownAnswerTolerance(
        name=name,
        comparison=comparison,
        tolerance=tolerance,
        build_error=build_error,
        gated=gated,
    )


@dataclass(frozen=True)
class OutputCheck:
    """One output's answers to the probes against its tolerance. `error` is the worst
    probe's relative error (relativeError) or how many probes answered otherwise
    (equal); `probe` is that worst probe (the first that answered otherwise)."""

    name: str
    comparison: KnownAnswerComparison
    tolerance: float
    error: float
    probe: int

    @property
    def passed(self) -> bool:
        return self.error <= self.tolerance

    @property
    def error_ratio(self) -> float:
        """The error over its tolerance: above 1 fails (infinite for any error where the
        tolerance is 0)."""
        if self.tolerance > 0:
            return self.error / self.tolerance
        return 0.0 if self.error == 0 else math.inf

    def describe(self) -> str:
        if self.comparison == "equal":
            return (
                f"output {self.name!r}: {self.error:g} probes answered otherwise than "
                f"expected (first: probe {self.probe}), over its tolerance of "
                f"{self.tolerance:g}"
            )
        return (
            f"output {self.name!r}: probe {self.probe} answered {self.error:.4g} from its "
            f"expected answer (relative L2 error), over its tolerance {self.tolerance:.4g}"
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "comparison": self.comparison,
            "tolerance": self.tolerance,
            "error": _finite_or_text(self.error),
            "probe": self.probe,
            "passed": self.passed,
        }


def _finite_or_text(value: float) -> float | str:
    """JSON has no infinity or NaN: those go out as their names."""
    return value if math.isfinite(value) else str(value)


@dataclass(frozen=True)
class Verdict:
    """The engine's answers to its known-answer set, judged.

    `skipped` says why nothing was checked (no set recorded, probes this configuration
    cannot run): not a failure. `failure` is an error the engine raised on the probes."""

    digest: str | None
    probes: int
    outputs: tuple[OutputCheck, ...] = ()
    answer_digests: tuple[str, ...] = ()
    """Per probe, a digest of the engine's answer bytes (every output): replicas of one
    engine on the same hardware can be compared with each other bit for bit."""
    seconds: float = 0.0
    skipped: str | None = None
    failure: str | None = None

    @property
    def checked(self) -> bool:
        return self.skipped is None

    @property
    def passed(self) -> bool:
        """Nothing checked, or every output within its tolerance."""
        if self.skipped is not None:
            return True
        return self.failure is None and all(o.passed for o in self.outputs)

    @property
    def result(self) -> str:
        """passed, failed or skipped."""
        if self.skipped is not None:
            return "skipped"
        return "passed" if self.passed else "failed"

    @property
    def worst(self) -> OutputCheck | None:
        return max(self.outputs, key=lambda o: o.error_ratio, default=None)

    def reason(self) -> str:
        """One line: why the engine failed (each failing output), or what was checked."""
        if self.skipped is not None:
            return f"not checked: {self.skipped}"
        if self.failure is not None:
            return f"the engine failed on the probes: {self.failure}"
        failing = [o.describe() for o in self.outputs if not o.passed]
        if failing:
            return "; ".join(failing)
        worst = self.worst
        ratio = 0.0 if worst is None else worst.error_ratio
        return f"{self.probes} probes answered within tolerance (worst at {ratio:.2f} of it)"

    def to_wire(self) -> dict[str, Any]:
        """The verdict as JSON (camelCase), as the runtime reports it."""
        return {
            "digest": self.digest,
            "result": self.result,
            "reason": self.reason(),
            "probes": self.probes,
            "seconds": round(self.seconds, 6),
            "outputs": [o.to_wire() for o in self.outputs],
            "answerDigests": list(self.answer_digests),
        }


def answer_digests(answered: Mapping[str, np.ndarray], names: Sequence[str]) -> tuple[str, ...]:
    """Per probe, the first 16 hex digits of the sha256 of its answer's bytes, output by
    output in `names`' order (a string's bytes with its length before it)."""
    count = answered[names[0]].shape[0] if names else 0
    digests = []
    for probe in range(count):
        digest = hashlib.sha256()
        for name in names:
            row = np.ascontiguousarray(answered[name][probe])
            if row.dtype.kind == "O":
                for item in row.ravel():
                    text = as_bytes(item)
                    digest.update(len(text).to_bytes(8, "little") + text)
            else:
                digest.update(row.tobytes())
        digests.append(digest.hexdigest()[:16])
    return tuple(digests)


def judge(
    tolerances: Sequence[KnownAnswerTolerance],
    expected: Mapping[str, np.ndarray],
    answered: Mapping[str, np.ndarray],
    digest: str | None = None,
    seconds: float = 0.0,
) -> Verdict:
    """The verdict on an engine's `answered` outputs to the probes against the `expected`
    ones, each output by its tolerance. An answer of the wrong shape fails its output."""
    checks: list[OutputCheck] = []
    for tolerance in tolerances:
        want, got = expected[tolerance.name], answered.get(tolerance.name)
        if got is None or got.shape != want.shape:
            shape = "no answer" if got is None else f"shape {list(got.shape)}"
            return Verdict(
                digest, want.shape[0], tuple(checks), seconds=seconds,
                failure=f"output {tolerance.name!r}: {shape}, expected {list(want.shape)}",
            )  # fmt: skip
        errors = probe_errors(tolerance.comparison, want, got)
        errors = np.where(np.isnan(errors), np.inf, errors)
        if tolerance.comparison == "equal":
            wrong = np.flatnonzero(errors)
            error, probe = float(wrong.size), int(wrong[0]) if wrong.size else 0
        else:
            probe = int(np.argmax(errors)) if errors.size else 0
            error = float(errors[probe]) if errors.size else 0.0
        checks.append(
            OutputCheck(tolerance.name, tolerance.comparison, tolerance.tolerance, error, probe)
        )
    names = [t.name for t in tolerances]
    count = next(iter(expected.values())).shape[0] if expected else 0
    return Verdict(digest, count, tuple(checks), answer_digests(answered, names), seconds)
