"""The int8 accuracy gate on a GPT-2-style decoder (`models.transformer_models`), the case
that showed the gate judged the wrong outputs: its key/value caches drift under
quantisation while its logits keep their answer.

Covers: by default the gate judges `logits` only (named like scores) and the presents are
compared and reported only, which the progress line and the report's `gated` flags say;
the presents' top-1 agreement is below the logits'; a gate set between the two passes on
the logits and, once `--gate-outputs` names the worst present as well, refuses the same
cached engine naming that output. Thresholds come from the measured report, not fixed
figures, so the test holds on CPUs with and without VNNI.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from kubeinfer.cli.main import main
from kubeinfer.runtime.building.calibration import write_samples
from models.transformer_models import build_decoder, decoder_inputs


def _build(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict | None, str]:
    code = main(["build", *args, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else None, captured.err


def test_the_gate_judges_the_logits_not_the_caches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = build_decoder(tmp_path / "decoder.onnx")
    samples = decoder_inputs(np.random.default_rng(0), rows=40, length=8, past_length=4)
    calibration = write_samples(tmp_path / "calibration.npz", samples)
    build = ["--model", str(model), "--precision", "int8", "--calibration", str(calibration),
             "--cache", str(tmp_path / "cache")]  # fmt: skip
    code, manifest, err = _build(capsys, *build, "--max-top1-drop", "0.5")
    assert code == 0, err
    presents = [f"present_{i}_{part}" for i in range(2) for part in ("key", "value")]
    assert f"Gating outputs ['logits']; comparing only {presents}" in err
    outputs = {o["name"]: o for o in manifest["accuracy"]["outputs"]}
    assert outputs["logits"]["gated"] and not any(outputs[p]["gated"] for p in presents)
    worst = min(presents, key=lambda p: outputs[p]["top1Agreement"])
    logits_agreement = outputs["logits"]["top1Agreement"]
    assert logits_agreement > outputs[worst]["top1Agreement"]
    between = 1 - outputs[worst]["top1Agreement"] - 1e-3  # tighter than the worst present
    code, hit, err = _build(capsys, *build, "--max-top1-drop", str(between))
    assert code == 0 and hit["cacheHit"], err
    code, _, err = _build(
        capsys, *build, "--max-top1-drop", str(between), "--gate-outputs", f"logits,{worst}"
    )
    [line] = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 1 and f"output {worst!r}: top-1 drop" in line
    assert "'logits'" not in line
