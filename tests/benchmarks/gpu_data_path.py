"""Real-model shapes through the runtime's data path on a GPU: ResNet-50 images and a
BERT-base encoder's token sequences, served over HTTP (binary tensors) and gRPC against the
same model run raw (a benchmark script for a CUDA machine, not a test).

    python tests/benchmarks/gpu_data_path.py [--json FILE] [--profile FILE] [--quick]
    python tests/benchmarks/gpu_data_path.py --dry-run     # on a CPU: every step but CUDA

The engines are stand-ins that run on the device, named as such: PyTorch's ResNet-50
(torchvision, random weights) and BERT-base (transformers' `BertModel` at its default
configuration, random weights), fp16, eager, launched on the `CudaSlot`'s stream between
the slot's own copies (pinned, preallocated buffers; `runtime/engines/cuda_streams.py`).
TensorRT, the product's GPU engine, would replace only that launch; it is not installed
anywhere we run, so its speed is not what is measured here: the data path around it is.
Run on an H200 on 2026-11-27: the figures are in docs/benchmarks.md.

- ResNet-50: input `input` (n, 3, 224, 224), FP32 on the wire (602,112 B per image) or FP16
  (301,056 B; INT8 would be 150,528 B); output `logits` (n, 1000) FP32. Requests of
  `rows` images; maxBatchSize 1 to 256.
- BERT-base: inputs `input_ids` and `attention_mask` (n, sequence) INT64, the sequence 1 to
  384 (`PadToBuckets` over buckets 32, 64, 128, 256, 384); output `pooled` (n, 768) FP32.
  One-row requests at 32, 128 and 384 tokens, and of lengths mixed uniformly over 16..384.

Each row of the report: raw (the slots driven directly at the batch size, one thread each,
as the batcher drives them) and served (the real runtime, `kubeinfer serve`'s path past
loading the engine on the Rust data plane, `engine_server.serve_engine`, in its own
process, loaded by Triton's perf_analyzer over loopback),
the served/raw ratio, rows and bytes per second through the data path (request and
response tensors), the served batches' mean size, p50/p99 at the client, the server
process's CPU in cores, and the GPU's utilisation read by nvidia-smi meanwhile. For each
raw batch: a batch's copies alone (H2D and D2H, no compute), a batch on one slot, and the
share of the copy time that a second slot's compute hid (1 - (t2 - tk) / tc, with t2 the
time per batch with two slots, tk the compute alone and tc the copies alone).

`--profile FILE` samples the server with py-spy (per thread, 100 Hz) during the ResNet-50
FP32 loads at the largest batch (HTTP into FILE, gRPC into FILE-grpc), and prints where
the busiest thread's time went.

`--dry-run` runs everything on a CPU with a stand-in for pycuda (the one the CPU tests
use; copies are not made, the compute does nothing, outputs are zeros): the server, the
perf_analyzer command lines, the metrics and the report. It checks the script, not a GPU.

`--baseline REV` serves the ResNet-50 FP32 rows again with the runtime of an earlier
commit (c80431e: the last one served through the Python data plane, which it is served
on where it has it; `engine_server.baseline_plane`) and the same engine: before and after,
in one run. REV is a commit, checked out once as a detached `git worktree` at
`.bench/baseline-<rev>` and reused, or a directory holding a checkout or a `git archive`
of its packages (a machine without the repository: carry one); the baseline's server is
this Python with a folder linking to its packages first on PYTHONPATH, checked in a child
before anything runs (`checkout_site`). `--compare ROUNDS` runs only that comparison, the
two in turns (with `--dry-run`, the data path alone on a CPU); `--plan` prints the rows
and the servers' command lines and stops:

    python tests/benchmarks/gpu_data_path.py --dry-run --baseline c80431e --compare 5
    mkdir -p .baseline/c80431e    # a baseline to carry to a machine without the repository
    git archive c80431e runtime contract cli | tar -x -C .baseline/c80431e

`python gpu_data_path.py serve --workload W --config FILE [--data-plane python]` is the
server process alone.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
from checkout_site import baseline_checkout, imports_from, package_links  # noqa: E402
from engine_server import PLANES, baseline_plane  # noqa: E402
from gpu_served import metric_values, nvidia_smi_memory, process_cpu_seconds  # noqa: E402
from kubeinfer.runtime.engines.base import EngineBase  # noqa: E402

HOST = "127.0.0.1"
MODEL = "bench"
SEQUENCE_BUCKETS = [32, 64, 128, 256, 384]
MLPERF_RESNET50_SERVER_H100 = 73_000
"""MLPerf Inference's ResNet-50 server scenario, per H100, NVIDIA's TensorRT int8 harness
(inputs already on the device): the issue's reference figure, images per second."""


# ----------------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class Workload:
    name: str
    inputs: tuple[Any, ...]  # TensorSpec
    outputs: tuple[Any, ...]
    shape_batching: str = "EqualShapes"

    def row_bytes(self, length: int | None = None) -> int:
        """Request plus response bytes of one row (at `length` tokens where variable)."""
        total = 0
        for spec in (*self.inputs, *self.outputs):
            item = [length if d < 0 else d for d in spec.item_shape]
            total += math.prod(item) * spec.dtype.itemsize
        return total


def workload(name: str) -> Workload:
    from kubeinfer.runtime.engines.base import TensorSpec

    if name in ("resnet50-fp32", "resnet50-fp16"):
        wire = "FP32" if name.endswith("fp32") else "FP16"
        image = TensorSpec("input", wire, (-1, 3, 224, 224))
        return Workload(name, (image,), (TensorSpec("logits", "FP32", (-1, 1000)),))
    if name == "bert-base":
        longest = SEQUENCE_BUCKETS[-1]
        tokens = [
            TensorSpec(n, "INT64", (-1, -1), ("sequence",), (1,), (longest,))
            for n in ("input_ids", "attention_mask")
        ]
        pooled = TensorSpec("pooled", "FP32", (-1, 768))
        return Workload(name, tuple(tokens), (pooled,), "PadToBuckets")
    raise ValueError(f"unknown workload {name!r}")


# ----------------------------------------------------------------------------- the engine


class TorchSlotEngine(EngineBase):
    """An `Engine` whose slots are `CudaSlot`s and whose step is a PyTorch module launched on
    the slot's stream, reading the slot's device input buffers and writing its output
    buffer. The module and its weights are shared by the slots. A stand-in for TensorRT."""

    def __init__(self, load: Workload, max_batch_size: int, dry_run: bool = False) -> None:
        from kubeinfer.runtime.engines.cuda_streams import CudaContext

        self.load = load
        self._inputs, self._outputs = load.inputs, load.outputs
        self._max_batch_size = max_batch_size
        self.context = CudaContext(0)
        self.module = None if dry_run else self._module()
        self._slots: list[Any] = []

    def _module(self) -> Any:
        import torch

        torch.manual_seed(0)
        with self.context.active():
            if self.load.name.startswith("resnet50"):
                import torchvision

                module = torchvision.models.resnet50(weights=None)
                module = module.cuda().half().eval().to(memory_format=torch.channels_last)
            else:
                from transformers import BertConfig, BertModel

                module = BertModel(BertConfig(), add_pooling_layer=True).cuda().half().eval()
            torch.cuda.synchronize()  # the slots' non-blocking streams do not wait for it
        return module

    @property
    def default_execution_slots(self) -> int:
        return 2

    def create_slot(self, compute: bool = True) -> Any:
        """A slot; `compute=False` leaves the step out (its copies alone, for timing)."""
        from kubeinfer.runtime.engines.cuda_streams import CudaSlot

        holder: list[Callable[[int, Any], None]] = [lambda n, s: None]
        slot = CudaSlot(
            self.context, self.inputs, self.outputs, self._max_batch_size,
            lambda n, s: holder[0](n, s),
        )  # fmt: skip
        if compute and self.module is not None:
            holder[0] = self._step(slot)
        self._slots.append(slot)
        return slot

    def _step(self, slot: Any) -> Callable[[int, Any], None]:
        import torch

        flat = {
            name: device_tensor(pointer, spec, self._max_batch_size, slot)
            for spec in self.inputs
            for name, pointer in slot.input_pointers.items()
            if name == spec.name
        }
        [out_spec] = self.outputs
        out = device_tensor(
            slot.output_pointers[out_spec.name], out_spec, self._max_batch_size, slot
        )
        stream = torch.cuda.ExternalStream(slot.stream_handle)
        module = self.module

        if self.load.name.startswith("resnet50"):

            def step(n: int, _slot: Any) -> None:
                with torch.inference_mode(), torch.cuda.stream(stream):
                    images = flat["input"][: n * 3 * 224 * 224].view(n, 3, 224, 224)
                    images = images.half().contiguous(memory_format=torch.channels_last)
                    out[: n * 1000].view(n, 1000).copy_(module(images))

            return step

        def step(n: int, slot: Any) -> None:
            [(length,), _] = slot.batch_shape
            with torch.inference_mode(), torch.cuda.stream(stream):
                ids = flat["input_ids"][: n * length].view(n, length)
                mask = flat["attention_mask"][: n * length].view(n, length)
                pooled = module(input_ids=ids, attention_mask=mask).pooler_output
                out[: n * 768].view(n, 768).copy_(pooled)

        return step

    def reference(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """The module on the default stream from host arrays: what a slot should return."""
        import torch

        with self.context.active(), torch.inference_mode():
            if self.load.name.startswith("resnet50"):
                images = torch.as_tensor(feeds["input"]).cuda().half()
                result = self.module(images.contiguous(memory_format=torch.channels_last))
            else:
                tensors = {k: torch.as_tensor(v).cuda() for k, v in feeds.items()}
                result = self.module(**tensors).pooler_output
            return result.float().cpu().numpy()

    def close(self) -> None:
        for slot in self._slots:
            slot.close()
        self._slots.clear()


def device_tensor(pointer: int, spec: Any, max_batch_size: int, owner: object) -> Any:
    """A flat torch tensor over a slot's device buffer (the largest batch's elements),
    through CuPy's view of the pointer (`__cuda_array_interface__`, no copy)."""
    import cupy  # type: ignore[import-not-found]
    import torch

    largest = spec.largest_item_shape
    count = max_batch_size * math.prod(largest)
    memory = cupy.cuda.UnownedMemory(pointer, count * spec.dtype.itemsize, owner)
    array = cupy.ndarray((count,), spec.dtype, cupy.cuda.MemoryPointer(memory, 0))
    return torch.as_tensor(array, device="cuda")


def sample_rows(load: Workload, rows: int, length: int | None, seed: int) -> dict[str, np.ndarray]:
    """Valid inputs: images of normal noise; token ids within BERT's vocabulary, unmasked."""
    rng = np.random.default_rng(seed)
    if load.name.startswith("resnet50"):
        [spec] = load.inputs
        return {"input": rng.standard_normal((rows, 3, 224, 224)).astype(spec.dtype)}
    assert length is not None
    ids = rng.integers(1000, 30000, (rows, length), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones((rows, length), np.int64)}


# ----------------------------------------------------------------------------- raw


def batch_seconds(slots: list[Any], n: int, shape: Any, seconds: float) -> float:
    """Seconds per batch with one thread per slot, each running `n` rows back to back."""
    from gpu_slots import throughput

    return 1 / throughput(slots, n, seconds, shape)


def raw(engine: TorchSlotEngine, n: int, length: int | None, seconds: float) -> dict[str, Any]:
    shape = None if length is None else ((length,), (length,))
    feeds = sample_rows(engine.load, n, length, seed=1)
    slots = [engine.create_slot() for _ in range(2)]
    copies = engine.create_slot(compute=False)
    for slot in (*slots, copies):
        for name, view in slot.input_views(n, shape).items():
            view[...] = feeds[name]
    [out_spec] = engine.outputs
    got = slots[0].run(n, shape)[out_spec.name].copy()
    error = None
    if engine.module is not None:
        expected = engine.reference(feeds)
        error = float(np.max(np.abs(got - expected)) / (np.max(np.abs(expected)) or 1))
    copy_s = batch_seconds([copies], n, shape, seconds / 4)
    one_s = batch_seconds(slots[:1], n, shape, seconds / 4)
    two_s = batch_seconds(slots, n, shape, seconds / 2)
    compute_s = max(one_s - copy_s, 1e-9)
    hidden = 1 - (two_s - compute_s) / copy_s if copy_s > 0 else float("nan")
    for slot in (*slots, copies):
        slot.close()
        engine._slots.remove(slot)
    return {
        "rows_per_s": n / two_s, "batch_ms_two_slots": two_s * 1e3,
        "batch_ms_one_slot": one_s * 1e3, "copy_ms": copy_s * 1e3,
        "copy_hidden": min(1.0, max(0.0, hidden)), "max_relative_error": error,
    }  # fmt: skip


# ----------------------------------------------------------------------------- served


def serve_main(argv: list[str]) -> int:
    """The runtime's serving path (`engine_server.serve_engine`: `kubeinfer serve`'s past
    loading the engine), with this file's engine."""
    from engine_server import serve_engine
    from kubeinfer.contract.runtime_config import RuntimeConfig

    parser = argparse.ArgumentParser(prog="gpu_data_path.py serve")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--data-plane", choices=PLANES, default="rust")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.dry_run:
        install_pycuda_stand_in()
    config = RuntimeConfig.model_validate(yaml.safe_load(args.config.read_text()))
    engine = TorchSlotEngine(workload(args.workload), config.batching.max_batch_size, args.dry_run)
    try:
        return serve_engine(config, engine, args.data_plane, gpu_memory=not args.dry_run)
    finally:
        engine.close()


def runtime_config(load: Workload, port: int, grpc_port: int, batch: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        "modelName": MODEL,
        "engine": {"onnxPath": "unused: the engine is gpu_data_path.TorchSlotEngine"},
        "host": HOST, "httpPort": port, "grpcPort": grpc_port,
        "maxRequestBytes": 256 * 1024 * 1024,
        "batching": {
            "maxBatchSize": batch, "maxQueueDelayMicroseconds": 2000, "executionSlots": 2,
            "maxQueueSize": 100_000, "defaultTimeoutMilliseconds": 120_000,
            "shapeBatching": load.shape_batching,
        },
    }  # fmt: skip
    if load.shape_batching == "PadToBuckets":
        config["batching"]["shapeBuckets"] = SEQUENCE_BUCKETS
        config["inputShapes"] = [
            {"name": spec.name, "minShape": [1], "optShape": [128],
             "maxShape": [SEQUENCE_BUCKETS[-1]], "padValue": 0}
            for spec in load.inputs
        ]  # fmt: skip
    return config


@dataclass
class Probe:
    """What is read around one measured run: the server's CPU, its batch histogram, the
    GPU's utilisation (nvidia-smi, sampled every 200 ms)."""

    pid: int
    metrics_url: str
    cpu: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    batches: list[dict[str, float]] = field(default_factory=list)
    sampler: subprocess.Popen[str] | None = None

    def __call__(self) -> None:
        from kubeinfer.cli.tune.server import http_get

        self.cpu.append(process_cpu_seconds(Path(f"/proc/{self.pid}/stat")))
        self.times.append(time.monotonic())
        _, text = http_get(self.metrics_url, timeout=10)
        self.batches.append(metric_values(text.decode(), "kubeinfer_batch_size"))
        if self.sampler is None:
            query = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
            try:
                self.sampler = subprocess.Popen(
                    [*query, "-lms", "200"], stdout=subprocess.PIPE, text=True
                )
            except OSError:
                self.sampler = None
        else:
            self.sampler.terminate()

    def figures(self) -> dict[str, float | None]:
        gpu = None
        if self.sampler is not None:
            out, _ = self.sampler.communicate(timeout=10)
            values = [float(v) for v in out.split() if v.strip().isdigit()]
            gpu = sum(values) / len(values) if values else None
        before, after = self.batches
        count = after.get("_count", 0) - before.get("_count", 0)
        rows = after.get("_sum", 0) - before.get("_sum", 0)
        span = self.times[1] - self.times[0]
        return {
            "mean_batch_rows": rows / count if count else None,
            "server_cpu_cores": (self.cpu[1] - self.cpu[0]) / span if span > 0 else None,
            "gpu_utilisation_percent": gpu,
        }


@dataclass(frozen=True)
class LoadPoint:
    protocol: str  # http or grpc
    rows: int
    concurrency: int
    length: int | None = None  # tokens; None with `mixed` or a fixed-shape model
    mixed: bool = False  # lengths drawn uniformly from 16..384

    @property
    def label(self) -> str:
        tokens = "mixed" if self.mixed else self.length
        where = f", {tokens} tokens" if tokens is not None else ""
        return f"{self.protocol}, {self.rows} row(s) x {self.concurrency} clients{where}"


def measure(load: Workload, point: LoadPoint, server: Any, args: Any, workdir: Path) -> dict:
    from kubeinfer.cli.tune import perf

    port = server.spec.port if point.protocol == "http" else server.grpc_port
    target = perf.Target(f"{HOST}:{port}", MODEL, protocol=point.protocol)
    samples = None
    if load.name == "bert-base":
        lengths = (
            np.random.default_rng(3).integers(16, 385, 64) if point.mixed else [point.length] * 8
        )
        samples = [
            {k: v[0] for k, v in sample_rows(load, 1, int(n), seed=i).items()}
            for i, n in enumerate(lengths)
        ]
    probe = Probe(server.process.pid, f"http://{HOST}:{server.spec.port}/metrics")
    profile = None
    if args.profile_this:
        output = profile_path(args.profile, point.protocol)
        profile = start_profile(server.process.pid, args.window * 3 + 2, output)
    try:
        result = perf.run(
            target, perf.Load(rows=point.rows, concurrency=point.concurrency), samples,
            args.window, workdir, args.warmup, around=probe,
        )  # fmt: skip
        figures = probe.figures()
    finally:
        if probe.sampler is not None and probe.sampler.poll() is None:
            probe.sampler.kill()
        if profile is not None:
            profile.wait(timeout=60)
    mean_length = None
    if load.name == "bert-base":
        mean_length = float(np.mean([s["input_ids"].shape[0] for s in samples or []]))
    row_bytes = load.row_bytes(None if mean_length is None else round(mean_length))
    return {
        "rows_per_s": result.rows_per_second, "bytes_per_s": result.rows_per_second * row_bytes,
        "p50_ms": result.p50_milliseconds, "p99_ms": result.p99_milliseconds,
        "client_cpu_s": result.client_cpu_seconds, **figures,
    }  # fmt: skip


class Server:
    """This file's server in its own process, with HTTP and gRPC ports."""

    def __init__(
        self, load: Workload, batch: int, workdir: Path, dry_run: bool,
        baseline: Path | None = None,
    ) -> None:  # fmt: skip
        from kubeinfer.cli.tune.server import ServerProcess, ServerSpec, free_port

        port, self.grpc_port = free_port(), free_port()
        config = workdir / f"config-{load.name}-{batch}.yaml"
        config.write_text(yaml.safe_dump(runtime_config(load, port, self.grpc_port, batch)))
        command = [sys.executable, str(Path(__file__).resolve()), "serve"]
        command += ["--config", str(config), "--workload", load.name]
        command += ["--dry-run"] if dry_run else []
        command += ["--data-plane", "rust" if baseline is None else baseline_plane(baseline)]
        env = {} if baseline is None else {"PYTHONPATH": str(package_links(baseline, workdir))}
        label = f"{load.name}-{batch}" + ("-baseline" if baseline else "")
        self.command = command
        self.spec = ServerSpec(label, command, port, MODEL, env=env)
        self._process = ServerProcess(self.spec, workdir / "logs", ready_timeout_s=300)

    def __enter__(self) -> Server:
        self._process.__enter__()
        self.process = self._process.process
        return self

    def __exit__(self, *exc: object) -> None:
        self._process.__exit__(*exc)


# ----------------------------------------------------------------------------- profile


def start_profile(pid: int, seconds: float, output: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling every thread of the server (raw collapsed stacks), or None."""
    spy = Path(sys.executable).parent / "py-spy"
    binary = str(spy) if spy.exists() else "py-spy"
    command = [binary, "record", "--pid", str(pid), "--duration", str(round(seconds))]
    command += ["--rate", "100", "--threads", "--nonblocking", "--format", "raw"]
    try:
        return subprocess.Popen([*command, "--output", str(output)], stderr=subprocess.DEVNULL)
    except OSError:
        return None


def profile_path(profile: Path, protocol: str) -> Path:
    """`--profile FILE` is the HTTP run's profile; the gRPC run's is FILE-grpc."""
    return (
        profile if protocol == "http" else profile.with_name(f"{profile.stem}-grpc{profile.suffix}")
    )


def profile_summary(path: Path, top: int = 12) -> list[str]:
    """Per thread, its samples; for the busiest thread, where they ended (the leaf
    function), most first."""
    if not path.is_file():
        return ["no profile (py-spy missing or refused)"]
    threads: collections.Counter[str] = collections.Counter()
    leaves: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not count.isdigit() or len(frames) < 2:
            continue
        thread = frames[0].split(": ", 1)[-1]  # "thread (1234): MainThread"
        threads[thread] += int(count)
        leaves[thread][frames[-1]] += int(count)
    if not threads:
        return ["the profile is empty"]
    lines = [f"{name}: {n} samples" for name, n in threads.most_common()]
    busiest, total = threads.most_common(1)[0]
    lines.append(f"where {busiest}'s samples ended:")
    for frame, n in leaves[busiest].most_common(top):
        lines.append(f"  {100 * n / total:5.1f} %  {frame}")
    return lines


# ----------------------------------------------------------------------------- the plan


def plan(quick: bool) -> list[tuple[str, int, list[LoadPoint]]]:
    """(workload, maxBatchSize, loads): the rows of the report, in order."""

    def both(rows: int, clients: int, **kw: Any) -> list[LoadPoint]:
        return [LoadPoint("http", rows, clients, **kw), LoadPoint("grpc", rows, clients, **kw)]

    if quick:
        return [
            ("resnet50-fp32", 64, both(8, 16)),
            ("bert-base", 8, [LoadPoint("http", 1, 16, mixed=True)]),
        ]
    return [
        ("resnet50-fp32", 256, both(8, 64)),
        ("resnet50-fp32", 32, both(1, 64)),
        ("resnet50-fp32", 1, [LoadPoint("http", 1, 4)]),
        ("resnet50-fp16", 256, both(8, 64)),
        ("bert-base", 64, [
            *both(1, 128, length=128), LoadPoint("http", 1, 128, length=32),
            LoadPoint("http", 1, 128, length=384), LoadPoint("http", 1, 128, mixed=True),
        ]),
    ]  # fmt: skip


def plan_text(args: argparse.Namespace) -> str:
    """`--plan`: the rows in order, and the command line of each server (this checkout's
    runtime and, with `--baseline`, the baseline's), as the run would start them."""
    lines = []
    for name, batch, points in plan(args.quick):
        sides = [("after", None)]
        if args.baseline is not None and name == "resnet50-fp32" and batch != 1:
            sides.append(("before", args.baseline))
        lines.append(f"{name}, maxBatchSize {batch}: " + "; ".join(p.label for p in points))
        for side, checkout in sides:
            server = Server(workload(name), batch, args.workdir, args.dry_run, checkout)
            path = server.spec.env.get("PYTHONPATH")
            lines.append(f"  {side}: " + (f"PYTHONPATH={path} " if path else "")
                         + " ".join(server.command))  # fmt: skip
    return "\n".join(lines)


def baseline_rows(args: argparse.Namespace, raws: dict[Any, Any], results: dict) -> None:
    """The ResNet-50 FP32 rows again, served by the runtime in `--baseline` (the same
    engine): the data path before a change against after it, in one run on one GPU."""
    for name, batch, points in plan(args.quick):
        if name != "resnet50-fp32" or batch == 1:
            continue
        load = workload(name)
        with Server(load, batch, args.workdir, args.dry_run, args.baseline) as server:
            for point in points:
                args.profile_this = False
                try:
                    served = measure(load, point, server, args, args.workdir / "perf")
                except Exception as error:
                    served = {"error": repr(error)}
                base = raws[(name, batch, None)]
                if "rows_per_s" in served and "rows_per_s" in base:
                    served["served_over_raw"] = served["rows_per_s"] / base["rows_per_s"]
                plane = baseline_plane(args.baseline)
                label = f"{point.label} (before: {args.baseline.name}, its {plane} data plane)"
                results["rows"].append({"workload": name, "batch": batch, "load": label,
                                        "raw": base, "served": served})  # fmt: skip
                print(f"{label}: {served}", flush=True)


def compare(args: argparse.Namespace) -> str:
    """`--compare ROUNDS`: ResNet-50 FP32 over `--compare-protocol` (requests of 8 images,
    64 clients, maxBatchSize 256) served by this checkout's runtime and by `--baseline`'s, in turns,
    ROUNDS times each; the median rows/s of each and their ratio. With `--dry-run` the
    engine does nothing, so what is compared is the data path alone, on a CPU."""
    load, point = workload("resnet50-fp32"), LoadPoint(args.compare_protocol, 8, 64)
    rates: dict[str, list[float]] = {"after": [], "before": []}
    cores: dict[str, list[float]] = {"after": [], "before": []}
    for _ in range(args.compare):
        for side, checkout in (("after", None), ("before", args.baseline)):
            with Server(load, 256, args.workdir, args.dry_run, checkout) as server:
                args.profile_this = False
                served = measure(load, point, server, args, args.workdir / "perf")
            rates[side].append(served["rows_per_s"])
            cores[side].append(served["server_cpu_cores"] or float("nan"))
            print(f"{side}: {served['rows_per_s']:.0f} rows/s", flush=True)
    after, before = (float(np.median(rates[k])) for k in ("after", "before"))
    return (
        f"ResNet-50 FP32, {point.label}, {args.compare} rounds in turns "
        f"({'data path alone, no GPU' if args.dry_run else 'on the GPU'}):\n"
        f"  before ({args.baseline.name}, its {baseline_plane(args.baseline)} data plane): "
        f"median {before:,.0f} rows/s "
        f"({float(np.median(cores['before'])):.2f} server cores), rounds {rates['before']}\n"
        f"  after: median {after:,.0f} rows/s "
        f"({float(np.median(cores['after'])):.2f} server cores), rounds {rates['after']}\n"
        f"  after / before: {after / before:.2f}"
    )


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"rows": [], "device": None}
    workdir = args.workdir
    profiled: set[str] = set()
    all_raws: dict[Any, Any] = {}
    for name, batch, points in plan(args.quick):
        load = workload(name)
        print(f"\n== {name}, maxBatchSize {batch}", flush=True)
        engine = TorchSlotEngine(load, batch, args.dry_run)
        results["device"] = engine.context.device.name()
        raws: dict[int | None, Any] = {}
        for length in sorted({raw_length(load, p) for p in points}, key=lambda v: v or 0):
            try:
                raws[length] = raw(engine, batch, length, args.raw_seconds)
            except Exception as error:  # a failed row is reported, the rest still run
                raws[length] = {"error": repr(error)}
            print(f"raw at {batch} rows, {length or ''} tokens: {raws[length]}", flush=True)
            all_raws[(name, batch, length)] = raws[length]
        engine.close()
        del engine
        release_device_memory(args.dry_run)
        with Server(load, batch, workdir, args.dry_run) as server:
            for point in points:
                args.profile_this = (
                    bool(args.profile)
                    and point.protocol not in profiled
                    and name == "resnet50-fp32"
                )
                if args.profile_this:
                    profiled.add(point.protocol)
                try:
                    served = measure(load, point, server, args, workdir / "perf")
                except Exception as error:
                    served = {"error": repr(error)}
                base = raws[raw_length(load, point)]
                if "rows_per_s" in served and "rows_per_s" in base:
                    served["served_over_raw"] = served["rows_per_s"] / base["rows_per_s"]
                row = {"workload": name, "batch": batch, "load": point.label, "raw": base,
                       "served": served}  # fmt: skip
                results["rows"].append(row)
                print(f"{point.label}: {served}", flush=True)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=2, default=str))
            results.setdefault("gpu_memory", nvidia_smi_memory())
    if args.baseline is not None:
        baseline_rows(args, all_raws, results)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2, default=str))
    return results


def raw_length(load: Workload, point: LoadPoint) -> int | None:
    """The tokens the raw row compared with a served one runs at (mixed: 128)."""
    return (point.length or 128) if load.name == "bert-base" else None


def release_device_memory(dry_run: bool) -> None:
    if not dry_run:
        import torch

        torch.cuda.empty_cache()


def report(results: dict[str, Any], profile: Path | None) -> str:
    lines = [f"device: {results['device']}", ""]
    lines.append("| workload | maxBatch | load | raw rows/s | served rows/s | served/raw | "
                 "MB/s served | mean batch | p50 / p99 ms | server cores | GPU % | "
                 "copy ms / batch | copy hidden |")  # fmt: skip
    lines.append("|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")

    def num(value: Any, form: str) -> str:
        return "-" if value is None or isinstance(value, str) else format(value, form)

    for row in results["rows"]:
        r, s = row["raw"], row["served"]
        if "error" in s:
            lines.append(f"| {row['workload']} | {row['batch']} | {row['load']} | "
                         f"failed: {s['error'][:120]} |")  # fmt: skip
            continue
        lines.append(
            f"| {row['workload']} | {row['batch']} | {row['load']} | "
            f"{num(r.get('rows_per_s'), ',.0f')} | {num(s['rows_per_s'], ',.0f')} | "
            f"{num(s.get('served_over_raw'), '.2f')} | {num(s['bytes_per_s'] / 1e6, ',.0f')} | "
            f"{num(s['mean_batch_rows'], '.1f')} | "
            f"{num(s['p50_ms'], '.1f')} / {num(s['p99_ms'], '.1f')} | "
            f"{num(s['server_cpu_cores'], '.2f')} | {num(s['gpu_utilisation_percent'], '.0f')} | "
            f"{num(r.get('copy_ms'), '.2f')} | {num(r.get('copy_hidden'), '.0%')} |"
        )
    errors = [r["raw"].get("max_relative_error") for r in results["rows"]]
    known = [e for e in errors if isinstance(e, float)]
    if known:
        lines.append(f"\nslot vs the module run directly: max relative error {max(known):.1e}")
    best = max((r["served"].get("rows_per_s", 0) for r in results["rows"]
                if r["workload"].startswith("resnet50")), default=0)  # fmt: skip
    lines.append(f"best ResNet-50 served: {best:,.0f} images/s, "
                 f"{best / MLPERF_RESNET50_SERVER_H100:.3f} of MLPerf's "
                 f"{MLPERF_RESNET50_SERVER_H100:,} per H100")  # fmt: skip
    if profile is not None:
        for protocol in ("http", "grpc"):
            lines += ["", f"profile of the server (ResNet-50 FP32, {protocol}, largest batch):"]
            lines += profile_summary(profile_path(profile, protocol))
    return "\n".join(lines)


def install_pycuda_stand_in() -> None:
    """`--dry-run`: the CPU tests' stand-in for pycuda.driver, no device behind it."""
    sys.path.insert(0, str(BENCHMARKS.parent / "runtime"))
    from test_gpu_fixes import fake_pycuda  # type: ignore[import-not-found]

    driver = fake_pycuda([], (("no device: a dry run", (0, 0)),))
    package = type(sys)("pycuda")
    package.driver = driver  # type: ignore[attr-defined]
    sys.modules["pycuda"], sys.modules["pycuda.driver"] = package, driver


def main() -> int:
    if sys.argv[1:2] == ["serve"]:
        return serve_main(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--profile", type=Path, help="py-spy's raw stacks of one served run")
    parser.add_argument("--quick", action="store_true", help="two small rows (a smoke run)")
    parser.add_argument("--dry-run", action="store_true", help="on a CPU, no CUDA (see above)")
    parser.add_argument("--warmup", type=float, default=1.5, help="seconds before measuring")
    parser.add_argument("--window", type=float, default=1.5, help="seconds per window (x3)")
    parser.add_argument("--raw-seconds", type=float, default=2.0)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument(
        "--compare", type=int, default=0, metavar="ROUNDS",
        help="only the before/after comparison (see `compare`), this many rounds in turns",
    )  # fmt: skip
    parser.add_argument("--compare-protocol", choices=("http", "grpc"), default="http")
    parser.add_argument(
        "--baseline", metavar="REV",
        help="an earlier commit (say c80431e, its worktree at .bench/baseline-<rev>) or a "
        "checkout's directory: its runtime serves the ResNet-50 FP32 rows again",
    )  # fmt: skip
    parser.add_argument(
        "--plan", action="store_true", help="print the rows and the servers' commands, and stop"
    )
    args = parser.parse_args()
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpu-data-path-"))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if args.baseline is not None:
        args.baseline = baseline_checkout(args.baseline)
        site = package_links(args.baseline, args.workdir)
        print(f"baseline {args.baseline}:\n{imports_from(site, args.baseline)}", flush=True)
    if args.plan:
        print(plan_text(args))
        return 0
    if args.dry_run:
        install_pycuda_stand_in()
    if args.compare:
        if args.baseline is None:
            parser.error("--compare needs --baseline")
        print(compare(args))
        return 0
    results = run_all(args)
    text = report(results, args.profile)
    print("\n" + text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
