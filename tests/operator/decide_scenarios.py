"""A small in-memory stand-in for the API server, for the pure decision's table tests.

`Cluster` keeps the objects a `Decision` applies, bumps a Deployment's generation when its
spec changes (leaving its status stale until a test marks it rolled out, as the
Deployment controller would), and lets a test play the part of the Job and Deployment
controllers: a build succeeds with a termination message, fails with a reason, or the
runtime pods become ready. Each `reconcile()` is one pass of `decide` over what is stored,
as the gather step would bring it (`as_gathered`): each signal the gather does not read
for those children (`reconcile.reads`) is `Unread`, which fails the test if `decide`
touches it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import kubernetes_validate
from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec, InferenceDeploymentStatus
from kubeinfer.operator.api.v1alpha1.conditions import ConditionType
from kubeinfer.operator.reconcile.decide import decide
from kubeinfer.operator.reconcile.reads import SIGNALS, signals_to_read
from kubeinfer.operator.rollout.shadow import metrics_query
from kubeinfer.operator.settings import Cost, OperatorSettings
from kubeinfer.operator.state import names
from kubeinfer.operator.state.cost_readings import CostHistory, CostReading
from kubeinfer.operator.state.decision import Decision
from kubeinfer.operator.state.observed import KubeObject, ObservedState, OwnerRef
from kubeinfer.operator.state.quality_readings import QualityReading
from kubeinfer.operator.state.scaling_inputs import (
    ScalingHistory,
    ScalingSignals,
    ServingPods,
    WakeSignals,
)
from kubeinfer.operator.state.shadow_readings import ShadowReading

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
SETTINGS = OperatorSettings(build={"backoff_seconds": 30, "backoff_max_seconds": 600})


def tuned(settings: OperatorSettings, **groups: dict[str, Any]) -> OperatorSettings:
    """`settings` with some fields of some groups changed (validated, unlike a plain
    `model_copy`): `tuned(FAST, requeue={"resync_interval_seconds": 3})`."""
    dumped = settings.model_dump()
    return OperatorSettings.model_validate(
        {**dumped, **{group: {**dumped[group], **fields} for group, fields in groups.items()}}
    )


KUBERNETES_VERSION = "1.33"
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


def singletons(owner: str) -> dict[tuple[str, str], str]:
    """(kind, name) of each child of which there is one, and its ObservedState field."""
    return {
        ("PersistentVolumeClaim", names.cache_claim_name(owner)): "pvc",
        ("ConfigMap", names.runtime_name(owner)): "configmap",
        ("Deployment", names.runtime_name(owner)): "deployment",
        ("Service", names.service_name(owner)): "service",
        ("ConfigMap", names.candidate_name(owner)): "candidate_configmap",
        ("Deployment", names.candidate_name(owner)): "candidate_deployment",
        ("Service", names.candidate_name(owner)): "candidate_service",
        ("ConfigMap", names.mirror_name(owner)): "mirror_configmap",
        ("ConfigMap", names.reference_name(owner)): "reference_configmap",
        ("Deployment", names.reference_name(owner)): "reference_deployment",
        ("Service", names.reference_name(owner)): "reference_service",
        ("PodMonitor", names.runtime_name(owner)): "pod_monitor",
        ("PodDisruptionBudget", names.runtime_name(owner)): "disruption_budget",
        ("Service", names.backend_service_name(owner)): "backend_service",
        ("EndpointSlice", names.activator_slice_name(owner)): "activator_slice",
    }


def k8s_time(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def make_spec(**sections: Any) -> InferenceDeploymentSpec:
    """A valid spec: model `mlp` version `1` from https, with `sections` merged in."""
    document: dict[str, Any] = {
        "model": {
            "name": "mlp",
            "version": "1",
            "source": {"uri": "https://models.example.com/mlp.onnx", "sha256": "c" * 64},
        }
    }
    for key, value in sections.items():
        document[key] = {**document.get(key, {}), **value}
    return InferenceDeploymentSpec.model_validate(document)


def validate_kubernetes(obj: KubeObject) -> None:
    """Strict validation against the official schemas: an unknown field fails. Objects
    already found valid are remembered (the scenarios apply many identical ones)."""
    text = json.dumps(obj, sort_keys=True)
    if text not in _VALID:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        _VALID.add(text)


_VALID: set[str] = set()


class Unread:
    """A signal the gather step does not read, where `decide` finds it: any use of it (a
    look at an attribute, a truth test, iterating, comparing) fails the test with the
    signal's name, so a decision that starts to read a signal the gather does not bring
    fails every table test that reaches it."""

    def __init__(self, signal: str) -> None:
        self.signal = signal

    def _read(self, *_: object) -> Any:
        raise AssertionError(
            f"decide read {self.signal!r}, which the gather step does not read for this "
            "observed state: declare it in reconcile.reads.signals_to_read"
        )

    def __getattr__(self, name: str) -> Any:
        self._read()

    __bool__ = __iter__ = __len__ = __contains__ = __getitem__ = _read
    __eq__ = __lt__ = __le__ = __gt__ = __ge__ = __add__ = __radd__ = _read  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Unread({self.signal!r})"


def as_gathered(observed: ObservedState, now: datetime) -> ObservedState:
    """`observed` as the gather step brings it: each signal it does not read for these
    children (`signals_to_read`) replaced by `Unread`."""
    wanted = signals_to_read(observed, now.replace(microsecond=0))
    unread = {
        field: Unread(field)
        for signal, fields in SIGNALS.items()
        if not getattr(wanted, signal)
        for field in fields
    }
    return replace(observed, **unread)


class Cluster:
    """One InferenceDeployment and its children, as the API server would store them."""

    def __init__(self, spec: InferenceDeploymentSpec, name: str = "demo", namespace: str = "ns"):
        self.name, self.namespace, self.uid = name, namespace, "0f0e0d0c-uid"
        self.spec, self.generation = spec, 1
        self.status = InferenceDeploymentStatus()
        self.objects: dict[tuple[str, str], KubeObject] = {}
        self.pods: list[KubeObject] = []
        self.writes = 0
        self.annotations: dict[str, str] = {}
        self.reading: ShadowReading | None = None
        """What the metrics source answers in the next passes (None: nothing read)."""
        self.signals: ScalingSignals | None = None
        self.serving_pods: ServingPods | None = None
        """The load and the pods the gather step reads for an autoscaled object."""
        self.history = ScalingHistory()
        """The autoscaler's memory, kept between passes as the reconciler keeps it."""
        self.wake: WakeSignals | None = None
        """What the gather step reads for an object with minReplicas 0."""
        self.service_slices: list[KubeObject] = []
        """The EndpointSlice controller's slices of the object's Service."""
        self.pod_monitors = False
        self.runtime_pods: list[KubeObject] = []
        self.candidate_pods: list[KubeObject] = []
        self.quality: QualityReading | None = None
        """The quality watch's window the gather step reads in the next passes."""
        self.cost_settings: Cost | None = None
        self.cost: CostReading | None = None
        self.cost_history = CostHistory()
        """The prices the gather is handed (None: none set), the inferences it reads when
        the cost is due, and the pods of the cost's window it returns."""
        """The serving and candidate pods the gather step lists (see `runtime_pod`)."""

    # -- the object itself --------------------------------------------------------------
    def update_spec(self, spec: InferenceDeploymentSpec) -> None:
        self.spec, self.generation = spec, self.generation + 1

    def condition(self, type_: ConditionType) -> Any:
        return next(c for c in self.status.conditions if c.type == type_)

    # -- one pass -------------------------------------------------------------------------
    def observe(self) -> ObservedState:
        slots = singletons(self.name)
        singles: dict[str, KubeObject | None] = {field: None for field in slots.values()}
        for key, obj in self.objects.items():
            if key in slots:
                singles[slots[key]] = copy.deepcopy(obj)
        return ObservedState(
            owner=OwnerRef(self.name, self.namespace, self.uid, self.generation),
            spec=self.spec,
            status=self.status,
            jobs=tuple(
                copy.deepcopy(o) for (k, _), o in sorted(self.objects.items()) if k == "Job"
            ),
            job_pods=tuple(copy.deepcopy(self.pods)),
            annotations=dict(self.annotations),
            shadow=self.reading if metrics_query(self.status.candidate) else None,
            scaling_signals=self.signals,
            serving_pods=self.serving_pods,
            scaling_history=self.history,
            wake_signals=self.wake,
            service_slices=tuple(self.service_slices),
            pod_monitors_available=self.pod_monitors,
            runtime_pods=tuple(copy.deepcopy(self.runtime_pods)),
            candidate_pods=tuple(copy.deepcopy(self.candidate_pods)),
            quality=self.quality,
            cost_settings=self.cost_settings,
            cost=self.cost,
            cost_history=self.cost_history,
            **singles,
        )

    def reconcile(self, now: datetime = T0, settings: OperatorSettings = SETTINGS) -> Decision:
        decision = decide(as_gathered(self.observe(), now), settings, now)
        self.history = decision.scaling_history or ScalingHistory()
        for child in decision.apply:
            if child["kind"] == "PodMonitor":
                from podmonitor_schema import validate_podmonitor  # node, only where needed

                validate_podmonitor(child)
            else:
                validate_kubernetes(child)
            self._store(child)
        for kind, name in decision.delete:
            self.objects.pop((kind, name), None)
        if decision.status != self.status:
            self.writes += 1
            # What the API server returns: the status round-tripped through JSON.
            wire = decision.status.model_dump(mode="json", by_alias=True, exclude_none=True)
            self.status = InferenceDeploymentStatus.model_validate(wire)
        self.writes += len(decision.apply) + len(decision.delete)
        return decision

    def _store(self, child: KubeObject) -> None:
        key = (child["kind"], child["metadata"]["name"])
        new = copy.deepcopy(child)
        old = self.objects.get(key)
        if child["kind"] == "Deployment":
            generation = (old or {}).get("metadata", {}).get("generation", 0)
            if old is None or old["spec"] != new["spec"]:
                generation += 1
            new["metadata"]["generation"] = generation
            new["status"] = copy.deepcopy((old or {}).get("status", {}))
        elif old is not None and "status" in old:
            new["status"] = old["status"]
        self.objects[key] = new

    # -- playing the controllers ----------------------------------------------------------
    def get(self, kind: str, name: str | None = None) -> KubeObject:
        """The child of that kind and name; without a name, the serving runtime's (the
        claim, the runtime ConfigMap and Deployment, the serving Service)."""
        if name is None:
            name = next(
                (
                    n
                    for (k, n), f in singletons(self.name).items()
                    if k == kind and f in ("pvc", "configmap", "deployment", "service")
                )
            )
        matches = [o for (k, n), o in self.objects.items() if k == kind and n == name]
        assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
        return matches[0]

    def has(self, kind: str, name: str) -> bool:
        return (kind, name) in self.objects

    def jobs(self) -> list[KubeObject]:
        return [o for (k, _), o in sorted(self.objects.items()) if k == "Job"]

    def delete(self, kind: str, name: str) -> None:
        del self.objects[(kind, name)]

    def _pod(self, job: KubeObject, terminated: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        self.pods.append(
            {
                "metadata": {
                    "name": f"{name}-x7k2p",
                    "labels": {"batch.kubernetes.io/job-name": name},
                },
                "status": {
                    "containerStatuses": [{"name": "build", "state": {"terminated": terminated}}]
                },
            }
        )

    def succeed_job(self, name: str, message: str, at: datetime = T0) -> None:
        job = self.objects[("Job", name)]
        job["status"] = {
            "succeeded": 1,
            "completionTime": k8s_time(at),
            "conditions": [
                {"type": "Complete", "status": "True", "lastTransitionTime": k8s_time(at)}
            ],
        }
        self._pod(job, {"exitCode": 0, "reason": "Completed", "message": message})

    def fail_job(self, name: str, reason: str, message: str, log: str, at: datetime = T0) -> None:
        job = self.objects[("Job", name)]
        job["status"] = {
            "failed": 2,
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": k8s_time(at),
                }
            ],
        }
        self._pod(job, {"exitCode": 1, "reason": "Error", "message": log})

    def roll_out(self, ready: int | None = None, name: str | None = None) -> None:
        """The Deployment controller finished: every desired pod updated and ready (the
        serving Deployment's, or the one named)."""
        deployment = self.get("Deployment", name)
        replicas = deployment["spec"]["replicas"]
        ready = replicas if ready is None else ready
        deployment["status"] = {
            "observedGeneration": deployment["metadata"]["generation"],
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "conditions": [
                {"type": "Available", "status": "True" if ready >= replicas else "False"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
            ],
        }

    def build_to_ready(self, digest: str = DIGEST_A, now: datetime = T0) -> None:
        """Drives a fresh object to Ready: build, succeed, roll out."""
        self.reconcile(now)
        (job,) = [j for j in self.jobs() if "status" not in j]
        self.succeed_job(job["metadata"]["name"], digest, at=now + timedelta(seconds=60))
        self.reconcile(now + timedelta(seconds=61))
        self.roll_out()
        self.reconcile(now + timedelta(seconds=90))

    def runtime_pod(
        self, suffix: str, container_status: dict[str, Any], name: str | None = None
    ) -> KubeObject:
        """A pod of the serving Deployment (or the one named) as the kubelet reports it:
        the template's labels and annotations, and the runtime container's status."""
        template = self.get("Deployment", name)["spec"]["template"]
        deployment = name or names.runtime_name(self.name)
        return {
            "metadata": {
                "name": f"{deployment}-{suffix}",
                "labels": dict(template["metadata"]["labels"]),
                "annotations": dict(template["metadata"]["annotations"]),
            },
            "status": {"containerStatuses": [{"name": "runtime", **container_status}]},
        }
