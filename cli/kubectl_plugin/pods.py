"""What `kubectl infd exemplars` and `build-logs` read from the pods, through the API server.

Exemplars: each serving pod keeps the worst rows of its own quality-watch window in memory
and serves them as an `.npz` at `GET /v2/quality/exemplars` on its `http` port. They are
read through the API server's pod proxy (`pods/<pod>:<port>/proxy/...`, the `pods/proxy`
permission): a Service proxy would answer from one pod the Service happens to pick, and a
port-forward needs a local listener per read; the proxy needs only the pod's address,
which the API server reaches.

Build logs: the build Jobs' pods carry the object's build labels (`names`); the API server
reads their logs from the kubelet, as `kubectl logs` does.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kubeinfer.operator.state import names

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api

Pod = dict[str, Any]
"""A pod as the API server sends it (JSON), as the rest of the project reads objects."""
EXEMPLARS_PATH = "v2/quality/exemplars"
HTTP_PORT_NAME = "http"


class PodsRefused(Exception):
    """No pod to read, or the API server refused the read; the message says which."""


def refusal(error: Any, what: str) -> PodsRefused:
    """An ApiException as one line: the Status message the API server sent, if any."""
    body = error.body.decode(errors="replace") if isinstance(error.body, bytes) else error.body
    try:
        message = str(json.loads(body or "{}").get("message", ""))
    except (ValueError, AttributeError):
        message = str(body or "").strip()[:200]
    detail = f": {message}" if message else ""
    return PodsRefused(f"the API server refused {what}: {error.status} {error.reason}{detail}")


def name_of(pod: Pod) -> str:
    return str(pod["metadata"]["name"])


def _ready(pod: Pod) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _list(core: CoreV1Api, namespace: str, selector: str, what: str) -> list[Pod]:
    from kubernetes.client.exceptions import ApiException

    try:
        response: Any = core.list_namespaced_pod(
            namespace, label_selector=selector, _preload_content=False
        )
    except ApiException as error:
        raise refusal(error, what) from None
    return list(json.loads(response.data).get("items") or [])


def serving_pods(core: CoreV1Api, namespace: str, owner: str) -> list[Pod]:
    """The owner's ready serving pods, by name."""
    selector = names.selector_string(names.serving_selector(owner))
    found = _list(core, namespace, selector, "the list of serving pods")
    return sorted((p for p in found if _ready(p)), key=name_of)


def http_port(pod: Pod) -> int:
    for container in pod["spec"]["containers"]:
        for port in container.get("ports") or []:
            if port.get("name") == HTTP_PORT_NAME:
                return int(port["containerPort"])
    raise PodsRefused(f"pod {name_of(pod)} has no port named {HTTP_PORT_NAME}")


def exemplars(core: CoreV1Api, namespace: str, pod: Pod) -> bytes:
    """The pod's `/v2/quality/exemplars` body, through the API server's pod proxy."""
    from kubernetes.client.exceptions import ApiException

    try:
        response: Any = core.connect_get_namespaced_pod_proxy_with_path(
            f"{name_of(pod)}:{http_port(pod)}", namespace, EXEMPLARS_PATH, _preload_content=False
        )
    except ApiException as error:
        raise refusal(error, f"the exemplars of pod {name_of(pod)}") from None
    return bytes(response.data)


def build_pods(core: CoreV1Api, namespace: str, owner: str, build_key: str | None) -> list[Pod]:
    """The owner's build pods, oldest first: those building `build_key`, or every one."""
    selector = names.build_pods_selector(owner)
    if build_key is not None:
        selector += f",{names.LABEL_BUILD_KEY}={build_key[: names.BUILD_KEY_LABEL_LENGTH]}"
    found = _list(core, namespace, selector, "the list of build pods")
    return sorted(found, key=lambda p: (p["metadata"].get("creationTimestamp", ""), name_of(p)))


def logs(core: CoreV1Api, namespace: str, pod: Pod) -> str:
    """The pod's (only) container's log, as `kubectl logs POD`."""
    from kubernetes.client.exceptions import ApiException

    try:
        response: Any = core.read_namespaced_pod_log(
            name_of(pod), namespace, _preload_content=False
        )
    except ApiException as error:
        raise refusal(error, f"the logs of pod {name_of(pod)}") from None
    return bytes(response.data).decode(errors="replace")
