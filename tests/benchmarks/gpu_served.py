"""The runtime served end to end on a GPU against the same computation run raw (a benchmark
script for a CUDA machine, not a test).

    python tests/benchmarks/gpu_served.py [--batch 256] [--rows 32] [--slots 2]
        [--widths 1024,8192,8192,8192,8192,8192,8192,8192,1000] [--json FILE]

The model is an fp32 MLP (`--widths`, ReLU between layers) whose step runs with CuPy on a
`CudaSlot`'s stream: pinned, preallocated buffers, copy-in, matmuls, copy-out, an event
wait. TensorRT would replace only that step. Two measurements of it, one after the other
on the same GPU:

- raw: the slots driven directly, one thread each as the batcher drives them, always at
  `--batch` rows (`gpu_slots.throughput`);
- served: the real runtime (`kubeinfer serve`'s path past loading the engine, on the Rust
  data plane: `engine_server.serve_engine`; admission, the dynamic batcher with `--slots`
  execution slots, the binary tensor codec, metrics, the HTTP server) in its own process,
  loaded over loopback HTTP by perf_analyzer (`--processes`
  of them, one by default) with `--clients` closed-loop clients in all, each request
  `--rows` rows in Triton's binary tensor extension. maxBatchSize is `--batch` and the
  queue delay long enough that, saturated, every batch is full.

It prints rows per second both ways and their ratio (served / raw), the served batches'
mean size (from the runtime's `kubeinfer_batch_size` histogram), the latency percentiles,
and, read while serving, the runtime's NVML gauges (where it exports them) beside
`nvidia-smi`'s figures for the same device. The load needs perf_analyzer on the machine
(`pip install perf-analyzer`, from a wheel folder without network; the GPU images' glibc
is new enough for it): not yet run on a GPU since the load moved to it.

`python gpu_served.py serve --config FILE --widths ...` is the server process on its own
(a RuntimeConfig file, as `kubeinfer serve --config` reads; the engine is this file's).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

MODEL = "bench"  # the name, input and output bench_adaptive_batching sends
INPUT, OUTPUT = "input", "logits"
HOST = "127.0.0.1"


# ----------------------------------------------------------------------------- the engine


class GpuMlpEngine:
    """An `Engine` whose slots are `CudaSlot`s running an fp32 MLP with CuPy on the slot's
    stream. The weights are uploaded once and shared by every slot; each slot has its own
    two activation buffers, allocated when it is made."""

    def __init__(
        self,
        widths: list[int],
        max_batch_size: int,
        *,
        capture_graphs: bool = False,
        seed: int = 0,
    ) -> None:
        import cupy  # type: ignore[import-not-found]
        from kubeinfer.runtime.engines.base import TensorSpec
        from kubeinfer.runtime.engines.cuda_streams import CudaContext

        self._cupy = cupy
        self.context = CudaContext(0)
        self._widths = widths
        self._max_batch_size = max_batch_size
        self._capture_graphs = capture_graphs
        rng = np.random.default_rng(seed)
        self.host_weights = [
            (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
            for a, b in itertools.pairwise(widths)
        ]
        with self.context.active():
            self._weights = [cupy.asarray(w) for w in self.host_weights]
            cupy.cuda.runtime.deviceSynchronize()  # the slots' streams do not wait for it
        self._inputs = (TensorSpec(INPUT, "FP32", (-1, widths[0])),)
        self._outputs = (TensorSpec(OUTPUT, "FP32", (-1, widths[-1])),)
        self._slots: list[Any] = []

    @property
    def inputs(self) -> tuple[Any, ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[Any, ...]:
        return self._outputs

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    @property
    def default_execution_slots(self) -> int:
        return 2

    def _device_matrix(self, pointer: int, columns: int, owner: object) -> Any:
        cupy = self._cupy
        size = self._max_batch_size * columns * 4
        memory = cupy.cuda.UnownedMemory(pointer, size, owner)
        return cupy.ndarray(
            (self._max_batch_size, columns), np.float32, cupy.cuda.MemoryPointer(memory, 0)
        )

    def create_slot(self) -> Any:
        from gpu_slots import external_stream
        from kubeinfer.runtime.engines.cuda_streams import CudaSlot

        cupy = self._cupy
        hidden = max(self._widths[1:-1], default=1)
        holder: list[Any] = []
        slot = CudaSlot(
            self.context,
            self._inputs,
            self._outputs,
            self._max_batch_size,
            lambda n, s: holder[0](n, s),
            capture_graphs=self._capture_graphs,
        )
        with self.context.active():
            x = self._device_matrix(slot.input_pointers[INPUT], self._widths[0], slot)
            y = self._device_matrix(slot.output_pointers[OUTPUT], self._widths[-1], slot)
            scratch = [cupy.empty((self._max_batch_size, hidden), np.float32) for _ in range(2)]
        stream = external_stream(cupy, slot.stream_handle)
        weights = self._weights

        def step(n: int, _slot: Any) -> None:
            with stream:
                h = x[:n]
                for i, w in enumerate(weights):
                    last = i == len(weights) - 1
                    out = y[:n] if last else scratch[i % 2][:n]
                    cupy.matmul(h, w, out=out)
                    if not last:
                        cupy.maximum(out, 0, out=out)
                    h = out

        holder.append(step)
        self._slots.append(slot)
        return slot

    def reference(self, batch: np.ndarray) -> np.ndarray:
        from gpu_slots import mlp_reference

        return mlp_reference(self.host_weights, batch)

    def close(self) -> None:
        for slot in self._slots:
            slot.close()
        self._slots.clear()


def parse_widths(text: str) -> list[int]:
    widths = [int(w) for w in text.split(",")]
    if len(widths) < 2 or min(widths) < 1:
        raise argparse.ArgumentTypeError("--widths: at least two positive layer widths")
    return widths


# ----------------------------------------------------------------------------- the server


def serve_main(argv: list[str]) -> int:
    """The runtime's own serving path (`engine_server.serve_engine`: `kubeinfer serve`'s
    past loading the engine), with this file's engine."""
    from engine_server import PLANES, serve_engine
    from kubeinfer.contract.runtime_config import RuntimeConfig

    parser = argparse.ArgumentParser(prog="gpu_served.py serve")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--widths", type=parse_widths, required=True)
    parser.add_argument("--graphs", action="store_true")
    parser.add_argument("--data-plane", choices=PLANES, default="rust")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    config = RuntimeConfig.model_validate(yaml.safe_load(args.config.read_text()))
    engine = GpuMlpEngine(args.widths, config.batching.max_batch_size, capture_graphs=args.graphs)
    try:
        return serve_engine(config, engine, args.data_plane)
    finally:
        engine.close()


def server_command(config_path: Path, widths: list[int], graphs: bool) -> list[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "serve", "--config", str(config_path)]
    command += ["--widths", ",".join(map(str, widths))]
    return command + (["--graphs"] if graphs else [])


def runtime_config(port: int, batch: int, slots: int, delay_us: int) -> dict[str, Any]:
    return {
        "modelName": MODEL,
        "engine": {"onnxPath": "unused: the engine is gpu_served.GpuMlpEngine"},
        "host": HOST,
        "httpPort": port,
        "maxRequestBytes": 256 * 1024 * 1024,
        "batching": {
            "maxBatchSize": batch,
            "maxQueueDelayMicroseconds": delay_us,
            "executionSlots": slots,
            "maxQueueSize": 100_000,
            "defaultTimeoutMilliseconds": 120_000,
        },
    }


# ----------------------------------------------------------------------------- the load


def load_process(
    port: int, rows: int, width: int, clients: int, warmup_s: float, seconds: float, queue: Any
) -> None:
    """One load-generator process: perf_analyzer's `clients` closed-loop clients of
    binary requests of `rows` rows (a warm-up run, then three windows of `seconds` / 3)."""
    from kubeinfer.cli.tune import perf

    rng = np.random.default_rng(port + clients)
    samples = [{INPUT: row} for row in rng.standard_normal((8 * rows, width)).astype(np.float32)]
    queue.put("started")  # the window opens warmup_s from here
    workdir = Path(tempfile.mkdtemp(prefix="gpu-served-load-"))
    try:
        result = perf.run(
            perf.Target(f"{HOST}:{port}", MODEL), perf.Load(rows=rows, concurrency=clients),
            samples, seconds / 3, workdir, warmup_s,
        )  # fmt: skip
        figures: dict[str, Any] = {
            "rows_per_s": result.rows_per_second, "errors": 0, "error_samples": [],
            "p50_ms": result.p50_milliseconds, "p99_ms": result.p99_milliseconds,
        }  # fmt: skip
    except perf.PerfAnalyzerFailed as error:
        figures = {"rows_per_s": 0.0, "errors": 1, "error_samples": [str(error)],
                   "p50_ms": None, "p99_ms": None}  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    queue.put(figures)


def metric_values(text: str, name: str) -> dict[str, float]:
    """Samples of one metric family from a Prometheus text exposition: suffix -> value
    (labels dropped; the runtime serves one model)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(rf"^{name}(_[a-z]+)?(\{{[^}}]*\}})? (\S+)$", line)
        if match:
            values[match.group(1) or ""] = float(match.group(3))
    return values


def process_cpu_seconds(stat: Path) -> float:
    """User and system CPU seconds of a process, all its threads (/proc/PID/stat)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def nvidia_smi_memory() -> dict[str, float] | None:
    """nvidia-smi's used and total memory of device 0 (MiB, as it prints them, in bytes)."""
    query = ["--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(
            ["nvidia-smi", *query], capture_output=True, text=True, check=True
        ).stdout.split("\n")[0]
    except (OSError, subprocess.CalledProcessError):
        return None
    used, total = (float(v) * 1024 * 1024 for v in out.split(","))
    return {"used_bytes": used, "total_bytes": total}


def served(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from kubeinfer.cli.tune.server import ServerProcess, ServerSpec, free_port, http_get

    port = free_port()
    config_path = workdir / f"config-{port}.yaml"
    config_path.write_text(yaml.safe_dump(runtime_config(port, args.batch, args.slots, 20_000)))
    command = server_command(config_path, args.widths, args.graphs)
    with ServerProcess(ServerSpec("gpu-served", command, port, MODEL), workdir / "logs") as server:
        assert server.process is not None
        stat = Path(f"/proc/{server.process.pid}/stat")
        queue: Any = multiprocessing.get_context("spawn").Queue()
        per_process = max(1, args.clients // args.processes)
        load_args = (port, args.rows, args.widths[0], per_process, args.warmup, args.seconds)
        processes = [
            multiprocessing.get_context("spawn").Process(
                target=load_process, args=(*load_args, queue)
            )
            for _ in range(args.processes)
        ]
        _, before = http_get(f"http://{HOST}:{port}/metrics", timeout=5)
        for process in processes:
            process.start()
        for _ in processes:
            assert queue.get(timeout=120) == "started"
        time.sleep(args.warmup)
        cpu_before = process_cpu_seconds(stat)
        time.sleep(args.seconds / 2)
        _, during = http_get(f"http://{HOST}:{port}/metrics", timeout=5)
        smi = nvidia_smi_memory()
        time.sleep(max(0.0, args.seconds / 2 - 1))
        server_cores = (process_cpu_seconds(stat) - cpu_before) / (args.seconds - 1)
        parts = [queue.get(timeout=args.warmup + args.seconds + 120) for _ in processes]
        for process in processes:
            process.join()
        _, after = http_get(f"http://{HOST}:{port}/metrics", timeout=5)
    batch_before = metric_values(before.decode(), "kubeinfer_batch_size")
    batch_after = metric_values(after.decode(), "kubeinfer_batch_size")
    batches = batch_after.get("_count", 0) - batch_before.get("_count", 0)
    batch_rows = batch_after.get("_sum", 0) - batch_before.get("_sum", 0)
    gauges = {
        name: metric_values(during.decode(), f"kubeinfer_gpu_memory_{name}_bytes").get("")
        for name in ("used", "total")
    }
    measured = [part for part in parts if part["p99_ms"] is not None]
    return {
        "rows_per_s": sum(part["rows_per_s"] for part in parts),
        "errors": sum(part["errors"] for part in parts),
        "error_samples": [s for part in parts for s in part["error_samples"]][:3],
        "mean_batch_rows": batch_rows / batches if batches else float("nan"),
        # one process: its percentiles; several: the slowest process's
        "p50_ms": max((part["p50_ms"] for part in measured), default=None),
        "p99_ms": max((part["p99_ms"] for part in measured), default=None),
        "server_cpu_cores": server_cores,
        "nvml_gauges_bytes": gauges,
        "nvidia_smi_bytes": smi,
    }


def raw(args: argparse.Namespace) -> dict[str, Any]:
    """Rows per second of the slots driven directly at `--batch` rows, and a correctness
    check of one batch against numpy."""
    from gpu_slots import throughput

    engine = GpuMlpEngine(args.widths, args.batch)
    try:
        slots = [engine.create_slot() for _ in range(args.slots)]
        batch = np.random.default_rng(1).standard_normal((args.batch, args.widths[0]))
        for slot in slots:
            slot.input_views(args.batch)[INPUT][...] = batch
        expected = engine.reference(batch.astype(np.float32))
        got = slots[0].run(args.batch)[OUTPUT]
        error = float(np.max(np.abs(got - expected)) / (np.max(np.abs(expected)) or 1))
        rate = throughput(slots, args.batch, args.seconds)
        device = engine.context.device.name()
    finally:
        engine.close()
    return {"rows_per_s": rate * args.batch, "max_relative_error": error, "device": device}


def main() -> int:
    if sys.argv[1:2] == ["serve"]:
        return serve_main(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--widths",
        type=parse_widths,
        default=parse_widths("1024,8192,8192,8192,8192,8192,8192,8192,1000"),
    )
    parser.add_argument("--batch", type=int, default=256, help="rows per batch (maxBatchSize)")
    parser.add_argument("--rows", type=int, default=32, help="rows per request")
    parser.add_argument("--slots", type=int, default=2, help="execution slots")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument(
        "--processes", type=int, default=1, help="load-generator processes (perf_analyzer's)"
    )
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--graphs", action="store_true", help="serve with CUDA Graphs")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gpu-served"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    raw_result = raw(args)
    served_result = served(args, args.workdir)
    ratio = served_result["rows_per_s"] / raw_result["rows_per_s"]
    print(
        f"device {raw_result['device']}; MLP {args.widths} fp32 (CuPy); {args.slots} slots; "
        f"batch {args.batch}; requests of {args.rows} rows; {args.clients} clients\n"
    )
    print("| | rows/s | mean batch | p50 ms | p99 ms | errors | server CPU (cores) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(f"| raw (slots driven directly) | {raw_result['rows_per_s']:.0f} | {args.batch} |||||")
    print(
        f"| served (HTTP, batcher) | {served_result['rows_per_s']:.0f} | "
        f"{served_result['mean_batch_rows']:.1f} | {served_result['p50_ms']:.1f} | "
        f"{served_result['p99_ms']:.1f} | {served_result['errors']} | "
        f"{served_result['server_cpu_cores']:.2f} |"
    )
    print(f"\nserved / raw: {ratio:.3f}; raw vs numpy: {raw_result['max_relative_error']:.1e}")
    gauges, smi = served_result["nvml_gauges_bytes"], served_result["nvidia_smi_bytes"] or {}
    print(
        f"GPU memory while serving: NVML gauges used {gauges['used']} B / total "
        f"{gauges['total']} B; nvidia-smi used {smi.get('used_bytes')} B / total "
        f"{smi.get('total_bytes')} B"
    )
    if served_result["error_samples"]:
        print("error samples:", served_result["error_samples"])
    if args.json:
        args.json.write_text(
            json.dumps({"raw": raw_result, "served": served_result, "ratio": ratio}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
