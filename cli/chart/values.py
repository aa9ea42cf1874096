"""The Helm chart's values, typed: the one source of `helm/kubeinfer/values.yaml` and
`values.schema.json` (`python -m kubeinfer.cli.chart --write`; a test fails when either
drifts). Field names are snake_case here and camelCase in the chart; attribute
docstrings are the comments of values.yaml and the schema's descriptions.

The operator's own settings are not redeclared: `settings` holds `OperatorSettings`'
groups themselves (all but `watching`, which `watchNamespaces` decides, RBAC included),
so a value the operator would refuse at start-up is refused by `helm install` first, with
the same bounds. The chart passes each as `KUBEINFER_<GROUP>__<FIELD>`, the nested name
`OperatorSettings.from_env` reads.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from kubeinfer.cli.monitoring.values import MonitoringValues
from kubeinfer.operator.settings import (
    Activator,
    Api,
    Build,
    Cost,
    Images,
    KnownAnswers,
    LeaderElection,
    Metrics,
    Pods,
    Requeue,
)
from pydantic import BaseModel, ConfigDict, Field

OPERATOR_REPOSITORY = "ghcr.io/kubeinfer/kubeinfer-operator"
"""The Dockerfile's `operator` target, as `kubeinfer.cluster.images` tags it."""

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
Namespace = Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]
Quantity = Annotated[
    str | int | float,
    Field(
        union_mode="left_to_right",
        json_schema_extra={"pattern": r"^[+]?(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE]\d+)?$"},
    ),
]
"""A resource quantity (`100m`, `256Mi`, `2`), as a string or a plain number."""


class _Values(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class OperatorImage(_Values):
    """The operator's image."""

    repository: str = Field(
        default=OPERATOR_REPOSITORY, min_length=1, max_length=255, pattern=r"^[^\s@]+$"
    )
    """Where to pull it from (the Dockerfile's `operator` target: kopf and the Kubernetes
    client, no inference libraries)."""

    tag: str = Field(default="", pattern=r"^([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$")
    """Its tag; empty means the chart's appVersion."""

    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"


class Resources(_Values):
    """Requests and limits of the operator's container. Its memory grows with the objects
    it watches (docs/fleet.md has the figure per object): raise the limit for fleets of a
    thousand InferenceDeployments and more."""

    requests: dict[str, Quantity] = Field(
        default_factory=lambda: dict[str, str | int | float](cpu="100m", memory="256Mi")
    )
    limits: dict[str, Quantity] = Field(
        default_factory=lambda: dict[str, str | int | float](memory="512Mi")
    )


class SecretName(_Values):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253)


class OperatorSettingsValues(_Values):
    """The operator's settings (`kubeinfer.operator.settings`), group by group; each value
    reaches the operator as `KUBEINFER_<GROUP>__<FIELD>`."""

    images: Images = Images()
    """What the containers the operator creates run (runtime pods, engine build Jobs)."""

    metrics: Metrics = Metrics()
    """Where shadow verdicts and the autoscaler read their signals, and PodMonitors."""

    requeue: Requeue = Requeue()
    """How soon the operator looks at an object again when no event says so."""

    build: Build = Build()
    """Engine build Jobs and the retries of failed attempts."""

    pods: Pods = Pods()
    """The runtime pods' shutdown."""

    known_answers: KnownAnswers = KnownAnswers()
    """What the known-answer checks do beyond an object's own pods: with
    taintSuspectNodes, the chart also grants the operator `patch` on nodes."""

    activator: Activator = Activator()
    """Where the operator finds the activator (scale to zero: docs/scale-to-zero.md); the
    chart installs it in the release's namespace, the operator's own."""

    cost: Cost = Cost()
    """What serving costs: with prices per node-hour, status.cost (`kubectl get infd -o
    wide`'s Cost/1k) and the dashboard's cost panel show the cost of 1,000 inferences."""

    api: Api = Api()
    """The operator's requests to the API server."""

    leader_election: LeaderElection = LeaderElection()
    """Leader election's timings (the Lease is the release's, `<release>-operator`)."""


class ActivatorResources(_Values):
    """Requests and limits of an activator container: it holds requests' bodies while a
    pod starts (at most maxHeldRequests a route, each within the runtime's body limit)."""

    requests: dict[str, Quantity] = Field(
        default_factory=lambda: dict[str, str | int | float](cpu="100m", memory="128Mi")
    )
    limits: dict[str, Quantity] = Field(
        default_factory=lambda: dict[str, str | int | float](memory="512Mi")
    )


class ActivatorValues(_Values):
    """The activator (docs/scale-to-zero.md): where the traffic of an InferenceDeployment
    at zero pods goes, held until a pod is ready. Its pods run the runtime image
    (`settings.images.runtime`), with no API token."""

    enabled: bool = True
    """Install it; off, no object goes to zero (ScaledToZero says the activator does not
    route it)."""

    replicas: int = Field(default=2, ge=1, le=20)
    """Activator pods; a disruption budget keeps all but one through a drain."""

    max_held_requests: int = Field(default=256, ge=1, le=1_000_000)
    """Requests held at once for one object; the next is refused with 503 and
    Retry-After at once."""

    hold_timeout_seconds: int = Field(default=120, ge=1, le=3600)
    """Longest a request is held, from its arrival, before a 503 (cold starts without the
    engine in the node's cache take longer: raise it where engines are built on demand)."""

    resources: ActivatorResources = ActivatorResources()


class ChartValues(_Values):
    """The values of the kubeinfer chart."""

    image: OperatorImage = OperatorImage()

    replicas: int = Field(default=2, ge=1, le=10)
    """Operator replicas. They elect a leader through a Lease in the release's namespace:
    only the leader reconciles, a standby takes over within the lease duration when it
    dies (at once when it is stopped). With more than one, a PodDisruptionBudget keeps one
    running through a drain."""

    watch_namespaces: list[Namespace] = Field(
        default_factory=list, max_length=100, json_schema_extra={"uniqueItems": True}
    )
    """Namespaces to watch, each given a Role and RoleBinding; empty means the whole
    cluster (a ClusterRole and ClusterRoleBinding instead)."""

    metrics_port: int | None = Field(default=8080, ge=1024, le=65535)
    """Port of the operator's own /metrics (each InferenceDeployment's conditions and
    replicas), served by the leader and standbys alike; null: not served."""

    settings: OperatorSettingsValues = OperatorSettingsValues()

    resources: Resources = Resources()

    image_pull_secrets: list[SecretName] = Field(default_factory=list)
    """Secrets with the credentials to pull the operator's image."""

    pod_annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations added to the operator's pods."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the operator's pods must match."""

    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    """Taints the operator's pods tolerate (Kubernetes' Toleration objects)."""

    affinity: dict[str, Any] = Field(default_factory=dict)
    """The operator's pods' affinity (Kubernetes' Affinity object)."""

    activator: ActivatorValues = ActivatorValues()

    monitoring: MonitoringValues = MonitoringValues()
