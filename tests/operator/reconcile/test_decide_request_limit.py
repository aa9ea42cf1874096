"""The runtime's request body limit, rendered by the pure decision from the build's report.

Covers: a build whose termination message reports `inputBytesPerRow` gets a runtime
ConfigMap with `maxRequestBytes` = a full batch (the runtime's maxBatchSize) of those
inputs as JSON plus room for the rest of the request, and the size recorded in an
annotation; once the build Job is garbage-collected the next pass renders the same
ConfigMap (nothing to write, no roll); a report without the size (an older builder), an
unreadable size, and a pinned engine leave the limit to the runtime, which derives it
from the model it loads; a new engine of
another size (a version change) renders its own limit; the report parses from the
message's JSON only.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import yaml
from decide_scenarios import DIGEST_A, DIGEST_B, T0, Cluster, make_spec
from kubeinfer.contract.runtime_config import request_bytes_limit
from kubeinfer.operator.reconcile.desired import CONFIG_KEY
from kubeinfer.operator.state.build_attempt import BuildReport, parse_build_report
from kubeinfer.operator.state.engine_state import ANNOTATION_INPUT_BYTES_PER_ROW


def rendered_limit(cluster: Cluster) -> int | None:
    return yaml.safe_load(cluster.get("ConfigMap")["data"][CONFIG_KEY]).get("maxRequestBytes")


def built(cluster: Cluster, message: str, at: timedelta = timedelta(seconds=30)) -> None:
    (job,) = [j for j in cluster.jobs() if "status" not in j]
    cluster.succeed_job(job["metadata"]["name"], message, at=T0 + at)
    cluster.reconcile(T0 + at + timedelta(seconds=1))


def report(digest: str, **fields) -> str:
    return json.dumps({"digest": digest, "cacheHit": False, **fields})


def test_the_limit_holds_a_full_batch_of_the_reported_inputs_and_survives_the_job():
    cluster = Cluster(make_spec(runtime={"batching": {"maxBatchSize": 16}}))
    cluster.reconcile()
    built(cluster, report(DIGEST_A, inputBytesPerRow=602112))  # resnet50: 3x224x224 FP32
    assert rendered_limit(cluster) == request_bytes_limit(602112, 16) == 602112 * 16 * 8 + 65536
    configmap = cluster.get("ConfigMap")
    assert configmap["metadata"]["annotations"][ANNOTATION_INPUT_BYTES_PER_ROW] == "602112"
    for job in cluster.jobs():
        cluster.delete("Job", job["metadata"]["name"])  # ttlSecondsAfterFinished
    decision = cluster.reconcile(T0 + timedelta(minutes=10))
    assert [c["kind"] for c in decision.apply if c["kind"] == "ConfigMap"] == []
    assert rendered_limit(cluster) == request_bytes_limit(602112, 16)


@pytest.mark.parametrize(
    "message",
    [report(DIGEST_A), report(DIGEST_A, inputBytesPerRow=-5), report(DIGEST_A,
     inputBytesPerRow="lots"), DIGEST_A],
)  # fmt: skip
def test_without_a_readable_size_the_runtime_derives_the_limit(message):
    cluster = Cluster(make_spec())
    cluster.reconcile()
    built(cluster, message)
    assert rendered_limit(cluster) is None
    configmap = cluster.get("ConfigMap")
    assert ANNOTATION_INPUT_BYTES_PER_ROW not in configmap["metadata"]["annotations"]


def test_a_pinned_engine_leaves_the_limit_to_the_runtime():
    cluster = Cluster(make_spec(engine={"pin": DIGEST_A}))
    cluster.reconcile()
    assert rendered_limit(cluster) is None


def test_a_new_engine_of_another_size_renders_its_own_limit():
    cluster = Cluster(make_spec(runtime={"batching": {"maxBatchSize": 4}}))
    cluster.reconcile()
    built(cluster, report(DIGEST_A, inputBytesPerRow=64))
    cluster.roll_out()
    cluster.reconcile(T0 + timedelta(minutes=1))
    assert rendered_limit(cluster) == request_bytes_limit(64, 4)
    spec = make_spec(model={"version": "2"}, runtime={"batching": {"maxBatchSize": 4}})
    cluster.update_spec(spec.model_copy(update={"engine": spec.engine.model_copy(
        update={"precision": "fp16"})}))  # fmt: skip
    cluster.reconcile(T0 + timedelta(minutes=2))
    assert rendered_limit(cluster) == request_bytes_limit(64, 4)  # the old engine serves on
    built(cluster, report(DIGEST_B, inputBytesPerRow=128), at=timedelta(minutes=3))
    assert rendered_limit(cluster) == request_bytes_limit(128, 4)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (report(DIGEST_A, inputBytesPerRow=64, target="cpu"), BuildReport(DIGEST_A, "cpu", 64)),
        (report(DIGEST_A, inputBytesPerRow="64"), BuildReport(DIGEST_A, None, 64)),
        (report(DIGEST_A, inputBytesPerRow=True), BuildReport(DIGEST_A, None, None)),
        (report(DIGEST_A, inputBytesPerRow=0), BuildReport(DIGEST_A, None, None)),
        (report(DIGEST_A, inputBytesPerRow=1), BuildReport(DIGEST_A, None, 1)),  # one int8
        (report(DIGEST_A, target=90), BuildReport(DIGEST_A, None, None)),  # not a name
        (f"built {DIGEST_A} inputBytesPerRow=64", BuildReport(DIGEST_A, None, None)),
        ("", BuildReport(None)),
    ],
)
def test_the_build_report_parses_from_the_message_json_only(message, expected):
    assert parse_build_report(message) == expected
