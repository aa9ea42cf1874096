"""What `bench_shadow.py` and `bench_quality_watch.py` share: the demo MLP built at fp32
and int8 through the engine cache, the mirror target file rewritten as kubelet does, the
pinning, one measured window of closed-loop load with the CPU of chosen processes, the
rotating order of interleaved rounds, and the command line.

Pinning (`--pin`, the default): the serving runs alone on CPU 0, the mirror's other end
and this load generator share CPU 1, each server with one ONNX Runtime thread, so the
other end's work does not take the serving's core and the throughput ratio shows the
mirror's own cost; with `--no-pin` all share both cores (two threads each), as an unpinned
pod would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.building.engine_build import build_engine
from kubeinfer.runtime.demo_models import build_memory_bound_mlp, build_small_mlp
from loadgen import encode_json_infer, run_closed_loop
from servers import HOST, ServerSpec, http_get, link_source_tree

MODELS = {"small-mlp": (build_small_mlp, 512), "memory-bound-mlp": (build_memory_bound_mlp, 1024)}
_TICK = os.sysconf("SC_CLK_TCK")
T = TypeVar("T")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, every thread included."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of a running process onto `cpus` (threads it starts later inherit)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), cpus)


def parse_args(
    description: str,
    argv: list[str] | None = None,
    more: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """The common options, and the benchmark's own (`more`)."""
    parser = argparse.ArgumentParser(description=description)
    if more is not None:
        more(parser)
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke check)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--model", choices=sorted(MODELS), default="small-mlp")
    parser.add_argument("--duration", type=float, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, help="unmeasured seconds before each run")
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serving alone on CPU 0; the mirror's other end and load generator on CPU 1",
    )
    args = parser.parse_args(argv)
    args.duration = args.duration or (2.0 if args.quick else 5.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 1.0)
    if args.quick:
        args.rounds = min(args.rounds, 2)
    return args


def pinned_threads(args: argparse.Namespace) -> tuple[bool, int]:
    """Whether the servers are pinned, and the ONNX Runtime threads of each."""
    pinned = args.pin and len(os.sched_getaffinity(0)) >= 2
    return pinned, 1 if pinned else (os.cpu_count() or 1)


@dataclass
class Engines:
    model: Path
    width: int
    digests: dict[str, str]
    """Engine digest by precision (fp32, int8), in `cache`."""
    cache: Path


def build_engines(work: Path, model_name: str) -> Engines:
    """The demo model at fp32 and int8 (calibrated on 160 demo samples), through the
    engine cache under `work`."""
    builder, width = MODELS[model_name]
    model = work / f"{model_name}.onnx"
    if not model.exists():
        builder(model)
    calibration = write_demo_samples(model, work / f"{model_name}-calibration.npz", count=160)
    digests = {
        precision: build_engine(str(model), "onnxruntime", precision, work / "cache",
                                calibration=str(calibration) if precision == "int8" else None,
                                max_batch_size=32).digest
        for precision in ("fp32", "int8")
    }  # fmt: skip
    return Engines(model, width, digests, work / "cache")


def requests_for(port: int, model_name: str, width: int) -> list[bytes]:
    """16 single-item JSON infer requests of standard normal inputs."""
    items = np.random.default_rng(7).standard_normal((16, width)).astype(np.float32)
    return [encode_json_infer(HOST, port, model_name, "input", x) for x in items]


def write_mirror_file(path: Path, content: dict[str, Any] | None) -> None:
    """Replaces the mirror target file atomically, as kubelet does (None: empty, no mirror)."""
    staging = path.with_suffix(".tmp")
    staging.write_text("" if content is None else json.dumps(content))
    os.replace(staging, path)


def get_json(port: int, path: str) -> dict[str, Any]:
    status, body = http_get(f"http://{HOST}:{port}{path}")
    assert status == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


def wait_until(read: Callable[[], T], holds: Callable[[T], bool], what: str) -> T:
    """Polls `read()` until `holds` its value (10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        value = read()
        if holds(value):
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {value}")
        time.sleep(0.02)


@dataclass
class Window:
    """One measured window of closed-loop load."""

    throughput: float
    p50_ms: float
    p99_ms: float
    cpu_ms: list[float]
    """CPU per answered request of each process asked for, in milliseconds."""
    errors: int


def measure(args: argparse.Namespace, port: int, requests: list[bytes], pids: list[int]) -> Window:
    """`args.clients` closed-loop clients for `args.warmup` + `args.duration` seconds; the
    CPU of `pids` over the measured part."""
    marks: dict[str, list[float]] = {}

    def mark(name: str) -> None:
        marks[name] = [process_cpu_seconds(pid) for pid in pids]

    result = asyncio.run(
        run_closed_loop(
            HOST, port, requests, args.clients, args.warmup, args.duration,
            on_window_start=lambda: mark("start"), on_window_end=lambda: mark("end"),
        )
    )  # fmt: skip
    done = max(1, result.completed + result.errors)
    spent = zip(marks["start"], marks["end"], strict=True)
    return Window(
        throughput=result.throughput,
        p50_ms=result.percentile_ms(50),
        p99_ms=result.percentile_ms(99),
        cpu_ms=[(end - start) / done * 1000 for start, end in spent],
        errors=result.errors,
    )


def rotations(conditions: Sequence[T], rounds: int) -> Iterator[tuple[int, list[T]]]:
    """Each round's order: the conditions rotated by one more each round, so drift on a
    shared machine falls on every condition alike."""
    for index in range(rounds):
        shift = index % len(conditions)
        yield index, [*conditions[shift:], *conditions[:shift]]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def from_tree(spec: ServerSpec, tree: Path, scratch: Path) -> ServerSpec:
    """The same `kubeinfer` server run from the source tree at `tree` (say a `git archive`
    of an older commit), through a `kubeinfer` package of links under `scratch` on
    PYTHONPATH, so a before and an after run side by side in one benchmark."""
    assert Path(spec.command[0]).name == "kubeinfer", spec.command
    spec.command = [sys.executable, "-m", "kubeinfer.cli", *spec.command[1:]]
    spec.env = {**spec.env, "PYTHONPATH": str(link_source_tree(tree, scratch))}
    return spec
