"""CUDA Graphs for a slot's step: one executable graph per batch size, captured once from
the step's own calls (copy-in, compute, copy-out) on the slot's stream and replayed from
then on.

Why: a small batch's GPU work is short next to the host's cost of queueing it, a launch
per kernel and a driver call per copy; a graph queues all of them with one launch. Each
batch size gets its own graph because a captured graph has its copies' sizes and its
kernels' shapes fixed in it. The buffers a slot's step reads and writes are allocated once
and never move, so a graph captured over them stays valid for the slot's life.

Why a size is run eagerly once before it is captured: libraries initialise lazily on
first use (CuPy compiles a kernel, cuBLAS creates its workspace, TensorRT applies a new
input shape), and those calls cannot be captured. A capture that still fails (the stream's
capture was invalidated by a call that is not allowed inside one, or the library refused
to be captured: CuPy raises for any cuBLAS call during a capture) leaves that size eager
for good and says so once in the log, and the batch runs eagerly: a library that cannot
be captured costs speed, never a failed request.

Why thread-local capture mode: the batcher runs slots in worker threads; in the global
mode another slot's thread making a call that is unsafe during a capture (a synchronous
copy, an allocation) would invalidate this slot's capture.

The graph API comes from NVIDIA's cuda-python (`cuda.bindings.driver`, the `gpu` extra):
pycuda has none. Both drive the same driver and the same primary context, so a pycuda
stream's handle is a `CUstream` here.

Ran on an H100 (`make gpu-check`: `tests/runtime/test_engines_cuda.py`'s graph test, and
`tests/benchmarks/gpu_slots.py --graphs` for batch-1 latency with and without graphs),
with CuPy computes; TensorRT's `execute_async_v3` under capture never ran (TensorRT is not
installed there), so the TensorRT engine does not turn graphs on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from types import ModuleType
from typing import Any

from kubeinfer.runtime.engines.base import BackendUnavailable, EngineError

log = logging.getLogger(__name__)


def import_cuda_driver() -> ModuleType:
    """`cuda.bindings.driver`, or `BackendUnavailable` saying how to get it."""
    try:
        from cuda.bindings import driver
    except ImportError as error:
        raise BackendUnavailable(
            f"CUDA Graphs need NVIDIA's cuda-python (pip install 'kubeinfer[gpu]'): {error}"
        ) from error
    return driver


def _checked(driver: ModuleType, result: tuple[Any, ...], call: str) -> Any:
    """The value of a cuda-python call (its results after the status), or EngineError."""
    status, *values = result
    if status != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(status)
        raise EngineError(f"{call} failed: {name.decode() if name else status}")
    return values[0] if len(values) == 1 else None


class SlotGraphs:
    """The executable graphs of one slot, by batch size (by rows and shape for a model with
    variable axes: any hashable key).

    `queue(key, step)` queues `step(key)`'s work on the stream: the first time for a key
    eagerly, the second time captured into a graph that is then launched, after that by
    launching the graph. Call it with the slot's context current, from one thread at a
    time (a slot runs one batch at a time)."""

    def __init__(self, stream_handle: int, driver: ModuleType | None = None) -> None:
        self._driver = driver or import_cuda_driver()
        self._stream = self._driver.CUstream(stream_handle)
        self._graphs: dict[Hashable, tuple[Any, Any]] = {}  # key -> (graph, executable)
        self._seen: set[Hashable] = set()
        self._eager_only: set[Hashable] = set()

    @property
    def captured_sizes(self) -> frozenset[Hashable]:
        return frozenset(self._graphs)

    def queue(self, batch_size: Hashable, step: Callable[[Any], None]) -> None:
        graph = self._graphs.get(batch_size)
        if graph is not None:
            _checked(self._driver, self._driver.cuGraphLaunch(graph[1], self._stream), "launch")
            return
        if batch_size not in self._seen or batch_size in self._eager_only:
            self._seen.add(batch_size)
            step(batch_size)
            return
        executable = self._capture(batch_size, step)
        if executable is None:  # the size stays eager; this batch runs as one
            step(batch_size)
            return
        _checked(self._driver, self._driver.cuGraphLaunch(executable, self._stream), "launch")

    def _capture(self, batch_size: Hashable, step: Callable[[Any], None]) -> Any | None:
        driver = self._driver
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        _checked(driver, driver.cuStreamBeginCapture(self._stream, mode), "cuStreamBeginCapture")
        try:
            step(batch_size)
        except Exception as error:  # e.g. CuPy refuses cuBLAS calls inside a capture
            status, graph = driver.cuStreamEndCapture(self._stream)  # out of capture mode
            if status == driver.CUresult.CUDA_SUCCESS and graph is not None:
                driver.cuGraphDestroy(graph)
            self._stay_eager(batch_size, repr(error))
            return None
        status, graph = driver.cuStreamEndCapture(self._stream)
        if status != driver.CUresult.CUDA_SUCCESS:
            self._stay_eager(batch_size, str(status))
            return None
        try:
            executable = _checked(driver, driver.cuGraphInstantiate(graph, 0), "instantiate")
        except EngineError as error:
            driver.cuGraphDestroy(graph)
            self._stay_eager(batch_size, str(error))
            return None
        self._graphs[batch_size] = (graph, executable)
        return executable

    def _stay_eager(self, batch_size: Hashable, why: str) -> None:
        """The size is run eagerly from now on (the caller runs this batch eagerly: a
        compute that fails for another reason than the capture fails there)."""
        self._eager_only.add(batch_size)
        log.warning("Could not capture a CUDA graph for %s, it stays eager: %s", batch_size, why)

    def close(self) -> None:
        """Destroys the graphs (with the context current; the stream idle)."""
        for graph, executable in self._graphs.values():
            self._driver.cuGraphExecDestroy(executable)
            self._driver.cuGraphDestroy(graph)
        self._graphs.clear()
