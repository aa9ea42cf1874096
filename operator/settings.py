"""The operator's own configuration, read once at start from `KUBEINFER_*` variables.

`OperatorSettings` is a pydantic-settings model grouped as kopf groups its settings
(`settings.build.backoff_seconds`, `settings.metrics.prometheus_url`, ...). Each field can
be set two ways: by its nested name, pydantic-settings' own form
(`KUBEINFER_BUILD__BACKOFF_SECONDS`, a group as JSON in `KUBEINFER_BUILD`), or by its flat
name, the one the Helm chart, the local mode and the README use
(`KUBEINFER_BUILD_BACKOFF_SECONDS`): a field's last validation alias, else the field's
own name. The nested name wins when both are set. Every duration carries its unit.

The pure reconcile core receives an instance as an argument; nothing reads the
environment at import time. `from_env(mapping)` reads a given mapping instead of
`os.environ` (the tests) and turns a bad value into `InvalidSettings` naming the variable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)
from pydantic_settings.sources.utils import parse_env_vars

ENV_PREFIX = "KUBEINFER_"
NESTED_DELIMITER = "__"

DEFAULT_RUNTIME_IMAGE = "ghcr.io/kubeinfer/kubeinfer-runtime:0.1.0"
DEFAULT_GPU_RUNTIME_IMAGE = "ghcr.io/kubeinfer/kubeinfer-runtime-gpu:0.1.0"


class InvalidSettings(ValueError):
    """An environment variable the operator cannot use; the message names it."""


class _Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


@dataclass(frozen=True)
class Flat:
    """Marks a grouped field whose flat variable, `KUBEINFER_<name>`, is not its own name
    (`Annotated[float, Flat("BUILD_BACKOFF_SECONDS")]` in group `build`)."""

    name: str


class Images(_Group):
    """What the containers the operator creates run."""

    runtime: Annotated[str, Flat("RUNTIME_IMAGE")] = Field(
        default=DEFAULT_RUNTIME_IMAGE, min_length=1, max_length=512
    )
    """Image of the runtime pods and engine build Jobs of ONNX Runtime engines when the
    spec names none (the Dockerfile's `runtime` target; both run the `kubeinfer` CLI)."""

    gpu_runtime: Annotated[str, Flat("GPU_RUNTIME_IMAGE")] = Field(
        default=DEFAULT_GPU_RUNTIME_IMAGE, min_length=1, max_length=512
    )
    """The same for TensorRT engines (the Dockerfile's `runtime-gpu` target: TensorRT and
    CUDA are in it, ONNX Runtime's CPU image has neither)."""

    pull_policy: Annotated[
        Literal["Always", "IfNotPresent", "Never"], Flat("IMAGE_PULL_POLICY")
    ] = Field(default="IfNotPresent")
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

    backoff_seconds: Annotated[float, Flat("BUILD_BACKOFF_SECONDS")] = Field(
        default=30, gt=0, le=86_400
    )
    """Delay before retrying after the first failed build attempt; doubles per attempt."""

    backoff_max_seconds: Annotated[float, Flat("BUILD_BACKOFF_MAX_SECONDS")] = Field(
        default=1800, gt=0, le=86_400
    )
    """Longest delay between build attempts."""

    backoff_limit: Annotated[int, Flat("BUILD_BACKOFF_LIMIT")] = Field(default=1, ge=0, le=10)
    """The build Job's own pod retries (Job.spec.backoffLimit) before the attempt fails."""

    active_deadline_seconds: Annotated[int, Flat("BUILD_ACTIVE_DEADLINE_SECONDS")] = Field(
        default=3600, ge=60, le=86_400
    )
    """Longest one build attempt may run (Job.spec.activeDeadlineSeconds)."""

    ttl_seconds_after_finished: Annotated[int, Flat("BUILD_TTL_SECONDS_AFTER_FINISHED")] = Field(
        default=86_400, ge=0, le=31_536_000
    )
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

    timeout_seconds: Annotated[float, Flat("METRICS_TIMEOUT_SECONDS")] = Field(
        default=5, gt=0, le=120
    )
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


class Api(_Group):
    """The operator's requests to the API server (kopf's `networking`)."""

    field_manager: str = Field(default="kubeinfer", min_length=1, max_length=128)
    """Server-side apply field manager: the operator owns exactly the fields it sets."""

    timeout_seconds: Annotated[float, Flat("API_TIMEOUT_SECONDS")] = Field(default=30, gt=0, le=600)
    """Longest one request to the API server may take (connecting, sending, reading the
    answer); a request past it fails and is retried like any unanswered one, so a hung
    call never holds an object's reconcile for long."""

    page_size: Annotated[int, Flat("API_PAGE_SIZE")] = Field(default=500, ge=1, le=10_000)
    """Objects per page when the operator lists (`limit`, then `continue`)."""


class LeaderElection(_Group):
    """With `--leader-election` (kopf's `peering`, done as client-go does it)."""

    lease_duration_seconds: Annotated[float, Flat("LEADER_ELECTION_LEASE_DURATION_SECONDS")] = (
        Field(default=15, ge=1, le=3600)
    )
    """How long a standby waits, after it last saw the Lease renewed, before it takes over
    (client-go's LeaseDuration)."""

    renew_deadline_seconds: Annotated[float, Flat("LEADER_ELECTION_RENEW_DEADLINE_SECONDS")] = (
        Field(default=10, ge=1, le=3600)
    )
    """How long the leader keeps trying to renew before it stops reconciling and exits
    (client-go's RenewDeadline)."""

    retry_period_seconds: Annotated[float, Flat("LEADER_ELECTION_RETRY_PERIOD_SECONDS")] = Field(
        default=2, ge=1, le=600
    )
    """How often candidates try to acquire, and the leader to renew (client-go's
    RetryPeriod). Each Lease request may take at most half of it."""

    @model_validator(mode="after")
    def _lease_outlives_a_failed_renewal(self) -> Self:
        """The leader must have stopped before a standby may take over: it gives up at most
        a retry period plus the renew deadline plus one more attempt (two requests of half a
        retry period each) after its last renewal, so the lease must last longer than that."""
        if self.renew_deadline_seconds <= 1.2 * self.retry_period_seconds:
            raise ValueError(
                f"{ENV_PREFIX}LEADER_ELECTION_RENEW_DEADLINE_SECONDS: must exceed 1.2 "
                f"times {ENV_PREFIX}LEADER_ELECTION_RETRY_PERIOD_SECONDS"
            )
        if (
            self.lease_duration_seconds
            <= self.renew_deadline_seconds + 2 * self.retry_period_seconds
        ):
            raise ValueError(
                f"{ENV_PREFIX}LEADER_ELECTION_LEASE_DURATION_SECONDS: must exceed the renew "
                "deadline plus two retry periods"
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

    images: Images = Images()
    watching: Watching = Watching()
    requeue: Requeue = Requeue()
    build: Build = Build()
    pods: Pods = Pods()
    metrics: Metrics = Metrics()
    api: Api = Api()
    leader_election: LeaderElection = LeaderElection()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then the environment in both forms; no .env or secrets files."""
        return init_settings, Environment(settings_cls)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with `update` validated: pydantic's own copy takes any key silently, so
        a misspelt or ungrouped field (`shadow_poll_seconds` for
        `requeue.shadow_poll_seconds`) would change nothing without a word."""
        if not update:
            return super().model_copy(deep=deep)
        return self.model_validate({**self.model_dump(), **update})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OperatorSettings:
        """The settings from `environ` (default `os.environ`) alone; raises InvalidSettings
        naming the variable on a bad value."""
        environ = os.environ if environ is None else environ
        try:
            return cls(_build_sources=((Environment(cls, environ),), {}))
        except SettingsError as error:  # a group given as JSON that does not parse
            group = re.search(r'field "(\w+)"', str(error))
            variable = f"{ENV_PREFIX}{group.group(1).upper()}" if group else "settings"
            raise InvalidSettings(f"{variable}: not a JSON object ({error})") from None
        except ValidationError as error:
            problems = "; ".join(
                (f"{variable_of(e['loc'], environ)}: " if len(e["loc"]) > 1 else "")  # else a
                + e["msg"].removeprefix("Value error, ")  # rule across fields, naming them
                for e in error.errors(include_url=False)
            )
            raise InvalidSettings(problems) from None


def _flat_names() -> Iterator[tuple[str, tuple[str, str]]]:
    for group, info in OperatorSettings.model_fields.items():
        model = info.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        for field, sub in model.model_fields.items():
            marks = [mark.name for mark in sub.metadata if isinstance(mark, Flat)]
            yield (marks[0] if marks else field.upper()).lower(), (group, field)


FLAT_NAMES: dict[str, tuple[str, str]] = dict(_flat_names())
"""Flat name, lower case (`build_backoff_seconds`) -> (group, field): `KUBEINFER_<FLAT>`."""
_FLAT_OF = {place: flat for flat, place in FLAT_NAMES.items()}


def variable_of(loc: tuple[int | str, ...], environ: Mapping[str, str]) -> str:
    """The variable behind an error's location (group, field, ...): the nested name when
    that is the one set, else the flat one."""
    group, field = str(loc[0]), str(loc[1])
    nested = f"{ENV_PREFIX}{group}{NESTED_DELIMITER}{field}".upper()
    if nested.lower() in {name.lower() for name in environ}:
        return nested
    return f"{ENV_PREFIX}{_FLAT_OF.get((group, field), field)}".upper()


class Environment(EnvSettingsSource):
    """pydantic-settings' environment source, over `os.environ` or a given mapping, that
    also reads every grouped field by its flat name (the nested name wins)."""

    def __init__(
        self, settings_cls: type[BaseSettings], environ: Mapping[str, str] | None = None
    ) -> None:
        self._environ = os.environ if environ is None else environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(
            self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )

    def __call__(self) -> dict[str, Any]:
        values: dict[str, dict[str, Any]] = {}
        for flat, (group, field) in FLAT_NAMES.items():
            value = self.env_vars.get(self.env_prefix.lower() + flat)
            if value is not None:
                values.setdefault(group, {})[field] = value
        for group, nested in super().__call__().items():
            if isinstance(nested, dict):
                values[group] = {**values.get(group, {}), **nested}
            else:
                values[group] = nested
        return values
