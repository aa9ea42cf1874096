"""`podmonitor_schema`: PodMonitors checked against the official prometheus-operator schema
(the CRDs of v0.90.1, compiled by `@kubernetes-models/prometheus-operator`, run by node).

Covers: the PodMonitor our serving pods need passes (and its minimal form); wrong types,
an unknown enum value, a duration that is not one, a missing required field and a wrong
kind each fail with the path named (and the allowed values of an enum); many objects go
through one node call, answered in order; without node the check skips locally and fails
under CI=true.
"""

from __future__ import annotations

import copy

import pytest
from podmonitor_schema import install_validator, podmonitor_errors, validate_podmonitor

pytestmark = pytest.mark.slow

SERVING = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PodMonitor",
    "metadata": {
        "name": "demo-runtime",
        "namespace": "serving",
        "labels": {"app.kubernetes.io/instance": "demo", "app.kubernetes.io/name": "kubeinfer"},
    },
    "spec": {
        "selector": {
            "matchLabels": {"app.kubernetes.io/instance": "demo", "kubeinfer.io/role": "serving"}
        },
        "namespaceSelector": {"matchNames": ["serving"]},
        "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
    },
}


def changed(path: str, value: object) -> dict:
    """SERVING with the field at `path` (dots; digits index lists) set, or removed for None."""
    obj = copy.deepcopy(SERVING)
    *parents, last = path.split(".")
    node: object = obj
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]  # type: ignore[index]
    assert isinstance(node, dict)
    if value is None:
        del node[last]
    else:
        node[last] = value
    return obj


def test_the_serving_pods_podmonitor_is_valid() -> None:
    validate_podmonitor(SERVING)
    minimal = changed("spec", {"selector": {"matchLabels": {"kubeinfer.io/role": "serving"}}})
    validate_podmonitor(minimal)


@pytest.mark.parametrize(
    ("obj", "error"),
    [
        (changed("spec.podMetricsEndpoints.0.port", 8000),
         "/spec/podMetricsEndpoints/0/port: must be string"),
        (changed("spec.selector.matchLabels", {"kubeinfer.io/role": True}),
         "/spec/selector/matchLabels/kubeinfer.io~1role: must be string"),
        (changed("spec.podMetricsEndpoints", {"port": "http"}),
         "/spec/podMetricsEndpoints: must be array"),
        (changed("spec.podMetricsEndpoints.0.scheme", "ftp"),
         "/spec/podMetricsEndpoints/0/scheme: must be equal to one of the allowed values "
         "(http, https, HTTP, HTTPS)"),
        (changed("spec.podMetricsEndpoints.0.relabelings", [{"action": "rename"}]),
         "/spec/podMetricsEndpoints/0/relabelings/0/action: must be equal to one of the "
         "allowed values (replace, Replace, keep, Keep, drop, Drop, hashmod, HashMod, "
         "labelmap, LabelMap, labeldrop, LabelDrop, labelkeep, LabelKeep, lowercase, "
         "Lowercase, uppercase, Uppercase, keepequal, KeepEqual, dropequal, DropEqual)"),
        (changed("spec.podMetricsEndpoints.0.interval", "15 seconds"),
         "/spec/podMetricsEndpoints/0/interval: must match pattern"),
        (changed("spec.selector", None), "/spec: must have required property selector"),
        (changed("kind", "ServiceMonitor"),
         "/kind: must be equal to one of the allowed values (PodMonitor)"),
    ],
)  # fmt: skip
def test_schema_errors_name_the_path(obj: dict, error: str) -> None:
    with pytest.raises(AssertionError) as failed:
        validate_podmonitor(obj)
    message = str(failed.value)
    assert message.startswith("PodMonitor demo-runtime does not match")
    assert f"\n  {error}" in message, message


def test_a_batch_is_answered_in_order_from_one_node_call() -> None:
    wrong_port = changed("spec.podMetricsEndpoints.0.port", 8000)
    no_selector = changed("spec.selector", None)
    both = changed("spec.podMetricsEndpoints.0.scheme", "ftp")
    both["spec"]["podMetricsEndpoints"][0]["port"] = 1
    results = podmonitor_errors([SERVING, wrong_port, SERVING, no_selector, both] * 20)
    assert len(results) == 100
    assert results[:5] == [
        [],
        ["/spec/podMetricsEndpoints/0/port: must be string"],
        [],
        ["/spec: must have required property selector"],
        ["/spec/podMetricsEndpoints/0/port: must be string",
         "/spec/podMetricsEndpoints/0/scheme: must be equal to one of the allowed values "
         "(http, https, HTTP, HTTPS)"],
    ]  # fmt: skip
    assert results[5:] == results[:5] * 19


def test_without_node_it_skips_locally_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="node and npm are needed"):
        install_validator()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the PodMonitor schema checks"):
        install_validator()
