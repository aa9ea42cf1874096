"""GPU execution slots without TensorRT: allocations per batch and 1 slot against N slots
(a benchmark script for a CUDA machine, not a test).

The slots are the runtime's own `CudaSlot`s (pycuda: a stream, pinned host and device
buffers, an event each); only the compute differs from serving TensorRT: an MLP of
`--layers` fp32 [features x features] matmuls with ReLU, launched on the slot's stream by
CuPy (default), PyTorch, or, with `--compute copy`, a device-to-device copy (pycuda only).
The weights are shared by every slot, as one engine's are; each slot owns its activation
buffers, allocated once.

It prints, as Markdown:
1. a correctness check of one batch against numpy;
2. the time of each phase on one slot (H2D copy, compute, D2H copy, from CUDA events),
   and the ideal overlap speed-up sum/max that several slots could reach;
3. allocations per batch after warm-up: pycuda allocations (`mem_alloc`,
   `pagelocked_empty` calls), the compute library's device allocations (CuPy allocator
   calls / PyTorch caching-allocator allocations), the driver's free memory change, and
   the traced host peak (tracemalloc) — all should be 0 (the host peak a few hundred
   bytes of Python objects at most);
4. throughput with 1, 2, 4 slots, each driven by its own thread as the batcher does:
   batches/s, rows/s, and the speed-up over 1 slot.

`--json FILE` also writes those numbers as JSON (`tests/benchmarks/gpu_check.py` reads it
for its summary table).

On a GPU machine, `make gpu-check` builds pycuda if needed and runs this with the `gpu`
tests (see gpu_check.py for the GPU machine without network). By hand, where pycuda is
installed (`pip install 'pycuda>=2025.1.2'` builds it: nvcc and cuda.h must be found, e.g.
`export CUDA_ROOT=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH`):

    python tests/benchmarks/gpu_slots.py                      # CuPy compute
    python tests/benchmarks/gpu_slots.py --compute torch
    python tests/benchmarks/gpu_slots.py --features 1024 --layers 1   # copy-bound

Ran on an H100 (docs/gpu-check.md has its tables): `make gpu-check` runs it with
its defaults; the overlap and graph figures come from

    python tests/benchmarks/gpu_slots.py --features 4096 --layers 1 --batch 512 \
        --slots 1 2 3 --timeline 200                          # copy time ~ compute time
    python tests/benchmarks/gpu_slots.py --compute kernels --features 256 --layers 8 \
        --batch 64 --slots 1 --graphs 6000                    # batch-1 latency, graphs

`--compute kernels` runs the MLP as CuPy `RawKernel` launches, not cuBLAS: CuPy refuses
any cuBLAS call while a stream is being captured into a CUDA graph.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from kubeinfer.runtime.engines.base import BatchShape, TensorSpec
from kubeinfer.runtime.engines.cuda_streams import CudaContext, CudaSlot, import_pycuda

Enqueue = Callable[[int, CudaSlot], None]


# ----------------------------------------------------------------------------- computes


@dataclass
class Model:
    """The MLP's weights on the device and a factory of per-slot compute callables."""

    weights: list[np.ndarray]  # host copies, for the numpy reference
    make_enqueue: Callable[[CudaSlot], Enqueue]
    count_device_allocations: Callable[[], int]

    def reference(self, batch: np.ndarray) -> np.ndarray:
        return mlp_reference(self.weights, batch)


def mlp_reference(weights: list[np.ndarray], batch: np.ndarray) -> np.ndarray:
    """The MLP in float64 numpy (ReLU between layers), rounded to fp32."""
    h = batch.astype(np.float64)
    for i, w in enumerate(weights):
        h = h @ w
        if i < len(weights) - 1:
            h = np.maximum(h, 0)
    return h.astype(np.float32)


def host_weights(features: int, layers: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    scale = 1 / np.sqrt(features)
    return [
        (rng.standard_normal((features, features)) * scale).astype(np.float32)
        for _ in range(layers)
    ]


# A dense layer without cuBLAS, for steps captured into CUDA Graphs: CuPy refuses any
# cuBLAS call while a stream is being captured. One thread per output element.
DENSE_KERNEL = r"""
extern "C" __global__ void dense(const float* x, const float* w, float* y, int rows,
                                 int in_features, int out_features, int relu) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y;
    if (col >= out_features || row >= rows) return;
    float acc = 0.0f;
    for (int i = 0; i < in_features; ++i)
        acc += x[row * in_features + i] * w[i * out_features + col];
    y[row * out_features + col] = (relu && acc < 0.0f) ? 0.0f : acc;
}
"""


def cupy_model(
    context: CudaContext, features: int, layers: int, max_batch: int, cublas: bool = True
) -> Model:
    """The MLP on CuPy: cuBLAS matmuls (`cublas`), else `DENSE_KERNEL` launches."""
    import cupy  # type: ignore[import-not-found]

    calls = [0]
    pool = cupy.get_default_memory_pool()

    def counting_malloc(size: int) -> Any:
        calls[0] += 1
        return pool.malloc(size)

    cupy.cuda.set_allocator(counting_malloc)
    weights = host_weights(features, layers)
    with context.active():
        device_weights = [cupy.asarray(w) for w in weights]
        cupy.cuda.runtime.deviceSynchronize()  # the slots' streams do not wait for uploads

    def wrap(pointer: int, owner: object) -> Any:
        memory = cupy.cuda.UnownedMemory(pointer, max_batch * features * 4, owner)
        return cupy.ndarray((max_batch, features), np.float32, cupy.cuda.MemoryPointer(memory, 0))

    def make_enqueue(slot: CudaSlot) -> Enqueue:
        with slot.context.active():
            x = wrap(slot.input_pointers["x"], slot)
            y = wrap(slot.output_pointers["y"], slot)
            scratch = [cupy.empty((max_batch, features), np.float32) for _ in range(2)]
        stream = external_stream(cupy, slot.stream_handle)
        size = np.int32(features)
        grid_x = (features + 127) // 128

        def enqueue(n: int, _slot: CudaSlot) -> None:
            with stream:
                h = x[:n]
                for i, w in enumerate(device_weights):
                    last = i == len(device_weights) - 1
                    out = y[:n] if last else scratch[i % 2][:n]
                    if cublas:
                        cupy.matmul(h, w, out=out)
                        if not last:
                            cupy.maximum(out, 0, out=out)
                    else:
                        relu = np.int32(not last)
                        dense((grid_x, n), (128,), (h, w, out, np.int32(n), size, size, relu))
                    h = out

        return enqueue

    dense = cupy.RawKernel(DENSE_KERNEL, "dense")
    return Model(weights, make_enqueue, lambda: calls[0])


def external_stream(cupy: Any, handle: int) -> Any:
    """A CuPy stream over the slot's stream (`Stream.from_external` where CuPy has it:
    `ExternalStream` is deprecated from CuPy 14)."""

    class SlotStream:  # the CUDA stream protocol: (version, handle)
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, handle)

    try:
        return cupy.cuda.Stream.from_external(SlotStream())
    except (AttributeError, TypeError, ValueError):  # an older CuPy
        return cupy.cuda.ExternalStream(handle)


def kernels_model(context: CudaContext, features: int, layers: int, max_batch: int) -> Model:
    return cupy_model(context, features, layers, max_batch, cublas=False)


def torch_model(context: CudaContext, features: int, layers: int, max_batch: int) -> Model:
    import torch  # type: ignore[import-not-found]

    weights = host_weights(features, layers)
    with context.active():
        device_weights = [torch.from_numpy(w).cuda() for w in weights]
        torch.cuda.synchronize()  # the slots' streams do not wait for uploads

    class _Cai:  # a device buffer as __cuda_array_interface__, for torch.as_tensor
        def __init__(self, pointer: int) -> None:
            self.__cuda_array_interface__ = {
                "shape": (max_batch, features),
                "typestr": "<f4",
                "data": (pointer, False),
                "strides": None,
                "version": 2,
            }

    def make_enqueue(slot: CudaSlot) -> Enqueue:
        with slot.context.active():
            x = torch.as_tensor(_Cai(slot.input_pointers["x"]), device="cuda")
            y = torch.as_tensor(_Cai(slot.output_pointers["y"]), device="cuda")
            scratch = [torch.empty((max_batch, features), device="cuda") for _ in range(2)]
        stream = torch.cuda.ExternalStream(slot.stream_handle)

        def enqueue(n: int, _slot: CudaSlot) -> None:
            with torch.cuda.stream(stream):
                h = x[:n]
                for i, w in enumerate(device_weights):
                    last = i == len(device_weights) - 1
                    out = y[:n] if last else scratch[i % 2][:n]
                    torch.matmul(h, w, out=out)
                    if not last:
                        torch.relu_(out)
                    h = out

        return enqueue

    def allocations() -> int:
        return int(torch.cuda.memory_stats().get("allocation.all.allocated", 0))

    return Model(weights, make_enqueue, allocations)


def copy_model(context: CudaContext, features: int, layers: int, max_batch: int) -> Model:
    cuda = context.cuda

    def make_enqueue(slot: CudaSlot) -> Enqueue:
        def enqueue(n: int, s: CudaSlot) -> None:
            cuda.memcpy_dtod_async(
                s.device_outputs["y"], s.device_inputs["x"], n * features * 4, s.stream
            )

        return enqueue

    identity = [np.eye(features, dtype=np.float32)]
    return Model(identity, make_enqueue, lambda: 0)


MODELS = {
    "cupy": cupy_model,
    "kernels": kernels_model,
    "torch": torch_model,
    "copy": copy_model,
}


# ----------------------------------------------------------------------------- measurements


class PycudaAllocationCounter:
    """Counts calls of pycuda's allocating functions (installed around the measured runs)."""

    NAMES = ("mem_alloc", "pagelocked_empty", "pagelocked_zeros", "mem_alloc_pitch")

    def __init__(self, cuda: Any) -> None:
        self.cuda, self.calls, self._saved = cuda, 0, {}

    def __enter__(self) -> PycudaAllocationCounter:
        for name in self.NAMES:
            original = getattr(self.cuda, name, None)
            if original is None:
                continue
            self._saved[name] = original

            def counted(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                self.calls += 1
                return _original(*args, **kwargs)

            setattr(self.cuda, name, counted)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._saved.items():
            setattr(self.cuda, name, original)


def make_slot(
    context: CudaContext,
    model: Model,
    features: int,
    max_batch: int,
    blocking: bool,
    graphs: bool = False,
) -> tuple[CudaSlot, Enqueue]:
    """A slot whose compute is the model's (the compute needs the slot's pointers, hence
    the indirection), and that compute."""
    spec_x = TensorSpec("x", "FP32", (-1, features))
    spec_y = TensorSpec("y", "FP32", (-1, features))
    holder: list[Enqueue] = []
    slot = CudaSlot(
        context,
        (spec_x,),
        (spec_y,),
        max_batch,
        lambda n, s: holder[0](n, s),
        blocking,
        capture_graphs=graphs,
    )
    holder.append(model.make_enqueue(slot))
    return slot, holder[0]


def phase_times_ms(
    context: CudaContext, slot: CudaSlot, enqueue: Enqueue, n: int, repeats: int = 20
) -> dict[str, float]:
    """Median milliseconds of H2D, compute and D2H on the slot's stream, from CUDA events."""
    cuda = context.cuda
    results: dict[str, list[float]] = {"h2d": [], "compute": [], "d2h": []}
    with context.active():
        events = [cuda.Event() for _ in range(4)]
        for _ in range(repeats):
            events[0].record(slot.stream)
            cuda.memcpy_htod_async(slot.device_inputs["x"], slot.input_views(n)["x"], slot.stream)
            events[1].record(slot.stream)
            enqueue(n, slot)
            events[2].record(slot.stream)
            cuda.memcpy_dtoh_async(
                slot.host_outputs["y"][:n], slot.device_outputs["y"], slot.stream
            )
            events[3].record(slot.stream)
            events[3].synchronize()
            results["h2d"].append(events[1].time_since(events[0]))
            results["compute"].append(events[2].time_since(events[1]))
            results["d2h"].append(events[3].time_since(events[2]))
    return {k: statistics.median(v) for k, v in results.items()}


def throughput(
    slots: list[CudaSlot], n: int, seconds: float, shape: BatchShape | None = None
) -> float:
    """Batches per second with one thread per slot (each warms up in its own thread); a
    model with variable axes is given each batch's `shape`."""
    counts = [0] * len(slots)
    ready = threading.Barrier(len(slots) + 1)
    stop = threading.Event()

    def work(i: int) -> None:
        for _ in range(5):
            slots[i].run(n, shape)
        ready.wait()
        while not stop.is_set():
            slots[i].run(n, shape)
            counts[i] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(slots))]
    for t in threads:
        t.start()
    ready.wait()
    start = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


Interval = tuple[float, float]


def traced_batches(
    context: CudaContext, slot: CudaSlot, enqueue: Enqueue, n: int, batches: int, start: Any
) -> list[tuple[Interval, Interval, Interval]]:
    """Runs `batches` batches on the slot as `CudaSlot.run` does (copy-in, compute,
    copy-out on its stream, then a wait) with timing events between the phases; returns
    each batch's (H2D, compute, D2H) intervals in ms since the `start` event."""
    cuda = context.cuda
    x, y = slot.input_views(n)["x"], slot.host_outputs["y"][:n]
    with context.active():
        marks = [[cuda.Event() for _ in range(4)] for _ in range(batches)]
        for events in marks:
            events[0].record(slot.stream)
            cuda.memcpy_htod_async(slot.device_inputs["x"], x, slot.stream)
            events[1].record(slot.stream)
            enqueue(n, slot)
            events[2].record(slot.stream)
            cuda.memcpy_dtoh_async(y, slot.device_outputs["y"], slot.stream)
            events[3].record(slot.stream)
            events[3].synchronize()
        times = [[event.time_since(start) for event in events] for events in marks]
        del marks  # freed with the context current, as pycuda needs
    return [((t[0], t[1]), (t[1], t[2]), (t[2], t[3])) for t in times]


def overlapped_ms(interval: Interval, others: list[Interval]) -> float:
    """How much of `interval` some interval of `others` covers (others merged first)."""
    covered, end = 0.0, interval[0]
    for lo, hi in sorted(others):
        lo, hi = max(lo, end), min(hi, interval[1])
        if hi > lo:
            covered += hi - lo
            end = hi
    return covered


def overlap_timeline(
    context: CudaContext, model: Model, features: int, n: int, count: int, batches: int
) -> dict[str, Any]:
    """`count` slots in threads, each running traced batches: per slot, its first batches'
    intervals; overall, the share of compute time during which another slot's copy ran
    (copies and compute overlapping across streams) and the batches per second."""
    cuda = context.cuda
    made = [make_slot(context, model, features, n, True) for _ in range(count)]
    for slot, _ in made:
        slot.input_views(n)["x"][...] = 1.0
        for _ in range(5):
            slot.run(n)
    with context.active():
        reference = cuda.Stream()
        start = cuda.Event()
        start.record(reference)
        start.synchronize()
    results: list[list[tuple[Interval, Interval, Interval]]] = [[] for _ in made]
    barrier = threading.Barrier(count)

    def work(i: int) -> None:
        slot, enqueue = made[i]
        traced_batches(context, slot, enqueue, n, 5, start)  # libraries' per-thread set-up
        barrier.wait()
        results[i] = traced_batches(context, slot, enqueue, n, batches, start)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    computed = covered = 0.0
    for i, batches_of_slot in enumerate(results):
        copies = [
            phase
            for j, other in enumerate(results)
            if j != i
            for h2d, _, d2h in other
            for phase in (h2d, d2h)
        ]
        for _, compute, _ in batches_of_slot:
            computed += compute[1] - compute[0]
            covered += overlapped_ms(compute, copies)
    first = min(b[0][0][0] for b in results)
    last = max(b[-1][2][1] for b in results)
    for slot, _ in made:
        slot.close()
    return {
        "slots": count,
        "compute_share_overlapped_by_other_slots_copies": covered / computed if computed else 0,
        "batches_per_s": count * batches / ((last - first) / 1000),
        "first_batches_ms": [
            [[round(t - first, 3) for t in phase] for batch in b[:3] for phase in batch]
            for b in results
        ],
    }


def graph_latency(
    context: CudaContext, model: Model, features: int, max_batch: int, runs: int
) -> dict[str, Any]:
    """Batch-1 latency of `run` on a slot with and without CUDA Graphs (same model, same
    input; blocks of runs alternate between the two so drift falls on both alike)."""
    slots = {
        graphs: make_slot(context, model, features, max_batch, True, graphs)[0]
        for graphs in (False, True)
    }
    row = np.random.default_rng(2).standard_normal((1, features)).astype(np.float32)
    outputs = {}
    for graphs, slot in slots.items():
        slot.input_views(1)["x"][...] = row
        for _ in range(20):  # eager, captured, then replayed
            outputs[graphs] = slot.run(1)["y"].copy()
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(4):
        for graphs, slot in slots.items():
            clock = time.perf_counter_ns
            for _ in range(runs // 4):
                t0 = clock()
                slot.run(1)
                times[graphs].append((clock() - t0) / 1000)
    difference = float(np.max(np.abs(outputs[True] - outputs[False])))
    captured = slots[True].graphs is not None and 1 in slots[True].graphs.captured_sizes
    for slot in slots.values():
        slot.close()
    result: dict[str, Any] = {"max_abs_difference": difference, "captured": captured}
    for graphs, name in ((False, "eager"), (True, "graphs")):
        result[name] = {
            "p50_us": float(np.percentile(times[graphs], 50)),
            "p99_us": float(np.percentile(times[graphs], 99)),
        }
    result["p50_speedup"] = result["eager"]["p50_us"] / result["graphs"]["p50_us"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compute", choices=sorted(MODELS), default="cupy")
    parser.add_argument("--features", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=512, help="rows per batch (= max batch)")
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--spin", action="store_true", help="spin-wait events (default: blocking)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--timeline",
        type=int,
        default=0,
        metavar="BATCHES",
        help="also trace this many batches per slot with timing events, per slot count",
    )
    parser.add_argument(
        "--graphs",
        type=int,
        default=0,
        metavar="RUNS",
        help="also time this many batch-1 runs with and without CUDA Graphs",
    )
    args = parser.parse_args()
    n, features = args.batch, args.features
    results: dict[str, Any] = {
        "compute": args.compute,
        "batch": n,
        "features": features,
        "layers": args.layers,
        "events": "spin" if args.spin else "blocking-sync",
    }

    context = CudaContext(0)
    cuda = import_pycuda()
    model = MODELS[args.compute](context, features, args.layers, n)
    with context.active():
        results["device"] = context.device.name()
        print(
            f"device: {context.device.name()}, compute: {args.compute}, "
            f"batch {n} x {features} fp32, {args.layers} layer(s), "
            f"events: {'spin' if args.spin else 'blocking-sync'}\n"
        )

    slot, enqueue = make_slot(context, model, features, n, not args.spin)
    batch = np.random.default_rng(1).standard_normal((n, features)).astype(np.float32)
    slot.input_views(n)["x"][...] = batch
    got = slot.run(n)["y"]
    expected = model.reference(batch)
    error = float(np.max(np.abs(got - expected)) / (np.max(np.abs(expected)) or 1))
    results["correctness"] = {"max_relative_error": error, "ok": error < 1e-3}
    print(
        f"1. correctness: max |gpu - numpy| / max |numpy| = {error:.2e} "
        f"({'ok' if error < 1e-3 else 'MISMATCH'})\n"
    )

    phases = phase_times_ms(context, slot, enqueue, n)
    total = sum(phases.values())
    results["phases_ms"] = {**phases, "ideal_overlap": total / max(phases.values())}
    print("2. phases on one slot (ms, median of 20):\n")
    print("| H2D | compute | D2H | sum | ideal overlap speed-up (sum / max) |")
    print("|---:|---:|---:|---:|---:|")
    print(
        f"| {phases['h2d']:.3f} | {phases['compute']:.3f} | {phases['d2h']:.3f} | {total:.3f} | "
        f"{total / max(phases.values()):.2f} |\n"
    )

    for _ in range(10):
        slot.run(n)
    batches = 200
    with context.active():
        free_before, _ = cuda.mem_get_info()
    device_before = model.count_device_allocations()
    tracemalloc.start()
    tracemalloc.reset_peak()
    traced_before = tracemalloc.get_traced_memory()[0]
    with PycudaAllocationCounter(cuda) as counter:
        for _ in range(batches):
            slot.run(n)
    traced_peak = tracemalloc.get_traced_memory()[1] - traced_before
    tracemalloc.stop()
    device_calls = model.count_device_allocations() - device_before
    with context.active():
        free_after, _ = cuda.mem_get_info()
    results["allocations"] = {
        "batches": batches,
        "pycuda_per_batch": counter.calls / batches,
        "device_per_batch": device_calls / batches,
        "driver_free_change_bytes": free_after - free_before,
        "traced_host_peak_bytes": traced_peak,
    }
    print(f"3. allocations over {batches} batches after warm-up:\n")
    print(
        "| pycuda allocations / batch | compute-library device allocations / batch "
        "| driver free memory change | traced host peak |"
    )
    print("|---:|---:|---:|---:|")
    print(
        f"| {counter.calls / batches:g} | {device_calls / batches:g} "
        f"| {free_after - free_before} B | {traced_peak} B |\n"
    )

    print("4. throughput, one thread per slot:\n")
    print("| slots | batches/s | rows/s | speed-up vs 1 slot |")
    print("|---:|---:|---:|---:|")
    base = None
    slot.close()
    results["throughput"] = []
    for count in args.slots:
        slots = [make_slot(context, model, features, n, not args.spin)[0] for _ in range(count)]
        for s in slots:
            s.input_views(n)["x"][...] = batch
        rate = throughput(slots, n, args.seconds)
        base = base or rate
        print(f"| {count} | {rate:.1f} | {rate * n:.0f} | {rate / base:.2f} |")
        results["throughput"].append(
            {"slots": count, "batches_per_s": rate, "rows_per_s": rate * n, "speedup": rate / base}
        )
        for s in slots:
            s.close()
    if args.timeline:
        print(f"\n5. overlap, {args.timeline} traced batches per slot (CUDA events):\n")
        print("| slots | batches/s | compute time overlapped by another slot's copies |")
        print("|---:|---:|---:|")
        results["timeline"] = []
        for count in args.slots:
            traced = overlap_timeline(context, model, features, n, count, args.timeline)
            results["timeline"].append(traced)
            share = traced["compute_share_overlapped_by_other_slots_copies"]
            print(f"| {count} | {traced['batches_per_s']:.1f} | {share:.0%} |")
        print("\nfirst batches per slot, ms from the first copy (H2D, compute, D2H):\n")
        for i, phases in enumerate(results["timeline"][-1]["first_batches_ms"]):
            spans = ", ".join(f"{a:.3f}-{b:.3f}" for a, b in phases)
            print(f"- slot {i}: {spans}")
    if args.graphs:
        latency = graph_latency(context, model, features, n, args.graphs)
        results["graphs"] = latency
        print(f"\n6. batch-1 latency of a slot's run, {args.graphs} runs each (µs):\n")
        print("| | p50 | p99 |")
        print("|---|---:|---:|")
        for name in ("eager", "graphs"):
            print(f"| {name} | {latency[name]['p50_us']:.1f} | {latency[name]['p99_us']:.1f} |")
        print(
            f"\np50 speed-up {latency['p50_speedup']:.2f}x; graph captured: "
            f"{latency['captured']}; max |graph - eager| = {latency['max_abs_difference']:.1e}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
