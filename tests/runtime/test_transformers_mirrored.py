"""A shadow candidate and a quality watch of the BERT-style encoder, between real
`kubeinfer serve` processes: requests of many lengths (outputs of as many lengths, the
hidden state following the sequence) mirrored and compared request by request.

Covers: every mirrored request compared, none a mismatch, whatever its length (the mirror
sends requests of different shapes apart; the comparison takes each request's own
shapes); top-1 rows counted per position of each request's own length (1 for the logits
plus its length for the hidden state); the quality watch's reference, the same model,
agreeing on every row with no difference; the shadow candidate, the same architecture
with other weights, disagreeing, measured, not a mismatch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as triton
from models.transformer_models import EncoderConfig, build_encoder, encoder_inputs
from serve_process import ServeProcess
from waiting import wait_for

pytestmark = pytest.mark.slow

TEXT = ("input_ids", "attention_mask", "token_type_ids")
FLAGS = [f"--input-shape={n}=1:32:128:0" for n in TEXT]
PADDED = ["--shape-batching", "PadToBuckets", "--shape-buckets", "16,32,64,128"]


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    folder = tmp_path_factory.mktemp("mirrored")
    model = build_encoder(folder / "encoder.onnx")
    other = build_encoder(folder / "other.onnx", EncoderConfig(seed=8))
    mirror_file = folder / "mirror.json"
    with (
        ServeProcess(other, "bert", *FLAGS) as candidate,
        ServeProcess(model, "bert", *FLAGS) as reference,
    ):
        url = "http://127.0.0.1:{}"
        mirror_file.write_text(json.dumps({
            "target": {"url": url.format(candidate.port), "modelName": "bert",
                       "candidateVersion": "2", "trafficPercent": 100},
            "qualityWatch": {"reference": {"url": url.format(reference.port), "modelName": "bert",
                                           "candidateVersion": "1-fp32", "trafficPercent": 100}},
        }))  # fmt: skip
        with ServeProcess(
            model, "bert", *FLAGS, *PADDED, "--mirror-target-file", str(mirror_file),
            "--mirror-poll-interval-milliseconds", "50",
        ) as serving:  # fmt: skip
            yield serving
            assert serving.stop() == 0, serving.output()


def figures(serving: ServeProcess, path: str) -> dict:
    return json.loads(serving.request("GET", path)[2])


def wait_for_compared(serving: ServeProcess, count: int) -> tuple[dict, dict]:
    seen: list[tuple[dict, dict]] = []

    def compared() -> tuple[dict, dict] | None:
        shadow, quality = figures(serving, "/v2/shadow"), figures(serving, "/v2/quality")
        seen.append((shadow["requests"], quality["requests"]))
        done = min(shadow["requests"]["compared"], quality["requests"]["compared"]) >= count
        return (shadow, quality) if done else None

    return wait_for(compared, within=60, what=lambda: f"all compared; saw {seen[-1]}")


def test_answers_of_every_length_are_compared_request_by_request(mirrored: ServeProcess) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{mirrored.port}")
    wait_for(lambda: figures(mirrored, "/v2/shadow")["active"], what="the target file read")
    rng = np.random.default_rng(4)
    lengths = [3, 17, 64, 120, 9, 33, 128, 1]
    for length in lengths:
        feed = encoder_inputs(rng, 1, length)
        inputs = []
        for name, array in feed.items():
            tensor = triton.InferInput(name, list(array.shape), "INT64")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        assert client.infer("bert", inputs).as_numpy("last_hidden_state").shape == (1, length, 64)
    shadow, quality = wait_for_compared(mirrored, len(lengths))
    rows = sum(1 + length for length in lengths)  # logits' one row, the hidden state's tokens
    assert shadow["mismatches"] == quality["mismatches"] == 0
    assert quality["top1"] == {"rows": rows, "agreements": rows, "agreement": 1.0}
    assert quality["maxAbsDifference"] < 1e-4
    assert shadow["top1"]["rows"] == rows and shadow["top1"]["agreement"] < 0.9
    assert shadow["maxAbsDifference"] > 0.1
