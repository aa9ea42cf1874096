"""The InferenceDeployment's status says what the build found of whether the model batches:
`status.engine.batching` (batches, the maxBatchSize the runtime serves with, why) and
EngineReady's message, read from the build Job's termination message and kept after the
Job is gone (the runtime ConfigMap's annotation, then the status itself). The operator
never writes the spec: runtime.batching.maxBatchSize stays what the user set.

Driven pass by pass through `decide` over `decide_scenarios.Cluster`, as the other
decision tests are.
"""

from __future__ import annotations

import json
from datetime import timedelta

from decide_scenarios import DIGEST_A, T0, Cluster, make_spec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType
from kubeinfer.operator.state.build_attempt import BatchingFinding, parse_batching
from kubeinfer.operator.state.engine_state import ANNOTATION_BATCHING

ENGINE = ConditionType.ENGINE_READY
WHY = "output 'logits' has 1 rows for a run of 2 different rows"


def _built(batching: dict, max_batch_size: int = 8) -> Cluster:
    cluster = Cluster(
        make_spec(
            engine={"maxBatchSize": 16}, runtime={"batching": {"maxBatchSize": max_batch_size}}
        )
    )
    cluster.reconcile()
    (job,) = cluster.jobs()
    message = json.dumps({"digest": DIGEST_A, "cacheHit": False, **batching})
    cluster.succeed_job(job["metadata"]["name"], message, at=T0 + timedelta(seconds=30))
    cluster.reconcile(T0 + timedelta(seconds=31))
    return cluster


def test_a_model_that_does_not_batch_is_reported_with_max_batch_size_1_in_effect() -> None:
    cluster = _built({"batches": False, "batchingReason": WHY})
    batching = cluster.status.engine.batching
    assert (batching.batches, batching.max_batch_size, batching.reason) == (False, 1, WHY)
    condition = cluster.condition(ENGINE)
    assert condition.status == ConditionStatus.TRUE
    assert (
        f"The model does not batch ({WHY}): the runtime serves it one request per run, "
        "maxBatchSize 1 in effect; runtime.batching.maxBatchSize 8 is set aside."
    ) in condition.message
    assert cluster.spec.runtime.batching.max_batch_size == 8  # the spec is the user's


def test_a_model_that_batches_keeps_the_spec_s_max_batch_size_and_says_nothing_more() -> None:
    cluster = _built({"batches": True})
    batching = cluster.status.engine.batching
    assert (batching.batches, batching.max_batch_size, batching.reason) == (True, 8, "")
    assert "batch" not in cluster.condition(ENGINE).message.split(".", 1)[1]


def test_a_model_not_probed_at_build_is_left_to_the_runtime() -> None:
    why = "not probed at build: the model's variable input axes take their ranges from ..."
    cluster = _built({"batches": None, "batchingReason": why})
    batching = cluster.status.engine.batching
    assert (batching.batches, batching.max_batch_size) == (None, None)
    assert f"Whether the model batches was not found out at build ({why})" in (
        cluster.condition(ENGINE).message
    )


def test_a_build_that_says_nothing_of_it_leaves_it_unset() -> None:
    cluster = _built({})
    assert cluster.status.engine.batching is None
    assert "batch" not in cluster.condition(ENGINE).message.split(".", 1)[1]


def test_the_finding_outlives_the_build_job_and_then_the_configmap() -> None:
    cluster = _built({"batches": False, "batchingReason": WHY})
    annotations = cluster.get("ConfigMap")["metadata"]["annotations"]
    assert parse_batching(json.loads(annotations[ANNOTATION_BATCHING])) == BatchingFinding(
        False, WHY
    )
    before = cluster.status.engine.batching
    (job,) = cluster.jobs()
    cluster.delete("Job", job["metadata"]["name"])
    cluster.pods.clear()
    cluster.reconcile(T0 + timedelta(days=2))
    assert cluster.status.engine.batching == before
    cluster.delete("ConfigMap", cluster.get("ConfigMap")["metadata"]["name"])
    cluster.reconcile(T0 + timedelta(days=3))
    assert cluster.status.engine.batching == before
    assert "maxBatchSize 1 in effect" in cluster.condition(ENGINE).message


def test_termination_messages_that_are_not_a_finding_are_ignored() -> None:
    assert parse_batching({"batches": "no"}) is None
    assert parse_batching({"digest": DIGEST_A}) is None
    assert parse_batching({"batches": False, "batchingReason": 3}) == BatchingFinding(False, "")
    long = parse_batching({"batches": False, "batchingReason": "x" * 5000})
    assert long is not None and len(long.reason) == 1024
