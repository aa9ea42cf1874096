"""int8 engines on CPUs of another kind, as real processes whose instructions are another
CPU model's (`qemu-x86_64 -cpu MODEL`, user-mode emulation: ONNX Runtime picks its kernels
from the CPUID it sees, so the answers are that CPU's whatever this machine is):

- `Nehalem` (SSE4.2): u8 x s8 products summed in 32 bits, exact, as VNNI's are;
- `Haswell` (AVX2 without VNNI): pairs of products summed in 16 bits first (vpmaddubsw),
  which saturate with full 8-bit weights.

An engine built where the kernels are exact with full 8-bit weights (as a builder that
trusted its CPU would make it; tests/support/full_range_int8_build.py) answers its
known-answer set within tolerance there, and on the AVX2 CPU far outside it: the check at
start fails, and the process stays live and never ready, saying why. kubeinfer's own int8
engine (7-bit weights) answers the same set bit for bit on both CPUs: peers on either kind
agree, and the tolerance's margin for other CPUs is not even spent.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.building.engine_build import build_engine
from required_tools import require_tool
from serve_process import ServeProcess

pytestmark = pytest.mark.slow

SUPPORT = Path(__file__).resolve().parents[1] / "support"
EXACT_CPU, SATURATING_CPU = "Nehalem", "Haswell"
EMULATED_START_SECONDS = 240.0
"""An emulated `kubeinfer serve` starts in tens of seconds, more on a busy machine."""


def emulated(cpu: str) -> tuple[str, ...]:
    """The launcher for `cpu`; skips without qemu-x86_64 (fails under CI=true: CI must
    run these) or off x86."""
    if platform.machine() != "x86_64":
        pytest.skip("x86 CPU models only")
    qemu = require_tool(
        "qemu-x86_64",
        "qemu-x86_64 is not installed (apt-get install qemu-user; `make test` tries)",
        "the other CPUs' tests",
    )
    return (qemu, "-cpu", cpu)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("other-cpus")
    onnx = build_tiny_mlp(root / "tiny.onnx")
    return onnx, write_demo_samples(onnx, root / "calibration.npz", count=64)


def serve(digest: str, cache: Path, cpu: str, **kwargs: Any) -> ServeProcess:
    return ServeProcess(
        None, "tiny", "--engine", digest, "--cache", str(cache), "--max-batch-size", "16",
        launcher=emulated(cpu), ready_timeout=EMULATED_START_SECONDS, **kwargs,
    )  # fmt: skip


def at_start(server: ServeProcess) -> dict[str, Any]:
    status, _, body = server.request("GET", "/v2/known-answers")
    assert status == 200, body
    return json.loads(body)["atStart"]  # type: ignore[no-any-return]


def test_a_full_range_engine_from_an_exact_cpu_fails_its_check_on_avx2_without_vnni(
    model: tuple[Path, Path], tmp_path: Path
) -> None:
    onnx, calibration = model
    cache = tmp_path / "cache"
    built = subprocess.run(
        [*emulated(EXACT_CPU), sys.executable, str(SUPPORT / "full_range_int8_build.py"),
         str(onnx), str(calibration), str(cache)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    digest = built.stdout.split()[-1]
    manifest = json.loads((cache / "engines" / digest.split(":")[1] / "manifest.json").read_text())
    (recorded,) = manifest["knownAnswers"]["outputs"]
    assert recorded["buildError"] < recorded["tolerance"]  # gated and recorded where exact
    with serve(digest, cache, SATURATING_CPU, ready_path="/v2/health/live") as server:
        verdict = at_start(server)
        assert server.request("GET", "/v2/health/ready")[0] == 503
        assert "Known-answer check failed at start" in server.output()  # said before listening
    assert verdict["result"] == "failed", verdict
    (output,) = verdict["outputs"]
    assert output["error"] > output["tolerance"] == pytest.approx(recorded["tolerance"])


def test_kubeinfers_int8_engine_answers_bit_for_bit_on_both_kinds_of_cpu(
    model: tuple[Path, Path], tmp_path: Path
) -> None:
    onnx, calibration = model
    built = build_engine(str(onnx), "onnxruntime", "int8", tmp_path / "cache",
                         calibration=str(calibration), max_batch_size=16)  # fmt: skip
    verdicts = []
    for cpu in (EXACT_CPU, SATURATING_CPU):
        with serve(built.digest, tmp_path / "cache", cpu) as server:
            verdicts.append(at_start(server))
    assert [v["result"] for v in verdicts] == ["passed", "passed"]
    assert verdicts[0]["answerDigests"] == verdicts[1]["answerDigests"]
    assert verdicts[0]["outputs"][0]["error"] == verdicts[1]["outputs"][0]["error"]
