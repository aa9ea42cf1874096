"""`make demo` keeps working: the whole main job (validate, render, build through the cache,
serve, load, metrics, drain, a shadow that passes and one that fails, autoscaling through
a burst) runs as a real process and ends with exit code 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_runs_end_to_end(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "kubeinfer.operator", "demo", "--workdir", str(tmp_path),
               "--seconds", "0.3"]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert out.count("valid InferenceDeployment") == 3
    assert "Deployment/resnet-cpu-runtime" in out
    assert "int8 against fp32" in out and "top-1 agreement" in out
    assert "matches ONNX Runtime in-process" in out
    assert "| 32 |" in out and "exited with code 0" in out
    assert "| int8, same model |" in out and "**Passed** ThresholdsMet" in out
    assert "| fp32, another model |" in out and "**Failed** DifferenceTooLarge" in out
    assert "**1 → " in out and " → 1** (TooFewReplicas)" in out, "up under the burst, down after"
    assert "1 after it; 0 requests answered other than 200" in out
    assert out.rstrip().endswith("Demo finished.")
