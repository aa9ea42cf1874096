"""A Pending candidate's verdict for one pass (`rollout.shadow.pending_verdict`), as a
table: pods that cannot load the engine fail it before anything else (a manual promotion
included); the manual gate comes before the thresholds; a verdict still Pending says why
the reading or the pods fell short."""

from __future__ import annotations

from datetime import timedelta

import pytest
from decide_scenarios import DIGEST_B, T0, make_spec
from kubeinfer.operator.api.v1alpha1.conditions import Reason
from kubeinfer.operator.api.v1alpha1.enums import ShadowVerdict
from kubeinfer.operator.api.v1alpha1.status import CandidateStatus
from kubeinfer.operator.rollout.shadow import GATE_ANNOTATION, pending_verdict
from kubeinfer.operator.state import names
from kubeinfer.operator.state.shadow_readings import ShadowAggregates, ShadowReading

SPEC = make_spec(
    rollout={"strategy": "Shadow", "shadow": {"minSamples": 50, "maxDurationSeconds": 600}}
)
PENDING = CandidateStatus(
    version="2",
    engine_digest=DIGEST_B,
    verdict=ShadowVerdict.PENDING,
    reason=Reason.SHADOW_RUNNING,
    start_time=T0,
)
GOOD = ShadowAggregates(
    compared=60, max_abs_difference=0.0, top1_rows=60, top1_agreements=60,
    serving_p99_seconds=0.01, candidate_p99_seconds=0.01,
)  # fmt: skip
FEW = ShadowAggregates(compared=3, max_abs_difference=0.0)
PROMOTE = {GATE_ANNOTATION: f"promote {DIGEST_B}"}


def pod(exit_code: int) -> dict:
    return {
        "metadata": {"name": "demo-candidate-x", "annotations": {
            names.ANNOTATION_ENGINE_DIGEST: DIGEST_B
        }},
        "status": {"containerStatuses": [{
            "name": "runtime", "ready": False,
            "lastState": {"terminated": {"exitCode": exit_code, "message": "no"}},
        }]},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("annotations", "reading", "pods", "outcome", "reason", "says"),
    [
        ({}, ShadowReading(GOOD), (), ShadowVerdict.PASSED, None, None),
        ({}, ShadowReading(FEW), (), ShadowVerdict.PENDING, None, None),
        (PROMOTE, ShadowReading(FEW), (), ShadowVerdict.PASSED, Reason.MANUAL_PROMOTION, None),
        (PROMOTE, ShadowReading(GOOD), (pod(3),), ShadowVerdict.FAILED,
         Reason.ENGINE_INCOMPATIBLE, "code 3"),
        ({}, ShadowReading(None, "Prometheus did not answer."), (), ShadowVerdict.PENDING,
         None, " Prometheus did not answer."),
        ({}, ShadowReading(FEW, "Late."), (pod(1),), ShadowVerdict.PENDING, None,
         " Late. The shadow candidate pod demo-candidate-x"),
        ({}, ShadowReading(GOOD, "Late."), (pod(1),), ShadowVerdict.PASSED, None, None),
    ],
)  # fmt: skip
def test_a_pending_candidates_verdict(annotations, reading, pods, outcome, reason, says):
    verdict = pending_verdict(
        SPEC, PENDING, DIGEST_B, annotations, reading, pods, T0 + timedelta(seconds=60)
    )
    assert verdict.outcome == outcome
    if reason is not None:
        assert verdict.reason == reason
    if says is not None:
        assert says in verdict.message
    elif outcome != ShadowVerdict.PENDING:
        assert "Late." not in verdict.message, "only a Pending verdict says what fell short"
