"""Engines that match their image, in the pure decision (`decide_scenarios.Cluster` plays
the API server and the controllers; runtime pods carry the container statuses a kubelet
reports):

- the image the build Job and the pods run is a build input: a new `runtime.image`, or a
  new default image in the operator's settings for the object's backend, builds again
  while the old engine keeps serving; a pinned engine is not rebuilt for an image;
- runtime pods that refuse their engine (exit code 3, with the runtime's termination
  message) make the object Degraded (and Stalled) with reason EngineIncompatible and that
  message, Ready False, a Warning Event, and the phase Failed when nothing serves; the
  status stays the same while the container goes around its crash loop, and clears once
  the pod is ready; another exit code, or an image that cannot be pulled, is
  RuntimeFailing;
- while the engine of a new image is built, the serving pods that already run the new
  image with the old engine are only mentioned in Progressing (not Degraded), and pods of
  an engine the Deployment no longer runs do not count;
- a shadow candidate whose pods refuse its engine fails its verdict at once with reason
  EngineIncompatible (not at maxDurationSeconds), its children go and serving is
  untouched; a candidate failing otherwise stays Pending and says why; a replaced
  candidate's failing pods do not fail the new trial;
- the runtime pods are listed only while a Deployment is not settled, and the operator's
  exit code is the runtime's;
- with a real `kubeinfer serve` run from the rendered runtime ConfigMap and a pinned
  engine written as another ONNX Runtime would write it, what the process leaves (its
  exit code and termination message) is what the status reports; and the build Job's
  argv, run by a real `kubeinfer build` on a model serve would refuse (a dynamic
  dimension besides the batch one), fails with serve's reason, which EngineReady says.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
import yaml
from decide_scenarios import DIGEST_A, DIGEST_B, SETTINGS, T0, Cluster, make_spec, tuned
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType, Reason
from kubeinfer.operator.api.v1alpha1.enums import Phase, ShadowVerdict
from kubeinfer.operator.reconcile.desired import (
    CACHE_MOUNT,
    CONFIG_KEY,
    CONFIG_MOUNT,
    TERMINATION_LOG,
)
from kubeinfer.operator.settings import DEFAULT_RUNTIME_IMAGE
from kubeinfer.operator.state import names
from kubeinfer.operator.state.runtime_failures import (
    EXIT_ENGINE_INCOMPATIBLE,
    runtime_failure,
    unsettled,
)
from kubeinfer.operator.state.shadow_readings import ShadowAggregates, ShadowReading
from test_shadow_rollout import CANDIDATE, build_new_version, served, shadowing_cluster
from test_shadow_rollout import spec as shadow_spec

TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE
NEW_IMAGE = "registry.example.com/kubeinfer-runtime:0.2.0"
REFUSAL = (
    f"error: engine {DIGEST_A} was built by onnxruntime 1.20.1, but this image has "
    "onnxruntime 1.22.0: an engine runs only on the backend version that built it; build "
    "it again with this image, or run it with the image that built it"
)


def crash_looping(code: int = EXIT_ENGINE_INCOMPATIBLE, message: str = REFUSAL) -> dict:
    """A runtime container the kubelet waits to restart after it exited with `code`."""
    terminated = {"exitCode": code, "reason": "Error", "message": message}
    return {
        "ready": False,
        "restartCount": 4,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1m20s"}},
        "lastState": {"terminated": terminated},
    }


def unfinished_build(cluster: Cluster) -> dict:
    (job,) = [j for j in cluster.jobs() if "status" not in j]
    return job


def condition(cluster: Cluster, type_: ConditionType) -> tuple:
    found = cluster.condition(type_)
    return found.status, found.reason


# -- the image is a build input ----------------------------------------------------------


def test_a_new_image_builds_the_engine_again_while_the_old_one_serves():
    cluster = Cluster(make_spec())
    cluster.build_to_ready(DIGEST_A)
    (first,) = cluster.jobs()
    assert first["spec"]["template"]["spec"]["containers"][0]["image"] == DEFAULT_RUNTIME_IMAGE
    cluster.update_spec(make_spec(runtime={"image": NEW_IMAGE}))
    later = T0 + timedelta(minutes=10)
    cluster.reconcile(later)
    job = unfinished_build(cluster)
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == NEW_IMAGE
    assert (
        job["metadata"]["labels"][names.LABEL_BUILD_KEY]
        != first["metadata"]["labels"][names.LABEL_BUILD_KEY]
    )
    assert condition(cluster, ConditionType.ENGINE_READY) == (FALSE, Reason.ENGINE_BUILDING)
    assert served(cluster) == DIGEST_A, "the old engine keeps serving while it builds"
    assert runtime_image(cluster) == DEFAULT_RUNTIME_IMAGE, (
        "and in the image that built it: the new image's backend may not load it"
    )
    cluster.succeed_job(job["metadata"]["name"], DIGEST_B, at=later + timedelta(minutes=1))
    cluster.reconcile(later + timedelta(minutes=2))
    assert served(cluster) == DIGEST_B
    assert runtime_image(cluster) == NEW_IMAGE, "the new engine rolls out in the new image"


def runtime_image(cluster: Cluster) -> str:
    (container,) = cluster.get("Deployment")["spec"]["template"]["spec"]["containers"]
    return container["image"]


def test_the_operators_default_image_for_the_backend_is_a_build_input():
    onnx = make_spec()
    tensorrt = make_spec(
        engine={"backend": "tensorrt"},
        runtime={"resources": {"gpus": 1}, "gpuProduct": "NVIDIA-L4"},
    )
    for spec, its_own in ((onnx, "runtime"), (tensorrt, "gpu_runtime")):
        for setting in ("runtime", "gpu_runtime"):
            cluster = Cluster(spec)
            cluster.build_to_ready(DIGEST_A)
            (built,) = cluster.jobs()
            upgraded = tuned(SETTINGS, images={setting: NEW_IMAGE})
            cluster.reconcile(T0 + timedelta(minutes=10), settings=upgraded)
            new = [job for job in cluster.jobs() if job is not built and "status" not in job]
            assert len(new) == (setting == its_own), (spec.engine.backend, setting)
            if new:
                assert new[0]["spec"]["template"]["spec"]["containers"][0]["image"] == NEW_IMAGE


def set_runtime_image(cluster: Cluster, image: str, sidecar_first: bool = False) -> None:
    """What a hand edit (or an older rollout) leaves: the Deployment's runtime container
    in another image; with `sidecar_first`, an injected container listed before it."""
    containers = cluster.get("Deployment")["spec"]["template"]["spec"]["containers"]
    containers[0]["image"] = image
    if sidecar_first:
        containers.insert(0, {"name": "istio-proxy", "image": "istio/proxyv2:1.24"})


def test_the_old_engine_serves_in_the_image_its_configmap_records_while_a_new_one_builds():
    """The runtime ConfigMap records the image the engine was deployed with; that record
    decides, not the Deployment's container (a hand edit there is reverted to it)."""
    cluster = Cluster(make_spec())
    cluster.build_to_ready(DIGEST_A)
    cluster.update_spec(make_spec(runtime={"image": NEW_IMAGE}))
    set_runtime_image(cluster, "registry.example.com/hand-edited:1", sidecar_first=True)
    cluster.reconcile(T0 + timedelta(minutes=10))
    assert served(cluster) == DIGEST_A
    containers = cluster.get("Deployment")["spec"]["template"]["spec"]["containers"]
    assert [(c["name"], c["image"]) for c in containers] == [("runtime", DEFAULT_RUNTIME_IMAGE)]


def test_without_an_image_record_the_old_engine_keeps_its_deployments_runtime_image():
    """A runtime ConfigMap written before the image record existed (an operator upgrade):
    the image the Deployment's runtime container runs is kept, never the new spec's."""
    cluster = Cluster(make_spec())
    cluster.build_to_ready(DIGEST_A)
    del cluster.get("ConfigMap")["metadata"]["annotations"][names.ANNOTATION_RUNTIME_IMAGE]
    cluster.update_spec(make_spec(runtime={"image": NEW_IMAGE}))
    set_runtime_image(cluster, "registry.example.com/older-runtime:0.0.9", sidecar_first=True)
    cluster.reconcile(T0 + timedelta(minutes=10))
    assert served(cluster) == DIGEST_A
    assert runtime_image(cluster) == "registry.example.com/older-runtime:0.0.9"


def test_a_pinned_engine_is_not_rebuilt_for_a_new_image():
    cluster = Cluster(make_spec(engine={"pin": DIGEST_A}))
    cluster.reconcile(T0)
    cluster.update_spec(make_spec(engine={"pin": DIGEST_A}, runtime={"image": NEW_IMAGE}))
    cluster.reconcile(T0 + timedelta(minutes=1))
    assert cluster.jobs() == []
    assert condition(cluster, ConditionType.ENGINE_READY) == (TRUE, Reason.ENGINE_PINNED)


# -- serving pods that cannot start -------------------------------------------------------


def test_serving_pods_refusing_their_engine_make_the_object_degraded_with_their_message():
    cluster = Cluster(make_spec(engine={"pin": DIGEST_A}, runtime={"replicas": 2}))
    cluster.reconcile(T0)
    cluster.runtime_pods = [cluster.runtime_pod("7c9f-x2k4q", crash_looping())]
    decision = cluster.reconcile(T0 + timedelta(minutes=1))
    degraded = cluster.condition(ConditionType.DEGRADED)
    assert (degraded.status, degraded.reason) == (TRUE, Reason.ENGINE_INCOMPATIBLE)
    assert degraded.message.startswith(
        f"The runtime pod demo-runtime-7c9f-x2k4q (engine {DIGEST_A}) cannot start: its "
        f"runtime container exited with code 3 (Error): {REFUSAL}."
    )
    assert "A change of runtime.image builds the engine again" in degraded.message
    assert condition(cluster, ConditionType.READY) == (FALSE, Reason.ENGINE_INCOMPATIBLE)
    assert cluster.condition(ConditionType.READY).message.startswith(degraded.message)
    assert condition(cluster, ConditionType.STALLED) == (TRUE, Reason.ENGINE_INCOMPATIBLE)
    assert condition(cluster, ConditionType.PROGRESSING) == (FALSE, Reason.ENGINE_INCOMPATIBLE)
    assert cluster.status.phase == Phase.FAILED, "nothing serves"
    (warning,) = [e for e in decision.events if e.type == "Warning"]  # one reason, one Event
    assert warning.reason == Reason.ENGINE_INCOMPATIBLE
    assert "Degraded is True" in warning.message and REFUSAL in warning.message

    # Around the crash loop (starting again, then failing again) nothing is rewritten.
    writes = cluster.writes
    status = crash_looping()
    status.update(state={"running": {"startedAt": "2026-01-01T12:02:00Z"}}, restartCount=5)
    cluster.runtime_pods = [cluster.runtime_pod("7c9f-x2k4q", status)]
    assert cluster.reconcile(T0 + timedelta(minutes=2)).events == ()
    cluster.runtime_pods = [cluster.runtime_pod("7c9f-x2k4q", crash_looping())]
    assert cluster.reconcile(T0 + timedelta(minutes=3)).events == ()
    assert cluster.writes == writes

    # A second pod failing is counted; one serving keeps the phase Degraded.
    cluster.runtime_pods.append(cluster.runtime_pod("7c9f-z8w2m", crash_looping()))
    cluster.roll_out(ready=1)
    cluster.reconcile(T0 + timedelta(minutes=4))
    assert "2 runtime pods are failing." in cluster.condition(ConditionType.DEGRADED).message
    assert cluster.status.phase == Phase.DEGRADED

    # Fixed (a pin this image can load): the pods are ready, nothing is failing.
    cluster.runtime_pods = [cluster.runtime_pod("7c9f-x2k4q", {**crash_looping(), "ready": True})]
    cluster.roll_out()
    cluster.reconcile(T0 + timedelta(minutes=5))
    assert condition(cluster, ConditionType.DEGRADED) == (FALSE, Reason.AS_EXPECTED)
    assert condition(cluster, ConditionType.READY) == (TRUE, Reason.READY)


@pytest.mark.parametrize(
    ("container", "said"),
    [
        (
            crash_looping(1, "error: cannot load the engine: engine sha256:... is not in the "
                             "cache at /cache"),
            "exited with code 1 (Error): error: cannot load the engine",
        ),
        (
            {
                "ready": False,
                "state": {"waiting": {"reason": "ImagePullBackOff",
                                      "message": 'Back-off pulling image "nope:1"'}},
            },
            'cannot start (ImagePullBackOff): Back-off pulling image "nope:1"',
        ),
    ],
)  # fmt: skip
def test_runtime_pods_failing_otherwise_are_runtime_failing(container, said):
    cluster = Cluster(make_spec(engine={"pin": DIGEST_A}))
    cluster.reconcile(T0)
    cluster.runtime_pods = [cluster.runtime_pod("5d8b-q7r2t", container)]
    cluster.reconcile(T0 + timedelta(minutes=1))
    degraded = cluster.condition(ConditionType.DEGRADED)
    assert (degraded.status, degraded.reason) == (TRUE, Reason.RUNTIME_FAILING)
    assert said in degraded.message and "runtime.image" not in degraded.message


def test_while_a_new_images_engine_builds_the_pods_refusing_the_old_one_are_only_mentioned():
    cluster = Cluster(make_spec())
    cluster.build_to_ready(DIGEST_A)
    cluster.update_spec(make_spec(runtime={"image": NEW_IMAGE}))
    later = T0 + timedelta(minutes=10)
    cluster.reconcile(later)
    # The serving pods keep the image that built engine A while B builds; should a pod
    # refuse engine A meanwhile (e.g. rolled by hand to the new image), it is mentioned.
    template = cluster.get("Deployment")["spec"]["template"]
    assert template["spec"]["containers"][0]["image"] == DEFAULT_RUNTIME_IMAGE
    cluster.runtime_pods = [cluster.runtime_pod("9a7e-m4n6p", crash_looping())]
    cluster.roll_out(ready=0)  # its Deployment counts it not ready: the gather lists pods
    cluster.reconcile(later + timedelta(seconds=20))
    progressing = cluster.condition(ConditionType.PROGRESSING)
    assert (progressing.status, progressing.reason) == (TRUE, Reason.ENGINE_BUILDING)
    assert f"Meanwhile: The runtime pod demo-runtime-9a7e-m4n6p (engine {DIGEST_A})" in (
        progressing.message
    )
    assert condition(cluster, ConditionType.DEGRADED) == (FALSE, Reason.AS_EXPECTED)
    assert cluster.condition(ConditionType.STALLED).status == FALSE
    # Built: the Deployment now runs engine B; the pod of engine A is on its way out.
    cluster.succeed_job(unfinished_build(cluster)["metadata"]["name"], DIGEST_B, at=later)
    cluster.reconcile(later + timedelta(minutes=1))
    assert served(cluster) == DIGEST_B
    assert condition(cluster, ConditionType.DEGRADED) == (FALSE, Reason.AS_EXPECTED)
    assert condition(cluster, ConditionType.PROGRESSING) == (TRUE, Reason.ROLLING_OUT)


# -- the shadow candidate -----------------------------------------------------------------


def test_a_candidate_refusing_its_engine_fails_its_verdict_at_once():
    cluster = shadowing_cluster()
    serving_before = cluster.get("Deployment")
    refusal = REFUSAL.replace(DIGEST_A, DIGEST_B)
    cluster.candidate_pods = [
        cluster.runtime_pod("6b2c-h5j8k", crash_looping(message=refusal), name=CANDIDATE)
    ]
    cluster.roll_out(ready=0, name=CANDIDATE)  # not ready: the gather lists its pods
    cluster.reading = ShadowReading(ShadowAggregates(compared=0))
    decision = cluster.reconcile(T0 + timedelta(minutes=12))  # 600 s maxDuration: far off
    record = cluster.status.candidate
    assert (record.verdict, record.reason) == (ShadowVerdict.FAILED, Reason.ENGINE_INCOMPATIBLE)
    assert record.message.startswith(
        f"The shadow candidate pod {CANDIDATE}-6b2c-h5j8k (engine {DIGEST_B}) cannot start"
    )
    assert refusal in record.message
    assert not cluster.has("Deployment", CANDIDATE) and not cluster.has("Service", CANDIDATE)
    assert cluster.get("Deployment") == serving_before and served(cluster) == DIGEST_A
    shadow = cluster.condition(ConditionType.SHADOW_PASSED)
    assert (shadow.status, shadow.reason) == (FALSE, Reason.SHADOW_FAILED)
    assert "EngineIncompatible" in shadow.message and refusal in shadow.message
    assert condition(cluster, ConditionType.DEGRADED) == (TRUE, Reason.SHADOW_FAILED)
    assert any(e.reason == Reason.SHADOW_FAILED and e.type == "Warning" for e in decision.events)


def test_a_candidate_failing_otherwise_stays_pending_and_says_why():
    cluster = shadowing_cluster()
    crash = crash_looping(1, "error: cannot load the engine: CUDA device 0 is busy")
    cluster.candidate_pods = [cluster.runtime_pod("6b2c-h5j8k", crash, name=CANDIDATE)]
    cluster.roll_out(ready=0, name=CANDIDATE)  # not ready: the gather lists its pods
    cluster.reading = ShadowReading(ShadowAggregates(compared=0))
    cluster.reconcile(T0 + timedelta(minutes=12))
    record = cluster.status.candidate
    assert record.verdict == ShadowVerdict.PENDING
    assert "exited with code 1 (Error): error: cannot load the engine: CUDA" in record.message
    cluster.reconcile(T0 + timedelta(minutes=25))  # started at 10:31, 600 s max
    assert cluster.status.candidate.verdict == ShadowVerdict.FAILED


def test_a_replaced_candidates_failing_pods_do_not_fail_the_new_trial():
    cluster = shadowing_cluster()
    old_pod = cluster.runtime_pod("6b2c-h5j8k", crash_looping(), name=CANDIDATE)
    build_new_version(cluster, "3", "sha256:" + "c" * 64, T0 + timedelta(minutes=12))
    assert served(cluster, CANDIDATE) == "sha256:" + "c" * 64
    cluster.candidate_pods = [old_pod]  # engine B's pod, still terminating its crash loop
    cluster.reading = ShadowReading(ShadowAggregates(compared=0))
    cluster.reconcile(T0 + timedelta(minutes=13))
    assert cluster.status.candidate.verdict == ShadowVerdict.PENDING
    assert cluster.status.candidate.version == "3"


def test_a_candidate_of_a_shadow_spec_is_judged_on_its_own_pods_only():
    """The serving pods' failure is the serving status', never the candidate's verdict."""
    cluster = Cluster(shadow_spec("1"))
    cluster.build_to_ready(DIGEST_A)
    build_new_version(cluster, "2", DIGEST_B, T0 + timedelta(minutes=10))
    cluster.runtime_pods = [cluster.runtime_pod("1a2b-c3d4e", crash_looping())]
    cluster.roll_out(ready=0)  # its Deployment counts it not ready: the gather lists pods
    cluster.reconcile(T0 + timedelta(minutes=11))
    assert cluster.status.candidate.verdict == ShadowVerdict.PENDING
    assert condition(cluster, ConditionType.DEGRADED) == (TRUE, Reason.ENGINE_INCOMPATIBLE)


# -- what is read, and the runtime's exit code -------------------------------------------


def test_pods_are_read_only_while_a_deployment_is_not_settled():
    def deployment(replicas: int, ready: int, updated: int, total: int, seen: int = 2) -> dict:
        return {
            "metadata": {"generation": 2},
            "spec": {"replicas": replicas},
            "status": {
                "observedGeneration": seen,
                "replicas": total,
                "updatedReplicas": updated,
                "readyReplicas": ready,
            },
        }

    assert not unsettled(None)
    assert not unsettled(deployment(3, 3, 3, 3))
    assert not unsettled(deployment(0, 0, 0, 0))
    assert unsettled(deployment(3, 2, 3, 3)), "a pod not ready"
    assert unsettled(deployment(3, 3, 2, 3)), "a pod not updated"
    assert unsettled(deployment(3, 3, 3, 4)), "a surge pod"
    assert unsettled(deployment(3, 3, 3, 3, seen=1)), "a template the controller has not seen"
    assert unsettled({"metadata": {"generation": 1}, "spec": {"replicas": 1}})


def test_the_operator_reads_the_runtimes_own_exit_code():
    from kubeinfer.runtime import engine_cache

    assert EXIT_ENGINE_INCOMPATIBLE == engine_cache.EXIT_ENGINE_INCOMPATIBLE


@pytest.mark.slow
def test_a_real_runtime_refusing_its_pinned_engine_is_reported_with_its_own_words(tmp_path):
    from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
    from kubeinfer.runtime.building.engine_build import build_engine
    from test_operator_engine_image import publish_as_built_by

    # An engine entry as ONNX Runtime 1.16.3 would have written it into the cache.
    model = build_tiny_mlp(tmp_path / "tiny.onnx")
    built = build_engine(str(model), "onnxruntime", "fp32", tmp_path / "b", max_batch_size=8)
    cache = tmp_path / "cache"
    digest = publish_as_built_by(built, cache, "1.16.3")

    cluster = Cluster(
        make_spec(
            engine={"pin": digest, "maxBatchSize": 8},
            runtime={"batching": {"maxBatchSize": 8}, "replicas": 1},
        )
    )
    cluster.reconcile(T0)
    container = cluster.get("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # The pod, as a kubelet runs it: the container's argv, with the mounted ConfigMap,
    # the cache volume and the termination log at paths of this machine.
    config = yaml.safe_load(cluster.get("ConfigMap")["data"][CONFIG_KEY])
    assert config["engine"]["cacheDirectory"] == CACHE_MOUNT
    config["engine"]["cacheDirectory"] = str(cache)
    config["mirrorTargetFile"] = str(tmp_path / "mirror.yaml")
    (tmp_path / CONFIG_KEY).write_text(yaml.safe_dump(config))
    log = tmp_path / "termination-log"
    paths = {f"{CONFIG_MOUNT}/{CONFIG_KEY}": str(tmp_path / CONFIG_KEY)}
    argv = [paths.get(arg, arg) for arg in container["args"]]
    process = subprocess.run(
        [sys.executable, "-m", "kubeinfer.cli", *argv,
         "--termination-message-path", str(log)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert process.returncode == EXIT_ENGINE_INCOMPATIBLE, process.stderr

    terminated = {"exitCode": process.returncode, "reason": "Error", "message": log.read_text()}
    status = {"ready": False, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    cluster.runtime_pods = [
        cluster.runtime_pod("4f6d-k9s3v", {**status, "lastState": {"terminated": terminated}})
    ]
    cluster.reconcile(T0 + timedelta(minutes=1))
    degraded = cluster.condition(ConditionType.DEGRADED)
    assert (degraded.status, degraded.reason) == (TRUE, Reason.ENGINE_INCOMPATIBLE)
    assert (
        f"{digest} was built by onnxruntime 1.16.3, but this image has onnxruntime "
        f"{built.manifest.key.backend_version}" in degraded.message
    )
    assert log.read_text() in degraded.message


@pytest.mark.slow
def test_a_build_job_of_a_model_serve_would_refuse_fails_with_serves_reason(tmp_path):
    import numpy as np
    from kubeinfer.runtime.building.calibration import write_samples
    from onnx_models import build_reduced_batch_model

    build_reduced_batch_model(tmp_path / "reduced.onnx")
    samples = {"x": np.random.default_rng(0).random((16, 3), np.float32)}
    calibration = write_samples(tmp_path / "calibration.npz", samples)
    cluster = Cluster(
        make_spec(
            model={"source": {"uri": f"file://{tmp_path / 'reduced.onnx'}", "sha256": None}},
            engine={"precision": "int8", "calibration": {"uri": f"file://{calibration}"}},
        )
    )
    cluster.reconcile(T0)
    (job,) = cluster.jobs()
    (container,) = job["spec"]["template"]["spec"]["containers"]
    log = tmp_path / "termination-log"
    paths = {CACHE_MOUNT: str(tmp_path / "cache"), TERMINATION_LOG: str(log)}
    argv = [paths.get(arg, arg) for arg in container["args"]]
    build = subprocess.run(
        [sys.executable, "-m", "kubeinfer.cli", *argv],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert build.returncode == 2, build.stderr
    reason = "output 'total' has a fixed first dimension (1)"
    assert reason in log.read_text()
    cluster.fail_job(
        job["metadata"]["name"], "BackoffLimitExceeded", "Job has reached the specified "
        "backoff limit", log.read_text(), at=T0 + timedelta(seconds=30),
    )  # fmt: skip
    cluster.reconcile(T0 + timedelta(seconds=31))
    engine = cluster.condition(ConditionType.ENGINE_READY)
    assert (engine.status, engine.reason) == (FALSE, Reason.ENGINE_BUILD_FAILED)
    assert f"cannot be served: {reason}" in engine.message


# -- reading one pod and one Deployment ------------------------------------------------


def runtime_pod_with(container: dict) -> dict:
    return {"metadata": {"name": "p"}, "status": {"containerStatuses": [container]}}


@pytest.mark.parametrize(
    ("container", "reason", "words"),
    [
        (  # the container has just exited: its current state, not its last one
            {"name": "runtime", "state": {"terminated": {"exitCode": 3, "message": "no"}}},
            Reason.ENGINE_INCOMPATIBLE,
            "exited with code 3 (Error): no.",
        ),
        (  # no reason and no message from the kubelet: the words it has
            {"name": "runtime", "lastState": {"terminated": {"exitCode": 1}}},
            Reason.RUNTIME_FAILING,
            "exited with code 1 (Error).",
        ),
        (
            {"name": "runtime", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}},
            Reason.RUNTIME_FAILING,
            "exited with code 137 (OOMKilled).",
        ),
        (
            {"name": "runtime", "state": {"waiting": {"reason": "ErrImagePull"}}},
            Reason.RUNTIME_FAILING,
            "cannot start (ErrImagePull).",
        ),
        (
            {"name": "runtime", "state": {"waiting": {"reason": "ErrImagePull", "message": "x"}}},
            Reason.RUNTIME_FAILING,
            "cannot start (ErrImagePull): x.",
        ),
    ],
    ids=["terminated now", "no reason or message", "oom", "no pull message", "pull message"],
)
def test_a_runtime_pods_failure_is_told_in_the_kubelets_words(container, reason, words):
    failure = runtime_failure([runtime_pod_with(container)])
    assert failure is not None and failure.reason == reason
    assert f"The runtime pod p cannot start: its runtime container {words}" in failure.message


@pytest.mark.parametrize(
    ("deployment", "settled"),
    [
        ({"metadata": {"generation": 2}, "spec": {"replicas": 2}, "status": {}}, False),
        (  # spec.replicas left out: the API server's default, 1
            {
                "metadata": {"generation": 2},
                "spec": {},
                "status": {
                    "observedGeneration": 2,
                    "replicas": 1,
                    "updatedReplicas": 1,
                    "readyReplicas": 1,
                },
            },
            True,
        ),
        (  # the counts match but the controller has not observed this generation
            {
                "metadata": {"generation": 1},
                "spec": {"replicas": 1},
                "status": {"replicas": 1, "updatedReplicas": 1, "readyReplicas": 1},
            },
            False,
        ),
        (  # an old pod still running beside the new ones
            {
                "metadata": {"generation": 3},
                "spec": {"replicas": 2},
                "status": {
                    "observedGeneration": 3,
                    "replicas": 3,
                    "updatedReplicas": 2,
                    "readyReplicas": 2,
                },
            },
            False,
        ),
    ],
    ids=["new", "default replicas", "generation not observed", "old pod left"],
)
def test_a_deployment_is_settled_once_its_controller_reports_every_pod_updated_and_ready(
    deployment, settled
):
    assert unsettled(deployment) is not settled
