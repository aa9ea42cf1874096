"""Builders of the children of an InferenceDeployment, as plain Kubernetes objects. Pure.

Each builder returns exactly the fields the operator owns (server-side apply with field
manager `kubeinfer` then owns those and nothing else), with the standard labels, an
ownerReference to the InferenceDeployment (so deleting it garbage-collects them) and an
input-hash annotation over everything else it sets: a child whose observed hash equals
the desired one needs no write (prometheus-operator's approach).

Spec fields never reach a shell: containers run the `kubeinfer` CLI with an argv list.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from kubeinfer.contract.runtime_config import (
    EngineSource,
    RuntimeConfig,
    request_bytes_limit,
)
from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec
from kubeinfer.operator.reconcile.child_meta import finish_child
from kubeinfer.operator.reconcile.desired_monitoring import scrape_annotations
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state import names
from kubeinfer.operator.state.build_attempt import BatchingFinding
from kubeinfer.operator.state.engine_state import (
    ANNOTATION_AGREEMENT,
    ANNOTATION_BATCHING,
    ANNOTATION_INPUT_BYTES_PER_ROW,
)
from kubeinfer.operator.state.known_answers import GATE_CONDITION
from kubeinfer.operator.state.observed import KubeObject, OwnerRef
from kubeinfer.operator.state.quality_readings import BuildAgreement

YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
"""libyaml's emitter where PyYAML has it (its wheels do): the same text as PyYAML's own
safe dumper, several times faster, and a pass renders the runtime's config every time."""

CACHE_MOUNT = "/cache"
CONFIG_MOUNT = "/etc/kubeinfer"
CONFIG_KEY = "runtime.yaml"
MIRROR_MOUNT = "/etc/kubeinfer-mirror"
"""Not below CONFIG_MOUNT: a mount point inside a ConfigMap volume cannot be created."""
MIRROR_KEY = "mirror.yaml"
SOURCES_MOUNT = "/sources"
TERMINATION_LOG = "/dev/termination-log"
HTTP_PORT = 8000
METRICS_SERVICE_PORT = 9090
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
TESTING_FAULTS_ENV = "KUBEINFER_SERVE_TESTING_FAULTS"
NON_ROOT_ID = 65532


def cache_claim(spec: InferenceDeploymentSpec, owner: str) -> str:
    """The claim both the build Job and the runtime mount."""
    return spec.engine.cache.existing_claim or names.cache_claim_name(owner)


def build_cache_pvc(owner: OwnerRef, spec: InferenceDeploymentSpec) -> KubeObject | None:
    """The engine cache claim, or None when the spec names an existing claim."""
    cache = spec.engine.cache
    if cache.existing_claim:
        return None
    body: dict[str, Any] = {
        "accessModes": [cache.access_mode],
        "resources": {"requests": {"storage": cache.size}},
    }
    if cache.storage_class_name:
        body["storageClassName"] = cache.storage_class_name
    labels = names.common_labels(owner.name, spec.model.version, names.COMPONENT_CACHE)
    return finish_child(
        "v1",
        "PersistentVolumeClaim",
        names.cache_claim_name(owner.name),
        owner,
        labels,
        {"spec": body},
    )


def pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_ID,
        "runAsGroup": NON_ROOT_ID,
        "fsGroup": NON_ROOT_ID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def placement(spec: InferenceDeploymentSpec) -> dict[str, Any]:
    """nodeSelector (with the GPU product, since an engine runs only on the GPU it was
    built for) and tolerations, shared by build Jobs and runtime pods."""
    selector = dict(spec.runtime.node_selector)
    if spec.runtime.gpu_product:
        selector[GPU_PRODUCT_LABEL] = spec.runtime.gpu_product
    placement: dict[str, Any] = {}
    if selector:
        placement["nodeSelector"] = dict(sorted(selector.items()))
    if spec.runtime.tolerations:
        placement["tolerations"] = [t.to_wire() for t in spec.runtime.tolerations]
    return placement


def runtime_config(
    spec: InferenceDeploymentSpec,
    settings: OperatorSettings,
    version: str,
    digest: str,
    role: str = names.ROLE_SERVING,
    input_bytes_per_row: int | None = None,
) -> RuntimeConfig:
    """What `kubeinfer serve` runs: the given engine from the mounted cache. Serving pods
    also watch the mirror target file (always mounted, so a shadow starts without a
    restart); a candidate mirrors nothing. The request body limit holds a full batch
    (the runtime's maxBatchSize) of the engine's inputs as JSON, when the build reported
    their size (`config.request_bytes_limit`); otherwise it is left to the runtime, which
    derives it the same way from the model it loads (at each input's largest shape)."""
    max_request_bytes = (
        None
        if input_bytes_per_row is None
        else request_bytes_limit(input_bytes_per_row, spec.runtime.batching.max_batch_size)
    )
    return RuntimeConfig(
        model_name=spec.model.name,
        model_version=version,
        engine=EngineSource(digest=digest, cache_directory=CACHE_MOUNT),
        batching=spec.runtime.batching,
        input_shapes=spec.engine.input_shapes,
        slo_p99_latency_milliseconds=spec.slo.p99_latency_milliseconds,
        http_port=HTTP_PORT,
        grpc_port=spec.runtime.grpc_port,
        drain_grace_period_seconds=settings.pods.drain_grace_period_seconds,
        mirror_target_file=f"{MIRROR_MOUNT}/{MIRROR_KEY}" if role == names.ROLE_SERVING else None,
        max_request_bytes=max_request_bytes,
    )


def _role_names(owner: str, role: str) -> tuple[str, str]:
    """(children's name, component label) of the serving runtime, the shadow candidate or
    the quality watch's reference."""
    if role == names.ROLE_CANDIDATE:
        return names.candidate_name(owner), names.COMPONENT_CANDIDATE
    if role == names.ROLE_REFERENCE:
        return names.reference_name(owner), names.COMPONENT_REFERENCE
    return names.runtime_name(owner), names.COMPONENT_RUNTIME


def _pods_of(owner: str, role: str) -> dict[str, str]:
    """The selector of a role's pods, for its Service (the serving Service selects the
    serving role only, so neither a candidate nor a reference ever takes live traffic)."""
    if role == names.ROLE_CANDIDATE:
        return names.candidate_selector(owner)
    if role == names.ROLE_REFERENCE:
        return names.reference_selector(owner)
    return names.serving_selector(owner)


def build_runtime_configmap(
    owner: OwnerRef,
    config: RuntimeConfig,
    build_key: str | None,
    image: str,
    role: str = names.ROLE_SERVING,
    input_bytes_per_row: int | None = None,
    agreement: BuildAgreement | None = None,
    product: str | None = None,
    batching: BatchingFinding | None = None,
) -> KubeObject:
    """The runtime's config as YAML; its annotations record which engine inputs the
    digest was built from, the image it runs in (read by the Deployment's builder, and
    by `decide` to keep an older engine in the image that built it), and the engine's
    input size, build agreement and whether its model batches (read back by
    `engine_state`). With `product`, one GPU
    product's of a mixed fleet (its name and label say which; its Deployment follows)."""
    text = yaml.dump(config.to_wire(), Dumper=YAML_DUMPER, sort_keys=True)
    annotations = {
        names.ANNOTATION_ENGINE_DIGEST: config.engine.digest or "",
        names.ANNOTATION_RUNTIME_IMAGE: image,
    }
    if build_key:
        annotations[names.ANNOTATION_BUILD_KEY] = build_key
    if input_bytes_per_row is not None:
        annotations[ANNOTATION_INPUT_BYTES_PER_ROW] = str(input_bytes_per_row)
    if agreement is not None:
        annotations[ANNOTATION_AGREEMENT] = json.dumps(
            agreement.to_wire(), sort_keys=True, separators=(",", ":")
        )
    if batching is not None:
        annotations[ANNOTATION_BATCHING] = json.dumps(
            batching.to_wire(), sort_keys=True, separators=(",", ":")
        )
    name, component = _role_names(owner.name, role)
    labels = names.common_labels(owner.name, config.model_version, component)
    if product is not None:
        name = names.product_runtime_name(owner.name, product)
        labels[names.LABEL_GPU_PRODUCT] = product
    body = {"data": {CONFIG_KEY: text}}
    return finish_child("v1", "ConfigMap", name, owner, labels, body, annotations)


def desired_replicas(spec: InferenceDeploymentSpec) -> int:
    """Pods to run where the autoscaler has no say: `runtime.replicas` with autoscaling off;
    with it on, only before the serving Deployment exists (the autoscaler sets the count
    from then on), so a new Deployment starts at minReplicas (one pod at least: an object
    that scales to zero starts serving, and goes to zero once idle)."""
    scaling = spec.autoscaling
    return max(1, scaling.min_replicas) if scaling.enabled else spec.runtime.replicas


def _runtime_resources(spec: InferenceDeploymentSpec) -> dict[str, Any]:
    resources = spec.runtime.resources
    amounts = {k: v for k, v in (("cpu", resources.cpu), ("memory", resources.memory)) if v}
    if resources.gpus:
        amounts[GPU_RESOURCE] = str(resources.gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def build_runtime_deployment(
    owner: OwnerRef,
    spec: InferenceDeploymentSpec,
    settings: OperatorSettings,
    configmap: KubeObject,
    replicas: int,
    role: str = names.ROLE_SERVING,
    pod_monitors: bool = False,
) -> KubeObject:
    """The runtime pods, serving or the shadow candidate. The pod template carries the
    ConfigMap's hash, so a new engine or policy rolls the pods; maxUnavailable 0 keeps
    serving capacity during the roll. The mirror target is mounted but not hashed:
    changing it must not roll anything."""
    meta = configmap["metadata"]
    version = meta["labels"][names.LABEL_VERSION]
    serving = role == names.ROLE_SERVING
    name, component = _role_names(owner.name, role)
    # The serving Deployment's selector is immutable and older than the role label.
    selector = names.runtime_selector(owner.name) if serving else _pods_of(owner.name, role)
    product = meta["labels"].get(names.LABEL_GPU_PRODUCT)
    if product is not None:  # a mixed GPU fleet's Deployment of one product
        name, selector = meta["name"], names.product_selector(owner.name, product)
    template_annotations = {
        names.ANNOTATION_CONFIG_HASH: names.stable_hash(configmap["data"]),
        names.ANNOTATION_ENGINE_DIGEST: meta["annotations"][names.ANNOTATION_ENGINE_DIGEST],
        **scrape_annotations(pod_monitors),
    }
    if names.ANNOTATION_BUILD_KEY in meta["annotations"]:
        template_annotations[names.ANNOTATION_BUILD_KEY] = meta["annotations"][
            names.ANNOTATION_BUILD_KEY
        ]
    labels = names.common_labels(owner.name, version, component)
    if product is not None:
        labels[names.LABEL_GPU_PRODUCT] = product
    template_labels = {**labels, names.LABEL_ROLE: role}
    body = {
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": selector},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {"labels": template_labels, "annotations": template_annotations},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": pod_security(),
                    "terminationGracePeriodSeconds": settings.pods.termination_grace_period_seconds,
                    **placement(spec),
                    **_spread(spec, selector),
                    "containers": [_runtime_container(owner, spec, settings, meta, serving)],
                    "volumes": _runtime_volumes(owner, spec, meta, serving),
                    **_readiness_gates(spec, serving),
                },
            },
        }
    }
    return finish_child("apps/v1", "Deployment", name, owner, labels, body)


def build_disruption_budget(owner: OwnerRef, version: str) -> KubeObject:
    """The serving pods' PodDisruptionBudget: one at a time may go by eviction (a drain,
    the cluster autoscaler), the next only once its replacement is ready, so voluntary
    disruptions never take serving below all its pods but one. It selects every serving
    pod of the object (a mixed fleet's products together), not a shadow candidate's or a
    quality reference's, which take no traffic. A pod that is not ready may always be
    evicted: it serves nothing, and a budget counting it would block a drain for good.
    Involuntary disruptions (a node lost) are not bound by it; the spreading limits those."""
    labels = names.common_labels(owner.name, version, names.COMPONENT_RUNTIME)
    selector = {"matchLabels": names.serving_selector(owner.name)}
    body = {
        "spec": {
            "maxUnavailable": 1,
            "selector": selector,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        }
    }
    name = names.runtime_name(owner.name)
    return finish_child("policy/v1", "PodDisruptionBudget", name, owner, labels, body)


def _spread(spec: InferenceDeploymentSpec, selector: dict[str, str]) -> dict[str, Any]:
    """The runtime pods' topologySpreadConstraints (`runtime.topologySpread`), one per
    key, over the pods of one revision (a rolling update's new pods spread among
    themselves: `matchLabelKeys`), if any."""
    spread = spec.runtime.topology_spread
    constraints = [
        {
            "maxSkew": spread.max_skew,
            "topologyKey": key,
            "whenUnsatisfiable": spread.when_unsatisfiable,
            "labelSelector": {"matchLabels": dict(selector)},
            "matchLabelKeys": ["pod-template-hash"],
        }
        for key in spread.topology_keys
    ]
    return {"topologySpreadConstraints": constraints} if constraints else {}


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


def _runtime_container(
    owner: OwnerRef,
    spec: InferenceDeploymentSpec,
    settings: OperatorSettings,
    meta: dict[str, Any],
    serving: bool,
) -> dict[str, Any]:
    """The runtime pods' one container: `kubeinfer serve` on the ConfigMap's config, in
    the image recorded on it, with its probes, ports, preStop pause and mounts (the
    mirror file on serving pods only)."""
    container: dict[str, Any] = {
        "name": "runtime",
        "image": meta["annotations"][names.ANNOTATION_RUNTIME_IMAGE],
        "imagePullPolicy": settings.images.pull_policy,
        "command": ["kubeinfer"],
        "args": ["serve", "--config", f"{CONFIG_MOUNT}/{CONFIG_KEY}"],
        "env": _runtime_env(settings, serving, owner),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            *_grpc_ports(spec.runtime.grpc_port, "containerPort"),
        ],
        # Loading an engine can take minutes; the startup probe holds liveness off until then.
        "startupProbe": _probe("/v2/health/live", 5, 120),
        "livenessProbe": _probe("/v2/health/live", 10, 3),
        "readinessProbe": _probe("/v2/health/ready", 5, 2),
        "lifecycle": {"preStop": {"sleep": {"seconds": settings.pods.pre_stop_sleep_seconds}}},
        "securityContext": container_security(),
        # `kubeinfer serve` writes why it could not start there (exit 3: an engine built
        # by another backend version), and the status reports it from the pod's status.
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
            {"name": "cache", "mountPath": CACHE_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    if serving:
        container["volumeMounts"].append(
            {"name": "mirror", "mountPath": MIRROR_MOUNT, "readOnly": True}
        )
    if _runtime_resources(spec):
        container["resources"] = _runtime_resources(spec)
    return container


def _readiness_gates(spec: InferenceDeploymentSpec, serving: bool) -> dict[str, Any]:
    """Where spec.knownAnswers turns the checks on, a serving pod takes traffic only once
    the operator saw it answer its known-answer set (reconcile.known_answers), and leaves
    its Service, alive, when it answers wrong later. Off (the default): no gate, so a pod's
    readiness never waits on the operator."""
    if not serving or spec.known_answers is None:
        return {}
    return {"readinessGates": [{"conditionType": GATE_CONDITION}]}


def _runtime_env(
    settings: OperatorSettings, serving: bool, owner: OwnerRef
) -> list[dict[str, str]]:
    """HOME, and on serving pods the tests' injected faults where the operator's settings
    name some, for this object (`pods.testing_faults_objects`; never in production:
    docs/known-answers.md)."""
    env = [{"name": "HOME", "value": "/tmp"}]
    pods = settings.pods
    if serving and pods.testing_faults and pods.injects_faults_into(owner.namespace, owner.name):
        env.append({"name": TESTING_FAULTS_ENV, "value": pods.testing_faults})
    return env


def _runtime_volumes(
    owner: OwnerRef, spec: InferenceDeploymentSpec, meta: dict[str, Any], serving: bool
) -> list[dict[str, Any]]:
    """The config, the engine cache (read-only), /tmp, and on serving pods the mirror
    file (optional: a pod must start even if its ConfigMap were deleted meanwhile)."""
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": meta["name"]}},
        {
            "name": "cache",
            "persistentVolumeClaim": {"claimName": cache_claim(spec, owner.name), "readOnly": True},
        },
        {"name": "tmp", "emptyDir": {}},
    ]
    if serving:
        mirror = {"name": names.mirror_name(owner.name), "optional": True}
        volumes.append({"name": "mirror", "configMap": mirror})
    return volumes


def _grpc_ports(grpc_port: int | None, key: str) -> list[dict[str, Any]]:
    """The runtime's `grpc` port, when the spec sets one (`key`: the port's field)."""
    if grpc_port is None:
        return []
    named = {"targetPort": "grpc"} if key == "port" else {}
    return [{"name": "grpc", key: grpc_port, **named, "protocol": "TCP"}]


def build_service(
    owner: OwnerRef,
    version: str,
    role: str = names.ROLE_SERVING,
    grpc_port: int | None = None,
    *,
    name: str | None = None,
    selects_pods: bool = True,
) -> KubeObject:
    """The runtime's Service: `http` for inference, `metrics` for scrapers selecting a
    named port (the runtime serves /metrics on its http port), and `grpc` when the spec
    sets a gRPC port. The serving Service selects the serving role only; the candidate's
    and the reference's Services (the mirrors' targets) their own pods. `name` another
    Service of the serving pods (the activator's backend); `selects_pods` False while the
    object is at zero pods and its EndpointSlice points at the activator
    (`desired_activator`)."""
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "ports": [
            {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
            {
                "name": "metrics",
                "port": METRICS_SERVICE_PORT,
                "targetPort": "http",
                "protocol": "TCP",
            },
            *_grpc_ports(grpc_port, "port"),
        ],
    }
    if selects_pods:
        # Without one, kube-proxy takes the EndpointSlice's port of each port's name.
        spec["selector"] = _pods_of(owner.name, role)
    body = {"spec": spec}
    if name is None:
        name, component = _role_names(owner.name, role)
        if role == names.ROLE_SERVING:
            name = names.service_name(owner.name)
    else:
        component = names.COMPONENT_RUNTIME
    labels = names.common_labels(owner.name, version, component)
    return finish_child("v1", "Service", name, owner, labels, body)
