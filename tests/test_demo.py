"""`make demo` keeps working, as a real process ending with exit code 0, from any
directory, saying at start where it writes:

- `kubeinfer demo`, writing under /tmp (its models are served to the pods over HTTP, so
  no directory is out of their reach): the story through the real operator on a local
  cluster in a network namespace of its own: an
  InferenceDeployment built and served, requests answered at its endpoint (a port of the
  namespace the demo started in), a burst that
  scales it up and back down, an int8 version promoted after a shadow test on live
  traffic, its quality watch Healthy and then Degraded=True QualityDrift on the shifted
  class and tenant (the figures from status.qualityWatch) with the exemplars fetched from
  the serving pod mostly the shifted rows, a bad candidate failed with serving untouched,
  `kubectl scale` with autoscaling off, a replica driven into wrong answers (the tests'
  fault, on that object only) caught by the operator's known-answer checks, taken out of
  its Service's endpoints, replaced and named with its node and engine while the other
  replica served throughout; and every process it started gone afterwards;
- `kubeinfer demo --serving`: the runtime alone (validate, render, build through the
  cache, serve, load, the batcher's histogram from /metrics, drain), writing under the
  user's state directory when not told where.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from processes_left import processes_mentioning

pytestmark = pytest.mark.slow


STORY_SECONDS = 1200
"""Far more than the story takes (about 4 minutes on a busy 2-core machine): a bound for a
hung step, after which the demo is stopped as Ctrl-C would stop it."""


def run_stopping_on_timeout(command: list[str], cwd: Path, seconds: float) -> tuple[int, str, str]:
    """Runs `command`; past `seconds`, SIGTERM, so it stops what it started, then fails."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        out, err = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=300)
        pytest.fail(f"still running after {seconds:.0f} s (stopped):\n{out[-4000:]}{err[-3000:]}")
    return process.returncode, out, err


@pytest.mark.demo
@pytest.mark.timeout(STORY_SECONDS + 400)
def test_the_demo_tells_the_story_through_the_operator(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    command = [sys.executable, "-m", "kubeinfer.cli.main", "demo", "--workdir", str(workdir)]
    code, out, err = run_stopping_on_timeout(command, tmp_path, STORY_SECONDS)
    assert code == 0, out[-4000:] + err[-3000:]
    assert out.startswith(f"kubeinfer demo: writing to {workdir} ")
    assert "a file of this machine, which pods cannot see; they read it at http://" in out
    assert "BuildingEngine" in out and "1/1     Ready" in out
    assert "$ curl -d @request.json http://127.0.0.1:" in out
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
    assert "(answering wrong)" in out and "left the Service's endpoints" in out
    assert "$ kubectl infd answers answers" in out and "KnownAnswersFailed" in out
    assert "its replacement answers-runtime-" in out and "2 pods serve again" in out
    assert "stayed in the Service's endpoints throughout" in out
    assert "caught: pod answers-runtime-" in out and "(engine sha256:" in out
    assert "9 of 9 steps passed" in out and out.rstrip().endswith("Demo finished.")
    assert processes_mentioning(workdir) == []


def test_the_serving_demo_runs_end_to_end(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "kubeinfer.cli.main", "demo", "--serving", "--seconds", "0.3"]
    environment = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    result = subprocess.run(
        command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    workdir = tmp_path / "state" / "kubeinfer" / "demo"
    assert out.startswith(f"kubeinfer demo: writing to {workdir} ")
    assert (workdir / "models" / "small-mlp.onnx").is_file() and (workdir / "cache").is_dir()
    assert out.count("valid InferenceDeployment") == 3
    assert "Deployment/resnet-cpu-runtime" in out
    assert "int8 against fp32" in out and "top-1 agreement" in out
    assert "matches ONNX Runtime in-process" in out
    assert "| 32 |" in out and "exited with code 0" in out
    assert "batch sizes the batcher ran, from /metrics" in out
    assert out.rstrip().endswith("Demo finished.")
