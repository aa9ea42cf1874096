"""Status and events of the pure decision: an unchanged object yields an identical
decision with no writes, lastTransitionTime survives passes that change nothing, every
condition carries observedGeneration, one Event per transition, the scale subresource's
fields, an invalid spec, a deleted child, a stalled rollout, and the autoscaling seam.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from decide_scenarios import DIGEST_A, DIGEST_B, SETTINGS, T0, Cluster, make_spec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType, Reason
from kubeinfer.operator.api.v1alpha1.inference_deployment import Phase
from kubeinfer.operator.api.v1alpha1.validation import InvalidManifest, parse_spec
from kubeinfer.operator.reconcile.decide import decide, decide_invalid
from kubeinfer.operator.state import names
from kubeinfer.operator.state.observed import OwnerRef

READY, DEGRADED = ConditionType.READY, ConditionType.DEGRADED
TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE


@pytest.mark.parametrize(
    "stage",
    ["building", "deploying", "ready", "build failed"],
)
def test_unchanged_inputs_give_an_identical_decision_and_no_writes(stage):
    cluster = Cluster(make_spec())
    if stage == "building":
        cluster.reconcile()
    elif stage == "deploying":
        cluster.reconcile()
        cluster.succeed_job(cluster.jobs()[0]["metadata"]["name"], DIGEST_A)
        cluster.reconcile(T0 + timedelta(seconds=1))
    elif stage == "ready":
        cluster.build_to_ready()
    else:
        cluster.reconcile()
        cluster.fail_job(
            cluster.jobs()[0]["metadata"]["name"], "BackoffLimitExceeded", "limit", "boom"
        )
        cluster.reconcile(T0 + timedelta(seconds=1))
    # One pass that observes the children the last one created (their status is news).
    cluster.reconcile(T0 + timedelta(seconds=2))
    later = T0 + timedelta(seconds=5)
    first = decide(cluster.observe(), SETTINGS, later)
    writes = cluster.writes
    second = cluster.reconcile(later + timedelta(seconds=3))
    assert first == decide(cluster.observe(), SETTINGS, later)
    assert second.apply == () and second.delete == () and second.events == ()
    assert second.status == cluster.status
    assert cluster.writes == writes


def test_last_transition_time_is_kept_while_a_condition_does_not_change():
    cluster = Cluster(make_spec())
    cluster.reconcile(T0)
    building = {c.type: c.last_transition_time for c in cluster.status.conditions}
    cluster.reconcile(T0 + timedelta(minutes=3))
    assert {c.type: c.last_transition_time for c in cluster.status.conditions} == building
    cluster.succeed_job(cluster.jobs()[0]["metadata"]["name"], DIGEST_A)
    cluster.reconcile(T0 + timedelta(minutes=4))
    after = {c.type: c.last_transition_time for c in cluster.status.conditions}
    assert after[ConditionType.ENGINE_READY] == T0 + timedelta(minutes=4)  # False -> True
    assert after[READY] == building[READY]  # still False
    assert after[DEGRADED] == building[DEGRADED]


def test_every_condition_carries_the_observed_generation():
    cluster = Cluster(make_spec())
    cluster.build_to_ready()
    cluster.update_spec(make_spec(runtime={"replicas": 2}))
    cluster.reconcile(T0 + timedelta(minutes=10))
    assert cluster.status.observed_generation == 2
    assert {c.observed_generation for c in cluster.status.conditions} == {2}
    assert {c.type for c in cluster.status.conditions} == {
        READY,
        ConditionType.ENGINE_READY,
        ConditionType.AVAILABLE,
        ConditionType.PROGRESSING,
        DEGRADED,
        ConditionType.RECONCILING,
        ConditionType.STALLED,
        ConditionType.CACHE_ATTACH_RISK,  # 2 replicas on the default ReadWriteOnce claim
    }


def kstatus(cluster: Cluster) -> tuple[str, str]:
    """(Reconciling, Stalled): what kstatus, and so a Flux health check, reads."""
    return (
        cluster.condition(ConditionType.RECONCILING).status,
        cluster.condition(ConditionType.STALLED).status,
    )


def test_kstatus_sees_in_progress_until_ready_and_failed_on_a_failed_build():
    cluster = Cluster(make_spec())
    cluster.reconcile()
    assert kstatus(cluster) == (TRUE, FALSE)  # building
    cluster.succeed_job(cluster.jobs()[0]["metadata"]["name"], DIGEST_A)
    cluster.reconcile(T0 + timedelta(seconds=1))
    assert kstatus(cluster) == (TRUE, FALSE)  # rolling out
    cluster.roll_out()
    cluster.reconcile(T0 + timedelta(seconds=2))
    assert kstatus(cluster) == (FALSE, FALSE)  # current
    cluster.update_spec(make_spec(engine={"precision": "fp16"}))
    cluster.reconcile(T0 + timedelta(seconds=3))
    (job,) = [j for j in cluster.jobs() if "status" not in j]
    cluster.fail_job(job["metadata"]["name"], "BackoffLimitExceeded", "limit", "boom")
    cluster.reconcile(T0 + timedelta(seconds=4))
    assert kstatus(cluster) == (FALSE, TRUE)  # failed
    assert cluster.condition(ConditionType.STALLED).reason == Reason.ENGINE_BUILD_FAILED


def test_an_event_is_emitted_on_every_transition_and_only_then():
    cluster = Cluster(make_spec())
    created = cluster.reconcile(T0)
    (building,) = created.events  # one reason, one Event: not being degraded, or not yet
    assert (building.type, building.reason) == ("Normal", Reason.ENGINE_BUILDING)  # available,
    assert building.message.startswith(  # on creation is no news
        "Ready is False, EngineReady is False, Progressing is True: Job demo-build-"
    )
    cluster.succeed_job(cluster.jobs()[0]["metadata"]["name"], DIGEST_A)
    built = cluster.reconcile(T0 + timedelta(seconds=1))
    assert ("Normal", Reason.ENGINE_BUILT) in {(e.type, e.reason) for e in built.events}
    assert cluster.reconcile(T0 + timedelta(seconds=2)).events == ()
    cluster.roll_out()
    ready = cluster.reconcile(T0 + timedelta(seconds=3))
    assert [e.message for e in ready.events if e.reason == Reason.READY] == [
        f"Ready is True: Version 1 (engine {DIGEST_A}) serves on 1 of 1 pods."
    ]


def test_the_scale_subresource_fields_follow_the_runtime():
    cluster = Cluster(make_spec(runtime={"replicas": 4}))
    cluster.build_to_ready()
    status = cluster.status
    assert (status.replicas, status.ready_replicas, status.ready) == (4, 4, "4/4")
    selector = dict(pair.split("=") for pair in status.selector.split(","))
    pod_labels = cluster.get("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert (selector[names.LABEL_INSTANCE], selector[names.LABEL_ROLE]) == (
        cluster.name, names.ROLE_SERVING,
    )  # fmt: skip
    build_pod_labels = cluster.jobs()[0]["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= build_pod_labels.items()


def test_an_invalid_spec_sets_degraded_with_the_validation_message_and_touches_nothing():
    cluster = Cluster(make_spec())
    cluster.build_to_ready()
    with pytest.raises(InvalidManifest) as invalid:
        parse_spec(
            {
                "model": {"name": "mlp", "version": "1", "source": {"uri": "https://x/m.onnx"}},
                "engine": {"precision": "int8"},
            }
        )
    owner = OwnerRef("demo", "ns", "uid", 2)
    # `now` with a fraction of a second: Kubernetes keeps condition times to the second
    now = T0 + timedelta(hours=1, microseconds=250_000)
    decision = decide_invalid(owner, cluster.status, invalid.value, now)
    assert (decision.apply, decision.delete, decision.requeue_after_seconds) == ((), (), None)
    conditions = {c.type: c for c in decision.status.conditions}
    assert (conditions[DEGRADED].status, conditions[DEGRADED].reason) == (TRUE, Reason.INVALID_SPEC)
    assert "precision int8 needs calibration data" in conditions[DEGRADED].message
    assert "spec.engine.calibration" in conditions[DEGRADED].message
    assert (conditions[READY].status, conditions[READY].reason) == (FALSE, Reason.INVALID_SPEC)
    stalled = conditions[ConditionType.STALLED]
    assert (stalled.status, stalled.reason) == (TRUE, Reason.INVALID_SPEC)
    assert conditions[ConditionType.RECONCILING].status == FALSE
    assert conditions[DEGRADED].observed_generation == 2
    assert conditions[DEGRADED].last_transition_time == T0 + timedelta(hours=1)
    assert decision.status.observed_generation == 2  # what `kubectl wait` compares
    assert decision.status.phase == Phase.FAILED
    assert decision.status.serving == cluster.status.serving
    (refused,) = decision.events  # Degraded and Ready, for one reason
    assert (refused.type, refused.reason) == ("Warning", Reason.INVALID_SPEC)
    assert refused.message.startswith("Ready is False, Degraded is True: spec.engine.calibration")
    # Deciding again on the stored result changes nothing: no status write, no event loop.
    again = decide_invalid(owner, decision.status, invalid.value, T0 + timedelta(hours=2))
    assert again.status == decision.status and again.events == ()


def test_a_deleted_child_is_recreated_identically():
    cluster = Cluster(make_spec())
    cluster.build_to_ready()
    for kind in ("Service", "ConfigMap", "Deployment"):
        before = cluster.get(kind)
        cluster.delete(kind, before["metadata"]["name"])
        decision = cluster.reconcile(T0 + timedelta(minutes=5))
        assert [o["kind"] for o in decision.apply] == [kind]
        recreated = cluster.get(kind)
        assert recreated["metadata"]["annotations"] == before["metadata"]["annotations"]
        assert recreated.get("spec", recreated.get("data")) == before.get(
            "spec", before.get("data")
        )


def test_a_stalled_rollout_is_degraded():
    cluster = Cluster(make_spec(runtime={"replicas": 2}))
    cluster.build_to_ready()
    deployment = cluster.get("Deployment")
    deployment["status"]["readyReplicas"] = 1
    deployment["status"]["conditions"] = [
        {"type": "Available", "status": "True"},
        {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": 'ReplicaSet "demo-runtime-5d9" has timed out progressing.',
        },
    ]
    decision = cluster.reconcile(T0 + timedelta(minutes=20))
    assert cluster.condition(DEGRADED).reason == Reason.ROLLOUT_STALLED
    assert "timed out progressing" in cluster.condition(DEGRADED).message
    assert cluster.condition(READY).status == FALSE
    assert cluster.status.phase == Phase.DEGRADED
    assert any(e.type == "Warning" for e in decision.events)


def test_a_batching_change_rolls_the_pods_through_the_config_hash():
    cluster = Cluster(make_spec())
    cluster.build_to_ready()
    before = cluster.get("Deployment")["spec"]["template"]["metadata"]["annotations"]
    cluster.update_spec(make_spec(runtime={"batching": {"maxQueueDelayMicroseconds": 500}}))
    decision = cluster.reconcile(T0 + timedelta(minutes=5))
    assert sorted(o["kind"] for o in decision.apply) == ["ConfigMap", "Deployment"]
    after = cluster.get("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert after[names.ANNOTATION_CONFIG_HASH] != before[names.ANNOTATION_CONFIG_HASH]
    assert after[names.ANNOTATION_ENGINE_DIGEST] == DIGEST_A
    assert cluster.condition(READY).status == FALSE  # the controller has not rolled yet
    cluster.roll_out()
    cluster.reconcile(T0 + timedelta(minutes=6))
    assert cluster.condition(READY).status == TRUE


def test_with_autoscaling_the_replicas_an_autoscaler_set_are_kept_within_bounds():
    spec = make_spec(autoscaling={"enabled": True, "minReplicas": 2, "maxReplicas": 5})
    cluster = Cluster(spec)
    cluster.build_to_ready()
    assert cluster.get("Deployment")["spec"]["replicas"] == 2
    for set_by_autoscaler, kept in ((4, 4), (9, 5)):
        cluster.get("Deployment")["spec"]["replicas"] = set_by_autoscaler
        cluster.reconcile(T0 + timedelta(minutes=5))
        assert cluster.get("Deployment")["spec"]["replicas"] == kept
        assert cluster.status.replicas == kept


def test_engine_ready_tells_only_of_the_engine_while_an_older_version_serves():
    def shadowed(version: str):
        uri = f"https://models.example.com/mlp-{version}.onnx"
        return make_spec(
            model={"version": version, "source": {"uri": uri}}, rollout={"strategy": "Shadow"}
        )

    cluster = Cluster(shadowed("1"))
    cluster.build_to_ready()
    cluster.update_spec(shadowed("2"))
    cluster.reconcile(T0 + timedelta(minutes=5))
    (job,) = [j for j in cluster.jobs() if "status" not in j]
    cluster.succeed_job(job["metadata"]["name"], DIGEST_B, at=T0 + timedelta(minutes=6))
    cluster.reconcile(T0 + timedelta(minutes=7))  # built: a candidate while version 1 serves
    engine = cluster.condition(ConditionType.ENGINE_READY)
    assert (engine.status, engine.reason) == (TRUE, Reason.ENGINE_BUILT)
    assert engine.message == f"Engine {DIGEST_B} was built by Job {job['metadata']['name']}."


def test_the_passes_after_a_build_keep_its_message_and_write_no_status():
    """The pass that reads the built engine from its Job creates the Deployment; the ones
    after it find the engine recorded and the new Deployment with no pod ready yet, and
    say the same, Job and all, so nothing is written until a pod is ready."""
    cluster = Cluster(make_spec())
    cluster.reconcile()
    job = cluster.jobs()[0]["metadata"]["name"]
    cluster.succeed_job(job, DIGEST_A)
    cluster.reconcile(T0 + timedelta(seconds=1))
    deployed, writes = cluster.status, cluster.writes
    for seconds in (2, 3):
        cluster.reconcile(T0 + timedelta(seconds=seconds))
    assert cluster.status == deployed and cluster.writes == writes
    engine = cluster.condition(ConditionType.ENGINE_READY)
    assert engine.message == f"Engine {DIGEST_A} was built by Job {job}."
