"""What each child carries: the runtime pod's security, probes, drain timing, rollout
strategy, scrape annotations and mounts; the build Job's placement and sources; the cache
claim; names that stay valid for the longest owner name; deterministic output.
"""

from __future__ import annotations

import yaml
from decide_scenarios import DIGEST_A, SETTINGS, T0, Cluster, make_spec, tuned, validate_kubernetes
from hypothesis import given, settings
from hypothesis import strategies as st
from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentStatus
from kubeinfer.operator.reconcile.decide import decide
from kubeinfer.operator.reconcile.desired import (
    CONFIG_KEY,
    MIRROR_KEY,
    MIRROR_MOUNT,
    TESTING_FAULTS_ENV,
    runtime_config,
)
from kubeinfer.operator.reconcile.desired_mirror import build_mirror_configmap
from kubeinfer.operator.state import names
from kubeinfer.operator.state.observed import ObservedState, OwnerRef


def ready_cluster(**sections) -> Cluster:
    cluster = Cluster(make_spec(**sections))
    cluster.build_to_ready(DIGEST_A)
    return cluster


def test_runtime_pods_are_locked_down():
    pod = ready_cluster().get("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["tmp"]["mountPath"] == "/tmp" and volumes["tmp"] == {
        "name": "tmp",
        "emptyDir": {},
    }
    assert mounts["cache"]["readOnly"] is True
    assert volumes["cache"]["persistentVolumeClaim"]["readOnly"] is True


def test_runtime_pods_serve_probe_and_drain_before_they_are_killed():
    deployment = ready_cluster().get("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["kubeinfer"]
    assert container["args"] == ["serve", "--config", "/etc/kubeinfer/runtime.yaml"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = SETTINGS.pods.drain_grace_period_seconds
    assert pod["terminationGracePeriodSeconds"] > pause + drain
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8000"
    assert names.ANNOTATION_CONFIG_HASH in annotations


def test_the_runtime_drains_for_the_operators_grace_period_and_only_serving_pods_mirror():
    settings = tuned(SETTINGS, pods={"drain_grace_period_seconds": 7})
    cluster = Cluster(make_spec())
    cluster.reconcile(T0, settings)
    (job,) = cluster.jobs()
    cluster.succeed_job(job["metadata"]["name"], DIGEST_A)
    cluster.reconcile(T0, settings)
    config = yaml.safe_load(cluster.get("ConfigMap")["data"][CONFIG_KEY])
    assert config["drainGracePeriodSeconds"] == 7
    pod = cluster.get("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pause + 7
    assert config["mirrorTargetFile"] == f"{MIRROR_MOUNT}/{MIRROR_KEY}"
    candidate = runtime_config(make_spec(), settings, "2", DIGEST_A, role=names.ROLE_CANDIDATE)
    assert candidate.mirror_target_file is None, "a candidate mirrors to nobody"


def test_the_runtime_config_text_is_what_pyyamls_own_dumper_writes():
    # The ConfigMap's text is hashed into the pods' template: a dumper that wrote it
    # differently would roll every runtime out on an operator upgrade.
    spec = make_spec(rollout={"strategy": "Shadow", "shadow": {"trafficPercent": 5}})
    cluster = Cluster(spec)
    cluster.reconcile(T0, SETTINGS)
    (job,) = cluster.jobs()
    cluster.succeed_job(job["metadata"]["name"], DIGEST_A)
    cluster.reconcile(T0, SETTINGS)
    text = cluster.get("ConfigMap")["data"][CONFIG_KEY]
    assert text == yaml.safe_dump(yaml.safe_load(text), sort_keys=True)
    owner = OwnerRef("demo", "ns", "uid", 1)
    mirror = build_mirror_configmap(owner, spec, "1", ("2", DIGEST_A))["data"][MIRROR_KEY]
    assert mirror == yaml.safe_dump(yaml.safe_load(mirror), sort_keys=True)


def test_the_mirror_target_carries_the_shadows_mirror_limits():
    shadow = {"trafficPercent": 5, "mirror": {"maxConcurrency": 9, "timeoutMilliseconds": 750}}
    spec = make_spec(rollout={"strategy": "Shadow", "shadow": shadow})
    owner = OwnerRef("demo", "ns", "uid", 1)
    configmap = build_mirror_configmap(owner, spec, "1", ("2", DIGEST_A))
    target = yaml.safe_load(configmap["data"][MIRROR_KEY])["target"]
    assert target["trafficPercent"] == 5
    assert (target["policy"]["maxConcurrency"], target["policy"]["timeoutMilliseconds"]) == (
        9,
        750,
    )


def test_gpu_runtime_pods_request_gpus_on_the_product_they_were_built_for():
    cluster = ready_cluster(
        engine={"backend": "tensorrt"},
        runtime={"resources": {"gpus": 2, "memory": "8Gi"}, "gpuProduct": "NVIDIA-L4"},
    )
    pod = cluster.get("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == {"memory": "8Gi", "nvidia.com/gpu": "2"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert container["image"] == SETTINGS.images.gpu_runtime, "TensorRT runs in the GPU image"


def test_runtime_pods_run_the_image_for_their_backend_unless_the_spec_names_one():
    for sections, image in (
        ({}, SETTINGS.images.runtime),
        (
            {
                "engine": {"backend": "tensorrt"},
                "runtime": {"resources": {"gpus": 1}, "gpuProduct": "NVIDIA-L4"},
            },
            None,
        ),
        ({"runtime": {"image": "registry.example.com/own:1"}}, "registry.example.com/own:1"),
    ):
        (container,) = ready_cluster(**sections).get("Deployment")["spec"]["template"]["spec"][
            "containers"
        ]
        assert container["image"] == (image or SETTINGS.images.gpu_runtime), sections


def test_the_service_exposes_http_and_metrics_on_the_runtime_pods():
    cluster = ready_cluster()
    service = cluster.get("Service")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "http": 8000,
        "metrics": 9090,
    }
    deployment = cluster.get("Deployment")
    selector = service["spec"]["selector"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    # This object's serving pods only, in as few labels as say so (docs/fleet.md).
    assert selector == {names.LABEL_INSTANCE: cluster.name, names.LABEL_ROLE: names.ROLE_SERVING}


def test_a_pvc_source_is_mounted_read_only_and_credentials_come_from_the_secret():
    spec = make_spec(
        model={"source": {"uri": "pvc://models/mlp/1/model.onnx", "secretRef": {"name": "creds"}}},
        engine={"precision": "int8", "calibration": {"uri": "pvc://models/mlp/1/calib.npz"}},
    )
    job = next(o for o in Cluster(spec).reconcile().apply if o["kind"] == "Job")
    validate_kubernetes(job)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[args.index("--model") + 1] == "file:///sources/models/mlp/1/model.onnx"
    source = next(v for v in pod["volumes"] if v["name"] == "source-0")
    assert source["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert args[args.index("--calibration") + 1] == "file:///sources/models/mlp/1/calib.npz"
    assert [v["name"] for v in pod["volumes"]] == ["cache", "tmp", "source-0"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "source-0")
    assert mount == {"name": "source-0", "mountPath": "/sources/models", "readOnly": True}
    assert container["envFrom"] == [{"secretRef": {"name": "creds"}}]


def test_calibration_data_on_another_claim_gets_its_own_mount_and_its_checksum_is_passed():
    sha = "e" * 64
    spec = make_spec(
        model={"source": {"uri": "pvc://models/mlp/1/model.onnx"}},
        engine={
            "precision": "int8",
            "calibration": {"uri": "pvc://calibration/mlp.npz", "sha256": sha},
        },
    )
    job = next(o for o in Cluster(spec).reconcile().apply if o["kind"] == "Job")
    validate_kubernetes(job)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--model") + 1] == "file:///sources/models/mlp/1/model.onnx"
    assert args[args.index("--calibration") + 1] == "file:///sources/calibration/mlp.npz"
    assert args[args.index("--calibration-sha256") + 1] == sha
    mounts = {m["name"]: m for m in container["volumeMounts"] if m["name"].startswith("source")}
    assert mounts["source-1"] == {
        "name": "source-1",
        "mountPath": "/sources/calibration",
        "readOnly": True,
    }


def test_the_cache_claim_follows_the_spec_and_an_existing_claim_is_not_created():
    cache = {"size": "20Gi", "storageClassName": "fast", "accessMode": "ReadWriteMany"}
    pvc = next(
        o
        for o in Cluster(make_spec(engine={"cache": cache})).reconcile().apply
        if o["kind"] == "PersistentVolumeClaim"
    )
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "20Gi"}},
        "storageClassName": "fast",
    }
    decision = Cluster(make_spec(engine={"cache": {"existingClaim": "shared"}})).reconcile()
    assert [o["kind"] for o in decision.apply] == ["Job"]
    volumes = decision.apply[0]["spec"]["template"]["spec"]["volumes"]
    assert volumes[0]["persistentVolumeClaim"] == {"claimName": "shared"}


@settings(max_examples=40, deadline=None)
@given(name=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?", fullmatch=True))
def test_child_names_are_valid_and_deterministic_for_any_owner_name(name):
    observed = ObservedState(
        owner=OwnerRef(name, "ns", "uid", 1), spec=make_spec(), status=InferenceDeploymentStatus()
    )
    first = decide(observed, SETTINGS, T0)
    assert first == decide(observed, SETTINGS, T0)
    for child in first.desired:
        child_name = child["metadata"]["name"]
        assert len(child_name) <= 63
        assert child_name[0].isalnum() and child_name[-1].isalnum()
    job_name = names.build_job_name(name, "k" * 64, 12)
    assert len(job_name) <= 63


def test_the_tests_faults_reach_the_serving_pods_of_the_objects_named_only():
    def faults(settings, name="demo", namespace="ns", role="Deployment"):
        cluster = Cluster(make_spec(), name=name, namespace=namespace)
        cluster.reconcile(T0, settings)
        (job,) = cluster.jobs()
        cluster.succeed_job(job["metadata"]["name"], DIGEST_A)
        cluster.reconcile(T0, settings)
        (container,) = cluster.get(role)["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        return env.get(TESTING_FAULTS_ENV)

    spec = "perturb-batches=1,perturb-after-batches=40"
    assert faults(SETTINGS) is None, "none unless the settings name some"
    everywhere = tuned(SETTINGS, pods={"testing_faults": spec})
    assert faults(everywhere) == spec, "no objects named: every object's serving pods"
    named = tuned(everywhere, pods={"testing_faults_objects": "ns/answers, other/demo"})
    assert named.pods.testing_faults_objects == ("ns/answers", "other/demo")
    assert faults(named, name="answers") == spec
    assert faults(named) is None, "ns/demo is not named"
    assert faults(named, namespace="other") == spec
    empty = tuned(everywhere, pods={"testing_faults_objects": ()})
    assert faults(empty) == spec, "an empty list names every object, as unset"
