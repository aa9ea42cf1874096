"""Raw ONNX Runtime throughput: the slot engine against a plain `session.run` (a benchmark
script, not a test).

1. One thread, batch 1, 8, 32: microseconds per call of `InferenceSession.run` (feeding
   a numpy slice, getting fresh arrays back) and of `OnnxRuntimeSlot.run` (inputs already
   in the slot's buffers, outputs written into them), and their ratio. The two are
   measured in alternating rounds and the median round is kept, so a neighbour's load on
   a shared machine hits both alike; with one intra-op thread the clock is the thread's
   CPU time, which a neighbour preempting us does not inflate.
2. Two slots in two threads (batch 8 and 32): rows per second with one session shared by
   the slots against a session per slot, for a given intra-op thread count, the choice
   behind `OnnxRuntimeEngine`'s default.

    .venv/bin/python tests/benchmarks/ort_slots.py --model small --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
from kubeinfer.cli.demo import mlp_models
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine, serving_session_options

BUILDERS = {
    "tiny": mlp_models.build_tiny_mlp,
    "small": mlp_models.build_small_mlp,
    "memory-bound": mlp_models.build_memory_bound_mlp,
}


def _per_call_us(call: Callable[[], object], seconds: float, clock: Callable[[], float]) -> float:
    calls = 0
    start = clock()
    while (elapsed := clock() - start) < seconds:
        call()
        calls += 1
    return elapsed / calls * 1e6


def single_thread(path: Path, threads: int | None, rounds: int, seconds: float) -> None:
    session = ort.InferenceSession(
        str(path), serving_session_options(threads), providers=["CPUExecutionProvider"]
    )
    engine = OnnxRuntimeEngine(path, 32, intra_op_threads=threads)
    slot = engine.create_slot()
    spec = engine.inputs[0]
    out_names = [s.name for s in engine.outputs]
    # With one intra-op thread all the work is on this thread: its CPU time is immune to
    # neighbours preempting it on a shared machine. With a pool, wall time is all we have.
    clock = time.thread_time if threads == 1 else time.perf_counter
    print(f"clock: {clock.__name__}\n")
    data = np.random.default_rng(0).standard_normal((32, *spec.item_shape)).astype(spec.dtype)
    print("| batch | session.run us | slot.run us | session/slot |")
    print("|---:|---:|---:|---:|")
    for n in (1, 8, 32):
        slot.input_views(n)[spec.name][:] = data[:n]
        feed = {spec.name: data[:n]}
        plain, slotted = [], []

        def run_plain(feed: dict[str, np.ndarray] = feed) -> object:
            return session.run(out_names, feed)

        def run_slot(n: int = n) -> object:
            return slot.run(n)

        run_plain(), run_slot()  # warm: the first run at a shape plans its memory pattern
        for _ in range(rounds):
            plain.append(_per_call_us(run_plain, seconds, clock))
            slotted.append(_per_call_us(run_slot, seconds, clock))
        p, s = statistics.median(plain), statistics.median(slotted)
        print(f"| {n} | {p:.1f} | {s:.1f} | {p / s:.2f} |")


def two_slots(path: Path, threads: int | None, per_slot: bool, n: int, seconds: float) -> float:
    """Rows per second of two threads, each running batches of `n` on its own slot."""
    engine = OnnxRuntimeEngine(path, n, intra_op_threads=threads, session_per_slot=per_slot)
    slots = [engine.create_slot() for _ in range(2)]
    for slot in slots:
        slot.run(n)
    counts = [0, 0]
    stop = threading.Event()

    def work(i: int) -> None:
        while not stop.is_set():
            slots[i].run(n)
            counts[i] += 1

    workers = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    return sum(counts) * n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(BUILDERS), default="small")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (0: ORT's)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.3, help="per measurement")
    parser.add_argument("--skip-two-slots", action="store_true")
    args = parser.parse_args()
    threads = args.threads or None
    with tempfile.TemporaryDirectory() as tmp:
        path = BUILDERS[args.model](Path(tmp) / f"{args.model}.onnx")
        print(f"model {args.model}, intra-op threads {threads or 'default'}\n")
        single_thread(path, threads, args.rounds, args.seconds)
        if args.skip_two_slots:
            return
        print("\n| batch | 2 slots, shared session rows/s | 2 slots, session per slot rows/s |")
        print("|---:|---:|---:|")
        for n in (8, 32):
            shared, own = [], []
            for _ in range(3):
                shared.append(two_slots(path, threads, False, n, args.seconds * 3))
                own.append(two_slots(path, threads, True, n, args.seconds * 3))
            print(f"| {n} | {statistics.median(shared):.0f} | {statistics.median(own):.0f} |")


if __name__ == "__main__":
    main()
