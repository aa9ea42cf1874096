"""A `CudaSlot` model with a variable sequence axis served by the Rust data plane over HTTP,
on a CPU: the stand-in for `pycuda.driver` keeps each device allocation as host bytes and
really copies them, and the compute reads the device inputs and writes the device outputs.
What the CPU shows: requests of mixed lengths are padded to their bucket, batched, copied
in at the bucket's length (no more), computed, copied out, and each client gets its own
rows cut back to its own length. What the driver does with real device memory is for the
`gpu` tests (`test_engines_cuda.py`, under compute-sanitizer on a GPU)."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from kubeinfer.contract.runtime_config import (
    BatchingPolicy,
    EngineSource,
    InputShape,
    RuntimeConfig,
)
from kubeinfer.runtime.engines.base import TensorSpec
from kubeinfer.runtime.engines.cuda_streams import CudaContext, CudaSlot
from rust_served import rust_served
from test_gpu_fixes import fake_pycuda, install

LONGEST = 16
BUCKETS = [4, 8, 16]
IDS = TensorSpec("ids", "INT64", (-1, -1), ("sequence",), (1,), (LONGEST,))
DOUBLED = TensorSpec("doubled", "FP32", (-1, -1), ("sequence",), None, (LONGEST,))


class DeviceMemory:
    """What the stand-in's `mem_alloc` returns: host bytes at a unique address."""

    def __init__(self, nbytes: int, heap: dict[int, DeviceMemory]) -> None:
        self.bytes = np.zeros(nbytes, np.uint8)
        self.address = 0x10000 + 0x1000000 * len(heap)
        heap[self.address] = self

    def __int__(self) -> int:
        return self.address

    def free(self) -> None:
        pass


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Installs the copying stand-in; returns the log of (direction, bytes) copies."""
    log: list[str] = []
    moved: list[tuple[str, int]] = []
    heap: dict[int, DeviceMemory] = {}
    driver = fake_pycuda(log, (("NVIDIA H100 80GB HBM3", (9, 0)),))

    def htod(device: DeviceMemory, host: np.ndarray, stream: Any) -> None:
        assert host.flags.c_contiguous
        device.bytes[: host.nbytes] = host.reshape(-1).view(np.uint8)
        moved.append(("htod", host.nbytes))

    def dtoh(host: np.ndarray, device: DeviceMemory, stream: Any) -> None:
        host.reshape(-1).view(np.uint8)[:] = device.bytes[: host.nbytes]
        moved.append(("dtoh", host.nbytes))

    driver.mem_alloc = lambda nbytes: DeviceMemory(nbytes, heap)  # type: ignore[attr-defined]
    driver.memcpy_htod_async = htod  # type: ignore[attr-defined]
    driver.memcpy_dtoh_async = dtoh  # type: ignore[attr-defined]
    install(monkeypatch, "pycuda.driver", driver)
    monkeypatch.setitem(sys.modules, "pycuda", type(sys)("pycuda"))
    return moved


class DoublingEngine:
    """doubled = 2 * ids, computed from the slot's device input into its device output."""

    inputs = (IDS,)
    outputs = (DOUBLED,)
    max_batch_size = 8
    default_execution_slots = 2

    def __init__(self) -> None:
        self.context = CudaContext(0)
        self.slots: list[CudaSlot] = []

    def create_slot(self) -> CudaSlot:
        slot = CudaSlot(self.context, self.inputs, self.outputs, self.max_batch_size, double)
        self.slots.append(slot)
        return slot

    def close(self) -> None:
        for slot in self.slots:
            slot.close()


def double(rows: int, slot: CudaSlot) -> None:
    assert slot.batch_shape is not None
    [(length,)] = slot.batch_shape
    ids = slot.device_inputs["ids"].bytes[: rows * length * 8].view(np.int64)
    slot.device_outputs["doubled"].bytes[: rows * length * 4].view(np.float32)[:] = 2 * ids


def config() -> RuntimeConfig:
    return RuntimeConfig(
        model_name="seq",
        engine=EngineSource(onnx_path="unused"),
        host="127.0.0.1",
        batching=BatchingPolicy(
            max_batch_size=8, max_queue_delay_microseconds=50_000, execution_slots=2,
            shape_batching="PadToBuckets", shape_buckets=BUCKETS,
        ),
        input_shapes=[InputShape(name="ids", min_shape=[1], opt_shape=[8],
                                 max_shape=[LONGEST], pad_value=0)],
    )  # fmt: skip


def test_mixed_lengths_come_back_cut_to_their_own_after_bucketed_copies(
    copies: list[tuple[str, int]],
) -> None:
    engine = DoublingEngine()
    lengths = [1, 3, 4, 5, 7, 9, 16, 2]
    try:
        with rust_served(config(), engine) as served:

            def infer(length: int) -> list[list[float]]:
                ids = [[length * 100 + i for i in range(length)]]
                body = {"inputs": [{"name": "ids", "datatype": "INT64", "shape": [1, length],
                                    "data": ids}]}  # fmt: skip
                status, _, answer = served.request(
                    "POST", "/v2/models/seq/infer", json.dumps(body).encode()
                )
                assert status == 200, answer
                [output] = json.loads(answer)["outputs"]
                assert output["shape"] == [1, length]
                return output["data"]

            with ThreadPoolExecutor(len(lengths)) as pool:
                answers = list(pool.map(infer, lengths))
    finally:
        engine.close()
    for length, data in zip(lengths, answers, strict=True):
        assert data == [2.0 * (length * 100 + i) for i in range(length)]
    # Each batch copied in its rows at its bucket's length, never the longest's.
    copied_in = [n for direction, n in copies if direction == "htod"]
    assert copied_in and all(n % 8 == 0 for n in copied_in)
    per_token = {n // 8 for n in copied_in}
    assert all(any(t == rows * b for rows in range(1, 9) for b in BUCKETS) for t in per_token)
    assert sum(copied_in) < len(lengths) * LONGEST * 8, "every batch copied at the longest"
