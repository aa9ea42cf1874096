"""Fixtures of the runtime server tests: the tiny demo MLP (built once per session, real
ONNX), the ONNX Runtime engine on it, that engine behind a gate (`gated`) so a test can
hold an execution slot busy and decide what queues, and `kubeinfer serve`'s Rust data
plane serving that gated engine in the test's own process (`serving`, `start_serving`:
`rust_served`), so that a test decides by the gate, not by the clock, what is running and
queued when a request or SIGTERM comes."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.contract.runtime_config import BatchingPolicy, EngineSource, RuntimeConfig
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from onnx_models import build_spin_model
from rust_served import RustServed, rust_served


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
    `held_rows` rows, when set; a batch of rows given to `hold` waits for that gate of its
    own instead) and recording the batch sizes it executed; a batch of `fail_rows` rows
    raises."""

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
        self.row_gates: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    inputs = property(lambda self: self.engine.inputs)
    outputs = property(lambda self: self.engine.outputs)
    max_batch_size = property(lambda self: self.engine.max_batch_size)
    default_execution_slots = property(lambda self: self.engine.default_execution_slots)

    def create_slot(self) -> GatedSlot:
        return GatedSlot(self, self.engine.create_slot())

    def hold(self, rows: int) -> threading.Event:
        """A gate of its own, shut, for batches of `rows` rows: set it to let them run."""
        self.row_gates[rows] = threading.Event()
        return self.row_gates[rows]

    def open_all(self) -> None:
        """Every gate opened (a failed test leaves no slot's thread waiting)."""
        self.gate.set()
        for gate in self.row_gates.values():
            gate.set()

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
            own = owner.row_gates.get(batch_size)
            if own is not None:
                assert own.wait(10)
            elif owner.held_rows in (None, batch_size):
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
    engine.open_all()  # a test that failed while holding a slot leaves no thread waiting


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
        engine.open_all()


class Serving:
    """The Rust data plane serving in this process (`rust_served`): its port, what a
    client sees of it (`served`: requests, /metrics), and its drain: `stop()` (what
    SIGTERM or SIGINT to this process also does while it serves) starts it, and `drained`
    is its task, whose result is the batches the drain left on the engine (0: every
    admitted request answered)."""

    def __init__(self, served: RustServed) -> None:
        self.served = served
        self.port = served.port
        self.drained: asyncio.Task[int] | None = None

    def stop(self) -> asyncio.Task[int]:
        if self.drained is None:
            self.drained = asyncio.get_running_loop().create_task(
                asyncio.to_thread(self.served.shutdown)
            )
        return self.drained


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@pytest.fixture
async def start_serving(
    gated: GatedEngine, one_slot_queue_of_two: RuntimeConfig
) -> AsyncIterator[Callable[..., Awaitable[Serving]]]:
    """Starts the gated tiny model on the Rust data plane on a loopback port (one slot, a
    queue of two, a body read timeout of 0.3 s; `start(**updates)` changes the config);
    while any serves, SIGTERM and SIGINT to this process drain them, as they drain
    `kubeinfer serve`. Each one started is drained, and its drain awaited, at teardown."""
    running: list[Serving] = []
    loop = asyncio.get_running_loop()
    with ExitStack() as servers:

        def stop_all() -> None:
            for server in running:
                server.stop()

        async def start(**updates: object) -> Serving:
            config = one_slot_queue_of_two.model_copy(update=updates)
            served = servers.enter_context(rust_served(config, gated))
            if not running:
                for signum in STOP_SIGNALS:
                    loop.add_signal_handler(signum, stop_all)
            running.append(Serving(served))
            return running[-1]

        try:
            yield start
        finally:
            for signum in STOP_SIGNALS:
                loop.remove_signal_handler(signum)
            gated.open_all()
            ends = await asyncio.gather(
                *(server.stop() for server in running), return_exceptions=True
            )
            for end in ends:
                if isinstance(end, BaseException):
                    raise end


@pytest.fixture
async def serving(start_serving: Callable[..., Awaitable[Serving]]) -> Serving:
    return await start_serving()
