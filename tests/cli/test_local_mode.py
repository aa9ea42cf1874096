"""`kubeinfer up` / `kubeinfer down`, as a user runs them (real processes):

- `up --detach --cpu FILE`, started in the host's network namespace as a user's shell
  would start it, with the model a file under /tmp: it returns once the manifest is
  applied and its endpoint open, printing what the machine lacks (TensorRT, GPUs), that
  the file was published to the pods, and `export KUBECONFIG=...`. With that kubeconfig
  (a port of the host's namespace) the cluster's kubectl waits for Ready, `get infd`
  shows the printer columns, `describe` shows the Event; the printed endpoint answers an
  inference and the printed Prometheus has discovered the runtime pod, both asked from
  the host's namespace, which holds no route or address of the cluster's and is left as
  it was; the operator runs as a pod of its own image under the chart's ServiceAccount; a
  verb taken out of the chart's ClusterRole shows up as the operator's failure
  (Forbidden) on the next object; `down` leaves no process, mount, cgroup or namespace;
- `up` in the foreground refuses a second session in its directory (which would stop its
  cluster) and, interrupted with Ctrl-C (SIGINT), stops everything too;
- a port the session opens in the host's namespace relays to a server only the
  session's namespace has (`forward`, in this process).
Plus the pure parts: what `kubeinfer up` changes and says, the Table rendering, the install.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import host_network
import pytest
import yaml
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.cli.local import forward, install, substitutions, table
from kubeinfer.cli.main import main
from kubeinfer.cluster import cgroups, control_plane, netns, teardown
from kubeinfer.cluster.binaries import ensure_binaries
from kubeinfer.operator import rbac
from processes_left import processes_mentioning
from waiting import wait_for

KUBEINFER = [sys.executable, "-m", "kubeinfer.cli.main"]
CLUSTER_RANGES = [ipaddress.ip_network(r) for r in (netns.POD_SUBNET, netns.SERVICE_SUBNET)]


def manifest(model: Path) -> dict:
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


def in_host(argv: list[str], timeout: float = 180, stdin: str | None = None):  # type: ignore[no-untyped-def]
    """`argv` run in the host's network namespace (this worker has left it)."""
    command, descriptors = netns.in_host_namespace(argv)
    return subprocess.run(
        command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False,
        pass_fds=descriptors,
    )  # fmt: skip


def routes_into_the_cluster(view: dict[str, list[str]], pod_ip: str) -> list[str]:
    """Lines of the host's addresses and routes that cover the cluster's ranges, and the
    host's route to `pod_ip` if it goes through a device of the cluster's."""
    found = []
    for line in view["addresses"] + view["routes"]:
        for word in line.split():
            try:
                network = ipaddress.ip_network(word, strict=False)
            except ValueError:
                continue
            if network.prefixlen and any(network.overlaps(r) for r in CLUSTER_RANGES):
                found.append(line)
    route = in_host(["ip", "-j", "route", "get", pod_ip], timeout=30)
    for entry in json.loads(route.stdout or "[]"):
        if entry.get("dev") in (netns.NODE_BRIDGE, "lo") or entry.get("type") == "local":
            found.append(json.dumps(entry))
    return found


def namespace_inode(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


@pytest.mark.slow
@pytest.mark.lifecycle
@pytest.mark.timeout(1200)
def test_up_detached_serves_reports_and_down_leaves_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "up-detached"
    model = build_tiny_mlp(tmp_path / "models" / "up-tiny.onnx")  # under /tmp
    file = tmp_path / "up.yaml"
    file.write_text(yaml.safe_dump(manifest(model)))
    kubectl = str(ensure_binaries()["kubectl"])
    before = host_network.snapshot()
    up = in_host(
        [*KUBEINFER, "up", "--detach", "--cpu", f"--directory={directory}", str(file)],
        timeout=600,
    )
    state = json.loads((directory / "session.json").read_text()) if up.returncode == 0 else {}
    session_namespace = namespace_inode(state.get("pid", "none"))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "tensorrt needs TensorRT and a GPU" in up.stdout
        assert f"model source file://{model}: a file of this machine" in up.stdout
        assert f"export KUBECONFIG={directory / 'kubeconfig'}" in up.stdout
        assert session_namespace not in (None, namespace_inode("self"))
        config = f"--kubeconfig={directory / 'kubeconfig'}"

        def run(*args: str, stdin: str | None = None) -> str:
            done = in_host([kubectl, config, *args], stdin=stdin)
            assert done.returncode == 0, done.stderr
            return done.stdout

        server = json.loads(run("config", "view", "-o", "json"))["clusters"][0]["cluster"]
        assert server["server"].startswith("https://127.0.0.1:")
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
            "ZERO",
            "P99",
            "ANSWERS",
            "AGE",
        ]
        assert row.split()[:7] == ["tiny", "tiny", "1", "onnxruntime", "fp32", "1/1", "Ready"]
        described = run("describe", "infd", "tiny")
        assert "kubeinfer up --cpu ran this on CPU" in described
        assert "served this machine's files to the pods" in described

        url = state["endpoints"]["default/tiny"] + "/v2/models/tiny/infer"
        assert url.startswith("http://127.0.0.1:")
        body = json.dumps(
            {
                "inputs": [
                    {"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}
                ]
            }
        )
        answer = in_host(["curl", "-sS", "--fail-with-body", "-d", body, url], timeout=30)
        assert answer.returncode == 0, answer.stdout + answer.stderr
        assert json.loads(answer.stdout)["outputs"][0]["shape"] == [1, 10], answer

        # Prometheus, asked from the host's namespace, discovered the runtime pod.
        targets = state["prometheus_url"] + "/api/v1/targets?state=active"

        def scraped() -> list[str]:
            found = in_host(["curl", "-sS", targets], timeout=30)
            active = json.loads(found.stdout or "{}").get("data", {}).get("activeTargets", [])
            return [t["labels"].get("pod", "") for t in active if t.get("health") == "up"]

        up_targets = wait_for(scraped, 120, "a scraped pod", every=0.5)
        assert any(p.startswith("tiny-runtime-") for p in up_targets)

        # The pods are the session's: the host's namespace has no way to them.
        pods = json.loads(run("get", "pods", "-l", "kubeinfer.io/role=serving", "-o", "json"))
        pod_ip = pods["items"][0]["status"]["podIP"]
        during = host_network.snapshot()
        assert routes_into_the_cluster(during, pod_ip) == []
        assert host_network.changes(before, during) == []

        selector = ",".join(f"{k}={v}" for k, v in install.OPERATOR_SELECTOR.items())
        operator = json.loads(run("get", "pods", "-n", install.NAMESPACE, "-l", selector,
                                  "-o", "json"))  # fmt: skip
        (pod,) = operator["items"]  # the activator's pods beside it are not the operator
        assert pod["spec"]["serviceAccountName"] == install.OPERATOR_ACCOUNT
        assert pod["spec"]["containers"][0]["image"] == install.OPERATOR_IMAGE

        # A stale chart: its ClusterRole lacks `create` on Jobs.
        role = json.loads(run("get", "clusterrole", install.OPERATOR_ACCOUNT, "-o", "json"))
        for rule in role["rules"]:
            if "jobs" in rule["resources"]:
                rule["verbs"] = [v for v in rule["verbs"] if v != "create"]
        run("replace", "-f", "-", stdin=json.dumps(role))
        second = manifest(model)
        second["metadata"]["name"] = "second"
        second["spec"]["engine"].update(backend="onnxruntime", precision="fp16")
        del second["spec"]["runtime"]["resources"]
        run("apply", "-f", "-", stdin=json.dumps(second))
        run(
            "wait",
            "--for=jsonpath={.status.conditions[?(@.type=='Degraded')].reason}=Forbidden",
            "infd/second",
            "--timeout=120s",
        )
        assert 'cannot create resource "jobs"' in run("describe", "infd", "second")
    finally:
        down = in_host([*KUBEINFER, "down", f"--directory={directory}"], timeout=180)
    assert down.returncode == 0, down.stderr
    assert processes_mentioning(directory) == []
    left = [pid for pid in os.listdir("/proc") if namespace_inode(pid) == session_namespace]
    assert left == [], "the session's namespace outlived it"
    cluster = directory / "cluster"
    node_state = control_plane.node_directory(cluster)
    assert teardown.mounts_under(directory) == [] and teardown.mounts_under(node_state) == []
    assert not node_state.exists()
    assert cgroups.cgroup_directories(control_plane.cgroup_root(cluster)) == []
    assert host_network.changes(before, host_network.snapshot()) == []


@pytest.mark.slow
@pytest.mark.lifecycle
@pytest.mark.timeout(900)
def test_up_in_the_foreground_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    directory = tmp_path / "up-foreground"
    process = subprocess.Popen(
        [*KUBEINFER, "up", f"--directory={directory}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    assert process.stdout is not None
    deadline = time.monotonic() + 300
    for line in process.stdout:
        lines.append(line)
        if line.startswith("export KUBECONFIG=") or time.monotonic() > deadline:
            break
    assert any(line.startswith("export KUBECONFIG=") for line in lines), "".join(lines)
    assert processes_mentioning(directory), "the session runs"
    second = subprocess.run(
        [*KUBEINFER, "up", "--detach", f"--directory={directory}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert second.returncode == 1 and "a session already runs from" in second.stderr
    session_namespace = namespace_inode(process.pid)
    assert session_namespace not in (None, namespace_inode("self"))
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, "".join(lines) + output
    assert "kubeinfer up: stopping" in output
    assert processes_mentioning(directory) == []
    left = [pid for pid in os.listdir("/proc") if namespace_inode(pid) == session_namespace]
    assert left == [], "the session's namespace outlived it"


def test_a_port_of_the_host_relays_to_a_server_only_the_session_has() -> None:
    """The forwarder listens in the host's namespace and connects in this worker's own
    (standing in for the session's); the server is on loopback here, not the host's."""
    host = netns.host_namespace()
    assert host is not None, "the test process did not leave the host's namespace"
    inside = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)

    async def scenario() -> tuple[int, bytes, bool]:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\ninside")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        forwarder = forward.Forwarder(host, inside, forward.fixed("127.0.0.1", port))
        await forwarder.start()
        try:
            status, body = await asyncio.to_thread(forward.request_from, host, forwarder.url)
            try:  # the server itself is no port of the host's namespace
                direct = f"http://127.0.0.1:{port}"
                _, seen = await asyncio.to_thread(forward.request_from, host, direct, None, {}, 5)
                reached = seen == b"inside"
            except OSError:
                reached = False
        finally:
            await forwarder.close()
            server.close()
        return status, body, reached

    try:
        status, body, reached_directly = asyncio.run(scenario())
    finally:
        os.close(inside)
    assert (status, body) == (200, b"inside")
    assert not reached_directly


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
        ({"model": {"source": {"uri": "file:///nowhere/m.onnx"}}}, False, ["no such file"], []),
        ({"model": {"source": {"uri": "http://10.244.0.1:8180/a/m.onnx"}}}, True, [], []),
    ],
    ids=["gpu-without-cpu", "gpu-with-cpu", "s3-without-credentials", "missing-file", "fine"],
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
    assert ("--cpu ran this on CPU" in adapted.event_message()) == bool(changed)
    if changed:
        assert adapted.manifest["spec"]["engine"]["backend"] == "onnxruntime"
        assert "gpus" not in adapted.manifest["spec"]["runtime"]["resources"]
    assert document["spec"] == spec, "the caller's manifest is left as it was"


def test_files_of_this_machine_are_applied_as_the_file_servers_urls() -> None:
    document = {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": "m"},
        "spec": {
            "model": {"source": {"uri": "file:///tmp/models/m.onnx"}},
            "engine": {"calibration": {"uri": "file:///tmp/models/c.npz"}},
        },
    }
    assert substitutions.local_files(document) == [
        "file:///tmp/models/m.onnx",
        "file:///tmp/models/c.npz",
    ]
    published = {
        "file:///tmp/models/m.onnx": "http://10.244.0.1:8180/abc/m.onnx",
        "file:///tmp/models/c.npz": "http://10.244.0.1:8180/abc/c.npz",
    }
    adapted = substitutions.adapt(document, False, published)
    spec = adapted.manifest["spec"]
    assert spec["model"]["source"]["uri"] == "http://10.244.0.1:8180/abc/m.onnx"
    assert spec["engine"]["calibration"]["uri"] == "http://10.244.0.1:8180/abc/c.npz"
    assert adapted.changes == []
    assert adapted.published == [
        "model.source.uri file:///tmp/models/m.onnx -> http://10.244.0.1:8180/abc/m.onnx",
        "engine.calibration.uri file:///tmp/models/c.npz -> http://10.244.0.1:8180/abc/c.npz",
    ]
    assert [n.split(": ")[1] for n in adapted.notes] == [
        "model source file:///tmp/models/m.onnx",
        "calibration file:///tmp/models/c.npz",
    ]
    annotation = adapted.manifest["metadata"]["annotations"][substitutions.ANNOTATION]
    assert annotation == "; ".join(adapted.published)
    assert "served this machine's files to the pods" in adapted.event_message()
    assert document["spec"]["model"]["source"]["uri"] == "file:///tmp/models/m.onnx"


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


def test_the_local_install_grants_every_rule_kubeinfer_rbac_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One list of roles for every installer: a role added to `kubeinfer rbac` (and so to
    # the chart) and not to `kubeinfer up` left the demo's operator without the nodes'
    # watch, which kopf answers by stopping the whole operator.
    def rules(documents: list[dict]) -> set[str]:
        return {
            json.dumps(rule, sort_keys=True)
            for document in documents
            if document["kind"] in ("ClusterRole", "Role")
            for rule in document["rules"]
        }

    account = install.OPERATOR_ACCOUNT
    argv = ["rbac", "--name", account, "--leader-election", "--lease-namespace",
            install.NAMESPACE, "--lease-name", account]  # fmt: skip
    assert main(argv) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert rules(install.operator_objects(None)) == rules(printed)


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return dict(deployment["spec"]["template"]["metadata"]["labels"])


def test_the_operator_is_installed_with_the_charts_rbac() -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in install.operator_objects(None)}
    role = objects[("ClusterRole", install.OPERATOR_ACCOUNT)]
    assert role["rules"] == [rule.to_dict() for rule in rbac.RULES]
    nodes = objects[("ClusterRole", f"{install.OPERATOR_ACCOUNT}-nodes")]
    assert nodes["rules"] == [rule.to_dict() for rule in rbac.NODE_RULES]
    lease = objects[("Role", f"{install.OPERATOR_ACCOUNT}-leader-election")]
    assert lease["rules"] == [rule.to_dict() for rule in rbac.lease_rules(install.OPERATOR_ACCOUNT)]
    roles = {name for (kind, name) in objects if kind in ("ClusterRole", "Role")}
    bindings = [o for (kind, _), o in objects.items() if kind.endswith("Binding")]
    assert {b["roleRef"]["name"] for b in bindings} == roles, "each role bound, once"
    for found in bindings:
        assert found["subjects"][0]["name"] == install.OPERATOR_ACCOUNT
    deployment = objects[("Deployment", install.OPERATOR_ACCOUNT)]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == install.OPERATOR_ACCOUNT
    (container,) = pod["containers"]
    assert container["args"][:2] == ["operator", "--all-namespaces"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # The activator's wakes reach the operator's metrics port through its Service.
    service = objects[("Service", install.OPERATOR_ACCOUNT)]
    assert service["spec"]["selector"].items() <= pod_labels(deployment).items()
    (port,) = service["spec"]["ports"]
    assert f"--metrics-port={port['port']}" in container["args"]
    assert {"name": port["targetPort"], "containerPort": port["port"]}.items() <= (
        container["ports"][0].items()
    )
    assert install.WAKE_URL.startswith(
        f"http://{install.OPERATOR_ACCOUNT}.{install.NAMESPACE}.svc:{port['port']}/"
    )
    with_prometheus = install.operator_objects("http://10.244.0.1:9090")
    env = with_prometheus[-1]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "KUBEINFER_METRICS__PROMETHEUS_URL", "value": "http://10.244.0.1:9090"} in env
    names_only = {e["name"] for e in env if "value" in e}
    assert not any("TESTING" in n for n in names_only), "`kubeinfer up` injects no faults"
    faults = {"KUBEINFER_PODS__TESTING_FAULTS": "perturb-batches=1"}
    with_faults = install.operator_objects(None, faults)
    env = with_faults[-1]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "KUBEINFER_PODS__TESTING_FAULTS", "value": "perturb-batches=1"} in env
    assert {"name": "KUBEINFER_IMAGES__PULL_POLICY", "value": "Never"} in env, "and the laptop's"
    for name in install.RESTRICTED_NAMESPACES:
        labels = objects[("Namespace", name)]["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
