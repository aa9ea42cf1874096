"""Deterministic names, labels, annotations and hashes of the children of an
InferenceDeployment.

The same owner and inputs always yield the same names, so a second reconcile (or a
restarted operator) addresses the objects the first one created instead of adding new
ones. Every child name is a DNS-1123 label of at most 63 characters (MAX_NAME_LENGTH),
however long the owner's name (the API caps it at 52, a DNS-1035 label, so the Services
that take it start with a letter): a suffix that would pass 63 cuts the owner's name and
adds a hash of it, so two owners never share a child (`child_name`).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

APP_NAME = "kubeinfer"
MANAGED_BY = "kubeinfer-operator"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_VERSION = "kubeinfer.io/version"
LABEL_BUILD_KEY = "kubeinfer.io/build-key"
LABEL_BUILD_ATTEMPT = "kubeinfer.io/build-attempt"
LABEL_GPU_PRODUCT = "kubeinfer.io/gpu-product"
"""On a mixed GPU fleet's runtime ConfigMaps, Deployments and pods: the GPU product
(`nvidia.com/gpu.product`) whose engine they run. Part of each product Deployment's
selector, so the Deployments of two products never select each other's pods."""
LABEL_ROLE = "kubeinfer.io/role"
"""On runtime pods: `serving`, `candidate` or `reference`. The serving Service selects
`serving` only, so neither a shadow candidate nor a quality reference ever takes live
traffic through it (Argo Rollouts' experiment pods once did, through a stable selector
that matched them)."""

ANNOTATION_INPUT_HASH = "kubeinfer.io/input-hash"
"""Hash of everything the operator sets on a child; equal hashes mean nothing to write."""
ANNOTATION_CONFIG_HASH = "kubeinfer.io/config-hash"
"""On the runtime pod template: a ConfigMap change changes it and so rolls the pods."""
ANNOTATION_ENGINE_DIGEST = "kubeinfer.io/engine-digest"
ANNOTATION_RUNTIME_IMAGE = "kubeinfer.io/runtime-image"
"""On the runtime ConfigMap: the image its engine was built with and runs in. An older
engine keeps serving in its own image while a new image's engine builds (the new image's
backend may not load the old engine)."""
ANNOTATION_BUILD_KEY = "kubeinfer.io/engine-build-key"
"""On the ConfigMap and the pod template: which engine inputs the served digest came
from, so a finished build is remembered after its Job is garbage-collected."""

COMPONENT_RUNTIME = "runtime"
COMPONENT_BUILD = "engine-build"
COMPONENT_CACHE = "engine-cache"
COMPONENT_CANDIDATE = "candidate"
"""The shadow candidate's pods: a component of their own, so the serving Deployment's
selector (immutable, and without the role label) never matches them."""

COMPONENT_REFERENCE = "quality-reference"
"""The quality watch's reference pods: a component of their own, like the candidate's."""

ROLE_SERVING = "serving"
ROLE_CANDIDATE = "candidate"
ROLE_REFERENCE = "reference"

COMPONENT_WRONG_ANSWERS = "wrong-answers"
ROLE_WRONG_ANSWERS = "wrong-answers"
"""A runtime pod taken out of serving for wrong answers: relabelled with these, so neither
its ReplicaSet (which then creates a replacement) nor its Service selects it any more,
and kept as evidence."""
ANNOTATION_WRONG_ANSWERS = "kubeinfer.io/wrong-answers"
"""On a pod taken out of serving: what it answered, where (JSON: the status' record)."""
TAINT_SUSPECT_ANSWERS = "kubeinfer.io/suspect-answers"
"""The NoSchedule taint (and the label marking it as the operator's) on a node the
known-answer checks named suspect, with the setting `known_answers.taint_suspect_nodes`
(`reconcile.node_taints`). It says what state the node is in, as `node.kubernetes.io/`
taints do, not a policy: a mixed GPU fleet keeps the node's product, without its GPUs."""

MAX_NAME_LENGTH = 63
"""A label value's limit, and a Service's; Jobs label their pods with their name."""

PRODUCT_SLUG_LENGTH = 24
"""Characters of a GPU product's name kept in its runtime Deployment's name."""

BUILD_KEY_LABEL_LENGTH = 40
"""Hex digits of the build key kept in labels (a label value holds at most 63)."""


def stable_hash(value: Any, length: int = 16) -> str:
    """sha256 of the canonical JSON of `value` (sorted keys), as `length` hex digits."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def child_name(owner: str, suffix: str) -> str:
    """`<owner>-<suffix>`, or where that passes MAX_NAME_LENGTH, `<owner cut>-<hash of
    owner>-<suffix>`: names that fit are the ones earlier versions gave, so upgrading
    renames nothing that was valid."""
    name = f"{owner}-{suffix}"
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = stable_hash(owner, 8)
    keep = MAX_NAME_LENGTH - len(suffix) - len(digest) - 2
    return f"{owner[:keep].rstrip('-')}-{digest}-{suffix}"


def cache_claim_name(owner: str) -> str:
    """The engine cache claim the operator creates. `<owner>-engine-cache` passes 63
    characters for owners of 51 or 52: those get a cut name (and, from before this limit,
    a 64- or 65-character claim that is left to the owner's garbage collection)."""
    return child_name(owner, "engine-cache")


def runtime_name(owner: str) -> str:
    """The runtime Deployment's and ConfigMap's name."""
    return child_name(owner, "runtime")


def product_runtime_name(owner: str, product: str) -> str:
    """A mixed GPU fleet's runtime Deployment and ConfigMap for one GPU product:
    `<owner>-runtime-<product>-<hash>`, the product lowercased to a DNS label, cut, and
    a hash of the product itself (products differing only in case or in what was cut
    stay apart)."""
    slug = re.sub(r"[^a-z0-9]+", "-", product.lower()).strip("-").removeprefix("nvidia-")
    return child_name(
        owner, f"runtime-{slug[:PRODUCT_SLUG_LENGTH].strip('-')}-{stable_hash(product, 5)}"
    )


def candidate_name(owner: str) -> str:
    """The shadow candidate's Deployment, ConfigMap and Service."""
    return child_name(owner, "candidate")


def reference_name(owner: str) -> str:
    """The quality watch's reference Deployment, ConfigMap and Service."""
    return child_name(owner, "reference")


def mirror_name(owner: str) -> str:
    """The ConfigMap holding the serving pods' mirror target."""
    return child_name(owner, "mirror")


def service_name(owner: str) -> str:
    """The Service keeps the owner's name, so clients call `http://<name>.<namespace>`."""
    return owner


def backend_service_name(owner: str) -> str:
    """With autoscaling.minReplicas 0: the Service that always selects the serving pods,
    which the activator forwards to (the owner's Service selects none while at zero)."""
    return child_name(owner, "backend")


LABEL_SERVICE_NAME = "kubernetes.io/service-name"
"""An EndpointSlice's Service."""
LABEL_SLICE_MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
SLICE_CONTROLLER = "endpointslice-controller.k8s.io"
"""The EndpointSlice controller's `managed-by`: its slices of a Service with a selector."""
SLICE_MIRROR = "endpointslicemirroring-controller.k8s.io"
"""The mirroring controller's: a selector-less Service's Endpoints copied into a slice."""
ACTIVATOR_SLICE_MANAGER = "operator.kubeinfer.io"
"""The activator's slice's `managed-by`: not the controller's, so it leaves it alone."""


def activator_slice_name(owner: str) -> str:
    """The EndpointSlice that sends the owner's Service's traffic to the activator pods
    while it has no serving pod."""
    return child_name(owner, "activator")


def build_job_name(owner: str, build_key: str, attempt: int) -> str:
    """`<owner>-build-<hash>-<attempt>`: the hash covers the owner and the build key, so a
    truncated owner name cannot collide with another owner's Job; at most 63 characters
    (Jobs label their pods with their name), the owner's part shorter still from the
    1000th attempt on."""
    tail = f"-build-{stable_hash([owner, build_key], 10)}-{attempt}"
    return f"{owner[: min(42, MAX_NAME_LENGTH - len(tail))]}{tail}"


def common_labels(owner: str, version: str, component: str) -> dict[str, str]:
    return {
        LABEL_NAME: APP_NAME,
        LABEL_INSTANCE: owner,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_COMPONENT: component,
        LABEL_VERSION: version,
    }


def runtime_selector(owner: str) -> dict[str, str]:
    """The serving Deployment's selector. Immutable on a Deployment, so it holds no version
    (and, from before shadow rollouts, no role)."""
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: owner, LABEL_COMPONENT: COMPONENT_RUNTIME}


def product_selector(owner: str, product: str) -> dict[str, str]:
    """A mixed GPU fleet's Deployment of one product: the serving selector's keys and the
    product (a new Deployment, so it may differ from the single runtime's)."""
    return {**runtime_selector(owner), LABEL_GPU_PRODUCT: product}


def serving_selector(owner: str) -> dict[str, str]:
    """The serving pods: what the Service, the disruption budget, the spread constraints,
    the scale subresource and metrics select. Two labels, the instance first in key order:
    the EndpointSlice and disruption controllers match every pod event of the namespace
    against every Service's and budget's selector (the latter parsed and validated afresh
    each time), so with a thousand objects in a namespace each requirement of these
    selectors was a measurable share of the controller manager's CPU (docs/fleet.md).
    Every serving pod also carries the Deployment's labels (`runtime_selector`)."""
    return {LABEL_INSTANCE: owner, LABEL_ROLE: ROLE_SERVING}


def candidate_selector(owner: str) -> dict[str, str]:
    """The shadow candidate's pods (its Deployment's and its Service's selector)."""
    return {
        LABEL_NAME: APP_NAME,
        LABEL_INSTANCE: owner,
        LABEL_COMPONENT: COMPONENT_CANDIDATE,
        LABEL_ROLE: ROLE_CANDIDATE,
    }


def reference_selector(owner: str) -> dict[str, str]:
    """The quality watch's reference pods (its Deployment's and its Service's selector)."""
    return {
        LABEL_NAME: APP_NAME,
        LABEL_INSTANCE: owner,
        LABEL_COMPONENT: COMPONENT_REFERENCE,
        LABEL_ROLE: ROLE_REFERENCE,
    }


def wrong_answers_selector(owner: str) -> dict[str, str]:
    """The pods taken out of serving for wrong answers."""
    return {LABEL_INSTANCE: owner, LABEL_COMPONENT: COMPONENT_WRONG_ANSWERS}


def selector_string(selector: dict[str, str]) -> str:
    """`k=v,k=v` in key order, as the scale subresource and HPAs read it."""
    return ",".join(f"{key}={selector[key]}" for key in sorted(selector))


def children_selector(owner_name: str) -> str:
    """The label selector every child of one InferenceDeployment matches."""
    return f"{LABEL_INSTANCE}={owner_name},{LABEL_MANAGED_BY}={MANAGED_BY}"


def build_pods_selector(owner_name: str) -> str:
    """The label selector of the object's build pods (their Job template's labels)."""
    return f"{children_selector(owner_name)},{LABEL_COMPONENT}={COMPONENT_BUILD}"
