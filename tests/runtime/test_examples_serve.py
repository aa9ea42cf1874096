"""The examples describe models that serve: `examples/gpu-int8-shadow-autoscale.yaml`'s
BERT classifier, rendered as the operator renders it (`kubeinfer render`'s own
`render_manifest`: the runtime ConfigMap its pods read), serves the BERT-style encoder
(`models.transformer_models`: the three INT64 inputs and dynamic axes torch writes).
Its inputShapes and PadToBuckets batching are accepted at start; requests of 1 to 128
tokens are answered as ONNX Runtime answers each alone, over HTTP; one of 129 tokens is a
400 naming the example's range.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml
from kubeinfer.operator.commands.render import render_manifest
from models.transformer_models import build_encoder, encoder_inputs
from serve_process import ServeProcess

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpu-int8-shadow-autoscale.yaml"


def runtime_config(example: Path) -> dict:
    """The runtime configuration the operator renders for `example`, less what only a pod
    has (the engine in its cache claim, the mirror file, its listening address)."""
    children, _ = render_manifest(yaml.safe_load(example.read_text()))
    (configmap,) = [
        c for c in children
        if c["kind"] == "ConfigMap" and "runtime.yaml" in (c.get("data") or {})
    ]  # fmt: skip
    config = yaml.safe_load(configmap["data"]["runtime.yaml"])
    for pod_only in ("engine", "mirrorTargetFile", "host", "httpPort"):
        config.pop(pod_only, None)
    return dict(config)


def test_the_bert_example_serves_a_bert_of_every_length_it_names(tmp_path: Path) -> None:
    config = runtime_config(EXAMPLE)
    assert config["batching"]["shapeBatching"] == "PadToBuckets"
    path = tmp_path / "runtime.yaml"
    path.write_text(yaml.safe_dump(config))
    model = build_encoder(tmp_path / "encoder.onnx")
    direct = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    name = config["modelName"]
    with ServeProcess(model, name, "--config", str(path)) as served:
        rng = np.random.default_rng(2)
        for length in (1, 77, 128):
            feed = encoder_inputs(rng, 2, length)
            body = {"inputs": [
                {"name": k, "shape": list(v.shape), "datatype": "INT64", "data": v.ravel().tolist()}
                for k, v in feed.items()
            ]}  # fmt: skip
            status, answer = served.infer(body)
            assert status == 200, answer
            outputs = {o["name"]: o for o in answer["outputs"]}
            for output, want in zip(["logits", "last_hidden_state"],
                                    direct.run(["logits", "last_hidden_state"], feed),
                                    strict=True):  # fmt: skip
                got = np.array(outputs[output]["data"], np.float32).reshape(want.shape)
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        long = encoder_inputs(rng, 1, 129)
        body = {"inputs": [
            {"name": k, "shape": [1, 129], "datatype": "INT64", "data": v.ravel().tolist()}
            for k, v in long.items()
        ]}  # fmt: skip
        status, answer = served.infer(body)
        assert status == 400 and "1..128" in answer["error"], answer
        assert served.stop() == 0, served.output()
