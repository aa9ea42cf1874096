"""The CUDA slot machinery (pycuda) and the TensorRT engine's import guard.

Everywhere: importing `cuda_streams` and `tensorrt` needs neither pycuda nor TensorRT,
and using them without those raises `BackendUnavailable` with an instruction (also through
`load_engine`). On a CUDA machine with pycuda (marker `gpu("pycuda.driver")`; the CuPy
test also needs CuPy; `make gpu-check` builds pycuda and runs them): a
`CudaSlot` whose compute is a device-to-device copy returns each batch's rows for every
size 1..max; its pinned and device buffers never move and device memory does not change
across hundreds of batches; two slots in threads keep their results apart; a CuPy matmul
launched on the slot's stream equals numpy's; batch sizes outside 1..max are refused.
With CUDA Graphs (`capture_graphs`, needs cuda-python): a size's step is captured and
replayed with each batch's data; a CuPy cuBLAS step, which CuPy refuses to capture, stays
eager and still answers right. The engine target read from the device names its model.
TensorRT itself cannot be installed on our machines: the TensorRT engine is untested. The
`gpu` tests here passed on an H100 (`make gpu-check`), also under memcheck.
"""

from __future__ import annotations

import sys
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from kubeinfer.runtime.engines import cuda_streams, tensorrt
from kubeinfer.runtime.engines.base import BackendUnavailable, BatchSizeError, TensorSpec
from kubeinfer.runtime.engines.loader import load_engine


def test_tensorrt_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt -> ImportError
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"\x00")
    with pytest.raises(BackendUnavailable, match=r"TensorRT is not installed.*onnxruntime"):
        tensorrt.TensorRTEngine(plan, max_batch_size=4)
    with pytest.raises(BackendUnavailable, match="TensorRT is not installed"):
        load_engine(plan, "tensorrt", max_batch_size=4)


def test_pycuda_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    with pytest.raises(BackendUnavailable, match="pycuda is not installed"):
        cuda_streams.CudaContext()


# ----------------------------------------------------------------------------- on a GPU

WIDTH = 4096  # a 16 KiB row: any per-batch host array would be at least that
X = TensorSpec("x", "FP32", (-1, WIDTH))
Y = TensorSpec("y", "FP32", (-1, WIDTH))


def copy_rows(batch_size: int, slot: cuda_streams.CudaSlot) -> None:
    """The compute of the identity slot: y = x, on the slot's stream."""
    slot.context.cuda.memcpy_dtod_async(
        slot.device_outputs["y"], slot.device_inputs["x"], batch_size * WIDTH * 4, slot.stream
    )


@pytest.fixture(scope="module")
def context() -> cuda_streams.CudaContext:
    return cuda_streams.CudaContext(0)


@pytest.mark.gpu("pycuda.driver")
def test_a_slot_returns_each_batch_for_every_size(context: cuda_streams.CudaContext) -> None:
    slot = cuda_streams.CudaSlot(context, (X,), (Y,), 16, copy_rows)
    rng = np.random.default_rng(0)
    try:
        for n in range(1, 17):
            batch = rng.standard_normal((n, WIDTH)).astype(np.float32)
            slot.input_views(n)["x"][...] = batch
            out = slot.run(n)["y"]
            assert out.shape == (n, WIDTH)
            np.testing.assert_array_equal(out, batch)
        with pytest.raises(BatchSizeError):
            slot.run(17)
        with pytest.raises(BatchSizeError):
            slot.input_views(0)
    finally:
        slot.close()


@pytest.mark.gpu("pycuda.driver")
def test_a_slot_allocates_nothing_per_batch(context: cuda_streams.CudaContext) -> None:
    slot = cuda_streams.CudaSlot(context, (X,), (Y,), 16, copy_rows)
    cuda = context.cuda
    try:
        pointers = (dict(slot.input_pointers), dict(slot.output_pointers))
        host = {k: v.ctypes.data for k, v in {**slot.host_inputs, **slot.host_outputs}.items()}
        for n in range(1, 17):
            slot.run(n)
        with context.active():
            free_before, _ = cuda.mem_get_info()
        tracemalloc.start()
        try:
            traced_before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            for _ in range(25):
                for n in range(1, 17):
                    slot.input_views(n)["x"][0, 0] = n
                    assert slot.run(n)["y"][0, 0] == n
            traced_growth = tracemalloc.get_traced_memory()[1] - traced_before
        finally:
            tracemalloc.stop()
        with context.active():
            free_after, _ = cuda.mem_get_info()
        # 400 leaked batches would be ~100 MiB; 2 MiB is the driver's allocation granule,
        # slack for another process on the same GPU.
        assert abs(free_after - free_before) < 2 * 2**20, "device memory moved in 400 batches"
        assert traced_growth < WIDTH * 4, f"host side allocated {traced_growth} B"
        assert (slot.input_pointers, slot.output_pointers) == pointers
        assert {
            k: v.ctypes.data for k, v in {**slot.host_inputs, **slot.host_outputs}.items()
        } == host
    finally:
        slot.close()


@pytest.mark.gpu("pycuda.driver")
def test_two_slots_in_threads_keep_their_results_apart(context: cuda_streams.CudaContext) -> None:
    slots = [cuda_streams.CudaSlot(context, (X,), (Y,), 8, copy_rows) for _ in range(2)]
    batches = [np.full((8, WIDTH), i + 1, np.float32) for i in range(2)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def work(i: int) -> None:
        try:
            barrier.wait()
            for _ in range(200):
                slots[i].input_views(8)["x"][...] = batches[i]
                np.testing.assert_array_equal(slots[i].run(8)["y"], batches[i])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for slot in slots:
        slot.close()
    assert not errors, errors


@pytest.mark.gpu("pycuda.driver", "cupy")
def test_a_cupy_matmul_on_the_slot_stream_equals_numpy(
    context: cuda_streams.CudaContext, tmp_path: Path
) -> None:
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(1)
    weight = (rng.standard_normal((256, 256)) / 16).astype(np.float32)
    with context.active():
        device_weight = cupy.asarray(weight)
        # The upload ran on CuPy's stream; the slot's non-blocking stream is not ordered
        # after it, so it must be finished before a batch reads the weight.
        cupy.cuda.runtime.deviceSynchronize()

    def device_array(pointer: int, rows: int, owner: object) -> object:
        memory = cupy.cuda.UnownedMemory(pointer, rows * 256 * 4, owner)
        return cupy.ndarray((rows, 256), np.float32, cupy.cuda.MemoryPointer(memory, 0))

    def matmul(n: int, slot: cuda_streams.CudaSlot) -> None:
        with cupy.cuda.ExternalStream(slot.stream_handle):
            x = device_array(slot.input_pointers["x"], n, slot)
            y = device_array(slot.output_pointers["y"], n, slot)
            cupy.matmul(x, device_weight, out=y)

    narrow = (TensorSpec("x", "FP32", (-1, 256)), TensorSpec("y", "FP32", (-1, 256)))
    slot = cuda_streams.CudaSlot(context, narrow[:1], narrow[1:], 8, matmul)
    try:
        for n in (1, 5, 8):
            batch = rng.standard_normal((n, 256)).astype(np.float32)
            slot.input_views(n)["x"][...] = batch
            np.testing.assert_allclose(slot.run(n)["y"], batch @ weight, rtol=1e-3, atol=1e-3)
    finally:
        slot.close()


@pytest.mark.gpu("pycuda.driver", "cuda.bindings")
def test_graphs_replay_each_batch_size_with_the_data_of_the_batch(
    context: cuda_streams.CudaContext,
) -> None:
    slot = cuda_streams.CudaSlot(context, (X,), (Y,), 8, copy_rows, capture_graphs=True)
    rng = np.random.default_rng(2)
    try:
        for _ in range(3):  # eager, captured, replayed
            for n in (1, 5, 8):
                batch = rng.standard_normal((n, WIDTH)).astype(np.float32)
                slot.input_views(n)["x"][...] = batch
                np.testing.assert_array_equal(slot.run(n)["y"], batch)
        assert slot.graphs is not None and slot.graphs.captured_sizes == {1, 5, 8}
    finally:
        slot.close()


DENSE = r"""
extern "C" __global__ void dense(const float* x, const float* w, float* y, int rows, int n) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y;
    if (col >= n || row >= rows) return;
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) acc += x[row * n + i] * w[i * n + col];
    y[row * n + col] = acc;
}
"""


@pytest.mark.gpu("pycuda.driver", "cupy", "cuda.bindings")
@pytest.mark.parametrize("cublas", [False, True], ids=["cupy-kernels", "cublas"])
def test_graphs_capture_cupy_kernels_and_leave_cublas_eager(
    context: cuda_streams.CudaContext, cublas: bool
) -> None:
    """A step of CuPy kernel launches is captured and replayed; CuPy refuses cuBLAS calls
    inside a capture, so a cuBLAS step stays eager, every batch still answered right."""
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(3)
    weights = [(rng.standard_normal((256, 256)) / 16).astype(np.float32) for _ in range(3)]
    narrow = (TensorSpec("x", "FP32", (-1, 256)), TensorSpec("y", "FP32", (-1, 256)))
    with context.active():
        device_weights = [cupy.asarray(w) for w in weights]
        # Two buffers, alternated: a layer never reads the buffer it writes.
        scratch = [cupy.empty((8, 256), np.float32) for _ in range(2)]
        kernel = cupy.RawKernel(DENSE, "dense")
        cupy.cuda.runtime.deviceSynchronize()

    def device_array(pointer: int, owner: object) -> object:
        memory = cupy.cuda.UnownedMemory(pointer, 8 * 256 * 4, owner)
        return cupy.ndarray((8, 256), np.float32, cupy.cuda.MemoryPointer(memory, 0))

    def mlp(n: int, slot: cuda_streams.CudaSlot) -> None:
        with cupy.cuda.ExternalStream(slot.stream_handle):
            h = device_array(slot.input_pointers["x"], slot)[:n]
            y = device_array(slot.output_pointers["y"], slot)[:n]
            for i, w in enumerate(device_weights):
                out = y if i == len(device_weights) - 1 else scratch[i % 2][:n]
                if cublas:
                    cupy.matmul(h, w, out=out)
                else:
                    kernel((1, n), (256,), (h, w, out, np.int32(n), np.int32(256)))
                cupy.maximum(out, 0, out=out)
                h = out

    def reference(batch: np.ndarray) -> np.ndarray:
        for w in weights:
            batch = np.maximum(batch @ w, 0)
        return batch

    slot = cuda_streams.CudaSlot(context, narrow[:1], narrow[1:], 8, mlp, capture_graphs=True)
    try:
        for _ in range(3):  # eager, captured (or refused), replayed (or eager)
            for n in (1, 8):
                batch = rng.standard_normal((n, 256)).astype(np.float32)
                slot.input_views(n)["x"][...] = batch
                np.testing.assert_allclose(slot.run(n)["y"], reference(batch), rtol=1e-3, atol=1e-3)
        assert slot.graphs is not None
        assert slot.graphs.captured_sizes == (frozenset() if cublas else {1, 8})
    finally:
        slot.close()


@pytest.mark.gpu("pycuda.driver", "pynvml")
def test_the_engine_target_names_this_device_as_nvml_does(
    context: cuda_streams.CudaContext,
) -> None:
    """The engine key's target is read from the device the plan would be built on: the
    compute capability and the model, so an H100's engine and an H200's differ."""
    import pynvml
    from kubeinfer.runtime.building.builders.tensorrt_builder import TensorRTBuilder
    from kubeinfer.runtime.engine_manifest import gpu_target

    target = TensorRTBuilder().target()
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    finally:
        pynvml.nvmlShutdown()
    name = name.decode() if isinstance(name, bytes) else name
    assert target == gpu_target(major, minor, name)
    model = name.lower().removeprefix("nvidia ").split()[0]  # h100, h200, a100, ...
    assert target.startswith(f"sm_{major}{minor}-{model}")
    print(f"engine target on {name}: {target}")


# A model with a variable sequence axis: each batch copies its own length, from the front of
# buffers sized for the longest (compute-sanitizer's memcheck runs this under `make
# gpu-check`: a view or a copy past a buffer is an out-of-bounds access there).
SEQUENCE = 64
IDS = TensorSpec("ids", "FP32", (-1, -1), ("sequence",), (1,), (SEQUENCE,))
TOKENS_OUT = TensorSpec("tokens", "FP32", (-1, -1), ("sequence",), None, (SEQUENCE,))


def copy_tokens(batch_size: int, slot: cuda_streams.CudaSlot) -> None:
    assert slot.batch_shape is not None
    [(length,)] = slot.batch_shape
    slot.context.cuda.memcpy_dtod_async(
        slot.device_outputs["tokens"], slot.device_inputs["ids"], batch_size * length * 4,
        slot.stream,
    )  # fmt: skip


@pytest.mark.gpu("pycuda.driver")
def test_a_sequence_slot_returns_each_batch_at_every_bucket(
    context: cuda_streams.CudaContext,
) -> None:
    slot = cuda_streams.CudaSlot(context, (IDS,), (TOKENS_OUT,), 8, copy_tokens)
    rng = np.random.default_rng(0)
    try:
        for length in (1, 16, 33, SEQUENCE):
            for n in (1, 5, 8):
                batch = rng.standard_normal((n, length)).astype(np.float32)
                slot.input_views(n, ((length,),))["ids"][...] = batch
                out = slot.run(n, ((length,),))["tokens"]
                assert out.shape == (n, length)
                np.testing.assert_array_equal(out, batch)
    finally:
        slot.close()
