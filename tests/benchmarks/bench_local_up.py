"""How long `kubeinfer up` takes to serve, as a user sees it (a benchmark script, not a test).

    .venv/bin/python tests/benchmarks/bench_local_up.py [--rounds 2]

Each round runs `kubeinfer up --detach --cpu` on a small model's manifest (a file under
/tmp, published to the pods by the session), from this shell's network namespace, then
posts an inference to the endpoint it printed, again and again, until one is answered
200; then `kubeinfer down`. It reports, from the command's start: when `up` returned
(the manifest applied, the endpoint open), when the endpoint first answered, and how
long `down` took. Builds are not timed: the binaries and images are built (or found)
before the first round. Each round starts from nothing: a fresh cluster, no engine in
any cache, so the model is built by the operator's Job every time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from report import rounds_table

KUBEINFER = [sys.executable, "-m", "kubeinfer.cli.main"]
BODY = json.dumps(
    {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
).encode()


def manifest(model: Path) -> dict[str, object]:
    return {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": "tiny", "namespace": "default"},
        "spec": {
            "model": {"name": "tiny", "version": "1", "source": {
                "uri": f"file://{model}", "sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
            }},
            "engine": {"backend": "onnxruntime", "precision": "fp32", "maxBatchSize": 8},
            "runtime": {"replicas": 1, "batching": {"maxBatchSize": 8}},
        },
    }  # fmt: skip


def answered(url: str) -> bool:
    request = urllib.request.Request(url, BODY, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def one_round(folder: Path, file: Path) -> dict[str, float]:
    directory = folder / f"up-{time.monotonic_ns()}"
    started = time.monotonic()
    up = subprocess.run(
        [*KUBEINFER, "up", "--detach", "--cpu", f"--directory={directory}", str(file)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    returned = time.monotonic() - started
    try:
        if up.returncode != 0:
            raise SystemExit(f"kubeinfer up failed:\n{up.stdout[-3000:]}{up.stderr[-3000:]}")
        state = json.loads((directory / "session.json").read_text())
        url = state["endpoints"]["default/tiny"] + "/v2/models/tiny/infer"
        deadline = time.monotonic() + 600
        while not answered(url):
            if time.monotonic() > deadline:
                raise SystemExit(f"{url} never answered")
            time.sleep(0.1)
        first_answer = time.monotonic() - started
    finally:
        stopping = time.monotonic()
        subprocess.run([*KUBEINFER, "down", f"--directory={directory}"], timeout=300, check=False)
        down = time.monotonic() - stopping
    return {"up returned": returned, "first answer": first_answer, "down": down}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    subprocess.run([*KUBEINFER, "cluster", "build"], check=True, stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory(prefix="bench-local-up-", dir="/tmp") as name:
        folder = Path(name)
        model = build_tiny_mlp(folder / "tiny.onnx")
        file = folder / "tiny.yaml"
        file.write_text(yaml.safe_dump(manifest(model)))
        rounds = []
        for index in range(args.rounds):
            rounds.append(one_round(folder, file))
            said = ", ".join(f"{key} {value:.1f} s" for key, value in rounds[-1].items())
            print(f"round {index + 1}: {said}", flush=True)
    print("\n" + rounds_table("from `kubeinfer up` started", rounds))


if __name__ == "__main__":
    main()
