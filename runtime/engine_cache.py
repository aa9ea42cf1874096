"""The content-addressed engine cache on disk: lookup, atomic publish, verified resolve.

Layout, under the cache root (a volume shared by build Jobs and runtime pods):

    engines/<hex>/manifest.json     the EngineManifest (key, engine sha256, report, ...)
    engines/<hex>/<engine file>     model.onnx (ONNX Runtime) or model.plan (TensorRT)
    engines/<hex>/<data files>      model.onnx.data: an ONNX engine's external data, if any
    engines/<hex>/known_answers.npz the probes and their expected outputs (known_answers)
    tmp/                            staging directories and downloads, same filesystem
    locks/<hex>.lock                one flock per key, so one builder works per key

where `<hex>` is the digest without its `sha256:` prefix. An entry appears only whole:
the builder writes the engine and then the manifest into a staging directory under
`tmp/`, fsyncs them and renames the directory into `engines/` (rename is atomic on one
filesystem, and renaming onto an existing non-empty directory fails, so a second
publisher of the same key keeps the first entry and drops its own). A per-key lock makes
a concurrent builder of the same key wait and then find the entry, doing no work; the
rename keeps the guarantee even where locks are not shared (some network filesystems).
Lock files are left in place: deleting a lock file someone may be waiting on is racy.

A staging directory is named after its key (`tmp/build-<hex>-<random>`) and exists only
while its builder holds that key's lock. A builder stopped by SIGTERM removes its own
(`kubeinfer build` turns the signal into an exception that unwinds the build); one killed
outright (SIGKILL, a lost node) leaves it, and the next build removes every staging
directory whose key's lock nobody holds, at once rather than after a day. Other scratch
entries (downloads, staging directories of older versions) go after STALE_SCRATCH_SECONDS.

`resolve_engine` is what serving and `--pin` use: it re-derives the digest from the
manifest's key and re-hashes the engine file and every file beside it (an ONNX engine's
external data, `EngineManifest.data_files`, and the known-answer set), and refuses an
entry that does not match, with a message naming the path and what to do. A file changed
after that check (on the node, between the check and the load) is what the known-answer
set, run on the loaded engine before serving, is there to catch.

An engine runs only on the backend version that built it (a TensorRT plan does not
deserialize under another TensorRT; an ONNX Runtime engine is a graph optimised by one
ONNX Runtime, with its fused kernels). The version is part of the key, so a build with
another version gets another digest and never a cache hit on this one; and
`check_compatible` refuses, with `EngineIncompatibleError`, an engine whose manifest
names another backend or version than this environment has. Serving, `--pin` and every
cache hit of `kubeinfer build` run it, so an image can never be handed an engine it
cannot load.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kubeinfer.runtime.engine_manifest import (
    MANIFEST_FILE,
    EngineManifest,
    is_digest,
    sha256_file,
)
from pydantic import ValidationError

if TYPE_CHECKING:
    from kubeinfer.contract.runtime_config import InputShape
    from kubeinfer.runtime.engines.base import Engine

STALE_SCRATCH_SECONDS = 24 * 3600
STAGING_NAME = re.compile(r"build-([0-9a-f]{64})-.+")
"""A staging directory: its key's hex digest, then mkdtemp's random part."""


class EngineCacheError(Exception):
    """The cache cannot give the requested engine."""


class EngineNotFoundError(EngineCacheError):
    """No entry for the digest."""


class EngineIntegrityError(EngineCacheError):
    """An entry exists but is incomplete, corrupt or tampered with."""


class EngineIncompatibleError(EngineCacheError):
    """The entry is sound, but was built by another backend or backend version than this
    environment has: it cannot be loaded here. `kubeinfer serve` and `kubeinfer build`
    exit with their own code for it (3), which the operator reports as
    EngineIncompatible."""


EXIT_ENGINE_INCOMPATIBLE = 3
"""The exit code of `kubeinfer serve` and `kubeinfer build` for an
`EngineIncompatibleError`: the engine was built by another backend or backend version than
this image has. Both commands read it here, beside the error, so neither imports the
other."""


@dataclass(frozen=True)
class ResolvedEngine:
    """A verified cache entry."""

    digest: str
    directory: Path
    engine_path: Path
    manifest: EngineManifest


def _hex(digest: str) -> str:
    if not is_digest(digest):
        raise EngineCacheError(
            f"{digest!r} is not an engine digest: expected sha256: followed by 64 lowercase "
            "hex digits"
        )
    return digest.removeprefix("sha256:")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class EngineCache:
    """One cache root; creating it creates nothing on disk."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def engines_dir(self) -> Path:
        return self.root / "engines"

    @property
    def scratch_dir(self) -> Path:
        return self.root / "tmp"

    def entry_dir(self, digest: str) -> Path:
        return self.engines_dir / _hex(digest)

    def contains(self, digest: str) -> bool:
        return (self.entry_dir(digest) / MANIFEST_FILE).is_file()

    def resolve(self, digest: str) -> ResolvedEngine:
        """The verified entry, or `EngineNotFoundError` / `EngineIntegrityError`."""
        directory = self.entry_dir(digest)
        manifest_path = directory / MANIFEST_FILE
        if not directory.is_dir():
            raise EngineNotFoundError(
                f"engine {digest} is not in the cache at {self.root} (no {directory}); "
                "build it with `kubeinfer build ... --cache DIR` or check that the right "
                "cache volume is mounted"
            )
        remedy = f"delete {directory} and rebuild the engine with `kubeinfer build`"
        try:
            manifest = EngineManifest.model_validate_json(manifest_path.read_bytes())
        except FileNotFoundError as error:
            raise EngineIntegrityError(
                f"engine {digest}: {manifest_path} is missing, so the entry cannot be "
                f"verified; {remedy}"
            ) from error
        except ValidationError as error:
            raise EngineIntegrityError(
                f"engine {digest}: {manifest_path} is not a valid manifest "
                f"({error.error_count()} problems, first: {error.errors()[0]['msg']}); {remedy}"
            ) from error
        if manifest.digest != digest or manifest.key.digest() != digest:
            raise EngineIntegrityError(
                f"engine {digest}: the manifest at {manifest_path} describes "
                f"{manifest.key.digest()}, not this digest (tampered or misplaced); {remedy}"
            )
        engine_path = directory / manifest.engine_file
        if not engine_path.is_file():
            raise EngineIntegrityError(f"engine {digest}: {engine_path} is missing; {remedy}")
        for name, expected in manifest.entry_files.items():
            path = directory / name
            if not path.is_file():
                raise EngineIntegrityError(f"engine {digest}: {path} is missing; {remedy}")
            actual = sha256_file(path)
            if actual != expected:
                raise EngineIntegrityError(
                    f"engine {digest}: {path} has sha256 {actual} but its manifest "
                    f"records {expected}: the file is corrupt or was modified, "
                    f"and is not served; {remedy}"
                )
        return ResolvedEngine(digest, directory, engine_path, manifest)

    @contextlib.contextmanager
    def lock(self, digest: str) -> Iterator[None]:
        """Holds the key's exclusive lock (blocking) for the duration of the block."""
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with (locks / f"{_hex(digest)}.lock").open("a") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    @contextlib.contextmanager
    def staging(self, digest: str) -> Iterator[Path]:
        """A fresh staging directory on the cache's filesystem, removed on exit unless it
        was published; the caller holds the key's lock (`lock`). Staging directories of
        builders that died (no one holds their key's lock) are removed first, and other
        scratch entries older than a day, so leftovers cannot fill the volume."""
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        self.remove_orphaned_staging(held=digest)
        self.remove_stale_scratch(time.time() - STALE_SCRATCH_SECONDS)
        path = Path(tempfile.mkdtemp(prefix=f"build-{_hex(digest)}-", dir=self.scratch_dir))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def remove_orphaned_staging(self, held: str | None = None) -> list[Path]:
        """Removes the staging directories whose builder is gone: their key's lock is free
        (taken here without waiting, and released), or it is `held`, the key whose lock
        the caller holds (only its holder builds it, so any directory of that key left is
        a dead builder's). Returns what was removed."""
        removed = []
        for path in sorted(self.scratch_dir.iterdir()) if self.scratch_dir.is_dir() else ():
            match = STAGING_NAME.fullmatch(path.name)
            if match is None or not path.is_dir():
                continue
            key = f"sha256:{match.group(1)}"
            if key == held or self._lock_is_free(key):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        return removed

    def _lock_is_free(self, digest: str) -> bool:
        """Takes and releases the key's lock without waiting; False while a builder has it."""
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with (locks / f"{_hex(digest)}.lock").open("a") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            return True

    def remove_stale_scratch(self, older_than: float) -> list[Path]:
        """Removes scratch entries (downloads, staging directories of older versions) last
        modified before `older_than` (a Unix time); returns what was removed. A staging
        directory named after its key is left to `remove_orphaned_staging`: a build can
        take longer than any age bound."""
        removed = []
        for path in self.scratch_dir.iterdir() if self.scratch_dir.is_dir() else ():
            if STAGING_NAME.fullmatch(path.name):
                continue
            try:
                if path.lstat().st_mtime >= older_than:
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                removed.append(path)
            except FileNotFoundError:  # another builder removed it first
                continue
        return removed

    def publish(self, digest: str, staging: Path, manifest: EngineManifest) -> bool:
        """Writes the manifest into `staging` and renames it into place. False when an
        entry for the digest already exists (another builder won; ours is dropped)."""
        for name in manifest.entry_files:
            with (staging / name).open("rb+") as handle:
                os.fsync(handle.fileno())
        manifest_path = staging / MANIFEST_FILE
        with manifest_path.open("w", encoding="utf-8") as handle:
            handle.write(manifest.to_json())
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(staging, 0o755)
        self.engines_dir.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(staging, self.entry_dir(digest))
        except OSError as error:
            if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
                return False
            raise
        _fsync_dir(self.engines_dir)
        return True


def resolve_engine(cache_dir: str | Path, digest: str) -> ResolvedEngine:
    """Resolves and verifies `digest` in the cache at `cache_dir` (serving, `--pin`)."""
    return EngineCache(Path(cache_dir)).resolve(digest)


def check_compatible(resolved: ResolvedEngine) -> None:
    """Raises `EngineIncompatibleError` unless this environment has the backend, at the
    version, that the engine's manifest names (`installed_backend_version`: the same
    function the builders record the version with). The message is one line: serving
    writes it to the container's termination message."""
    from kubeinfer.runtime.engines.loader import installed_backend_version

    key = resolved.manifest.key
    installed = installed_backend_version(key.backend)
    if installed == key.backend_version:
        return
    here = f"{key.backend} {installed}" if installed else f"no {key.backend}"
    raise EngineIncompatibleError(
        f"engine {resolved.digest} was built by {key.backend} {key.backend_version}, but "
        f"this image has {here}: an engine runs only on the backend version that built it; "
        "build it again with this image, or run it with the image that built it"
    )


@dataclass(frozen=True)
class CachedEngine:
    """An engine loaded from the cache, and the verified entry it was loaded from (its
    manifest: the key, the known-answer set)."""

    engine: Engine
    resolved: ResolvedEngine


AfterDigestCheck = Callable[[ResolvedEngine], ResolvedEngine | None]
"""Called between the entry's verification and the engine's load: the window in which a
file changed on the node goes unseen by the digest check (a fault `kubeinfer serve`'s
`testing_faults` makes there, for its tests). It returns the entry to load instead, or
None to load the one checked."""


def load_cached(
    cache_dir: str | Path,
    digest: str,
    max_batch_size: int,
    intra_op_threads: int | None = None,
    input_shapes: Sequence[InputShape] = (),
    after_digest_check: AfterDigestCheck | None = None,
) -> CachedEngine:
    """Resolves and verifies `digest`, checks that this environment has the backend
    version that built it, then loads it with the manifest's backend: the serving side's
    one call (`kubeinfer serve --engine sha256:... --cache DIR`)."""
    from kubeinfer.runtime.engines.loader import load_engine

    resolved = resolve_engine(cache_dir, digest)
    check_compatible(resolved)
    key = resolved.manifest.key
    if max_batch_size > key.batch_profile.max:
        raise EngineCacheError(
            f"engine {digest} was built for batches up to {key.batch_profile.max}, but the "
            f"runtime's maxBatchSize is {max_batch_size}; lower maxBatchSize or build the "
            f"engine with --max-batch-size {max_batch_size}"
        )
    if after_digest_check is not None:
        resolved = after_digest_check(resolved) or resolved
    engine = load_engine(
        resolved.engine_path,
        key.backend,
        max_batch_size,
        intra_op_threads=intra_op_threads,
        input_shapes=input_shapes,
    )
    return CachedEngine(engine, resolved)


def load_cached_engine(
    cache_dir: str | Path,
    digest: str,
    max_batch_size: int,
    intra_op_threads: int | None = None,
    input_shapes: Sequence[InputShape] = (),
) -> Engine:
    """`load_cached`'s engine alone."""
    return load_cached(cache_dir, digest, max_batch_size, intra_op_threads, input_shapes).engine
