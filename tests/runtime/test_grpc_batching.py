"""gRPC requests batch as REST's do, though grpc.aio hands them to the batcher one at a
time, a few event-loop turns apart.

Covers, from the pure rule up: the policy's company rule as a table (with nothing in
flight, a request whose transport says company may be a few loop turns behind waits
until that many quiet turns have passed, never past maxQueueDelayMicroseconds, a
deadline, a full batch or a preferred size, and never while draining; a request that
says nothing runs at once, as before; while a batch is in flight the old rules decide);
the batcher over the real engine: requests handed over a few loop turns apart join one
batch when they carry company turns (and the next group waits anew), and each runs alone
when they do not; and a real `kubeinfer serve --grpc-port` on the tiny model, whose
batches run inline (fast): 32 concurrent gRPC clients are served in batches of several
rows, where each RPC used to find the slot free and run alone.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from kubeinfer.contract.runtime_config import BatchingPolicy
from kubeinfer.runtime.batching.policy import (
    Flush,
    FlushDecision,
    Pending,
    WaitTurns,
    WaitUntil,
    next_decision,
)
from kubeinfer.runtime.batching.queue import Batcher
from ports import free_port
from serve_process import ServeProcess
from tritonclient.grpc import service_pb2 as pb

FAR = 1e9  # a deadline that never matters


def p(arrived: float = 0.0, company: int = 0, rows: int = 1, deadline: float = FAR) -> Pending:
    return Pending(rows=rows, arrived_at=arrived, deadline=deadline, company_turns=company)


def policy(preferred: tuple[int, ...] = (), delay_us: int = 1000, max_batch: int = 8):
    return BatchingPolicy(
        max_batch_size=max_batch,
        max_queue_delay_microseconds=delay_us,
        preferred_batch_sizes=list(preferred),
    )


DEFAULT = policy()


@dataclass(frozen=True)
class Case:
    name: str
    pending: list[Pending]
    quiet: int
    expected: FlushDecision
    policy: BatchingPolicy = DEFAULT
    busy: int = 0
    now: float = 0.0
    draining: bool = False


CASES = [
    Case("a lone request that asks for no company runs at once",
         [p()], quiet=0, expected=FlushDecision((), Flush(1, 1))),
    Case("a lone request waiting for company waits for the quiet turns still missing",
         [p(company=3)], quiet=1, expected=FlushDecision((), WaitTurns(2))),
    Case("and runs once that many quiet turns have passed",
         [p(company=3)], quiet=3, expected=FlushDecision((), Flush(1, 1))),
    Case("the queue waits as long as its most patient request says",
         [p(company=1), p(company=4)], quiet=2, expected=FlushDecision((), WaitTurns(2))),
    Case("never past maxQueueDelayMicroseconds after the oldest arrival",
         [p(arrived=0.0, company=8), p(arrived=0.0005, company=8)], quiet=0, now=0.001,
         expected=FlushDecision((), Flush(2, 2))),
    Case("a full batch runs at once",
         [p(company=8) for _ in range(8)], quiet=0, expected=FlushDecision((), Flush(8, 8))),
    Case("a queue past maxBatchSize sends a full batch at once",
         [p(company=8) for _ in range(9)], quiet=0, expected=FlushDecision((), Flush(8, 8))),
    Case("a preferred size reached runs at once",
         [p(company=8), p(company=8)], quiet=0, policy=policy(preferred=(2, 4)),
         expected=FlushDecision((), Flush(2, 2))),
    Case("past the largest preferred size it runs at once",
         [p(company=8) for _ in range(5)], quiet=0, policy=policy(preferred=(2, 4)),
         expected=FlushDecision((), Flush(5, 5))),
    Case("below a preferred size it waits for company",
         [p(company=8)], quiet=0, policy=policy(preferred=(2, 4)),
         expected=FlushDecision((), WaitTurns(8))),
    Case("while draining nothing waits",
         [p(company=8)], quiet=0, draining=True, expected=FlushDecision((), Flush(1, 1))),
    Case("a zero queue delay waits for nobody",
         [p(company=8)], quiet=0, policy=policy(delay_us=0),
         expected=FlushDecision((), Flush(1, 1))),
    Case("expired requests are answered and the live one waits for company",
         [p(company=8, deadline=0.5), p(arrived=0.9, company=8)], quiet=0, now=0.9,
         expected=FlushDecision((0,), WaitTurns(8))),
    Case("while a batch is in flight the delay decides, by the clock, as before",
         [p(company=8)], quiet=0, busy=1, expected=FlushDecision((), WaitUntil(0.001))),
    Case("and quiet turns do not shorten it",
         [p(company=1)], quiet=5, busy=1, expected=FlushDecision((), WaitUntil(0.001))),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_company_rule(case: Case) -> None:
    decision = next_decision(
        case.policy, case.pending, 1, case.busy, case.now, case.draining, quiet_turns=case.quiet
    )
    assert decision == case.expected


# --------------------------------------------------------------------------- the batcher


def one_row() -> dict[str, np.ndarray]:
    return {"input": np.full((1, 16), 0.5, np.float32)}


async def handed_over_turns_apart(batcher: Batcher, company_turns: int) -> None:
    """Four requests, each queued two loop turns after the one before, as grpc.aio hands
    RPCs to their handlers."""
    answers = []
    for _ in range(4):
        admission = batcher.admit()
        admission.company_turns = company_turns
        answers.append(asyncio.ensure_future(batcher.infer(one_row(), 1, admission=admission)))
        await asyncio.sleep(0)  # not a wait: two loop turns apart, as grpc.aio hands RPCs over
        await asyncio.sleep(0)  # not a wait: two loop turns apart, as grpc.aio hands RPCs over
    for answer in answers:
        assert (await answer)["logits"].shape == (1, 10)


@pytest.mark.parametrize(("company_turns", "batches"), [(4, [4, 4]), (0, [1] * 8)])
async def test_requests_a_few_turns_apart_join_one_batch_when_they_wait_for_company(
    gated, company_turns: int, batches: list[int]
) -> None:
    batcher = Batcher(
        gated,
        BatchingPolicy(execution_slots=1, max_queue_delay_microseconds=10**6),
        inline_below_seconds=10.0,  # every small batch runs inline once one is measured
    )
    await batcher.start()
    try:
        await batcher.infer(one_row(), 1)  # measured: from here small batches run inline
        await handed_over_turns_apart(batcher, company_turns)
        await handed_over_turns_apart(batcher, company_turns)  # the quiet turns count anew
    finally:
        await batcher.close()
    assert gated.batches[1:] == batches


# --------------------------------------------------------------------------- end to end

CLIENTS = 32
REQUESTS_PER_CLIENT = 40
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def batches_and_rows(server: ServeProcess) -> tuple[float, float]:
    return (
        server.metric("kubeinfer_batch_size_count"),
        server.metric("kubeinfer_batch_size_sum"),
    )


async def closed_loop(address: str) -> None:
    """CLIENTS clients, each on its own channel, each sending its next request when its
    last is answered."""
    request = pb.ModelInferRequest(model_name="tiny")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(np.full((1, 16), 0.5, "<f4").tobytes())
    raw = request.SerializeToString()
    channels = [grpc.aio.insecure_channel(address) for _ in range(CLIENTS)]

    async def client(channel: grpc.aio.Channel) -> None:
        call = channel.unary_unary(MODEL_INFER)
        for _ in range(REQUESTS_PER_CLIENT):
            answer = pb.ModelInferResponse.FromString(await call(raw, timeout=30))
            assert answer.outputs[0].shape == [1, 10]

    try:
        await asyncio.gather(*(client(channel) for channel in channels))
    finally:
        await asyncio.gather(*(channel.close() for channel in channels))


@pytest.mark.slow
def test_concurrent_grpc_clients_of_a_fast_model_are_served_in_batches(tiny_model: Path) -> None:
    grpc_port = free_port()
    with ServeProcess(
        tiny_model, "tiny", "--grpc-port", str(grpc_port), "--intra-op-threads", "1",
        "--execution-slots", "1", "--max-batch-size", "32",
    ) as server:  # fmt: skip
        asyncio.run(closed_loop(f"127.0.0.1:{grpc_port}"))  # warm: small batches measured fast
        batches_before, rows_before = batches_and_rows(server)
        started = time.monotonic()
        asyncio.run(closed_loop(f"127.0.0.1:{grpc_port}"))
        batches_after, rows_after = batches_and_rows(server)
    rows = rows_after - rows_before
    assert rows == CLIENTS * REQUESTS_PER_CLIENT
    mean_batch = rows / (batches_after - batches_before)
    assert mean_batch >= 3, (
        f"{rows:.0f} requests ran in batches of {mean_batch:.2f} rows on average "
        f"({time.monotonic() - started:.1f} s)"
    )
