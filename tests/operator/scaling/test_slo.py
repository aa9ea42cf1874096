"""The latency objective: the pure report (`reconcile.slo_status`: status.slo and the
SLOMet condition), the autoscaler's SLO signal (`scaling.signals.slo_proposal`: HPA's
ratio, only pushing up, once the miss lasted), and both through the pure decision, pass
by pass (`decide_scenarios.Cluster`)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from decide_scenarios import T0, Cluster, make_spec
from kubeinfer.operator.api.v1alpha1.autoscaling import AutoscalingSpec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType, Reason
from kubeinfer.operator.api.v1alpha1.inference_deployment import SloSpec
from kubeinfer.operator.reconcile.slo_status import slo_report
from kubeinfer.operator.scaling.signals import SLO_MISS, slo_proposal
from kubeinfer.operator.state.scaling_inputs import ScalingSignals, ServingPods, SloMiss

TRUE, FALSE, UNKNOWN = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN
OBJECTIVE = SloSpec(p99_latency_milliseconds=50)


def read(p99_ms: float | None, window: int | None = 120, error: str = "") -> ScalingSignals:
    return ScalingSignals(
        p99_seconds=None if p99_ms is None else p99_ms / 1e3,
        p99_window_seconds=window,
        error=error,
    )


def test_without_an_objective_there_is_no_report() -> None:
    assert slo_report(SloSpec(), read(80), None, T0) is None


@pytest.mark.parametrize(
    ("signals", "condition", "says"),
    [
        (read(12.5), (TRUE, Reason.SLO_MET), "Met: p99 12.5 ms over the last 120 s, objective"),
        (read(50), (TRUE, Reason.SLO_MET), "Met: p99 50 ms"),
        (read(80), (FALSE, Reason.SLO_MISSED), "Missed: p99 80 ms over the last 120 s"),
        (read(80, None), (FALSE, Reason.SLO_MISSED), "since the serving pods started"),
        (read(None), (UNKNOWN, Reason.SLO_UNMEASURED), "no request was answered"),
        (read(None, error="refused"), (UNKNOWN, Reason.SLO_UNMEASURED), "could not be read"),
        (None, (UNKNOWN, Reason.SLO_UNMEASURED), "the metrics were not read"),
    ],
)
def test_the_p99_against_the_objective(signals, condition, says) -> None:
    report = slo_report(OBJECTIVE, signals, None, T0)
    assert report is not None
    assert report.condition[:2] == condition
    assert says in report.condition[2]
    assert report.status.objective_p99_milliseconds == 50
    assert report.status.last_evaluated == T0


def test_a_miss_keeps_when_it_began_through_unread_passes_and_ends_on_a_met_reading() -> None:
    first = slo_report(OBJECTIVE, read(80), None, T0)
    assert first.status.missed_since == T0 and first.missed_for_seconds == 0
    later = slo_report(OBJECTIVE, read(90), first.status, T0 + timedelta(seconds=45))
    assert later.status.missed_since == T0 and later.missed_for_seconds == 45
    unread = slo_report(OBJECTIVE, read(None, error="down"), later.status, T0 + timedelta(60))
    assert unread.status.missed_since == T0 and unread.missed_for_seconds is None
    met = slo_report(OBJECTIVE, read(20), unread.status, T0 + timedelta(seconds=90))
    assert met.status.met is True and met.status.missed_since is None
    again = slo_report(OBJECTIVE, read(80), met.status, T0 + timedelta(seconds=120))
    assert again.status.missed_since == T0 + timedelta(seconds=120)
    # A new objective is a new question: the clock starts again.
    other = SloSpec(p99_latency_milliseconds=60)
    moved = slo_report(other, read(80), again.status, T0 + timedelta(seconds=150))
    assert moved.status.missed_since == T0 + timedelta(seconds=150)


AFTER = AutoscalingSpec(enabled=True, scale_up_on_slo_miss_after_seconds=60, tolerance=0.1)
PODS = ServingPods(desired=3, ready=3, starting=0)


@pytest.mark.parametrize(
    ("p99_ms", "missed_for", "replicas", "says"),
    [
        (100, 30, None, "not yet missed for scaleUpOnSloMissAfterSeconds 60"),
        (54, 60, 3, "keeps at least 3 pods"),  # within tolerance: the count holds
        (100, 60, 6, "calls for at least 6 pods"),  # ceil(3 x 100 / 50)
        (60, 600, 4, "calls for at least 4 pods"),  # ceil(3 x 1.2) = 4 = 3 + 1
        (56, 600, 4, "calls for at least 4 pods"),  # ceil(3 x 1.12) = 4
    ],
)
def test_a_sustained_miss_only_pushes_up(p99_ms, missed_for, replicas, says) -> None:
    proposal = slo_proposal(AFTER, SloMiss(p99_ms / 1e3, 0.05, missed_for), PODS)
    assert (proposal.signal, proposal.replicas) == (SLO_MISS, replicas)
    assert says in proposal.message


# -- through the decision --------------------------------------------------------------------


def cluster_with(**spec: object) -> Cluster:
    cluster = Cluster(make_spec(slo={"p99LatencyMilliseconds": 50}, **spec))
    cluster.build_to_ready()
    return cluster


def test_the_status_reports_the_objective_without_autoscaling_and_warns_on_a_miss() -> None:
    cluster = cluster_with()
    cluster.signals = read(20)
    cluster.reconcile(T0 + timedelta(minutes=1))
    met = cluster.condition(ConditionType.SLO_MET)
    assert (met.status, met.reason) == (TRUE, Reason.SLO_MET)
    assert cluster.status.slo.p99_milliseconds == 20 and cluster.status.slo.met
    cluster.signals = read(75)
    decision = cluster.reconcile(T0 + timedelta(minutes=2))
    missed = cluster.condition(ConditionType.SLO_MET)
    assert (missed.status, missed.reason) == (FALSE, Reason.SLO_MISSED)
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", Reason.SLO_MISSED)]
    # A miss is no failure of the object: Ready and Degraded are untouched.
    assert cluster.condition(ConditionType.READY).status == TRUE
    assert cluster.condition(ConditionType.DEGRADED).status == FALSE
    cluster.update_spec(make_spec())
    cluster.reconcile(T0 + timedelta(minutes=3))
    assert cluster.status.slo is None
    assert ConditionType.SLO_MET not in {c.type for c in cluster.status.conditions}


def test_the_autoscaler_scales_up_on_a_miss_that_lasted_since_the_count_last_changed() -> None:
    cluster = cluster_with(
        autoscaling={
            "enabled": True, "maxReplicas": 8, "targetRequestsInProgressPerReplica": 4,
            "scaleUpOnSloMissAfterSeconds": 60,
        },
    )  # fmt: skip

    def missing(at_seconds: int) -> int:
        cluster.signals = ScalingSignals(
            requests_in_progress_per_replica=4, p99_seconds=0.1, p99_window_seconds=120
        )
        replicas = cluster.get("Deployment")["spec"]["replicas"]
        cluster.serving_pods = ServingPods(desired=replicas, ready=replicas, starting=0)
        cluster.reconcile(T0 + timedelta(seconds=at_seconds))
        return int(cluster.get("Deployment")["spec"]["replicas"])

    assert missing(600) == 1, "the queue is on target; the miss has only begun"
    assert missing(630) == 1
    assert missing(660) == 2, "missed for 60 s: ceil(1 x 100 / 50)"
    active = cluster.condition(ConditionType.SCALING_ACTIVE)
    assert "p99 100 ms (objective 50 ms) missed for" in active.message
    assert cluster.status.autoscaling.last_scale_time == T0 + timedelta(seconds=660)
    assert missing(690) == 2, "the p99 lags the new pod: the clock runs from the change"
    assert missing(720) == 4


def test_beyond_tolerance_a_miss_adds_a_pod_even_when_the_ready_ones_call_for_no_more() -> None:
    starting = ServingPods(desired=3, ready=2, starting=1)
    proposal = slo_proposal(AFTER, SloMiss(0.06, 0.05, 600), starting)
    assert proposal.replicas == 4, "ceil(2 x 1.2) = 3 is the count set now: one more"
