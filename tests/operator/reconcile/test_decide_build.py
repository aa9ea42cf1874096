"""The pure decision through an engine's life: build Job, digest from the termination
message, runtime children, readiness, failures with backoff, pinning, version changes, and
convergence after a restart or a garbage-collected Job.

Each test drives `decide` pass by pass over `decide_scenarios.Cluster`, which stores what
a Decision applies (every applied object is validated against the Kubernetes 1.33
schemas in strict mode) and plays the Job and Deployment controllers.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import yaml
from decide_scenarios import DIGEST_A, DIGEST_B, SETTINGS, T0, Cluster, make_spec
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType, Reason
from kubeinfer.operator.api.v1alpha1.inference_deployment import Phase
from kubeinfer.operator.reconcile.desired import CONFIG_KEY
from kubeinfer.operator.state import names
from kubeinfer.operator.state.build_attempt import parse_termination_message
from kubeinfer.operator.state.engine_state import build_key

READY, ENGINE = ConditionType.READY, ConditionType.ENGINE_READY
TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE


def kinds(objects) -> list[str]:
    return sorted(o["kind"] for o in objects)


def served_digest(cluster: Cluster) -> str:
    config = yaml.safe_load(cluster.get("ConfigMap")["data"][CONFIG_KEY])
    return config["engine"]["digest"]


def test_a_new_deployment_gets_a_cache_claim_and_a_build_job_but_no_runtime_yet():
    cluster = Cluster(make_spec())
    decision = cluster.reconcile()
    assert kinds(decision.apply) == ["Job", "PersistentVolumeClaim"]
    assert cluster.status.phase == Phase.BUILDING_ENGINE
    assert cluster.condition(ENGINE).reason == Reason.ENGINE_BUILDING
    assert cluster.condition(READY).status == FALSE
    assert decision.requeue_after_seconds == pytest.approx(10)
    assert cluster.status.engine.build_key is None, "no key without an engine built from it"


def test_the_build_job_runs_kubeinfer_build_as_argv_on_a_node_with_the_gpu_product():
    spec = make_spec(
        engine={"backend": "tensorrt", "precision": "fp16"},
        runtime={"resources": {"gpus": 1}, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
    )
    spec = spec.model_copy(
        update={
            "model": spec.model.model_copy(
                update={
                    "source": spec.model.source.model_copy(
                        update={"uri": "https://x/m.onnx; rm -rf /"}
                    )
                }
            )
        }
    )
    job = next(o for o in Cluster(spec).reconcile().apply if o["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["kubeinfer"]
    args = container["args"]
    # The hostile URI stays one argv element: there is no shell to interpret it.
    assert args[args.index("--model") + 1] == "https://x/m.onnx; rm -rf /"
    assert args[args.index("--backend") + 1] == "tensorrt"
    assert args[args.index("--precision") + 1] == "fp16"
    assert args[args.index("--cache") + 1] == "/cache"
    assert args[args.index("--termination-message-path") + 1] == "/dev/termination-log"
    assert "--json" in args
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert pod["restartPolicy"] == "Never"
    assert {"backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished"} <= set(job["spec"])


def test_a_succeeded_job_s_termination_message_deploys_the_runtime_with_that_digest():
    cluster = Cluster(make_spec())
    cluster.reconcile()
    (job,) = cluster.jobs()
    message = json.dumps({"digest": DIGEST_A, "cacheHit": False})
    cluster.succeed_job(job["metadata"]["name"], message, at=T0 + timedelta(seconds=30))
    decision = cluster.reconcile(T0 + timedelta(seconds=31))
    assert kinds(decision.apply) == [
        "ConfigMap", "Deployment", "PodDisruptionBudget", "Service",
    ]  # fmt: skip
    assert served_digest(cluster) == DIGEST_A
    assert cluster.condition(ENGINE).status == TRUE
    assert cluster.condition(ENGINE).reason == Reason.ENGINE_BUILT
    assert cluster.status.engine.digest == DIGEST_A
    assert cluster.status.phase == Phase.DEPLOYING
    assert cluster.condition(READY).status == FALSE


def test_a_rolled_out_deployment_makes_the_object_ready():
    cluster = Cluster(make_spec(runtime={"replicas": 3}))
    cluster.build_to_ready(DIGEST_A)
    assert cluster.condition(READY).status == TRUE
    assert cluster.status.phase == Phase.READY
    assert cluster.status.serving.version == "1"
    assert cluster.status.serving.engine_digest == DIGEST_A
    assert (cluster.status.replicas, cluster.status.ready_replicas) == (3, 3)
    assert cluster.status.ready == "3/3"
    engine = cluster.status.engine
    spec = cluster.spec.engine
    assert (engine.digest, engine.backend, engine.precision, engine.max_batch_size) == (
        DIGEST_A,
        spec.backend,
        spec.precision,
        spec.max_batch_size,
    )
    assert (
        engine.build_key
        == cluster.get("ConfigMap")["metadata"]["annotations"][names.ANNOTATION_BUILD_KEY]
    )
    # a settled object asks for no timer: the next change wakes it
    assert cluster.reconcile(T0 + timedelta(minutes=30)).requeue_after_seconds is None


def test_ready_stays_false_until_every_desired_replica_is_ready():
    cluster = Cluster(make_spec(runtime={"replicas": 3}))
    cluster.build_to_ready(DIGEST_A)
    cluster.roll_out(ready=2)
    cluster.reconcile(T0 + timedelta(minutes=5))
    assert cluster.condition(READY).status == FALSE
    assert cluster.status.ready == "2/3"


def test_a_failed_build_reports_the_job_reason_and_is_retried_with_backoff():
    cluster = Cluster(make_spec())
    cluster.reconcile()
    (job,) = cluster.jobs()
    first = job["metadata"]["name"]
    failed_at = T0 + timedelta(seconds=20)
    cluster.fail_job(
        first,
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
        "error: the build failed: out of memory",
        at=failed_at,
    )

    decision = cluster.reconcile(failed_at + timedelta(seconds=5))
    engine = cluster.condition(ENGINE)
    assert (engine.status, engine.reason) == (FALSE, Reason.ENGINE_BUILD_FAILED)
    assert "BackoffLimitExceeded" in engine.message
    assert "Job has reached the specified backoff limit" in engine.message
    assert "out of memory" in engine.message
    assert cluster.condition(ConditionType.DEGRADED).status == TRUE
    assert cluster.status.phase == Phase.FAILED  # nothing served yet
    assert decision.apply == ()  # no new attempt before the backoff
    assert decision.requeue_after_seconds == pytest.approx(25)
    # half a second before the retry: woken a second later, not spun on
    almost = cluster.reconcile(failed_at + timedelta(seconds=29.5))
    assert (almost.apply, almost.requeue_after_seconds) == ((), 1.0)
    assert any(
        e.type == "Warning" and e.reason == Reason.ENGINE_BUILD_FAILED for e in decision.events
    )

    decision = cluster.reconcile(failed_at + timedelta(seconds=30))
    (retry,) = [o for o in decision.apply if o["kind"] == "Job"]
    assert retry["metadata"]["name"] != first
    assert retry["metadata"]["labels"][names.LABEL_BUILD_ATTEMPT] == "1"
    assert cluster.condition(ENGINE).reason == Reason.ENGINE_BUILDING

    # The second failure waits twice as long.
    second_failed = failed_at + timedelta(seconds=100)
    cluster.fail_job(
        retry["metadata"]["name"],
        "DeadlineExceeded",
        "Job was active longer than specified deadline",
        "",
        at=second_failed,
    )
    decision = cluster.reconcile(second_failed + timedelta(seconds=1))
    assert decision.requeue_after_seconds == pytest.approx(59)


def test_a_failed_rebuild_keeps_the_previous_version_serving():
    cluster = Cluster(make_spec())
    cluster.build_to_ready(DIGEST_A)
    cluster.update_spec(make_spec(model={"version": "2"}, engine={"precision": "fp16"}))
    later = T0 + timedelta(hours=1)
    cluster.reconcile(later)
    (new_job,) = [j for j in cluster.jobs() if "status" not in j]
    cluster.fail_job(
        new_job["metadata"]["name"], "BackoffLimitExceeded", "backoff limit", "", at=later
    )
    decision = cluster.reconcile(later + timedelta(seconds=1))
    assert served_digest(cluster) == DIGEST_A
    assert cluster.get("Deployment")["metadata"]["labels"][names.LABEL_VERSION] == "1"
    assert not [o for o in decision.apply if o["kind"] in ("ConfigMap", "Deployment")]
    assert cluster.status.serving.version == "1"
    assert cluster.status.phase == Phase.DEGRADED
    assert "Version 1 keeps serving" in cluster.condition(ENGINE).message
    assert cluster.condition(ConditionType.AVAILABLE).status == TRUE


def test_a_pinned_engine_needs_no_job():
    cluster = Cluster(make_spec(engine={"pin": DIGEST_B, "cache": {"existingClaim": "engines"}}))
    decision = cluster.reconcile()
    assert kinds(decision.apply) == [
        "ConfigMap", "Deployment", "PodDisruptionBudget", "Service",
    ]  # fmt: skip
    assert served_digest(cluster) == DIGEST_B
    assert cluster.condition(ENGINE).reason == Reason.ENGINE_PINNED
    volumes = cluster.get("Deployment")["spec"]["template"]["spec"]["volumes"]
    cache = next(v for v in volumes if v["name"] == "cache")
    assert cache["persistentVolumeClaim"] == {"claimName": "engines", "readOnly": True}


def test_a_version_change_builds_first_and_keeps_the_old_digest_until_built():
    cluster = Cluster(make_spec())
    cluster.build_to_ready(DIGEST_A)
    old_deployment = cluster.get("Deployment")
    cluster.update_spec(
        make_spec(
            model={"version": "2", "source": {"uri": "https://models.example.com/mlp-v2.onnx"}},
            runtime={"batching": {"maxBatchSize": 8}},
        )
    )
    later = T0 + timedelta(hours=1)
    decision = cluster.reconcile(later)
    # The new build starts; the runtime's ConfigMap and Deployment are not touched.
    assert kinds(decision.apply) == ["Job"]
    assert cluster.get("Deployment") == old_deployment
    assert served_digest(cluster) == DIGEST_A
    assert cluster.condition(READY).status == FALSE
    assert cluster.status.observed_generation == 2

    (new_job,) = [j for j in cluster.jobs() if "status" not in j]
    cluster.succeed_job(new_job["metadata"]["name"], DIGEST_B, at=later + timedelta(seconds=40))
    decision = cluster.reconcile(later + timedelta(seconds=41))
    assert kinds(decision.apply) == [
        "ConfigMap", "Deployment", "PodDisruptionBudget", "Service",
    ]  # fmt: skip
    assert served_digest(cluster) == DIGEST_B
    config = yaml.safe_load(cluster.get("ConfigMap")["data"][CONFIG_KEY])
    assert config["modelVersion"] == "2" and config["batching"]["maxBatchSize"] == 8
    template = cluster.get("Deployment")["spec"]["template"]["metadata"]
    old_template = old_deployment["spec"]["template"]["metadata"]
    assert (
        template["annotations"][names.ANNOTATION_CONFIG_HASH]
        != old_template["annotations"][names.ANNOTATION_CONFIG_HASH]
    )
    assert cluster.condition(READY).status == FALSE  # pods not rolled yet
    # status.serving says what the pods run: version 1 until the roll is complete
    assert (cluster.status.serving.version, cluster.status.serving.engine_digest) == (
        "1",
        DIGEST_A,
    )
    cluster.roll_out()
    cluster.reconcile(later + timedelta(seconds=90))
    assert cluster.condition(READY).status == TRUE
    assert cluster.status.serving.version == "2"


def test_any_engine_input_changes_the_build_key_and_the_version_alone_does_not():
    base = make_spec()
    changed = [
        make_spec(model={"source": {"uri": "https://models.example.com/other.onnx"}}),
        make_spec(engine={"precision": "fp16"}),
        make_spec(engine={"maxBatchSize": 64}),
        make_spec(engine={"backend": "tensorrt"}, runtime={"resources": {"gpus": 1}}),
        make_spec(runtime={"gpuProduct": "NVIDIA-A100-SXM4-80GB"}),
        make_spec(engine={"calibration": {"uri": "https://x/c.npz"}}),
    ]
    keys = {build_key(spec, SETTINGS) for spec in changed}
    assert len(keys) == len(changed) and build_key(base, SETTINGS) not in keys
    assert build_key(make_spec(model={"version": "9"}, runtime={"replicas": 5}), SETTINGS) == (
        build_key(base, SETTINGS)
    )


def test_an_operator_restart_mid_build_converges_on_the_same_job():
    cluster = Cluster(make_spec())
    first = cluster.reconcile()
    (job,) = cluster.jobs()
    job["status"] = {"active": 1, "startTime": "2026-01-01T12:00:01Z"}
    # A new operator process: the same observed world, a later clock.
    again = cluster.reconcile(T0 + timedelta(minutes=7))
    assert again.apply == ()
    assert [j["metadata"]["name"] for j in cluster.jobs()] == [job["metadata"]["name"]]
    # Even a restart that has not yet seen the Job names the same one: applying it again
    # addresses the existing Job instead of adding a second.
    blind = Cluster(make_spec()).reconcile()
    assert [o["metadata"]["name"] for o in blind.apply if o["kind"] == "Job"] == [
        o["metadata"]["name"] for o in first.apply if o["kind"] == "Job"
    ]


def test_a_garbage_collected_build_job_is_not_rebuilt():
    cluster = Cluster(make_spec())
    cluster.build_to_ready(DIGEST_A)
    (job,) = cluster.jobs()
    cluster.delete("Job", job["metadata"]["name"])
    cluster.pods.clear()
    decision = cluster.reconcile(T0 + timedelta(days=2))
    assert decision.apply == ()
    assert cluster.condition(READY).status == TRUE


def test_an_unfinished_build_of_replaced_inputs_is_deleted():
    cluster = Cluster(make_spec())
    cluster.reconcile()
    (old_job,) = cluster.jobs()
    cluster.update_spec(make_spec(engine={"precision": "fp16"}))
    decision = cluster.reconcile(T0 + timedelta(minutes=1))
    assert decision.delete == (("Job", old_job["metadata"]["name"]),)
    assert [o["kind"] for o in decision.apply] == ["Job"]


def test_a_finished_build_of_replaced_inputs_is_kept_for_its_logs():
    """Its TTL removes it; deleting it would lose what `kubectl logs` shows of a failure."""
    cluster = Cluster(make_spec())
    cluster.reconcile()
    (failed,) = cluster.jobs()
    cluster.fail_job(failed["metadata"]["name"], "BackoffLimitExceeded", "m", "error: x")
    cluster.update_spec(make_spec(engine={"precision": "fp16"}))
    decision = cluster.reconcile(T0 + timedelta(minutes=1))
    assert decision.delete == ()
    assert [o["kind"] for o in decision.apply] == ["Job"]


def test_the_engine_target_is_the_builds_and_outlives_its_job():
    """The build's target (a GPU model for TensorRT) stays in the status after the Job is
    garbage-collected; a CPU build that names none is built for "cpu"."""
    gpu = {"backend": "tensorrt"}
    for engine, message, target in (
        ({}, DIGEST_A, "cpu"),
        (gpu, json.dumps({"digest": DIGEST_A, "target": "sm_90-h100"}), "sm_90-h100"),
        (gpu, DIGEST_A, None),
    ):
        # One GPU product: a single engine (tests/operator/fleet/test_decide_fleet.py has fleets).
        on_gpu = {"resources": {"gpus": 1}, "gpuProduct": "NVIDIA-H100-80GB-HBM3"}
        spec = make_spec(engine=engine, runtime=on_gpu if engine else {})
        cluster = Cluster(spec)
        cluster.reconcile()
        (job,) = cluster.jobs()
        cluster.succeed_job(job["metadata"]["name"], message)
        cluster.reconcile(T0 + timedelta(seconds=1))
        assert cluster.status.engine.target == target, message
        cluster.delete("Job", job["metadata"]["name"])
        cluster.pods.clear()
        cluster.reconcile(T0 + timedelta(days=2))
        assert cluster.status.engine.target == target, "after the Job is gone"


def test_a_completed_job_whose_pod_is_not_seen_yet_waits_then_retries():
    cluster = Cluster(make_spec())
    cluster.reconcile()
    (job,) = cluster.jobs()
    cluster.succeed_job(job["metadata"]["name"], DIGEST_A, at=T0)
    cluster.pods.clear()
    decision = cluster.reconcile(T0 + timedelta(seconds=10))
    assert decision.apply == () and cluster.condition(ENGINE).reason == Reason.ENGINE_BUILDING
    cluster.reconcile(T0 + timedelta(seconds=75))
    assert cluster.condition(ENGINE).reason == Reason.ENGINE_BUILD_FAILED
    assert "NoDigest" in cluster.condition(ENGINE).message
    decision = cluster.reconcile(T0 + timedelta(minutes=2))
    (retry,) = decision.apply
    assert retry["metadata"]["labels"][names.LABEL_BUILD_ATTEMPT] == "1"


def test_a_build_under_way_and_the_cache_claim_are_not_rewritten_when_other_fields_change():
    cluster = Cluster(make_spec())
    cluster.reconcile()
    (job,) = cluster.jobs()
    # A Job's pod template is immutable: re-applying a changed one would be refused.
    # Nor is a claim's storage class or access mode: the claim is created once.
    cluster.update_spec(
        make_spec(
            runtime={"resources": {"cpu": "4"}},
            model={"version": "1b"},
            engine={"cache": {"storageClassName": "other", "accessMode": "ReadWriteMany"}},
        )
    )
    decision = cluster.reconcile(T0 + timedelta(minutes=1))
    assert decision.apply == ()
    assert cluster.jobs() == [job]
    assert cluster.condition(ENGINE).reason == Reason.ENGINE_BUILDING


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            json.dumps({"digest": DIGEST_A, "target": "sm_90", "cacheHit": True}),
            (DIGEST_A, "sm_90"),
        ),
        (DIGEST_B, (DIGEST_B, None)),
        (f"built engine {DIGEST_B}\n", (DIGEST_B, None)),
        ("error: the build failed: out of memory", (None, None)),
        (json.dumps({"digest": "sha256:short"}), (None, None)),
        ("", (None, None)),
    ],
    ids=["json", "bare digest", "digest in text", "error line", "malformed digest", "empty"],
)
def test_the_termination_message_yields_the_digest_and_target(message, expected):
    assert parse_termination_message(message) == expected


def failed_build_message(pods_edit, job_said: bool = True) -> str:
    """EngineReady's message after the first build Job failed with the log line
    'error: out of memory', its pod changed by `pods_edit(job_name, pod)`."""
    cluster = Cluster(make_spec())
    cluster.reconcile()
    (job,) = cluster.jobs()
    name = job["metadata"]["name"]
    cluster.fail_job(name, "BackoffLimitExceeded", "backoff limit", "error: out of memory")
    if not job_said:
        (condition,) = job["status"]["conditions"]
        del condition["reason"], condition["message"]
    pods_edit(name, cluster.pods[-1])
    cluster.reconcile(T0 + timedelta(seconds=1))
    assert cluster.condition(ENGINE).reason == Reason.ENGINE_BUILD_FAILED
    return cluster.condition(ENGINE).message


def legacy_label(job: str, pod: dict) -> None:
    pod["metadata"]["labels"] = {"job-name": job}  # clusters before 1.27 set only this


def owner_only(job: str, pod: dict) -> None:
    pod["metadata"]["labels"] = {}
    pod["metadata"]["ownerReferences"] = [{"kind": "Job", "name": job, "uid": "u"}]


def another_jobs(job: str, pod: dict) -> None:
    pod["metadata"]["labels"] = {"batch.kubernetes.io/job-name": f"{job}-other"}
    pod["metadata"]["ownerReferences"] = [{"kind": "Job", "name": f"{job}-other", "uid": "u"}]


def sidecar_said_it(job: str, pod: dict) -> None:
    (status,) = pod["status"]["containerStatuses"]
    status["name"] = "istio-proxy"


def exit_zero(job: str, pod: dict) -> None:
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] = 0


def no_message(job: str, pod: dict) -> None:
    del pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"]


def still_running(job: str, pod: dict) -> None:
    pod["status"]["containerStatuses"][0]["state"] = {"running": {}}


@pytest.mark.parametrize(
    ("pods_edit", "reported"),
    [
        (lambda job, pod: None, True),
        (legacy_label, True),
        (owner_only, True),
        (another_jobs, False),
        (sidecar_said_it, False),
        (exit_zero, False),
        (no_message, False),
        (still_running, False),
    ],
    ids=[
        "label",
        "legacy label",
        "owner reference only",
        "another job's pod",
        "another container",
        "exit code 0",
        "no message",
        "not terminated",
    ],
)
def test_a_failed_build_reports_what_its_own_build_container_said(pods_edit, reported):
    """The Job's pods are found by either Job label or by owner; only the build container's
    termination with a non-zero exit code is the build's own word."""
    message = failed_build_message(pods_edit)
    assert " failed: BackoffLimitExceeded: backoff limit" in message
    if reported:
        assert "; the build reported: error: out of memory. Retrying" in message
    else:
        assert "the build reported" not in message, message


def test_a_failed_job_without_reason_or_message_still_says_it_failed():
    message = failed_build_message(lambda job, pod: None, job_said=False)
    assert " failed: Failed: the build Job failed; the build reported: error: out" in message


def test_the_builds_report_is_cut_at_2000_characters():
    def long_log(job: str, pod: dict) -> None:
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        terminated["message"] = "x" * 1999 + "yz"

    message = failed_build_message(long_log)
    assert "; the build reported: " + "x" * 1999 + "y. Retrying at" in message


@pytest.mark.parametrize("label", [None, "", "first", "-1"])
def test_a_failed_job_without_a_readable_attempt_number_counts_as_the_first(label):
    cluster = Cluster(make_spec())
    cluster.reconcile()
    (job,) = cluster.jobs()
    labels = job["metadata"]["labels"]
    if label is None:
        del labels[names.LABEL_BUILD_ATTEMPT]
    else:
        labels[names.LABEL_BUILD_ATTEMPT] = label
    cluster.fail_job(job["metadata"]["name"], "BackoffLimitExceeded", "m", "error: x")
    decision = cluster.reconcile(T0 + timedelta(seconds=1))
    assert decision.requeue_after_seconds == pytest.approx(SETTINGS.build.backoff_seconds - 1)
    (retry,) = [o for o in cluster.reconcile(T0 + timedelta(minutes=5)).apply if o["kind"] == "Job"]
    assert retry["metadata"]["labels"][names.LABEL_BUILD_ATTEMPT] == "1"


@pytest.mark.parametrize(
    "deleted", [("ConfigMap",), ("ConfigMap", "Deployment"), ("ConfigMap", "status")]
)
def test_the_old_engine_keeps_serving_while_a_new_one_builds_after_its_children_are_deleted(
    deleted,
):
    """What serves is read from the runtime ConfigMap, else the Deployment's pod template,
    else the status: deleting them mid-build never serves the unbuilt version (nor after a
    restore from a backup, which brings objects back without their status)."""
    cluster = Cluster(make_spec())
    cluster.build_to_ready(DIGEST_A)
    source = {"uri": "https://models.example.com/mlp-v2.onnx"}
    cluster.update_spec(make_spec(model={"version": "2", "source": source}))
    cluster.reconcile(T0 + timedelta(hours=1))
    for kind in deleted:
        if kind == "status":
            cluster.status = cluster.status.model_copy(update={"serving": None})
        else:
            cluster.delete(kind, cluster.get(kind)["metadata"]["name"])
    cluster.reconcile(T0 + timedelta(hours=1, seconds=5))
    assert served_digest(cluster) == DIGEST_A
    config = yaml.safe_load(cluster.get("ConfigMap")["data"][CONFIG_KEY])
    assert config["modelVersion"] == "1", "the version that engine was built from"
    assert cluster.status.serving.version == "1"
    assert cluster.status.serving.engine_digest == DIGEST_A


def test_pinning_the_built_engine_keeps_its_target_and_another_pin_has_none_known():
    gpu, on_gpu = {"backend": "tensorrt"}, {"resources": {"gpus": 1}, "gpuProduct": "NVIDIA-L4"}
    spec = make_spec(engine=gpu, runtime=on_gpu)
    cluster = Cluster(spec)
    cluster.reconcile()
    (job,) = cluster.jobs()
    cluster.succeed_job(job["metadata"]["name"], json.dumps({"digest": DIGEST_A, "target": "t"}))
    cluster.reconcile(T0 + timedelta(seconds=1))
    for pin, target in ((DIGEST_A, "t"), (DIGEST_B, None)):
        cluster.update_spec(
            make_spec(engine={**gpu, "pin": pin}, runtime={"resources": {"gpus": 1}})
        )
        cluster.reconcile(T0 + timedelta(minutes=1))
        engine = cluster.status.engine
        assert (engine.digest, engine.target) == (pin, target)
        assert pin in cluster.condition(ENGINE).message


def unfinished_jobs(cluster: Cluster) -> list[str]:
    return [j["metadata"]["name"] for j in cluster.jobs() if "status" not in j]


def test_an_unfinished_build_is_deleted_whatever_the_new_inputs_engine_is():
    """A build of inputs the spec no longer asks for is deleted in the pass that sees the
    change: when the new spec pins an engine, when its engine is already built, and when
    its own build failed and waits for its retry."""
    fp16 = make_spec(engine={"precision": "fp16"})

    pinned = Cluster(make_spec())
    pinned.reconcile()
    (running,) = unfinished_jobs(pinned)
    pinned.update_spec(make_spec(engine={"pin": DIGEST_A}))
    assert pinned.reconcile(T0 + timedelta(minutes=1)).delete == (("Job", running),)

    built = Cluster(make_spec())
    built.build_to_ready(DIGEST_A)
    built.update_spec(fp16)
    built.reconcile(T0 + timedelta(minutes=1))
    (running,) = unfinished_jobs(built)
    built.update_spec(make_spec())  # back to the inputs engine A was built from
    decision = built.reconcile(T0 + timedelta(minutes=2))
    assert decision.delete == (("Job", running),)
    assert built.condition(ENGINE).message.startswith(f"Engine {DIGEST_A} was built")

    failing = Cluster(make_spec())
    failing.reconcile()
    (first,) = failing.jobs()
    failing.fail_job(first["metadata"]["name"], "BackoffLimitExceeded", "m", "error: x")
    failing.update_spec(fp16)
    failing.reconcile(T0 + timedelta(seconds=1))
    (running,) = unfinished_jobs(failing)
    failing.update_spec(make_spec())  # back to the inputs whose build failed: in backoff
    decision = failing.reconcile(T0 + timedelta(seconds=2))
    assert decision.delete == (("Job", running),)
    assert failing.condition(ENGINE).reason == Reason.ENGINE_BUILD_FAILED


def test_the_engine_condition_names_the_job_and_its_attempt():
    cluster = Cluster(make_spec())
    cluster.reconcile()
    (first,) = cluster.jobs()
    name = first["metadata"]["name"]
    assert cluster.condition(ENGINE).message == f"Job {name} is building the engine."
    cluster.fail_job(name, "BackoffLimitExceeded", "m", "error: x")
    cluster.reconcile(T0 + timedelta(minutes=5))
    (retry,) = unfinished_jobs(cluster)
    assert cluster.condition(ENGINE).message == f"Job {retry} is building the engine (attempt 2)."
    cluster.succeed_job(retry, DIGEST_A, at=T0 + timedelta(minutes=5))
    cluster.pods.clear()  # its pod is not seen yet
    cluster.reconcile(T0 + timedelta(minutes=5, seconds=1))
    assert cluster.condition(ENGINE).message == (
        f"Job {retry} completed; waiting for its pod's termination message."
    )


def test_a_failed_job_without_a_condition_time_backs_off_from_its_start():
    cluster = Cluster(make_spec())
    cluster.reconcile()
    (job,) = cluster.jobs()
    cluster.fail_job(job["metadata"]["name"], "BackoffLimitExceeded", "m", "error: x")
    (condition,) = job["status"]["conditions"]
    del condition["lastTransitionTime"]
    job["status"]["startTime"] = "2026-01-01T12:00:10Z"
    decision = cluster.reconcile(T0 + timedelta(seconds=20))
    assert decision.requeue_after_seconds == pytest.approx(SETTINGS.build.backoff_seconds - 10)
    del job["status"]["startTime"]  # no time at all: nothing to back off from
    (retry,) = [
        o for o in cluster.reconcile(T0 + timedelta(seconds=21)).apply if o["kind"] == "Job"
    ]
    assert retry["metadata"]["labels"][names.LABEL_BUILD_ATTEMPT] == "1"


@pytest.mark.parametrize("text", ["{not: yaml", "engine: 3", ""])
def test_an_unreadable_runtime_config_of_the_old_engine_is_rendered_again(text):
    """A hand-mangled runtime ConfigMap while a new version builds: the old engine's config
    is rendered from the spec again (never a crash)."""
    cluster = Cluster(make_spec())
    cluster.build_to_ready(DIGEST_A)
    cluster.update_spec(make_spec(model={"version": "2"}, engine={"precision": "fp16"}))
    cluster.reconcile(T0 + timedelta(hours=1))
    cluster.get("ConfigMap")["data"][CONFIG_KEY] = text
    cluster.reconcile(T0 + timedelta(hours=1, seconds=5))
    assert served_digest(cluster) == DIGEST_A


def test_the_gates_and_the_outputs_they_judge_go_to_the_build_job_as_flags():
    accuracy = {"maxTop1Drop": 0.01, "minCosine": 0.99, "gateOutputs": ["logits", "probs"]}
    spec = make_spec(engine={"precision": "fp16", "accuracy": accuracy})
    job = next(o for o in Cluster(spec).reconcile().apply if o["kind"] == "Job")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-top1-drop") + 1] == "0.01"
    assert args[args.index("--min-cosine") + 1] == "0.99"
    assert args[args.index("--gate-outputs") + 1] == "logits,probs"
    plain = make_spec(engine={"precision": "fp16", "accuracy": {"maxTop1Drop": 0.01}})
    job = next(o for o in Cluster(plain).reconcile().apply if o["kind"] == "Job")
    assert "--gate-outputs" not in job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert build_key(spec, SETTINGS) != build_key(plain, SETTINGS)  # another choice, rebuilt
