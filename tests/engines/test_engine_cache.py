"""The content-addressed cache: a second build of the same inputs is a hit that does no
work; the digest is the sha256 of the key's canonical JSON, the same in another process,
at another cache path and on another machine; every key field changes it; a corrupt,
tampered or missing entry is refused with a message naming the path and the remedy; two
builders of one key (two real processes) return the same digest and leave exactly one
complete entry; publishing onto an existing entry keeps the first one whole."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubeinfer.runtime.building.builders.onnxruntime_builder import OnnxRuntimeBuilder
from kubeinfer.runtime.building.engine_build import build_engine
from kubeinfer.runtime.engine_cache import (
    EngineCache,
    EngineCacheError,
    EngineIntegrityError,
    EngineNotFoundError,
    resolve_engine,
)
from kubeinfer.runtime.engine_manifest import BatchProfile, EngineKey


def _build(model: Path, cache: Path, precision: str = "fp32", **kwargs):  # type: ignore[no-untyped-def]
    return build_engine(str(model), "onnxruntime", precision, cache, **kwargs)


def test_a_second_build_of_the_same_inputs_is_a_hit_that_does_no_work(
    models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _build(models["tiny"], tmp_path)
    assert not first.cache_hit
    mtimes = {p: p.stat().st_mtime_ns for p in first.engine_path.parent.iterdir()}

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("the builder ran on a cache hit")

    monkeypatch.setattr(OnnxRuntimeBuilder, "build", no_build)
    monkeypatch.setattr(OnnxRuntimeBuilder, "run", no_build)
    second = _build(models["tiny"], tmp_path)
    assert second.cache_hit and second.digest == first.digest
    assert second.manifest == first.manifest
    assert {p: p.stat().st_mtime_ns for p in first.engine_path.parent.iterdir()} == mtimes


def test_the_digest_is_the_sha256_of_the_keys_canonical_json() -> None:
    key = EngineKey(
        model_sha256="a" * 64,
        backend="onnxruntime",
        backend_version="1.20.0",
        precision="int8",
        batch_profile=BatchProfile.up_to(8),
        calibration_sha256="b" * 64,
        target="cpu",
    )
    canonical = (
        '{"backend":"onnxruntime","backendVersion":"1.20.0","batchProfile":'
        '{"max":8,"min":1,"opt":8},"calibrationSha256":"' + "b" * 64 + '","layout":3,'
        '"modelSha256":"' + "a" * 64 + '","precision":"int8","target":"cpu"}'
    )
    assert key.canonical_json() == canonical
    assert key.digest() == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


@pytest.mark.parametrize(
    "change",
    [
        {"model_sha256": "c" * 64},
        {"backend": "tensorrt"},
        {"backend_version": "1.20.1"},
        {"precision": "fp16"},
        {"batch_profile": BatchProfile.up_to(16)},
        {"calibration_sha256": None},
        {"target": "sm_90"},
        {"layout": 1},  # the recipe before known-answer sets: never a hit on a new entry
    ],
)
def test_every_key_field_changes_the_digest(change: dict[str, object]) -> None:
    base = {
        "model_sha256": "a" * 64,
        "backend": "onnxruntime",
        "backend_version": "1.20.0",
        "precision": "int8",
        "batch_profile": BatchProfile.up_to(8),
        "calibration_sha256": "b" * 64,
        "target": "cpu",
    }
    assert EngineKey(**base).digest() != EngineKey(**{**base, **change}).digest()  # type: ignore[arg-type]


def test_the_same_inputs_give_the_same_digest_in_another_process_and_cache(
    models: dict[str, Path], tmp_path: Path
) -> None:
    here = _build(
        models["tiny"], tmp_path / "a", "int8", calibration=str(models["tiny_calibration"])
    )
    script = (
        "import sys; from kubeinfer.runtime.building.engine_build import build_engine; "
        "print(build_engine(sys.argv[1], 'onnxruntime', 'int8', sys.argv[2], "
        "calibration=sys.argv[3]).digest)"
    )
    other = subprocess.run(
        [sys.executable, "-c", script, str(models["tiny"]), str(tmp_path / "elsewhere" / "b"),
         str(models["tiny_calibration"])],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "7"},
    )  # fmt: skip
    assert other.stdout.strip() == here.digest
    # The key holds content hashes only: no path, host name or time.
    key_json = here.manifest.key.canonical_json()
    assert str(tmp_path) not in key_json and os.uname().nodename not in key_json


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_corrupted_engine_file_is_refused_with_an_actionable_message(
    models: dict[str, Path], tmp_path: Path
) -> None:
    result = _build(models["tiny"], tmp_path)
    _corrupt(result.engine_path)
    with pytest.raises(EngineIntegrityError) as refused:
        resolve_engine(tmp_path, result.digest)
    message = str(refused.value)
    assert "corrupt or was modified" in message and result.manifest.engine_sha256 in message
    assert f"delete {result.engine_path.parent}" in message
    # A build of the same key refuses it too, instead of serving or silently replacing it.
    with pytest.raises(EngineIntegrityError):
        _build(models["tiny"], tmp_path)


def test_a_tampered_manifest_and_a_missing_entry_are_refused(
    models: dict[str, Path], tmp_path: Path
) -> None:
    result = _build(models["tiny"], tmp_path)
    manifest_path = result.engine_path.parent / "manifest.json"
    data = json.loads(manifest_path.read_text())
    data["key"]["precision"] = "int8"  # claims to be another engine
    manifest_path.write_text(json.dumps(data))
    with pytest.raises(EngineIntegrityError, match="tampered or misplaced"):
        resolve_engine(tmp_path, result.digest)
    manifest_path.write_text("{not json")
    with pytest.raises(EngineIntegrityError, match="not a valid manifest"):
        resolve_engine(tmp_path, result.digest)
    with pytest.raises(EngineNotFoundError, match="is not in the cache"):
        resolve_engine(tmp_path, "sha256:" + "0" * 64)
    with pytest.raises(EngineCacheError, match="not an engine digest"):
        resolve_engine(tmp_path, "sha256:XYZ")


def test_publishing_onto_an_existing_entry_keeps_the_first_one_whole(
    models: dict[str, Path], tmp_path: Path
) -> None:
    result = _build(models["tiny"], tmp_path)
    cache = EngineCache(tmp_path)
    with cache.staging(result.digest) as staging:
        (staging / result.manifest.engine_file).write_bytes(b"a different engine")
        (staging / "known_answers.npz").write_bytes(b"different known answers")
        assert not cache.publish(result.digest, staging, result.manifest)
    assert resolve_engine(tmp_path, result.digest).manifest == result.manifest
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.slow
def test_two_concurrent_builders_of_one_key_leave_one_complete_entry(
    models: dict[str, Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    command = [
        sys.executable, "-m", "kubeinfer.cli", "build", "--model", str(models["tiny"]),
        "--precision", "int8", "--calibration", str(models["tiny_calibration"]),
        "--cache", str(cache), "--json",
    ]  # fmt: skip
    builders = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [builder.communicate(timeout=120) for builder in builders]
    assert [b.returncode for b in builders] == [0, 0], [err for _, err in outputs]
    manifests = [json.loads(out) for out, _ in outputs]
    assert manifests[0]["digest"] == manifests[1]["digest"]
    assert sorted(m["cacheHit"] for m in manifests) == [False, True]  # one built, one waited
    entries = list((cache / "engines").iterdir())
    assert [e.name for e in entries] == [manifests[0]["digest"].removeprefix("sha256:")]
    names = sorted(p.name for p in entries[0].iterdir())
    assert names == ["known_answers.npz", "manifest.json", "model.onnx"]
    assert list((cache / "tmp").iterdir()) == []
    resolve_engine(cache, manifests[0]["digest"])


def test_a_killed_builders_leftovers_are_removed_once_stale(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    digest = "sha256:" + "3" * 64
    with cache.staging(digest) as fresh:
        old = tmp_path / "tmp" / "build-killed"
        (old / "work").mkdir(parents=True)
        (old / "work" / "qdq.onnx").write_bytes(b"partial")
        download = tmp_path / "tmp" / "fetch-partial"
        download.write_bytes(b"half a model")
        day_ago = time.time() - 2 * 24 * 3600
        for path in (old, download):
            os.utime(path, (day_ago, day_ago))
        assert sorted(p.name for p in cache.remove_stale_scratch(time.time() - 3600)) == [
            "build-killed", "fetch-partial",
        ]  # fmt: skip
        assert [p.name for p in (tmp_path / "tmp").iterdir()] == [fresh.name]
