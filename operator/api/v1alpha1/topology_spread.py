"""How the runtime pods spread over the cluster's failure domains: the spec's
`runtime.topologySpread`, which `reconcile.desired` renders as the pods'
`topologySpreadConstraints`.

By default the pods of a Deployment spread over zones, then over nodes, as a preference:
a node or a zone that fails takes as few of them as the cluster allows, and where the
spreading cannot hold (one zone left, fewer nodes than pods) they still schedule.
"""

from __future__ import annotations

from typing import Annotated, Literal

from kubeinfer.contract.api_model import ApiModel
from kubeinfer.operator.api.v1alpha1.patterns import QUALIFIED_NAME
from pydantic import Field

ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"

TopologyKey = Annotated[str, Field(pattern=QUALIFIED_NAME, max_length=317)]


class TopologySpreadSpec(ApiModel):
    """One topology spread constraint per key, over the pods of one revision of the
    runtime Deployment (a rolling update's new pods spread among themselves)."""

    topology_keys: list[TopologyKey] = Field(
        default_factory=lambda: [ZONE, HOSTNAME],
        max_length=8,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    """Node labels whose values are the domains to spread over (by default the zone, then
    the node); empty: no spreading. A node without the label is no domain of that key:
    with DoNotSchedule it takes none of the pods."""

    max_skew: int = Field(default=1, ge=1, le=100)
    """Most pods one domain may hold beyond the domain with the fewest."""

    when_unsatisfiable: Literal["ScheduleAnyway", "DoNotSchedule"] = "ScheduleAnyway"
    """ScheduleAnyway: a preference, the scheduler ranks nodes by it and a pod still
    schedules where it cannot hold; DoNotSchedule: a rule, a pod that would break it
    stays Pending."""
