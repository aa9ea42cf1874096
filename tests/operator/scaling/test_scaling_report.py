"""What a recommendation writes to the status and the Events (`scaling_report`), field by
field: the Event for a change of the count (its type, reason and message), lastScaleTime
kept across passes that change nothing, the load figures with the time they were read and
their rounding (so a figure moving in its tenth decimal does not make every pass write the
status), and the measured startup. The pass-by-pass wiring is in test_decide_scaling.py."""

from __future__ import annotations

from datetime import timedelta

from decide_scenarios import T0, make_spec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, Reason
from kubeinfer.operator.api.v1alpha1.status import AutoscalingStatus, MetricsStatus
from kubeinfer.operator.reconcile.scaling_status import scaling_report
from kubeinfer.operator.state.decision import Event
from kubeinfer.operator.state.scaling_inputs import Recommendation, ScalingSignals, ServingPods

SPEC = make_spec(autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": 6})
ACTIVE = (
    ConditionStatus.TRUE,
    Reason.VALID_METRIC_FOUND,
    "Requests in progress per replica 2 (target 8) calls for 1 pod.",
)
WITHIN = (ConditionStatus.FALSE, Reason.DESIRED_WITHIN_RANGE, "2 pods, within ...")
EARLIER = T0 - timedelta(minutes=10)


def recommended(replicas: int, desired: int | None = None) -> Recommendation:
    return Recommendation(
        replicas,
        replicas if desired is None else desired,
        "requestsInProgressPerReplica",
        ACTIVE,
        WITHIN,
    )


def test_a_scale_down_is_a_normal_scaled_down_event_naming_the_counts_and_why():
    report = scaling_report(
        SPEC, recommended(2, 1), ScalingSignals(2), ServingPods(4, 4, 0), None, None, T0
    )
    assert report.events == (
        Event(
            "Normal",
            Reason.SCALED_DOWN,
            "Scaled the runtime from 4 to 2 pods (requestsInProgressPerReplica): Requests in "
            "progress per replica 2 (target 8) calls for 1 pod.",
        ),
    )
    assert report.autoscaling.last_scale_time == T0


def test_a_pass_that_changes_nothing_keeps_the_last_scale_time():
    previous = AutoscalingStatus(desired_replicas=4, last_scale_time=EARLIER)
    report = scaling_report(
        SPEC, recommended(4), ScalingSignals(8), ServingPods(4, 4, 0), previous, None, T0
    )
    assert report.events == ()
    assert report.autoscaling.last_scale_time == EARLIER


def test_the_figures_are_written_rounded_with_when_they_were_read():
    # Three decimals for the load figures, one for the startup (p99 read in seconds,
    # written in milliseconds).
    signals = ScalingSignals(12.34567, 0.93219, 0.01234567)
    pods = ServingPods(4, 4, 0, startup_seconds=20.4321)
    report = scaling_report(SPEC, recommended(4), signals, pods, None, None, T0)
    assert report.metrics == MetricsStatus(
        requests_in_progress_per_replica=12.346,
        gpu_memory_used_ratio=0.932,
        p99_milliseconds=12.346,
        read_time=T0,
    )
    assert report.autoscaling.pod_startup_seconds == 20.4


def test_the_same_figures_read_again_keep_the_status_as_it_was():
    # An idle autoscaled object writes nothing: the time alone is no change.
    signals = ScalingSignals(2.0, 0.5, 0.02)
    pods = ServingPods(4, 4, 0)
    first = scaling_report(SPEC, recommended(4), signals, pods, None, None, EARLIER).metrics
    again = scaling_report(SPEC, recommended(4), signals, pods, None, first, T0).metrics
    assert again is first and again is not None and again.read_time == EARLIER
    moved = ScalingSignals(2.5, 0.5, 0.02)
    changed = scaling_report(SPEC, recommended(4), moved, pods, None, first, T0).metrics
    assert changed is not None and changed.read_time == T0
    assert changed.requests_in_progress_per_replica == 2.5
