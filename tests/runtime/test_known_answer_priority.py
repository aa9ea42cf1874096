"""The known-answer set run on demand goes at the lowest priority
(`KnownAnswerCheck.run_when_idle`): no probe batch starts while the data plane is busy,
each starts once it is idle, and one that never gets a quiet moment runs after the wait's
bound anyway; the tiny demo MLP's real engine answers, its runs counted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from kubeinfer.runtime.engine_manifest import KnownAnswerSet, KnownAnswerTolerance
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from kubeinfer.runtime.known_answers.probe_file import Probes
from kubeinfer.runtime.known_answers.runner import KnownAnswerCheck, KnownAnswers
from kubeinfer.runtime.testing_faults import InjectedFaults, PerturbingEngine
from waiting import eventually


def _check(tiny_model: Path, probes: int = 6) -> tuple[KnownAnswerCheck, PerturbingEngine]:
    engine = OnnxRuntimeEngine(tiny_model, max_batch_size=4, intra_op_threads=1)
    counted = PerturbingEngine(engine, InjectedFaults())  # counts batches, perturbs none
    inputs = {"input": np.random.default_rng(0).standard_normal((probes, 16)).astype(np.float32)}
    slot = engine.create_slot()
    slot.input_views(4)["input"][...] = inputs["input"][:4]
    head = np.array(slot.run(4)["logits"])
    slot.input_views(probes - 4)["input"][...] = inputs["input"][4:]
    expected = {"logits": np.concatenate([head, slot.run(probes - 4)["logits"]])}
    slot.close()
    tolerance = KnownAnswerTolerance(
        name="logits", comparison="relativeError", tolerance=1e-3, build_error=0, gated=True
    )
    recorded = KnownAnswerSet(
        file="known_answers.npz", sha256="0" * 64, probes=probes, source="drawn",
        outputs=[tolerance],
    )  # fmt: skip
    known = KnownAnswers("sha256:" + "1" * 64, recorded, Probes(inputs, expected))
    return KnownAnswerCheck(counted, known, batch_rows=4), counted


async def test_no_probe_batch_runs_while_busy_and_each_runs_once_idle(tiny_model: Path) -> None:
    check, counted = _check(tiny_model)
    asked, busy = [], asyncio.Event()
    busy.set()

    def idle() -> bool:
        asked.append(busy.is_set())
        return not busy.is_set()

    run = asyncio.create_task(check.run_when_idle(idle, wait_seconds=600))
    await eventually(
        lambda: len(asked) >= 5, what="the run to ask whether the plane is idle", in_thread=False
    )
    assert next(counted.batches) == 0  # nothing ran while busy
    busy.clear()
    verdict = await run
    assert verdict.passed and verdict.probes == 6, verdict.reason()
    assert next(counted.batches) == 4  # three probe batches (1, 4, 1 rows), then this draw
    assert check.latest is verdict and check.at_start is None


async def test_a_plane_never_idle_is_still_checked_after_the_wait(tiny_model: Path) -> None:
    check, counted = _check(tiny_model)
    verdict = await check.run_when_idle(lambda: False, wait_seconds=0.01)
    assert verdict.passed and verdict.checked
    assert next(counted.batches) == 3
