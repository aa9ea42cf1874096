"""The operator's own configuration, read once at start from `KUBEINFER_*` variables.

A plain frozen pydantic model rather than pydantic-settings: the operator has a handful of
scalar knobs, and `from_env` keeps the mapping from variable to field explicit and
testable with a dict instead of a patched environment. Every duration carries its unit.
The pure reconcile core receives an instance as an argument; nothing reads the
environment at import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

ENV_PREFIX = "KUBEINFER_"

DEFAULT_RUNTIME_IMAGE = "ghcr.io/kubeinfer/kubeinfer-runtime:0.1.0"
DEFAULT_GPU_RUNTIME_IMAGE = "ghcr.io/kubeinfer/kubeinfer-runtime-gpu:0.1.0"


class InvalidSettings(ValueError):
    """An environment variable the operator cannot use; the message names it."""


class OperatorSettings(BaseModel):
    """Operator-wide defaults and timings (each field maps to `KUBEINFER_<FIELD_NAME>`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtime_image: str = Field(default=DEFAULT_RUNTIME_IMAGE, min_length=1, max_length=512)
    """Image of the runtime pods and engine build Jobs of ONNX Runtime engines when the
    spec names none (the Dockerfile's `runtime` target; both run the `kubeinfer` CLI)."""

    gpu_runtime_image: str = Field(default=DEFAULT_GPU_RUNTIME_IMAGE, min_length=1, max_length=512)
    """The same for TensorRT engines (the Dockerfile's `runtime-gpu` target: TensorRT and
    CUDA are in it, ONNX Runtime's CPU image has neither)."""

    def image_for(self, spec_image: str | None, tensorrt: bool) -> str:
        """The runtime and build image of an object: its own, else the default of its
        backend."""
        return spec_image or (self.gpu_runtime_image if tensorrt else self.runtime_image)

    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Pull policy of the containers the operator creates."""

    field_manager: str = Field(default="kubeinfer", min_length=1, max_length=128)
    """Server-side apply field manager: the operator owns exactly the fields it sets."""

    namespaces: tuple[str, ...] = ()
    """Namespaces to watch (comma-separated in the environment); empty means the whole
    cluster."""

    resync_interval_seconds: float = Field(default=60, gt=0, le=86_400)
    """Period of the timer that reconciles every object even when nothing changed."""

    build_poll_seconds: float = Field(default=10, gt=0, le=3600)
    """How soon to look again while a build Job runs (its pod's termination message is
    not always announced by an event on the Job)."""

    build_backoff_seconds: float = Field(default=30, gt=0, le=86_400)
    """Delay before retrying after the first failed build attempt; doubles per attempt."""

    build_backoff_max_seconds: float = Field(default=1800, gt=0, le=86_400)
    """Longest delay between build attempts."""

    build_backoff_limit: int = Field(default=1, ge=0, le=10)
    """The build Job's own pod retries (Job.spec.backoffLimit) before the attempt fails."""

    build_active_deadline_seconds: int = Field(default=3600, ge=60, le=86_400)
    """Longest one build attempt may run (Job.spec.activeDeadlineSeconds)."""

    build_ttl_seconds_after_finished: int = Field(default=86_400, ge=0, le=31_536_000)
    """How long finished build Jobs are kept before Kubernetes deletes them; the built
    engine's digest is kept on the runtime ConfigMap, so nothing is rebuilt after."""

    pre_stop_sleep_seconds: int = Field(default=5, ge=0, le=300)
    """Pause before SIGTERM reaches a runtime pod, so Service endpoints stop sending it
    traffic before it starts draining."""

    drain_grace_period_seconds: int = Field(default=30, ge=0, le=3600)
    """How long a terminating runtime pod may answer queued and in-flight requests (the
    runtime's drainGracePeriodSeconds); the pod's termination grace period is longer."""

    prometheus_url: str | None = Field(default=None, pattern=r"^https?://.+$", max_length=2048)
    """The Prometheus that shadow verdicts (and the autoscaler) read, when an
    InferenceDeployment names none (spec.monitoring.prometheus.url). Unset: the operator
    reads the runtime pods' /metrics itself."""

    metrics_timeout_seconds: float = Field(default=5, gt=0, le=120)
    """Longest one read of the metrics source may take (a Prometheus query, or one pod's
    /metrics); a slower source counts as unavailable for that pass."""

    shadow_poll_seconds: float = Field(default=15, gt=0, le=3600)
    """How often a running shadow test's aggregates are read and judged."""

    autoscale_poll_seconds: float = Field(default=15, gt=0, le=3600)
    """How often an autoscaled object's signals are read and its count recommended (the
    HorizontalPodAutoscaler's default sync period)."""

    pod_monitors: Literal["auto", "off"] = "auto"
    """`auto`: create a PodMonitor (monitoring.coreos.com/v1) per InferenceDeployment where
    the prometheus-operator's API exists; `off`: never (the pods' prometheus.io annotations
    remain for annotation-based scrape jobs)."""

    pod_monitor_labels: dict[str, str] = Field(default_factory=dict)
    """Labels added to every PodMonitor (`k=v,k=v` in the environment), for a Prometheus
    whose podMonitorSelector asks for them (e.g. `release=kube-prometheus-stack`)."""

    api_timeout_seconds: float = Field(default=30, gt=0, le=600)
    """Longest one request to the API server may take (connecting, sending, reading the
    answer); a request past it fails and is retried like any unanswered one, so a hung
    call never holds an object's reconcile for long."""

    api_page_size: int = Field(default=500, ge=1, le=10_000)
    """Objects per page when the operator lists (`limit`, then `continue`)."""

    leader_election_lease_duration_seconds: float = Field(default=15, ge=1, le=3600)
    """With `--leader-election`: how long a standby waits, after it last saw the Lease
    renewed, before it takes over (client-go's LeaseDuration)."""

    leader_election_renew_deadline_seconds: float = Field(default=10, ge=1, le=3600)
    """How long the leader keeps trying to renew before it stops reconciling and exits
    (client-go's RenewDeadline)."""

    leader_election_retry_period_seconds: float = Field(default=2, ge=1, le=600)
    """How often candidates try to acquire, and the leader to renew (client-go's
    RetryPeriod). Each Lease request may take at most half of it."""

    @model_validator(mode="after")
    def _lease_outlives_a_failed_renewal(self) -> OperatorSettings:
        """The leader must have stopped before a standby may take over: it gives up at most
        a retry period plus the renew deadline plus one more attempt (two requests of half a
        retry period each) after its last renewal, so the lease must last longer than that."""
        duration = self.leader_election_lease_duration_seconds
        deadline = self.leader_election_renew_deadline_seconds
        retry = self.leader_election_retry_period_seconds
        if deadline <= 1.2 * retry:
            raise ValueError(
                f"{ENV_PREFIX}LEADER_ELECTION_RENEW_DEADLINE_SECONDS: must exceed 1.2 "
                f"times {ENV_PREFIX}LEADER_ELECTION_RETRY_PERIOD_SECONDS"
            )
        if duration <= deadline + 2 * retry:
            raise ValueError(
                f"{ENV_PREFIX}LEADER_ELECTION_LEASE_DURATION_SECONDS: must exceed the renew "
                "deadline plus two retry periods"
            )
        return self

    @field_validator("pod_monitor_labels", mode="before")
    @classmethod
    def _split_labels(cls, value: Any) -> Any:
        if isinstance(value, str):
            pairs = [part.strip() for part in value.split(",") if part.strip()]
            if not all("=" in pair for pair in pairs):
                raise ValueError("expected key=value pairs separated by commas")
            return dict(pair.split("=", 1) for pair in pairs)
        return value

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split_namespaces(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @property
    def termination_grace_period_seconds(self) -> int:
        """preStop pause + drain + a margin, so the kubelet never kills a draining pod."""
        return self.pre_stop_sleep_seconds + self.drain_grace_period_seconds + 10

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OperatorSettings:
        """Reads `KUBEINFER_<FIELD>` variables (unset ones keep their defaults); raises
        InvalidSettings naming the variable on a bad value."""
        environ = os.environ if environ is None else environ
        values = {
            name: environ[ENV_PREFIX + name.upper()]
            for name in cls.model_fields
            if ENV_PREFIX + name.upper() in environ
        }
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            problems = "; ".join(
                f"{ENV_PREFIX}{str(detail['loc'][0]).upper()}: {detail['msg']}"
                if detail["loc"]
                else detail["msg"].removeprefix("Value error, ")  # a rule across fields
                for detail in error.errors(include_url=False)
            )
            raise InvalidSettings(problems) from None
