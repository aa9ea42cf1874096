"""`kubeinfer build`'s inputs and outputs as a user meets them: the digest on stdout (the
manifest with --json), progress on stderr, the termination-message file, --pin; models
over http(s) with a sha256 check against a real loopback server; and bad input (missing
file, not ONNX, calibration of the wrong shape or inputs or a .npy file, unknown scheme,
int8 without calibration, a checksum mismatch, an unknown digest) gives one clear line,
exit code 2, no traceback, and leaves the cache exactly as it was."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from kubeinfer.cli.main import main
from kubeinfer.runtime.building.calibration import write_samples
from kubeinfer.runtime.building.model_fetch import FetchError, fetch


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["build", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def cache(models: dict[str, Path], tmp_path: Path) -> Path:
    """A cache that already holds one engine, so "unchanged" is checked on a real one."""
    from kubeinfer.runtime.building.engine_build import build_engine

    root = tmp_path / "cache"
    build_engine(str(models["tiny"]), "onnxruntime", "fp32", root)
    return root


@pytest.fixture(scope="module")
def server(models: dict[str, Path]) -> Iterator[str]:
    """A real HTTP server on loopback serving the models directory."""
    directory = str(models["tiny"].parent)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object) -> None:
            super().__init__(*args, directory=directory)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_build_prints_the_digest_and_progress_and_writes_the_termination_message(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = tmp_path / "termination-log"
    code, out, err = _cli(
        capsys, "--model", str(models["tiny"]), "--precision", "fp16",
        "--cache", str(tmp_path / "c"), "--termination-message-path", str(message),
    )  # fmt: skip
    assert code == 0
    digest = out.strip()
    assert digest.startswith("sha256:")
    assert json.loads(message.read_text()) == {
        "digest": digest, "target": "cpu", "backend": "onnxruntime", "precision": "fp16",
        "cacheHit": False, "inputBytesPerRow": 64, "batches": True,
    }  # fmt: skip
    assert "Converting to fp16" in err and "Publishing" in err
    code, out, err = _cli(capsys, "--pin", digest, "--cache", str(tmp_path / "c"), "--json")
    manifest = json.loads(out)
    assert code == 0 and manifest["digest"] == digest and manifest["cacheHit"] is True
    assert manifest["key"]["precision"] == "fp16" and manifest["accuracy"]["samples"] == 32


def test_a_model_over_http_is_checked_against_its_sha256(
    models: dict[str, Path], server: str, cache: Path, snapshot
) -> None:  # type: ignore[no-untyped-def]
    from kubeinfer.runtime.building.engine_build import build_engine

    sha = hashlib.sha256(models["tiny"].read_bytes()).hexdigest()
    local = build_engine(str(models["tiny"]), "onnxruntime", "fp16", cache)
    remote = build_engine(f"{server}/tiny.onnx#sha256={sha}", "onnxruntime", "fp16", cache)
    assert remote.digest == local.digest and remote.cache_hit  # same bytes, same engine
    before = snapshot(cache)
    with pytest.raises(FetchError, match="sha256 mismatch"):
        build_engine(f"{server}/tiny.onnx", "onnxruntime", "fp32", cache, model_sha256="0" * 64)
    with pytest.raises(FetchError, match="HTTP 404"):
        build_engine(f"{server}/missing.onnx", "onnxruntime", "fp32", cache)
    assert snapshot(cache) == before


def test_fetch_downloads_into_the_scratch_dir_and_removes_it_after(
    models: dict[str, Path], server: str, tmp_path: Path
) -> None:
    fetched = fetch(f"{server}/tiny.onnx", tmp_path)
    assert fetched.temporary and fetched.path.parent == tmp_path
    assert fetched.path.read_bytes() == models["tiny"].read_bytes()
    fetched.cleanup()
    assert list(tmp_path.iterdir()) == []


def _bad_inputs(models: dict[str, Path], tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    not_onnx = tmp_path / "notes.onnx"
    not_onnx.write_bytes(b"this is not a protobuf \x00\xff" * 10)
    wrong_shape = write_samples(
        tmp_path / "wrong_shape.npz", {"input": np.zeros((8, 15), np.float32)}
    )
    wrong_name = write_samples(tmp_path / "wrong_name.npz", {"x": np.zeros((8, 16), np.float32)})
    not_npz = tmp_path / "calibration.npz"
    not_npz.write_text("a,b,c\n")
    npy = tmp_path / "calibration.npy"
    np.save(npy, np.zeros((8, 16), np.float32))
    static = onnx.load(str(models["tiny"]))
    static.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(static, str(tmp_path / "static.onnx"))
    tiny = str(models["tiny"])
    int8 = ["--precision", "int8"]
    return {
        "missing file": (["--model", str(tmp_path / "nope.onnx")], "no such file"),
        "not onnx": (["--model", str(not_onnx)], "is not a valid ONNX model"),
        "fixed batch": (
            ["--model", str(tmp_path / "static.onnx")],
            "input [1, 16] is fixed; export the model with a dynamic batch axis",
        ),
        "wrong calibration shape": (
            ["--model", tiny, *int8, "--calibration", str(wrong_shape)],
            "array 'input' has shape [8, 15]; expected [samples, 16]",
        ),
        "wrong calibration inputs": (
            ["--model", tiny, *int8, "--calibration", str(wrong_name)],
            "one array per model input ['input'], found ['x']",
        ),
        "calibration not npz": (
            ["--model", tiny, *int8, "--calibration", str(not_npz)],
            "is not a readable .npz file",
        ),
        "calibration npy": (
            ["--model", tiny, *int8, "--calibration", str(npy)],
            "is a .npy file (one array of shape [8, 16], without input names); write an .npz "
            "archive with one array per model input instead: numpy.savez(path, input=samples)",
        ),
        "unknown scheme": (["--model", "ftp://example.com/m.onnx"], "unsupported scheme 'ftp'"),
        "int8 without calibration": (["--model", tiny, *int8], "int8 needs calibration data"),
        "checksum mismatch": (["--model", tiny, "--model-sha256", "1" * 64], "sha256 mismatch"),
        "unknown digest": (["--pin", "sha256:" + "2" * 64], "is not in the cache"),
        "pin and model": (
            ["--pin", "sha256:" + "2" * 64, "--model", tiny],
            "give either --pin or --model, not both",
        ),
        "bad batch size": (["--model", tiny, "--max-batch-size", "0"], "must be within 1..1024"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing file", "not onnx", "fixed batch", "wrong calibration shape",
        "wrong calibration inputs", "calibration not npz", "calibration npy", "unknown scheme",
        "int8 without calibration", "checksum mismatch", "unknown digest", "pin and model",
        "bad batch size",
    ],
)  # fmt: skip
def test_bad_input_is_one_clear_line_and_leaves_the_cache_unchanged(
    models: dict[str, Path],
    tmp_path: Path,
    cache: Path,
    capsys: pytest.CaptureFixture[str],
    snapshot,
    case: str,
) -> None:  # type: ignore[no-untyped-def]
    args, expected = _bad_inputs(models, tmp_path)[case]
    before = snapshot(cache)
    code, out, err = _cli(capsys, *args, "--cache", str(cache))
    assert code == 2 and out == ""
    error_lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and expected in error_lines[0], err
    assert "Traceback" not in err
    assert snapshot(cache) == before


def test_s3_without_its_extra_says_how_to_install_it(tmp_path: Path) -> None:
    try:
        import s3fs  # noqa: F401
    except ImportError:
        with pytest.raises(FetchError, match=r"needs s3fs.*pip install 'kubeinfer\[s3\]'"):
            fetch("s3://bucket/model.onnx", tmp_path)
    else:
        pytest.skip("s3fs is installed here")


def test_gs_without_its_extra_says_how_to_install_it(tmp_path: Path) -> None:
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(FetchError, match=r"needs gcsfs.*pip install 'kubeinfer\[gcs\]'"):
            fetch("gs://bucket/model.onnx", tmp_path)
    else:
        pytest.skip("gcsfs is installed here")


def test_a_failed_build_leaves_its_reason_in_the_termination_message(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = tmp_path / "termination-log"
    code, _, _ = _cli(
        capsys, "--model", str(models["tiny"]), "--precision", "int8",
        "--cache", str(tmp_path / "c"), "--termination-message-path", str(message),
    )  # fmt: skip
    assert code == 2
    assert message.read_text().startswith("error: precision int8 needs calibration data")


def test_a_given_validation_file_replaces_the_held_out_samples_in_the_report(
    models: dict[str, Path], tmp_path: Path
) -> None:
    from kubeinfer.runtime.building.calibration import write_demo_samples
    from kubeinfer.runtime.building.engine_build import build_engine

    validation = write_demo_samples(models["tiny"], tmp_path / "validation.npz", count=7, seed=3)
    common = {"calibration": str(models["tiny_calibration"])}
    held_out = build_engine(str(models["tiny"]), "onnxruntime", "int8", tmp_path / "a", **common)
    given = build_engine(
        str(models["tiny"]), "onnxruntime", "int8", tmp_path / "b", validation=str(validation),
        **common,
    )  # fmt: skip
    assert given.digest == held_out.digest  # the engine depends on the calibration only
    assert given.manifest.engine_sha256 == held_out.manifest.engine_sha256
    assert (held_out.manifest.accuracy.validation_source, held_out.manifest.accuracy.samples) == (
        "held-out", 13,
    )  # fmt: skip
    assert (given.manifest.accuracy.validation_source, given.manifest.accuracy.samples) == (
        "given", 7,
    )  # fmt: skip
