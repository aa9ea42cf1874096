"""`SlotGraphs`' order of work per batch size, against a stand-in for cuda-python's driver
module (the library boundary; the real driver runs in `test_engines_cuda.py`'s `gpu`
tests): a size runs eagerly the first time, is captured and launched the second time and
only launched after that; a capture the driver invalidates, or a step that raises inside
it, leaves that size eager for good with the batch still run eagerly (a step that fails
eagerly too raises); closing destroys every graph."""

from __future__ import annotations

import enum
from types import SimpleNamespace
from typing import Any

import pytest
from kubeinfer.runtime.engines.cuda_graphs import SlotGraphs


class Result(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901


class FakeDriver:
    """Records the calls; `invalidate` makes the next capture fail as the driver would."""

    CUresult = Result
    CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.invalidate = False
        self.capturing = False

    def CUstream(self, handle: int) -> int:  # cuda-python's names, as the module spells them
        return handle

    def cuStreamBeginCapture(self, stream: int, mode: int) -> tuple[Any]:
        assert mode == 1
        self.capturing = True
        self.calls.append("begin")
        return (Result.CUDA_SUCCESS,)

    def cuStreamEndCapture(self, stream: int) -> tuple[Any, Any]:
        self.capturing = False
        self.calls.append("end")
        if self.invalidate:
            self.invalidate = False
            return (Result.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, None)
        return (Result.CUDA_SUCCESS, "graph")

    def cuGraphInstantiate(self, graph: str, flags: int) -> tuple[Any, Any]:
        self.calls.append("instantiate")
        return (Result.CUDA_SUCCESS, "exec")

    def cuGraphLaunch(self, executable: str, stream: int) -> tuple[Any]:
        self.calls.append("launch")
        return (Result.CUDA_SUCCESS,)

    def cuGraphExecDestroy(self, executable: str) -> tuple[Any]:
        self.calls.append("destroy exec")
        return (Result.CUDA_SUCCESS,)

    def cuGraphDestroy(self, graph: str) -> tuple[Any]:
        self.calls.append("destroy graph")
        return (Result.CUDA_SUCCESS,)

    def cuGetErrorName(self, status: Any) -> tuple[Any, bytes]:
        return (Result.CUDA_SUCCESS, Result(status).name.encode())


@pytest.fixture
def driver() -> FakeDriver:
    return FakeDriver()


def stepper(driver: FakeDriver) -> Any:
    def step(n: int) -> None:
        driver.calls.append(f"step {n} {'captured' if driver.capturing else 'eager'}")

    return step


def test_a_size_runs_eagerly_then_is_captured_then_replayed(driver: FakeDriver) -> None:
    graphs = SlotGraphs(7, driver)  # type: ignore[arg-type]
    step = stepper(driver)
    for _ in range(3):
        graphs.queue(4, step)
    assert driver.calls == [
        "step 4 eager",
        "begin", "step 4 captured", "end", "instantiate", "launch",
        "launch",
    ]  # fmt: skip
    assert graphs.captured_sizes == {4}
    graphs.queue(2, step)  # another size starts over
    assert driver.calls[-1] == "step 2 eager"


def test_an_invalidated_capture_leaves_the_size_eager_and_still_runs_the_batch(
    driver: FakeDriver,
) -> None:
    graphs = SlotGraphs(7, driver)  # type: ignore[arg-type]
    step = stepper(driver)
    graphs.queue(4, step)
    driver.invalidate = True
    graphs.queue(4, step)
    graphs.queue(4, step)
    assert driver.calls == [
        "step 4 eager",
        "begin", "step 4 captured", "end", "step 4 eager",
        "step 4 eager",
    ]  # fmt: skip
    assert graphs.captured_sizes == frozenset()


def test_a_step_that_raises_during_capture_ends_it_and_runs_the_batch_eagerly(
    driver: FakeDriver,
) -> None:
    graphs = SlotGraphs(7, driver)  # type: ignore[arg-type]
    calls = []

    def refuses_capture(n: int) -> None:  # as CuPy does for cuBLAS calls
        calls.append("captured" if driver.capturing else "eager")
        if driver.capturing:
            raise NotImplementedError("calling cuBLAS API during stream capture")

    for _ in range(3):
        graphs.queue(4, refuses_capture)
    assert calls == ["eager", "captured", "eager", "eager"] and not driver.capturing
    assert graphs.captured_sizes == frozenset()


def test_a_step_that_fails_eagerly_too_raises(driver: FakeDriver) -> None:
    graphs = SlotGraphs(7, driver)  # type: ignore[arg-type]
    graphs.queue(4, stepper(driver))

    def failing(n: int) -> None:
        raise RuntimeError("compute failed")

    with pytest.raises(RuntimeError, match="compute failed"):
        graphs.queue(4, failing)
    assert driver.calls[-3:] == ["begin", "end", "destroy graph"] and not driver.capturing


def test_close_destroys_every_graph(driver: FakeDriver) -> None:
    graphs = SlotGraphs(7, driver)  # type: ignore[arg-type]
    step = stepper(driver)
    for n in (1, 2, 1, 2):
        graphs.queue(n, step)
    graphs.close()
    assert driver.calls.count("destroy exec") == 2 and driver.calls.count("destroy graph") == 2
    assert graphs.captured_sizes == frozenset()
