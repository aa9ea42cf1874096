"""The BERT-style encoder and the GPT-2-style decoder (`models.transformer_models`) on the
real ONNX Runtime engine, and served by the Rust data plane in process, each answer
judged against ONNX Runtime run directly on that request alone.

Covers: the engine's slots for variable axes (views of one buffer at each batch's shape,
answers equal to a plain session's at every shape, bindings kept up to their bound, an
output whose axis no input names allocated by ONNX Runtime); the server under both
strategies with requests of mixed lengths queued while the slot is held: EqualShapes
runs each length in a batch of its own, PadToBuckets runs the lengths of one bucket in
one batch, padded, and every request still gets exactly its own answer, cut back to its
own length; the decoder's past keeps requests apart under padding while its new tokens
are padded; the slot buffer bytes match what the engine allocated.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from kubeinfer.contract.runtime_config import (
    BatchingPolicy,
    EngineSource,
    InputShape,
    RuntimeConfig,
    ShapeBatching,
)
from kubeinfer.runtime.engines import onnxruntime_shapes
from kubeinfer.runtime.engines.base import slot_buffer_bytes
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from models.transformer_models import (
    DecoderConfig,
    build_decoder,
    build_encoder,
    decoder_inputs,
    encoder_inputs,
)
from onnx import TensorProto, helper
from rust_served import RustServed, rust_served
from waiting import wait_for

TEXT = ("input_ids", "attention_mask", "token_type_ids")


def text_shapes(high: int = 128) -> list[InputShape]:
    return [
        InputShape(name=n, min_shape=[1], opt_shape=[32], max_shape=[high], pad_value=0)
        for n in TEXT
    ]


def decoder_shapes() -> list[InputShape]:
    config = DecoderConfig()
    kv = (config.heads, config.head_size)
    shapes = [
        InputShape(name="input_ids", min_shape=[1], opt_shape=[8], max_shape=[64], pad_value=0),
        InputShape(
            name="attention_mask", min_shape=[1], opt_shape=[8], max_shape=[128], pad_value=0
        ),
    ]
    for i in range(config.layers):
        for part in ("key", "value"):
            shapes.append(
                InputShape(
                    name=f"past_{i}_{part}",
                    min_shape=[kv[0], 0, kv[1]],
                    opt_shape=[kv[0], 16, kv[1]],
                    max_shape=[kv[0], 64, kv[1]],
                )
            )
    return shapes


@pytest.fixture(scope="module")
def encoder_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_encoder(tmp_path_factory.mktemp("encoder") / "encoder.onnx")


@pytest.fixture(scope="module")
def decoder_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_decoder(tmp_path_factory.mktemp("decoder") / "decoder.onnx")


def direct(path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


def run_slot(slot, feed: dict[str, np.ndarray], names) -> dict[str, np.ndarray]:
    rows = next(iter(feed.values())).shape[0]
    shape = tuple(feed[name].shape[1:] for name in names)
    views = slot.input_views(rows, shape)
    for name, view in views.items():
        view[...] = feed[name]
    return {k: v.copy() for k, v in slot.run(rows, shape).items()}


def test_a_slot_answers_every_shape_as_a_plain_session_does(encoder_path, decoder_path) -> None:
    rng = np.random.default_rng(0)
    encoder = OnnxRuntimeEngine(encoder_path, 4, intra_op_threads=1, input_shapes=text_shapes())
    slot = encoder.create_slot()
    for rows, length in [(1, 1), (4, 128), (2, 17), (3, 64), (2, 17)]:
        feed = encoder_inputs(rng, rows, length)
        got, want = run_slot(slot, feed, TEXT), direct(encoder_path, feed)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
    # One buffer per tensor, sized for a full batch at the largest shape.
    assert sum(b.nbytes for b in slot._buffers.values()) == slot_buffer_bytes(encoder)
    decoder = OnnxRuntimeEngine(decoder_path, 4, input_shapes=decoder_shapes())
    names = [s.name for s in decoder.inputs]
    slot = decoder.create_slot()
    for rows, length, past in [(1, 5, 0), (2, 1, 9), (4, 64, 64)]:
        feed = decoder_inputs(rng, rows, length, past)
        got, want = run_slot(slot, feed, names), direct(decoder_path, feed)
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)


def test_a_slot_keeps_its_bindings_up_to_its_bound(encoder_path, monkeypatch) -> None:
    monkeypatch.setattr(onnxruntime_shapes, "BINDINGS_KEPT", 3)
    engine = OnnxRuntimeEngine(encoder_path, 2, input_shapes=text_shapes())
    slot = engine.create_slot()
    rng = np.random.default_rng(1)
    for length in (3, 4, 5, 6, 3):
        run_slot(slot, encoder_inputs(rng, 1, length), TEXT)
    assert list(slot._bound) == [(1, ((n,),) * 3) for n in (5, 6, 3)]


def test_an_output_named_after_no_input_is_allocated_per_run(tmp_path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Concat", ["x", "x"], ["y"], axis=1)],
        "doubled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "doubled"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "doubled.onnx"))
    shapes = [InputShape(name="x", min_shape=[1], opt_shape=[4], max_shape=[16])]
    engine = OnnxRuntimeEngine(tmp_path / "doubled.onnx", 2, input_shapes=shapes)
    assert engine.outputs[0].max_item_shape is None
    slot = engine.create_slot()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(run_slot(slot, {"x": x}, ["x"])["y"], np.hstack([x, x]))


def infer(served: RustServed, request: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One request over HTTP, JSON both ways; its outputs as arrays."""
    inputs = [
        {"name": name, "datatype": "INT64" if array.dtype == np.int64 else "FP32",
         "shape": list(array.shape), "data": array.ravel().tolist()}
        for name, array in request.items()
    ]  # fmt: skip
    status, _, body = served.request(
        "POST", served.infer_path, json.dumps({"inputs": inputs}).encode()
    )
    assert status == 200, body
    return {
        output["name"]: np.array(output["data"], np.float32).reshape(output["shape"])
        for output in json.loads(body)["outputs"]
    }


def serve_queued(
    engine, input_shapes: list[InputShape], policy: BatchingPolicy, requests: list[dict]
) -> list[dict[str, np.ndarray]]:
    """Holds the slot with the first request, queues the others in their order, then lets
    them run."""
    batching = policy.model_copy(
        update={"max_batch_size": 8, "execution_slots": 1, "max_queue_delay_microseconds": 0}
    )
    config = RuntimeConfig(
        model_name="m", engine=EngineSource(onnx_path="m.onnx"), host="127.0.0.1",
        batching=batching, input_shapes=input_shapes,
    )  # fmt: skip
    with rust_served(config, engine) as served, ThreadPoolExecutor(len(requests)) as pool:
        engine.gate.clear()
        first = pool.submit(infer, served, requests[0])
        wait_for(lambda: engine.running == 1, what="the first request held", every=0.001)
        others = []
        for request in requests[1:]:  # one at a time: they queue in this order
            others.append(pool.submit(infer, served, request))
            queued = len(others)
            wait_for(lambda n=queued: served.queued() == n, what=f"{queued} queued", every=0.001)
        engine.gate.set()
        return [answer.result(timeout=60) for answer in (first, *others)]


@pytest.mark.parametrize(
    ("strategy", "batches"),
    [
        # held: 40; then 5, 9, 12, 9, 30 queued (three lengths in bucket 16, one in 32)
        (ShapeBatching.EQUAL_SHAPES, [(1, 40), (1, 5), (2, 9), (1, 12), (1, 30)]),
        (ShapeBatching.PAD_TO_BUCKETS, [(1, 64), (4, 16), (1, 32)]),
    ],
)
def test_mixed_lengths_share_batches_as_the_strategy_says(
    encoder_path, gated_of, strategy, batches
) -> None:
    engine = OnnxRuntimeEngine(encoder_path, 8, intra_op_threads=1, input_shapes=text_shapes())
    gated = gated_of(engine)
    policy = BatchingPolicy(shape_batching=strategy, shape_buckets=[16, 32, 64, 128])
    rng = np.random.default_rng(2)
    requests = [encoder_inputs(rng, 1, n) for n in (40, 5, 9, 12, 9, 30)]
    try:
        answers = serve_queued(gated, text_shapes(), policy, requests)
    finally:
        gated.gate.set()
    ran = [(rows, shape[0][0]) for rows, shape in zip(gated.batches, gated.shapes, strict=True)]
    assert ran == batches
    for request, answer in zip(requests, answers, strict=True):
        want = direct(encoder_path, request)
        assert answer["last_hidden_state"].shape == want["last_hidden_state"].shape
        for name in want:  # a padded batch adds only rounding to the masked positions' math
            np.testing.assert_allclose(answer[name], want[name], rtol=1e-4, atol=1e-4)
    engine.close()


def test_a_decoders_past_keeps_requests_apart_while_new_tokens_are_padded(
    decoder_path, gated_of
) -> None:
    engine = OnnxRuntimeEngine(decoder_path, 8, intra_op_threads=1, input_shapes=decoder_shapes())
    gated = gated_of(engine)
    policy = BatchingPolicy(max_batch_size=8, shape_batching=ShapeBatching.PAD_TO_BUCKETS)
    rng = np.random.default_rng(3)
    # (new tokens, past): the held one, then two prompts of bucket 8, two steps after a
    # past of 9 and one after a past of 4.
    cases = [(3, 0), (5, 0), (7, 0), (1, 9), (1, 9), (1, 4)]
    requests = [decoder_inputs(rng, 1, length, past) for length, past in cases]
    try:
        answers = serve_queued(gated, decoder_shapes(), policy, requests)
    finally:
        gated.gate.set()
    ran = [
        (rows, shape[0][0], shape[2][1])
        for rows, shape in zip(gated.batches, gated.shapes, strict=True)
    ]
    assert ran == [(1, 4, 0), (2, 8, 0), (2, 1, 9), (1, 1, 4)]
    for request, answer in zip(requests, answers, strict=True):
        want = direct(decoder_path, request)
        for name in want:
            assert answer[name].shape == want[name].shape, name
            np.testing.assert_allclose(answer[name], want[name], rtol=1e-4, atol=1e-4)
    engine.close()
