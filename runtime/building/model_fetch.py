"""Fetches a file named by a URI to a local path, with its sha256, through fsspec.

Schemes: a plain path or `file://` (read in place), `http://` and `https://` (fsspec's
HTTP file system, on aiohttp), `s3://BUCKET/KEY` (s3fs, the optional extra
`kubeinfer[s3]`; credentials from the usual AWS environment variables, which the operator
fills from the InferenceDeployment's secretRef) and `gs://BUCKET/OBJECT` (gcsfs, the
optional extra `kubeinfer[gcs]`; credentials from GOOGLE_APPLICATION_CREDENTIALS or the
node's workload identity). Any other scheme is refused with the list of supported ones.

A download is read in blocks of `BLOCK_BYTES` (ranged reads where the store knows the
file's size), written to a temporary file beside the cache and hashed as it goes. When a
read fails in a way worth retrying (a connection reset, a timeout, a 5xx answer), the
download resumes at the byte it had reached, up to `RETRIES` times with a doubling pause;
a store that cannot read from an offset (an HTTP server without ranges or without a
length) starts over instead. What cannot succeed on a retry (no such file, a 4xx answer,
no permission) fails at once.

When an expected sha256 is given (a flag, or a `#sha256=<hex>` fragment as pip writes
it) a mismatch is refused before the bytes are used, so a tampered or truncated download
never reaches the cache. `model_files` decides which files make up a model (its external
data) and fetches them all with this module.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlsplit

from kubeinfer.runtime.engine_manifest import sha256_file

BLOCK_BYTES = 8 << 20
RETRIES = 5
FIRST_PAUSE_SECONDS = 0.5
HTTP_SOCKET_TIMEOUT_SECONDS = 60
SCHEMES = ("", "file", "http", "https", "s3", "gs")
SUPPORTED = "a path, file://, http://, https://, s3:// or gs://"
EXTRA_OF = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs")}
"""The library fsspec needs for a scheme, and kubeinfer's extra that installs it."""


class FetchError(ValueError):
    """The URI cannot be fetched, or its bytes are not the expected ones."""


@dataclass(frozen=True)
class FetchedFile:
    """A local copy (or the original file) and its sha256; `temporary` copies are removed
    by `cleanup`."""

    uri: str
    path: Path
    sha256: str
    temporary: bool

    def cleanup(self) -> None:
        if self.temporary:
            self.path.unlink(missing_ok=True)


def split_expected(uri: str, expected_sha256: str | None) -> tuple[str, str | None]:
    """The URI without its `#sha256=` fragment, and the sha256 it must have (lower case),
    from the fragment or the argument (which must agree)."""
    base, _, fragment = uri.partition("#")
    if fragment:
        match = re.fullmatch(r"sha256=([0-9a-fA-F]{64})", fragment)
        if not match:
            raise FetchError(f"{uri}: the only fragment understood is #sha256=<64 hex digits>")
        from_fragment = match.group(1).lower()
        if expected_sha256 and expected_sha256.lower() != from_fragment:
            raise FetchError(f"{uri}: the fragment's sha256 differs from the one given")
        expected_sha256 = from_fragment
    if expected_sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", expected_sha256):
        raise FetchError(f"expected sha256 {expected_sha256!r} is not 64 hex digits")
    return base, expected_sha256.lower() if expected_sha256 else None


def check_sha256(uri: str, actual: str, expected: str | None) -> None:
    if expected is not None and actual != expected:
        raise FetchError(
            f"{uri}: sha256 mismatch: expected {expected}, got {actual}; the file was "
            "changed or the download is incomplete, so it is not used"
        )


def scheme_of(uri: str) -> str:
    """The URI's scheme in lower case ("" for a plain path); refuses an unsupported one."""
    scheme = urlsplit(uri).scheme.lower() if "://" in uri else ""
    if scheme not in SCHEMES:
        raise FetchError(f"{uri}: unsupported scheme {scheme!r}; use {SUPPORTED}")
    return scheme


def local_path(uri: str) -> Path:
    """The local file a path or `file://` URI names."""
    if uri.startswith("file://"):
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost"):
            raise FetchError(f"{uri}: file:// URIs must name a local file (file:///path)")
        return Path(unquote(parts.path))
    return Path(uri)


def remote_filesystem(uri: str) -> tuple[Any, str]:
    """(fsspec file system, path in it) for a remote URI; a scheme whose library is not
    installed names the extra that installs it."""
    import fsspec

    scheme = scheme_of(uri)
    options: dict[str, Any] = {}
    if scheme in ("http", "https"):
        import aiohttp

        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=HTTP_SOCKET_TIMEOUT_SECONDS,
            sock_read=HTTP_SOCKET_TIMEOUT_SECONDS,
        )  # fmt: skip
        options["client_kwargs"] = {"timeout": timeout}
    try:
        return fsspec.core.url_to_fs(uri, **options)
    except ImportError as error:
        library, extra = EXTRA_OF.get(scheme, (scheme, scheme))
        raise FetchError(
            f"{uri}: {scheme}:// needs {library}, which is the optional extra: "
            f"pip install 'kubeinfer[{extra}]'"
        ) from error


def _answer(error: BaseException) -> tuple[int, str] | None:
    """The HTTP status (and reason) behind an error, looking through the errors it was
    raised from: fsspec reports a failed HTTP request for a file's size as
    FileNotFoundError, whatever the status was."""
    seen: BaseException | None = error
    while seen is not None:
        status = getattr(seen, "status", None)
        if isinstance(status, int):
            return status, str(getattr(seen, "message", "") or "")
        seen = seen.__cause__ or seen.__context__
    return None


def describe_error(uri: str, error: BaseException) -> str:
    """One line saying why `uri` could not be read."""
    answer = _answer(error)
    if answer is not None and answer[0] == 404:
        return f"{uri}: no such file (the server answered HTTP 404 {answer[1]})".rstrip()
    if answer is not None:
        return f"{uri}: the server answered HTTP {answer[0]} {answer[1]}".rstrip()
    if isinstance(error, FileNotFoundError):
        return f"{uri}: no such file"
    if isinstance(error, PermissionError):
        return f"{uri}: permission denied: {error}"
    return f"{uri}: cannot download: {type(error).__name__}: {error}"


def retryable(error: BaseException) -> bool:
    """Whether another try may succeed: not for a missing file, a refusal or a 4xx answer
    (408 and 429 aside), yes for connection errors, timeouts and 5xx answers."""
    answer = _answer(error)
    if answer is not None:
        return answer[0] >= 500 or answer[0] in (408, 429)
    if isinstance(error, FileNotFoundError | PermissionError | IsADirectoryError):
        return False
    return isinstance(error, OSError | TimeoutError | ValueError) or _is_client_error(error)


def _is_client_error(error: BaseException) -> bool:
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - aiohttp is in the runtime extra
        return False
    return isinstance(error, aiohttp.ClientError)


@dataclass
class Download:
    """One file's download in progress: where it goes, what was written and hashed."""

    target: IO[bytes]
    digest: Any
    written: int = 0

    def write(self, chunk: bytes) -> None:
        self.target.write(chunk)
        self.digest.update(chunk)
        self.written += len(chunk)

    def restart(self) -> None:
        self.target.seek(0)
        self.target.truncate()
        self.digest, self.written = hashlib.sha256(), 0


def download(
    fs: Any,
    path: str,
    uri: str,
    target: IO[bytes],
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Writes the file at `path` in `fs` to `target`, resuming after errors worth
    retrying (see the module); returns its sha256."""
    progress = Download(target, hashlib.sha256())
    pause, failures = FIRST_PAUSE_SECONDS, 0
    while True:
        try:
            _read_from(fs, path, progress)
            return str(progress.digest.hexdigest())
        except Exception as error:  # fsspec's stores raise their own errors
            failures += 1
            if isinstance(error, ValueError) and progress.written:
                progress.restart()  # the store would not read from an offset (no ranges)
            if not retryable(error) or failures > RETRIES:
                tries = f" (after {failures} tries)" if failures > 1 else ""
                raise FetchError(describe_error(uri, error) + tries) from error
            sleep(pause)
            pause *= 2


def _read_from(fs: Any, path: str, progress: Download) -> None:
    """Reads from `progress.written` to the end, in blocks; starts over where the store
    cannot seek, and streams the whole file where it cannot read ranges at all (an HTTP
    server without them, such as Python's own, refuses a block read past the first)."""
    try:
        with fs.open(path, "rb", block_size=BLOCK_BYTES, cache_type="none") as source:
            if progress.written:
                try:
                    source.seek(progress.written)
                except (ValueError, OSError):  # a stream: no ranges, or no known size
                    progress.restart()
            while chunk := source.read(BLOCK_BYTES):
                progress.write(chunk)
    except ValueError as error:
        if "range" not in str(error).lower():
            raise
        progress.restart()
        with fs.open(path, "rb", block_size=0) as stream:  # fsspec's streaming read
            while chunk := stream.read(BLOCK_BYTES):
                progress.write(chunk)


def fetch(uri: str, scratch_dir: Path, expected_sha256: str | None = None) -> FetchedFile:
    """The file behind `uri`, checked against `expected_sha256` when one is known.
    Downloads land in `scratch_dir` (on the cache's filesystem) and are temporary."""
    base, expected = split_expected(uri, expected_sha256)
    if scheme_of(base) in ("", "file"):
        path = local_path(base)
        if not path.is_file():
            raise FetchError(f"{uri}: no such file")
        actual = sha256_file(path)
        check_sha256(uri, actual, expected)
        return FetchedFile(uri, path, actual, temporary=False)
    fs, remote = remote_filesystem(base)
    scratch_dir.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile(dir=scratch_dir, prefix="fetch-", delete=False)
    fetched = FetchedFile(uri, Path(handle.name), "", temporary=True)
    try:
        with handle:
            actual = download(fs, remote, uri, handle)
        check_sha256(uri, actual, expected)
    except BaseException:
        fetched.cleanup()
        raise
    return FetchedFile(uri, fetched.path, actual, temporary=True)
