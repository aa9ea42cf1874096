"""Fixtures of the runtime server tests: the tiny demo MLP (built once per session, real
ONNX), the ONNX Runtime engine on it, that engine behind a gate (`gated`) so a test can
hold an execution slot busy and decide what queues, and `kubeinfer serve`'s own `serve_transports()`
running in the test's event loop on that gated engine (`serving`), so that a test decides
by the gate, not by the clock, what is running and queued when a request or SIGTERM
comes."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubeinfer.contract.runtime_config import BatchingPolicy, EngineSource, RuntimeConfig
from kubeinfer.runtime.dataplane import DataPlane
from kubeinfer.runtime.demo_models import build_tiny_mlp
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from kubeinfer.runtime.serving import assemble, serve_transports
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
    which the overload and drain tests need."""
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
        self.shapes: list[object] = []  # each batch's shape (None: no variable axes)
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

    def input_views(self, batch_size: int, shape=None):
        return self.slot.input_views(batch_size, shape)

    def run(self, batch_size: int, shape=None):
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
            owner.shapes.append(shape)
            owner.threads.append(threading.get_ident())
            return self.slot.run(batch_size, shape)
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


@pytest.fixture
def gated_of() -> Iterator[Callable[[OnnxRuntimeEngine], GatedEngine]]:
    """Wraps an engine of the test's own in a `GatedEngine`; each gate is opened again at
    teardown, so a failed test leaves no thread waiting."""
    made: list[GatedEngine] = []

    def wrap(engine: OnnxRuntimeEngine) -> GatedEngine:
        made.append(GatedEngine(engine))
        return made[-1]

    yield wrap
    for engine in made:
        engine.gate.set()


@dataclass
class Serving:
    """`serve_transports()` running in this event loop: its port, data plane, stop event
    and task (whose result is the exit code)."""

    port: int
    dataplane: DataPlane
    stop: asyncio.Event
    task: asyncio.Task[int]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def start_serving(
    gated: GatedEngine, one_slot_queue_of_two: RuntimeConfig
) -> AsyncIterator[Callable[..., Awaitable[Serving]]]:
    """Starts the gated tiny model served by `serve_transports()` on a loopback port (one slot, a
    queue of two, a body read timeout of 0.3 s; `start(**updates)` changes the config);
    each one started is stopped, and its exit awaited, at teardown."""
    running: list[Serving] = []

    async def start(**updates: object) -> Serving:
        config = one_slot_queue_of_two.model_copy(update={"http_port": free_port(), **updates})
        dataplane = assemble(config, gated)
        started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        task = asyncio.create_task(
            serve_transports(dataplane, on_started=started.set_result, stop=stop)
        )
        await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            task.result()  # serving failed before it started: its error
        running.append(Serving(started.result(), dataplane, stop, task))
        return running[-1]

    try:
        yield start
    finally:
        gated.gate.set()
        for server in running:
            server.stop.set()
        ends = await asyncio.gather(*(server.task for server in running), return_exceptions=True)
        for end in ends:
            if isinstance(end, BaseException):
                raise end


@pytest.fixture
async def serving(start_serving: Callable[..., Awaitable[Serving]]) -> Serving:
    return await start_serving()
