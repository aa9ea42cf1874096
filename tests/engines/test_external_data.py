"""Models with external data, as torch writes them (`model.onnx` + `model.onnx.data`),
through the fetcher (`model_fetch`, `model_files`), the build, the cache and serving;
fetched from a real HTTP server on loopback that answers ranges, breaks a download
mid-way, or fails, as real servers do.

Covers: a source naming the `.onnx` file or its folder, local or over http, builds at
fp32, fp16 and int8 to an engine whose entry holds `model.onnx` and its own
`model.onnx.data`, both recorded and verified (a changed data file is refused when
served), and the served engine answers as ONNX Runtime does on the source; the model's
digest covers the data file (other weights, another engine); a download broken mid-way
resumes from the block it reached (never from the start) and yields the same bytes; a
wrong sha256 is refused and leaves the cache as it was; 5xx answers are retried and then
reported with the count, a 404 at once; a data file outside the model's folder or missing
is refused by name.
"""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from kubeinfer.runtime.building import model_fetch
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.building.engine_build import build_engine
from kubeinfer.runtime.building.model_fetch import FetchError
from kubeinfer.runtime.building.model_files import fetch_model
from kubeinfer.runtime.engine_cache import EngineIntegrityError, load_cached_engine
from kubeinfer.runtime.engine_manifest import sha256_file

BLOCK = 64 * 1024


def save_with_external_data(model: onnx.ModelProto, folder: Path) -> Path:
    """`model` as torch writes it: `model.onnx` and every weight in `model.onnx.data`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save_model(
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
        location="model.onnx.data", size_threshold=0,
    )  # fmt: skip
    return path


@pytest.fixture(scope="module")
def external(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from kubeinfer.cli.demo.mlp_models import build_small_mlp

    root = tmp_path_factory.mktemp("external")
    single = build_small_mlp(root / "single.onnx")
    path = save_with_external_data(onnx.load(str(single)), root / "served" / "mlp")
    assert (path.parent / "model.onnx.data").stat().st_size > 8 * BLOCK
    return {
        "path": path,
        "single": single,
        "calibration": write_demo_samples(single, root / "calibration.npz", count=64),
    }


class Server:
    """A loopback HTTP server of one folder, with ranges (206), which can break a
    response mid-way or answer an error, and records every GET's path and range."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.gets: list[tuple[str, int]] = []
        self.break_nth_get: dict[str, int] = {}  # path -> which GET to break (1-based)
        self.fail: dict[str, int] = {}  # path -> HTTP status to answer
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, body: bool) -> None:
                name = self.path.lstrip("/")
                if name in server.fail:
                    self.send_error(server.fail[name])
                    return
                file = server.root / name
                if file.is_dir() and self.path.endswith("/"):  # a directory index
                    links = "".join(f'<a href="{p.name}">{p.name}</a>' for p in file.iterdir())
                    page = f"<html><body>{links}</body></html>".encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    if body:
                        self.wfile.write(page)
                    return
                if not file.is_file():
                    self.send_error(404)
                    return
                data = file.read_bytes()
                start, end = 0, len(data)
                match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                if match:
                    start = int(match.group(1))
                    end = min(len(data), int(match.group(2)) + 1) if match.group(2) else end
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(end - start))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if not body:
                    return
                server.gets.append((name, start))
                count = sum(1 for got, _ in server.gets if got == name)
                if server.break_nth_get.get(name) == count:
                    self.wfile.write(data[start : start + (end - start) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)  # the peer sees the body cut short
                    return
                self.wfile.write(data[start:end])

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def starts(self, name: str) -> list[int]:
        return [start for got, start in self.gets if got == name]


@pytest.fixture
def server(external: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    monkeypatch.setattr(model_fetch, "BLOCK_BYTES", BLOCK)
    monkeypatch.setattr(model_fetch, "FIRST_PAUSE_SECONDS", 0.0)
    running = Server(external["path"].parent.parent)
    running.thread.start()
    yield running
    running.httpd.shutdown()
    running.httpd.server_close()


def _reference(path: Path, rows: int = 5) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(3).standard_normal((rows, 512)).astype(np.float32)
    [logits] = ort.InferenceSession(str(path)).run(None, {"input": x})
    return x, logits


def _served(cache: Path, digest: str, x: np.ndarray) -> np.ndarray:
    engine = load_cached_engine(cache, digest, max_batch_size=8, intra_op_threads=1)
    slot = engine.create_slot()
    try:
        slot.input_views(len(x))["input"][...] = x
        return np.array(slot.run(len(x))["logits"], copy=True)
    finally:
        slot.close()
        engine.close()


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_a_model_with_external_data_builds_caches_and_serves(
    external: dict[str, Path], tmp_path: Path, precision: str
) -> None:
    cache = tmp_path / "cache"
    calibration = str(external["calibration"]) if precision == "int8" else None
    result = build_engine(str(external["path"]), "onnxruntime", precision, cache, calibration)
    entry = result.engine_path.parent
    assert sorted(p.name for p in entry.iterdir()) == [
        "known_answers.npz", "manifest.json", "model.onnx", "model.onnx.data"
    ]  # fmt: skip
    data = entry / "model.onnx.data"
    assert result.manifest.data_files == {"model.onnx.data": sha256_file(data)}
    assert data.stat().st_size > result.engine_path.stat().st_size  # the weights are there
    x, logits = _reference(external["path"])
    served = _served(cache, result.digest, x)
    tolerance = {"fp32": 1e-5, "fp16": 2e-2, "int8": 0.5}[precision]
    np.testing.assert_allclose(served, logits, atol=tolerance, rtol=tolerance)
    if precision != "fp32":
        np.testing.assert_array_equal(served.argmax(-1), logits.argmax(-1))
    data.chmod(0o644)
    data.write_bytes(data.read_bytes()[:-1] + b"\x00")
    with pytest.raises(EngineIntegrityError, match=r"model\.onnx\.data has sha256"):
        load_cached_engine(cache, result.digest, max_batch_size=8)


def test_the_folder_or_the_file_name_the_same_model_whose_digest_covers_its_data(
    external: dict[str, Path], tmp_path: Path
) -> None:
    by_file = fetch_model(str(external["path"]), tmp_path)
    by_folder = fetch_model(f"file://{external['path'].parent}", tmp_path)
    assert by_file.files == by_folder.files and by_file.sha256 == by_folder.sha256
    assert [name for name, _ in by_file.files] == ["model.onnx", "model.onnx.data"]
    assert by_file.sha256 != sha256_file(external["path"])  # the data counts
    other = onnx.load(str(external["path"]))
    other.graph.initializer[0].raw_data = bytes(len(other.graph.initializer[0].raw_data))
    moved = save_with_external_data(other, tmp_path / "other")
    assert sha256_file(moved) == sha256_file(external["path"])  # same graph file...
    assert fetch_model(str(moved), tmp_path).sha256 != by_file.sha256  # ...other model
    single = fetch_model(str(external["single"]), tmp_path)
    assert single.sha256 == sha256_file(external["single"])  # one file: its own sha256


def test_over_http_a_broken_download_resumes_where_it_stopped(
    external: dict[str, Path], server: Server, tmp_path: Path
) -> None:
    data_name = "mlp/model.onnx.data"
    server.break_nth_get[data_name] = 3  # the third block's response is cut in half
    fetched = fetch_model(f"{server.url}/mlp/model.onnx", tmp_path / "scratch")
    local = fetch_model(str(external["path"]), tmp_path)
    assert fetched.files == local.files  # the same bytes, every file
    starts = server.starts(data_name)
    assert starts[:4] == [0, BLOCK, 2 * BLOCK, 2 * BLOCK]  # block 3 again, not block 1
    assert starts.count(0) == 1  # never started over
    fetched.cleanup()
    assert list((tmp_path / "scratch").iterdir()) == []


def test_over_http_the_folder_builds_the_same_engine_and_a_wrong_sha256_is_refused(
    external: dict[str, Path], server: Server, tmp_path: Path, snapshot
) -> None:  # type: ignore[no-untyped-def]
    cache = tmp_path / "cache"
    local = build_engine(str(external["path"]), "onnxruntime", "fp32", cache)
    remote = build_engine(f"{server.url}/mlp/", "onnxruntime", "fp32", cache)
    assert remote.digest == local.digest and remote.cache_hit
    before = snapshot(cache)
    with pytest.raises(FetchError, match="sha256 mismatch"):
        build_engine(f"{server.url}/mlp/model.onnx#sha256={'0' * 64}", "onnxruntime", "fp32",
                     cache)  # fmt: skip
    assert snapshot(cache) == before
    assert list((cache / "tmp").iterdir()) == []  # the download went with the refusal


def test_server_errors_are_retried_then_reported_and_a_404_is_not(
    server: Server, tmp_path: Path
) -> None:
    server.fail["mlp/model.onnx"] = 503
    with pytest.raises(FetchError, match=r"HTTP 503.*\(after 6 tries\)"):
        fetch_model(f"{server.url}/mlp/model.onnx", tmp_path)
    assert server.starts("mlp/model.onnx") == []  # refused before any body
    not_found = r"missing\.onnx: no such file \(the server answered HTTP 404"
    with pytest.raises(FetchError, match=not_found) as refused:
        fetch_model(f"{server.url}/missing.onnx", tmp_path)
    assert "tries" not in str(refused.value)


def test_a_data_file_outside_the_folder_or_missing_is_refused(
    external: dict[str, Path], tmp_path: Path
) -> None:
    model = onnx.load(str(external["path"]), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../../etc/weights.bin"
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    with pytest.raises(FetchError, match=r"names external data at '\.\./\.\./etc/weights\.bin'"):
        fetch_model(str(bad), tmp_path)
    lonely = tmp_path / "lonely" / "model.onnx"
    lonely.parent.mkdir()
    lonely.write_bytes(external["path"].read_bytes())
    with pytest.raises(FetchError, match=r"external data file 'model\.onnx\.data' is missing"):
        fetch_model(str(lonely), tmp_path)
