"""`kubeinfer serve` checks its engine's known answers before it reports ready, as real
processes: engines built by a real `kubeinfer build` process, served over loopback.

- A sound engine passes at start, is ready, and reports the verdict (`GET
  /v2/known-answers`), runs the set again on demand (`POST`) and exports both.
- The execution slot's stand-in for a GPU's silent fault (`--testing-faults
  perturb-batches=1`) and an engine file changed after its digest check
  (`damage-engine-after-digest-check`) each leave the process live and never ready: its
  readiness answers 503, its infer requests 503 naming the output, the probe and the
  error against its tolerance, and so does its log; restarted on the damaged file, the
  digest check refuses it outright.
- A replica that goes wrong after its start (the fault from its second batch on) is
  reported by the check on demand and left serving: taking it out is the operator's.
- Labels and text (a text classifier, BYTES in, string labels out) fail by equality.
- An `--onnx` model, and an engine whose manifest predates known-answer sets, are served
  with the check skipped, saying why; a bad `--testing-faults` is refused (exit 2).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.runtime.building.calibration import write_demo_samples, write_samples
from models.sklearn_models import build_text_classifier, text_split
from ports import free_port
from serve_process import ServeProcess

pytestmark = pytest.mark.slow

ROWS = "16"  # the largest batch: the 13 held-out probes run as two (the first alone)


def kubeinfer_build(*args: str) -> dict:  # type: ignore[type-arg]
    done = subprocess.run(
        [sys.executable, "-m", "kubeinfer.cli", "build", *args, "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    """The tiny MLP's int8 engine, built by `kubeinfer build` into a cache."""
    root = tmp_path_factory.mktemp("known-answers")
    model = build_tiny_mlp(root / "tiny.onnx")
    calibration = write_demo_samples(model, root / "calibration.npz", count=64)
    built = kubeinfer_build(
        "--model", str(model), "--precision", "int8", "--calibration", str(calibration),
        "--max-batch-size", ROWS, "--cache", str(root / "cache"),
    )  # fmt: skip
    assert built["knownAnswers"]["probes"] == 13
    return {"model": model, "cache": root / "cache", "digest": built["digest"]}


def serve(
    tiny: dict[str, Path | str], *flags: str, cache: Path | None = None, **kwargs: str
) -> ServeProcess:
    return ServeProcess(
        None, "tiny", "--engine", str(tiny["digest"]), "--cache", str(cache or tiny["cache"]),
        "--max-batch-size", ROWS, *flags, **kwargs,
    )  # fmt: skip


def verdicts(server: ServeProcess, method: str = "GET") -> dict:  # type: ignore[type-arg]
    status, _, body = server.request(method, "/v2/known-answers")
    assert status == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


def infer(server: ServeProcess) -> tuple[int, dict]:  # type: ignore[type-arg]
    x = np.random.default_rng(2).standard_normal((1, 16)).astype(np.float32)
    return server.infer({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16],
                                     "data": x.ravel().tolist()}]})  # fmt: skip


def test_a_sound_engine_passes_at_start_and_again_on_demand(tiny: dict[str, Path | str]) -> None:
    with serve(tiny) as server:
        at_start = verdicts(server)
        assert at_start["servingAllowed"] and at_start["atStart"]["result"] == "passed"
        assert at_start["atStart"]["digest"] == tiny["digest"]
        assert at_start["atStart"]["probes"] == 13
        assert infer(server)[0] == 200
        again = verdicts(server, "POST")
        assert again["latest"]["result"] == "passed" and again["atStart"] == at_start["atStart"]
        # the same engine on the same CPU answers its probes bit for bit alike
        assert again["latest"]["answerDigests"] == at_start["atStart"]["answerDigests"]
        assert server.metric("kubeinfer_known_answer_checks_total", result="passed") == 2
        assert server.metric("kubeinfer_known_answers_failing") == 0
        assert 0 < server.metric("kubeinfer_known_answer_error_ratio", output="logits") < 1
        assert server.metric("kubeinfer_known_answer_seconds_total") > 0
        assert "Known-answer check passed at start" in server.output()


def assert_held_unready(server: ServeProcess, output: str) -> dict:  # type: ignore[type-arg]
    """The process is live and not ready, refuses inference naming why, and says so."""
    held = verdicts(server)
    assert not held["servingAllowed"] and held["atStart"]["result"] == "failed"
    reason = held["atStart"]["reason"]
    assert f"output '{output}': probe" in reason and "over its tolerance" in reason
    assert server.request("GET", "/v2/health/ready")[0] == 503
    assert server.request("GET", "/v2/health/live")[0] == 200
    status, refused = infer(server)
    assert status == 503 and reason in refused["error"]
    assert verdicts(server, "POST")["latest"]["result"] == "failed"
    assert server.request("GET", "/v2/health/ready")[0] == 503  # never ready
    assert server.metric("kubeinfer_known_answers_failing") == 1
    assert server.metric("kubeinfer_known_answer_error_ratio", output=output) > 1
    assert server.process.poll() is None
    log = server.output()
    assert "Known-answer check failed at start" in log and reason in log
    assert "Holding readiness false for good" in log
    return held  # type: ignore[no-any-return]


def test_a_silent_fault_in_the_execution_slot_keeps_the_replica_live_and_never_ready(
    tiny: dict[str, Path | str],
) -> None:
    faults = ("--testing-faults", "perturb-batches=1")
    with serve(tiny, *faults, ready_path="/v2/health/live") as server:
        held = assert_held_unready(server, "logits")
        assert "Injecting faults for tests" in server.output()
    assert held["atStart"]["outputs"][0]["error"] > held["atStart"]["outputs"][0]["tolerance"]


def test_an_engine_file_changed_after_its_digest_check_is_caught_before_serving(
    tiny: dict[str, Path | str], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(tiny["cache"], cache)
    damage = ("--testing-faults", "damage-engine-after-digest-check")
    with serve(tiny, *damage, cache=cache, ready_path="/v2/health/live") as server:
        assert_held_unready(server, "logits")
        assert "Damaged the engine file after its digest check" in server.output()
    restarted = subprocess.run(
        [sys.executable, "-m", "kubeinfer.cli", "serve", "--engine", str(tiny["digest"]),
         "--cache", str(cache), "--model-name", "tiny", "--host", "127.0.0.1",
         "--port", str(free_port())],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert restarted.returncode == 1 and "is corrupt or was modified" in restarted.stderr


def test_a_replica_that_goes_wrong_after_its_start_is_reported_and_left_to_the_operator(
    tiny: dict[str, Path | str],
) -> None:
    # The check at start runs two batches (the first probe alone, then the others) clean.
    faults = ("--testing-faults", "perturb-batches=1,perturb-after-batches=2")
    with serve(tiny, *faults) as server:
        assert verdicts(server)["atStart"]["result"] == "passed"
        later = verdicts(server, "POST")
        assert later["servingAllowed"] and later["latest"]["result"] == "failed"
        assert "output 'logits': probe" in later["latest"]["reason"]
        assert server.request("GET", "/v2/health/ready")[0] == 200
        assert server.metric("kubeinfer_known_answers_failing") == 1
        assert server.metric("kubeinfer_known_answer_checks_total", result="failed") == 1
        assert "Known-answer check failed on demand" in server.output()


def test_a_text_classifier_answering_other_labels_fails_by_equality(tmp_path: Path) -> None:
    _, _, held_out, _ = text_split()
    texts = write_samples(tmp_path / "texts.npz", {"text": np.array(held_out).reshape(-1, 1)})
    model = build_text_classifier(tmp_path / "text.onnx")[0]
    built = kubeinfer_build("--model", str(model), "--calibration", str(texts),
                            "--cache", str(tmp_path / "cache"))  # fmt: skip
    source = ("--engine", built["digest"], "--cache", str(tmp_path / "cache"))
    with ServeProcess(None, "text", *source) as sound:
        assert verdicts(sound)["atStart"]["result"] == "passed"
    faulty = ("--testing-faults", "perturb-batches=1")
    with ServeProcess(None, "text", *source, *faulty, ready_path="/v2/health/live") as server:
        reason = verdicts(server)["atStart"]["reason"]
        assert server.request("GET", "/v2/health/ready")[0] == 503
    assert "output 'label':" in reason and "probes answered otherwise than expected" in reason


def test_engines_without_a_set_are_served_with_the_check_skipped_saying_why(
    tiny: dict[str, Path | str], tmp_path: Path
) -> None:
    with ServeProcess(Path(tiny["model"]), "tiny") as server:
        skipped = verdicts(server)["atStart"]
        assert server.metric("kubeinfer_known_answer_checks_total", result="skipped") == 1
        # asked for (--onnx): said, not warned of
        assert (
            "INFO kubeinfer.runtime.known_answers.runner: Known-answer check skipped at start"
            in server.output()
        )
    assert skipped["result"] == "skipped" and "an ONNX file served as it is" in skipped["reason"]
    cache = tmp_path / "cache"
    shutil.copytree(tiny["cache"], cache)
    manifest = cache / "engines" / str(tiny["digest"]).removeprefix("sha256:") / "manifest.json"
    older = json.loads(manifest.read_text())
    del older["knownAnswers"]  # a manifest of the recipe before sets were recorded
    manifest.write_text(json.dumps(older))
    with serve(tiny, cache=cache) as server:
        skipped = verdicts(server)["atStart"]
        assert infer(server)[0] == 200
        assert (
            "WARNING kubeinfer.runtime.known_answers.runner: Known-answer check skipped at start"
            in server.output()
        )
    assert "records no known-answer set" in skipped["reason"]


def test_a_bad_testing_faults_setting_is_refused(tiny: dict[str, Path | str]) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "kubeinfer.cli", "serve", "--onnx", str(tiny["model"]),
         "--model-name", "tiny", "--port", str(free_port()), "--testing-faults", "gremlins"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2 and "'gremlins' is not one of" in refused.stderr
