"""The CRD on the session's real API server (kube-apiserver v1.36, no operator running):
the CRD as shipped is Established with its schema kept whole and no NonStructuralSchema
condition; every invalid manifest kubectl can send is refused with what `kubeinfer
validate` prints for it (a CEL rule's own message at its field; a schema check in the API
server's words for the same field and bound, pattern, type or values); kubectl itself
refuses the two it cannot map or decode, and the YAML-level ones, which `validate`
refuses before anything is sent, are what kubectl would otherwise read differently;
every example is stored unchanged (no field pruned); and the kubectl-facing parts are
wired: `kubectl get infd` prints the columns, `kubectl explain` the descriptions, and
`kubectl wait --for=condition=Ready` and `kubectl scale infd` work through the status and
scale subresources (status is patched as the admin here, in the operator's stead)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_harness import CRD, LocalCluster
from kubeinfer.operator.commands.validate import run as validate
from waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = sorted((ROOT / "tests" / "manifests" / "invalid").glob("*.yaml"))
CRD_NAME = "inferencedeployments.kubeinfer.io"


def expectation(path: Path) -> str:
    """The first line of each invalid manifest says what it must be refused with."""
    return path.read_text().splitlines()[0].removeprefix("# expect: ")


YAML_LEVEL = [p for p in INVALID if re.match(r"line \d+, column \d+: ", expectation(p))]
"""Refused by `kubeinfer validate` as YAML (a syntax error, a duplicate key, a scalar that
YAML 1.1 and 1.2 read differently), before any object exists to send."""
CLIENT_REFUSED = {"wrong-kind.yaml", "uid-alias-bomb.yaml"}
"""kubectl refuses these itself: no resource maps to the kind, or the uid does not decode."""
SENT = [p for p in INVALID if p not in YAML_LEVEL and p.name not in CLIENT_REFUSED]


@pytest.fixture(scope="module")
def namespace(local_cluster: LocalCluster) -> Iterator[str]:
    name = local_cluster.new_namespace("crd-on-api-server")
    yield name
    local_cluster.admin().delete("v1", "namespaces", name, namespace=None)


def kubectl(cluster: LocalCluster, *args: str, stdin: str | None = None) -> str:
    """kubectl's output; an AssertionError with its words when it fails."""
    return cluster.kubectl(*args, stdin=stdin)


def refused(cluster: LocalCluster, *args: str) -> str:
    """What kubectl says when the command fails (it must)."""
    result = subprocess.run(
        [str(cluster.cluster.kubectl), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode != 0, f"kubectl {' '.join(args)} succeeded: {result.stdout}"
    return result.stderr


def test_the_crd_as_shipped_is_established_and_kept_whole(local_cluster: LocalCluster) -> None:
    stored = json.loads(kubectl(local_cluster, "get", "crd", CRD_NAME, "-o", "json"))
    conditions = {c["type"]: c for c in stored["status"]["conditions"]}
    assert conditions["Established"]["status"] == "True"
    assert conditions["NamesAccepted"]["status"] == "True"
    assert "NonStructuralSchema" not in conditions, conditions["NonStructuralSchema"]["message"]
    shipped = yaml.safe_load(CRD.read_text())
    # Nothing of the schema was dropped or rewritten on the way in.
    assert stored["spec"]["versions"] == shipped["spec"]["versions"]
    assert stored["spec"]["names"] == {**shipped["spec"]["names"], **stored["spec"]["names"]}


def validate_says(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """(field, message) of the one finding `kubeinfer validate` prints for the file."""
    assert validate([path]) == 1
    [line] = [l for l in capsys.readouterr().err.splitlines() if l.startswith(f"{path}: ")]  # noqa: E741
    field, _, message = line.removeprefix(f"{path}: ").partition(": ")
    return field, message


def in_server_words(field: str, message: str) -> re.Pattern[str]:
    """What kube-apiserver says for the finding `validate` reports as `field: message`: a
    schema check in the server's words, for the same field and the same bound, pattern,
    type or values; a CEL rule (the CRD carries the models' rules) in its own words."""
    f = re.escape(field)
    schema_checks: list[tuple[str, Any]] = [
        (r"Input should be a valid integer",
         lambda m: rf'{f}: Invalid value: "\w+": {f} in body must be of type integer'),
        (r"Field required", lambda m: rf"{f}: Required value"),
        (r"String should match pattern '(.+)'",
         lambda m: rf'{f}: Invalid value: ".*": {f} in body should match '
                   + re.escape("'" + m[1] + "'")),
        (r"Input should be (greater|less) than or equal to (\S+)",
         lambda m: rf"{f}: Invalid value: \S+: {f} in body should be {m[1]} than or equal to "
                   rf"{re.escape(m[2])}\b"),
        (r"Extra inputs are not permitted",
         lambda m: rf'strict decoding error: unknown field "{f}"'),
        (r"Input should be ('[^']*'(?:, '[^']*')* or '[^']*')",
         lambda m: rf'{f}: Unsupported value: "[^"]*": supported values: '
                   + re.escape(", ".join(f'"{v}"' for v in re.findall(r"'([^']*)'", m[1])))),
    ]  # fmt: skip
    for pattern, words in schema_checks:
        if match := re.fullmatch(pattern, message):
            return re.compile(words(match))
    # A rule on the root (metadata has no schema to point into) reports no field.
    at = "<nil>" if field == "metadata.name" else f
    return re.compile(rf"{at}: Invalid value: {re.escape(message)}$", re.M)


@pytest.mark.parametrize("path", SENT, ids=lambda p: p.name)
def test_an_invalid_manifest_is_refused_by_the_api_server_as_validate_refuses_it(
    path: Path, local_cluster: LocalCluster, namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    field, message = validate_says(path, capsys)
    assert f"{field}: {message}".startswith(expectation(path))
    # A server-side dry run: admission and validation run in full, nothing is stored.
    refusal = refused(local_cluster, "create", "--dry-run=server", "-n", namespace, "-f", str(path))
    assert in_server_words(field, message).search(refusal), refusal


@pytest.mark.parametrize(
    ("name", "kubectl_says"),
    [
        ("wrong-kind.yaml", 'no matches for kind "Deployment" in version "kubeinfer.io/v1alpha1"'),
        ("uid-alias-bomb.yaml",
         "cannot unmarshal array into Go struct field ObjectMeta.metadata.uid"),
    ],
)  # fmt: skip
def test_kubectl_refuses_what_it_cannot_map_or_decode_before_sending(
    name: str, kubectl_says: str, local_cluster: LocalCluster, namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    path = ROOT / "tests" / "manifests" / "invalid" / name
    field, _ = validate_says(path, capsys)
    refusal = refused(local_cluster, "create", "--dry-run=server", "-n", namespace, "-f", str(path))
    # Client-side: kubectl's own "error: ...", never the server's "Error from server".
    assert refusal.startswith("error: ") and kubectl_says in refusal, refusal
    assert field in refusal or field == "kind"  # the kind is named by its value


KUBECTL_READINGS = {
    # What kubectl (YAML 1.1, last duplicate wins) sends where `validate` refuses the YAML.
    "duplicate-key.yaml": ("runtime", "replicas", 3),
    "enabled-yes.yaml": ("autoscaling", "enabled", True),
    "replicas-leading-zero.yaml": ("runtime", "replicas", 8),
    "yaml-syntax-error.yaml": None,  # kubectl cannot read it either
}


def test_every_yaml_level_refusal_has_a_kubectl_reading() -> None:
    assert {p.name for p in YAML_LEVEL} == set(KUBECTL_READINGS)


@pytest.mark.parametrize("path", YAML_LEVEL, ids=lambda p: p.name)
def test_a_yaml_level_refusal_stops_what_kubectl_would_read_differently(
    path: Path, local_cluster: LocalCluster, namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    field, message = validate_says(path, capsys)
    assert f"{field}: {message}".startswith(expectation(path))
    reading = KUBECTL_READINGS[path.name]
    create = ("create", "--dry-run=server", "-n", namespace, "-o", "json", "-f", str(path))
    if reading is None:
        assert refused(local_cluster, *create).startswith("error: error parsing")
        return
    section, key, value = reading
    assert json.loads(kubectl(local_cluster, *create))["spec"][section][key] == value


def missing_from(sent: Any, stored: Any, path: str = "spec") -> list[str]:
    """The paths of `sent` that `stored` does not hold with the same value (defaults the
    server added are not differences)."""
    if isinstance(sent, dict) and isinstance(stored, dict):
        return [p for k, v in sent.items()
                for p in (missing_from(v, stored[k], f"{path}.{k}") if k in stored
                          else [f"{path}.{k}"])]  # fmt: skip
    return [] if sent == stored else [f"{path}: sent {sent!r}, stored {stored!r}"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_an_example_is_stored_unchanged(
    example: Path, local_cluster: LocalCluster, namespace: str
) -> None:
    document = yaml.safe_load(example.read_text())
    document["metadata"]["namespace"] = namespace
    kubectl(local_cluster, "create", "-f", "-", stdin=json.dumps(document))
    name = document["metadata"]["name"]
    stored = json.loads(kubectl(local_cluster, "get", "infd", name, "-n", namespace, "-o", "json"))
    assert missing_from(document["spec"], stored["spec"]) == []
    for key in ("labels", "annotations"):
        assert stored["metadata"].get(key, {}) == document["metadata"].get(key, {})


def create_minimal(cluster: LocalCluster, namespace: str, name: str) -> None:
    document = yaml.safe_load((ROOT / "examples" / "cpu-minimal.yaml").read_text())
    document["metadata"] = {"name": name, "namespace": namespace}
    kubectl(cluster, "create", "-f", "-", stdin=json.dumps(document))


def patch_status(cluster: LocalCluster, namespace: str, name: str, status: dict[str, Any]) -> None:
    kubectl(cluster, "patch", "infd", name, "-n", namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": status}))  # fmt: skip


def test_kubectl_get_prints_the_printer_columns(
    local_cluster: LocalCluster, namespace: str
) -> None:
    create_minimal(local_cluster, namespace, "columns")
    zero = {"type": "ScaledToZero", "status": "True", "reason": "Idle", "message": "Zero pods.",
            "lastTransitionTime": "2026-12-04T00:00:00Z"}  # fmt: skip
    status = {"ready": "0/0", "phase": "Ready", "metrics": {"p99Milliseconds": 12.5},
              "conditions": [zero]}  # fmt: skip
    patch_status(local_cluster, namespace, "columns", status)
    table = kubectl(local_cluster, "get", "infd", "columns", "-n", namespace)
    header, row = table.splitlines()
    assert header.split() == [
        "NAME", "MODEL", "VERSION", "BACKEND", "PRECISION", "READY", "PHASE", "ZERO", "P99",
        "ANSWERS", "AGE",
    ]  # fmt: skip
    assert row.split()[:-1] == ["columns", "resnet", "1", "onnxruntime", "fp32", "0/0", "Ready",
                                "True", "12.5"]  # fmt: skip
    # The short name and the categories reach it too.
    assert "columns" in kubectl(local_cluster, "get", "kubeinfer", "-n", namespace, "-o", "name")
    assert "inferencedeployment.kubeinfer.io/columns" in kubectl(
        local_cluster, "get", "all", "-n", namespace, "-o", "name"
    )


def test_kubectl_explain_shows_the_descriptions(local_cluster: LocalCluster) -> None:
    explained = kubectl(local_cluster, "explain", "infd.spec")
    assert re.search(r"KIND:\s+InferenceDeployment", explained)
    assert re.search(r"VERSION:\s+v1alpha1", explained)
    spec = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for name, field in spec["properties"]["spec"]["properties"].items():
        assert re.search(rf"^  {name}\t<\w+>", explained, re.M), name
        assert field["description"].splitlines()[0] in explained, name
    replicas = kubectl(local_cluster, "explain", "infd.spec.runtime.replicas")
    described = spec["properties"]["spec"]["properties"]["runtime"]["properties"]["replicas"]
    assert " ".join(described["description"].split()) in " ".join(replicas.split())


def test_kubectl_wait_for_ready_is_wired_to_the_status_subresource(
    local_cluster: LocalCluster, namespace: str
) -> None:
    create_minimal(local_cluster, namespace, "waited")
    # Status written through the main resource is ignored: status is its own subresource.
    kubectl(local_cluster, "patch", "infd", "waited", "-n", namespace, "--type=merge",
            "-p", json.dumps({"status": {"phase": "Failed"}}))  # fmt: skip
    stored = json.loads(
        kubectl(local_cluster, "get", "infd", "waited", "-n", namespace, "-o", "json")
    )
    assert "status" not in stored or "phase" not in stored["status"]
    early = refused(local_cluster, "wait", "--for=condition=Ready", "infd/waited",
                    "-n", namespace, "--timeout=1s")  # fmt: skip
    assert "timed out" in early, early

    waiting = subprocess.Popen(
        [str(local_cluster.cluster.kubectl), f"--kubeconfig={local_cluster.kubeconfig}", "wait",
         "--for=condition=Ready", "infd/waited", "-n", namespace, "--timeout=60s"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        # Watching before the status is written, so the condition arrives as a change.
        wait_for(
            lambda: local_cluster.audit.calls(
                lambda c: (
                    (c.verb, c.resource, c.namespace)
                    == ("watch", "inferencedeployments", namespace)
                )
            ),
            what="kubectl wait to watch",
        )
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        patch_status(local_cluster, namespace, "waited", {"conditions": [
            {"type": "Ready", "status": "True", "reason": "Serving",
             "message": "every replica serves", "lastTransitionTime": now}]})  # fmt: skip
        output, _ = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
        waiting.wait()
    assert waiting.returncode == 0, output
    assert output.strip() == "inferencedeployment.kubeinfer.io/waited condition met"


def test_kubectl_scale_is_wired_to_the_scale_subresource(
    local_cluster: LocalCluster, namespace: str
) -> None:
    create_minimal(local_cluster, namespace, "scaled")
    kubectl(local_cluster, "scale", "infd/scaled", "-n", namespace, "--replicas=5")
    stored = json.loads(
        kubectl(local_cluster, "get", "infd", "scaled", "-n", namespace, "-o", "json")
    )
    assert stored["spec"]["runtime"]["replicas"] == 5
    selector = "app.kubernetes.io/instance=scaled"
    patch_status(local_cluster, namespace, "scaled", {"replicas": 4, "selector": selector})
    scale = json.loads(kubectl(local_cluster, "get", "infd", "scaled", "-n", namespace,
                               "--subresource=scale", "-o", "json"))  # fmt: skip
    assert scale["kind"] == "Scale"
    assert scale["spec"] == {"replicas": 5}
    assert scale["status"] == {"replicas": 4, "selector": selector}
    # The precondition reads the scale's spec: a stale count is refused.
    stale = refused(local_cluster, "scale", "infd/scaled", "-n", namespace,
                    "--current-replicas=2", "--replicas=1")  # fmt: skip
    assert "Expected replicas to be 2, was 5" in stale, stale
