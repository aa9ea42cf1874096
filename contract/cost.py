"""The cost of 1,000 inferences over a window, in one formula and its two forms: the
Python function the operator's status and `kubeinfer tune` compute it with, and the PromQL
the chart's dashboard plots. Pure.

    cost of the window   = sum over the pods of  share x node price per hour x seconds / 3600
    per 1,000 inferences = 1000 x cost of the window / inferences answered in the window

- A pod's share of its node: a pod that requests GPUs (`nvidia.com/gpu`) holds that many
  of the node's allocatable GPUs; a pod that requests none holds its requested CPU of the
  node's allocatable CPU (`node_share`). The node's price is per node-hour, in the user's
  currency (a plain number: the figure is in the same currency).
- The seconds a pod ran in the window count whether it answered anything or stood idle: an
  idle pod is paid for. Seconds with no pod at all (an object at zero) cost nothing, but
  the inferences of the window still divide the cost of the pods that ran in it.
- No inference answered in the window: no figure (`per_thousand_inferences` is None),
  never a division by zero.

The PromQL form (`per_thousand_inferences_promql`) is built from the same series: the
operator's `kubeinfer_inferencedeployment_pod_price_per_hour` (a pod's share times its
node's price, while it runs on a priced node) summed over the window at a fixed resolution
(each step a pod's series is present counts the step's seconds), over the runtime's
`kubeinfer_requests_total{code="200"}` grown in the window (`GROWTH_IN_WINDOW_BY`: the
counts, whole, not `increase()`'s extrapolation) of the pods that had a price. Both read
the pods the operator priced; `tests/monitoring` runs the PromQL on a real Prometheus
against hand-made series and compares it with `window_cost` on the same samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kubeinfer.contract import metric_series as series

SECONDS_PER_HOUR = 3600
CPU_NODES = "cpu"
"""The key of `cost.pricePerNodeHour` that prices a node without a GPU product label."""
ANSWERED_CODE = "200"
"""An inference answered: the request counter's `code` for a successful infer."""


@dataclass(frozen=True)
class PodUsage:
    """One pod over the window: its share of its node, the node's price, how long it ran."""

    node_share: float
    """0..1: the part of its node the pod holds (`node_share`)."""
    node_price_per_hour: float
    """The node's price for one hour, in the user's currency."""
    running_seconds: float
    """Seconds the pod ran inside the window, idle or not."""

    def __post_init__(self) -> None:
        for name, value in (
            ("node_share", self.node_share),
            ("node_price_per_hour", self.node_price_per_hour),
            ("running_seconds", self.running_seconds),
        ):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number at least 0, not {value}")
        if self.node_share > 1:
            raise ValueError(f"node_share is at most 1, not {self.node_share}")

    @property
    def price_per_hour(self) -> float:
        """What the pod costs per hour: its share of its node's price."""
        return self.node_share * self.node_price_per_hour


@dataclass(frozen=True)
class WindowCost:
    """What the pods of one window cost, and per 1,000 inferences."""

    cost: float
    """What the pods cost over the window, in the prices' currency."""
    pod_hours: float
    """The hours the pods ran in the window, added up (two pods for an hour: 2)."""
    inferences: float
    """Inferences answered in the window."""
    per_thousand_inferences: float | None
    """1000 x cost / inferences; None when no inference was answered."""


def node_share(
    requested_gpus: float, node_gpus: float, requested_cpu: float, node_cpu: float
) -> float | None:
    """The part of its node a pod holds: its GPUs over the node's allocatable GPUs when it
    requests any, else its requested CPU over the node's allocatable CPU (cores, or any unit
    used for both); at most 1. None where the share is not known: GPUs requested on a node
    with none allocatable, or no CPU requested, or none allocatable."""
    if requested_gpus > 0:
        return min(1.0, requested_gpus / node_gpus) if node_gpus > 0 else None
    if requested_cpu > 0 and node_cpu > 0:
        return min(1.0, requested_cpu / node_cpu)
    return None


def window_cost(pods: Sequence[PodUsage], inferences: float) -> WindowCost:
    """The cost of the window of `pods` (every pod that ran in it, idle ones included), and
    of 1,000 of the `inferences` answered in it: None without any, whatever the pods cost
    (the figure is a price per inference; a window that answered nothing has none)."""
    if not (math.isfinite(inferences) and inferences >= 0):
        raise ValueError(f"inferences must be a finite number at least 0, not {inferences}")
    cost = math.fsum(p.price_per_hour * p.running_seconds for p in pods) / SECONDS_PER_HOUR
    hours = math.fsum(p.running_seconds for p in pods) / SECONDS_PER_HOUR
    per_thousand = 1000 * cost / inferences if inferences > 0 else None
    return WindowCost(cost, hours, inferences, per_thousand)


# -- the PromQL form ---------------------------------------------------------------------------

WINDOW_BASE_MARGIN_SECONDS = 60
"""How far before the window's start a counter's last sample may lie and still be its value
there (the operator's windowed queries use the same margin)."""

GROWTH_IN_WINDOW_BY = (
    "sum by ({by}) ("
    "(last_over_time({series}[{window}s]) - last_over_time({series}[{margin}s] offset {window}s)"
    " unless resets({series}[{window_and_margin}s]) > 0)"
    " or last_over_time({series}[{window}s]))"
)
"""A counter's growth over the window per series, summed by the `{by}` labels: its value
now less its value at the window's start, or all of it where the series began (or reset)
inside the window. The same form as the quality watch's window
(`kubeinfer.operator.metrics_sources.queries`, whose comment gives its error); a test
checks the two are one text."""


def growth_in_window(selector: str, window_seconds: int, by: Sequence[str]) -> str:
    """`GROWTH_IN_WINDOW_BY` of the counter samples `selector` (a name with its matchers)."""
    return GROWTH_IN_WINDOW_BY.format(
        by=", ".join(by),
        series=selector,
        window=int(window_seconds),
        margin=WINDOW_BASE_MARGIN_SECONDS,
        window_and_margin=int(window_seconds) + WINDOW_BASE_MARGIN_SECONDS,
    )


def _selector(name: str, matchers: str) -> str:
    return f"{name}{{{matchers}}}" if matchers else name


def per_thousand_inferences_promql(
    window_seconds: int, resolution_seconds: int, matchers: str = ""
) -> str:
    """The cost of 1,000 inferences over the last `window_seconds`, per InferenceDeployment
    (`namespace`, `name`), as PromQL: the pods' prices per hour summed over the window every
    `resolution_seconds` (a subquery: each step a pod's price is present counts that many
    seconds of it), over the inferences its priced pods answered in the window. `matchers`
    (e.g. `namespace=~"$namespace"`) select both sides' series. No inference in the window:
    no sample (the division is by a count above 0 only)."""
    if not 0 < resolution_seconds <= window_seconds:
        raise ValueError("the resolution must be positive and at most the window")
    price = _selector(series.INFERENCE_DEPLOYMENT_POD_PRICE_PER_HOUR.name, matchers)
    answered = ", ".join(filter(None, (f'code="{ANSWERED_CODE}"', matchers)))
    requests = _selector(series.REQUESTS.total, answered)
    pod = "namespace, name, pod"
    window, step = int(window_seconds), int(resolution_seconds)
    cost = (
        f"sum_over_time(sum by (namespace, name) (max by ({pod}) ({price}))[{window}s:{step}s])"
        f" * {step} / {SECONDS_PER_HOUR}"
    )
    inferences = (
        f"sum by (namespace, name) (\n  {growth_in_window(requests, window, ('namespace', 'pod'))}"
        f"\n  * on (namespace, pod) group_left (name)\n"
        f"  group by ({pod}) (max_over_time({price}[{window}s]))\n)"
    )
    return f"1000 * {cost}\n/\n({inferences} > 0)"
