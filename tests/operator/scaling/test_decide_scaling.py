"""Autoscaling and scrape wiring through the pure decision, pass by pass
(`decide_scenarios.Cluster`; the load and the pods are what the gather step would read):
the recommender's count becomes the Deployment's replicas, the status and the Events say
why, `runtime.replicas` is said to be unused while autoscaling is on, missing metrics hold
the count, turning autoscaling off hands the count back to `runtime.replicas`; and the
PodMonitor replaces the scrape annotations where the cluster serves PodMonitors."""

from __future__ import annotations

from datetime import timedelta

from decide_scenarios import DIGEST_A, SETTINGS, T0, Cluster, make_spec, tuned
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType, Reason
from kubeinfer.operator.state.scaling_inputs import ScalingSignals, ServingPods

SCALING = {
    "enabled": True,
    "minReplicas": 1,
    "maxReplicas": 6,
    "targetRequestsInProgressPerReplica": 4,
}


def autoscaled(**scaling) -> Cluster:
    cluster = Cluster(make_spec(autoscaling={**SCALING, **scaling}, runtime={"replicas": 1}))
    cluster.build_to_ready()
    return cluster


def replicas(cluster: Cluster) -> int:
    return cluster.get("Deployment")["spec"]["replicas"]


def load(cluster: Cluster, depth: float | None, ready: int, error: str = "") -> None:
    cluster.signals = ScalingSignals(
        requests_in_progress_per_replica=depth, p99_seconds=0.012, error=error
    )
    cluster.serving_pods = ServingPods(
        desired=replicas(cluster), ready=ready, starting=0, startup_seconds=20.0
    )


def test_the_queue_depth_sets_the_deployment_replicas_and_the_status_says_why():
    cluster = autoscaled()
    assert replicas(cluster) == 1
    load(cluster, depth=12, ready=1)
    decision = cluster.reconcile(T0 + timedelta(minutes=5))
    assert replicas(cluster) == 3, "ceil(1 x 12 / 4)"
    status = cluster.status
    assert status.replicas == 3 and status.autoscaling.desired_replicas == 3
    assert status.autoscaling.last_scale_time == T0 + timedelta(minutes=5)
    assert status.autoscaling.pod_startup_seconds == 20.0
    assert status.metrics.requests_in_progress_per_replica == 12
    assert status.metrics.p99_milliseconds == 12.0
    active = cluster.condition(ConditionType.SCALING_ACTIVE)
    assert (active.status, active.reason) == (ConditionStatus.TRUE, Reason.VALID_METRIC_FOUND)
    (event,) = [e for e in decision.events if e.reason == Reason.SCALED_UP]
    assert "from 1 to 3 pods" in event.message and "12" in event.message
    # the same pass's condition transitions are announced beside the scale event
    announced = {(e.reason, e.message.split(" is ")[0]) for e in decision.events}
    assert {(Reason.VALID_METRIC_FOUND, "ScalingActive"), ("RollingOut", "Ready")} <= announced
    assert decision.requeue_after_seconds is not None


def test_kubectl_scale_is_said_to_be_unused_while_autoscaling_is_on():
    cluster = autoscaled()
    load(cluster, depth=12, ready=1)
    cluster.reconcile(T0 + timedelta(minutes=5))
    active = cluster.condition(ConditionType.SCALING_ACTIVE)
    assert "runtime.replicas (1" in active.message and "not used" in active.message
    assert replicas(cluster) == 3


def test_missing_metrics_hold_the_count_and_say_why():
    cluster = autoscaled()
    load(cluster, depth=12, ready=1)
    cluster.reconcile(T0 + timedelta(minutes=5))
    load(cluster, depth=None, ready=3, error="Prometheus at http://p:9090: cannot connect")
    for minutes in (6, 20, 60):
        cluster.reconcile(T0 + timedelta(minutes=minutes))
        assert replicas(cluster) == 3
    active = cluster.condition(ConditionType.SCALING_ACTIVE)
    assert (active.status, active.reason) == (ConditionStatus.FALSE, Reason.METRICS_UNAVAILABLE)
    assert "cannot connect" in active.message
    assert cluster.status.metrics.requests_in_progress_per_replica == 12, (
        "the last figures are kept"
    )
    load(cluster, depth=0, ready=3)
    cluster.reconcile(T0 + timedelta(minutes=61))
    assert cluster.condition(ConditionType.SCALING_ACTIVE).status == ConditionStatus.TRUE


def test_autoscaling_off_hands_the_count_back_to_runtime_replicas():
    cluster = autoscaled()
    load(cluster, depth=12, ready=1)
    cluster.reconcile(T0 + timedelta(minutes=5))
    cluster.update_spec(make_spec(runtime={"replicas": 2}))
    cluster.reconcile(T0 + timedelta(minutes=6))
    assert replicas(cluster) == 2
    types = {c.type for c in cluster.status.conditions}
    assert not types & {ConditionType.SCALING_ACTIVE, ConditionType.SCALING_LIMITED}
    assert cluster.status.autoscaling is None


def test_a_pod_monitor_replaces_the_scrape_annotations_where_the_cluster_serves_them():
    cluster = Cluster(make_spec())
    cluster.build_to_ready()
    annotations = cluster.get("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert not cluster.has("PodMonitor", "demo-runtime")

    cluster.pod_monitors = True
    cluster.reconcile(T0 + timedelta(minutes=5))
    monitor = cluster.get("PodMonitor", "demo-runtime")  # validated against its schema
    template = cluster.get("Deployment")["spec"]["template"]["metadata"]
    assert not [k for k in template["annotations"] if k.startswith("prometheus.io/")]
    assert monitor["spec"]["selector"]["matchLabels"] == cluster.get("Service")["spec"]["selector"]
    # it scrapes the runtime container's named port at the path the runtime serves metrics on
    # (the schema leaves every field of an endpoint optional, so it cannot tell)
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (container,) = cluster.get("Deployment")["spec"]["template"]["spec"]["containers"]
    (port,) = [p for p in container["ports"] if p["name"] == endpoint["port"]]
    assert str(port["containerPort"]) == "8000" == annotations["prometheus.io/port"]
    assert endpoint["path"] == "/metrics" == annotations["prometheus.io/path"]
    assert endpoint["interval"] == "15s"
    # once stored, the PodMonitor is seen as it is and not written again
    assert cluster.reconcile(T0 + timedelta(minutes=6)).apply == ()


def test_the_pod_monitor_carries_the_labels_a_prometheus_selects_on():
    settings = tuned(SETTINGS, metrics={"pod_monitor_labels": {"release": "kps"}})
    cluster = Cluster(make_spec())
    cluster.pod_monitors = True
    cluster.reconcile(T0, settings)
    (job,) = cluster.jobs()
    cluster.succeed_job(job["metadata"]["name"], DIGEST_A)
    cluster.reconcile(T0 + timedelta(seconds=1), settings)
    labels = cluster.get("PodMonitor", "demo-runtime")["metadata"]["labels"]
    assert labels["release"] == "kps" and labels["app.kubernetes.io/instance"] == "demo"


def test_the_autoscalers_memory_carries_from_pass_to_pass():
    """The stabilization window and the last scale time live between passes: after a
    scale-up, a quiet minute does not bring the count down (the 5-minute window holds it),
    and a pass that changes nothing keeps lastScaleTime."""
    cluster = autoscaled()
    load(cluster, depth=12, ready=1)
    cluster.reconcile(T0 + timedelta(minutes=5))
    assert replicas(cluster) == 3
    load(cluster, depth=0, ready=3)
    cluster.reconcile(T0 + timedelta(minutes=6))
    assert replicas(cluster) == 3, "held by scaleDownStabilizationSeconds"
    assert cluster.status.autoscaling.last_scale_time == T0 + timedelta(minutes=5)
    # once the window has seen only low recommendations, the count comes down (a memory
    # lost between passes would restart the window each time and hold it for ever)
    for minute in range(7, 13):
        load(cluster, depth=0, ready=replicas(cluster))
        cluster.reconcile(T0 + timedelta(minutes=minute))
    assert replicas(cluster) == 1
