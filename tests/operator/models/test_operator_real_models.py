"""Models users bring, on the real control plane: the real operator (in-process), real
build Jobs and runtime pods in containers (uid 65532, read-only root filesystem, a memory
limit), each family built at every precision it allows, shadow-tested, quality-watched
and asked through tritonclient over HTTP and gRPC at the pods' own addresses.

- a GPT-2-style decoder (`models.transformer_models`), saved as torch saves it (the graph
  in `decoder.onnx`, its weights in `decoder.onnx.data`), with a variable sequence length
  and past: fp16 first, then an int8 version gated on its logits (the report says the
  key/value caches were compared only) shadowed on live requests of 1 to 32 new tokens
  after pasts of 0 to 16, promoted, then watched against its fp32 reference;
- the digits classifier (`models.sklearn_models`): skl2onnx's default export (ZipMap)
  refused, its status naming the export option; without ZipMap, fp16, then int8 gated on
  `probabilities` (spec.engine.accuracy.gateOutputs) shadowed, promoted and watched;
  labels as scikit-learn predicts them;
- the text classifier, one graph with onnxruntime-extensions operators (raw text in,
  topic out): int8 refused (nothing to quantise), its status saying to build at fp32;
  fp16 watched against fp32 by label equality; a version trained on fewer sentences,
  shadowed on mixed-topic sentences, rolled back on its top-1 agreement.

Answers are judged against ONNX Runtime running the engine file the pods serve, read from
the cache claim on the node, with the runtime's own session options (and the classifiers'
labels against scikit-learn). Under the `transformers` marker, the same shadow and watch
on a BERT and a GPT-2 exported by torch and transformers (skipped where not installed;
both passed on 2026-11-27, torch 2.15.0 and transformers 5.24.0, docs/development.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from kubeinfer.operator.state import names
from kubeinfer.runtime.building.calibration import write_samples
from models.sklearn_models import (
    build_digits_mlp,
    build_text_classifier,
    digits,
    mixed_sentences,
    normalised,
    text_split,
)
from models.transformer_models import (
    DecoderConfig,
    build_decoder,
    decoder_inputs,
    encoder_inputs,
)
from operator_harness import Model, World, condition, eventually, start_operator
from real_models_harness import (
    OWNER,
    SAMPLES,
    SETTINGS,
    WATCH,
    answers_as_the_engine,
    body,
    document,
    engine_report,
    gated_by_the_build_job,
    healthy,
    ready,
    refused,
    served,
    serving,
    shadow,
    source,
    traffic,
    waiting,
)
from test_operator_shadow_rollout import candidate, ready_urls, verdict

pytestmark = pytest.mark.slow

DECODER = DecoderConfig()
PAST = tuple(f"past_{i}_{part}" for i in range(DECODER.layers) for part in ("key", "value"))
KV = (DECODER.heads, DECODER.head_size)
DECODER_SHAPES = [
    {"name": "input_ids", "minShape": [1], "optShape": [8], "maxShape": [32], "padValue": 0},
    {"name": "attention_mask", "minShape": [1], "optShape": [16], "maxShape": [64], "padValue": 0},
    *(
        {
            "name": n,
            "minShape": [KV[0], 0, KV[1]],
            "optShape": [KV[0], 8, KV[1]],
            "maxShape": [KV[0], 32, KV[1]],
        }
        for n in PAST
    ),
]
TEXT = ("input_ids", "attention_mask", "token_type_ids")
ENCODER_SHAPES = [
    {"name": n, "minShape": [1], "optShape": [32], "maxShape": [128], "padValue": 0} for n in TEXT
]
PAD = {"shapeBatching": "PadToBuckets"}


# -- the shadow and watch story that the transformer families share ------------------------


@dataclass(frozen=True)
class Family:
    """A model with a variable sequence length, how a user deploys it, and its traffic."""

    model: Model
    engine: dict[str, Any]
    """The engine section's fields besides the precision (shapes, calibration)."""
    batching: dict[str, Any]
    traffic: list[dict[str, Any]]
    feeds: list[dict[str, np.ndarray]]
    """Requests answered through tritonclient and judged against the engine."""
    thresholds: dict[str, float]
    scores: str
    """The output that holds the scores (gated at int8)."""


async def shadowed_and_watched(world: World, family: Family) -> None:
    """fp16 served and answering as its engine; an int8 version gated on the scores output,
    shadowed on live traffic, promoted and answering as its engine; then watched against
    the fp32 reference, Healthy; every live request a 200."""
    first = document(
        family.model,
        "1",
        {**family.engine, "precision": "fp16"},
        family.batching,
        rollout=shadow(**family.thresholds),
    )
    int8 = {
        **family.engine,
        "precision": "int8",
        "accuracy": {"maxTop1Drop": 0.2, "gateOutputs": [family.scores]},
    }
    second = document(
        family.model,
        "2",
        int8,
        family.batching,
        rollout=shadow(**family.thresholds),
        qualityWatch=WATCH,
    )
    async with start_operator(world, SETTINGS):
        world.create(first)
        fp16 = await ready(world, "the fp16 engine built and Ready")
        await asyncio.to_thread(answers_as_the_engine, world, fp16, family.feeds)
        world.patch_spec(second["spec"])
        await eventually(
            lambda: (
                candidate(world).get("verdict") == "Pending"
                and ready_urls(world, names.candidate_name(OWNER))
            ),
            180,
            "the int8 candidate built and running",
        )
        async with traffic(world, family.traffic) as codes:
            record = await verdict(world, "Promoted", within=180)
            watched = await healthy(world)
        assert record["samples"] >= SAMPLES and record["mismatches"] == 0, record
        assert served(world) == record["engineDigest"] != fp16
        assert watched["engineDigest"] == record["engineDigest"], watched
        assert set(codes) == {200}, codes
        await serving(world, record["engineDigest"])
        await asyncio.to_thread(answers_as_the_engine, world, record["engineDigest"], family.feeds)
        report = engine_report(world, record["engineDigest"])
        assert {n for n, o in report.items() if o["gated"]} == {family.scores}, report
        assert gated_by_the_build_job(world, "int8") == [family.scores]


# -- the decoder --------------------------------------------------------------------------


def saved_as_torch_saves(path: Path) -> Path:
    """The model at `path` rewritten as torch's exporter writes it: the graph in the
    `.onnx` file, its weights (every tensor over a kilobyte) in `<name>.data` beside it."""
    data = path.with_name(f"{path.name}.data")
    data.unlink(missing_ok=True)  # onnx appends to an existing data file
    onnx.save_model(onnx.load(str(path)), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=data.name)  # fmt: skip
    assert data.stat().st_size > path.stat().st_size
    return path


def decoder_traffic(rng: np.random.Generator, count: int) -> list[dict[str, np.ndarray]]:
    """One-row requests of 1 to 32 new tokens after a past of 0, 4, 8 or 16."""
    return [
        decoder_inputs(rng, 1, int(length), int(past))
        for length, past in zip(
            rng.integers(1, 33, count), rng.choice([0, 4, 8, 16], count), strict=True
        )
    ]


def decoder_family(model: Path, folder: Path) -> Family:
    rng = np.random.default_rng(4)
    calibration = write_samples(folder / "decoder-calibration.npz", decoder_inputs(rng, 40, 8, 8))
    return Family(
        model=Model(model),
        engine={"inputShapes": DECODER_SHAPES, "calibration": source(calibration)},
        batching=PAD,
        traffic=[body(f) for f in decoder_traffic(rng, 48)],
        feeds=[
            decoder_inputs(rng, 1, 5, 0),
            decoder_inputs(rng, 1, 1, 9),
            decoder_inputs(rng, 2, 17, 4),
        ],
        # The caches move by up to a few units under int8 (their top-1 is meaningless, but
        # counted): the thresholds are far from both an int8 engine and another model.
        thresholds={"maxAbsoluteOutputDifference": 5.0, "minTop1Agreement": 0.8},
        scores="logits",
    )


async def test_a_gpt2_decoder_of_variable_length_is_shadowed_watched_and_answers(
    world: World, model_directory: Path
) -> None:
    folder = model_directory / world.namespace
    path = saved_as_torch_saves(build_decoder(folder / "decoder.onnx"))
    await shadowed_and_watched(world, decoder_family(path, folder))


def gpt2_shapes(tokens: int) -> list[dict[str, Any]]:
    """New tokens up to `tokens` after no past (a prompt's first pass)."""
    no_past = [KV[0], 0, KV[1]]
    return [
        {"name": "input_ids", "minShape": [1], "optShape": [64], "maxShape": [tokens]},
        {"name": "attention_mask", "minShape": [1], "optShape": [64], "maxShape": [tokens]},
        *({"name": n, "minShape": no_past, "optShape": no_past, "maxShape": no_past} for n in PAST),
    ]


async def test_a_real_vocabulary_past_its_memory_limit_says_so_in_the_status(
    world: World, model_directory: Path
) -> None:
    """GPT-2's 50257-token vocabulary at 256 tokens and 32 rows needs 1.5 GiB of logits
    buffer: under a 512 MiB limit the pod's runtime reads its cgroup, exits before
    allocating, and the object says what to lower."""
    folder = model_directory / world.namespace
    path = build_decoder(folder / "gpt2-vocabulary.onnx", DecoderConfig(vocab=50257))
    engine = {"precision": "fp32", "maxBatchSize": 32, "inputShapes": gpt2_shapes(256)}
    spec = document(Model(path), "1", engine, {"maxBatchSize": 32})
    spec["spec"]["runtime"]["resources"] = {"memory": "512Mi"}

    def failing() -> dict[str, Any] | None:
        found = ((world.infd() or {}).get("status") or {}).get("conditions") or []
        return next((c for c in found if c["reason"] == "RuntimeFailing"), None)

    async with start_operator(world, SETTINGS):
        world.create(spec)
        said = await waiting(world, failing, "the runtime's refusal in the status")
    lower = "available; lower maxBatchSize, executionSlots or the inputs' maxShape"
    assert lower in said["message"], said
    assert (condition(world.infd(), "Ready") or {}).get("status") == "False"


# -- the digits classifier ----------------------------------------------------------------


async def test_a_digits_classifier_zipmap_refused_otherwise_shadowed_watched_and_answers(
    world: World, model_directory: Path
) -> None:
    folder = model_directory / world.namespace
    data = digits()
    zipmap, _ = build_digits_mlp(folder / "digits-zipmap.onnx", zipmap=True)
    plain_export, classifier = build_digits_mlp(folder / "digits.onnx")
    calibration = write_samples(folder / "digits-calibration.npz", {"X": data.calibration_x})
    int8 = {
        "precision": "int8",
        "calibration": source(calibration),
        "accuracy": {"maxTop1Drop": 0.05, "gateOutputs": ["probabilities"]},
    }
    rows = data.validation_x
    bodies = [body({"X": rows[i : i + 4]}) for i in range(0, len(rows) - 4, 4)]
    feeds = [{"X": rows[:8]}, {"X": rows[100:101]}]
    asked = rows[:64]  # maxBatchSize rows a request
    thresholds = {"maxAbsoluteOutputDifference": 0.6, "minTop1Agreement": 0.9}
    async with start_operator(world, SETTINGS):
        world.create(document(Model(zipmap), "1", int8, name="zipmap"))
        world.create(
            document(Model(plain_export), "1", {"precision": "fp16"}, rollout=shadow(**thresholds))
        )
        await refused(world, "zipmap", "{'zipmap': False}")
        fp16 = await ready(world, "the fp16 digits classifier Ready")
        answers = await asyncio.to_thread(answers_as_the_engine, world, fp16, feeds)
        np.testing.assert_array_equal(answers[0]["label"], classifier.predict(rows[:8]))
        second = document(
            Model(plain_export),
            "2",
            int8,
            rollout=shadow(**thresholds),
            qualityWatch={**WATCH, "minTop1Agreement": 0.9},
        )
        world.patch_spec(second["spec"])
        async with traffic(world, bodies) as codes:
            record = await verdict(world, "Promoted", within=240)
            watched = await healthy(world)
        assert record["samples"] >= SAMPLES and record["top1Agreement"] >= 0.9, record
        assert watched["engineDigest"] == record["engineDigest"] == served(world), watched
        assert set(codes) == {200}, codes
        await serving(world, record["engineDigest"])
        chunks = [{"X": asked[i : i + 8]} for i in range(0, len(asked), 8)]
        answers = await asyncio.to_thread(
            answers_as_the_engine, world, record["engineDigest"], chunks
        )
        labels = np.concatenate([answer["label"] for answer in answers])
        agreement = np.mean(labels == classifier.predict(asked))
        assert agreement >= 0.95, agreement
        report = engine_report(world, record["engineDigest"])
        assert report["probabilities"]["gated"] and not report["label"]["gated"], report
        assert gated_by_the_build_job(world, "int8") == ["probabilities"]


# -- the text classifier ------------------------------------------------------------------


def column(texts: list[str]) -> np.ndarray:
    array = np.empty((len(texts), 1), dtype=object)
    array[:, 0] = [t.encode() for t in texts]
    return array


async def test_a_text_classifier_in_one_graph_is_watched_and_a_worse_version_rolled_back(
    world: World, model_directory: Path
) -> None:
    pytest.importorskip("onnxruntime_extensions")
    folder = model_directory / world.namespace
    full, pipeline = build_text_classifier(folder / "topics.onnx", extensions=True)
    small, small_pipeline = build_text_classifier(
        folder / "small.onnx", extensions=True, per_topic=3
    )
    mixed = [f"{s.capitalize()}!" for s in mixed_sentences(60, seed=3)]
    agreement = np.mean(
        pipeline.predict([normalised(t) for t in mixed])
        == small_pipeline.predict([normalised(t) for t in mixed])
    )
    assert agreement < 0.85, f"the smaller model agrees too often ({agreement}) to be refused"
    calibration = write_samples(folder / "texts.npz", {"raw_text": np.array(mixed)[:, None]})
    bodies = [body({"raw_text": column([t])}) for t in mixed]
    _, _, held, _ = text_split()
    shouted = [f"{t.upper()}?!" for t in held]
    thresholds = {"maxAbsoluteOutputDifference": 1.0, "minTop1Agreement": 0.95}
    fp16 = {"precision": "fp16"}
    async with start_operator(world, SETTINGS):
        int8 = {"precision": "int8", "calibration": source(calibration)}
        world.create(document(Model(full), "1", int8, name="int8"))
        world.create(
            document(
                Model(full),
                "1",
                fp16,
                rollout=shadow(**thresholds),
                qualityWatch={**WATCH, "minTop1Agreement": 0.95},
            )
        )
        await refused(world, "int8", "Build it at fp32")
        served_fp16 = await ready(world, "the fp16 text classifier Ready")
        halves = [{"raw_text": column(shouted[:5])}, {"raw_text": column(shouted[5:])}]
        answers = await asyncio.to_thread(answers_as_the_engine, world, served_fp16, halves)
        labels = [str(label) for answer in answers for label in answer["label"]]
        assert labels == list(pipeline.predict([normalised(t) for t in held]))
        async with traffic(world, bodies) as codes:
            watched = await healthy(world)
            assert watched["top1Agreement"] == 1.0, watched
            world.patch_spec(
                document(Model(small), "2", fp16, rollout=shadow(**thresholds))["spec"]
            )
            record = await verdict(world, "Failed", within=240)
        assert record["reason"] == "Top1AgreementTooLow", record
        assert record["top1Agreement"] < 0.95, record
        assert served(world) == served_fp16
        assert set(codes) == {200}, codes


# -- the same on models exported by torch and transformers --------------------------------


@pytest.mark.transformers
@pytest.mark.parametrize("architecture", ["bert", "gpt2"])
async def test_a_torch_export_is_shadowed_watched_and_answers(
    world: World, model_directory: Path, architecture: str
) -> None:
    """Ran from a venv of its own with torch 2.15.0 and transformers 5.24.0 (2026-11-27),
    which the project's venv does not pin: docs/development.md, "The transformers marker"."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from models.torch_models import export_bert, export_gpt2

    folder = model_directory / world.namespace
    folder.mkdir(parents=True, exist_ok=True)
    export: Callable[[Path], Path] = export_bert if architecture == "bert" else export_gpt2
    path = export(folder / f"{architecture}.onnx")
    if architecture == "gpt2":
        family = decoder_family(path, folder)
    else:
        rng = np.random.default_rng(6)
        calibration = write_samples(folder / "bert-calibration.npz", encoder_inputs(rng, 40, 32))
        family = Family(
            model=Model(path),
            engine={"inputShapes": ENCODER_SHAPES, "calibration": source(calibration)},
            batching=PAD,
            traffic=[body(encoder_inputs(rng, 1, int(n))) for n in rng.integers(1, 129, 48)],
            feeds=[encoder_inputs(rng, 1, 7), encoder_inputs(rng, 2, 100)],
            thresholds={"maxAbsoluteOutputDifference": 3.0, "minTop1Agreement": 0.8},
            scores="logits",
        )
    await shadowed_and_watched(world, family)
