"""A replica of another runtime version among its peers, as real processes: four `kubeinfer
serve` of one engine (fp32, from one cache), one of them with the stand-in for another
runtime's numerics (`--testing-faults perturb-batches=1,perturb-lowest-bit`: every float
it answers one unit in the last place off). Each answers the operator's `POST
/v2/known-answers`, and the operator's own reading (`answers_from_wire`) and decision
(`decide_answers`) take those bodies as they come.

- Every replica passes its own set: the odd one's error is far inside its tolerance, so
  the check against the recorded answers alone would let it serve.
- Its answer digests differ from its three peers', which agree bit for bit (one engine,
  one CPU): it alone is taken out, as answering unlike its peers, naming its first
  differing probe.
- Without the fault, the four agree and nothing is taken out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.operator.api.v1alpha1.conditions import Reason
from kubeinfer.operator.reconcile.known_answers import decide_answers
from kubeinfer.operator.state.known_answers import (
    AnswerReadings,
    Hardware,
    PodAnswers,
    answers_from_wire,
)
from kubeinfer.runtime.building.engine_build import build_engine
from serve_process import ServeProcess
from test_known_answers_decision import pod

pytestmark = pytest.mark.slow

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
NODE = Hardware("node-1", cpu_model="the test machine's CPU")
ROWS = "16"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    root = tmp_path_factory.mktemp("peers")
    built = build_engine(str(build_tiny_mlp(root / "tiny.onnx")), "onnxruntime", "fp32",
                         root / "cache", max_batch_size=int(ROWS))  # fmt: skip
    return built.digest, root / "cache"


@pytest.fixture(scope="module")
def replicas(engine: tuple[str, Path]) -> Iterator[list[ServeProcess]]:
    """Three sound replicas and, last, the one of another runtime version."""
    digest, cache = engine
    flags = ("--engine", digest, "--cache", str(cache), "--max-batch-size", ROWS,
             "--intra-op-threads", "1")  # fmt: skip
    odd = ("--testing-faults", "perturb-batches=1,perturb-lowest-bit")
    started: list[ServeProcess] = []
    try:
        for extra in ((), (), (), odd):
            started.append(ServeProcess(None, "tiny", *flags, *extra))
        yield started
    finally:
        for server in started:
            server.stop()


def asked(
    servers: list[ServeProcess], digest: str
) -> tuple[list[Any], list[PodAnswers], list[dict[str, Any]]]:
    """Each server's answer to the operator's POST, as sent and as the operator reads it."""
    pods, answers, bodies = [], [], []
    for index, server in enumerate(servers):
        status, _, body = server.request("POST", "/v2/known-answers", timeout=30)
        assert status == 200, body
        pods.append(pod(f"tiny-{index}", NODE.node, gate="True"))
        bodies.append(json.loads(body))
        answers.append(answers_from_wire(pods[-1], digest, bodies[-1]))
    return pods, answers, bodies


def readings(pods: list[Any], answers: list[PodAnswers]) -> AnswerReadings:
    return AnswerReadings(
        pods=tuple(pods),
        answers={a.uid: a for a in answers},
        hardware={NODE.node: NODE},
        taken_out=(),
        next_check_in_seconds=300.0,
    )


def test_the_replica_of_another_runtime_passes_its_set_but_is_taken_out_by_its_peers(
    replicas: list[ServeProcess], engine: tuple[str, Path]
) -> None:
    pods, answers, bodies = asked(replicas, engine[0])
    assert [a.result for a in answers] == ["passed"] * 4
    odd = answers[-1]
    for output in bodies[-1]["latest"]["outputs"]:  # far inside: only the peers can tell
        assert 0 < output["error"] < output["tolerance"] / 100, output
    assert len({a.answer_digests for a in answers[:3]}) == 1
    assert odd.answer_digests != answers[0].answer_digests
    report = decide_answers(readings(pods, answers), NOW)
    assert [t.record.pod for t in report.take_out] == ["tiny-3"]
    record = report.take_out[0].record
    assert record.reason == Reason.ANSWERS_DIFFER_FROM_PEERS
    assert record.engine_digest == engine[0] and record.node == NODE.node
    first_differing = next(
        i
        for i, (a, b) in enumerate(zip(odd.answer_digests, answers[0].answer_digests, strict=True))
        if a != b
    )
    assert record.probe == first_differing


def test_sound_replicas_of_one_engine_agree_and_none_is_taken_out(
    replicas: list[ServeProcess], engine: tuple[str, Path]
) -> None:
    pods, answers, _ = asked(replicas[:3], engine[0])
    assert [a.result for a in answers] == ["passed"] * 3
    assert decide_answers(readings(pods, answers), NOW).take_out == ()
