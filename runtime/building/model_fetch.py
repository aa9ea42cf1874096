"""Fetches a model or calibration file named by a URI to a local path, with its sha256.

Schemes: a plain path or `file://` (read in place), `http://` and `https://` (streamed to
a temporary file beside the cache while hashing), `s3://BUCKET/KEY` through boto3 (the
optional extra `kubeinfer[s3]`; credentials from the usual AWS environment variables,
which the operator fills from the InferenceDeployment's secretRef), `gs://BUCKET/OBJECT`
through google-cloud-storage (the optional extra `kubeinfer[gcs]`; credentials from
GOOGLE_APPLICATION_CREDENTIALS or the node's workload identity). Any other scheme is
refused with the list of supported ones. When an expected sha256 is given (a flag, or a
`#sha256=<hex>` fragment as pip writes it) a mismatch is refused before the bytes are
used, so a tampered or truncated download never reaches the cache.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import unquote, urlsplit

from kubeinfer.runtime.engine_manifest import sha256_file

CHUNK_BYTES = 1 << 20
HTTP_TIMEOUT_SECONDS = 60
SUPPORTED = "a path, file://, http://, https://, s3:// or gs://"


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


def _split_expected(uri: str, expected_sha256: str | None) -> tuple[str, str | None]:
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


def _check(uri: str, actual: str, expected: str | None) -> None:
    if expected is not None and actual != expected:
        raise FetchError(
            f"{uri}: sha256 mismatch: expected {expected}, got {actual}; the file was "
            "changed or the download is incomplete, so it is not used"
        )


def _stream_to(source: IO[bytes], target: IO[bytes]) -> str:
    digest = hashlib.sha256()
    while chunk := source.read(CHUNK_BYTES):
        digest.update(chunk)
        target.write(chunk)
    return digest.hexdigest()


def _download(uri: str, scratch_dir: Path, opener) -> tuple[Path, str]:
    scratch_dir.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile(dir=scratch_dir, prefix="fetch-", delete=False)
    path = Path(handle.name)
    try:
        with handle, opener() as source:
            return path, _stream_to(source, handle)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _fetch_http(uri: str, scratch_dir: Path) -> tuple[Path, str]:
    try:
        return _download(
            uri,
            scratch_dir,
            lambda: urllib.request.urlopen(uri, timeout=HTTP_TIMEOUT_SECONDS),
        )
    except urllib.error.HTTPError as error:
        raise FetchError(f"{uri}: the server answered HTTP {error.code} {error.reason}") from error
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise FetchError(f"{uri}: cannot download: {reason}") from error


def _bucket_and_name(uri: str, form: str) -> tuple[str, str]:
    parts = urlsplit(uri)
    bucket, name = parts.netloc, parts.path.lstrip("/")
    if not bucket or not name:
        raise FetchError(f"{uri}: expected {form}")
    return bucket, name


def _fetch_s3(uri: str, scratch_dir: Path) -> tuple[Path, str]:
    try:
        import boto3
    except ImportError as error:
        raise FetchError(
            f"{uri}: s3:// needs boto3, which is the optional extra: pip install 'kubeinfer[s3]'"
        ) from error
    bucket, key = _bucket_and_name(uri, "s3://BUCKET/KEY")
    try:
        body = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"]
        return _download(uri, scratch_dir, lambda: body)
    except FetchError:
        raise
    except Exception as error:  # botocore's errors share no importable base without botocore
        raise FetchError(f"{uri}: cannot download from S3: {error}") from error


def _fetch_gs(uri: str, scratch_dir: Path) -> tuple[Path, str]:
    try:
        from google.cloud import storage
    except ImportError as error:
        raise FetchError(
            f"{uri}: gs:// needs google-cloud-storage, which is the optional extra: "
            "pip install 'kubeinfer[gcs]'"
        ) from error
    bucket, name = _bucket_and_name(uri, "gs://BUCKET/OBJECT")
    try:
        blob = storage.Client().bucket(bucket).blob(name)
        return _download(uri, scratch_dir, lambda: blob.open("rb"))
    except FetchError:
        raise
    except Exception as error:  # google-api-core's errors, without importing it up front
        raise FetchError(f"{uri}: cannot download from Google Cloud Storage: {error}") from error


def _local_path(uri: str) -> Path:
    if uri.startswith("file://"):
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost"):
            raise FetchError(f"{uri}: file:// URIs must name a local file (file:///path)")
        return Path(unquote(parts.path))
    return Path(uri)


def fetch(uri: str, scratch_dir: Path, expected_sha256: str | None = None) -> FetchedFile:
    """The file behind `uri`, checked against `expected_sha256` when one is known.
    Downloads land in `scratch_dir` (on the cache's filesystem) and are temporary."""
    base, expected = _split_expected(uri, expected_sha256)
    scheme = urlsplit(base).scheme.lower() if "://" in base else ""
    if scheme in ("", "file"):
        path = _local_path(base)
        if not path.is_file():
            raise FetchError(f"{uri}: no such file")
        actual = sha256_file(path)
        _check(uri, actual, expected)
        return FetchedFile(uri, path, actual, temporary=False)
    if scheme in ("http", "https"):
        path, actual = _fetch_http(base, scratch_dir)
    elif scheme == "s3":
        path, actual = _fetch_s3(base, scratch_dir)
    elif scheme == "gs":
        path, actual = _fetch_gs(base, scratch_dir)
    else:
        raise FetchError(f"{uri}: unsupported scheme {scheme!r}; use {SUPPORTED}")
    fetched = FetchedFile(uri, path, actual, temporary=True)
    try:
        _check(uri, actual, expected)
    except FetchError:
        fetched.cleanup()
        raise
    return fetched
