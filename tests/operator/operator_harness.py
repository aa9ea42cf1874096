"""The harness of the operator scenarios: the real kopf operator against the session's real
cluster (kube-apiserver, etcd, kube-controller-manager, kube-scheduler and a kubelet with
containerd and runc, see `cluster_harness`), in a namespace of the test's own.

The `world` fixture (conftest) makes the namespace and the operator's identity there: a
ServiceAccount bound to exactly the Role `kubeinfer rbac` generates (plus leader
election's), so a verb the Role lacks fails the scenario as it would in a cluster.
`start_operator` runs `run_operator` in-process, logged in with that account's token,
with short timings so scenarios take seconds. Nothing is played by hand: the Job
controller, the ReplicaSet controller and the garbage collector are the real ones, and the
kubelet runs build Jobs (`kubeinfer build`) and runtime pods (`kubeinfer serve`) as
containers of the project's runtime image, on real ONNX models (`models`) that reach them
from the cluster's file server (`Model.uri`).

What the operator did is read from the API server's audit log (`World.calls`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
from cluster_harness import ApiCall, Kube, LocalCluster, file_url
from kubeinfer.operator import rbac
from kubeinfer.operator.commands.run import run_operator
from kubeinfer.operator.handlers import configure_kopf
from kubeinfer.operator.kube.leader_election import Election
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.telemetry.exporter import StatusBoard
from waiting import eventually  # the tests import it from here too

IDS = ("kubeinfer.io/v1alpha1", "inferencedeployments")
OPERATOR_ACCOUNT = "kubeinfer-operator"

SCENARIOS_RUN: dict[str, str] = {}
"""Each scenario run this session → its namespace (the `world` fixture records it)."""
ROLE_TAKEN_AWAY: set[str] = set()
"""Namespaces where a scenario took verbs out of the operator's Role on purpose: their
refusals are the point, not a gap in the Role (`test_rbac_used_exactly` leaves them out)."""

WATCHED = {
    "inferencedeployments",
    "jobs",
    "pods",
    "deployments",
    "configmaps",
    "services",
    "persistentvolumeclaims",
    "poddisruptionbudgets",
}

FAST = OperatorSettings(
    requeue={"resync_interval_seconds": 0.5, "build_poll_seconds": 0.5},
    build={"backoff_seconds": 0.5, "backoff_max_seconds": 1},
    pods={"pre_stop_sleep_seconds": 0, "drain_grace_period_seconds": 2},
)


@dataclass(frozen=True)
class Model:
    """A real ONNX model file and its sha256, as a manifest's source names it."""

    path: Path

    @property
    def uri(self) -> str:
        return file_url(self.path)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def manifest(model: Model, name: str = "resnet", version: str = "1", **spec: Any) -> dict[str, Any]:
    """An InferenceDeployment of `model`: fp32 ONNX Runtime, one replica."""
    body: dict[str, Any] = {
        "model": {
            "name": "resnet",
            "version": version,
            "source": {"uri": model.uri},
        },
        "engine": {"backend": "onnxruntime", "precision": "fp32", "maxBatchSize": 8},
        "runtime": {"replicas": 1, "batching": {"maxBatchSize": 8}},
    }
    body["model"]["source"]["sha256"] = model.sha256
    for key, value in spec.items():
        body[key] = {**body.get(key, {}), **value}
    return {
        "apiVersion": IDS[0],
        "kind": "InferenceDeployment",
        "metadata": {"name": name},
        "spec": body,
    }


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item["type"] == type_:
            return item
    return None


@dataclass
class World:
    """A namespace of the real cluster, with the operator's account in it."""

    cluster: LocalCluster
    kube: Kube
    lease_name: str = rbac.DEFAULT_LEASE_NAME
    tokens_issued: list[str] = field(default_factory=list)
    board: StatusBoard = field(default_factory=StatusBoard)
    """The running operator's (`start_operator` gives each run a new one)."""

    def passes_done(self) -> int:
        """Reconcile passes the running operator has ended (a pass may read and write
        nothing at all, so the audit log cannot count them)."""
        return sum(self.board.activity.passes.values())

    @property
    def namespace(self) -> str:
        return self.kube.namespace

    @property
    def operator_user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{OPERATOR_ACCOUNT}"

    def infd(self, name: str = "resnet") -> dict[str, Any] | None:
        return self.kube.get(*IDS, name)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.kube.create(obj)

    def patch_spec(self, spec: dict[str, Any], name: str = "resnet") -> dict[str, Any]:
        return self.kube.patch(*IDS, name, {"spec": spec})

    def children(self, kind_plural: tuple[str, str]) -> list[dict[str, Any]]:
        return self.kube.list(*kind_plural)

    def jobs(self) -> list[dict[str, Any]]:
        return self.children(("batch/v1", "jobs"))

    def pods(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        return self.kube.list("v1", "pods", label_selector)

    def one(self, api_version: str, plural: str) -> dict[str, Any] | None:
        found = self.children((api_version, plural))
        return found[0] if len(found) == 1 else None

    def events(self) -> list[dict[str, Any]]:
        return self.children(("v1", "events"))

    def calls(self) -> list[ApiCall]:
        """Every request the operator made, as the API server's audit log recorded it."""
        return self.kube.calls(user=self.operator_user)

    def writes(self) -> list[ApiCall]:
        return [c for c in self.calls() if c.verb not in ("get", "list", "watch")]

    def token(self) -> str:
        token = self.cluster.service_account_token(self.namespace, OPERATOR_ACCOUNT)
        self.tokens_issued.append(token)
        return token


def grant_operator_role(world: World) -> None:
    """The operator's ServiceAccount, its Role as `kubeinfer rbac` writes it, and leader
    election's Role for the Lease, each bound to the account."""
    kube = world.kube
    kube.create(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": OPERATOR_ACCOUNT}}
    )
    roles = [
        rbac.role_document(OPERATOR_ACCOUNT, world.namespace),
        rbac.lease_role_document(f"{OPERATOR_ACCOUNT}-lease", world.namespace, world.lease_name),
    ]
    grant_node_role(world)
    for role in roles:
        kube.create(role)
        kube.create(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": role["metadata"]["name"]},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": role["metadata"]["name"],
                },
                "subjects": [
                    {
                        "kind": "ServiceAccount",
                        "name": OPERATOR_ACCOUNT,
                        "namespace": world.namespace,
                    }
                ],
            }
        )


def node_role_name(world: World) -> str:
    """The nodes' ClusterRole (and its binding) of one scenario's operator account."""
    return f"{OPERATOR_ACCOUNT}-nodes-{world.namespace}"


def grant_node_role(world: World) -> None:
    """The nodes' ClusterRole as `kubeinfer rbac` writes it (list and watch: mixed GPU
    fleets read the GPU nodes), bound to the account; `revoke_node_role` removes both."""
    name = node_role_name(world)
    world.kube.create(rbac.node_role_document(name))
    world.kube.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": OPERATOR_ACCOUNT, "namespace": world.namespace}
            ],
        }
    )


def revoke_node_role(world: World) -> None:
    admin = world.cluster.admin()
    for plural in ("clusterrolebindings", "clusterroles"):
        admin.delete("rbac.authorization.k8s.io/v1", plural, node_role_name(world), namespace=None)


def kopf_settings() -> kopf.OperatorSettings:
    """The operator's kopf settings, tuned for tests: quick retries and exits."""
    settings = configure_kopf(kopf.OperatorSettings())
    settings.networking.error_backoffs = [0.1, 0.2]
    settings.watching.reconnect_backoff = 0.05
    settings.queueing.idle_timeout = 1.0
    settings.queueing.exit_timeout = 1.0
    settings.background.cancellation_polling = 0.1
    settings.process.ultimate_exiting_timeout = 2.0
    return settings


@contextlib.asynccontextmanager
async def start_operator(
    world: World,
    settings: OperatorSettings = FAST,
    *,
    election: Election | None = None,
    tokens: Callable[[], str | None] | None = None,
    metrics_port: int | None = None,
) -> AsyncIterator[asyncio.Task[None]]:
    """Runs the operator as `kubeinfer operator` does (`run_operator`) until the block
    ends, logged in as its ServiceAccount (a fresh token at each login, or what `tokens`
    returns); with `election`, as a replica that must win the Lease first; with
    `metrics_port`, serving its own metrics there. Yields the
    operator's task (done early when, say, the Lease was lost)."""
    issue = tokens or world.token

    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(
            server=world.cluster.server,
            ca_path=str(world.cluster.ca_file),
            token=issue(),
            default_namespace=world.namespace,
        )

    stop, ready = asyncio.Event(), asyncio.Event()
    since = len(world.calls())
    world.board = StatusBoard()
    task = asyncio.create_task(
        run_operator(
            settings,
            clusterwide=False,
            namespaces=[world.namespace],
            election=election,
            metrics_port=metrics_port,
            login=login,
            kopf_settings=kopf_settings(),
            stop_flag=stop,
            ready_flag=ready,
            board=world.board,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), timeout=20)
        # kopf is ready before its watches are: wait for them, so that what a scenario
        # does next is seen through them, and timings do not include kopf's start.
        if election is None:
            await eventually(
                lambda: WATCHED <= {c.resource for c in world.calls()[since:] if c.verb == "watch"},
                what="kopf's watches",
            )
        yield task
    finally:
        stop.set()
        if not task.done():
            await asyncio.wait_for(task, timeout=20)
