"""`spec.autoscaling.wakeOn`: what starts pods besides a request held by the activator.

KEDA scales from zero on a query and on a cron window; these are the same two, read by
the autoscaler (`kubeinfer.operator.scaling.zero`). Both are validated here, so a bad
cron expression or time zone is refused with the manifest, not met at the first pass.
"""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from kubeinfer.contract.api_model import ApiModel
from pydantic import Field, field_validator

CRON_FIVE_FIELDS = r"^\S+( +\S+){4}$"


class PrometheusWake(ApiModel):
    """Start a pod from zero while a PromQL query says work is waiting upstream (a queue's
    depth, jobs submitted): its value above `threshold` wakes the object."""

    query: str = Field(min_length=1, max_length=4096)
    """PromQL evaluated by the operator's Prometheus at each pass while the object is at
    zero: a scalar or a vector of one sample (wrap a query of several in `sum()`), compared
    with `threshold`. An answer of another shape, or a Prometheus that cannot be reached,
    wakes nothing and is said in the ScaledToZero condition."""

    threshold: float = Field(default=0, ge=0)
    """The value the query must exceed."""


class WakeSchedule(ApiModel):
    """A window when traffic is known to come: from each time `start` names, for
    `durationSeconds`, at least `replicas` pods, whatever the load (a floor, as KEDA's cron
    scaler sets one)."""

    start: str = Field(pattern=CRON_FIVE_FIELDS, max_length=128)
    """When the window opens: a five-field cron expression (minute hour day-of-month month
    day-of-week), in `timeZone`. The API server checks there are five fields; the
    operator checks each (an impossible one is an InvalidSpec condition)."""

    duration_seconds: int = Field(ge=60, le=7 * 24 * 3600)
    """How long the window stays open."""

    time_zone: str = Field(default="UTC", min_length=1, max_length=64)
    """The IANA time zone `start` is read in (`Europe/Paris`), so a window follows its
    daylight-saving changes."""

    replicas: int = Field(default=1, ge=1, le=1000)
    """Fewest pods while the window is open."""

    @field_validator("start")
    @classmethod
    def _cron(cls, value: str) -> str:
        if not croniter.is_valid(value):
            raise ValueError(f"{value!r} is not a five-field cron expression")
        return value

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as error:
            raise ValueError(f"{value!r} is not an IANA time zone") from error
        return value


class WakeOnSpec(ApiModel):
    """Signals that start pods besides a request the activator holds."""

    prometheus: PrometheusWake | None = None
    """Wake from zero on a Prometheus query (needs minReplicas 0 and the operator's
    Prometheus: the direct read evaluates no PromQL)."""

    schedules: list[WakeSchedule] = Field(default_factory=list, max_length=16)
    """Windows with a floor on the count; at zero, a window opening wakes the object."""
