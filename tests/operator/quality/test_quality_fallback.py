"""`onDrift: Fallback`, pass by pass (`decide_scenarios.Cluster`): drift found on the
served int8 engine first raises Degraded (the verdict and its Event), then serving rolls to
the model at the reference precision (on ONNX Runtime, the reference engine itself; on
TensorRT, a build of its own) and stays there whatever the watch reads, until the
drifted engine's inputs change or onDrift is Alert again."""

from __future__ import annotations

from datetime import timedelta

import yaml
from decide_scenarios import DIGEST_A, DIGEST_B, T0, Cluster, make_spec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType, Reason
from kubeinfer.operator.api.v1alpha1.enums import Phase, QualityState
from kubeinfer.operator.quality.report import window_to_read
from kubeinfer.operator.reconcile.desired import CONFIG_KEY
from kubeinfer.operator.state import names
from kubeinfer.operator.state.quality_readings import QualityReading
from test_quality_watch_children import INT8, REFERENCE, argument, mirror_file, reading, watching

OWNER = "demo"
DIGEST_C = "sha256:" + "c" * 64
SERVING = names.runtime_name(OWNER)


def falling_back(**watch: object) -> object:
    return make_spec(
        engine=INT8,
        qualityWatch={"enabled": True, "minSamples": 100, "onDrift": "Fallback", **watch},
    )


def served_digest(cluster: Cluster) -> str:
    config = yaml.safe_load(cluster.get("ConfigMap", SERVING)["data"][CONFIG_KEY])
    return str(config["engine"]["digest"])


def drifted(cluster: Cluster) -> None:
    """The int8 engine (DIGEST_A) serves, the fp32 reference (DIGEST_B) runs, class 3
    drifts: the verdict is published on this pass."""
    watching(cluster)
    cluster.quality = reading((2000, 1920), **{"3": (400, 320)})
    decision = cluster.reconcile(T0 + timedelta(minutes=5))
    assert cluster.status.quality_watch.state == QualityState.DRIFTING
    assert cluster.status.quality_watch.engine_digest == DIGEST_A
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", Reason.QUALITY_DRIFT)]
    assert served_digest(cluster) == DIGEST_A, "the verdict comes first; serving rolls next"


def test_drift_rolls_serving_to_the_reference_engine_and_says_so():
    cluster = Cluster(falling_back(), name=OWNER)
    drifted(cluster)
    decision = cluster.reconcile(T0 + timedelta(minutes=6))
    assert served_digest(cluster) == DIGEST_B, "on ONNX Runtime the reference engine serves"
    assert not [j for j in cluster.jobs() if "status" not in j], "nothing to build"
    events = {e.reason: e for e in decision.events}
    assert events[Reason.QUALITY_FALLBACK].type == "Warning"
    assert f"falls back to the fp32 engine {DIGEST_B}" in events[Reason.QUALITY_FALLBACK].message
    fallback = cluster.status.quality_watch.fallback
    assert fallback is not None
    assert (fallback.engine_digest, fallback.drifted_engine_digest) == (DIGEST_B, DIGEST_A)
    assert str(fallback.precision) == "fp32" and "class '3'" in fallback.drift
    degraded = cluster.condition(ConditionType.DEGRADED)
    assert (degraded.status, degraded.reason) == (ConditionStatus.TRUE, Reason.QUALITY_DRIFT)
    assert f"falls back to the fp32 engine {DIGEST_B}" in degraded.message
    ready = cluster.condition(ConditionType.READY)
    assert (ready.status, ready.reason) == (ConditionStatus.FALSE, Reason.QUALITY_FALLBACK)
    assert cluster.condition(ConditionType.STALLED).status == ConditionStatus.FALSE
    assert cluster.condition(ConditionType.PROGRESSING).status == ConditionStatus.TRUE  # rolling
    assert mirror_file(cluster).quality_watch is None, "fp32 against fp32: nothing to compare"
    # The spec's engine is still the int8 one: the status says which engine the spec has.
    assert cluster.status.engine.digest == DIGEST_A

    cluster.roll_out()
    cluster.reconcile(T0 + timedelta(minutes=7))
    assert cluster.status.phase == Phase.DEGRADED
    assert cluster.condition(ConditionType.PROGRESSING).status == ConditionStatus.FALSE


def test_a_fallback_holds_whatever_the_watch_reads_until_the_engine_inputs_change():
    cluster = Cluster(falling_back(), name=OWNER)
    drifted(cluster)
    cluster.reconcile(T0 + timedelta(minutes=6))
    cluster.roll_out()
    cluster.reconcile(T0 + timedelta(minutes=6, seconds=30))
    for minute, figures in enumerate([(4000, 3990), (4000, 3000), (4000, 4000)], start=7):
        cluster.quality = reading(figures, **{"3": (2000, 1999)})
        decision = cluster.reconcile(T0 + timedelta(minutes=minute))
        assert served_digest(cluster) == DIGEST_B, "never back on figures"
        assert decision.events == ()
        assert cluster.condition(ConditionType.DEGRADED).reason == Reason.QUALITY_DRIFT

    # A new calibration set: a new engine, built, then served and watched afresh.
    calibration = {"uri": "https://models.example.com/calibration-v2.npz"}
    cluster.update_spec(
        make_spec(
            engine={**INT8, "calibration": calibration},
            qualityWatch={"enabled": True, "minSamples": 100, "onDrift": "Fallback"},
        )
    )
    decision = cluster.reconcile(T0 + timedelta(minutes=10))
    ready = cluster.condition(ConditionType.READY)
    assert (ready.status, ready.reason) == (ConditionStatus.FALSE, Reason.ENGINE_BUILDING)
    assert any(e.reason == Reason.ENGINE_BUILDING for e in decision.events)
    assert cluster.status.quality_watch.fallback is None
    (build,) = [j for j in cluster.jobs() if "status" not in j]
    assert argument(build, "--precision") == "int8"
    cluster.succeed_job(build["metadata"]["name"], DIGEST_C, at=T0 + timedelta(minutes=11))
    cluster.reconcile(T0 + timedelta(minutes=12))
    assert served_digest(cluster) == DIGEST_C
    cluster.roll_out()
    cluster.quality = reading((2000, 1990), **{"3": (400, 398)})
    cluster.reconcile(T0 + timedelta(minutes=13))
    watch = cluster.status.quality_watch
    assert (watch.state, watch.engine_digest) == (QualityState.HEALTHY, DIGEST_C)
    assert cluster.condition(ConditionType.DEGRADED).status == ConditionStatus.FALSE
    assert cluster.condition(ConditionType.READY).status == ConditionStatus.TRUE


def test_setting_on_drift_back_to_alert_serves_the_spec_engine_and_watches_it_afresh():
    cluster = Cluster(falling_back(), name=OWNER)
    drifted(cluster)
    cluster.reconcile(T0 + timedelta(minutes=6))
    cluster.roll_out()
    cluster.update_spec(make_spec(engine=INT8, qualityWatch={"enabled": True, "minSamples": 100}))
    cluster.reconcile(T0 + timedelta(minutes=7))
    assert served_digest(cluster) == DIGEST_A
    assert cluster.status.quality_watch.state == QualityState.PENDING
    cluster.roll_out()
    cluster.reconcile(T0 + timedelta(minutes=8))
    assert mirror_file(cluster).quality_watch is not None, "the watch compares again"


def test_alert_alone_never_touches_serving():
    cluster = Cluster(falling_back(onDrift="Alert"), name=OWNER)
    drifted(cluster)
    for minute in (6, 7):
        cluster.reconcile(T0 + timedelta(minutes=minute))
        assert served_digest(cluster) == DIGEST_A
        assert cluster.status.quality_watch.fallback is None


def test_on_tensorrt_the_fallback_is_built_by_tensorrt_at_the_reference_precision():
    spec = make_spec(
        engine={**INT8, "backend": "tensorrt"},
        runtime={"resources": {"gpus": 1}, "gpuProduct": "NVIDIA-L4"},
        qualityWatch={"enabled": True, "minSamples": 100, "onDrift": "Fallback"},
    )
    cluster = Cluster(spec, name=OWNER)
    drifted(cluster)
    cluster.reconcile(T0 + timedelta(minutes=6))
    (build,) = [j for j in cluster.jobs() if "status" not in j]
    assert (argument(build, "--backend"), argument(build, "--precision")) == ("tensorrt", "fp32")
    assert "--calibration" not in build["spec"]["template"]["spec"]["containers"][0]["args"]
    assert served_digest(cluster) == DIGEST_A, "serving stays while the fallback builds"
    assert "falling back to the model at fp32: Job " in cluster.status.quality_watch.message
    assert cluster.condition(ConditionType.DEGRADED).reason == Reason.QUALITY_DRIFT
    # The reference's and the serving engine's Jobs do not take it for a stale one.
    decision = cluster.reconcile(T0 + timedelta(minutes=6, seconds=10))
    assert not [name for kind, name in decision.delete if kind == "Job"]

    cluster.succeed_job(build["metadata"]["name"], DIGEST_C, at=T0 + timedelta(minutes=7))
    cluster.reconcile(T0 + timedelta(minutes=8))
    assert served_digest(cluster) == DIGEST_C
    assert cluster.status.quality_watch.fallback.engine_digest == DIGEST_C
    assert cluster.get("Deployment", REFERENCE)["spec"]["replicas"] == 1


def test_the_window_never_reaches_back_before_the_watch_began_on_the_engine_serving():
    cluster = Cluster(falling_back(windowSeconds=3600), name=OWNER)
    watching(cluster)
    began = cluster.status.quality_watch.watching_since
    assert began == T0 + timedelta(seconds=62)
    assert cluster.status.quality_watch.engine_digest == DIGEST_A
    watch = cluster.spec.quality_watch
    status = cluster.status.quality_watch
    assert window_to_read(watch, status, DIGEST_A, began + timedelta(minutes=10)) == 600
    assert window_to_read(watch, status, DIGEST_A, began + timedelta(hours=5)) == 3600
    assert window_to_read(watch, status, DIGEST_C, began + timedelta(hours=5)) is None
    # The metrics source down on the next pass: the watch keeps when it began.
    cluster.quality = QualityReading(error="Prometheus at http://p:9090: connection refused")
    cluster.reconcile(T0 + timedelta(minutes=2))
    assert cluster.status.quality_watch.watching_since == began
    assert "connection refused" in cluster.status.quality_watch.message
