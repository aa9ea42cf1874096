"""A model served by an HTTP server that knows no ranges (Python's own `http.server`, as
the local cluster's file server is) downloads whole, in more than one block, with its
sha256 checked: the fetcher streams where a ranged read past the first block is refused."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from kubeinfer.runtime.building import model_fetch


@pytest.fixture
def plain_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", tmp_path
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_file_of_several_blocks_downloads_whole_from_a_server_without_ranges(
    plain_server: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    base, folder = plain_server
    data = (bytes(range(256)) * ((2 * model_fetch.BLOCK_BYTES + 12345) // 256 + 1))[
        : 2 * model_fetch.BLOCK_BYTES + 12345
    ]
    (folder / "model.onnx").write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    scratch = tmp_path_factory.mktemp("scratch")
    fetched = model_fetch.fetch(f"{base}/model.onnx", scratch, expected)
    try:
        assert fetched.sha256 == expected
        assert fetched.path.read_bytes() == data
    finally:
        fetched.cleanup()
