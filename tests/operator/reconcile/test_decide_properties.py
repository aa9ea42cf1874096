"""Properties of the decision over random histories: whatever the order of spec changes,
build outcomes, rollouts, deleted children and clock jumps, (1) a pass that follows a pass
over the same world writes nothing, (2) no two unfinished build Jobs ever coexist, (3) the
runtime only ever serves a digest some build reported (or the pin), and (4) Ready=True
means the current spec's engine serves on every desired pod.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

import yaml
from decide_scenarios import T0, Cluster, make_spec
from hypothesis import event, given, settings
from hypothesis import strategies as st
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType
from kubeinfer.operator.reconcile.desired import CONFIG_KEY

SPECS = [
    make_spec(),
    make_spec(model={"version": "2"}),
    make_spec(engine={"precision": "fp16"}),
    make_spec(runtime={"replicas": 3, "batching": {"maxBatchSize": 8}}),
    make_spec(engine={"pin": "sha256:" + "e" * 64}),
]
SUCCEED = st.tuples(st.just("succeed"), st.integers(0, 3))
ROLL_OUT = st.tuples(st.just("roll out"), st.just(0))
ACTIONS = st.one_of(  # successes and rollouts listed twice: most histories reach Ready
    st.tuples(st.just("spec"), st.integers(0, len(SPECS) - 1)),
    SUCCEED,
    SUCCEED,
    st.tuples(st.just("fail"), st.integers(0, 3)),
    ROLL_OUT,
    ROLL_OUT,
    st.tuples(st.just("delete"), st.sampled_from(["ConfigMap", "Deployment", "Service", "Job"])),
    st.tuples(st.just("wait"), st.integers(1, 600)),
)


def digest_for(seed: str) -> str:
    return "sha256:" + hashlib.sha256(seed.encode()).hexdigest()


def unfinished_jobs(cluster: Cluster) -> list[dict]:
    return [j for j in cluster.jobs() if not (j.get("status") or {}).get("conditions")]


@settings(max_examples=60, deadline=None)
@given(from_ready=st.booleans(), history=st.lists(ACTIONS, min_size=1, max_size=14))
def test_random_histories_keep_the_invariants(from_ready, history):
    cluster = Cluster(SPECS[0])
    now = T0
    reported = {spec.engine.pin for spec in SPECS if spec.engine.pin}
    if from_ready:
        reported.add(digest_for("first"))
        cluster.build_to_ready(digest_for("first"), now)
        now += timedelta(minutes=2)
    for action, argument in history:
        running = unfinished_jobs(cluster)
        if action == "spec":
            cluster.update_spec(SPECS[argument])
        elif action == "succeed" and running:
            digest = digest_for(f"{running[0]['metadata']['name']}-{argument}")
            reported.add(digest)
            cluster.succeed_job(running[0]["metadata"]["name"], digest, at=now)
        elif action == "fail" and running:
            cluster.fail_job(
                running[0]["metadata"]["name"], "BackoffLimitExceeded", "x", "y", at=now
            )
        elif action == "roll out" and ("Deployment", "demo-runtime") in cluster.objects:
            cluster.roll_out()
        elif action == "delete":
            victims = [name for kind, name in cluster.objects if kind == argument]
            if victims:
                cluster.delete(argument, victims[0])
        elif action == "wait":
            now += timedelta(seconds=argument)
        cluster.reconcile(now)

        # (1) The world did not change between these two passes: the second writes nothing.
        cluster.reconcile(now)
        writes = cluster.writes
        again = cluster.reconcile(now)
        assert (again.apply, again.delete, again.events) == ((), (), ())
        assert cluster.writes == writes
        # (2) One build at a time.
        assert len(unfinished_jobs(cluster)) <= 1
        # (3) Only reported digests are ever served.
        if ("ConfigMap", "demo-runtime") in cluster.objects:
            config = yaml.safe_load(cluster.get("ConfigMap")["data"][CONFIG_KEY])
            assert config["engine"]["digest"] in reported
        # (4) Ready means the current engine on every desired pod.
        ready = cluster.condition(ConditionType.READY)
        event(f"phase {cluster.status.phase}")
        if ready.status == ConditionStatus.TRUE:
            deployment = cluster.get("Deployment")
            assert config["engine"]["digest"] == cluster.status.engine.digest
            assert config["modelVersion"] == cluster.spec.model.version
            assert deployment["status"]["readyReplicas"] == deployment["spec"]["replicas"]
            assert deployment["spec"]["replicas"] == cluster.spec.runtime.replicas
            assert ready.observed_generation == cluster.generation
