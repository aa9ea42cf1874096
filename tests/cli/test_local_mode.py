"""`kubeinfer up` / `kubeinfer down`, as a user runs them (real processes):

- `up --detach --cpu FILE` returns once the manifest is applied and its endpoint open,
  printing what the machine lacks (TensorRT, GPUs) and `export KUBECONFIG=...`; with that
  kubeconfig the cluster's kubectl waits for Ready, `get infd` shows the printer columns,
  `describe` shows the --cpu Event; the endpoint answers an inference; the operator runs
  as a pod of its own image under the chart's ServiceAccount; a verb taken out of the
  chart's ClusterRole shows up as the operator's failure (Forbidden) on the next object;
  `down` stops everything: no process that mentions the session's directory is left;
- `up` in the foreground, interrupted with Ctrl-C (SIGINT), stops everything too.
Plus the pure parts: what `--cpu` changes and says, the Table rendering, the install.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubeinfer.cli.local import install, substitutions, table
from kubeinfer.cluster.binaries import ensure_binaries
from kubeinfer.operator import rbac
from kubeinfer.runtime.demo_models import build_tiny_mlp
from processes_left import processes_mentioning

KUBEINFER = [sys.executable, "-m", "kubeinfer.cli.main"]


def manifest(model: Path) -> dict:
    import hashlib

    return {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": "tiny", "namespace": "default"},
        "spec": {
            "model": {
                "name": "tiny",
                "version": "1",
                "source": {
                    "uri": f"file://{model}",
                    "sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
                },
            },
            "engine": {"backend": "tensorrt", "precision": "fp32", "maxBatchSize": 8},
            "runtime": {"replicas": 1, "resources": {"gpus": 1}, "batching": {"maxBatchSize": 8}},
        },
    }


@pytest.mark.slow
def test_up_detached_serves_reports_and_down_leaves_no_process(model_directory: Path) -> None:
    directory = model_directory / "up-detached"
    model = build_tiny_mlp(model_directory / "up-tiny.onnx")
    file = model_directory / "up.yaml"
    file.write_text(yaml.safe_dump(manifest(model)))
    kubectl = str(ensure_binaries()["kubectl"])
    up = subprocess.run(
        [*KUBEINFER, "up", "--detach", "--cpu", f"--directory={directory}", str(file)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "tensorrt needs TensorRT and a GPU" in up.stdout
        assert f"export KUBECONFIG={directory / 'kubeconfig'}" in up.stdout
        config = f"--kubeconfig={directory / 'kubeconfig'}"

        def run(*args: str) -> str:
            done = subprocess.run(
                [kubectl, config, *args], capture_output=True, text=True, timeout=180, check=False
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        run("wait", "--for=condition=Ready", "infd/tiny", "--timeout=150s")
        header, row = run("get", "infd").splitlines()[:2]
        assert header.split() == [
            "NAME",
            "MODEL",
            "VERSION",
            "BACKEND",
            "PRECISION",
            "READY",
            "PHASE",
            "P99",
            "AGE",
        ]
        assert row.split()[:7] == ["tiny", "tiny", "1", "onnxruntime", "fp32", "1/1", "Ready"]
        assert "kubeinfer up --cpu ran this on CPU" in run("describe", "infd", "tiny")

        state = json.loads((directory / "session.json").read_text())
        url = state["endpoints"]["default/tiny"] + "/v2/models/tiny/infer"
        body = json.dumps(
            {
                "inputs": [
                    {"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}
                ]
            }
        )
        answer = subprocess.run(
            ["curl", "-sf", "-d", body, url],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert json.loads(answer.stdout)["outputs"][0]["shape"] == [1, 10], answer

        operator = json.loads(run("get", "pods", "-n", install.NAMESPACE, "-o", "json"))
        (pod,) = operator["items"]
        assert pod["spec"]["serviceAccountName"] == install.OPERATOR_ACCOUNT
        assert pod["spec"]["containers"][0]["image"] == install.OPERATOR_IMAGE

        # A stale chart: its ClusterRole lacks `create` on Jobs.
        role = json.loads(run("get", "clusterrole", install.OPERATOR_ACCOUNT, "-o", "json"))
        for rule in role["rules"]:
            if "jobs" in rule["resources"]:
                rule["verbs"] = [v for v in rule["verbs"] if v != "create"]
        done = subprocess.run(
            [kubectl, config, "replace", "-f", "-"],
            input=json.dumps(role),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        second = manifest(model)
        second["metadata"]["name"] = "second"
        second["spec"]["engine"].update(backend="onnxruntime", precision="fp16")
        del second["spec"]["runtime"]["resources"]
        subprocess.run(
            [kubectl, config, "apply", "-f", "-"],
            input=json.dumps(second),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        run(
            "wait",
            "--for=jsonpath={.status.conditions[?(@.type=='Degraded')].reason}=Forbidden",
            "infd/second",
            "--timeout=120s",
        )
        assert 'cannot create resource "jobs"' in run("describe", "infd", "second")
    finally:
        down = subprocess.run(
            [*KUBEINFER, "down", f"--directory={directory}"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert down.returncode == 0, down.stderr
    assert processes_mentioning(directory) == []


@pytest.mark.slow
def test_up_in_the_foreground_stops_everything_on_ctrl_c(model_directory: Path) -> None:
    directory = model_directory / "up-foreground"
    process = subprocess.Popen(
        [*KUBEINFER, "up", f"--directory={directory}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    assert process.stdout is not None
    deadline = time.monotonic() + 180
    for line in process.stdout:
        lines.append(line)
        if line.startswith("export KUBECONFIG=") or time.monotonic() > deadline:
            break
    assert any(line.startswith("export KUBECONFIG=") for line in lines), "".join(lines)
    assert processes_mentioning(directory), "the session runs"
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, "".join(lines) + output
    assert "kubeinfer up: stopping" in output
    assert processes_mentioning(directory) == []


@pytest.mark.parametrize(
    ("spec", "cpu", "said", "changed"),
    [
        (
            {"engine": {"backend": "tensorrt"}, "runtime": {"resources": {"gpus": 1}}},
            False,
            ["tensorrt needs TensorRT", "1 nvidia.com/gpu"],
            [],
        ),
        (
            {
                "engine": {"backend": "tensorrt"},
                "runtime": {"resources": {"gpus": 2}, "gpuProduct": "NVIDIA-H100"},
            },
            True,
            ["--cpu builds it with ONNX Runtime"],
            [
                "engine.backend tensorrt -> onnxruntime",
                "runtime.resources.gpus 2 -> none",
                "runtime.gpuProduct NVIDIA-H100 -> none",
            ],
        ),
        ({"model": {"source": {"uri": "s3://models/m.onnx"}}}, False, ["no credentials"], []),
        ({"model": {"source": {"uri": "file:///tmp/m.onnx"}}}, False, ["own /tmp"], []),
        ({"model": {"source": {"uri": "file:///var/tmp/m.onnx"}}}, True, [], []),
    ],
    ids=["gpu-without-cpu", "gpu-with-cpu", "s3-without-credentials", "under-tmp", "fine"],
)
def test_what_the_machine_lacks_is_said_and_cpu_changes_it(
    spec: dict, cpu: bool, said: list[str], changed: list[str]
) -> None:
    document = {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": "m"},
        "spec": spec,
    }
    adapted = substitutions.adapt(document, cpu)
    assert len(adapted.notes) == len(said)
    for note, words in zip(adapted.notes, said, strict=True):
        assert words in note and note.startswith("InferenceDeployment/m")
    assert adapted.changes == changed
    annotations = adapted.manifest["metadata"].get("annotations") or {}
    assert (substitutions.ANNOTATION in annotations) == bool(changed)
    if changed:
        assert adapted.manifest["spec"]["engine"]["backend"] == "onnxruntime"
        assert "gpus" not in adapted.manifest["spec"]["runtime"]["resources"]
    assert document["spec"] == spec, "the caller's manifest is left as it was"


def test_the_table_renders_as_kubectl_and_age_alone_is_no_change() -> None:
    listing = {
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "priority": 0},
            {"name": "Ready", "type": "string", "priority": 0},
            {"name": "Detail", "type": "string", "priority": 1},
            {"name": "Age", "type": "date", "priority": 0},
        ],
        "rows": [
            {"cells": ["demo", "1/1", "x", "5s"], "object": {"metadata": {"namespace": "ml"}}},
            {"cells": ["b", None, "y", "12m"], "object": {"metadata": {"namespace": "default"}}},
        ],
    }
    assert table.render(listing) == [
        "NAMESPACE   NAME   READY   AGE",
        "ml          demo   1/1     5s",
        "default     b              12m",
    ]
    older = json.loads(json.dumps(listing))
    older["rows"][0]["cells"][3] = "6s"
    assert table.row_key(listing, listing["rows"][0]) == table.row_key(older, older["rows"][0])
    older["rows"][0]["cells"][1] = "0/1"
    assert table.row_key(listing, listing["rows"][0]) != table.row_key(older, older["rows"][0])


def test_the_operator_is_installed_with_the_charts_rbac() -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in install.operator_objects(None)}
    role = objects[("ClusterRole", install.OPERATOR_ACCOUNT)]
    assert role["rules"] == [rule.to_dict() for rule in rbac.RULES]
    lease = objects[("Role", f"{install.OPERATOR_ACCOUNT}-leader-election")]
    assert lease["rules"] == [rule.to_dict() for rule in rbac.lease_rules(install.OPERATOR_ACCOUNT)]
    for binding in ("ClusterRoleBinding", "RoleBinding"):
        (found,) = [o for (kind, _), o in objects.items() if kind == binding]
        assert found["subjects"][0]["name"] == install.OPERATOR_ACCOUNT
    deployment = objects[("Deployment", install.OPERATOR_ACCOUNT)]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == install.OPERATOR_ACCOUNT
    (container,) = pod["containers"]
    assert container["args"][:2] == ["operator", "--all-namespaces"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    with_prometheus = install.operator_objects("http://127.0.0.1:9090")
    env = with_prometheus[-1]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "KUBEINFER_METRICS__PROMETHEUS_URL", "value": "http://127.0.0.1:9090"} in env
