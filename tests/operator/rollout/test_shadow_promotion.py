"""The end of a shadow, pass by pass over `decide_scenarios.Cluster`: a passed candidate
keeps running until the serving pods run its engine, and a candidate the spec no longer
asks for is closed, not left Pending or Passed.

Found by mutation testing (issue 11, item 6): `promotion_complete` was never reached, since
the pass after a verdict marked the candidate Promoted (and removed it) as soon as the
serving children named its engine, before their pods ran it, and kept the Passed reason.
"""

from __future__ import annotations

import copy
from datetime import timedelta

from decide_scenarios import DIGEST_A, DIGEST_B, T0
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType, Reason
from kubeinfer.operator.api.v1alpha1.enums import ShadowVerdict
from kubeinfer.operator.state.shadow_readings import ShadowReading
from test_shadow_rollout import CANDIDATE, GOOD, mirror_target, served, shadowing_cluster, spec


def test_a_passed_candidate_runs_until_the_serving_pods_run_its_engine():
    cluster = shadowing_cluster()
    cluster.reading = ShadowReading(GOOD)
    cluster.reconcile(T0 + timedelta(minutes=12))
    assert cluster.status.candidate.verdict == ShadowVerdict.PASSED
    assert served(cluster) == DIGEST_B
    # Passes while the serving Deployment rolls: the serving children name engine B, but
    # its pods do not all run it; the candidate still serves as spare capacity.
    for seconds in (15, 30, 45):
        cluster.reconcile(T0 + timedelta(minutes=12, seconds=seconds))
        assert cluster.has("Deployment", CANDIDATE), seconds
        assert cluster.status.candidate.verdict == ShadowVerdict.PASSED
        assert cluster.condition(ConditionType.PROGRESSING).reason == Reason.PROMOTING
        assert mirror_target(cluster) is None
    cluster.roll_out()
    cluster.reconcile(T0 + timedelta(minutes=13))
    record = cluster.status.candidate
    assert (record.verdict, record.reason) == (ShadowVerdict.PROMOTED, Reason.SHADOW_PROMOTED)
    assert record.message.endswith("Serving runs it on every pod now.")
    assert not cluster.has("Deployment", CANDIDATE)
    assert cluster.condition(ConditionType.READY).status == ConditionStatus.TRUE


def test_a_candidate_is_closed_when_the_spec_goes_back_to_the_serving_version():
    cluster = shadowing_cluster()
    assert cluster.status.candidate.verdict == ShadowVerdict.PENDING
    cluster.update_spec(spec("1"))
    cluster.reconcile(T0 + timedelta(minutes=12))
    record = cluster.status.candidate
    assert (record.verdict, record.reason) == (ShadowVerdict.ABORTED, "Superseded")
    assert record.engine_digest == DIGEST_B
    assert served(cluster) == DIGEST_A
    assert not cluster.has("Deployment", CANDIDATE)
    assert mirror_target(cluster) is None
    writes = cluster.writes
    cluster.reconcile(T0 + timedelta(minutes=13))
    assert cluster.writes == writes, "and it settles"


def test_a_lost_write_of_the_promotion_is_made_again():
    """The pass that passed the candidate wrote the serving children; if that write is
    lost (a conflict, an operator restart), the next pass writes them again and the
    candidate keeps running."""
    cluster = shadowing_cluster()
    before = {kind: copy.deepcopy(cluster.get(kind)) for kind in ("ConfigMap", "Deployment")}
    cluster.reading = ShadowReading(GOOD)
    cluster.reconcile(T0 + timedelta(minutes=12))
    assert served(cluster) == DIGEST_B
    for kind, child in before.items():
        cluster.objects[(kind, child["metadata"]["name"])] = child  # the write never landed
    assert served(cluster) == DIGEST_A
    cluster.reconcile(T0 + timedelta(minutes=12, seconds=15))
    assert served(cluster) == DIGEST_B
    assert cluster.has("Deployment", CANDIDATE)
    assert cluster.status.candidate.verdict == ShadowVerdict.PASSED


def test_a_promoted_engine_is_served_again_after_the_serving_children_are_reverted():
    """After the promotion, the serving children put back as they were before it (a
    restore, a hand edit): the promoted engine is served again, not shadowed again."""
    cluster = shadowing_cluster()
    before = {kind: copy.deepcopy(cluster.get(kind)) for kind in ("ConfigMap", "Deployment")}
    cluster.reading = ShadowReading(GOOD)
    cluster.reconcile(T0 + timedelta(minutes=12))
    cluster.roll_out()
    cluster.reconcile(T0 + timedelta(minutes=13))
    assert cluster.status.candidate.verdict == ShadowVerdict.PROMOTED
    for kind, child in before.items():
        cluster.objects[(kind, child["metadata"]["name"])] = child
    assert served(cluster) == DIGEST_A
    cluster.reconcile(T0 + timedelta(minutes=14))
    assert served(cluster) == DIGEST_B
    assert cluster.status.candidate.verdict == ShadowVerdict.PROMOTED
    assert not cluster.has("Deployment", CANDIDATE)
