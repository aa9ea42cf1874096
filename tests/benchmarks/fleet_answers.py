"""A real runtime that answers the operator's known-answer checks for every simulated pod
of bench_fleet (`--known-answers`): KWOK's pods have addresses in the fleet's pod network
that nothing answers at, so objects with checks on never had a verdict there.

In bench_fleet's own network namespace (never the host's: `netns.check_made_here`), the
whole pod network is routed to the loopback as local addresses (`ip route add local`), and
one `kubeinfer serve` of a real engine (the demo's small MLP, built here with its
known-answer set) listens on every address at the runtime's HTTP port. Each pod the
operator asks, at its own IP, is answered by that server's `POST /v2/known-answers`: the
set really runs, so what the operator pays per pod (a request, a verdict to read, the peers
to compare, a gate to write) is what it pays in production; only the engine is shared.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from kubeinfer.cli.demo.mlp_models import build_small_mlp
from kubeinfer.cluster import netns
from kubeinfer.cluster.fleet import POD_NETWORK
from kubeinfer.contract import metric_series as series
from kubeinfer.operator.reconcile.desired import HTTP_PORT
from kubeinfer.runtime.building.engine_build import build_engine
from prometheus_client.parser import text_string_to_metric_families
from servers import HOST, REPO, ServerProcess, ServerSpec, http_get

MODEL = "fleet-answers"


class FleetAnswers:
    """Started on creation; `checks()` reads how many sets it ran, by result."""

    def __init__(self, directory: Path) -> None:
        netns.check_made_here()
        subprocess.run(
            [netns.ip_command(), "route", "add", "local", POD_NETWORK, "dev", "lo"],
            check=True, timeout=10,
        )  # fmt: skip
        model = build_small_mlp(directory / "answers.onnx")
        built = build_engine(str(model), "onnxruntime", "fp32", directory / "answers-cache",
                             max_batch_size=8)  # fmt: skip
        command = [
            str(REPO / ".venv" / "bin" / "kubeinfer"), "serve",
            "--engine", built.digest, "--cache", str(directory / "answers-cache"),
            "--model-name", MODEL, "--host", "0.0.0.0", "--port", str(HTTP_PORT),
            "--max-batch-size", "8", "--intra-op-threads", "1",
        ]  # fmt: skip
        spec = ServerSpec("answers", command, HTTP_PORT, MODEL)
        self.server = ServerProcess(spec, directory / "logs").__enter__()

    def checks(self) -> dict[str, float]:
        """The known-answer sets run so far, by result (passed, failed, skipped)."""
        _, body = http_get(f"http://{HOST}:{HTTP_PORT}/metrics")
        total = series.KNOWN_ANSWER_CHECKS.total
        return {
            sample.labels.get("result", ""): sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples
            if sample.name == total
        }

    def stop(self) -> None:
        self.server.__exit__(None, None, None)
