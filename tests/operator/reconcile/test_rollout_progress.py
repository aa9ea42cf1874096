"""How far the serving Deployment is from the desired one (`rollout_progress`), how the
runtime pods' failures are chosen and told (`runtime_failure`), and how condition
transitions become Events (`transition_events`): pure functions, table-tested at their
edges. Added for mutation testing (issue 11, item 6), where each edge survived."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kubeinfer.operator.api.v1alpha1.conditions import (
    Condition,
    ConditionStatus,
    ConditionType,
    Reason,
)
from kubeinfer.operator.reconcile.events import EVENT_MESSAGE_LIMIT, transition_events
from kubeinfer.operator.reconcile.rollout_progress import RolloutProgress, rollout_progress
from kubeinfer.operator.state import names
from kubeinfer.operator.state.runtime_failures import runtime_failure

HASHED = {"annotations": {names.ANNOTATION_INPUT_HASH: "h1"}}


def deployment(generation=2, conditions=(), **status) -> dict:
    metadata = {"name": "demo-runtime", **HASHED}
    if generation is not None:
        metadata["generation"] = generation
    return {"metadata": metadata, "status": {**status, "conditions": list(conditions)}}


DONE = {
    "observedGeneration": 2,
    "replicas": 3,
    "updatedReplicas": 3,
    "readyReplicas": 3,
    "availableReplicas": 3,
}
DESIRED = {"metadata": {"name": "demo-runtime", **HASHED}}


def test_no_desired_deployment_is_nothing_yet():
    assert rollout_progress(deployment(**DONE), None, 3) == RolloutProgress(
        False, False, False, False, 0, "the Deployment does not exist yet"
    )


def test_a_new_deployment_reads_the_same_until_a_pod_is_ready():
    """The pass that creates the Deployment, the one that sees it appear and the ones that
    see its controller count the first pods all say the same, so only the first of them
    writes the status; a pod becoming ready is news."""
    counted = {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3}
    seen = deployment(observedGeneration=2)
    progresses = {
        rollout_progress(observed, DESIRED, 3)
        for observed in (None, deployment(), seen, deployment(**counted))
    }
    assert progresses == {
        RolloutProgress(True, False, False, False, 0, "Deployment demo-runtime: 0 of 3 pods ready")
    }
    one_ready = rollout_progress(deployment(**counted, readyReplicas=1), DESIRED, 3)
    assert one_ready.message == "Deployment demo-runtime: 1 of 3 pods ready"


def test_the_updated_pods_are_named_while_old_ones_are_left():
    rolling = {**DONE, "replicas": 4, "updatedReplicas": 1}
    assert rollout_progress(deployment(**rolling), DESIRED, 3).message == (
        "Deployment demo-runtime: 1 of 3 pods updated, 3 ready"
    )


@pytest.mark.parametrize(
    ("observed", "complete", "available"),
    [
        (deployment(**DONE), True, True),
        (deployment(generation=None, **DONE), True, True),  # no generation: nothing to wait for
        (deployment(**{**DONE, "observedGeneration": 1}), False, True),
        (deployment(**{k: v for k, v in DONE.items() if k != "observedGeneration"}), False, True),
        (deployment(**{**DONE, "replicas": 4}), False, True),  # an old pod is left
        (deployment(**{**DONE, "updatedReplicas": 2}), False, True),
        (deployment(**{**DONE, "readyReplicas": 2}), False, True),
        (deployment(**{**DONE, "availableReplicas": 2}), False, True),  # the others serve
        (deployment(**{**DONE, "readyReplicas": 0, "availableReplicas": 0}), False, False),
        (deployment(**{k: v for k, v in DONE.items() if k != "replicas"}), False, True),
        (deployment(**{k: v for k, v in DONE.items() if k != "updatedReplicas"}), False, True),
        (  # the controller's Available condition (all pods, with maxUnavailable 0) is not
            # what Available means here: a pod lost, the others serve
            deployment(
                conditions=[{"type": "Available", "status": "False"}],
                **{**DONE, "readyReplicas": 2, "availableReplicas": 2},
            ),
            False,
            True,
        ),
    ],
    ids=[
        "done",
        "no generation",
        "older generation",
        "generation not observed",
        "old pod left",
        "not all updated",
        "not all ready",
        "not all available",
        "none available",
        "no replica count",
        "no updated count",
        "the controller's Available condition",
    ],
)
def test_complete_only_when_every_pod_is_updated_ready_and_available(observed, complete, available):
    progress = rollout_progress(observed, DESIRED, 3)
    assert (progress.exists, progress.complete, progress.available) == (True, complete, available)
    assert progress.message.startswith("Deployment demo-runtime: ")


def test_pods_not_ready_after_the_rollout_are_being_replaced_not_rolled():
    rolled = [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]
    rolling = [{"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}]
    lost = {**DONE, "readyReplicas": 2, "availableReplicas": 2}
    assert rollout_progress(deployment(conditions=rolled, **lost), DESIRED, 3).replacing
    assert not rollout_progress(deployment(conditions=rolling, **lost), DESIRED, 3).replacing
    assert not rollout_progress(deployment(conditions=rolled, **DONE), DESIRED, 3).replacing
    other = {"metadata": {"name": "demo-runtime", "annotations": {}}}  # a new template
    assert not rollout_progress(deployment(conditions=rolled, **lost), other, 3).replacing


def test_one_replica_is_not_complete_on_missing_counts():
    one = {"observedGeneration": 1, "updatedReplicas": 1, "readyReplicas": 1}
    one["availableReplicas"] = 1
    assert not rollout_progress(deployment(generation=1, **one), DESIRED, 1).complete
    del one["observedGeneration"]
    one["replicas"] = 1
    assert not rollout_progress(deployment(generation=1, **one), DESIRED, 1).complete
    one["observedGeneration"] = 1
    assert rollout_progress(deployment(generation=1, **one), DESIRED, 1).complete


def test_another_input_hash_is_not_complete():
    other = {"metadata": {"name": "demo-runtime", "annotations": {}}}
    assert not rollout_progress(deployment(**DONE), other, 3).complete


def test_a_deadline_exceeded_is_stalled_and_says_the_controllers_words():
    stuck = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
    said = {**stuck, "message": 'ReplicaSet "x" has timed out progressing.'}
    for condition, words in ((said, said["message"]), (stuck, "progress deadline exceeded")):
        progress = rollout_progress(deployment(conditions=[condition], readyReplicas=1), DESIRED, 3)
        assert progress.stalled and progress.ready_replicas == 1
        assert progress.message == f"Deployment demo-runtime: 1 of 3 pods ready; {words}"


# -- runtime pods' failures --------------------------------------------------------------


def failing_pod(name: str | None, code: int, digest: str | None = None, **meta) -> dict:
    metadata = {**meta}
    if name is not None:
        metadata["name"] = name
    if digest:
        metadata["annotations"] = {names.ANNOTATION_ENGINE_DIGEST: digest}
    terminated = {"exitCode": code, "message": f"exit {code}"}
    return {
        "metadata": metadata,
        "status": {
            "containerStatuses": [{"name": "runtime", "lastState": {"terminated": terminated}}]
        },
    }


def test_an_incompatible_engine_is_told_first_then_the_first_pod_by_name():
    pods = [failing_pod("b", 1), failing_pod("c", 3), failing_pod("a", 1), failing_pod("d", 3)]
    failure = runtime_failure(pods)
    assert failure.reason == Reason.ENGINE_INCOMPATIBLE
    assert failure.message.startswith("The runtime pod c cannot start:")
    assert failure.message.count(" 4 runtime pods are failing.") == 1
    assert "runtime.image builds the engine again" in failure.message
    failure = runtime_failure([failing_pod("b", 1), failing_pod("a", 2)], "shadow candidate")
    assert failure.reason == Reason.RUNTIME_FAILING
    assert failure.message.startswith("The shadow candidate pod a cannot start:")
    assert "2 shadow candidate pods are failing." in failure.message
    assert "runtime.image" not in failure.message


def test_one_failing_pod_says_nothing_of_others_and_names_its_engine_when_known():
    failure = runtime_failure([failing_pod("a", 1, digest="sha256:" + "a" * 64)])
    assert failure.message.startswith(f"The runtime pod a (engine sha256:{'a' * 64}) cannot")
    assert "pods are failing" not in failure.message
    assert failure.message.endswith("exit 1.")
    unnamed = runtime_failure([failing_pod(None, 1)])
    assert unnamed.message.startswith("The runtime pod  cannot start:")


def test_terminating_pods_and_other_engines_pods_are_passed_over():
    terminating = failing_pod("a", 3, deletionTimestamp="2026-01-01T00:00:00Z")
    other = failing_pod("b", 3, digest="sha256:" + "b" * 64)
    mine = failing_pod("c", 1, digest="sha256:" + "c" * 64)
    failure = runtime_failure([terminating, other, mine], digest="sha256:" + "c" * 64)
    assert failure.reason == Reason.RUNTIME_FAILING
    assert failure.message.startswith("The runtime pod c (engine")
    assert runtime_failure([terminating]) is None


# -- condition transitions as Events --------------------------------------------------


def condition(message: str) -> Condition:
    return Condition(
        type=ConditionType.READY,
        status=ConditionStatus.FALSE,
        reason="Waiting",
        message=message,
        last_transition_time=datetime(2026, 1, 1, tzinfo=UTC),
    )


def test_an_event_message_is_cut_to_the_limit_and_says_so():
    prefix = "Ready is False: "
    fits = "x" * (EVENT_MESSAGE_LIMIT - len(prefix))
    (event,) = transition_events([], [condition(fits)])
    assert event.message == prefix + fits
    (event,) = transition_events([], [condition(fits + "yz")])
    assert len(event.message) == EVENT_MESSAGE_LIMIT
    assert event.message == (prefix + fits)[: EVENT_MESSAGE_LIMIT - 3] + "..."
