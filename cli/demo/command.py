"""`kubeinfer demo`: the product's story through the operator on a local cluster
(`story`); `kubeinfer demo --serving`: the runtime alone, without a cluster: validate the
examples, show what the operator would create, build the demo model's engines through
the cache, serve one with dynamic batching, drive load, and read the batcher's own
histogram back from /metrics. (Shadow tests and autoscaling need the operator: they are
the story's.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

MODEL_NAME = "demo"


def examples_dir() -> Path:
    """The example manifests: shipped in the package (`kubeinfer.cli.demo.examples`,
    package data mapped from the checkout's `examples/`), so the demo runs from any working
    directory; in an editable install of a checkout, that checkout's `examples/`."""
    packaged = Path(__file__).resolve().parent / "examples"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "examples"


def _step(title: str) -> None:
    print(f"\n== {title}\n", flush=True)


def show_manifests() -> bool:
    from kubeinfer.operator.commands.validate import validate_file

    ok = True
    for path in sorted(examples_dir().glob("*.yaml")):
        problems, valid = validate_file(path)
        for line in valid + problems:
            print(f"  {line}")
        ok = ok and not problems
    return ok


def show_children(path: Path) -> None:
    from kubeinfer.operator.api.manifest_loader import load_documents
    from kubeinfer.operator.commands.render import render_manifest

    children, _ = render_manifest(load_documents(path.read_bytes())[0])
    for child in children:
        detail = ""
        if child["kind"] == "Deployment":
            pod = child["spec"]["template"]["spec"]
            detail = (
                f"  replicas={child['spec']['replicas']}"
                f" args={' '.join(pod['containers'][0].get('args', []))}"
            )
        elif child["kind"] == "Job":
            detail = (
                f"  args={' '.join(child['spec']['template']['spec']['containers'][0]['args'])}"
            )
        print(f"  {child['kind']}/{child['metadata']['name']}{detail}")
    print(f"\n  (the full YAML: kubeinfer render {path})")


def build_engines(workdir: Path) -> tuple[dict[str, str], str]:
    """The demo model's fp32 and int8 engines; returns the digests and the cache."""
    from kubeinfer.cli.demo.mlp_models import build_small_mlp
    from kubeinfer.runtime.building.calibration import write_demo_samples
    from kubeinfer.runtime.building.engine_build import build_engine

    model = build_small_mlp(workdir / "models" / "small-mlp.onnx")
    calibration = write_demo_samples(model, workdir / "models" / "calibration.npz")
    cache = workdir / "cache"
    digests = {}
    print(f"  model {model} ({model.stat().st_size / 1e6:.1f} MB), cache {cache}")
    for precision in ("fp32", "int8"):
        started = time.perf_counter()
        result = build_engine(
            str(model),
            "onnxruntime",
            precision,
            cache,
            calibration=str(calibration) if precision == "int8" else None,
            max_batch_size=32,
        )
        took = time.perf_counter() - started
        state = "cache hit, nothing rebuilt" if result.cache_hit else "built"
        size = result.manifest.engine_bytes / 1e6
        print(f"  {precision}: {result.digest[:23]}...  {size:6.1f} MB  {state} in {took:.2f} s")
        digests[precision] = result.digest
        if precision == "int8" and result.manifest.accuracy:
            report = result.manifest.accuracy
            print(f"\n  int8 against fp32 on {report.samples} {report.validation_source} samples:")
            for output in report.outputs:
                top1 = "n/a" if output.top1_agreement is None else f"{output.top1_agreement:.3f}"
                print(
                    f"    {output.name}: max |diff| {output.max_abs_diff:.4f}, "
                    f"mean |diff| {output.mean_abs_diff:.4f}, "
                    f"cosine {output.cosine_similarity:.5f}, top-1 agreement {top1}"
                )
    print("\n  (run it again: every build is a cache hit)")
    return digests, str(cache)


def _histogram(metrics_text: str, name: str) -> dict[str, float]:
    """Cumulative bucket counts, sum and count of one histogram from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                values[sample.labels["le"]] = values.get(sample.labels["le"], 0) + sample.value
            elif sample.name.endswith(("_sum", "_count")):
                key = sample.name.rsplit("_", 1)[1]
                values[key] = values.get(key, 0) + sample.value
    return values


def serve_and_load(digest: str, cache: str, seconds: float) -> bool:
    import numpy as np
    from kubeinfer.cli.demo.load import free_port

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "kubeinfer.cli", "serve",
        "--engine", digest, "--cache", cache, "--model-name", MODEL_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-batch-size", "32", "--max-queue-delay-microseconds", "2000",
        "--drain-grace-period-seconds", "10",
    ]  # fmt: skip
    print(f"  $ kubeinfer serve --engine {digest[:23]}... --cache {cache} --port {port}")
    server = subprocess.Popen(command)
    try:
        if not _wait_ready(server, base):
            print("  the server did not become ready", file=sys.stderr)
            return False
        rows = np.random.default_rng(7).standard_normal((4, 512)).astype(np.float32)
        _compare_one_request(base, rows, cache, digest)
        ok = _load_table(base, rows[0], seconds)
        _show_batch_sizes(base)
    finally:
        code = _stop(server)
    print(f"\n  SIGTERM: the server drained and exited with code {code}")
    return ok and code == 0


def _wait_ready(server: subprocess.Popen[bytes], base: str) -> bool:
    """Polls the server's readiness; False as soon as it exits, or when it never gets ready."""
    from kubeinfer.cli.demo.load import http_get

    deadline = time.monotonic() + 60
    while http_get(f"{base}/v2/health/ready")[0] != 200:
        if server.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _compare_one_request(base: str, rows: np.ndarray, cache: str, digest: str) -> None:
    """Sends one request of several rows and prints how far the served answer is from
    ONNX Runtime's on the same engine file in this process: the batcher's stacking and
    splitting must not change an answer."""
    import numpy as np
    import onnxruntime

    infer_url = f"{base}/v2/models/{MODEL_NAME}/infer"
    request = {"inputs": [{"name": "input", "shape": list(rows.shape), "datatype": "FP32",
                           "data": rows.ravel().tolist()}]}  # fmt: skip
    body = json.dumps(request).encode()
    with urllib.request.urlopen(
        urllib.request.Request(infer_url, body, {"Content-Type": "application/json"})
    ) as response:
        served = json.loads(response.read())["outputs"][0]
    local = onnxruntime.InferenceSession(_engine_file(cache, digest)).run(None, {"input": rows})[0]
    difference = float(np.abs(np.asarray(served["data"]).reshape(local.shape) - local).max())
    print(
        f"  a {len(rows)}-row request matches ONNX Runtime in-process: "
        f"max |diff| {difference:.2e}\n"
    )


def _load_table(base: str, row: np.ndarray, seconds: float) -> bool:
    """Single-row requests from more and more clients, a table row each with the mean batch
    the batcher ran (from its own /metrics, before and after): batches grow with the
    clients. True when every request was answered 200."""
    from kubeinfer.cli.demo.load import drive, http_get

    infer_url = f"{base}/v2/models/{MODEL_NAME}/infer"
    single = json.dumps({"inputs": [{"name": "input", "shape": [1, 512], "datatype": "FP32",
                                     "data": row.tolist()}]}).encode()  # fmt: skip
    print("  | clients | req/s | p50 ms | p99 ms | mean batch | status codes |")
    print("  |---:|---:|---:|---:|---:|---|")
    ok = True
    for clients in (1, 8, 32):
        before = _histogram(http_get(f"{base}/metrics")[1].decode(), "kubeinfer_batch_size")
        result = asyncio.run(drive(infer_url, single, clients, seconds))
        after = _histogram(http_get(f"{base}/metrics")[1].decode(), "kubeinfer_batch_size")
        batches = after.get("count", 0) - before.get("count", 0)
        rows_run = after.get("sum", 0) - before.get("sum", 0)
        codes = ", ".join(f"{code}: {n}" for code, n in sorted(result.codes.items()))
        print(
            f"  | {clients} | {result.requests_per_second:.0f} "
            f"| {result.percentile_milliseconds(50):.2f} "
            f"| {result.percentile_milliseconds(99):.2f} "
            f"| {rows_run / max(batches, 1):.1f} | {codes} |"
        )
        ok = ok and set(result.codes) == {200}
    return ok


def _show_batch_sizes(base: str) -> None:
    """The batcher's batch-size histogram over the whole run, one bar per bucket."""
    from kubeinfer.cli.demo.load import http_get

    print("\n  batch sizes the batcher ran, from /metrics (kubeinfer_batch_size):")
    buckets = _histogram(http_get(f"{base}/metrics")[1].decode(), "kubeinfer_batch_size")
    edges = [(k, v) for k, v in buckets.items() if k not in ("sum", "count")]
    edges.sort(key=lambda kv: float(kv[0]))
    previous, total, lower = 0.0, max(buckets.get("count", 1), 1), 1
    for edge, cumulative in edges:
        count, previous = cumulative - previous, cumulative
        if edge == "+Inf":
            label = f"> {lower - 1}"
        else:
            upper = int(float(edge))
            label = str(upper) if upper == lower else f"{lower}..{upper}"
            lower = upper + 1
        if count:
            print(f"    {label:>7} {count:8.0f}  {'#' * max(1, round(40 * count / total))}")


def _stop(server: subprocess.Popen[bytes]) -> int:
    """SIGTERM, as Kubernetes stops a pod, so the server drains; its exit code (-9 when it
    did not exit in time and was killed)."""
    server.send_signal(signal.SIGTERM)
    try:
        return server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        return -9


def _engine_file(cache: str, digest: str) -> str:
    from kubeinfer.runtime.engine_cache import resolve_engine

    return str(resolve_engine(cache, digest).engine_path)


def run(args: argparse.Namespace) -> int:
    workdir: Path = args.workdir
    _step("1. The example manifests (kubeinfer validate examples/*.yaml)")
    ok = show_manifests()
    _step("2. What the operator creates for examples/cpu-minimal.yaml (kubeinfer render)")
    show_children(examples_dir() / "cpu-minimal.yaml")
    _step("3. Engines for the demo model, through the content-addressed cache (kubeinfer build)")
    digests, cache = build_engines(workdir)
    _step("4. Serving the fp32 engine with dynamic batching (kubeinfer serve), under load")
    ok = serve_and_load(digests["fp32"], cache, args.seconds) and ok
    print("\n(shadow tests and autoscaling run through the operator: kubeinfer demo)")
    print("\nDemo finished." if ok else "\nDemo finished with problems (see above).")
    return 0 if ok else 1


def default_workdir() -> Path:
    """Where the demo writes unless told: the user's state directory, wherever the
    project is cloned and whatever the current directory."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "kubeinfer" / "demo"


def run_demo(args: argparse.Namespace) -> int:
    args.workdir = (args.workdir or default_workdir()).resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"kubeinfer demo: writing to {args.workdir} (the models, the engine cache"
        + ("" if args.serving else ", the local cluster's files")
        + ")",
        flush=True,
    )
    if args.serving:
        return run(args)
    from kubeinfer.cli.demo.story import run_story
    from kubeinfer.cli.local.namespace import NamespaceProblem
    from kubeinfer.cli.local.session import UpError
    from kubeinfer.cluster.binaries import BuildError
    from kubeinfer.cluster.control_plane import ClusterError
    from kubeinfer.cluster.netns import NamespaceError

    directory = (args.directory or args.workdir / "local").resolve()
    try:
        return 0 if run_story(args.workdir, directory) else 1
    except (UpError, BuildError, ClusterError, NamespaceProblem, NamespaceError) as error:
        print(f"kubeinfer demo: {error}", file=sys.stderr)
        return 1


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the main job on a built-in model, through the operator on a local cluster",
    )
    parser.add_argument("--workdir", type=Path, default=None,
                        help="models, cache and the cluster's files "
                        "(default: $XDG_STATE_HOME/kubeinfer/demo)")  # fmt: skip
    parser.add_argument("--directory", type=Path, default=None,
                        help="the local cluster's files (default: WORKDIR/local)")  # fmt: skip
    parser.add_argument(
        "--serving",
        action="store_true",
        help="instead: the runtime alone, with no cluster (validate, render, build, serve "
        "under load, the batcher's histogram)",
    )
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="load duration per step (--serving)")  # fmt: skip
    parser.set_defaults(handler=run_demo)
