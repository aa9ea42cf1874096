"""KL divergence between two answers of a classifier-shaped output. Pure (numpy only).

An output with classes (its last axis of 2 or more, `output_statistics.has_classes`) holds
either probabilities or logits, and the runtime is not told which. The rule: an output is
read as probabilities when, on both sides, every row (every position of the leading
dimensions) is non-negative and sums to 1 within `PROBABILITY_SUM_TOLERANCE`; otherwise
both sides are read as logits and turned into probabilities by a softmax over the last
axis. Both sides are always read the same way, so a side that is a hair outside the
tolerance (an int8 engine's rounded probabilities) never makes the two incomparable: both
then go through the softmax, which is monotonic, so top-1 and the ordering of the KL
figures stay meaningful.

`KL(trusted || other) = sum_k p_k (log p_k - log q_k)`, in nats, per row: `p` the trusted
side's distribution (the serving engine's for a shadow, the reference's for a quality
watch), `q` the other's. `0 log 0` counts 0; a class the trusted side gives mass that the
other gives none would be infinite, so probabilities are floored at `PROBABILITY_FLOOR`
(at most about 27.6 nats per row): one broken row cannot turn every mean into infinity.
"""

from __future__ import annotations

import numpy as np

PROBABILITY_SUM_TOLERANCE = 1e-3
PROBABILITY_FLOOR = 1e-12


def looks_like_probabilities(rows: np.ndarray) -> bool:
    """Whether every row (last axis) is non-negative and sums to 1 within the tolerance."""
    if rows.size == 0 or bool((rows < 0).any()):
        return False
    sums = rows.sum(axis=-1, dtype=np.float64)
    return bool((np.abs(sums - 1.0) <= PROBABILITY_SUM_TOLERANCE).all())


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _log_probabilities(probabilities: np.ndarray) -> np.ndarray:
    floored = np.maximum(probabilities, PROBABILITY_FLOOR)
    return np.log(floored / floored.sum(axis=-1, keepdims=True))


def kl_divergence_rows(trusted: np.ndarray, other: np.ndarray) -> np.ndarray:
    """KL(trusted || other) per row (every position of the leading dimensions, flattened),
    in nats, never negative; see the module for how probabilities and logits are read.
    Both arrays have the same shape, with classes on the last axis, and hold finite
    values (the comparison rules out the others first)."""
    if trusted.shape != other.shape:
        raise ValueError(f"shapes differ: {trusted.shape} and {other.shape}")
    classes = trusted.shape[-1]
    p_rows = trusted.reshape(-1, classes).astype(np.float64)
    q_rows = other.reshape(-1, classes).astype(np.float64)
    if looks_like_probabilities(p_rows) and looks_like_probabilities(q_rows):
        log_p, log_q = _log_probabilities(p_rows), _log_probabilities(q_rows)
    else:
        log_p, log_q = _log_softmax(p_rows), _log_softmax(q_rows)
    kl = (np.exp(log_p) * (log_p - log_q)).sum(axis=-1)
    return np.maximum(kl, 0.0)  # rounding leaves identical rows a hair below 0
