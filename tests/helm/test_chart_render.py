"""The chart as the real Helm (v4) renders it, over a matrix of values: cluster-wide and
namespaced, one replica and two, monitoring off and on, custom images and settings.

For each: `helm lint --strict` passes; every object `helm template` renders is valid for
the API server that will receive it (strict schemas: built-in kinds at the control
plane's release, PodMonitor and PrometheusRule at prometheus-operator's own CRDs); the
RBAC is exactly `kubeinfer.operator.rbac`'s rules (patching nodes only where the settings
ask to taint suspect nodes), bound to the chart's ServiceAccount
that the operator's pods run as; the replicas elect a leader on the release's Lease, and
a PodDisruptionBudget comes with more than one; and the environment the operator gets
reads back, through `OperatorSettings.from_env`, as the settings the values asked for.

Bad values are refused by Helm itself, from values.schema.json, naming the value.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from helm_harness import CHART, Helm, KubeObject, by_kind, env_of, merged, validate
from kubeinfer.cli.chart import render
from kubeinfer.cli.chart.values import ChartValues
from kubeinfer.cli.local.activator import activator_objects
from kubeinfer.operator import rbac
from kubeinfer.operator.settings import DEFAULT_RUNTIME_IMAGE, Activator, OperatorSettings
from pydantic.alias_generators import to_snake

RELEASE, NAMESPACE = "rel", "ops"
OPERATOR = f"{RELEASE}-operator"

MONITORING_ON = {
    "monitoring": {
        "operatorPodMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True, "annotations": {"grafana_folder": "Inference"}},
        "labels": {"release": "kube-prometheus-stack"},
    }
}
CUSTOM = {
    "image": {"repository": "registry.example.com/ml/kubeinfer-operator", "tag": "1.2.3",
              "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry-credentials"}],
    "podAnnotations": {"example.com/team": "ml-platform"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml",
                     "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
    "resources": {"requests": {"cpu": 0.5, "memory": "300Mi"},
                  "limits": {"cpu": 2, "memory": "1Gi"}},
    "metricsPort": None,
    "settings": {
        "images": {"runtime": "registry.example.com/ml/kubeinfer-runtime:1.2.3",
                   "gpuRuntime": "registry.example.com/ml/kubeinfer-runtime-gpu:1.2.3",
                   "pullPolicy": "Always"},
        "metrics": {"prometheusUrl": "http://prometheus-operated.monitoring:9090",
                    "timeoutSeconds": 2.5, "podMonitors": "off",
                    "podMonitorLabels": {"release": "kube-prometheus-stack", "team": "ml"}},
        "requeue": {"resyncIntervalSeconds": 0.5, "buildPollSeconds": 3,
                    "shadowPollSeconds": 20, "autoscalePollSeconds": 30},
        "build": {"backoffSeconds": 1.5, "backoffMaxSeconds": 600, "backoffLimit": 3,
                  "activeDeadlineSeconds": 7200, "ttlSecondsAfterFinished": 31_536_000},
        "pods": {"preStopSleepSeconds": 0, "drainGracePeriodSeconds": 45},
        "knownAnswers": {"taintSuspectNodes": True},
        "cost": {"pricePerNodeHour": {"NVIDIA-A100-SXM4-80GB": 32.77, "cpu": 0.34,
                                      "NVIDIA-H100-80GB-HBM3": 2_500_000},
                 "windowSeconds": 1800, "refreshSeconds": 120},
        "api": {"fieldManager": "kubeinfer-ml", "timeoutSeconds": 12, "pageSize": 10_000},
        "leaderElection": {"leaseDurationSeconds": 30, "renewDeadlineSeconds": 20,
                           "retryPeriodSeconds": 4},
    },
}  # fmt: skip
"""Every setting changed from its default (a number past 1e6 among them, which Go would
print in exponent form), images from another registry, and the pod's placement."""

ACTIVATOR_NAME = "kubeinfer-activator"


def operator_kinds(objects: list[KubeObject]) -> dict[str, list[KubeObject]]:
    """The release's objects by kind, the activator's left out (its own test)."""
    return by_kind([o for o in objects if not is_activator(o)])


def is_activator(obj: KubeObject) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return labels.get("app.kubernetes.io/name") == ACTIVATOR_NAME


Rendering = tuple[dict[str, Any], list[KubeObject]]
"""A case's values and the objects Helm rendered from them."""

MATRIX: dict[str, dict[str, Any]] = {
    "defaults: cluster-wide, 2 replicas": {},
    "cluster-wide, 1 replica": {"replicas": 1},
    "namespaced, 2 replicas": {"watchNamespaces": ["team-a", "team-b"]},
    "namespaced, 1 replica, monitoring on": {
        "replicas": 1, "watchNamespaces": ["team-a"], **MONITORING_ON,
    },
    "cluster-wide, 2 replicas, monitoring on with the runtime's PodMonitor": merged(
        MONITORING_ON,
        {"monitoring": {"runtimePodMonitor": {"enabled": True}},
         "settings": {"metrics": {"podMonitors": "off"}}},
    ),
    "custom images and settings": CUSTOM,
}  # fmt: skip


def expected_settings(values: dict[str, Any]) -> OperatorSettings:
    """What the operator should read: the chart's default settings with `values`' over
    them, in the operator's own names."""
    chart = merged(render.values_dict(ChartValues()), values)["settings"]
    return OperatorSettings.model_validate(
        {to_snake(group): {to_snake(k): v for k, v in fields.items()}
         for group, fields in chart.items()}
    )  # fmt: skip


@pytest.fixture(scope="module", params=list(MATRIX), ids=list(MATRIX))
def rendering(request: pytest.FixtureRequest, helm: Helm) -> Rendering:
    values = MATRIX[request.param]
    return values, helm.template(values, RELEASE, NAMESPACE)


def test_lint_strict_passes(helm: Helm) -> None:
    for case, values in MATRIX.items():
        linted = helm.run("lint", "--strict", str(CHART), "-f", str(helm.values_file(values)),
                          "--kube-version", "1.36.3", check=False)  # fmt: skip
        assert linted.returncode == 0, f"{case}: {linted.stdout}{linted.stderr}"
        assert "0 chart(s) failed" in linted.stdout


def test_every_rendered_object_is_valid(rendering: Rendering) -> None:
    _, objects = rendering
    for obj in objects:
        validate(obj)


def test_rbac_is_the_operators_rules_bound_to_its_service_account(
    rendering: Rendering,
) -> None:
    values, objects = rendering
    kinds = operator_kinds(objects)
    (account,) = kinds["ServiceAccount"]
    assert account["metadata"]["name"] == OPERATOR
    namespaces = values.get("watchNamespaces")
    rules = [rule.to_dict() for rule in rbac.RULES]
    lease_rules = [rule.to_dict() for rule in rbac.lease_rules(OPERATOR)]
    roles = {(r["kind"], r["metadata"].get("namespace"), r["metadata"]["name"]): r
             for r in kinds.get("Role", []) + kinds.get("ClusterRole", [])}  # fmt: skip
    if namespaces:
        for namespace in namespaces:
            assert roles.pop(("Role", namespace, OPERATOR))["rules"] == rules
    else:
        assert roles.pop(("ClusterRole", None, OPERATOR))["rules"] == rules
    # Nodes belong to no namespace: their ClusterRole in both modes (mixed GPU fleets).
    node_rules = [rule.to_dict() for rule in rbac.NODE_RULES]
    assert roles.pop(("ClusterRole", None, f"{OPERATOR}-nodes"))["rules"] == node_rules
    # Patching nodes (the suspect nodes' taint) only where the settings ask for it.
    taints = ((values.get("settings") or {}).get("knownAnswers") or {}).get("taintSuspectNodes")
    if taints:
        taint_rules = [rule.to_dict() for rule in rbac.NODE_TAINT_RULES]
        assert roles.pop(("ClusterRole", None, f"{OPERATOR}-node-taints"))["rules"] == taint_rules
    assert roles.pop(("Role", NAMESPACE, f"{OPERATOR}-leader-election"))["rules"] == lease_rules
    assert roles == {}, "no other role"
    bindings = kinds.get("RoleBinding", []) + kinds.get("ClusterRoleBinding", [])
    assert len(bindings) == (len(namespaces) if namespaces else 1) + 2 + (1 if taints else 0)
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}
        ]
        role_kind = "ClusterRole" if binding["kind"] == "ClusterRoleBinding" else "Role"
        reference = binding["roleRef"]
        assert reference["apiGroup"] == "rbac.authorization.k8s.io"
        assert reference["kind"] == role_kind
        place = binding["metadata"].get("namespace")
        rendered = [r["metadata"]["name"] for r in kinds[role_kind]
                    if r["metadata"].get("namespace") == place]  # fmt: skip
        assert reference["name"] in rendered


def test_the_operator_pods_elect_a_leader_under_the_charts_account(
    rendering: Rendering,
) -> None:
    values, objects = rendering
    kinds = operator_kinds(objects)
    (deployment,) = kinds["Deployment"]
    replicas = values.get("replicas", 2)
    assert deployment["spec"]["replicas"] == replicas
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == OPERATOR
    (container,) = pod["containers"]
    namespaces = values.get("watchNamespaces")
    scope = [f"--namespace={n}" for n in namespaces] if namespaces else ["--all-namespaces"]
    metrics_port = values.get("metricsPort", 8080)
    assert container["args"] == [
        "operator", *scope, "--leader-election", f"--lease-name={OPERATOR}",
        *([f"--metrics-port={metrics_port}"] if metrics_port else []),
    ]  # fmt: skip
    ports = [(p["name"], p["containerPort"]) for p in container.get("ports", [])]
    assert ports == ([("metrics", metrics_port)] if metrics_port else [])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    budgets = kinds.get("PodDisruptionBudget", [])
    if replicas > 1:
        (budget,) = budgets
        assert budget["spec"]["minAvailable"] == 1
        assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    else:
        assert budgets == [], "one replica: a budget of one would block every drain"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_operator_reads_the_settings_the_values_ask_for(
    rendering: Rendering, monkeypatch: pytest.MonkeyPatch
) -> None:
    values, objects = rendering
    (deployment,) = operator_kinds(objects)["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = env_of(container)
    for name in [n for n in os.environ if n.upper().startswith("KUBEINFER_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert OperatorSettings.from_env() == expected_settings(values)
    nested = {f"KUBEINFER_{group}__{field}".upper()
              for group, info in OperatorSettings.model_fields.items() if group != "watching"
              for field in info.annotation.model_fields}  # type: ignore[union-attr]  # fmt: skip
    # For tests only: no chart renders them.
    nested -= {"KUBEINFER_PODS__TESTING_FAULTS", "KUBEINFER_PODS__TESTING_FAULTS_OBJECTS"}
    # Unset by default: the operator's own namespace, where the chart installs it.
    optional = {"KUBEINFER_METRICS__PROMETHEUS_URL", "KUBEINFER_ACTIVATOR__NAMESPACE"}
    assert set(env) == nested - (optional - set(env)), (
        "every setting is passed by its own name (the Prometheus URL only when set)"
    )
    downward = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
                for e in container["env"] if "valueFrom" in e}  # fmt: skip
    assert downward == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}


def test_custom_images_and_placement_reach_the_pod(helm: Helm) -> None:
    (deployment,) = operator_kinds(helm.template(CUSTOM))["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/ml/kubeinfer-operator:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == CUSTOM["resources"]
    for key in ("imagePullSecrets", "nodeSelector", "tolerations", "affinity"):
        assert pod[key] == CUSTOM[key]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations == CUSTOM["podAnnotations"]
    (default,) = operator_kinds(helm.template({}))["Deployment"]
    (container,) = default["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/kubeinfer/kubeinfer-operator:0.1.0"


def test_monitoring_renders_only_when_asked(helm: Helm) -> None:
    monitoring_kinds = {"PodMonitor", "PrometheusRule", "ConfigMap"}
    assert not monitoring_kinds & set(operator_kinds(helm.template({})))
    assert monitoring_kinds <= set(operator_kinds(helm.template(MONITORING_ON)))


def test_notes_say_what_to_apply_next(helm: Helm) -> None:
    values = helm.values_file({"watchNamespaces": ["team-a"]})
    shown = helm.run("install", RELEASE, str(CHART), "--dry-run=client", "-n", NAMESPACE,
                     "-f", str(values))  # fmt: skip
    notes = shown.stdout[shown.stdout.index("NOTES:") :]
    assert f"rollout status deployment/{OPERATOR}" in notes
    assert "metadata.namespace to team-a" in notes
    assert "kubectl wait -n team-a infd/resnet-cpu" in notes
    assert "--for=condition=Ready" in notes


BAD_VALUES = {
    "replicas=0": "at '/replicas'",
    "replicas=eleven": "at '/replicas'",
    "replica=2": "additional properties 'replica' not allowed",
    "watchNamespaces={Team_A}": "at '/watchNamespaces/0'",
    "image.pullPolicy=Sometimes": "at '/image/pullPolicy'",
    "settings.requeue.resyncIntervalSeconds=0": "at '/settings/requeue/resyncIntervalSeconds'",
    "settings.metrics.podMonitors=sometimes": "at '/settings/metrics/podMonitors'",
    "settings.metrics.prometheusUrl=prometheus:9090": "at '/settings/metrics/prometheusUrl'",
    "settings.build.backoffLimit=1.5": "at '/settings/build/backoffLimit'",
    "resources.requests.cpu=lots": "at '/resources/requests/cpu'",
    "metricsPort=80": "at '/metricsPort'",
}


@pytest.mark.parametrize("setting", list(BAD_VALUES))
def test_bad_values_are_refused_by_helm_naming_the_value(helm: Helm, setting: str) -> None:
    refused = helm.run("template", RELEASE, str(CHART), "--set", setting, check=False)
    assert refused.returncode == 1
    assert "values don't meet the specifications of the schema(s)" in refused.stderr
    assert BAD_VALUES[setting] in refused.stderr, refused.stderr


def test_prices_per_node_hour_reach_the_operator_as_one_variable(helm: Helm) -> None:
    """`settings.cost.pricePerNodeHour` is one variable of `product=price` pairs (keys in
    order, as Go ranges over a map); left `{}`, it is empty, and no cost is computed."""
    prices = {"cpu": 0.34, "NVIDIA-A100-SXM4-80GB": 32.77}
    values = {"settings": {"cost": {"pricePerNodeHour": prices, "windowSeconds": 900}}}
    (deployment,) = operator_kinds(helm.template(values))["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = env_of(container)
    assert env["KUBEINFER_COST__PRICE_PER_NODE_HOUR"] == "NVIDIA-A100-SXM4-80GB=32.77,cpu=0.34"
    assert env["KUBEINFER_COST__WINDOW_SECONDS"] == "900"
    (default,) = operator_kinds(helm.template({}))["Deployment"]
    (container,) = default["spec"]["template"]["spec"]["containers"]
    assert env_of(container)["KUBEINFER_COST__PRICE_PER_NODE_HOUR"] == ""


def test_the_activator_renders_as_kubeinfer_up_installs_it(helm: Helm) -> None:
    """The chart's activator and `kubeinfer up`'s (cli.local.activator) are the same pod:
    no API token, the route table mounted optionally, non-root on a read-only root, the
    operator's view of its ports; the chart adds its bounds, resources and the wake URL of
    the operator's Service, and installs nothing of it when `activator.enabled` is off."""
    values = {"activator": {"maxHeldRequests": 100, "holdTimeoutSeconds": 30}}
    rendered = [o for o in helm.template(values, RELEASE, NAMESPACE) if is_activator(o)]
    kinds = by_kind(rendered)
    (deployment,) = kinds["Deployment"]
    assert {k: len(v) for k, v in kinds.items()} == {
        "ServiceAccount": 1, "Deployment": 1, "PodDisruptionBudget": 1,
    }  # fmt: skip
    built = by_kind(activator_objects(Activator(), image=DEFAULT_RUNTIME_IMAGE,
                                      pull_policy="IfNotPresent"))  # fmt: skip
    (expected,) = built["Deployment"]
    pod, want = deployment["spec"]["template"]["spec"], expected["spec"]["template"]["spec"]
    for key in ("serviceAccountName", "automountServiceAccountToken", "securityContext",
                "volumes"):  # fmt: skip
        assert pod[key] == want[key], key
    (container,), (wanted,) = pod["containers"], want["containers"]
    for key in ("image", "imagePullPolicy", "ports", "readinessProbe", "livenessProbe",
                "securityContext", "volumeMounts"):  # fmt: skip
        assert container[key] == wanted[key], key
    assert container["args"][: len(wanted["args"])] == wanted["args"]
    wake = f"--wake-url=http://{OPERATOR}.{NAMESPACE}.svc:8080/v1/activator/wake"
    assert container["args"][len(wanted["args"]) :] == [
        "--max-held-requests=100", "--hold-timeout-seconds=30", wake,
    ]  # fmt: skip
    assert deployment["spec"]["replicas"] == 2
    (service,) = operator_kinds(helm.template(values, RELEASE, NAMESPACE))["Service"]
    assert service["metadata"]["name"] == OPERATOR
    assert service["spec"]["ports"][0]["port"] == 8080
    off = helm.template({"activator": {"enabled": False}}, RELEASE, NAMESPACE)
    assert not [o for o in off if is_activator(o)]
    assert "Service" not in operator_kinds(off)
