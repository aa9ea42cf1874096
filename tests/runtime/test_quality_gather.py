"""A quality watch sends its samples to the reference together, in-process against a
scripted reference on loopback (its answer a known function of each row, so which request
disagreed is known by construction):

- `compare_requests` over requests stacked into one answer gives each request exactly
  what `compare_request` gives it alone (outputs of rank 2 and 3, several outputs,
  requests of several rows), its class tallies `top1_by_reference_class`'s; a NaN in one
  request's rows is a mismatch of that request only; an answer without the stacked rows
  is a mismatch of every request;
- the mirror with `gather_rows` sends the samples queued within `gather_seconds` as one
  request, each compared with its own rows (the disagreeing request's slice and exemplar
  are its own), at most `gather_rows` rows at once and at once when that many wait;
  requests that do not stack (another trailing shape) go apart; a shadow's mirror (the
  default) sends each request alone.
"""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
from aiohttp import web
from kubeinfer.contract.runtime_config import QualityWatch
from kubeinfer.runtime.output_statistics import top1_by_reference_class
from kubeinfer.runtime.protocol.tensor_codec import decode_infer_request, encode_infer_response
from kubeinfer.runtime.protocol.v2_types import HEADER_LENGTH_HEADER, InferOutput, InferResponse
from kubeinfer.runtime.shadow.aggregates import RunningAggregates, ShadowMetrics
from kubeinfer.runtime.shadow.comparison import compare_request, compare_requests
from kubeinfer.runtime.shadow.mirror import Mirror
from kubeinfer.runtime.shadow.quality import QualityAggregates
from prometheus_client import CollectorRegistry
from test_shadow_mirror import Scripted, serve, target
from waiting import eventually

RNG = np.random.default_rng(11)
CLASSES = 10


def logits_of(x: np.ndarray) -> np.ndarray:
    """The scripted reference's model: the first CLASSES features of each row."""
    return np.ascontiguousarray(x[:, :CLASSES])


def by_rows(body: bytes, header_length: int | None) -> tuple[int, bytes, dict[str, str]]:
    x = decode_infer_request(body, header_length).inputs[0].data
    response = InferResponse("m", "1", None, [InferOutput("logits", "FP32", logits_of(x), True)])
    payload, length = encode_infer_response(response)
    return 200, payload, {HEADER_LENGTH_HEADER: str(length)}


@pytest.fixture
async def reference():
    scripted = Scripted()
    scripted.answer = by_rows
    app = web.Application()
    app.router.add_post("/v2/models/m/infer", scripted.handle)
    runner, url = await serve(app)
    yield scripted, url
    await runner.cleanup()


def rows_received(scripted: Scripted) -> list[tuple[int, ...]]:
    shapes = []
    for body, headers in scripted.received:
        length = int(headers[HEADER_LENGTH_HEADER])
        shapes.append(tuple(decode_infer_request(body, length).inputs[0].data.shape))
    return shapes


# --------------------------------------------------------------------------- comparison


def noisy(array: np.ndarray, scale: float = 0.6) -> np.ndarray:
    return (array + RNG.standard_normal(array.shape) * scale).astype(np.float32)


@pytest.mark.parametrize(
    "shapes",
    [
        {"logits": (CLASSES,)},
        {"tokens": (3, 7)},  # [batch, tokens, vocab]: top-1 per token
        {"logits": (CLASSES,), "score": (1,), "tokens": (2, 5)},
    ],
    ids=["classes", "tokens", "several-outputs"],
)
@pytest.mark.parametrize("trusted", ["serving", "candidate"])
def test_stacked_requests_get_what_each_gets_alone(shapes, trusted) -> None:
    rows = [1, 3, 1, 2, 1]
    serving = [
        {name: ("FP32", RNG.standard_normal((n, *shape)).astype(np.float32))
         for name, shape in shapes.items()}
        for n in rows
    ]  # fmt: skip
    answers = [{name: (t, noisy(a)) for name, (t, a) in request.items()} for request in serving]
    stacked = {name: ("FP32", np.concatenate([a[name][1] for a in answers])) for name in shapes}

    together = compare_requests(serving, stacked, trusted=trusted, per_row=True)
    for request, answer, result in zip(serving, answers, together, strict=True):
        alone = compare_request(request, answer, trusted=trusted, per_row=True)
        assert result.mismatch is None
        assert result.max_abs_difference == pytest.approx(alone.max_abs_difference, rel=1e-12)
        assert result.sum_abs_difference == pytest.approx(alone.sum_abs_difference, rel=1e-9)
        assert result.min_cosine == pytest.approx(alone.min_cosine, rel=1e-9)
        assert (result.elements, result.top1_rows, result.top1_agreements) == (
            alone.elements, alone.top1_rows, alone.top1_agreements,
        )  # fmt: skip
        assert result.class_tallies == alone.class_tallies
        assert result.kl_divergence == pytest.approx(alone.kl_divergence, rel=1e-9)
        assert result.rows is not None and alone.rows is not None
        for field in ("disagreements", "kl_divergence", "max_abs_difference", "reference_class"):
            np.testing.assert_allclose(getattr(result.rows, field), getattr(alone.rows, field))
        if len(shapes) == 1:  # the one output's tallies are its classes' in the build's terms
            (name,) = shapes
            sides = [request[name][1], answer[name][1]]
            by_class = top1_by_reference_class(*(sides if trusted == "serving" else sides[::-1]))
            assert by_class is not None
            assert result.class_tallies == tuple((k, *v) for k, v in sorted(by_class.items()))


def test_a_nan_in_one_request_is_its_mismatch_only() -> None:
    serving = [{"logits": ("FP32", RNG.standard_normal((1, CLASSES)).astype(np.float32))}
               for _ in range(3)]  # fmt: skip
    answer = np.concatenate([s["logits"][1] for s in serving])
    answer[1, 4] = np.nan
    results = compare_requests(serving, {"logits": ("FP32", answer)}, per_row=True)
    assert [r.mismatch is None for r in results] == [True, False, True]
    assert results[1].mismatch is not None and "NaN" in results[1].mismatch
    assert results[0].top1_rows == results[2].top1_rows == 1


def test_an_answer_without_the_stacked_rows_is_a_mismatch_of_every_request() -> None:
    serving = [{"logits": ("FP32", RNG.standard_normal((1, CLASSES)).astype(np.float32))}
               for _ in range(3)]  # fmt: skip
    short = {"logits": ("FP32", serving[0]["logits"][1])}  # one row where three were sent
    results = compare_requests(serving, short)
    assert all(r.mismatch is not None and "shape [1, 10]" in r.mismatch for r in results)


# --------------------------------------------------------------------------- the mirror


def watch_for(url: str, **policy: int) -> QualityWatch:
    return QualityWatch(reference=target(url, **policy), slice_header="X-Tenant", max_slices=8)


async def test_samples_go_as_one_request_and_each_is_judged_on_its_own_rows(reference) -> None:
    scripted, url = reference
    watch = watch_for(url)
    aggregates = QualityAggregates(watch, "m", "1", ShadowMetrics(CollectorRegistry()))
    mirror = Mirror(watch.reference, aggregates, gather_rows=32, gather_seconds=0.05)
    await mirror.start()
    tenants = ["a", "b", "c", "d", "e", "f"]
    inputs = {t: RNG.standard_normal((1, 16)).astype(np.float32) for t in tenants}
    try:
        for tenant in tenants:
            logits = logits_of(inputs[tenant])
            if tenant == "d":  # this request's serving answer picks another class
                logits = logits.copy()
                logits[0, (logits.argmax() + 1) % CLASSES] = logits.max() + 1
            mirror.offer({"input": ("FP32", inputs[tenant])}, {"logits": ("FP32", logits)},
                         0.001, tenant)  # fmt: skip
        await eventually(
            lambda: aggregates.outcomes["compared"] == len(tenants),
            what="one comparison per tenant",
            every=0.005,
            in_thread=False,
        )
    finally:
        await mirror.close()
    assert rows_received(scripted) == [(6, 16)]  # one request to the reference
    status = aggregates.status()
    slices = {s["slice"]: s["agreement"] for s in status["slices"]}
    assert slices == {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0, "e": 1.0, "f": 1.0}
    archive = np.load(io.BytesIO(aggregates.exemplars_npz()), allow_pickle=False)
    np.testing.assert_array_equal(archive["input"][0], inputs["d"][0])  # the worst: d's


async def test_a_gather_holds_at_most_gather_rows_and_sends_at_once_when_they_wait(
    reference,
) -> None:
    scripted, url = reference
    to = watch_for(url).reference
    aggregates = RunningAggregates(to, "m", "1", ShadowMetrics(CollectorRegistry()))
    mirror = Mirror(to, aggregates, gather_rows=4, gather_seconds=30.0)
    await mirror.start()
    x = RNG.standard_normal((1, 16)).astype(np.float32)
    try:
        started = asyncio.get_running_loop().time()
        for _ in range(8):  # two full batches wait: neither waits for the 30 s
            mirror.offer({"input": ("FP32", x)}, {"logits": ("FP32", logits_of(x))}, 0.001)
        await eventually(
            lambda: aggregates.outcomes["compared"] == 8,
            what="8 compared",
            every=0.005,
            in_thread=False,
        )
        assert asyncio.get_running_loop().time() - started < 5
    finally:
        await mirror.close()
    assert rows_received(scripted) == [(4, 16), (4, 16)]


async def test_requests_that_do_not_stack_go_apart_and_a_shadow_sends_each_alone(
    reference,
) -> None:
    scripted, url = reference
    to = watch_for(url).reference
    offers = [RNG.standard_normal((n, width)).astype(np.float32)
              for n, width in ((1, 16), (2, 16), (1, 12), (1, 16))]  # fmt: skip
    for gather_rows, expected in (
        (32, [(3, 16), (1, 12), (1, 16)]),  # the 12-wide request ends the first gather
        (1, [(1, 16), (2, 16), (1, 12), (1, 16)]),
    ):
        scripted.received.clear()
        aggregates = RunningAggregates(to, "m", "1", ShadowMetrics(CollectorRegistry()))
        mirror = Mirror(to, aggregates, gather_rows=gather_rows, gather_seconds=0.05)
        await mirror.start()
        try:
            for x in offers:
                mirror.offer({"input": ("FP32", x)}, {"logits": ("FP32", logits_of(x))}, 0.001)
            await eventually(
                lambda a=aggregates: a.outcomes["compared"] == len(offers),
                what="every offer compared",
                every=0.005,
                in_thread=False,
            )
        finally:
            await mirror.close()
        assert sorted(rows_received(scripted)) == sorted(expected), gather_rows
        assert aggregates.status()["top1"]["agreement"] == 1.0
