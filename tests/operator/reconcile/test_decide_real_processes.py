"""The decision's seams with the real CLI: the build Job's argv, run as is by a real
`kubeinfer build` process, writes the termination message the decision reads (the
digest, and the model's input bytes per row, from which the request body limit is
rendered); the ConfigMap's runtime.yaml it then renders is what a real `kubeinfer serve
--config` loads, and that server answers inference equal to ONNX Runtime in-process and
refuses a body over the rendered limit.

Only what a pod provides is substituted: the cache volume's mount path (/cache) and the
termination-log path become temporary paths, and the port a free loopback one.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml
from decide_scenarios import T0, Cluster, make_spec
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.contract.runtime_config import request_bytes_limit
from kubeinfer.operator.api.v1alpha1.conditions import ConditionStatus, ConditionType
from kubeinfer.operator.reconcile.desired import CACHE_MOUNT, CONFIG_KEY, TERMINATION_LOG
from ports import free_port
from processes import stop, wait_ready

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "kubeinfer.cli"]


def run_job(job: dict, cache: Path, termination_log: Path) -> subprocess.CompletedProcess:
    """Runs the Job's container as the kubelet would, with the pod's paths substituted."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["kubeinfer"]
    paths = {CACHE_MOUNT: str(cache), TERMINATION_LOG: str(termination_log)}
    argv = [paths.get(arg, arg) for arg in container["args"]]
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=120)


def request(port: int, method: str, path: str, body: bytes | None = None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_a_job_built_engine_is_served_from_the_rendered_config(tmp_path):
    model = build_tiny_mlp(tmp_path / "tiny.onnx")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    spec = make_spec(
        model={"name": "tiny", "source": {"uri": f"file://{model}", "sha256": sha}},
        engine={"maxBatchSize": 8},
        runtime={"batching": {"maxBatchSize": 8}},
    )
    cluster = Cluster(spec)
    cluster.reconcile()
    (job,) = cluster.jobs()
    cache, log = tmp_path / "cache", tmp_path / "termination-log"
    cache.mkdir()
    built = run_job(job, cache, log)
    assert built.returncode == 0, built.stderr

    cluster.succeed_job(job["metadata"]["name"], log.read_text(), at=T0 + timedelta(seconds=5))
    cluster.reconcile(T0 + timedelta(seconds=6))
    engine = cluster.condition(ConditionType.ENGINE_READY)
    assert engine.status == ConditionStatus.TRUE, engine.message
    digest = cluster.status.engine.digest
    reported = json.loads(log.read_text())
    assert digest == reported["digest"]
    assert reported["inputBytesPerRow"] == 16 * 4  # the tiny MLP: 16 FP32 per row

    config = yaml.safe_load(cluster.get("ConfigMap")["data"][CONFIG_KEY])
    assert config["engine"] == {"digest": digest, "cacheDirectory": CACHE_MOUNT}
    assert config["maxRequestBytes"] == request_bytes_limit(16 * 4, 8)
    config["engine"]["cacheDirectory"] = str(cache)  # where the PVC is "mounted" here
    config_file = tmp_path / CONFIG_KEY
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    server = subprocess.Popen(
        [*CLI, "serve", "--config", str(config_file), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_ready(
            lambda: request(port, "GET", "/v2/health/ready")[0] == 200,
            server, "kubeinfer serve --config", output=lambda: server.stdout.read().decode(),
        )  # fmt: skip
        rows = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        (input_meta,) = session.get_inputs()
        expected = session.run(None, {input_meta.name: rows})[0]
        body = {
            "inputs": [
                {
                    "name": input_meta.name,
                    "shape": list(rows.shape),
                    "datatype": "FP32",
                    "data": rows.ravel().tolist(),
                }
            ]
        }
        status, answer = request(port, "POST", "/v2/models/tiny/infer", json.dumps(body).encode())
        assert status == 200, answer
        (output,) = json.loads(answer)["outputs"]
        got = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        status, metadata = request(port, "GET", "/v2/models/tiny")
        assert status == 200 and json.loads(metadata)["versions"] == ["1"]
        oversized = b" " * (config["maxRequestBytes"] + 1)
        status, answer = request(port, "POST", "/v2/models/tiny/infer", oversized)
        assert status == 413, answer
    finally:
        stop(server, timeout=60)
