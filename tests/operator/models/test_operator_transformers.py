"""The BERT-style encoder (`models.transformer_models`, three INT64 inputs of a variable
sequence length) rolled out and watched on the real control plane: the real operator,
real build Jobs, real serving, candidate and reference pods, live requests of lengths
drawn from 1 to 128 tokens.

- an int8 build of the same encoder, shadow-tested against the fp32 one on live traffic of
  mixed lengths (the pods padding them to buckets), agrees and is promoted; every live
  request got a 200; the promoted pods answer requests of 1 to 128 tokens through
  tritonclient over HTTP and gRPC as ONNX Runtime answers them on the engine file;
- a quality watch of the int8 engine against its fp32 reference, on the same traffic,
  compares requests of every length and is Healthy.

The engine's inputShapes and the batching's shapeBatching reach the pods through the
rendered runtime configuration; nothing here is specific to the tiny model the other
scenarios serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cluster_harness import file_url
from decide_scenarios import tuned
from kubeinfer.operator.state import names
from models.transformer_models import build_encoder, encoder_inputs
from operator_harness import FAST, Model, World, condition, eventually, manifest, start_operator
from real_models_harness import GRPC_PORT, answers_as_the_engine, serving
from test_operator_shadow_rollout import candidate, ready_urls, served_digest, traffic_to, verdict

pytestmark = pytest.mark.slow

FAST_SHADOW = tuned(FAST, requeue={"shadow_poll_seconds": 0.5}, pods={"pre_stop_sleep_seconds": 3})
OWNER = "resnet"  # the harness's manifests name the object and the model so
TEXT = ("input_ids", "attention_mask", "token_type_ids")
SHAPES = {
    "maxBatchSize": 8,
    "inputShapes": [
        {"name": n, "minShape": [1], "optShape": [32], "maxShape": [128], "padValue": 0}
        for n in TEXT
    ],
}
BATCHING = {"shapeBatching": "PadToBuckets", "shapeBuckets": [16, 32, 64, 128]}


def digest_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def encoder_model(world: World, folder: Path) -> tuple[Model, dict[str, Any]]:
    """The encoder, and int8 calibration data of its inputs (64 sequences of 32 tokens)."""
    model = Model(build_encoder(folder / f"{world.namespace}-encoder.onnx"))
    samples = encoder_inputs(np.random.default_rng(5), 64, 32)
    path = folder / f"{world.namespace}-calibration.npz"
    np.savez(path, **samples)
    return model, {"uri": file_url(path), "sha256": digest_of(path)}


def encoder_manifest(model: Model, version: str, **spec: Any) -> dict[str, Any]:
    document = manifest(model, version=version, **spec)
    document["spec"]["engine"].update(SHAPES)
    document["spec"]["runtime"]["batching"].update(BATCHING)
    document["spec"]["runtime"]["grpcPort"] = GRPC_PORT
    return document


def mixed_lengths(world: World) -> contextlib.AbstractAsyncContextManager[Counter[int | str]]:
    """One-sequence requests of 1 to 128 tokens to the serving Service's ready pods until
    the block ends (`traffic_to`); yields the status codes."""
    rng = np.random.default_rng(8)
    bodies = []
    for length in rng.integers(1, 129, 64):
        feed = encoder_inputs(rng, 1, int(length))
        bodies.append({"inputs": [
            {"name": n, "shape": [1, int(length)], "datatype": "INT64",
             "data": feed[n].ravel().tolist()} for n in TEXT
        ]})  # fmt: skip
    service = names.service_name(OWNER)
    return traffic_to(world, service, lambda index, count: bodies[(index * 31 + count) % 64])


async def ready(world: World, what: str) -> None:
    await eventually(
        lambda: (condition(world.infd(), "Ready") or {}).get("status") == "True", 180, what
    )


async def test_an_int8_bert_shadowed_on_mixed_lengths_is_promoted(
    world: World, model_directory: Path
) -> None:
    model, calibration = encoder_model(world, model_directory)
    shadow = {
        "strategy": "Shadow",
        "shadow": {
            "trafficPercent": 100, "minSamples": 40, "maxDurationSeconds": 300,
            # Hidden states move by about 1 under int8 (their scale is a layer norm's).
            "thresholds": {"maxAbsoluteOutputDifference": 3.0, "minTop1Agreement": 0.8,
                           "maxP99LatencyRegressionPercent": 1000},
        },
    }  # fmt: skip
    async with start_operator(world, FAST_SHADOW):
        world.create(encoder_manifest(model, "1", rollout=shadow))
        await ready(world, "the fp32 encoder built and Ready")
        fp32 = served_digest(world)
        update = encoder_manifest(
            model, "2", rollout=shadow, engine={"precision": "int8", "calibration": calibration}
        )
        world.patch_spec(update["spec"])
        await eventually(
            lambda: (
                candidate(world).get("verdict") == "Pending"
                and ready_urls(world, names.candidate_name(OWNER))
            ),
            within=180,
            what="the int8 candidate built and running",
        )
        async with mixed_lengths(world) as codes:
            await verdict(world, "Promoted", within=240)
        record = candidate(world)
        assert record["samples"] >= 40 and record["top1Agreement"] >= 0.8, record
        assert served_digest(world) == record["engineDigest"] != fp32
        assert set(codes) == {200}, codes
        # The promoted engine answers requests of several lengths through tritonclient,
        # over HTTP and gRPC, as ONNX Runtime answers them on its engine file.
        await serving(world, record["engineDigest"])
        rng = np.random.default_rng(9)
        feeds = [encoder_inputs(rng, rows, n) for rows, n in ((1, 1), (2, 57), (1, 128))]
        await asyncio.to_thread(answers_as_the_engine, world, record["engineDigest"], feeds)


async def test_a_quality_watch_of_an_int8_bert_compares_every_length(
    world: World, model_directory: Path
) -> None:
    model, calibration = encoder_model(world, model_directory)
    watch = {
        "enabled": True, "samplePercent": 100, "windowSeconds": 60, "minSamples": 40,
        "minTop1Agreement": 0.8, "minClassAgreement": 0.0,
    }  # fmt: skip
    spec = encoder_manifest(
        model, "1", engine={"precision": "int8", "calibration": calibration}, qualityWatch=watch
    )
    async with start_operator(world, FAST_SHADOW):
        world.create(spec)
        await ready(world, "the int8 encoder built and Ready")
        await eventually(
            lambda: ready_urls(world, names.reference_name(OWNER)), 180, "the fp32 reference"
        )
        async with mixed_lengths(world) as codes:
            healthy = await eventually(
                lambda: (
                    (
                        status := (world.infd() or {}).get("status", {}).get("qualityWatch") or {}
                    ).get("state")
                    == "Healthy"
                    and status
                ),
                within=180,
                what="the watch Healthy",
            )
        assert healthy["samples"] >= 40 and healthy["top1Agreement"] >= 0.8, healthy
        assert (condition(world.infd(), "Degraded") or {}).get("status") == "False"
        assert set(codes) == {200}, codes
