"""Covers the test models of `transformer_models`: ONNX Runtime on each graph agrees with
the numpy reference of the same math at several batch sizes and lengths; the dynamic axes
carry the names torch writes; the encoder's attention mask really masks (a padded
sequence classifies as the unpadded one); the decoder's past really continues a sequence
(one pass over a whole sequence equals a prefix pass followed by a pass over the rest
with the prefix's presents as its past) and its causal mask hides later tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from models.transformer_models import (
    PAST,
    TOTAL,
    DecoderConfig,
    EncoderConfig,
    build_decoder,
    build_encoder,
    decoder_inputs,
    decoder_reference,
    encoder_inputs,
    encoder_reference,
)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    path = build_encoder(tmp_path_factory.mktemp("encoder") / "encoder.onnx")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    path = build_decoder(tmp_path_factory.mktemp("decoder") / "decoder.onnx")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def run(session: ort.InferenceSession, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


def test_the_axes_are_named_as_torch_names_them(
    encoder: ort.InferenceSession, decoder: ort.InferenceSession
) -> None:
    assert [i.shape for i in encoder.get_inputs()] == [["batch_size", "sequence_length"]] * 3
    assert {o.name: o.shape for o in encoder.get_outputs()} == {
        "logits": ["batch_size", 3],
        "last_hidden_state": ["batch_size", "sequence_length", 64],
    }
    shapes = {i.name: i.shape for i in decoder.get_inputs()}
    assert shapes["attention_mask"] == ["batch_size", TOTAL]
    assert shapes["past_1_value"] == ["batch_size", 4, PAST, 16]
    outputs = {o.name: o.shape for o in decoder.get_outputs()}
    assert outputs["logits"] == ["batch_size", "sequence_length", 512]
    assert outputs["present_0_key"] == ["batch_size", 4, TOTAL, 16]


@pytest.mark.parametrize(("rows", "length"), [(1, 1), (2, 8), (3, 37), (1, 128)])
def test_the_encoder_is_the_math_it_claims(
    encoder: ort.InferenceSession, rows: int, length: int
) -> None:
    feed = encoder_inputs(
        np.random.default_rng(length), rows, length, padded_from=length - length // 4
    )
    got, want = run(encoder, feed), encoder_reference(EncoderConfig(), **feed)
    for name in ("logits", "last_hidden_state"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=2e-4)


def test_the_encoder_tells_inputs_apart(encoder: ort.InferenceSession) -> None:
    """Every class is some input's top-1 (the shadow and quality tests need a classifier
    whose answers vary, not one class for everything)."""
    logits = run(encoder, encoder_inputs(np.random.default_rng(1), 64, 24))["logits"]
    assert set(logits.argmax(axis=1)) == {0, 1, 2}


def test_the_encoder_ignores_masked_positions(encoder: ort.InferenceSession) -> None:
    rng = np.random.default_rng(3)
    short = encoder_inputs(rng, 2, 20)
    padded = {name: np.pad(array, ((0, 0), (0, 44))) for name, array in short.items()}
    padded["input_ids"][:, 20:] = 17  # whatever the pad tokens are
    alone, in_padding = run(encoder, short), run(encoder, padded)
    np.testing.assert_allclose(in_padding["logits"], alone["logits"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        in_padding["last_hidden_state"][:, :20], alone["last_hidden_state"], rtol=1e-5, atol=1e-5
    )
    unmasked = dict(padded, attention_mask=np.ones_like(padded["attention_mask"]))
    assert not np.allclose(run(encoder, unmasked)["logits"], alone["logits"], atol=1e-3)


@pytest.mark.parametrize(("rows", "length", "past"), [(1, 1, 0), (2, 5, 0), (2, 1, 9), (3, 7, 4)])
def test_the_decoder_is_the_math_it_claims(
    decoder: ort.InferenceSession, rows: int, length: int, past: int
) -> None:
    feed = decoder_inputs(np.random.default_rng(length + past), rows, length, past)
    got = run(decoder, feed)
    want = decoder_reference(
        DecoderConfig(), feed["input_ids"], feed["attention_mask"],
        {k: v for k, v in feed.items() if k.startswith("past_")},
    )  # fmt: skip
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=2e-4, err_msg=name)


def test_the_decoder_continues_a_sequence_from_its_past(decoder: ort.InferenceSession) -> None:
    rng = np.random.default_rng(5)
    whole = decoder_inputs(rng, 2, 12, 0)
    at_once = run(decoder, whole)
    prefix = dict(
        whole, input_ids=whole["input_ids"][:, :7], attention_mask=whole["attention_mask"][:, :7]
    )
    first = run(decoder, prefix)
    rest = {"input_ids": whole["input_ids"][:, 7:], "attention_mask": whole["attention_mask"]}
    rest |= {n.replace("present", "past"): a for n, a in first.items() if n.startswith("present")}
    second = run(decoder, rest)
    np.testing.assert_allclose(first["logits"], at_once["logits"][:, :7], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(second["logits"], at_once["logits"][:, 7:], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        second["present_1_value"], at_once["present_1_value"], rtol=1e-4, atol=1e-4
    )


def test_the_decoder_does_not_see_later_tokens(decoder: ort.InferenceSession) -> None:
    rng = np.random.default_rng(9)
    feed = decoder_inputs(rng, 1, 10, 0)
    changed = dict(feed, input_ids=feed["input_ids"].copy())
    changed["input_ids"][0, 6:] = (changed["input_ids"][0, 6:] + 1) % 512
    a, b = run(decoder, feed)["logits"], run(decoder, changed)["logits"]
    np.testing.assert_allclose(a[:, :6], b[:, :6], rtol=1e-5, atol=1e-5)
    assert not np.allclose(a[:, 6:], b[:, 6:], atol=1e-3)


def test_the_models_are_deterministic(tmp_path: Path) -> None:
    one = build_encoder(tmp_path / "a.onnx").read_bytes()
    assert one == build_encoder(tmp_path / "b.onnx").read_bytes()
    assert (
        build_decoder(tmp_path / "c.onnx").read_bytes()
        == build_decoder(tmp_path / "d.onnx").read_bytes()
    )
