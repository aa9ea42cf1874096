"""PromQL written from the contract's series: the dashboard's panels and the alert rules
both build their expressions here, so a series renamed in `kubeinfer.contract.metric_series`
renames every query, and a label a series does not carry fails at generation time rather
than as an empty panel. Pure string building.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kubeinfer.contract.metric_series import Series

SCRAPE_LABELS = ("namespace", "pod")
"""What Prometheus attaches to every runtime series (the PodMonitor's or the annotation
job's relabelling): the operator's queries and these select on them."""


def _labels_of(series: Series) -> set[str]:
    own = set(series.labels)
    if series.kind == "histogram":
        own.add("le")
    # The operator's series carry the object's namespace themselves (honorLabels).
    return own | set(SCRAPE_LABELS)


def _check(series: Series, labels: Sequence[str]) -> None:
    unknown = set(labels) - _labels_of(series)
    if unknown:
        raise ValueError(f"{series.name} has no label {sorted(unknown)}")


def sample(series: Series, part: str = "") -> str:
    """The name of one of the family's samples: `total` (a counter's), `bucket`, `count`,
    `sum` (a histogram's), or the family's own name (a gauge's)."""
    if part == "total":
        return series.total
    assert part in ("", "bucket", "count", "sum"), part
    assert (series.kind == "histogram") == bool(part), (series.name, part)
    return series.name + (f"_{part}" if part else "")


def selector(series: Series, part: str = "", **match: str) -> str:
    """`name{label="value", ...}`; a value starting with `=~`, `!=` or `!~` is that
    matcher (`namespace="=~$namespace"` is `namespace=~"$namespace"`)."""
    _check(series, list(match))
    matchers = []
    for label, value in match.items():
        operator = "="
        for prefix in ("=~", "!=", "!~"):
            if value.startswith(prefix):
                operator, value = prefix, value[len(prefix) :]
        matchers.append(f'{label}{operator}"{value}"')
    name = sample(series, part)
    return f"{name}{{{', '.join(matchers)}}}" if matchers else name


def by(labels: Sequence[str]) -> str:
    return f"by ({', '.join(labels)})"


def summed_rate(
    series: Series, group: Sequence[str], window: str, part: str = "total", **match: str
) -> str:
    """`sum by (group) (rate(series[window]))`: a counter's (or a histogram part's) rate."""
    _check(series, group)
    return f"sum {by(group)} (rate({selector(series, part, **match)}[{window}]))"


def summed_increase(
    series: Series, group: Sequence[str], window: str, part: str = "total", **match: str
) -> str:
    _check(series, group)
    return f"sum {by(group)} (increase({selector(series, part, **match)}[{window}]))"


def quantile(q: float, series: Series, group: Sequence[str], window: str, **match: str) -> str:
    """A histogram's q-quantile over `window`, per `group` (summed over pods)."""
    assert series.kind == "histogram", series.name
    rate = summed_rate(series, (*group, "le"), window, "bucket", **match)
    return f"histogram_quantile({q:g}, {rate})"


def ratio(
    numerator: Series,
    denominator: Series,
    group: Sequence[str],
    window: str,
    match: Mapping[str, str],
    increase: bool = False,
) -> str:
    """One counter's growth over another's, per `group` (agreements over rows)."""
    of = summed_increase if increase else summed_rate
    return f"{of(numerator, group, window, **match)}\n/\n{of(denominator, group, window, **match)}"


def gauge(series: Series, group: Sequence[str], how: str = "max", **match: str) -> str:
    """`max by (group) (series{match})`: a gauge per group, one figure where several
    operator replicas or pods report it."""
    _check(series, group)
    return f"{how} {by(group)} ({selector(series, **match)})"


def condition(family: Series, labels: Mapping[str, str], group: Sequence[str]) -> str:
    """The operator's condition gauge for one (type, status, reason): 1 while an object's
    status holds it."""
    return f"{gauge(family, group, **labels)} == 1"
