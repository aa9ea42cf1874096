"""What `bench_shadow.py` and `bench_quality_watch.py` share: the demo MLP built at fp32
and int8 through the engine cache, the mirror target file rewritten as kubelet does, the
pinning, one measured run of closed-loop load (perf_analyzer's) with the CPU of chosen
processes, the rotating order of interleaved rounds, and the command line.

Pinning (`--pin`, the default): the serving runs alone on CPU 0, the mirror's other end
and this load generator share CPU 1, each server with one ONNX Runtime thread, so the
other end's work does not take the serving's core and the throughput ratio shows the
mirror's own cost; with `--no-pin` all share both cores (two threads each), as an unpinned
pod would.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from kubeinfer.cli.demo.mlp_models import build_memory_bound_mlp, build_small_mlp
from kubeinfer.cli.tune import perf
from kubeinfer.cli.tune.server_side import Snapshot, between, process_cpu_seconds, snapshot
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.building.engine_build import build_engine
from servers import (
    HOST,
    REPO,
    KubeinferSpec,
    ServerSpec,
    http_get,
    kubeinfer_spec,
    link_source_tree,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # waiting
from waiting import wait_for

MODELS = {"small-mlp": (build_small_mlp, 512), "memory-bound-mlp": (build_memory_bound_mlp, 1024)}
T = TypeVar("T")


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


def engine_spec(
    engines: Engines, model_name: str, threads: int, precision: str, label: str,
    mirror_file: Path | None = None,
) -> KubeinferSpec:  # fmt: skip
    """`kubeinfer serve` of the demo model's engine at `precision`, one execution slot;
    with `mirror_file`, mirroring as that file says (read every 100 ms)."""
    mirroring = (
        ()
        if mirror_file is None
        else (
            "--mirror-target-file",
            str(mirror_file),
            "--mirror-poll-interval-milliseconds",
            "100",
        )
    )
    spec = kubeinfer_spec(
        engines.model, model_name, threads, engine=(engines.digests[precision], engines.cache),
        extra_args=("--execution-slots", "1", *mirroring),
    )  # fmt: skip
    spec.label = label
    return spec


def empty_mirror_file(path: Path) -> Path:
    """A mirror target file that says: no mirror (yet)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    return path


def samples_for(model_name: str) -> list[dict[str, np.ndarray]]:
    """16 single-item inputs of standard normal values (perf_analyzer's input data)."""
    width = MODELS[model_name][1]
    items = np.random.default_rng(7).standard_normal((16, width)).astype(np.float32)
    return [{"input": x} for x in items]


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
    """`read()`'s value once `holds` it (10 s at most), through tests/support/waiting."""
    seen: list[T] = []

    def held() -> tuple[T] | None:
        seen.append(value := read())
        return (value,) if holds(value) else None  # a tuple: truthy whatever the value

    return wait_for(held, within=10, what=lambda: f"{what}: {seen[-1]}", every=0.02)[0]


@dataclass
class Window:
    """One measured run of closed-loop load."""

    throughput: float
    p50_ms: float
    p99_ms: float
    cpu_ms: list[float]
    """CPU per request the serving answered, of each process asked for, in milliseconds."""


def measure(
    args: argparse.Namespace, serving: ServerSpec, samples: list[dict[str, np.ndarray]],
    pids: list[int],
) -> Window:  # fmt: skip
    """perf_analyzer's `args.clients` closed-loop clients, single-item JSON requests, for
    `args.warmup` + `args.duration` seconds (three windows); the CPU of `pids` over the
    measured run, per request the serving answered in it (its own count)."""
    marks: list[tuple[float | None, Snapshot]] = []

    def mark() -> None:
        marks.append((process_cpu_seconds(pids[1:]) if pids[1:] else 0.0,
                      snapshot(pids[:1], serving.metrics_url, serving.model_name)))  # fmt: skip

    result = perf.run(
        perf.Target(f"{HOST}:{serving.port}", serving.model_name, "http", "json"),
        perf.Load(concurrency=args.clients), samples, args.duration / 3,
        REPO / ".bench" / "perf-analyzer" / serving.label, args.warmup, mark,
    )  # fmt: skip
    (others_before, before), (others_after, after) = marks
    side = between(before, after)
    answered = side.answered or 1.0
    others = (others_after or 0.0) - (others_before or 0.0)
    return Window(
        throughput=result.requests_per_second,
        p50_ms=result.p50_milliseconds,
        p99_ms=result.p99_milliseconds,
        cpu_ms=[(side.cpu_seconds or 0.0) / answered * 1000, others / answered * 1000],
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
