"""One build Job attempt's state machine (`state.build_attempt.attempt_state`), walked
transition by transition: running until a condition is True; Complete with a pod that
reported a digest is Succeeded; Complete without one awaits the pod's report for the
grace and is then Failed (NoDigest); Failed says why in the Job's and the build's words
and when. Also which pods are a Job's, its attempt number, and when it has finished.
Pure: Jobs and pods as the API server returns them, no cluster."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubeinfer.operator.state import names
from kubeinfer.operator.state.build_attempt import (
    FAILURE_REPORT_LIMIT,
    MISSING_MESSAGE_GRACE,
    AttemptPhase,
    AttemptState,
    BuildReport,
    attempt_number,
    attempt_state,
    finished,
    pods_of,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
DIGEST = "sha256:" + "c" * 64
JOB = "demo-build-0123456789-1"
REPORT = f'{{"digest": "{DIGEST}", "target": "sm_90", "inputBytesPerRow": 64}}'


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def job(*conditions: dict, **status: object) -> dict:
    return {"metadata": {"name": JOB}, "status": {**status, "conditions": list(conditions)}}


def complete(at: datetime | None = NOW - timedelta(seconds=5)) -> dict:
    times = {} if at is None else {"completionTime": stamp(at)}
    return job({"type": "Complete", "status": "True"}, **times)


def failed(reason: str | None = "BackoffLimitExceeded", **more: object) -> dict:
    condition = {"type": "Failed", "status": "True", "message": "Job has reached the limit"}
    if reason is not None:
        condition["reason"] = reason
    return job({**condition, **more}, startTime=stamp(NOW - timedelta(minutes=9)))


def pod(exit_code: int, message: str, container: str = "build") -> dict:
    terminated = {"exitCode": exit_code, "message": message}
    return {
        "metadata": {"name": f"{JOB}-x", "labels": {"batch.kubernetes.io/job-name": JOB}},
        "status": {"containerStatuses": [{"name": container, "state": {"terminated": terminated}}]},
    }


SUCCEEDED = AttemptState(AttemptPhase.SUCCEEDED, report=BuildReport(DIGEST, "sm_90", 64))
AWAITING = AttemptState(AttemptPhase.AWAITING_REPORT)
NO_DIGEST = (
    "NoDigest: the build Job completed but no pod reported an engine digest in its "
    "termination message"
)
LIMIT = "BackoffLimitExceeded: Job has reached the limit"
FAILED_AT = NOW - timedelta(minutes=1)


@pytest.mark.parametrize(
    ("job_", "pods", "now", "expected"),
    [
        # Running: no condition yet, or none that is True.
        (job(), [], NOW, AttemptState(AttemptPhase.RUNNING)),
        (
            job({"type": "Complete", "status": "False"}),
            [pod(0, REPORT)],
            NOW,
            AttemptState(AttemptPhase.RUNNING),
        ),
        (job({"type": "Failed", "status": "False"}), [], NOW, AttemptState(AttemptPhase.RUNNING)),
        # Complete, and the pod reported its engine: Succeeded.
        (complete(), [pod(0, REPORT)], NOW, SUCCEEDED),
        (
            complete(),
            [pod(0, f"built {DIGEST}")],
            NOW,
            AttemptState(AttemptPhase.SUCCEEDED, report=BuildReport(DIGEST)),
        ),
        (complete(), [pod(1, REPORT), pod(0, REPORT)], NOW, SUCCEEDED),  # a retried pod's
        # Complete, no report yet: the pod may trail the Job, for the grace.
        (complete(), [], NOW, AWAITING),
        (complete(), [pod(1, REPORT)], NOW, AWAITING),  # a failed container reports nothing
        (complete(), [pod(0, "no digest here")], NOW, AWAITING),
        (complete(), [pod(0, REPORT, container="istio-proxy")], NOW, AWAITING),
        (complete(at=None), [], NOW + timedelta(days=1), AWAITING),  # no time, no deadline
        (complete(NOW - MISSING_MESSAGE_GRACE + timedelta(seconds=1)), [], NOW, AWAITING),
        # ...then Failed, from the end of the grace.
        (
            complete(NOW - MISSING_MESSAGE_GRACE),
            [],
            NOW,
            AttemptState(AttemptPhase.FAILED, failure=NO_DIGEST, failed_at=NOW),
        ),
        # Failed: the Job's reason and message, and when.
        (
            failed(lastTransitionTime=stamp(FAILED_AT)),
            [],
            NOW,
            AttemptState(AttemptPhase.FAILED, failure=LIMIT, failed_at=FAILED_AT),
        ),
        (
            failed(),  # no transition time: when it started
            [],
            NOW,
            AttemptState(AttemptPhase.FAILED, failure=LIMIT, failed_at=NOW - timedelta(minutes=9)),
        ),
        (
            job({"type": "Failed", "status": "True"}),  # the Job says nothing
            [],
            NOW,
            AttemptState(AttemptPhase.FAILED, failure="Failed: the build Job failed"),
        ),
        (
            failed(reason=None, lastTransitionTime="yesterday"),
            [],
            NOW,
            AttemptState(
                AttemptPhase.FAILED,
                failure="Failed: Job has reached the limit",
                failed_at=NOW - timedelta(minutes=9),
            ),
        ),
    ],
)
def test_an_attempt_moves_from_running_to_succeeded_or_failed(job_, pods, now, expected):
    assert attempt_state(job_, pods, now) == expected


def test_a_complete_job_wins_over_a_failed_condition():
    both = job({"type": "Failed", "status": "True"}, {"type": "Complete", "status": "True"})
    assert attempt_state(both, [pod(0, REPORT)], NOW) == SUCCEEDED


@pytest.mark.parametrize(
    ("pods", "failure"),
    [
        ([pod(1, "  CUDA out of memory \n")], f"{LIMIT}; the build reported: CUDA out of memory"),
        ([pod(1, "first"), pod(2, "last")], f"{LIMIT}; the build reported: last"),
        ([pod(1, "said"), pod(0, "fine")], f"{LIMIT}; the build reported: said"),  # exit 0: no
        ([pod(1, "said", container="sidecar")], LIMIT),
        ([pod(1, "   ")], LIMIT),
        ([pod(1, "x" * (FAILURE_REPORT_LIMIT + 5))], f"{LIMIT}; the build reported: {'x' * 2000}"),
    ],
)
def test_a_failed_attempt_adds_what_the_build_said_last(pods, failure):
    state = attempt_state(failed(lastTransitionTime=stamp(FAILED_AT)), pods, NOW)
    assert (state.phase, state.failure) == (AttemptPhase.FAILED, failure)


def test_a_jobs_pods_are_found_by_either_job_label_or_their_owner():
    def named(name: str, labels: dict | None = None, owner: str | None = None) -> dict:
        meta: dict = {"name": name, "labels": labels or {}}
        if owner:
            meta["ownerReferences"] = [{"kind": "Job", "name": owner}]
        return {"metadata": meta}

    pods = [
        named("new-label", {"batch.kubernetes.io/job-name": JOB}),
        named("old-label", {"job-name": JOB}),
        named("owned", owner=JOB),
        named("another", {"batch.kubernetes.io/job-name": "other"}, owner="other"),
        {"metadata": {}},
    ]
    assert [p["metadata"]["name"] for p in pods_of(JOB, pods)] == [
        "new-label",
        "old-label",
        "owned",
    ]


@pytest.mark.parametrize(
    ("labels", "attempt"),
    [({names.LABEL_BUILD_ATTEMPT: "3"}, 3), ({names.LABEL_BUILD_ATTEMPT: "x"}, 0), ({}, 0)],
)
def test_the_attempt_number_is_read_from_its_label(labels, attempt):
    assert attempt_number({"metadata": {"labels": labels}}) == attempt


def test_a_job_has_finished_once_complete_or_failed():
    assert [finished(j) for j in (job(), complete(), failed())] == [False, True, True]
