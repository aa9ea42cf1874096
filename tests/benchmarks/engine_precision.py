"""int8 against fp32 on the memory-bound model: engine size, ONNX Runtime throughput at
batch 1 and 32, and the accuracy report (a benchmark script, not a test).

Both engines are built through the cache exactly as `kubeinfer build` builds them
(`build_engine`, int8 calibrated on the deterministic demo samples, 20% held out for the
report) and timed through the serving engine (`load_engine` + one execution slot, inputs
already in the slot's buffers), so the figures are what `kubeinfer serve` gets per batch,
without HTTP. fp32 and int8 are measured in alternating rounds and the median round kept,
so a neighbour's load on a shared machine hits both alike.

    .venv/bin/python tests/benchmarks/engine_precision.py [--model memory-bound] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from kubeinfer.cli.demo import mlp_models
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.building.engine_build import BuildResult, build_engine
from kubeinfer.runtime.engines.loader import load_engine

MODELS = {
    "small": mlp_models.build_small_mlp,
    "memory-bound": mlp_models.build_memory_bound_mlp,
}
BATCH_SIZES = (1, 32)


def _rows_per_second(result: BuildResult, batch: int, seconds: float, threads: int | None) -> float:
    engine = load_engine(result.engine_path, "onnxruntime", max(BATCH_SIZES), threads)
    slot = engine.create_slot()
    try:
        rng = np.random.default_rng(0)
        for view in slot.input_views(batch).values():
            view[...] = rng.standard_normal(view.shape).astype(view.dtype)
        slot.run(batch)  # warm-up: first-run allocations
        runs, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            slot.run(batch)
            runs += 1
        return runs * batch / elapsed
    finally:
        slot.close()
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="memory-bound")
    parser.add_argument("--work", type=Path, default=Path(".bench/engine_precision"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.5, help="per round and batch size")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    model = MODELS[args.model](args.work / f"{args.model}.onnx")
    calibration = write_demo_samples(model, args.work / f"{args.model}_calibration.npz")
    cache = args.work / "cache"
    builds = {}
    for precision in ("fp32", "int8"):
        started = time.perf_counter()
        builds[precision] = build_engine(
            str(model), "onnxruntime", precision, cache, calibration=str(calibration),
            max_batch_size=max(BATCH_SIZES),
        )  # fmt: skip
        print(
            f"built {precision}: {builds[precision].digest} "
            f"({'cache hit' if builds[precision].cache_hit else 'built'}, "
            f"{time.perf_counter() - started:.1f} s)"
        )

    samples: dict[str, dict[int, list[float]]] = {p: {b: [] for b in BATCH_SIZES} for p in builds}
    for _ in range(args.rounds):
        for batch in BATCH_SIZES:
            for precision, result in builds.items():
                rate = _rows_per_second(result, batch, args.seconds, args.threads)
                samples[precision][batch].append(rate)

    rows = {}
    for precision, result in builds.items():
        report = result.manifest.accuracy
        assert report is not None
        logits = report.outputs[0]
        rows[precision] = {
            "engineBytes": result.manifest.engine_bytes,
            **{
                f"rowsPerSecondBatch{b}": statistics.median(samples[precision][b])
                for b in BATCH_SIZES
            },
            "maxAbsDiff": logits.max_abs_diff,
            "meanAbsDiff": logits.mean_abs_diff,
            "cosine": logits.cosine_similarity,
            "top1Agreement": logits.top1_agreement,
            "validationSamples": report.samples,
            "validationSource": report.validation_source,
        }  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"\nmodel {args.model}, ONNX Runtime CPU, median of {args.rounds} rounds")
    print(
        f"{'':6}{'engine MB':>10}{'rows/s b=1':>12}{'rows/s b=32':>13}"
        f"{'max|d|':>10}{'mean|d|':>10}{'cosine':>10}{'top-1':>8}"
    )
    for precision, row in rows.items():
        print(
            f"{precision:6}{row['engineBytes'] / 1e6:10.1f}{row['rowsPerSecondBatch1']:12.1f}"
            f"{row['rowsPerSecondBatch32']:13.1f}{row['maxAbsDiff']:10.4f}"
            f"{row['meanAbsDiff']:10.4f}{row['cosine']:10.6f}{row['top1Agreement']:8.3f}"
        )
    fp32, int8 = rows["fp32"], rows["int8"]
    print(
        f"int8/fp32: size {int8['engineBytes'] / fp32['engineBytes']:.2f}x, "
        f"batch 1 {int8['rowsPerSecondBatch1'] / fp32['rowsPerSecondBatch1']:.2f}x, "
        f"batch 32 {int8['rowsPerSecondBatch32'] / fp32['rowsPerSecondBatch32']:.2f}x "
        f"(accuracy on {int8['validationSamples']} {int8['validationSource']} samples)"
    )


if __name__ == "__main__":
    main()
