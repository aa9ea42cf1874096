"""The mirror target file: reading it (`parse_mirror_content` for the whole `MirrorFile`,
`parse_mirror_file` for its shadow target; pure) and watching it (`TargetWatcher`, a
periodic task).

The operator renders a `MirrorFile` into a ConfigMap mounted as a directory in the serving
pods. Kubelet updates such a file by swapping a symlink atomically, which inotify on the
file itself does not see, so the watcher re-reads the content every poll interval (a few
hundred bytes, read in a worker thread, never on a request's path) and acts only when the
bytes changed:

- missing or empty file, or `target: null` (and no `qualityWatch`): mirroring is off;
- a valid content: handed to `on_target` (which decides whether it is another candidate,
  or another watch);
- anything else (not YAML/JSON, a field the `MirrorFile` model refuses, unreadable): one
  WARNING with the reason, and the previous target stays in place. The same bad content
  is not reported again; a fix, or another bad content, is acted on at the next poll.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Generic, TypeVar

import yaml
from kubeinfer.contract.runtime_config import MirrorFile, MirrorTarget
from pydantic import ValidationError

log = logging.getLogger(__name__)


class MirrorFileError(ValueError):
    """The mirror target file cannot be used; the message says why."""


def parse_mirror_content(content: bytes) -> MirrorFile:
    """A mirror file's content (YAML or JSON, camelCase); empty content is a file naming
    nothing. Raises `MirrorFileError`."""
    if not content.strip():
        return MirrorFile()
    try:
        loaded = yaml.safe_load(content)
    except yaml.YAMLError as error:
        raise MirrorFileError(f"not valid YAML/JSON: {error}") from None
    if loaded is None:
        return MirrorFile()
    if not isinstance(loaded, dict):
        raise MirrorFileError(f"expected a mapping with a target, got {type(loaded).__name__}")
    try:
        return MirrorFile.model_validate(loaded)
    except ValidationError as error:
        problems = [
            f"{'.'.join(str(p) for p in e['loc']) or 'file'}: {e['msg']}" for e in error.errors()
        ]
        raise MirrorFileError("; ".join(problems)) from None
    except ValueError as error:  # a cross-field rule
        raise MirrorFileError(str(error)) from None


def parse_mirror_file(content: bytes) -> MirrorTarget | None:
    """The shadow target in a mirror file's content; None when the content is empty or
    has no target. Raises `MirrorFileError`."""
    return parse_mirror_content(content).target


def same_candidate(a: MirrorTarget | None, b: MirrorTarget | None) -> bool:
    """Whether two targets are the same candidate: its aggregates carry over from one to
    the other (a new share or policy), rather than restart."""
    if a is None or b is None:
        return a is b
    return (a.url, a.model_name, a.candidate_version, a.candidate_digest) == (
        b.url, b.model_name, b.candidate_version, b.candidate_digest,
    )  # fmt: skip


_MISSING = b"\0missing"  # the remembered "content" of an absent file


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return _MISSING


Parsed = TypeVar("Parsed")


class TargetWatcher(Generic[Parsed]):
    """Re-reads `path` every `interval_seconds` and awaits `on_target(parse(content))` when
    the file holds another valid content (a missing file: `parse(b"")`). `start()` reads
    once before returning, so a target present at startup is mirrored from the first
    request. `parse` is `parse_mirror_file` (the shadow target) unless given, e.g.
    `parse_mirror_content` for the whole file."""

    def __init__(
        self,
        path: str | Path,
        interval_seconds: float,
        on_target: Callable[[Parsed], Awaitable[None]],
        parse: Callable[[bytes], Parsed] = parse_mirror_file,  # type: ignore[assignment]
    ) -> None:
        self.path = Path(path)
        self._interval = interval_seconds
        self._on_target = on_target
        self._parse = parse
        self._last: bytes | str | None = None  # content, or an error's text
        self._task: asyncio.Task[None] | None = None

    async def poll(self) -> None:
        """One read: acts on the content if it changed since the last read."""
        try:
            content: bytes | str = await asyncio.to_thread(_read, self.path)
        except OSError as error:
            content = f"cannot read it: {error.strerror or error}"
        if content == self._last:
            return
        self._last = content
        if isinstance(content, str):
            self._invalid(content)
            return
        try:
            target = self._parse(b"" if content == _MISSING else content)
        except MirrorFileError as error:
            self._invalid(str(error))
            return
        try:
            # Shielded: stopping the watcher must not cut a change of target in half.
            await asyncio.shield(self._on_target(target))
        except BaseException:
            self._last = None  # not applied: the next poll tries again
            raise

    def _invalid(self, reason: str) -> None:
        log.warning(
            "Ignored the mirror target file, kept the previous target path=%s reason=%s",
            self.path, reason,
        )  # fmt: skip

    async def start(self) -> None:
        try:
            await self.poll()
        except Exception:  # serving goes on without a shadow; the next poll retries
            log.exception("Failed to apply the mirror target file path=%s", self.path)
        self._task = asyncio.create_task(self._loop(), name="kubeinfer-mirror-target")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.poll()
            except Exception:  # the watcher outlives any one bad poll
                log.exception("Failed to apply the mirror target file path=%s", self.path)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
