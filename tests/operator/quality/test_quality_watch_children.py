"""The quality watch's children, pass by pass (`decide_scenarios.Cluster`): the reference
engine is built by a Job of its own (ONNX Runtime, the reference precision, no
calibration), apart from the serving engine's, neither deleting the other's; its runtime
is one CPU pod behind a Service of its own that the serving Service never selects; the
serving pods' mirror file names the reference only while it has a pod available and
serving runs the spec's engine; turning the watch off removes the reference."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest
import yaml
from decide_scenarios import DIGEST_A, DIGEST_B, T0, Cluster, make_spec
from kubeinfer.contract.runtime_config import MirrorFile
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType, Reason
from kubeinfer.operator.api.v1alpha1.enums import QualityState
from kubeinfer.operator.reconcile.desired import CONFIG_KEY, HTTP_PORT, MIRROR_KEY
from kubeinfer.operator.state import names
from kubeinfer.operator.state.engine_state import ANNOTATION_AGREEMENT
from kubeinfer.operator.state.quality_readings import (
    AgreementTally,
    BuildAgreement,
    QualityReading,
    WindowTallies,
    parse_build_agreement,
)

OWNER = "demo"
REFERENCE = names.reference_name(OWNER)
INT8 = {
    "precision": "int8",
    "calibration": {"uri": "https://models.example.com/calibration.npz"},
}


def watched(**watch: object) -> object:
    return make_spec(engine=INT8, qualityWatch={"enabled": True, "samplePercent": 5, **watch})


def argument(job: dict, flag: str) -> str:
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index(flag) + 1]


def mirror_file(cluster: Cluster) -> MirrorFile:
    """The serving pods' mirror file; an empty one while none is written (the runtime
    reads a missing file as "mirror nothing")."""
    if not cluster.has("ConfigMap", names.mirror_name(OWNER)):
        return MirrorFile()
    text = cluster.get("ConfigMap", names.mirror_name(OWNER))["data"][MIRROR_KEY]
    return MirrorFile.model_validate(yaml.safe_load(text))


def both_built(cluster: Cluster) -> tuple[dict, dict]:
    """Both builds started on the first pass: (serving Job, reference Job)."""
    cluster.reconcile(T0)
    jobs = cluster.jobs()
    assert len(jobs) == 2, [j["metadata"]["name"] for j in jobs]
    (serving,) = [j for j in jobs if argument(j, "--precision") == "int8"]
    (reference,) = [j for j in jobs if argument(j, "--precision") == "fp32"]
    return serving, reference


def test_the_reference_engine_is_built_apart_at_the_reference_precision_on_cpu():
    cluster = Cluster(watched())
    serving, reference = both_built(cluster)
    assert argument(reference, "--backend") == "onnxruntime"
    assert "--calibration" not in reference["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--calibration" in serving["spec"]["template"]["spec"]["containers"][0]["args"]
    key = names.LABEL_BUILD_KEY
    assert reference["metadata"]["labels"][key] != serving["metadata"]["labels"][key]
    # Neither engine's state takes the other's running Job for a stale one.
    decision = cluster.reconcile(T0 + timedelta(seconds=5))
    assert not [name for kind, name in decision.delete if kind == "Job"]
    assert len(cluster.jobs()) == 2


def test_the_reference_runs_one_cpu_pod_that_the_serving_service_never_selects():
    cluster = Cluster(watched(), name=OWNER)
    serving, reference = both_built(cluster)
    cluster.succeed_job(reference["metadata"]["name"], DIGEST_B, at=T0 + timedelta(seconds=30))
    cluster.succeed_job(serving["metadata"]["name"], DIGEST_A, at=T0 + timedelta(seconds=60))
    cluster.reconcile(T0 + timedelta(seconds=61))
    deployment = cluster.get("Deployment", REFERENCE)
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in str(container.get("resources", {}))
    assert pod["metadata"]["labels"][names.LABEL_ROLE] == names.ROLE_REFERENCE
    config = yaml.safe_load(cluster.get("ConfigMap", REFERENCE)["data"][CONFIG_KEY])
    assert config["engine"]["digest"] == DIGEST_B
    assert config.get("mirrorTargetFile") is None, "the reference mirrors nothing"
    served_by = cluster.get("Service", names.service_name(OWNER))["spec"]["selector"]
    assert not set(served_by.items()) <= set(pod["metadata"]["labels"].items())
    reference_service = cluster.get("Service", REFERENCE)["spec"]["selector"]
    assert set(reference_service.items()) <= set(pod["metadata"]["labels"].items())


def test_the_mirror_names_the_reference_once_it_has_a_pod_available():
    cluster = Cluster(watched(sliceHeader="X-Kubeinfer-Slice", windowSeconds=900), name=OWNER)
    serving, reference = both_built(cluster)
    cluster.succeed_job(reference["metadata"]["name"], DIGEST_B, at=T0 + timedelta(seconds=30))
    cluster.succeed_job(serving["metadata"]["name"], DIGEST_A, at=T0 + timedelta(seconds=60))
    cluster.reconcile(T0 + timedelta(seconds=61))
    cluster.roll_out()
    cluster.reconcile(T0 + timedelta(seconds=62))
    assert mirror_file(cluster).quality_watch is None, "no reference pod available yet"
    cluster.roll_out(name=REFERENCE)
    cluster.reconcile(T0 + timedelta(seconds=63))
    watch = mirror_file(cluster).quality_watch
    assert watch is not None
    assert watch.reference.url == f"http://{REFERENCE}.ns.svc:{HTTP_PORT}"
    assert (watch.reference.candidate_version, watch.reference.candidate_digest) == ("1", DIGEST_B)
    assert watch.reference.traffic_percent == 5
    assert (watch.slice_header, watch.window_seconds) == ("X-Kubeinfer-Slice", 900)
    assert mirror_file(cluster).target is None, "no shadow candidate"


def test_turning_the_watch_off_removes_the_reference_and_stops_the_mirror():
    cluster = Cluster(watched(), name=OWNER)
    serving, reference = both_built(cluster)
    cluster.succeed_job(reference["metadata"]["name"], DIGEST_B, at=T0 + timedelta(seconds=30))
    cluster.succeed_job(serving["metadata"]["name"], DIGEST_A, at=T0 + timedelta(seconds=60))
    cluster.reconcile(T0 + timedelta(seconds=61))
    cluster.roll_out()
    cluster.roll_out(name=REFERENCE)
    cluster.reconcile(T0 + timedelta(seconds=62))
    assert mirror_file(cluster).quality_watch is not None
    cluster.update_spec(make_spec(engine=INT8, qualityWatch={"enabled": False}))
    decision = cluster.reconcile(T0 + timedelta(seconds=70))
    assert {("Deployment", REFERENCE), ("Service", REFERENCE), ("ConfigMap", REFERENCE)} <= set(
        decision.delete
    )
    assert mirror_file(cluster).quality_watch is None
    # The serving engine is unchanged by the watch: no new build, no roll.
    assert not [j for j in cluster.jobs() if "status" not in j]


def test_a_reference_found_in_its_configmap_is_not_built_again():
    cluster = Cluster(watched(), name=OWNER)
    serving, reference = both_built(cluster)
    cluster.succeed_job(reference["metadata"]["name"], DIGEST_B, at=T0 + timedelta(seconds=30))
    cluster.succeed_job(serving["metadata"]["name"], DIGEST_A, at=T0 + timedelta(seconds=60))
    cluster.reconcile(T0 + timedelta(seconds=61))
    for job in cluster.jobs():  # the Jobs' TTL passed
        cluster.delete("Job", job["metadata"]["name"])
    cluster.reconcile(T0 + timedelta(hours=2))
    assert cluster.jobs() == []
    config = yaml.safe_load(cluster.get("ConfigMap", REFERENCE)["data"][CONFIG_KEY])
    assert config["engine"]["digest"] == DIGEST_B


def test_the_reference_pod_counts_among_the_pods_on_a_read_write_once_cache():
    cluster = Cluster(watched(), name=OWNER)
    cluster.reconcile(T0)
    risk = cluster.condition(ConditionType.CACHE_ATTACH_RISK)
    assert risk.status == ConditionStatus.TRUE
    assert "up to 2 runtime pods (serving and quality reference)" in risk.message


# -- the status and the condition ---------------------------------------------------------


def watching(cluster: Cluster) -> None:
    """Both engines built, both runtimes rolled out: the serving pods mirror."""
    serving, reference = both_built(cluster)
    cluster.succeed_job(reference["metadata"]["name"], DIGEST_B, at=T0 + timedelta(seconds=30))
    cluster.succeed_job(serving["metadata"]["name"], DIGEST_A, at=T0 + timedelta(seconds=60))
    cluster.reconcile(T0 + timedelta(seconds=61))
    cluster.roll_out()
    cluster.roll_out(name=REFERENCE)
    cluster.reconcile(T0 + timedelta(seconds=62))


def reading(overall: tuple[int, int], **classes: tuple[int, int]) -> QualityReading:
    """(rows, agreements) overall and per class."""
    return QualityReading(
        WindowTallies(
            AgreementTally(*overall),
            {name: AgreementTally(*tally) for name, tally in classes.items()},
        )
    )


def test_the_watch_waits_for_its_reference_and_says_why():
    cluster = Cluster(watched(), name=OWNER)
    cluster.reconcile(T0)
    status = cluster.status.quality_watch
    assert status is not None and status.state == QualityState.PENDING
    assert status.message.startswith("The reference engine is not ready: Job ")
    assert cluster.condition(ConditionType.DEGRADED).status == ConditionStatus.FALSE


def test_a_pass_that_reads_the_recorded_figures_leaves_the_status_as_it_was():
    cluster = Cluster(watched(minSamples=100), name=OWNER)
    watching(cluster)
    cluster.quality = replace(reading((2000, 1980)), covered_seconds=15.0)
    cluster.reconcile(T0 + timedelta(minutes=5))
    settled = cluster.status.quality_watch
    assert settled is not None and "The counts cover 15 s of the 3600 s window" in settled.message
    # Nothing new was counted: only the time moved (the window covers more of it).
    cluster.quality = replace(reading((2000, 1980)), covered_seconds=75.0)
    cluster.reconcile(T0 + timedelta(minutes=6))
    assert cluster.status.quality_watch == settled
    # New figures are judged and recorded, with their time.
    cluster.quality = replace(reading((2100, 2079)), covered_seconds=135.0)
    cluster.reconcile(T0 + timedelta(minutes=7))
    moved = cluster.status.quality_watch
    assert moved is not None and moved.samples == 2100
    assert moved.last_evaluated == T0 + timedelta(minutes=7)
    assert "The counts cover 135 s" in moved.message


def test_a_class_that_drifts_degrades_the_object_once_and_recovery_clears_it():
    cluster = Cluster(watched(minSamples=100, minClassAgreement=0.9), name=OWNER)
    watching(cluster)
    cluster.quality = reading((2000, 1980), **{"3": (400, 398)})
    cluster.reconcile(T0 + timedelta(minutes=5))
    status = cluster.status.quality_watch
    assert status.state == QualityState.HEALTHY and status.samples == 2000
    assert status.top1_agreement == 0.99 and status.reference_engine_digest == DIGEST_B
    assert status.last_evaluated == T0 + timedelta(minutes=5)
    assert cluster.condition(ConditionType.DEGRADED).status == ConditionStatus.FALSE

    # Class 3 drifts while the whole traffic holds above minTop1Agreement.
    cluster.quality = reading((2000, 1920), **{"3": (400, 320)})
    decision = cluster.reconcile(T0 + timedelta(minutes=6))
    degraded = cluster.condition(ConditionType.DEGRADED)
    assert (degraded.status, degraded.reason) == (ConditionStatus.TRUE, Reason.QUALITY_DRIFT)
    assert "class '3'" in degraded.message and "0.8000" in degraded.message
    assert cluster.condition(ConditionType.READY).status == ConditionStatus.TRUE
    assert cluster.condition(ConditionType.STALLED).status == ConditionStatus.FALSE
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", Reason.QUALITY_DRIFT)]
    status = cluster.status.quality_watch
    assert status.state == QualityState.DRIFTING
    assert (status.worst_class.name, status.worst_class.samples) == ("3", 400)
    assert [(g.kind, g.name) for g in status.drifting] == [("class", "3")]

    # No figures this pass (Prometheus down): the drift stays, no Event either way.
    cluster.quality = QualityReading(error="Prometheus at http://p:9090: connection refused")
    decision = cluster.reconcile(T0 + timedelta(minutes=7))
    assert cluster.condition(ConditionType.DEGRADED).reason == Reason.QUALITY_DRIFT
    assert decision.events == ()

    # Just above the threshold is not yet back (hysteresis): still drifting.
    cluster.quality = reading((2000, 1960), **{"3": (400, 362)})
    cluster.reconcile(T0 + timedelta(minutes=8))
    assert cluster.condition(ConditionType.DEGRADED).reason == Reason.QUALITY_DRIFT

    # Significantly back: cleared, with an Event.
    cluster.quality = reading((4000, 3960), **{"3": (2000, 1990)})
    decision = cluster.reconcile(T0 + timedelta(minutes=9))
    assert cluster.condition(ConditionType.DEGRADED).status == ConditionStatus.FALSE
    assert cluster.status.quality_watch.state == QualityState.HEALTHY
    assert any(e.type == "Normal" for e in decision.events)


def test_turning_the_watch_off_drops_its_status_and_its_condition():
    cluster = Cluster(watched(minSamples=100), name=OWNER)
    watching(cluster)
    cluster.quality = reading((2000, 1500))
    cluster.reconcile(T0 + timedelta(minutes=5))
    assert cluster.condition(ConditionType.DEGRADED).reason == Reason.QUALITY_DRIFT
    cluster.update_spec(make_spec(engine=INT8))
    cluster.reconcile(T0 + timedelta(minutes=6))
    assert cluster.status.quality_watch is None
    assert cluster.condition(ConditionType.DEGRADED).status == ConditionStatus.FALSE


# -- the build's agreement as the baseline ------------------------------------------------


def built_with_agreement(by_class: dict[str, list[int]]) -> str:
    accuracy = {"output": "probabilities", "rows": 2000, "agreements": 1960, "byClass": by_class}
    return json.dumps({"digest": DIGEST_A, "accuracy": accuracy})


def test_the_build_agreement_is_recorded_and_lowers_the_bar_for_a_class_it_measured_low():
    low_at_build = {"7": [400, 300]}  # quantisation already changed class 7 at build time
    cluster = Cluster(watched(minSamples=100, minClassAgreement=0.9), name=OWNER)
    serving, reference = both_built(cluster)
    cluster.succeed_job(reference["metadata"]["name"], DIGEST_B, at=T0 + timedelta(seconds=30))
    cluster.succeed_job(
        serving["metadata"]["name"], built_with_agreement(low_at_build), T0 + timedelta(seconds=60)
    )
    cluster.reconcile(T0 + timedelta(seconds=61))
    annotations = cluster.get("ConfigMap", names.runtime_name(OWNER))["metadata"]["annotations"]
    assert json.loads(annotations[ANNOTATION_AGREEMENT]) == {
        "rows": 2000,
        "agreements": 1960,
        "byClass": low_at_build,
    }
    for job in cluster.jobs():  # the Jobs' TTL passed: the ConfigMap still says it
        cluster.delete("Job", job["metadata"]["name"])
    cluster.roll_out()
    cluster.roll_out(name=REFERENCE)
    cluster.reconcile(T0 + timedelta(seconds=62))
    # Live, class 7 agrees as it did at build time: below the floor, yet no drift.
    cluster.quality = reading((2000, 1950), **{"7": (400, 296)})
    cluster.reconcile(T0 + timedelta(minutes=5))
    assert cluster.status.quality_watch.state == QualityState.HEALTHY
    assert cluster.status.quality_watch.worst_class.threshold < 0.75
    # Well below its build figure: drift.
    cluster.quality = reading((2000, 1900), **{"7": (400, 200)})
    cluster.reconcile(T0 + timedelta(minutes=6))
    assert cluster.condition(ConditionType.DEGRADED).reason == Reason.QUALITY_DRIFT


def test_without_a_build_agreement_the_floors_alone_judge():
    cluster = Cluster(watched(minSamples=100, minClassAgreement=0.9), name=OWNER)
    watching(cluster)
    cluster.quality = reading((2000, 1950), **{"7": (400, 296)})
    cluster.reconcile(T0 + timedelta(minutes=5))
    assert cluster.condition(ConditionType.DEGRADED).reason == Reason.QUALITY_DRIFT
    assert cluster.status.quality_watch.worst_class.threshold == 0.9


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"rows": 10, "agreements": 9}, BuildAgreement(10, 9)),
        (
            {"rows": 10, "agreements": 9, "byClass": {"1": [4, 4], "2": [6, 5]}},
            BuildAgreement(10, 9, {"1": (4, 4), "2": (6, 5)}),
        ),
        # A class entry that makes no sense is left out (it falls back to the overall).
        (
            {"rows": 10, "agreements": 9, "byClass": {"1": [4, 5], "2": "x", "3": [0, 0]}},
            BuildAgreement(10, 9),
        ),
        ({"rows": 10, "agreements": 11}, None),
        ({"rows": 0, "agreements": 0}, None),
        ({"rows": "10", "agreements": 9}, None),
        ({"rows": True, "agreements": 0}, None),
        ([10, 9], None),
        (None, None),
    ],
)
def test_a_build_agreement_is_read_only_when_it_makes_sense(document, expected):
    assert parse_build_agreement(document) == expected


def test_readings_set_aside_and_a_young_window_are_said_in_the_status():
    cluster = Cluster(watched(minSamples=100, windowSeconds=600), name=OWNER)
    watching(cluster)
    cluster.quality = QualityReading(
        WindowTallies(AgreementTally(2000, 1990)),
        covered_seconds=120,
        set_aside=("Class 9: 5 agreements out of 3 rows make no sense; set aside.",),
    )
    cluster.reconcile(T0 + timedelta(minutes=5))
    message = cluster.status.quality_watch.message
    assert "Class 9: 5 agreements out of 3 rows make no sense; set aside." in message
    assert "The counts cover 120 s of the 600 s window so far." in message
