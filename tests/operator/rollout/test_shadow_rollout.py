"""The shadow rollout through the pure decision, pass by pass (`decide_scenarios.Cluster`
plays the API server and the controllers; the aggregates are what a metrics source would
answer): a new engine runs as a candidate beside the serving one and is promoted or rolled
back on its verdict, never touching serving before; failures are remembered; a spec change
replaces the candidate; the manual gate acts only on the digest it names; the serving
Service never selects a candidate pod."""

from __future__ import annotations

from datetime import timedelta

import yaml
from decide_scenarios import DIGEST_A, DIGEST_B, T0, Cluster, make_spec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType, Reason
from kubeinfer.operator.api.v1alpha1.enums import Phase, ShadowVerdict
from kubeinfer.operator.api.v1alpha1.status import CandidateStatus
from kubeinfer.operator.reconcile.desired import CONFIG_KEY, MIRROR_KEY
from kubeinfer.operator.rollout.shadow import (
    GATE_ANNOTATION,
    RolloutPlan,
    ShadowQuery,
    metrics_query,
    promotion_complete,
    shadow_replaced_event,
    trial_key,
)
from kubeinfer.operator.state import names
from kubeinfer.operator.state.decision import Decision
from kubeinfer.operator.state.engine_state import ServingEngine
from kubeinfer.operator.state.shadow_readings import ShadowAggregates, ShadowReading

DIGEST_C = "sha256:" + "c" * 64
SHADOW = {
    "strategy": "Shadow",
    "shadow": {"trafficPercent": 25, "minSamples": 50, "maxDurationSeconds": 600},
}
CANDIDATE = names.candidate_name("demo")
GOOD = ShadowAggregates(
    compared=60,
    max_abs_difference=0.001,
    top1_rows=60,
    top1_agreements=60,
    serving_p99_seconds=0.01,
    candidate_p99_seconds=0.01,
)
BAD = ShadowAggregates(compared=5, max_abs_difference=3.0)
TRIAL_KEY_OF_VERSION_2 = "1b47aa49e83ade4f4c93e86b0b07d1b1"
"""`trial_key(spec("2"), engine B)` as stored by earlier operator versions. A change here
reruns every failed trial after an upgrade (a new shadow setting with a default does
too): make it on purpose, never as a side effect."""


def spec(version: str = "1", **sections):
    uri = f"https://models.example.com/mlp-{version}.onnx"
    return make_spec(model={"version": version, "source": {"uri": uri}}, rollout=SHADOW, **sections)


def mirror_target(cluster: Cluster) -> dict | None:
    """The serving pods' mirror target; None too while there is no mirror file (the
    runtime reads a missing one as "mirror nothing")."""
    if not cluster.has("ConfigMap", names.mirror_name("demo")):
        return None
    text = cluster.get("ConfigMap", names.mirror_name("demo"))["data"][MIRROR_KEY]
    return (yaml.safe_load(text) or {}).get("target")


def served(cluster: Cluster, name: str | None = None) -> str:
    config = yaml.safe_load(cluster.get("ConfigMap", name)["data"][CONFIG_KEY])
    return config["engine"]["digest"]


def build_new_version(cluster: Cluster, version: str, digest: str, at) -> Decision:
    """The spec moves to `version`; its engine is built as `digest`. Returns the decision
    of the pass that saw the engine built."""
    cluster.update_spec(spec(version))
    cluster.reconcile(at)
    (job,) = [j for j in cluster.jobs() if "status" not in j]
    cluster.succeed_job(job["metadata"]["name"], digest, at=at + timedelta(seconds=30))
    return cluster.reconcile(at + timedelta(seconds=31))


def shadowing_cluster() -> Cluster:
    """Version 1 (engine A) serves; version 2 (engine B) is the available candidate."""
    cluster = Cluster(spec("1"))
    cluster.build_to_ready(DIGEST_A)
    build_new_version(cluster, "2", DIGEST_B, T0 + timedelta(minutes=10))
    cluster.roll_out(name=CANDIDATE)
    cluster.reconcile(T0 + timedelta(minutes=11))
    return cluster


def test_the_first_engine_serves_directly_with_nothing_to_compare():
    cluster = Cluster(spec("1"))
    cluster.build_to_ready(DIGEST_A)
    assert served(cluster) == DIGEST_A
    assert not cluster.has("Deployment", CANDIDATE)
    assert cluster.condition(ConditionType.READY).status == ConditionStatus.TRUE
    shadow = cluster.condition(ConditionType.SHADOW_PASSED)
    assert (shadow.status, shadow.reason) == (ConditionStatus.UNKNOWN, Reason.NO_CANDIDATE)
    assert not cluster.has("ConfigMap", names.mirror_name("demo")), "no mirror file to write"


def test_a_new_engine_runs_as_a_candidate_and_serving_is_untouched():
    cluster = Cluster(spec("1"))
    cluster.build_to_ready(DIGEST_A)
    serving_before = cluster.get("Deployment")
    build_new_version(cluster, "2", DIGEST_B, T0 + timedelta(minutes=10))
    assert cluster.get("Deployment") == serving_before, "serving is not rolled"
    assert served(cluster) == DIGEST_A
    assert served(cluster, CANDIDATE) == DIGEST_B
    candidate = cluster.get("Deployment", CANDIDATE)
    assert candidate["spec"]["replicas"] == 1
    assert cluster.status.phase == Phase.SHADOWING
    record = cluster.status.candidate
    assert (record.version, record.engine_digest, record.verdict) == (
        "2", DIGEST_B, ShadowVerdict.PENDING,
    )  # fmt: skip
    assert record.start_time == T0 + timedelta(minutes=10, seconds=31)
    assert record.reason == Reason.SHADOW_RUNNING and "mirror" in record.message
    # Not mirrored to before a candidate pod is available (requests would go nowhere).
    assert mirror_target(cluster) is None
    cluster.reconcile(T0 + timedelta(minutes=10, seconds=45))
    assert mirror_target(cluster) is None
    cluster.roll_out(name=CANDIDATE)
    decision = cluster.reconcile(T0 + timedelta(minutes=11))
    target = mirror_target(cluster)
    assert target["url"] == f"http://{CANDIDATE}.ns.svc:8000"
    assert (target["candidateVersion"], target["candidateDigest"]) == ("2", DIGEST_B)
    assert target["trafficPercent"] == 25
    assert cluster.get("Deployment") == serving_before, "the mirror target rolls nothing"
    assert decision.requeue_after_seconds is not None
    progressing = cluster.condition(ConditionType.PROGRESSING)
    assert (progressing.status, progressing.reason) == (ConditionStatus.TRUE, Reason.SHADOW_RUNNING)


def test_the_serving_service_never_selects_a_candidate_pod():
    cluster = shadowing_cluster()
    service = cluster.get("Service")["spec"]["selector"]
    candidate_pods = cluster.get("Deployment", CANDIDATE)["spec"]["template"]["metadata"]["labels"]
    serving_pods = cluster.get("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service.items() <= serving_pods.items()
    assert not service.items() <= candidate_pods.items()
    # Nor does the serving Deployment's selector: it would adopt the candidate's pods.
    serving_selector = cluster.get("Deployment")["spec"]["selector"]["matchLabels"]
    assert not serving_selector.items() <= candidate_pods.items()
    candidate_service = cluster.get("Service", CANDIDATE)["spec"]["selector"]
    assert candidate_service.items() <= candidate_pods.items()
    assert not candidate_service.items() <= serving_pods.items()


def test_a_passed_candidate_is_promoted_then_removed():
    cluster = shadowing_cluster()
    cluster.reading = ShadowReading(GOOD)
    cluster.reconcile(T0 + timedelta(minutes=12))
    assert cluster.status.candidate.verdict == ShadowVerdict.PASSED
    assert served(cluster) == DIGEST_B, "serving rolls to the candidate's engine"
    assert cluster.get("Deployment")["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert cluster.has("Deployment", CANDIDATE), "the candidate stays until the roll is done"
    assert mirror_target(cluster) is None, "the mirror stops at the verdict"
    assert cluster.condition(ConditionType.SHADOW_PASSED).status == ConditionStatus.TRUE
    assert cluster.condition(ConditionType.PROGRESSING).reason == Reason.PROMOTING

    cluster.roll_out()
    cluster.reconcile(T0 + timedelta(minutes=13))
    assert cluster.status.candidate.verdict == ShadowVerdict.PROMOTED
    assert not cluster.has("Deployment", CANDIDATE)
    assert not cluster.has("Service", CANDIDATE)
    assert not cluster.has("ConfigMap", CANDIDATE)
    assert cluster.condition(ConditionType.READY).status == ConditionStatus.TRUE
    assert cluster.status.serving.engine_digest == DIGEST_B
    assert cluster.status.candidate.samples == 60
    writes = cluster.writes
    cluster.reconcile(T0 + timedelta(minutes=14))
    assert cluster.writes == writes, "a promoted object settles"


def test_a_failed_candidate_is_rolled_back_and_not_tried_again():
    cluster = shadowing_cluster()
    serving_before = cluster.get("Deployment")
    cluster.reading = ShadowReading(BAD)
    decision = cluster.reconcile(T0 + timedelta(minutes=12))
    record = cluster.status.candidate
    assert (record.verdict, record.reason) == (ShadowVerdict.FAILED, Reason.DIFFERENCE_TOO_LARGE)
    assert record.max_absolute_difference == 3.0
    assert not cluster.has("Deployment", CANDIDATE)
    assert cluster.get("Deployment") == serving_before and served(cluster) == DIGEST_A
    assert mirror_target(cluster) is None
    assert cluster.status.phase == Phase.DEGRADED
    degraded = cluster.condition(ConditionType.DEGRADED)
    assert (degraded.status, degraded.reason) == (ConditionStatus.TRUE, Reason.SHADOW_FAILED)
    assert cluster.condition(ConditionType.STALLED).status == ConditionStatus.TRUE
    assert any(e.reason == Reason.SHADOW_FAILED and e.type == "Warning" for e in decision.events)
    # Later passes (the build Job long gone) neither rebuild nor retry the same engine.
    for job in cluster.jobs():
        cluster.delete("Job", job["metadata"]["name"])
    for minutes in (20, 60, 600):
        decision = cluster.reconcile(T0 + timedelta(minutes=minutes))
        assert not cluster.jobs() and not cluster.has("Deployment", CANDIDATE)
        # Serving stays, and the object stays Degraded until the spec changes.
        assert served(cluster) == DIGEST_A and cluster.status.phase == Phase.DEGRADED
        degraded = cluster.condition(ConditionType.DEGRADED)
        assert degraded.reason == Reason.SHADOW_FAILED
        assert "Version 1 keeps serving" in degraded.message
    assert cluster.status.candidate.verdict == ShadowVerdict.FAILED
    # A new spec is a new trial; the failed one was over, not replaced mid-shadow.
    decision = build_new_version(cluster, "3", DIGEST_C, T0 + timedelta(hours=11))
    assert all(e.reason != "ShadowReplaced" for e in decision.events)
    assert cluster.status.candidate.verdict == ShadowVerdict.PENDING
    assert served(cluster, CANDIDATE) == DIGEST_C


def test_too_few_samples_by_the_deadline_is_a_rollback():
    cluster = shadowing_cluster()
    cluster.reading = ShadowReading(ShadowAggregates(compared=3, max_abs_difference=0.0))
    cluster.reconcile(T0 + timedelta(minutes=12))
    assert cluster.status.candidate.verdict == ShadowVerdict.PENDING
    assert cluster.status.candidate.samples == 3
    cluster.reconcile(T0 + timedelta(minutes=25))  # started at 10:31, 600 s max
    assert cluster.status.candidate.reason == Reason.INSUFFICIENT_SAMPLES
    assert not cluster.has("Deployment", CANDIDATE)


def test_the_candidate_record_carries_every_figure_in_its_unit():
    cluster = shadowing_cluster()
    cluster.reading = ShadowReading(
        ShadowAggregates(
            compared=20,
            mismatches=1,
            dropped=4,
            candidate_errors=2,
            timeouts=3,
            max_abs_difference=0.002,
            top1_rows=20,
            top1_agreements=19,
            serving_p99_seconds=0.0125,
            candidate_p99_seconds=0.015,
        )
    )
    cluster.reconcile(T0 + timedelta(minutes=12))
    record = cluster.status.candidate
    assert record.reason == Reason.OUTPUT_MISMATCH
    # Errors and timeouts are both answers the candidate did not give; p99s in ms.
    assert (record.samples, record.mismatches, record.dropped, record.candidate_errors) == (
        20, 1, 4, 5,
    )  # fmt: skip
    assert (record.top1_agreement, record.max_absolute_difference) == (0.95, 0.002)
    assert (record.serving_p99_milliseconds, record.candidate_p99_milliseconds) == (12.5, 15.0)


def test_the_trial_is_the_version_the_engine_and_the_shadow_settings():
    # A failed trial is retried only when this key changes: a new version or engine, or
    # other settings to judge it by (loosened thresholds are a new trial).
    base = spec("2")
    candidate = ServingEngine("2", DIGEST_B, None)
    key = trial_key(base, candidate)
    assert trial_key(spec("2"), candidate) == key
    looser = SHADOW | {"shadow": {**SHADOW["shadow"], "thresholds": {"minTop1Agreement": 0.9}}}
    others = [
        trial_key(base, ServingEngine("3", DIGEST_B, None)),
        trial_key(base, ServingEngine("2", DIGEST_C, None)),
        trial_key(make_spec(model=base.model.to_wire(), rollout=looser), candidate),
    ]
    assert key not in others and len(set(others)) == 3


def test_the_trial_key_is_unchanged_from_earlier_versions():
    # Stored records compare against it: a key computed differently after an operator
    # upgrade would rerun every failed trial.
    key = trial_key(spec("2"), ServingEngine("2", DIGEST_B, None))
    assert key == TRIAL_KEY_OF_VERSION_2


def test_unreadable_metrics_keep_the_candidate_pending_and_say_why():
    cluster = shadowing_cluster()
    cluster.reading = ShadowReading(None, "Prometheus at http://p:9090 did not answer.")
    cluster.reconcile(T0 + timedelta(minutes=12))
    record = cluster.status.candidate
    assert record.verdict == ShadowVerdict.PENDING
    assert record.reason == Reason.METRICS_UNAVAILABLE
    assert "did not answer" in record.message
    assert cluster.has("Deployment", CANDIDATE) and served(cluster) == DIGEST_A
    assert cluster.status.phase == Phase.SHADOWING


def test_a_spec_change_during_the_shadow_replaces_the_candidate():
    cluster = shadowing_cluster()
    cluster.reading = ShadowReading(ShadowAggregates(compared=10, max_abs_difference=0.0))
    cluster.reconcile(T0 + timedelta(minutes=12))
    cluster.update_spec(spec("3"))
    cluster.reconcile(T0 + timedelta(minutes=13))
    # While version 3 builds, version 2's candidate is no longer what the spec asks for.
    record = cluster.status.candidate
    assert (record.verdict, record.reason) == (ShadowVerdict.ABORTED, "Superseded")
    assert "spec changed" in record.message
    assert not cluster.has("Deployment", CANDIDATE)
    assert served(cluster) == DIGEST_A
    (job,) = [j for j in cluster.jobs() if "status" not in j]
    cluster.succeed_job(job["metadata"]["name"], DIGEST_C, at=T0 + timedelta(minutes=14))
    cluster.reconcile(T0 + timedelta(minutes=15))
    record = cluster.status.candidate
    assert (record.version, record.engine_digest, record.verdict) == (
        "3", DIGEST_C, ShadowVerdict.PENDING,
    )  # fmt: skip
    assert record.samples == 0 and record.start_time == T0 + timedelta(minutes=15)
    assert served(cluster, CANDIDATE) == DIGEST_C


def test_a_new_pin_is_shadowed_and_replacing_it_mid_shadow_is_announced():
    cluster = Cluster(spec("1", engine={"pin": DIGEST_A}))
    cluster.reconcile(T0)
    cluster.roll_out()
    cluster.reconcile(T0 + timedelta(seconds=5))
    cluster.update_spec(spec("1", engine={"pin": DIGEST_B}))
    cluster.reconcile(T0 + timedelta(seconds=10))
    assert served(cluster, CANDIDATE) == DIGEST_B and served(cluster) == DIGEST_A
    cluster.update_spec(spec("1", engine={"pin": DIGEST_C}))
    decision = cluster.reconcile(T0 + timedelta(seconds=20))
    assert served(cluster, CANDIDATE) == DIGEST_C
    (event,) = [e for e in decision.events if e.reason == "ShadowReplaced"]
    # "Normal" exactly: the API server accepts no other spelling of an Event's type.
    assert event.type == "Normal"
    assert DIGEST_B in event.message and DIGEST_C in event.message


def test_the_replaced_event_says_when_no_candidate_follows():
    replaced = CandidateStatus(version="2", engine_digest=DIGEST_B)
    event = shadow_replaced_event(replaced, None)
    assert event.type == "Normal" and "version 2" in event.message
    assert event.message.endswith("the candidate is now none.")


def test_the_manual_gate_acts_only_on_the_digest_it_names():
    cluster = shadowing_cluster()
    cluster.reading = ShadowReading(ShadowAggregates(compared=1, max_abs_difference=0.0))
    cluster.annotations[GATE_ANNOTATION] = f"promote {DIGEST_C}"  # a stale command
    cluster.reconcile(T0 + timedelta(minutes=12))
    assert cluster.status.candidate.verdict == ShadowVerdict.PENDING
    assert served(cluster) == DIGEST_A
    cluster.annotations[GATE_ANNOTATION] = f"promote {DIGEST_B}"
    cluster.reconcile(T0 + timedelta(minutes=13))
    assert cluster.status.candidate.verdict == ShadowVerdict.PASSED
    assert cluster.status.candidate.reason == "ManualPromotion"
    assert "kubeinfer promote" in cluster.status.candidate.message
    assert served(cluster) == DIGEST_B


def test_abort_removes_the_candidate_and_leaves_serving():
    cluster = shadowing_cluster()
    cluster.annotations[GATE_ANNOTATION] = f"abort {DIGEST_B}"
    cluster.reconcile(T0 + timedelta(minutes=12))
    record = cluster.status.candidate
    assert (record.verdict, record.reason) == (ShadowVerdict.ABORTED, "ManualAbort")
    assert "kubeinfer abort" in record.message
    assert not cluster.has("Deployment", CANDIDATE) and served(cluster) == DIGEST_A
    degraded = cluster.condition(ConditionType.DEGRADED)
    assert degraded.reason == Reason.SHADOW_ABORTED


def test_a_malformed_gate_is_ignored():
    cluster = shadowing_cluster()
    cluster.annotations[GATE_ANNOTATION] = f"promote-now {DIGEST_B}"
    cluster.reconcile(T0 + timedelta(minutes=12))
    assert cluster.status.candidate.verdict == ShadowVerdict.PENDING


def test_switching_to_the_rolling_strategy_mid_shadow_supersedes_the_candidate():
    cluster = shadowing_cluster()
    cluster.update_spec(spec("2").model_copy(update={"rollout": make_spec().rollout}))
    cluster.reconcile(T0 + timedelta(minutes=12))
    record = cluster.status.candidate
    assert (record.verdict, record.reason) == (ShadowVerdict.ABORTED, "Superseded")
    assert not cluster.has("Deployment", CANDIDATE)
    assert served(cluster) == DIGEST_B, "the rolling strategy rolls serving directly"


def test_promotion_completes_only_once_serving_runs_the_passed_engine_everywhere():
    passed = CandidateStatus(
        version="2", engine_digest=DIGEST_B, verdict=ShadowVerdict.PASSED, message="Met."
    )
    engine_b = ServingEngine("2", DIGEST_B, None)
    plan = RolloutPlan(engine_b, candidate=engine_b, record=passed)
    done = promotion_complete(plan, serving_rolled_out=True)
    assert done.serving == engine_b and done.candidate is None
    assert (done.record.verdict, done.record.reason) == (
        ShadowVerdict.PROMOTED, Reason.SHADOW_PROMOTED,
    )  # fmt: skip
    assert done.record.message == "Met. Serving runs it on every pod now."
    not_yet = [
        (plan, False),  # the roll is under way
        (RolloutPlan(ServingEngine("1", DIGEST_A, None), record=passed), True),  # another engine
        (RolloutPlan(None, record=passed), True),  # nothing serves
        (RolloutPlan(engine_b, record=passed.model_copy(update={"verdict": "Pending"})), True),
        (RolloutPlan(engine_b), True),  # no candidate at all
    ]
    for unfinished, rolled_out in not_yet:
        assert promotion_complete(unfinished, rolled_out) is unfinished


def test_the_metrics_are_read_only_for_a_pending_candidate_with_a_start():
    pending = CandidateStatus(version="2", engine_digest=DIGEST_B, start_time=T0)
    assert metrics_query(pending) == ShadowQuery(DIGEST_B, "2", T0)
    assert metrics_query(pending.model_copy(update={"version": None})) == ShadowQuery(
        DIGEST_B, "", T0
    )
    for unread in (
        None,
        pending.model_copy(update={"verdict": ShadowVerdict.PASSED}),
        pending.model_copy(update={"start_time": None}),
        pending.model_copy(update={"engine_digest": None}),
    ):
        assert metrics_query(unread) is None


def test_the_rolling_strategy_never_runs_a_candidate():
    cluster = Cluster(make_spec())
    cluster.build_to_ready(DIGEST_A)
    uri = "https://models.example.com/mlp-2.onnx"
    cluster.update_spec(make_spec(model={"version": "2", "source": {"uri": uri}}))
    cluster.reconcile(T0 + timedelta(minutes=10))
    (job,) = [j for j in cluster.jobs() if "status" not in j]
    cluster.succeed_job(job["metadata"]["name"], DIGEST_B, at=T0 + timedelta(minutes=11))
    cluster.reconcile(T0 + timedelta(minutes=12))
    assert served(cluster) == DIGEST_B
    assert not cluster.has("Deployment", CANDIDATE)
    assert cluster.status.candidate is None
    assert all(c.type != ConditionType.SHADOW_PASSED for c in cluster.status.conditions)
