"""The chart's monitoring templates, rendered by the real `helm template` (Helm built from
its Go module, `kubeinfer.cluster.binaries.ensure_helm`):

- the PrometheusRule carries the generated rule file unchanged (the alerts' own
  `{{ $labels.x }}` survive Helm's templating) and the dashboard ConfigMap the generated
  JSON, with the sidecar's label, in the release's namespace or the one asked for;
- the operator's PodMonitor selects the operator's pods at the port the Deployment names
  `metrics`, with honorLabels; the runtime's selects exactly the labels the operator puts
  on serving pods, in the watched namespaces;
- what would scrape twice or nothing is refused with Helm's error: a runtime PodMonitor
  while the operator makes its own, an operator PodMonitor without the metrics port;
- with monitoring off (the default), none of these objects.

Every rendered object's validity against Kubernetes' and the prometheus-operator's
schemas is the chart tests' (tests/helm/), over the same values.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeinfer.cli.monitoring.render import DASHBOARD, RULES
from kubeinfer.cluster import binaries
from kubeinfer.operator.state import names

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kubeinfer"
ON = {
    "monitoring.operatorPodMonitor.enabled": "true",
    "monitoring.prometheusRule.enabled": "true",
    "monitoring.dashboard.enabled": "true",
    "monitoring.labels.release": "kube-prometheus-stack",
}


@pytest.fixture(scope="module")
def helm() -> str:
    try:
        return str(binaries.ensure_helm())
    except binaries.BuildError as error:
        pytest.skip(f"no helm binary: {error}")


def render(helm: str, values: dict[str, str]) -> subprocess.CompletedProcess[str]:
    flags = [f"--set={key}={value}" for key, value in values.items()]
    return subprocess.run(
        [helm, "template", "rel", str(CHART), "--namespace", "ops", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )


def objects(helm: str, values: dict[str, str]) -> dict[tuple[str, str], dict[str, Any]]:
    result = render(helm, values)
    assert result.returncode == 0, result.stderr
    return {
        (obj["kind"], obj["metadata"]["name"]): obj
        for obj in yaml.safe_load_all(result.stdout)
        if obj
    }


def test_the_rule_and_the_dashboard_are_the_generated_files(helm: str) -> None:
    rendered = objects(helm, {**ON, "monitoring.dashboard.namespace": "grafana"})
    rule = rendered[("PrometheusRule", "rel-alerts")]
    assert rule["spec"] == yaml.safe_load((ROOT / RULES).read_text())
    assert "{{ $labels.namespace }}" in json.dumps(rule["spec"])
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    config = rendered[("ConfigMap", "rel-dashboard")]
    assert json.loads(config["data"]["kubeinfer.json"]) == json.loads(
        (ROOT / DASHBOARD).read_text()
    )
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config["metadata"]["namespace"] == "grafana"
    default = objects(helm, ON)[("ConfigMap", "rel-dashboard")]
    assert default["metadata"]["namespace"] == "ops"


def test_the_operator_pod_monitor_scrapes_the_port_the_deployment_names(helm: str) -> None:
    rendered = objects(helm, ON)
    monitor = rendered[("PodMonitor", "rel-operator")]
    deployment = rendered[("Deployment", "rel-operator")]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in container.get("ports", [])}
    assert endpoint["port"] in ports
    assert f"--metrics-port={ports[endpoint['port']]}" in container["args"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_runtime_pod_monitor_selects_the_serving_pods_of_the_watched_namespaces(
    helm: str,
) -> None:
    off = {"monitoring.runtimePodMonitor.enabled": "true", "settings.metrics.podMonitors": "off"}
    watched = objects(helm, {**off, "watchNamespaces": "{serving,batch}"})
    monitor = watched[("PodMonitor", "rel-runtime")]
    serving_pod = {
        **names.common_labels("clf", "1", names.COMPONENT_RUNTIME),
        **names.serving_selector("clf"),
    }
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= serving_pod.items()
    for other in (names.candidate_selector("clf"), names.reference_selector("clf")):
        assert not selector.items() <= other.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["serving", "batch"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "http"
    everywhere = objects(helm, off)
    assert everywhere[("PodMonitor", "rel-runtime")]["spec"]["namespaceSelector"] == {"any": True}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"monitoring.runtimePodMonitor.enabled": "true"}, "scrape each pod twice"),
        (
            {"monitoring.operatorPodMonitor.enabled": "true", "metricsPort": "null"},
            "needs metricsPort",
        ),
    ],
    ids=["runtime-beside-the-operators", "operator-without-metrics"],
)
def test_a_monitor_that_would_scrape_twice_or_nothing_is_refused(
    helm: str, values: dict[str, str], message: str
) -> None:
    result = render(helm, values)
    assert result.returncode != 0
    assert message in result.stderr


def test_nothing_of_it_by_default(helm: str) -> None:
    kinds = {kind for kind, _ in objects(helm, {})}
    assert not kinds & {"PodMonitor", "PrometheusRule"}
    assert ("ConfigMap", "rel-dashboard") not in objects(helm, {})
