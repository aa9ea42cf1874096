"""The known-answer set run on a loaded engine: the thin part around `comparison.judge`.

`check_engine(engine, known)` runs the probes on a slot of the engine's own (made for the
run and closed after it, so the batcher's slots and buffers are untouched), the way the
batcher runs requests (rows copied into the slot's input views, the outputs copied out),
and judges the answers. The first probe runs alone and the others in batches of up to the
serving batch size, so both a lone request's path and a batch's are checked (and warmed:
ONNX Runtime plans its memory per shape, and a kernel may differ with the rows). It blocks: serving
calls it once at start, before its transports listen, and whatever data plane serves
the engine calls the same function (or `answer_probes` and `judge`) on its own path.

`KnownAnswerCheck` keeps the verdict of the start (which decides whether the replica may
ever serve: `serving_allowed`) and of the latest run, and runs the set again on demand
(`run_when_idle`): each probe batch waits until the data plane says it is idle, so
probes never go ahead of queued requests; after `IDLE_WAIT_SECONDS` without a quiet
moment it runs anyway, one batch, so a replica that is never idle is still checked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from kubeinfer.runtime.engine_manifest import EngineManifest, KnownAnswerSet
from kubeinfer.runtime.engines.base import BatchShape, Engine, ExecutionSlot
from kubeinfer.runtime.known_answers import probe_file
from kubeinfer.runtime.known_answers.comparison import Verdict, judge
from kubeinfer.runtime.known_answers.probe_file import Probes, Samples

log = logging.getLogger(__name__)

IDLE_WAIT_SECONDS = 10.0
"""How long an on-demand probe batch waits for the data plane to be idle before it runs
beside the traffic anyway."""
IDLE_POLL_SECONDS = 0.005


@dataclass(frozen=True)
class KnownAnswers:
    """An engine's known-answer set as recorded in its cache entry, loaded for serving."""

    digest: str
    recorded: KnownAnswerSet
    probes: Probes


def load_known_answers(directory: Path, manifest: EngineManifest) -> KnownAnswers | None:
    """The known-answer set of the cache entry in `directory` (its file's sha256 checked
    on the bytes read), or None for an engine built before sets were recorded. Raises
    `ProbeFileError`."""
    recorded = manifest.known_answers
    if recorded is None:
        return None
    probes = probe_file.read(directory / recorded.file, recorded.sha256)
    missing = {t.name for t in recorded.outputs} - set(probes.expected)
    if missing:
        raise probe_file.ProbeFileError(
            f"the known-answer file of {manifest.digest} has no expected {sorted(missing)}"
        )
    return KnownAnswers(manifest.digest, recorded, probes)


def unrunnable(engine: Engine, probes: Probes) -> str | None:
    """Why the engine, as configured here, cannot take the probes (other inputs, or an
    item shape outside the configured range); None when it can."""
    names = {spec.name for spec in engine.inputs}
    if names != set(probes.inputs):
        return f"the probes' inputs {sorted(probes.inputs)} are not the engine's {sorted(names)}"
    for spec in engine.inputs:
        item = tuple(probes.inputs[spec.name].shape[1:])
        low = spec.min_item_shape or tuple(d if d >= 0 else 0 for d in spec.item_shape)
        high = spec.largest_item_shape or item
        fits = len(item) == len(spec.item_shape) and all(
            want in (-1, got) and lo <= got <= hi
            for want, got, lo, hi in zip(spec.item_shape, item, low, high, strict=False)
        )
        if not fits:
            return (
                f"the probes' input {spec.name!r} has item shape {list(item)}, outside what "
                f"this configuration serves ({list(low)} to {list(high)})"
            )
    return None


def batch_shape(engine: Engine, probes: Probes) -> BatchShape | None:
    """The `shape` a slot of a model with variable axes is told (None without)."""
    if not any(spec.variable for spec in engine.inputs):
        return None
    return tuple(tuple(probes.inputs[spec.name].shape[1:]) for spec in engine.inputs)


def _batches(count: int, rows: int) -> Iterator[tuple[int, int]]:
    """(first row, rows) of each probe batch: the first probe alone, then the others."""
    yield 0, 1
    for start in range(1, count, rows):
        yield start, min(rows, count - start)


def _run_batch(
    slot: ExecutionSlot, inputs: Samples, start: int, rows: int, shape: BatchShape | None
) -> Samples:
    for name, view in slot.input_views(rows, shape).items():
        view[...] = inputs[name][start : start + rows]
    return {name: np.array(out, copy=True) for name, out in slot.run(rows, shape).items()}


def _joined(parts: list[Samples]) -> Samples:
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def answer_probes(engine: Engine, probes: Probes, batch_rows: int | None = None) -> Samples:
    """The engine's answers to the probes, run on a slot of its own in batches of up to
    `batch_rows` rows (default: the engine's max batch size)."""
    rows = min(batch_rows or engine.max_batch_size, engine.max_batch_size)
    shape = batch_shape(engine, probes)
    slot = engine.create_slot()
    try:
        parts = [
            _run_batch(slot, probes.inputs, start, n, shape)
            for start, n in _batches(probes.count, rows)
        ]
    finally:
        slot.close()
    return _joined(parts)


def not_checked(reason: str, digest: str | None = None) -> Verdict:
    return Verdict(digest, 0, skipped=reason)


def check_engine(
    engine: Engine,
    known: KnownAnswers,
    batch_rows: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Verdict:
    """Runs the known-answer set on `engine` and judges the answers (blocks)."""
    reason = unrunnable(engine, known.probes)
    if reason is not None:
        return not_checked(reason, known.digest)
    started = clock()
    try:
        answers = answer_probes(engine, known.probes, batch_rows)
    except Exception as error:  # an engine raises its own types; any is a failed check
        return _raised(known, error)
    return _judged(known, answers, clock() - started)


def _raised(known: KnownAnswers, error: Exception) -> Verdict:
    failure = f"{type(error).__name__}: {error}"
    return Verdict(known.digest, known.probes.count, failure=failure)


def _judged(known: KnownAnswers, answers: Samples, seconds: float) -> Verdict:
    return judge(known.recorded.outputs, known.probes.expected, answers, known.digest, seconds)


class KnownAnswerCheck:
    """One served engine's known-answer set: the verdict at start, the latest verdict, and
    runs on demand at the lowest priority. Without a set (`known` None: an `--onnx` model,
    an engine built before sets were recorded) every verdict is `not_checked(reason)`."""

    def __init__(
        self,
        engine: Engine,
        known: KnownAnswers | None,
        *,
        missing_reason: str = "no known-answer set was recorded with this engine",
        missing_expected: bool = False,
        batch_rows: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine, self.known = engine, known
        self._missing_reason = missing_reason
        # An ONNX file served as it is was asked for without a set: its skip is news, not
        # a warning; an engine that should carry one and does not is a warning.
        self._missing_expected = missing_expected
        self._batch_rows = batch_rows
        self._clock = clock
        self._lock = asyncio.Lock()
        self.at_start: Verdict | None = None
        """The verdict of the run at start (`run`): it decides `serving_allowed`."""
        self.latest: Verdict | None = None

    @property
    def serving_allowed(self) -> bool:
        """Whether the replica may serve: its engine passed the set at start (or had
        none to check). A later failure is reported, and left to the operator."""
        return self.at_start is not None and self.at_start.passed

    @property
    def hold_reason(self) -> str:
        if self.at_start is None:
            return "the known-answer check has not run yet"
        return f"the engine failed its known-answer check: {self.at_start.reason()}"

    def run(self) -> Verdict:
        """The check at start, in the caller's thread (blocks), and its log line."""
        if self.known is None:
            verdict = not_checked(self._missing_reason)
        else:
            verdict = check_engine(self._engine, self.known, self._batch_rows, self._clock)
        self.at_start = self.latest = verdict
        if self.known is None and self._missing_expected:
            log.info("Known-answer check skipped at start: %s", verdict.reason())
        else:
            log_verdict(verdict, "at start")
        if not verdict.passed:
            log.error("Holding readiness false for good: this engine must not serve")
        return verdict

    async def run_when_idle(
        self, idle: Callable[[], bool], wait_seconds: float = IDLE_WAIT_SECONDS
    ) -> Verdict:
        """Runs the set again, each probe batch in a worker thread once `idle()` says
        nothing is queued or running (or `wait_seconds` passed); one run at a time."""
        async with self._lock:
            known = self.known
            if known is None:
                verdict = not_checked(self._missing_reason)
            elif (reason := unrunnable(self._engine, known.probes)) is not None:
                verdict = not_checked(reason, known.digest)
            else:
                verdict = await self._run_idle(known, idle, wait_seconds)
            self.latest = verdict
            return verdict

    async def _run_idle(
        self, known: KnownAnswers, idle: Callable[[], bool], wait_seconds: float
    ) -> Verdict:
        engine = self._engine
        rows = min(self._batch_rows or engine.max_batch_size, engine.max_batch_size)
        shape = batch_shape(engine, known.probes)
        seconds, parts = 0.0, []
        try:
            slot = await asyncio.to_thread(engine.create_slot)
            try:
                for start, n in _batches(known.probes.count, rows):
                    await _until_idle(idle, self._clock, wait_seconds)
                    started = self._clock()
                    part = await asyncio.to_thread(
                        _run_batch, slot, known.probes.inputs, start, n, shape
                    )
                    seconds += self._clock() - started
                    parts.append(part)
            finally:
                slot.close()
        except Exception as error:  # an engine raises its own types; any is a failed check
            return _raised(known, error)
        return _judged(known, _joined(parts), seconds)


def known_answers_body(check: KnownAnswerCheck | None) -> dict[str, Any]:
    """The `GET /v2/known-answers` body: whether the replica may serve, and the verdicts at
    start and of the latest run (nulls without a check)."""
    if check is None:
        return {"servingAllowed": True, "atStart": None, "latest": None}
    return {
        "servingAllowed": check.serving_allowed,
        "atStart": check.at_start and check.at_start.to_wire(),
        "latest": check.latest and check.latest.to_wire(),
    }


def log_verdict(verdict: Verdict, when: str) -> None:
    """One log line: a failure as an error naming each failing output's probe, error and
    tolerance; a set not checked as a warning."""
    if verdict.result == "failed":
        log.error(
            "Known-answer check failed %s digest=%s probes=%d: %s",
            when, verdict.digest, verdict.probes, verdict.reason(),
        )  # fmt: skip
    elif verdict.result == "skipped":
        log.warning("Known-answer check skipped %s: %s", when, verdict.reason())
    else:
        worst = verdict.worst
        log.info(
            "Known-answer check passed %s digest=%s probes=%d worst_error_ratio=%.3f "
            "seconds=%.4f",
            when, verdict.digest, verdict.probes, 0.0 if worst is None else worst.error_ratio,
            verdict.seconds,
        )  # fmt: skip


async def _until_idle(idle: Callable[[], bool], clock: Callable[[], float], wait: float) -> None:
    """Returns once `idle()` holds, or `wait` seconds from now (the batcher has no event
    for its idleness: it is polled, as its own drain does)."""
    deadline = clock() + wait
    while not idle():
        if clock() >= deadline:
            return
        await asyncio.sleep(IDLE_POLL_SECONDS)
