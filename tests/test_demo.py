"""`make demo` keeps working, as a real process ending with exit code 0:

- `kubeinfer demo`: the story through the real operator on a local cluster: an
  InferenceDeployment built and served, requests answered at its endpoint, a burst that
  scales it up and back down, an int8 version promoted after a shadow test on live
  traffic, its quality watch Healthy and then Degraded=True QualityDrift on the shifted
  class and tenant (the figures from status.qualityWatch) with the exemplars fetched from
  the serving pod mostly the shifted rows, a bad candidate failed with serving untouched,
  `kubectl scale` with autoscaling off; and every process it started gone afterwards;
- `kubeinfer demo --serving`: the runtime alone (validate, render, build through the
  cache, serve, load, the batcher's histogram from /metrics, drain).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from processes_left import processes_mentioning

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.mark.demo
def test_the_demo_tells_the_story_through_the_operator(model_directory: Path) -> None:
    workdir = model_directory / "demo"
    command = [sys.executable, "-m", "kubeinfer.cli.main", "demo", "--workdir", str(workdir)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=400)
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-3000:]
    assert "BuildingEngine" in out and "1/1     Ready" in out
    assert "max |diff| against ONNX Runtime in-process" in out
    assert "the runtime went from 1 to " in out and "back to 1 after the window" in out
    assert "Promoted after" in out
    assert "windowSeconds 30: the shortest allowed, for the demo" in out
    assert "→  Healthy" in out and "Degraded=True QualityDrift: " in out
    assert "worst slice b: " in out and "the aggregate alone would hide it" in out
    assert "$ curl -o exemplars.npz" in out and "stacked as a calibration file is" in out
    assert "Healthy, then QualityDrift: class " in out and "are the shifted rows" in out
    assert "Failed (DifferenceTooLarge), serving untouched" in out
    assert "2 pods, as `kubectl scale` asked" in out
    assert "7 of 7 steps passed" in out and out.rstrip().endswith("Demo finished.")
    assert processes_mentioning(workdir) == []


def test_the_demo_refuses_a_workdir_its_pods_cannot_see() -> None:
    command = [sys.executable, "-m", "kubeinfer.cli.main", "demo", "--workdir", "/tmp/demo"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "every pod mounts its own /tmp" in result.stderr and "Traceback" not in result.stderr


def test_the_serving_demo_runs_end_to_end(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "kubeinfer.cli.main",
        "demo",
        "--serving",
        "--workdir",
        str(tmp_path),
        "--seconds",
        "0.3",
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert out.count("valid InferenceDeployment") == 3
    assert "Deployment/resnet-cpu-runtime" in out
    assert "int8 against fp32" in out and "top-1 agreement" in out
    assert "matches ONNX Runtime in-process" in out
    assert "| 32 |" in out and "exited with code 0" in out
    assert "batch sizes the batcher ran, from /metrics" in out
    assert out.rstrip().endswith("Demo finished.")
