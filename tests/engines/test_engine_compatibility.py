"""Engines that match their image, at the runtime's end: `kubeinfer serve` (a real process)
refuses a cached engine whose manifest names another backend version than the one
installed, or a backend that is not installed, with exit code 3, one line on stderr and
the same line in the termination message; a failure with another code (1, 2) writes its
termination message too. `kubeinfer build --pin` refuses such an engine the same way, and
a build next to another version's entry of the same model builds its own instead of
taking it. `kubeinfer build` refuses what `kubeinfer serve --onnx` refuses (a dynamic
dimension besides the batch one, an output that does not follow the batch), for fp32
and int8 alike, with serve's own reason, exit 2, the termination message and an
untouched cache.

Other versions' entries are written as such a version would write them: a real engine
built here, its manifest's key given another `backendVersion` (and so another digest),
published under that digest with its engine file's real sha256."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from kubeinfer.runtime.building.calibration import write_samples
from kubeinfer.runtime.building.engine_build import BuildResult, build_engine
from kubeinfer.runtime.engine_manifest import EngineManifest, sha256_file
from kubeinfer.runtime.engines.loader import installed_backend_version
from onnx_models import build_reduced_batch_model

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "kubeinfer.cli"]
INSTALLED = installed_backend_version("onnxruntime")


def kubeinfer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def publish_as(built: BuildResult, cache: Path, **key: str) -> str:
    """Publishes `built`'s engine in `cache` as if the key's fields in `key` had been
    what built it (e.g. another backendVersion); returns that entry's digest."""
    manifest = built.manifest
    new_key = manifest.key.model_copy(update=key)
    entry = cache / "engines" / new_key.digest().removeprefix("sha256:")
    entry.mkdir(parents=True)
    engine_file = manifest.engine_file if "backend" not in key else "model.plan"
    shutil.copyfile(built.engine_path, entry / engine_file)
    for name in manifest.entry_files.keys() - {manifest.engine_file}:  # the known answers
        shutil.copyfile(built.engine_path.parent / name, entry / name)
    relabelled = manifest.model_copy(
        update={
            "key": new_key,
            "digest": new_key.digest(),
            "engine_file": engine_file,
            "engine_sha256": sha256_file(entry / engine_file),
        }
    )
    EngineManifest.model_validate_json(relabelled.to_json())  # a manifest a build could write
    (entry / "manifest.json").write_text(relabelled.to_json())
    return new_key.digest()


@pytest.fixture(scope="module")
def built(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """The tiny model's fp32 engine, built by the ONNX Runtime installed here."""
    cache = tmp_path_factory.mktemp("cache")
    return build_engine(str(models["tiny"]), "onnxruntime", "fp32", cache, max_batch_size=8)


def serve(cache: Path, digest: str, termination_log: Path) -> subprocess.CompletedProcess[str]:
    return kubeinfer(
        "serve", "--engine", digest, "--cache", str(cache), "--model-name", "tiny",
        "--host", "127.0.0.1", "--port", "1", "--max-batch-size", "8",
        "--termination-message-path", str(termination_log),
    )  # fmt: skip


def test_serve_refuses_an_engine_built_by_another_onnxruntime(
    built: BuildResult, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    digest = publish_as(built, cache, backend_version="1.16.3")
    log = tmp_path / "termination-log"
    result = serve(cache, digest, log)
    assert result.returncode == 3, result.stderr
    said = (
        f"engine {digest} was built by onnxruntime 1.16.3, but this image has onnxruntime "
        f"{INSTALLED}: an engine runs only on the backend version that built it"
    )
    assert said in result.stderr and "Traceback" not in result.stderr
    assert log.read_text().startswith(f"error: {said}")
    assert "\n" not in log.read_text()


@pytest.mark.skipif(
    installed_backend_version("tensorrt") is not None, reason="TensorRT is installed here"
)
def test_serve_refuses_a_tensorrt_engine_in_an_image_without_tensorrt(
    built: BuildResult, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    digest = publish_as(
        built, cache, backend="tensorrt", backend_version="10.13.3.9", target="sm_90-h100"
    )
    log = tmp_path / "termination-log"
    result = serve(cache, digest, log)
    assert result.returncode == 3, result.stderr
    assert "was built by tensorrt 10.13.3.9, but this image has no tensorrt" in log.read_text()


def test_serve_failing_otherwise_writes_its_termination_message_too(
    built: BuildResult, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(built.engine_path.parents[2], cache)
    engine = cache / "engines" / built.digest.removeprefix("sha256:") / "model.onnx"
    engine.write_bytes(engine.read_bytes()[:-1] + b"\x00")
    log = tmp_path / "termination-log"
    corrupt = serve(cache, built.digest, log)
    assert corrupt.returncode == 1
    assert log.read_text().startswith(f"error: cannot load the engine: engine {built.digest}")
    invalid = kubeinfer(
        "serve", "--onnx", str(engine), "--max-batch-size", "0",
        "--termination-message-path", str(log),
    )  # fmt: skip
    assert invalid.returncode == 2
    assert log.read_text() == (
        "error: invalid configuration: modelName: Field required; "
        "batching.maxBatchSize: Input should be greater than or equal to 1"
    )


def test_build_pin_refuses_another_versions_engine_as_serve_does(
    built: BuildResult, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    digest = publish_as(built, cache, backend_version="1.16.3")
    log = tmp_path / "termination-log"
    result = kubeinfer("build", "--pin", digest, "--cache", str(cache),
                       "--termination-message-path", str(log))  # fmt: skip
    assert result.returncode == 3 and result.stdout == ""
    assert log.read_text().startswith(f"error: engine {digest} was built by onnxruntime 1.16.3")
    assert kubeinfer("build", "--pin", built.digest, "--cache",
                     str(built.engine_path.parents[2])).returncode == 0  # fmt: skip


def test_another_versions_entry_of_the_same_model_is_never_a_cache_hit(
    built: BuildResult, models: dict[str, Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    other = publish_as(built, cache, backend_version="1.16.3")
    result = build_engine(str(models["tiny"]), "onnxruntime", "fp32", cache, max_batch_size=8)
    assert not result.cache_hit and result.digest == built.digest != other
    assert result.manifest.key.backend_version == INSTALLED


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_build_refuses_a_model_serve_refuses_with_serves_reason(
    tmp_path: Path, precision: str, snapshot
) -> None:  # type: ignore[no-untyped-def]
    path = build_reduced_batch_model(tmp_path / "reduced.onnx")
    samples = {"x": np.random.default_rng(0).random((16, 3), np.float32)}
    data = str(write_samples(tmp_path / "samples.npz", samples))
    served = kubeinfer(
        "serve", "--onnx", str(path), "--model-name", "m", "--max-batch-size", "8", "--port", "1"
    )
    assert served.returncode == 1
    reason = served.stderr.strip().splitlines()[-1].split("cannot load the engine: ")[1]

    cache, log = tmp_path / "cache", tmp_path / "termination-log"
    # fp32 takes the samples as validation data; int8 as calibration data.
    flag = "--calibration" if precision == "int8" else "--validation"
    result = kubeinfer(
        "build", "--model", str(path), "--precision", precision, flag, data,
        "--cache", str(cache), "--termination-message-path", str(log),
    )  # fmt: skip
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert log.read_text() == f"error: {path} cannot be served: {reason}"
    assert snapshot(cache) == {}
