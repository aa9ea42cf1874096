"""`status.cost`: the cost of 1,000 inferences over the last window, from what the gather
step read (`reads.CostRead`): the pods of the window with their shares and prices, and,
when the figure is due, the inferences they answered. Pure.

The formula is `kubeinfer.contract.cost.window_cost`'s, over the priced pods only: a pod on
a node without a price is left out, and so are its inferences, so the figure stays a price
per inference of the pods it counts. Between two figures (`cost.refreshSeconds`) and when
the inferences could not be read, the stored figure stands (the operator's
`kubeinfer_inferencedeployment_metrics_unavailable{reader="cost"}` says the latter); with
no price set, or no priced pod in the window, there is none.
"""

from __future__ import annotations

import math
from datetime import datetime

from kubeinfer.contract.cost import window_cost
from kubeinfer.operator.api.v1alpha1.status import CostStatus
from kubeinfer.operator.reconcile.reads import Reads
from kubeinfer.operator.state.cost_readings import usages
from kubeinfer.operator.state.observed import ObservedState

SIGNIFICANT_DIGITS = 6


def _significant(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def cost_record(observed: ObservedState, wanted: Reads, now: datetime) -> CostStatus | None:
    """`status.cost` for this pass: computed afresh from a reading of the inferences, else
    the stored one (None where the settings price no node)."""
    if wanted.cost is None:
        return None
    stored = observed.status.cost
    reading = observed.cost if wanted.cost.inferences else None
    if reading is None or reading.inferences is None or reading.covered_seconds < 1:
        return stored  # not due, not readable, or no past yet (a direct read's first)
    pods = usages(observed.cost_history.runs, now, reading.covered_seconds)
    if not pods:
        return None  # no pod of the window is on a priced node: nothing to say
    inferences = math.fsum(reading.inferences.get(pod, 0.0) for pod in pods)
    figure = window_cost(list(pods.values()), inferences)
    per_thousand = figure.per_thousand_inferences
    return CostStatus(
        per_thousand_inferences=_significant(per_thousand) if per_thousand is not None else None,
        window_seconds=max(1, round(reading.covered_seconds)),
        inferences=round(inferences),
        pod_hours=round(figure.pod_hours, 4),
        last_evaluated=now,
    )
