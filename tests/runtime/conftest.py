"""Fixtures of the runtime server tests: the tiny demo MLP (built once per session, real
ONNX), the ONNX Runtime engine on it, and that engine behind a gate (`gated`) so a test can
hold an execution slot busy and decide what queues."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubeinfer.contract.runtime_config import BatchingPolicy, EngineSource, RuntimeConfig
from kubeinfer.runtime.demo_models import build_tiny_mlp
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from onnx_models import build_spin_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_mlp(tmp_path_factory.mktemp("runtime-models") / "tiny.onnx")


@pytest.fixture(scope="session")
def spin_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model whose requests choose how long the engine call takes (`onnx_models`)."""
    return build_spin_model(tmp_path_factory.mktemp("spin") / "spin.onnx")


@pytest.fixture
def one_slot_queue_of_two(tiny_model: Path) -> RuntimeConfig:
    """The tiny model on one execution slot with room for two queued requests and a short
    body read timeout: with the slot held (`gated`), the third request is refused at once,
    which the overload and framing tests need."""
    return RuntimeConfig(
        model_name="tiny",
        engine=EngineSource(onnx_path=str(tiny_model)),
        host="127.0.0.1",
        body_read_timeout_seconds=0.3,
        batching=BatchingPolicy(execution_slots=1, max_queue_size=2),
    )


@pytest.fixture
def tiny_engine(tiny_model: Path) -> Iterator[OnnxRuntimeEngine]:
    engine = OnnxRuntimeEngine(tiny_model, max_batch_size=32, intra_op_threads=1)
    yield engine
    engine.close()


class GatedEngine:
    """The real engine, with every slot's `run` waiting for `gate` (only batches of
    `held_rows` rows, when set) and recording the batch sizes it executed; a batch of
    `fail_rows` rows raises."""

    def __init__(self, engine: OnnxRuntimeEngine) -> None:
        self.engine = engine
        self.gate = threading.Event()
        self.gate.set()
        self.batches: list[int] = []
        self.threads: list[int] = []
        self.running = 0
        self.max_running = 0
        self.fail_rows: int | None = None
        self.held_rows: int | None = None
        self._lock = threading.Lock()

    inputs = property(lambda self: self.engine.inputs)
    outputs = property(lambda self: self.engine.outputs)
    max_batch_size = property(lambda self: self.engine.max_batch_size)
    default_execution_slots = property(lambda self: self.engine.default_execution_slots)

    def create_slot(self) -> GatedSlot:
        return GatedSlot(self, self.engine.create_slot())

    def close(self) -> None:
        self.engine.close()


class GatedSlot:
    def __init__(self, owner: GatedEngine, slot) -> None:
        self.owner, self.slot = owner, slot

    def input_views(self, batch_size: int):
        return self.slot.input_views(batch_size)

    def run(self, batch_size: int):
        owner = self.owner
        with owner._lock:
            owner.running += 1
            owner.max_running = max(owner.max_running, owner.running)
        try:
            if owner.held_rows in (None, batch_size):
                assert owner.gate.wait(10)
            if batch_size == owner.fail_rows:
                raise RuntimeError("simulated engine failure")
            owner.batches.append(batch_size)
            owner.threads.append(threading.get_ident())
            return self.slot.run(batch_size)
        finally:
            with owner._lock:
                owner.running -= 1

    def close(self) -> None:
        self.slot.close()


@pytest.fixture
def gated(tiny_engine: OnnxRuntimeEngine) -> Iterator[GatedEngine]:
    engine = GatedEngine(tiny_engine)
    yield engine
    engine.gate.set()  # a test that failed while holding a slot leaves no thread waiting
