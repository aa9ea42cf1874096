"""`kubeinfer serve --engine sha256:... --cache DIR` as a real process: it serves the int8
engine built into the cache (answers over HTTP equal the engine file run in-process, and
stay close to fp32), and refuses to start on a corrupted engine file (exit 1, a message
naming the file and the remedy) or an engine built for smaller batches."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from kubeinfer.runtime.building.engine_build import BuildResult, build_engine
from ports import free_port
from serve_process import ServeProcess

pytestmark = pytest.mark.slow


def _serve(cache: Path, digest: str, *flags: str) -> subprocess.Popen[str]:
    """A serve process that is expected to refuse to start (its output read at its exit)."""
    return subprocess.Popen(
        [sys.executable, "-m", "kubeinfer.cli", "serve", "--engine", digest,
         "--cache", str(cache), "--model-name", "tiny", "--host", "127.0.0.1",
         "--port", str(free_port()), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def int8(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    cache = tmp_path_factory.mktemp("cache")
    return build_engine(
        str(models["tiny"]), "onnxruntime", "int8", cache,
        calibration=str(models["tiny_calibration"]), max_batch_size=8,
    )  # fmt: skip


def test_serve_answers_with_the_cached_int8_engine(
    int8: BuildResult, models: dict[str, Path]
) -> None:
    cache = int8.engine_path.parents[2]
    with ServeProcess(
        None, "tiny", "--engine", int8.digest, "--cache", str(cache), "--max-batch-size", "8"
    ) as server:
        client = triton.InferenceServerClient(server.address)
        x = np.random.default_rng(5).standard_normal((3, 16)).astype(np.float32)
        request = triton.InferInput("input", list(x.shape), "FP32")
        request.set_data_from_numpy(x)
        served = client.infer("tiny", [request]).as_numpy("logits")
    engine_file = ort.InferenceSession(str(int8.engine_path)).run(None, {"input": x})[0]
    fp32 = ort.InferenceSession(str(models["tiny"])).run(None, {"input": x})[0]
    np.testing.assert_allclose(served, engine_file, rtol=1e-5, atol=1e-6)
    cosine = (
        np.sum(served * fp32, axis=1)
        / np.linalg.norm(served, axis=1)
        / np.linalg.norm(fp32, axis=1)
    )
    assert np.all(cosine > 0.98)
    assert not np.array_equal(served, fp32)  # it is the quantised engine that answered


def test_serve_refuses_a_corrupted_engine_and_a_too_small_profile(
    int8: BuildResult, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(int8.engine_path.parents[2], cache)
    process = _serve(cache, int8.digest, "--max-batch-size", "64")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1 and "built for batches up to 8" in output
    engine = cache / "engines" / int8.digest.removeprefix("sha256:") / "model.onnx"
    engine.write_bytes(engine.read_bytes()[:-10])  # truncated, as by a full disk
    process = _serve(cache, int8.digest, "--max-batch-size", "8")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "is corrupt or was modified" in output and "Traceback" not in output
