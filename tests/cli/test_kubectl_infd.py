"""`kubectl infd` (the `kubectl-infd` console script) through the real `kubectl` the
control-plane build makes, which finds the plugin on PATH, against the real control plane
and the real operator (one namespace and one operator for the module):

- `watched`: int8 with a quality watch against its fp32 reference (two real build Jobs, a
  reference pod, live requests sampled at 100 %);
- `shadow`: pinned engines under a shadow test (a candidate stays Pending without
  traffic, until the gate acts).

A third object, `answered`, has no operator on it: its status is written by the test
through the status subresource, as the known-answer checks write it (two replicas taken
out, a suspect node), and `answers` prints it back to a user who may only `get`
InferenceDeployments.

The kubeconfig is a user's: a ServiceAccount's token, the Role the plugin needs, a current
context in another namespace and a context `ml` in the test's. `status` prints the
status' figures (read back from the object), `promote`/`abort` set the gate the operator
acts on, refuse a stale `--digest` and a missing candidate, `exemplars` writes the pod's
own `.npz` (the bytes the pod serves, read through the API server's pod proxy),
`build-logs` prints what `kubectl logs` prints for the build pods. A user whose Role lacks
a permission gets the API server's refusal in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from cluster_harness import LocalCluster, file_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from decide_scenarios import tuned
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.cli.kubectl_plugin.status_view import render
from kubeinfer.operator.rollout.shadow import GATE_ANNOTATION
from kubeinfer.operator.state import names
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.building.engine_build import build_engine
from operator_harness import (
    FAST,
    IDS,
    Model,
    World,
    condition,
    grant_operator_role,
    manifest,
    start_operator,
)
from waiting import wait_for

SETTINGS = tuned(FAST, requeue={"shadow_poll_seconds": 0.5})
BIN = Path(sys.executable).parent
"""Where `kubectl-infd` is installed (the console script of this environment)."""
USER = "sre"
USER_RULES = [
    {"apiGroups": ["kubeinfer.io"], "resources": ["inferencedeployments"],
     "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["pods/log", "pods/proxy"], "verbs": ["get"]},
]  # fmt: skip
"""What the plugin needs (docs/kubectl-infd.md's Role), and nothing more."""


@dataclass
class Setup:
    world: World
    kubectl: Path
    kubeconfig: Path
    shadow_engines: list[str]

    @property
    def namespace(self) -> str:
        return self.world.namespace

    def infd(self, name: str) -> dict[str, Any]:
        return self.world.kube.get(*IDS, name) or {}

    def run(self, *argv: str, kubeconfig: Path | None = None) -> tuple[int, str, str]:
        """`kubectl infd ARGV` as a user types it: the plugin found on PATH, the
        kubeconfig from KUBECONFIG."""
        env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "KUBECONFIG": str(kubeconfig or self.kubeconfig),
        }
        done = subprocess.run(
            [str(self.kubectl), "infd", *argv],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        return done.returncode, done.stdout, done.stderr


def grant(world: World, account: str, rules: list[dict[str, Any]]) -> str:
    """A ServiceAccount bound to a Role of `rules`; its token."""
    kube = world.kube
    kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}})
    rbac = "rbac.authorization.k8s.io"
    kube.create({"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": {"name": account},
                 "rules": rules})  # fmt: skip
    kube.create({
        "apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": {"name": account},
        "roleRef": {"apiGroup": rbac, "kind": "Role", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": world.namespace}],
    })  # fmt: skip
    return world.cluster.service_account_token(world.namespace, account)


def users_kubeconfig(cluster: LocalCluster, path: Path, token: str, namespace: str) -> Path:
    """A current context in `default` and a context `ml` in `namespace`, one user."""
    contexts = [
        {"name": "elsewhere", "context": {"cluster": "c", "user": "u", "namespace": "default"}},
        {"name": "ml", "context": {"cluster": "c", "user": "u", "namespace": namespace}},
    ]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "elsewhere",
        "clusters": [{"name": "c", "cluster": {
            "server": cluster.server, "certificate-authority": str(cluster.ca_file)}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": contexts,
    }))  # fmt: skip
    return path


def send_requests(url: str, count: int) -> None:
    rows = np.random.default_rng(5).standard_normal((count * 4, 16)).astype(np.float32)
    for index in range(count):
        batch = rows[index * 4 : index * 4 + 4]
        body = {"inputs": [{"name": "input", "shape": [4, 16], "datatype": "FP32",
                            "data": batch.ravel().tolist()}]}  # fmt: skip
        request = urllib.request.Request(
            f"{url}/v2/models/resnet/infer", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200


def digest_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextlib.contextmanager
def operator_in_a_thread(world: World) -> Iterator[None]:
    """The operator (`start_operator`) on an event loop of its own, for the module: the
    tests run `kubectl` as a user would, with nothing to await."""
    started, stop = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    async def operate() -> None:
        async with start_operator(world, SETTINGS):
            started.set()
            await asyncio.to_thread(stop.wait)

    def main() -> None:
        try:
            asyncio.run(operate())
        except BaseException as error:
            failed.append(error)
            started.set()

    thread = threading.Thread(target=main, name="operator", daemon=True)
    thread.start()
    started.wait(60)
    if failed:
        raise failed[0]
    try:
        yield
    finally:
        stop.set()
        thread.join(60)


@pytest.fixture(scope="module")
def setup(
    local_cluster: LocalCluster, model_directory: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    from test_operator_shadow_rollout import ready_urls

    assert (BIN / "kubectl-infd").exists(), f"no kubectl-infd in {BIN}: pip install -e ."
    namespace = local_cluster.new_namespace("kubectl-infd")
    world = World(local_cluster, local_cluster.admin(namespace))
    grant_operator_role(world)
    token = grant(world, USER, USER_RULES)
    kubeconfig = tmp_path_factory.mktemp("kubectl-infd") / "kubeconfig"
    users_kubeconfig(local_cluster, kubeconfig, token, namespace)
    tiny = Model(build_tiny_mlp(model_directory / f"{namespace}-tiny.onnx"))
    models = [tiny] + [
        Model(build_tiny_mlp(model_directory / f"{namespace}-{seed}.onnx", seed=seed))
        for seed in (2, 3)
    ]
    cache = world.cluster.claim_directory(namespace, names.cache_claim_name("shadow"))
    engines = [
        build_engine(str(m.path), "onnxruntime", "fp32", cache, max_batch_size=8).digest
        for m in models
    ]
    calibration = write_demo_samples(
        tiny.path, model_directory / f"{namespace}-calibration.npz", count=64
    )
    watched = manifest(
        tiny,
        name="watched",
        engine={
            "precision": "int8",
            "calibration": {"uri": file_url(calibration), "sha256": digest_of(calibration)},
        },
        # A long window: the exemplars stay what they are while the test reads them.
        qualityWatch={"enabled": True, "samplePercent": 100, "windowSeconds": 600,
                      "minSamples": 10},
    )  # fmt: skip
    setup = Setup(world, local_cluster.cluster.kubectl, kubeconfig, engines)
    try:
        with operator_in_a_thread(world):
            world.create(watched)
            world.create(manifest(tiny, name="shadow", engine={"pin": engines[0]},
                                  rollout={"strategy": "Shadow"}))  # fmt: skip
            wait_for(lambda: ready(setup.infd("watched")), 180, "watched Ready")
            reference = names.reference_name("watched")
            wait_for(lambda: ready_urls(world, reference), 120, "its reference running")

            def counted() -> int:
                watch = (setup.infd("watched").get("status") or {}).get("qualityWatch") or {}
                return int(watch.get("samples") or 0)

            # Requests until the operator has read them compared (the mirror reaches the
            # reference a moment after the reference's pod is ready), then until the pod
            # has settled every request it sampled (all of them: 100 %) and the operator has
            # read all its compared rows: from then on nothing moves the status.
            (url,) = ready_urls(world, names.service_name("watched"))

            def compared_enough() -> bool:
                if counted() >= 48:
                    return True
                send_requests(url, 4)
                return False

            wait_for(compared_enough, 60, lambda: f"48 samples: {setup.infd('watched')['status']}",
                     every=0.2)  # fmt: skip

            def settled() -> bool:
                with urllib.request.urlopen(f"{url}/v2/quality", timeout=10) as answer:
                    figures = json.loads(answer.read())
                resolved = sum(figures["requests"].values()) == figures["answered"]
                return resolved and counted() == figures["top1"]["rows"]

            wait_for(settled, 120, "every sampled request settled and its rows counted")
            yield setup
    finally:
        local_cluster.admin().delete("v1", "namespaces", namespace, namespace=None)


def ready(obj: dict[str, Any]) -> bool:
    return (condition(obj, "Ready") or {}).get("status") == "True"


def status_between_unchanged_reads(
    setup: Setup, *args: str
) -> tuple[int, str, str, dict[str, Any]]:
    """`kubectl infd status watched` run between two reads of the object, and the status
    they read: the setup has waited until every request sent was compared and counted, so
    nothing moves it any more (the operator writes nothing in steady state)."""
    before = setup.infd("watched")["status"]
    code, out, err = setup.run("status", "watched", *args)
    assert setup.infd("watched")["status"] == before, "the status moved with nothing new"
    return code, out, err, before


@pytest.mark.slow
def test_kubectl_finds_the_plugin(setup: Setup) -> None:
    code, out, err = setup.run("--help")
    assert code == 0, err
    assert "kubectl infd status NAME" in out


@pytest.mark.slow
def test_status_prints_the_figures_in_the_context_and_namespace_asked(setup: Setup) -> None:
    code, out, err, status = status_between_unchanged_reads(setup, "--context", "ml")
    assert code == 0, err
    watch = status["qualityWatch"]
    assert re.search(r"^Phase:\s+Ready$", out, re.M), out
    assert f"Engine:     {status['engine']['digest']}  onnxruntime int8 cpu" in out
    assert re.search(rf"^\s+serving\s+1\s+{status['serving']['engineDigest'][:19]}\s", out, re.M)
    assert f"QUALITY WATCH  {watch['state']}  window 600 s" in out
    overall = re.search(r"^\s+overall\s+(\d+)\s+(\S+)", out, re.M)
    assert overall is not None and int(overall.group(1)) >= 48, out
    assert re.search(r"^\s+Ready\s+True\s+Ready\s", out, re.M)
    # The current context is in another namespace: -n, or --kubeconfig with --context.
    code, out, err = setup.run("status", "watched")
    assert code == 1 and "inferencedeployment default/watched: 403 Forbidden" in err, err
    code, again, err = setup.run("status", "-n", setup.namespace, "watched")
    assert code == 0 and "Name:       watched" in again, err
    config = ["--kubeconfig", str(setup.kubeconfig), "--context", "ml"]
    code, again, err = setup.run("status", "watched", *config, kubeconfig=Path("/none"))
    assert code == 0 and "Name:       watched" in again, err
    code, _, err = setup.run("status", "nothing", "--context", "ml")
    assert code == 1 and f"inferencedeployment {setup.namespace}/nothing not found" in err, err


@pytest.mark.slow
def test_promote_and_abort_set_the_gate_the_operator_acts_on(setup: Setup) -> None:
    _, new, newer = setup.shadow_engines
    world, ml = setup.world, ("--context", "ml")

    def candidate() -> dict[str, Any]:
        return (setup.infd("shadow").get("status") or {}).get("candidate") or {}

    def pending(digest: str) -> bool:
        return candidate().get("engineDigest") == digest and candidate().get("verdict") == "Pending"

    wait_for(lambda: ready(setup.infd("shadow")), 120, "shadow Ready on its first engine")
    world.kube.patch(*IDS, "shadow", {"spec": {"model": {"version": "2"}, "engine": {"pin": new}}})
    wait_for(lambda: pending(new), 120, "the second engine under shadow test")
    code, out, err = setup.run("status", "shadow", *ml)
    assert code == 0, err
    assert re.search(rf"^\s+candidate\s+2\s+{new[:19]}\s+Pending\s", out, re.M), out
    assert f"Candidate {new}: ShadowRunning" in out

    code, _, err = setup.run("promote", "shadow", "--digest", newer, *ml)
    assert code == 1 and f"is now engine {new}" in err, err
    assert GATE_ANNOTATION not in (setup.infd("shadow")["metadata"].get("annotations") or {})
    code, out, err = setup.run("promote", "shadow", *ml)
    assert code == 0 and f"candidate {new} will be promoted" in out, err
    wait_for(lambda: candidate().get("verdict") == "Promoted", 120, "the candidate promoted")

    third = {"model": {"version": "3"}, "engine": {"pin": newer}}
    world.kube.patch(*IDS, "shadow", {"spec": third})
    wait_for(lambda: pending(newer), 120, "the third engine under shadow test")
    code, out, err = setup.run("abort", "shadow", "--digest", newer, *ml)
    assert code == 0 and f"candidate {newer} will be aborted" in out, err
    wait_for(lambda: candidate().get("verdict") == "Aborted", 60, "the candidate aborted")
    code, _, err = setup.run("abort", "shadow", *ml)
    assert code == 1 and "no candidate under shadow test (last verdict: Aborted)" in err, err


@pytest.mark.slow
def test_exemplars_writes_the_npz_the_pod_serves(setup: Setup, tmp_path: Path) -> None:
    output = tmp_path / "worst.npz"
    code, out, err = setup.run("exemplars", "watched", "-o", str(output), "--context", "ml")
    assert code == 0, err
    (pod,) = [
        p for p in setup.world.pods(names.selector_string(names.serving_selector("watched")))
        if not p["metadata"].get("deletionTimestamp")
    ]  # fmt: skip
    port = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
    url = f"http://{pod['status']['podIP']}:{port}/v2/quality/exemplars"
    served = urllib.request.urlopen(url, timeout=10).read()
    assert output.read_bytes() == served, "the bytes the pod itself serves"
    with np.load(io.BytesIO(served)) as archive:
        metadata = json.loads(str(archive["__metadata__"]))
        rows = archive["input"]
    assert 0 < len(metadata) == rows.shape[0] and rows.shape[1:] == (16,)
    said = f"({len(served)} bytes, {len(metadata)} exemplars) from pod {pod['metadata']['name']}"
    assert said in out, out


@pytest.mark.slow
def test_build_logs_prints_what_kubectl_logs_prints(setup: Setup) -> None:
    code, out, err = setup.run("build-logs", "watched", "--context", "ml")
    assert code == 0, err
    key = setup.infd("watched")["status"]["engine"]["buildKey"]
    selector = f"{names.build_pods_selector('watched')},{names.LABEL_BUILD_KEY}={key[:40]}"
    (pod,) = setup.world.pods(selector)
    job = pod["metadata"]["labels"]["job-name"]
    expected = setup.world.kube.kubectl("logs", pod["metadata"]["name"])
    assert expected.strip() and "[build" in expected
    assert out == f"==> job/{job} pod/{pod['metadata']['name']} <==\n{expected}"
    code, every, err = setup.run("build-logs", "watched", "--all", "--context", "ml")
    assert code == 0 and every.count("==> job/") == 2, every  # the serving and the reference
    code, _, err = setup.run("build-logs", "shadow", "--context", "ml")
    assert code == 1 and "runs the pinned engine sha256:" in err, err


@pytest.mark.slow
def test_a_user_without_the_permission_gets_the_refusal_in_one_line(
    setup: Setup, tmp_path: Path
) -> None:
    reader = [{"apiGroups": ["kubeinfer.io"], "resources": ["inferencedeployments"],
               "verbs": ["get"]}]  # fmt: skip
    token = grant(setup.world, "reader", reader)
    config = users_kubeconfig(setup.world.cluster, tmp_path / "kubeconfig", token, setup.namespace)
    for argv in (("exemplars", "watched"), ("build-logs", "watched")):
        code, _, err = setup.run(*argv, "--context", "ml", kubeconfig=config)
        assert code == 1 and "403 Forbidden" in err and "pods is forbidden" in err, err
        assert err.count("\n") == 1, err


def test_status_renders_the_quality_watch_the_operator_wrote() -> None:
    """The view of a drift the real operator recorded (Argo CD's testdata)."""
    drift = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "deploy/argocd/resource_customizations"
         "/kubeinfer.io/InferenceDeployment/testdata/degraded_qualityDrift.yaml").read_text()
    )  # fmt: skip
    watch = drift["status"]["qualityWatch"]
    out = render(drift, datetime(2030, 1, 1, tzinfo=UTC))
    assert re.search(r"^Degraded:\s+True  QualityDrift: Top-1 agreement drifted", out, re.M)
    assert f"QUALITY WATCH  Drifting  window {watch['windowSeconds']} s" in out
    worst = watch["worstClass"]
    assert re.search(
        rf"^\s+worst class {worst['name']}\s+{worst['samples']}\s+"
        rf"{round(worst['top1Agreement'], 4)}\s",
        out,
        re.M,
    ), out
    assert "Drifting: overall" in out


NOW = datetime(2026, 12, 2, 14, 10, tzinfo=UTC)
WRONG = [
    {"pod": "answered-runtime-7d9c-x2k4p", "node": "node-1", "cpuModel": "arch amd64",
     "engineDigest": "sha256:" + "ab" * 32, "reason": "KnownAnswersFailed", "output": "logits",
     "probe": 6, "error": 0.4001, "tolerance": 0.1398,
     "message": "output 'logits': probe 6 answered 0.4001", "detected": "2026-12-02T14:06:00Z"},
    {"pod": "answered-runtime-7d9c-q9w2z", "node": "node-2", "gpuProduct": "NVIDIA-H100",
     "gpuUuid": "GPU-5f2e", "engineDigest": "sha256:" + "cd" * 32,
     "reason": "AnswersDifferFromPeers", "probe": 3, "detected": "2026-12-02T14:01:00Z"},
]  # fmt: skip
"""status.wrongAnswers as the known-answer decision writes it, newest first."""


def answered_object(wrong: list[dict[str, Any]], suspect: list[str]) -> dict[str, Any]:
    condition = {"type": "AnswersCorrect", "status": "False", "reason": "KnownAnswersFailed",
                 "message": "2 pod(s) answered wrong and were taken out of serving",
                 "lastTransitionTime": "2026-12-02T14:06:00Z", "observedGeneration": 1}  # fmt: skip
    return {
        "metadata": {"name": "answered", "namespace": "ml", "generation": 1},
        "spec": {"knownAnswers": {"intervalSeconds": 300}},
        "status": {"conditions": [condition], "wrongAnswers": wrong, "suspectNodes": suspect},
    }


def answer_rows(out: str) -> list[list[str]]:
    """The WRONG ANSWERS table's rows, split on the columns' three spaces."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("POD "))
    rows = []
    for line in lines[start + 1 :]:
        if not line.startswith("  ") or line.strip().startswith("Suspect nodes"):
            break
        rows.append(re.split(r"\s{3,}", line.strip()))
    return rows


def test_answers_lists_the_replicas_taken_out_with_node_engine_probe_and_error() -> None:
    from kubeinfer.cli.kubectl_plugin.status_view import wrong_answers

    out = "\n".join(wrong_answers(answered_object(WRONG, ["node-1"]), NOW, always=True))
    assert "AnswersCorrect: False  KnownAnswersFailed: 2 pod(s) answered wrong" in out
    assert answer_rows(out) == [
        ["answered-runtime-7d9c-x2k4p", "node-1", "arch amd64", "sha256:abababababab",
         "KnownAnswersFailed", "logits", "6", "0.4001 (tolerance 0.1398)", "4m"],
        ["answered-runtime-7d9c-q9w2z", "node-2", "NVIDIA-H100 GPU-5f2e", "sha256:cdcdcdcdcdcd",
         "AnswersDifferFromPeers", "-", "3", "-", "9m"],
    ]  # fmt: skip
    assert "Suspect nodes: node-1" in out
    # An error the runtime reported as a NaN is left unset in the status.
    nan = [{**WRONG[0], "error": None}]
    assert answer_rows("\n".join(wrong_answers(answered_object(nan, []), NOW)))[0][7] == (
        "not finite"
    )


def test_answers_says_when_nothing_is_out_and_when_the_checks_are_off() -> None:
    from kubeinfer.cli.kubectl_plugin.status_view import wrong_answers

    clean = answered_object([], [])
    assert wrong_answers(clean, NOW) == [], "status shows the block only when a pod is out"
    assert "  No pod taken out" in wrong_answers(clean, NOW, always=True)
    off = {**clean, "spec": {}}
    assert "  Known-answer checks are off (spec.knownAnswers is unset)" in wrong_answers(
        off, NOW, always=True
    )
    # status: the block between the quality watch and the conditions, only when a pod is out.
    out = render(answered_object(WRONG, ["node-1"]), NOW)
    assert out.index("WRONG ANSWERS") < out.index("CONDITIONS")
    assert "WRONG ANSWERS" not in render(clean, NOW)


@pytest.mark.slow
def test_answers_prints_the_status_the_checks_wrote_to_a_user_who_may_only_get(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    """Through the real kubectl, with no operator: the status written as the operator
    writes it (the status subresource), read back by the plugin."""
    namespace = local_cluster.new_namespace("kubectl-infd-answers")
    world = World(local_cluster, local_cluster.admin(namespace))
    try:
        reader = [{"apiGroups": ["kubeinfer.io"], "resources": ["inferencedeployments"],
                   "verbs": ["get"]}]  # fmt: skip
        token = grant(world, "reader", reader)
        config = users_kubeconfig(local_cluster, tmp_path / "kubeconfig", token, namespace)
        model = tmp_path / "model.onnx"
        model.write_bytes(b"not read: no operator runs")
        body = manifest(Model(model), name="answered", knownAnswers={"intervalSeconds": 300})
        world.kube.create(body)
        status = answered_object(WRONG, ["node-1"])["status"]
        world.kube.patch(*IDS, "answered", {"status": status}, subresource="status")
        setup = Setup(world, local_cluster.cluster.kubectl, config, [])
        code, out, err = setup.run("answers", "answered", "--context", "ml")
        assert code == 0, err
        assert out.startswith("Name:       answered\n"), out
        assert [row[:5] for row in answer_rows(out)] == [
            [r["pod"], r["node"], ANY_DEVICE[i], f"sha256:{r['engineDigest'][7:19]}", r["reason"]]
            for i, r in enumerate(WRONG)
        ]
        assert [row[6:8] for row in answer_rows(out)] == [
            ["6", "0.4001 (tolerance 0.1398)"],
            ["3", "-"],
        ]
        assert "Suspect nodes: node-1" in out
        code, out, err = setup.run("status", "answered", "--context", "ml")
        assert code == 0 and "WRONG ANSWERS" in out, err
        code, _, err = setup.run("answers", "nothing", "--context", "ml")
        assert code == 1 and f"inferencedeployment {namespace}/nothing not found" in err, err
    finally:
        local_cluster.admin().delete("v1", "namespaces", namespace, namespace=None)


ANY_DEVICE = ["arch amd64", "NVIDIA-H100 GPU-5f2e"]
