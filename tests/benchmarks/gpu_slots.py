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

Not run yet: no machine that worked on it had a GPU.
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
from kubeinfer.runtime.engines.base import TensorSpec
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
        h = batch.astype(np.float64)
        for i, w in enumerate(self.weights):
            h = h @ w
            if i < len(self.weights) - 1:
                h = np.maximum(h, 0)
        return h.astype(np.float32)


def host_weights(features: int, layers: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    scale = 1 / np.sqrt(features)
    return [
        (rng.standard_normal((features, features)) * scale).astype(np.float32)
        for _ in range(layers)
    ]


def cupy_model(context: CudaContext, features: int, layers: int, max_batch: int) -> Model:
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
        stream = cupy.cuda.ExternalStream(slot.stream_handle)

        def enqueue(n: int, _slot: CudaSlot) -> None:
            with stream:
                h = x[:n]
                for i, w in enumerate(device_weights):
                    last = i == len(device_weights) - 1
                    out = y[:n] if last else scratch[i % 2][:n]
                    cupy.matmul(h, w, out=out)
                    if not last:
                        cupy.maximum(out, 0, out=out)
                    h = out

        return enqueue

    return Model(weights, make_enqueue, lambda: calls[0])


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


MODELS = {"cupy": cupy_model, "torch": torch_model, "copy": copy_model}


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
    context: CudaContext, model: Model, features: int, max_batch: int, blocking: bool
) -> tuple[CudaSlot, Enqueue]:
    """A slot whose compute is the model's (the compute needs the slot's pointers, hence
    the indirection), and that compute."""
    spec_x = TensorSpec("x", "FP32", (-1, features))
    spec_y = TensorSpec("y", "FP32", (-1, features))
    holder: list[Enqueue] = []
    slot = CudaSlot(
        context, (spec_x,), (spec_y,), max_batch, lambda n, s: holder[0](n, s), blocking
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


def throughput(slots: list[CudaSlot], n: int, seconds: float) -> float:
    """Batches per second with one thread per slot (each warms up in its own thread)."""
    counts = [0] * len(slots)
    ready = threading.Barrier(len(slots) + 1)
    stop = threading.Event()

    def work(i: int) -> None:
        for _ in range(5):
            slots[i].run(n)
        ready.wait()
        while not stop.is_set():
            slots[i].run(n)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compute", choices=sorted(MODELS), default="cupy")
    parser.add_argument("--features", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=512, help="rows per batch (= max batch)")
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--spin", action="store_true", help="spin-wait events (default: blocking)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
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
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
