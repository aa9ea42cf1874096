"""What one sampled request costs the serving runtime's CPU under a quality watch, and
what every answered request costs it, measured in-process, side by side in one run.

A script, not a test (nothing here is named test_*, so pytest never collects it):

    .venv/bin/python tests/benchmarks/quality_sample_cost.py [--requests-per-second 6000]
        [--serving-cpu-us 120] [--shares 1,5] [--seconds 5] [--rounds 3] [--baseline TREE]

`bench_quality_watch.py` measures the watch's cost as the throughput it takes, which a
shared machine's noise can swamp at the few percent it is about; this measures the two
costs that figure is made of, as CPU time, which others' load disturbs far less:

- per sampled request: a child process (pinned to CPU 0) runs a `ShadowController`
  with a watch sampling every request offered to it, against a real fp32 reference
  (`kubeinfer serve` of the small demo MLP, on CPU 1), and offers it single-row requests
  for `--seconds` at each share of `--requests-per-second` (the serving throughput: the
  rate samples then come at, which sets how many go to the reference together); its
  process CPU per offer, less that of the same child with no watch (the feeding loop's
  own cost), is the cost of one sample: queueing, sending, comparing, recording;
- per answered request, sampled or not: the data plane's side of an offer (its outputs
  dict, `ShadowController.offer`, the sampler) with a watch at 1 %, in a tight loop.

Each child runs this checkout's kubeinfer, or with `--baseline TREE` also an older source
tree's (through PYTHONPATH), in interleaved rounds; medians over the rounds. With
`--serving-cpu-us` (the serving CPU per request with no watch, as `bench_quality_watch.py`
measures it), the costs are put as the share of the serving CPU the watch takes at each
share: (offer + share x sample) / serving.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(port: int, rate: float, seconds: float, watch: bool) -> dict[str, float]:
    """Runs in the child process: the CPU per offered sample at `rate`, and per answered
    request with a watch at 1 %."""
    import numpy as np
    from kubeinfer.contract.runtime_config import QualityWatch, RuntimeConfig
    from kubeinfer.runtime.shadow.controller import ShadowController
    from prometheus_client import CollectorRegistry

    rng = np.random.default_rng(0)
    inputs = [{"input": ("FP32", rng.standard_normal((1, 512)).astype(np.float32))}
              for _ in range(16)]  # fmt: skip
    results = [{"logits": rng.standard_normal((1, 128)).astype(np.float32)} for _ in range(16)]
    datatypes = {"logits": "FP32"}

    def watch_at(percent: int) -> QualityWatch:
        return QualityWatch.model_validate({
            "reference": {"url": f"http://127.0.0.1:{port}", "modelName": "small-mlp",
                          "candidateVersion": "fp32", "candidateDigest": f"bench-{percent}",
                          "trafficPercent": percent},
            "sliceHeader": "X-Tenant",
        })  # fmt: skip

    async def run() -> dict[str, float]:
        config = RuntimeConfig(model_name="small-mlp", engine={"onnxPath": "/unused.onnx"})
        controller = ShadowController(config, CollectorRegistry())

        def answered(index: int) -> None:
            """What the data plane does for an answered request (`infer_decoded`)."""
            if controller.active:
                outputs = {n: (datatypes[n], a) for n, a in results[index % 16].items()}
                controller.offer(inputs[index % 16], outputs, 0.001, None)

        async def feed(count: int) -> None:
            for index in range(count):
                answered(index)
                await asyncio.sleep(1 / rate)

        if watch:
            await controller.apply_watch(watch_at(100))
        await feed(int(rate))  # warm: connections open, code paths run
        await asyncio.sleep(1.0)
        compared = controller.quality_status()["requests"]["compared"]
        count = int(rate * seconds)
        started = time.process_time()
        await feed(count)
        await asyncio.sleep(1.0)  # the last gather sent and compared
        spent = time.process_time() - started
        if watch:
            compared = controller.quality_status()["requests"]["compared"] - compared
            assert compared == count, f"{compared} of {count} samples compared"
        # Every answered request, at 1 %, with no await between them, as on a busy loop.
        await controller.apply_watch(watch_at(1))
        offers = 200_000
        offer_started = time.process_time()
        for index in range(offers):
            answered(index)
        per_offer = (time.process_time() - offer_started) / offers
        await controller.stop()
        return {"sample_us": spent / count * 1e6, "offer_us": per_offer * 1e6}

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(HERE))
    from mirror_harness import build_engines, from_tree, pin
    from servers import REPO, ServerProcess, kubeinfer_spec

    parser = argparse.ArgumentParser(description="quality watch cost per sample")
    parser.add_argument("--requests-per-second", type=float, default=6000.0,
                        help="the serving throughput the shares are of")  # fmt: skip
    parser.add_argument("--serving-cpu-us", type=float, help="serving CPU per request")
    parser.add_argument("--shares", default="1,5", help="sampling shares in percent")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, metavar="TREE")
    args = parser.parse_args(argv)
    shares = [int(s) for s in args.shares.split(",")]
    work = REPO / ".bench" / "quality-watch"
    engines = build_engines(work, "small-mlp")
    spec = kubeinfer_spec(
        engines.model, "small-mlp", 1, engine=(engines.digests["fp32"], engines.cache),
        extra_args=("--execution-slots", "1"),
    )  # fmt: skip
    spec.label = "reference-sample-cost"
    trees: list[tuple[str, dict[str, str]]] = [("this checkout", {})]
    if args.baseline:  # only the PYTHONPATH of from_tree's package of links is used
        probe = from_tree(kubeinfer_spec(engines.model, "m", 1), args.baseline,
                          work / "baseline-package")  # fmt: skip
        trees.append((f"baseline {args.baseline}", probe.env))
    watched = [(label, env, True) for label, env in trees] + [("no watch", {}, False)]
    conditions = [(label, env, on, share) for share in shares for label, env, on in watched]
    print(f"quality watch cost per sample: shares {shares} of {args.requests_per_second:g} "
          f"req/s for {args.seconds:g} s, {args.rounds} rounds, load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    found: dict[tuple[str, int], list[dict[str, float]]] = {}
    with ServerProcess(spec, work / "logs") as reference:
        assert reference.process is not None
        pin(reference.process.pid, {1})
        for index in range(args.rounds):
            shift = index % len(conditions)
            for label, env, on, share in conditions[shift:] + conditions[:shift]:
                rate = args.requests_per_second * share / 100
                command = ["taskset", "-c", "0", sys.executable, __file__, "--child",
                           str(spec.port), str(rate), str(args.seconds), str(int(on))]  # fmt: skip
                done = subprocess.run(command, env={**os.environ, **env}, cwd="/tmp",
                                      capture_output=True, text=True, check=False)  # fmt: skip
                if done.returncode != 0:
                    raise RuntimeError(f"{label}: {done.stderr[-2000:]}")
                figures = json.loads(done.stdout.strip().splitlines()[-1])
                found.setdefault((label, share), []).append(figures)
                print(f"  round {index + 1} {label:>28} {share:>3} % ({rate:g}/s): "
                      f"{figures['sample_us']:7.1f} us CPU per offer; "
                      f"{figures['offer_us']:5.2f} us per answered request at 1 %",
                      flush=True)  # fmt: skip

    def median(label: str, share: int, key: str) -> float:
        return statistics.median(f[key] for f in found[(label, share)])

    print("\n| serving | share | samples/s | CPU per sample (us) | CPU per answered request "
          "(us) | share of the serving CPU |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for share in shares:
        loop = median("no watch", share, "sample_us")
        for label, _ in trees:
            sample = median(label, share, "sample_us") - loop
            offer = median(label, share, "offer_us")
            part = (
                f"{(offer + share / 100 * sample) / args.serving_cpu_us:.1%}"
                if args.serving_cpu_us else ""
            )  # fmt: skip
            print(f"| {label} | {share} % | {args.requests_per_second * share / 100:g} "
                  f"| {sample:.0f} | {offer:.2f} | {part} |")  # fmt: skip
    print(f"\n(CPU per sample: less the feeding loop's own with no watch; per answered "
          f"request: the offer path every request pays, at 1 %; share of the serving CPU: "
          f"(that + share x sample) / {args.serving_cpu_us or '?'} us; load average after "
          f"{os.getloadavg()[0]:.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, port, rate, seconds, watch = sys.argv
        print(json.dumps(child(int(port), float(rate), float(seconds), watch == "1")))
        sys.exit(0)
    sys.exit(main())
