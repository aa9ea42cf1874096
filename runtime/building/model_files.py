"""The files an ONNX model is made of, fetched together: the `.onnx` file and the external
data files it names.

torch writes `model.onnx` and `model.onnx.data` even for small models, and every model
over 2 GB keeps its weights outside the protobuf: each such tensor names its file by a
location relative to the `.onnx` file's folder. A source names the `.onnx` file (its data
files beside it, wherever it lives: a path, http(s), s3, gs), or a folder holding exactly
one `.onnx` file (an http(s) folder ends with `/` and must list its files, as a plain
directory index does). Every file is fetched with `model_fetch` (retries, resumption,
sha256) into one scratch folder, keeping the names the model uses.

A location that leaves the model's folder (absolute, or with `..`) is refused: a model
names its own files only. The expected sha256 (a flag or the URI's `#sha256=`) is that of
the `.onnx` file. The model's content address (`sha256`, the engine key's model digest)
covers every file: the `.onnx` file's sha256 alone for a model without external data (so
such models keep the digest they always had), else the sha256 of the `sha256sum`-style
listing of all files (`model_digest`).
"""

from __future__ import annotations

import hashlib
import posixpath
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import onnx
from kubeinfer.runtime.building.model_fetch import (
    FetchError,
    check_sha256,
    download,
    local_path,
    remote_filesystem,
    scheme_of,
    split_expected,
)
from kubeinfer.runtime.engine_manifest import sha256_file


@dataclass(frozen=True)
class FetchedModel:
    """A model's files on this machine. `path` is the `.onnx` file; `files` each file's
    name (relative to the model's folder, the `.onnx` file first) and sha256;
    `scratch` the temporary folder of a download, removed by `cleanup`."""

    uri: str
    path: Path
    files: tuple[tuple[str, str], ...]
    scratch: Path | None = None

    @property
    def sha256(self) -> str:
        """The model's content address (see the module)."""
        return model_digest(self.files)

    @property
    def has_external_data(self) -> bool:
        return len(self.files) > 1

    def cleanup(self) -> None:
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def model_digest(files: tuple[tuple[str, str], ...]) -> str:
    """The `.onnx` file's sha256 when it is the only file, else the sha256 of the lines
    `<sha256>  <name>` of every file, sorted by name."""
    if len(files) == 1:
        return files[0][1]
    listing = "".join(f"{sha}  {name}\n" for name, sha in sorted(files, key=lambda f: f[0]))
    return hashlib.sha256(listing.encode()).hexdigest()


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of a graph that can hold external data, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _tensors(subgraph)


def external_data_locations(model: onnx.ModelProto, uri: str) -> list[str]:
    """The files the model's tensors name, relative to its folder, sorted; refuses a
    location outside that folder."""
    locations = set()
    for tensor in _tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entry = {item.key: item.value for item in tensor.external_data}
        location = entry.get("location", "")
        pure = PurePosixPath(location)
        if not location or pure.is_absolute() or ".." in pure.parts or "\\" in location:
            raise FetchError(
                f"{uri}: tensor {tensor.name!r} names external data at {location!r}, which is "
                "not a file inside the model's folder; refused"
            )
        locations.add(posixpath.normpath(location))
    return sorted(locations)


def _locations_of(path: Path, uri: str) -> list[str]:
    """The external data files of the `.onnx` file at `path` (none when it cannot be
    parsed: the build then says it is not a valid ONNX model)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # protobuf's DecodeError and onnx's own errors
        return []
    return external_data_locations(model, uri)


def _one_onnx_file(names: list[str], uri: str) -> str:
    candidates = sorted(n for n in names if n.endswith(".onnx"))
    if len(candidates) != 1:
        found = ", ".join(posixpath.basename(c) for c in candidates) or "none"
        raise FetchError(
            f"{uri}: a model folder must hold exactly one .onnx file (found {found}); "
            "name the .onnx file instead"
        )
    return candidates[0]


def fetch_model(uri: str, scratch_dir: Path, expected_sha256: str | None = None) -> FetchedModel:
    """The model behind `uri` (an `.onnx` file or a folder, see the module), every file
    present and hashed, the `.onnx` file checked against `expected_sha256`."""
    base, expected = split_expected(uri, expected_sha256)
    if scheme_of(base) in ("", "file"):
        return _local_model(uri, local_path(base), expected)
    return _remote_model(uri, base, scratch_dir, expected)


def _local_model(uri: str, path: Path, expected: str | None) -> FetchedModel:
    if path.is_dir():
        path = path / _one_onnx_file([p.name for p in path.iterdir()], uri)
    if not path.is_file():
        raise FetchError(f"{uri}: no such file")
    sha = sha256_file(path)
    check_sha256(uri, sha, expected)
    files = [(path.name, sha)]
    for location in _locations_of(path, uri):
        data = path.parent / location
        if not data.is_file():
            raise FetchError(f"{uri}: its external data file {location!r} is missing beside it")
        files.append((location, sha256_file(data)))
    return FetchedModel(uri, path, tuple(files))


def _remote_model(uri: str, base: str, scratch_dir: Path, expected: str | None) -> FetchedModel:
    fs, remote = remote_filesystem(base)
    if base.endswith("/") or (scheme_of(base) not in ("http", "https") and _isdir(fs, remote)):
        listing = [str(entry) for entry in _listing(fs, remote, uri)]
        remote = _one_onnx_file(listing, uri)
    scratch_dir.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(dir=scratch_dir, prefix="fetch-"))
    try:
        name = posixpath.basename(remote.rstrip("/"))
        path = folder / name
        sha = _download_to(fs, remote, uri, path)
        check_sha256(uri, sha, expected)
        files = [(name, sha)]
        for location in _locations_of(path, uri):
            source = posixpath.join(posixpath.dirname(remote), location)
            where = f"{uri} (external data {location!r})"
            files.append((location, _download_to(fs, source, where, folder / location)))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return FetchedModel(uri, path, tuple(files), scratch=folder)


def _isdir(fs: Any, path: str) -> bool:
    try:
        return bool(fs.isdir(path))
    except Exception:  # a store that cannot tell: take the path for a file
        return False


def _listing(fs: Any, path: str, uri: str) -> list[str]:
    try:
        return list(fs.ls(path, detail=False))
    except Exception as error:  # fsspec's stores raise their own errors
        raise FetchError(f"{uri}: cannot list the model folder: {error}") from error


def _download_to(fs: Any, source: str, uri: str, target: Path) -> str:
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as handle:
        return download(fs, source, uri, handle)
