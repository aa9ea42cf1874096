"""How Prometheus finds the serving pods: a PodMonitor where the prometheus-operator runs,
the conventional `prometheus.io/*` pod annotations otherwise. Pure.

One or the other, never both: a Prometheus with both a PodMonitor and an annotation-based
`kubernetes-pods` job would scrape each pod twice, and every sum the operator reads (the
shadow's counts, the queue depth) would count twice. The prometheus-operator attaches
`namespace`, `pod`, `container` and `endpoint` labels to every series of a PodMonitor's
targets, and the common `kubernetes-pods` job attaches `namespace` and `pod` through its
relabelling: the labels the operator's named queries select on.
"""

from __future__ import annotations

from kubeinfer.operator.reconcile.child_meta import finish_child
from kubeinfer.operator.state import names
from kubeinfer.operator.state.observed import KubeObject, OwnerRef

SCRAPE_INTERVAL = "15s"
"""As often as the autoscaler and the shadow verdict read (their default periods)."""


def scrape_annotations(pod_monitors: bool) -> dict[str, str]:
    """The runtime pod template's scrape annotations: none where a PodMonitor scrapes."""
    if pod_monitors:
        return {}
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        "prometheus.io/path": "/metrics",
    }


def build_pod_monitor(
    owner: OwnerRef, version: str, extra_labels: dict[str, str] | None = None
) -> KubeObject:
    """The PodMonitor of the serving pods (the serving Service's selector), with the
    operator's `podMonitorLabels` for a Prometheus that selects PodMonitors by label."""
    labels = {
        **(extra_labels or {}),
        **names.common_labels(owner.name, version, names.COMPONENT_RUNTIME),
    }
    body = {
        "spec": {
            "selector": {"matchLabels": names.serving_selector(owner.name)},
            "podMetricsEndpoints": [
                {"port": "http", "path": "/metrics", "interval": SCRAPE_INTERVAL}
            ],
        }
    }
    name = names.runtime_name(owner.name)
    return finish_child("monitoring.coreos.com/v1", "PodMonitor", name, owner, labels, body)
