"""The operator's own configuration, read once at start from `KUBEINFER_*` variables.

`OperatorSettings` is a pydantic-settings model grouped as kopf groups its settings
(`settings.build.backoff_seconds`, `settings.metrics.prometheus_url`, ...). Each field is
set by one variable, `KUBEINFER_<GROUP>__<FIELD>` (`KUBEINFER_BUILD__BACKOFF_SECONDS`,
`KUBEINFER_METRICS__PROMETHEUS_URL`), pydantic-settings' nested name and the one the Helm
chart passes; a whole group given as one variable (`KUBEINFER_BUILD`) is refused, so no
setting has two spellings. Every duration carries its unit.

The pure reconcile core receives an instance as an argument; nothing reads the
environment at import time. `from_env()` turns a bad value into `InvalidSettings` naming
the variable."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

ENV_PREFIX = "KUBEINFER_"
NESTED_DELIMITER = "__"

DEFAULT_RUNTIME_IMAGE = "ghcr.io/kubeinfer/kubeinfer-runtime:0.1.0"
DEFAULT_GPU_RUNTIME_IMAGE = "ghcr.io/kubeinfer/kubeinfer-runtime-gpu:0.1.0"


class InvalidSettings(ValueError):
    """An environment variable the operator cannot use; the message names it."""


class _Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class Images(_Group):
    """What the containers the operator creates run."""

    runtime: str = Field(default=DEFAULT_RUNTIME_IMAGE, min_length=1, max_length=512)
    """Image of the runtime pods and engine build Jobs of ONNX Runtime engines when the
    spec names none (the Dockerfile's `runtime` target; both run the `kubeinfer` CLI)."""

    gpu_runtime: str = Field(default=DEFAULT_GPU_RUNTIME_IMAGE, min_length=1, max_length=512)
    """The same for TensorRT engines (the Dockerfile's `runtime-gpu` target: TensorRT and
    CUDA are in it, ONNX Runtime's CPU image has neither)."""

    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(default="IfNotPresent")
    """Pull policy of the containers the operator creates."""

    def image_for(self, spec_image: str | None, tensorrt: bool) -> str:
        """The runtime and build image of an object: its own, else the default of its
        backend."""
        return spec_image or (self.gpu_runtime if tensorrt else self.runtime)


class Watching(_Group):
    """Which objects the operator sees."""

    namespaces: Annotated[tuple[str, ...], NoDecode] = ()
    """Namespaces to watch (comma-separated in the environment); empty means the whole
    cluster."""

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split_namespaces(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value


class Requeue(_Group):
    """How soon the operator looks at an object again when no event says so."""

    resync_interval_seconds: float = Field(default=60, gt=0, le=86_400)
    """Period of the timer that reconciles every object even when nothing changed."""

    build_poll_seconds: float = Field(default=10, gt=0, le=3600)
    """How soon to look again while a build Job runs (its pod's termination message is
    not always announced by an event on the Job)."""

    shadow_poll_seconds: float = Field(default=15, gt=0, le=3600)
    """How often a running shadow test's aggregates are read and judged."""

    autoscale_poll_seconds: float = Field(default=15, gt=0, le=3600)
    """How often an autoscaled object's signals are read and its count recommended (the
    HorizontalPodAutoscaler's default sync period)."""


class Build(_Group):
    """Engine build Jobs and the retries of failed attempts."""

    backoff_seconds: float = Field(default=30, gt=0, le=86_400)
    """Delay before retrying after the first failed build attempt; doubles per attempt."""

    backoff_max_seconds: float = Field(default=1800, gt=0, le=86_400)
    """Longest delay between build attempts."""

    backoff_limit: int = Field(default=1, ge=0, le=10)
    """The build Job's own pod retries (Job.spec.backoffLimit) before the attempt fails."""

    active_deadline_seconds: int = Field(default=3600, ge=60, le=86_400)
    """Longest one build attempt may run (Job.spec.activeDeadlineSeconds)."""

    ttl_seconds_after_finished: int = Field(default=86_400, ge=0, le=31_536_000)
    """How long finished build Jobs are kept before Kubernetes deletes them; the built
    engine's digest is kept on the runtime ConfigMap, so nothing is rebuilt after."""


class Pods(_Group):
    """The runtime pods' shutdown."""

    pre_stop_sleep_seconds: int = Field(default=5, ge=0, le=300)
    """Pause before SIGTERM reaches a runtime pod, so Service endpoints stop sending it
    traffic before it starts draining."""

    drain_grace_period_seconds: int = Field(default=30, ge=0, le=3600)
    """How long a terminating runtime pod may answer queued and in-flight requests (the
    runtime's drainGracePeriodSeconds); the pod's termination grace period is longer."""

    testing_faults: str | None = Field(default=None, max_length=256)
    """FOR TESTS ONLY: faults the serving pods inject (`kubeinfer serve --testing-faults`,
    docs/known-answers.md), so the tests can show wrong answers caught; never set in
    production."""

    testing_faults_objects: Annotated[tuple[str, ...] | None, NoDecode] = None
    """FOR TESTS ONLY: the InferenceDeployments (`namespace/name`, comma-separated in the
    environment) whose serving pods get `testing_faults`; unset or empty: every one's.
    `kubeinfer demo` injects its faults into one object only, so its other steps stay
    fault-free."""

    @field_validator("testing_faults_objects", mode="before")
    @classmethod
    def _split_objects(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = tuple(part.strip() for part in value.split(",") if part.strip())
        for item in value or ():
            namespace, _, name = str(item).partition("/")
            if not (namespace and name) or "/" in name:
                raise ValueError(f"expected namespace/name, got {item!r}")
        return value

    def injects_faults_into(self, namespace: str, name: str) -> bool:
        """Whether the serving pods of `namespace/name` get `testing_faults`."""
        if not self.testing_faults:
            return False
        return not self.testing_faults_objects or f"{namespace}/{name}" in (
            self.testing_faults_objects
        )

    @property
    def termination_grace_period_seconds(self) -> int:
        """preStop pause + drain + a margin, so the kubelet never kills a draining pod."""
        return self.pre_stop_sleep_seconds + self.drain_grace_period_seconds + 10


class Metrics(_Group):
    """Where shadow verdicts and the autoscaler read their signals, and PodMonitors."""

    prometheus_url: str | None = Field(default=None, pattern=r"^https?://.+$", max_length=2048)
    """The Prometheus that shadow verdicts (and the autoscaler) read, when an
    InferenceDeployment names none (spec.monitoring.prometheus.url). Unset: the operator
    reads the runtime pods' /metrics itself."""

    timeout_seconds: float = Field(default=5, gt=0, le=120)
    """Longest one read of the metrics source may take (a Prometheus query, or one pod's
    /metrics); a slower source counts as unavailable for that pass."""

    pod_monitors: Literal["auto", "off"] = "auto"
    """`auto`: create a PodMonitor (monitoring.coreos.com/v1) per InferenceDeployment where
    the prometheus-operator's API exists; `off`: never (the pods' prometheus.io annotations
    remain for annotation-based scrape jobs)."""

    pod_monitor_labels: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    """Labels added to every PodMonitor (`k=v,k=v` in the environment), for a Prometheus
    whose podMonitorSelector asks for them (e.g. `release=kube-prometheus-stack`)."""

    @field_validator("pod_monitor_labels", mode="before")
    @classmethod
    def _split_labels(cls, value: Any) -> Any:
        if isinstance(value, str):
            pairs = [part.strip() for part in value.split(",") if part.strip()]
            if not all("=" in pair for pair in pairs):
                raise ValueError("expected key=value pairs separated by commas")
            return dict(pair.split("=", 1) for pair in pairs)
        return value


class KnownAnswers(_Group):
    """What the known-answer checks (spec.knownAnswers, docs/known-answers.md) do beyond
    an InferenceDeployment's own pods."""

    taint_suspect_nodes: bool = False
    """Taint each node an InferenceDeployment's status.suspectNodes names (pods of more
    than one engine answered wrong there) with `kubeinfer.io/suspect-answers:NoSchedule`,
    so nothing new is scheduled there, and remove the taint once no InferenceDeployment
    names the node. Off: the status names the node and nothing is done to it. On, the
    operator needs `patch` on nodes (the chart grants it only then)."""


class Activator(_Group):
    """Where the activator runs (the Deployment the chart and `kubeinfer up` install,
    docs/scale-to-zero.md): the pods an object at zero pods is routed to, and the route
    table they read."""

    namespace: str | None = Field(default=None, min_length=1, max_length=63)
    """The activator pods' namespace; unset: the operator's own (`POD_NAMESPACE`, which the
    chart and `kubeinfer up` set, else `kubeinfer-system`), where both install it."""

    def namespace_or(self, own: str | None) -> str:
        """The activator's namespace, with `own` the operator's (None: not known)."""
        return self.namespace or own or "kubeinfer-system"

    pod_selector: str = Field(
        default="app.kubernetes.io/name=kubeinfer-activator", min_length=1, max_length=512
    )
    """The label selector of the activator pods."""

    routes_config_map: str = Field(
        default="kubeinfer-activator-routes", min_length=1, max_length=253
    )
    """The ConfigMap (in `namespace`) whose `routes.json` the operator writes and the
    activator pods mount: one route per object with minReplicas 0."""

    http_port: int = Field(default=8000, ge=1, le=65535)
    """The activator pods' HTTP port (also its /v2/activator, which the operator reads)."""

    grpc_port: int = Field(default=8001, ge=1, le=65535)
    """The activator pods' gRPC port."""


class Cost(_Group):
    """What serving costs: status.cost, the cost of 1,000 inferences over the last window
    (docs/operating.md#the-cost-of-1000-inferences)."""

    price_per_node_hour: Annotated[dict[str, float], NoDecode] = Field(default_factory=dict)
    """The price of one node for one hour, by the node's GPU product (its
    `nvidia.com/gpu.product` label, as GPU feature discovery sets it), and under `cpu` for
    nodes without one (`product=price,cpu=price` in the environment). A plain number in
    your currency: the cost is in the same. Empty: no cost is computed or shown. A pod on a
    node without a price is left out of the figure, its inferences too."""

    window_seconds: int = Field(default=3600, ge=60, le=7 * 86_400)
    """The window the cost covers: the pods' seconds and the inferences answered in it."""

    refresh_seconds: int = Field(default=300, ge=10, le=86_400)
    """How often status.cost is computed again (the inferences read, the status written);
    between, the figure stands. The pods are watched at every pass all the same."""

    @field_validator("price_per_node_hour", mode="before")
    @classmethod
    def _split_prices(cls, value: Any) -> Any:
        if isinstance(value, str):
            pairs = [part.strip() for part in value.split(",") if part.strip()]
            if not all("=" in pair for pair in pairs):
                raise ValueError("expected product=price pairs separated by commas")
            value = dict(pair.split("=", 1) for pair in pairs)
        return value

    @field_validator("price_per_node_hour", mode="after")
    @classmethod
    def _prices_are_prices(cls, value: dict[str, float]) -> dict[str, float]:
        for product, price in value.items():
            if not product.strip():
                raise ValueError("a price needs a GPU product (or cpu) before its =")
            if not (math.isfinite(price) and price >= 0):
                raise ValueError(f"the price of {product} must be a number at least 0")
        return value

    @property
    def priced(self) -> bool:
        """Whether any node has a price: the cost is computed only then."""
        return bool(self.price_per_node_hour)


class Api(_Group):
    """The operator's requests to the API server (kopf's `networking`)."""

    field_manager: str = Field(default="kubeinfer", min_length=1, max_length=128)
    """Server-side apply field manager: the operator owns exactly the fields it sets."""

    timeout_seconds: float = Field(default=30, gt=0, le=600)
    """Longest one request to the API server may take (connecting, sending, reading the
    answer); a request past it fails and is retried like any unanswered one, so a hung
    call never holds an object's reconcile for long."""

    page_size: int = Field(default=500, ge=1, le=10_000)
    """Objects per page when the operator lists (`limit`, then `continue`)."""

    max_concurrent_passes: int = Field(default=64, ge=1, le=1000)
    """Reconcile passes in flight at once, over all objects (controller-runtime's
    MaxConcurrentReconciles); the others wait their turn, and the events that arrive
    meanwhile join the pass already waiting for their object. Without a bound, a
    thousand objects created together start a thousand passes, whose requests the API
    server leaves unanswered past the timeout, and every failed pass comes back."""


class LeaderElection(_Group):
    """With `--leader-election` (kopf's `peering`, done as client-go does it)."""

    lease_duration_seconds: float = Field(default=15, ge=1, le=3600)
    """How long a standby waits, after it last saw the Lease renewed, before it takes over
    (client-go's LeaseDuration)."""

    renew_deadline_seconds: float = Field(default=10, ge=1, le=3600)
    """How long the leader keeps trying to renew before it stops reconciling and exits
    (client-go's RenewDeadline)."""

    retry_period_seconds: float = Field(default=2, ge=1, le=600)
    """How often candidates try to acquire, and the leader to renew (client-go's
    RetryPeriod). Each Lease request may take at most half of it."""

    @model_validator(mode="after")
    def _lease_outlives_a_failed_renewal(self) -> Self:
        """The leader must have stopped before a standby may take over: it gives up at most
        a retry period plus the renew deadline plus one more attempt (two requests of half a
        retry period each) after its last renewal, so the lease must last longer than that."""
        if self.renew_deadline_seconds <= 1.2 * self.retry_period_seconds:
            raise ValueError(
                f"{variable('leader_election', 'renew_deadline_seconds')}: must exceed 1.2 "
                f"times {variable('leader_election', 'retry_period_seconds')}"
            )
        if (
            self.lease_duration_seconds
            <= self.renew_deadline_seconds + 2 * self.retry_period_seconds
        ):
            raise ValueError(
                f"{variable('leader_election', 'lease_duration_seconds')}: must exceed the "
                "renew deadline plus two retry periods"
            )
        return self


class OperatorSettings(BaseSettings):
    """Operator-wide defaults and timings, in groups (see the module's docstring for the
    variable names)."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=NESTED_DELIMITER,
    )

    # NoDecode: a group is never read from one variable as JSON, only field by field.
    images: Annotated[Images, NoDecode] = Images()
    watching: Annotated[Watching, NoDecode] = Watching()
    requeue: Annotated[Requeue, NoDecode] = Requeue()
    build: Annotated[Build, NoDecode] = Build()
    pods: Annotated[Pods, NoDecode] = Pods()
    metrics: Annotated[Metrics, NoDecode] = Metrics()
    known_answers: Annotated[KnownAnswers, NoDecode] = KnownAnswers()
    cost: Annotated[Cost, NoDecode] = Cost()
    activator: Annotated[Activator, NoDecode] = Activator()
    api: Annotated[Api, NoDecode] = Api()
    leader_election: Annotated[LeaderElection, NoDecode] = LeaderElection()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then the environment; no .env or secrets files."""
        return init_settings, env_settings

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with `update` validated: pydantic's own copy takes any key silently, so
        a misspelt or ungrouped field (`shadow_poll_seconds` for
        `requeue.shadow_poll_seconds`) would change nothing without a word."""
        if not update:
            return super().model_copy(deep=deep)
        return self.model_validate({**self.model_dump(), **update})

    @classmethod
    def from_env(cls) -> OperatorSettings:
        """The settings from the process environment alone; raises InvalidSettings naming
        each variable with a bad value, and each that is spelt like a setting but is not
        one (`misspelt`)."""
        try:
            settings = cls()
        except ValidationError as error:
            raise InvalidSettings("; ".join(map(_problem, error.errors()))) from None
        if wrong := misspelt(os.environ):
            raise InvalidSettings("; ".join(wrong))
        return settings


def variable(group: str, field: str | None = None) -> str:
    """The variable of a group's field (`KUBEINFER_BUILD__BACKOFF_SECONDS`), or of the
    group as a whole."""
    name = f"{group}{NESTED_DELIMITER}{field}" if field else group
    return f"{ENV_PREFIX}{name}".upper()


def _problem(error: ErrorDetails) -> str:
    """One validation error as `VARIABLE: what is wrong`. An error at a group alone is a
    rule across its fields (which names them), or the group given as one variable."""
    loc, message = error["loc"], error["msg"].removeprefix("Value error, ")
    if len(loc) > 1:
        return f"{variable(str(loc[0]), str(loc[1]))}: {message}"
    if error["type"] == "model_type" and isinstance(error["input"], str):
        group = str(loc[0])
        return (
            f"{variable(group)}: a group is not set as a whole; set each of its fields as "
            f"{variable(group, '<field>')}"
        )
    return message


def misspelt(environ: Mapping[str, str]) -> list[str]:
    """A problem for each `KUBEINFER_` variable without the group separator that names a
    setting's field (`KUBEINFER_BUILD_BACKOFF_SECONDS`, `KUBEINFER_RUNTIME_IMAGE`): such a
    variable would otherwise be ignored without a word, and the setting keep its default.
    The message names the variable meant: the longest field named, in the group named
    where the name says one."""
    places = [
        (group, field)
        for group, info in OperatorSettings.model_fields.items()
        for field in info.annotation.model_fields  # type: ignore[union-attr]
    ]
    problems = []
    for name in sorted(environ):
        words = f"_{name.upper().removeprefix(ENV_PREFIX).lower()}_"
        if not name.upper().startswith(ENV_PREFIX) or NESTED_DELIMITER in words:
            continue
        named = [(g, f) for g, f in places if f"_{f}_" in words]
        longest = max((len(f) for _, f in named), default=0)
        named = [(g, f) for g, f in named if len(f) == longest]
        named = [(g, f) for g, f in named if f"_{g}_" in words] or named
        if named:
            meant = " or ".join(variable(g, f) for g, f in named)
            problems.append(f"{name}: not a setting; the variable is {meant}")
    return problems
