"""Scale to zero through the pure decision, pass by pass (`decide_scenarios.Cluster`): an
idle object with minReplicas 0 goes to zero pods only with the activator routing it; the
pass that takes it there writes the backend Service and the activator's EndpointSlice
before its Service stops selecting pods, and the Deployment last; Ready stays True and
ScaledToZero says why; a held request wakes one pod at once while the Service keeps the
activator; a ready pod gets the Service selecting pods again, and the activator's slice
goes one pass later; minReplicas above 0 removes the backend Service and the slice; the
route the activator needs is in every decision."""

from __future__ import annotations

from datetime import timedelta

from decide_scenarios import T0, Cluster, make_spec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType, Reason
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state import names
from kubeinfer.operator.state.scaling_inputs import ScalingSignals, ServingPods, WakeSignals

ACTIVATORS = ("10.0.9.2", "10.0.9.1")
SCALING = {"enabled": True, "minReplicas": 0, "maxReplicas": 4, "scaleToZeroAfterSeconds": 60}


def at_zero_ready(cluster: Cluster) -> None:
    cluster.build_to_ready()


def quiet(cluster: Cluster, ready: int, answered: float = 7.0, routing: bool = True) -> None:
    cluster.signals = ScalingSignals(requests_in_progress_per_replica=0.0, p99_seconds=0.01)
    replicas = cluster.get("Deployment")["spec"]["replicas"]
    cluster.serving_pods = ServingPods(desired=replicas, ready=ready, starting=0)
    cluster.wake = WakeSignals(
        requests_answered=answered,
        held_requests=0,
        activator_routing=routing,
        activator_addresses=ACTIVATORS if routing else (),
        activator_message="" if routing else "no activator pod is ready",
    )


def scaled_cluster(**scaling) -> Cluster:
    cluster = Cluster(make_spec(autoscaling={**SCALING, **scaling}, runtime={"grpcPort": 8001}))
    cluster.build_to_ready()
    return cluster


def selector(cluster: Cluster) -> dict | None:
    return cluster.get("Service", names.service_name(cluster.name))["spec"].get("selector")


def test_an_idle_object_goes_to_zero_through_the_activator_in_order():
    cluster = scaled_cluster()
    assert cluster.get("Deployment")["spec"]["replicas"] == 1, "a new object starts serving"
    quiet(cluster, ready=1)
    cluster.reconcile(T0 + timedelta(seconds=100))  # the idle window starts
    labels = {
        names.LABEL_SERVICE_NAME: cluster.name,
        names.LABEL_SLICE_MANAGED_BY: names.SLICE_CONTROLLER,
    }
    controllers = {"metadata": {"name": "demo-x7k2p", "labels": labels}}
    cluster.service_slices = [controllers]
    decision = cluster.reconcile(T0 + timedelta(seconds=161))
    assert ("EndpointSlice", "demo-x7k2p") in decision.delete, "the controller's stale slice"
    kinds = [(c["kind"], c["metadata"]["name"]) for c in decision.apply]
    slice_name = names.activator_slice_name(cluster.name)
    assert kinds.index(("EndpointSlice", slice_name)) < kinds.index(("Service", cluster.name))
    assert kinds.index(("Service", cluster.name)) < kinds.index(
        ("Deployment", names.runtime_name(cluster.name))
    )
    assert cluster.get("Deployment")["spec"]["replicas"] == 0
    assert selector(cluster) is None
    endpoints = cluster.get("EndpointSlice", slice_name)
    assert [e["addresses"][0] for e in endpoints["endpoints"]] == sorted(ACTIVATORS)
    assert endpoints["metadata"]["labels"]["kubernetes.io/service-name"] == cluster.name
    assert {p["name"]: p["port"] for p in endpoints["ports"]} == {
        "http": 8000,
        "metrics": 8000,
        "grpc": 8001,
    }
    backend = cluster.get("Service", names.backend_service_name(cluster.name))
    assert backend["spec"]["selector"] == names.serving_selector(cluster.name)
    # Listed before ready: the activator asks each pod itself, not kube-proxy's rules.
    assert backend["spec"]["publishNotReadyAddresses"] is True
    zero = cluster.condition(ConditionType.SCALED_TO_ZERO)
    assert (zero.status, zero.reason) == (ConditionStatus.TRUE, Reason.IDLE)
    leaving = cluster.get("Deployment")
    leaving["status"] = {
        **leaving["status"],
        "observedGeneration": leaving["metadata"]["generation"],
    }
    cluster.reconcile(T0 + timedelta(seconds=165))  # its pod still leaving: Ready stays True
    ready = cluster.condition(ConditionType.READY)
    assert ready.status == ConditionStatus.TRUE, ready.message
    cluster.roll_out()  # the Deployment controller: zero pods, none ready
    quiet(cluster, ready=0)
    cluster.reconcile(T0 + timedelta(seconds=170))
    for kind in (ConditionType.READY, ConditionType.AVAILABLE):
        condition = cluster.condition(kind)
        assert condition.status == ConditionStatus.TRUE, condition.message
    assert cluster.status.ready == "0/0"
    assert decision.activator_route == {
        "namespace": cluster.namespace,
        "service": cluster.name,
        "models": ["mlp"],
        "backendHost": f"{names.backend_service_name(cluster.name)}.{cluster.namespace}.svc",
        "httpPort": 8000,
        "grpcPort": 8001,
    }


def test_without_the_activator_the_pods_stay_and_the_condition_says_why():
    cluster = scaled_cluster()
    quiet(cluster, ready=1, routing=False)
    cluster.reconcile(T0 + timedelta(seconds=100))
    cluster.reconcile(T0 + timedelta(seconds=400))
    assert cluster.get("Deployment")["spec"]["replicas"] == 1
    assert selector(cluster) == names.serving_selector(cluster.name)
    zero = cluster.condition(ConditionType.SCALED_TO_ZERO)
    assert zero.reason == Reason.ACTIVATOR_NOT_ROUTING
    assert "no activator pod is ready" in zero.message


def test_a_held_request_wakes_a_pod_and_the_activator_leaves_the_path_once_it_is_ready():
    cluster = scaled_cluster()
    quiet(cluster, ready=1)
    cluster.reconcile(T0 + timedelta(seconds=100))
    cluster.reconcile(T0 + timedelta(seconds=161))
    assert cluster.get("Deployment")["spec"]["replicas"] == 0
    quiet(cluster, ready=0)
    cluster.wake = WakeSignals(
        held_requests=5, activator_routing=True, activator_addresses=ACTIVATORS
    )
    decision = cluster.reconcile(T0 + timedelta(seconds=500))
    assert cluster.get("Deployment")["spec"]["replicas"] == 1
    assert any(e.reason == Reason.SCALED_UP and "0 to 1" in e.message for e in decision.events)
    assert selector(cluster) is None, "the activator holds the traffic while the pod starts"
    slice_name = names.activator_slice_name(cluster.name)
    assert ("EndpointSlice", slice_name) not in decision.delete
    # The pod is ready: the Service selects pods again, both slices serve for a pass.
    cluster.roll_out()
    quiet(cluster, ready=1, answered=5.0)
    decision = cluster.reconcile(T0 + timedelta(seconds=510))
    assert selector(cluster) == names.serving_selector(cluster.name)
    assert ("EndpointSlice", slice_name) not in decision.delete
    decision = cluster.reconcile(T0 + timedelta(seconds=511))
    assert ("EndpointSlice", slice_name) in decision.delete
    zero = cluster.condition(ConditionType.SCALED_TO_ZERO)
    assert (zero.status, zero.reason) == (ConditionStatus.FALSE, Reason.RECENTLY_ACTIVE)


def test_min_replicas_above_zero_removes_the_activator_children_and_the_route():
    cluster = scaled_cluster()
    quiet(cluster, ready=1)
    cluster.reconcile(T0 + timedelta(seconds=100))
    cluster.reconcile(T0 + timedelta(seconds=161))
    cluster.update_spec(
        make_spec(autoscaling={**SCALING, "minReplicas": 1}, runtime={"grpcPort": 8001})
    )
    decision = cluster.reconcile(T0 + timedelta(seconds=200), OperatorSettings())
    assert ("Service", names.backend_service_name(cluster.name)) in decision.delete
    assert ("EndpointSlice", names.activator_slice_name(cluster.name)) in decision.delete
    assert decision.activator_route is None
    assert cluster.get("Deployment")["spec"]["replicas"] == 1
    assert selector(cluster) == names.serving_selector(cluster.name)
