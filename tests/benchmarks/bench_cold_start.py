"""What a cold start from zero costs on the real node, and where the time goes (a benchmark
script, not a test).

    .venv/bin/python tests/benchmarks/bench_cold_start.py [--rounds 3] [--model small|heavy]

Runs `kubeinfer up`'s session in-process (as `make demo` does: the operator and two
activator pods in pods of the project's images), applies one model with `minReplicas: 0`
and then, each round, waits for it to reach zero pods (its last pod gone), sends one
request to its Service's ClusterIP and times its answer. While it waits it polls the
serving pods every 50 ms (when a pod is first listed, first running, first Ready) and reads
the pod's log lines that time the engine's load and the start of serving, so each round
splits into:

- wake: the request sent to the pod created (the activator holds it, asks the operator,
  which scales the Deployment; the ReplicaSet controller creates the pod);
- pod start: created to its container running (scheduling, sandbox, network, image);
- process to engine: the container running to the engine loaded (Python's imports, the
  engine file's digest checked, ONNX Runtime's session), of which the engine's own load is
  what `kubeinfer serve` logs as `Engine loaded in`;
- checks and server: the engine loaded to serving (the known-answer check, the batching
  probe, the Rust server's start);
- to the answer: serving to the answer (the readiness probe passing, the activator's
  probe seeing it, the forward, the first batch).

The first apply is timed too, from the apply to the first answer: the engine is not in the
cache then, so the operator's build Job makes it first. Builds nothing itself: the binaries
and images are built (or found) first, as `make demo` does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import onnx
from kubeinfer.cli.demo.story import Models, manifest
from kubeinfer.cli.local.session import LocalSession
from kubeinfer.operator.state import names
from report import rounds_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # waiting
from waiting import eventually

NAME = "cold"
NAMESPACE = "default"
WINDOW_SECONDS = 10
SERVING = f"app.kubernetes.io/instance={NAME},kubeinfer.io/role=serving"
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
ENGINE_LOADED = re.compile(r"Engine loaded in ([0-9.]+) s")
SERVING_LINE = re.compile(r"Serving through the Rust data plane .*known_answers_seconds=")


def spec_of(model: Path) -> dict[str, Any]:
    return {
        "model": {"name": NAME, "version": "1", "source": {"uri": f"file://{model}"}},
        "engine": {"backend": "onnxruntime", "precision": "fp32", "maxBatchSize": 8},
        "runtime": {"batching": {"maxBatchSize": 8}},
        "autoscaling": {
            "enabled": True, "minReplicas": 0, "maxReplicas": 1,
            "scaleToZeroAfterSeconds": WINDOW_SECONDS,
        },
    }  # fmt: skip


def body_for(model: Path) -> dict[str, Any]:
    """One row of the model's one input (the demo models' width differs)."""
    (declared,) = onnx.load(str(model), load_external_data=False).graph.input
    width = declared.type.tensor_type.shape.dim[1].dim_value
    rows = np.random.default_rng(3).standard_normal((1, width)).astype(np.float32)
    return {"inputs": [{"name": declared.name, "shape": [1, width], "datatype": "FP32",
                        "data": rows.ravel().tolist()}]}  # fmt: skip


@dataclass
class PodTimes:
    """When (time.time()) this benchmark first saw the pod listed, running, Ready."""

    listed: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)
    ready: dict[str, float] = field(default_factory=dict)


async def watch_pods(session: LocalSession, seen: PodTimes, stop: asyncio.Event) -> None:
    while not stop.is_set():
        listing = json.loads(await session.kubectl("-n", NAMESPACE, "get", "pods", "-l",
                                                   SERVING, "-o", "json"))  # fmt: skip
        now = time.time()
        for pod in listing["items"]:
            name = pod["metadata"]["name"]
            seen.listed.setdefault(name, now)
            status = pod.get("status") or {}
            states = [c.get("state") or {} for c in status.get("containerStatuses") or []]
            if states and all("running" in s for s in states):
                seen.running.setdefault(name, now)
            conditions = status.get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                seen.ready.setdefault(name, now)
        await asyncio.sleep(0.05)


def log_time(line: str) -> float | None:
    found = LOG_TIME.match(line)
    if found is None:
        return None
    stamp = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f")
    return stamp.replace(tzinfo=UTC).timestamp()  # the pods log in UTC


async def start_lines(session: LocalSession, pod: str) -> tuple[float, float, float]:
    """(engine loaded at, its own load seconds, serving at) from the pod's log."""
    text = await session.kubectl("-n", NAMESPACE, "logs", pod, "-c", "runtime")
    loaded = loaded_seconds = serving = None
    for line in text.splitlines():
        if (found := ENGINE_LOADED.search(line)) is not None:
            loaded, loaded_seconds = log_time(line), float(found.group(1))
        elif SERVING_LINE.search(line):
            serving = log_time(line)
    if loaded is None or loaded_seconds is None or serving is None:
        raise SystemExit(f"{pod}'s log lacks its start lines:\n{text[-2000:]}")
    return loaded, loaded_seconds, serving


async def ask(url: str, body: dict[str, Any], timeout_seconds: float = 150) -> int:
    timeout = aiohttp.ClientTimeout(total=timeout_seconds)
    async with aiohttp.ClientSession(timeout=timeout) as client:
        async with client.post(url, json=body) as answer:
            await answer.read()
            return answer.status


async def first_answer(url: str, body: dict[str, Any]) -> None:
    async def answered() -> bool:
        try:  # kube-proxy refuses a new ClusterIP until it has programmed it
            status = await ask(url, body, 10)
            if 400 <= status < 500:
                raise SystemExit(f"the first request was refused {status}")
            return status == 200
        except (TimeoutError, aiohttp.ClientError):
            return False

    await eventually(answered, 600, "the first answer", every=0.2)


async def at_zero(session: LocalSession) -> None:
    async def zero() -> bool:
        infd = json.loads(await session.kubectl("-n", NAMESPACE, "get", "infd", NAME,
                                                "-o", "json"))  # fmt: skip
        conditions = (infd.get("status") or {}).get("conditions") or []
        scaled = any(c["type"] == "ScaledToZero" and c["status"] == "True" for c in conditions)
        pods = json.loads(await session.kubectl("-n", NAMESPACE, "get", "pods", "-l", SERVING,
                                                "-o", "json"))["items"]  # fmt: skip
        return scaled and not pods

    await eventually(zero, 300, "zero pods, the last one gone", every=0.2)


async def one_round(session: LocalSession, url: str, body: dict[str, Any]) -> dict[str, float]:
    seen, stop = PodTimes(), asyncio.Event()
    watcher = asyncio.create_task(watch_pods(session, seen, stop))
    try:
        sent = time.time()
        status = await ask(url, body)
        answered = time.time()
    finally:
        stop.set()
        await watcher
    if status != 200:
        raise SystemExit(f"the request from zero was answered {status}")
    (pod,) = [name for name, at in seen.listed.items() if at >= sent - 0.05] or [None]
    if pod is None or pod not in seen.running:
        raise SystemExit(f"no pod was seen starting for the request: {seen}")
    loaded, engine_seconds, serving = await start_lines(session, pod)
    return {
        "cold start (sent to answered)": answered - sent,
        "wake (sent to pod listed)": seen.listed[pod] - sent,
        "pod start (listed to running)": seen.running[pod] - seen.listed[pod],
        "process to engine loaded": loaded - seen.running[pod],
        "  of which the engine's own load": engine_seconds,
        "checks and server (loaded to serving)": serving - loaded,
        "to the answer (serving to answered)": answered - serving,
        "over the engine's own load": answered - sent - engine_seconds,
    }


async def bench(session: LocalSession, model: Path, rounds: int) -> list[dict[str, float]]:
    await session.start()
    applied = time.monotonic()
    await session.apply([manifest(NAME, spec_of(model))])
    address = None
    while address is None:
        address = await session.service_address(NAMESPACE, names.service_name(NAME))
        await asyncio.sleep(0.2)
    url = f"http://{address[0]}:{address[1]}/v2/models/{NAME}/infer"
    body = body_for(model)
    await first_answer(url, body)
    uncached = time.monotonic() - applied
    print(f"first apply, the engine not in the cache (built first): first answer after "
          f"{uncached:.1f} s", flush=True)  # fmt: skip
    results = []
    for index in range(rounds):
        await at_zero(session)
        results.append(await one_round(session, url, body))
        said = ", ".join(f"{k.strip()} {v:.2f}" for k, v in results[-1].items())
        print(f"round {index + 1}: {said}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", choices=("small", "heavy"), default="small")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cold-start-", dir="/tmp") as name:
        folder = Path(name)
        models = Models.build(folder / "models")
        model = models.small if args.model == "small" else models.heavy
        print(f"model: {model.name} ({model.stat().st_size / 1e6:.1f} MB)", flush=True)
        session = LocalSession(folder / "session", say=lambda line: print(line, flush=True))
        session.prepare()

        async def run() -> list[dict[str, float]]:
            main = asyncio.current_task()
            if main is not None:  # SIGTERM as Ctrl-C: the session is stopped first
                asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
            try:
                return await bench(session, model, args.rounds)
            finally:
                await session.stop()

        results = asyncio.run(run())
    title = f"from zero, the engine in the cache ({args.model})"
    print("\n" + rounds_table(title, results, digits=2))


if __name__ == "__main__":
    main()
