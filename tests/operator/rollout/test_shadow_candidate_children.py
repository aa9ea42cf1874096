"""The shadow candidate's own children (`decide_scenarios.Cluster`, pass by pass): its
ConfigMap records its own engine, build key, image and input size, its request limit
holds a batch of its inputs, and its Deployment and Service select only its pods.

Added for mutation testing (issue 11, item 6): each of these could be swapped for the
serving engine's, or dropped, with every other test passing."""

from __future__ import annotations

import json
from datetime import timedelta

import yaml
from decide_scenarios import DIGEST_A, DIGEST_B, T0, Cluster
from kubeinfer.contract.runtime_config import request_bytes_limit
from kubeinfer.operator.reconcile.desired import CONFIG_KEY
from kubeinfer.operator.state import names
from kubeinfer.operator.state.engine_state import ANNOTATION_INPUT_BYTES_PER_ROW
from test_shadow_rollout import CANDIDATE, spec

NEW_IMAGE = "registry.example.com/kubeinfer-runtime:0.2.0"


def report(digest: str, input_bytes_per_row: int) -> str:
    return json.dumps({"digest": digest, "inputBytesPerRow": input_bytes_per_row})


def test_the_candidate_runs_its_own_engine_with_its_own_records():
    cluster = Cluster(spec("1"))
    cluster.reconcile(T0)
    (first,) = cluster.jobs()
    cluster.succeed_job(first["metadata"]["name"], report(DIGEST_A, 100))
    cluster.reconcile(T0 + timedelta(seconds=1))
    cluster.roll_out()
    cluster.reconcile(T0 + timedelta(seconds=2))
    cluster.update_spec(spec("2", runtime={"image": NEW_IMAGE}))
    cluster.reconcile(T0 + timedelta(minutes=10))
    (job,) = [j for j in cluster.jobs() if "status" not in j]
    cluster.succeed_job(job["metadata"]["name"], report(DIGEST_B, 300))
    cluster.reconcile(T0 + timedelta(minutes=11))
    batch = cluster.spec.runtime.batching.max_batch_size

    serving, candidate = cluster.get("ConfigMap"), cluster.get("ConfigMap", CANDIDATE)
    for configmap, digest, size, key in (
        (serving, DIGEST_A, 100, first),
        (candidate, DIGEST_B, 300, job),
    ):
        annotations = configmap["metadata"]["annotations"]
        assert annotations[names.ANNOTATION_ENGINE_DIGEST] == digest
        # the Job's label holds the key cut to a label's 63 characters
        label = key["metadata"]["labels"][names.LABEL_BUILD_KEY]
        assert annotations[names.ANNOTATION_BUILD_KEY].startswith(label)
        assert annotations[ANNOTATION_INPUT_BYTES_PER_ROW] == str(size)
        config = yaml.safe_load(configmap["data"][CONFIG_KEY])
        assert config["maxRequestBytes"] == request_bytes_limit(size, batch)
    assert "mirrorTargetFile" not in yaml.safe_load(candidate["data"][CONFIG_KEY])
    assert candidate["metadata"]["annotations"][names.ANNOTATION_RUNTIME_IMAGE] == NEW_IMAGE
    assert serving["metadata"]["annotations"][names.ANNOTATION_RUNTIME_IMAGE] != NEW_IMAGE

    deployment = cluster.get("Deployment", CANDIDATE)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == NEW_IMAGE
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels[names.LABEL_ROLE] == names.ROLE_CANDIDATE
    assert deployment["spec"]["selector"]["matchLabels"] == names.candidate_selector("demo")
    service = cluster.get("Service", CANDIDATE)
    assert service["spec"]["selector"] == names.candidate_selector("demo")
    assert service["metadata"]["labels"]["app.kubernetes.io/component"] == (
        names.COMPONENT_CANDIDATE
    )
