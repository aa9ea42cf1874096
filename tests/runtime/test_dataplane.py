"""The data plane's own decisions, which both transports hand their requests to
(`kubeinfer.runtime.dataplane`), on the tiny model's real engine with an injected clock:
a client's deadline (gRPC's) shortens a request's timeout only when it is sooner, the
request limit refuses a message past it with a 413 naming the limit, and `assemble`
joins the parts once (the mirrors' series in the one registry /metrics serves)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubeinfer.contract.runtime_config import BatchingPolicy, EngineSource, RuntimeConfig
from kubeinfer.runtime.batching.admission import Admission
from kubeinfer.runtime.dataplane import DataPlane
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from kubeinfer.runtime.protocol.errors import RequestTooLarge
from kubeinfer.runtime.protocol.v2_types import InferRequest
from kubeinfer.runtime.serving import assemble

NOW = 10.5
ARRIVED = 10.0


@pytest.fixture
def dataplane(tiny_model: Path, tiny_engine: OnnxRuntimeEngine) -> Iterator[DataPlane]:
    config = RuntimeConfig(
        model_name="tiny",
        engine=EngineSource(onnx_path=str(tiny_model)),
        max_request_bytes=4096,
        batching=BatchingPolicy(default_timeout_milliseconds=2000),
    )
    assembled = assemble(config, tiny_engine, clock=lambda: NOW)
    yield assembled
    assembled.codec.close()


@pytest.mark.parametrize(
    ("own_microseconds", "remaining_seconds", "expected_microseconds"),
    [
        (None, None, None),  # no client deadline: the request's own (the default) stands
        (300_000, None, 300_000),
        (None, 0.25, 750_000),  # sooner than the default: from arrival, 0.5 s + 0.25 s
        (300_000, 0.25, 300_000),  # its own is sooner still
        (None, 5.0, 2_000_000),  # the default is sooner
        (None, -1.0, 1),  # passed already: the shortest timeout, never 0 (the default)
    ],
)
def test_a_client_deadline_shortens_the_timeout_only_when_sooner(
    dataplane: DataPlane,
    own_microseconds: int | None,
    remaining_seconds: float | None,
    expected_microseconds: int | None,
) -> None:
    request = InferRequest(id=None, inputs=[], timeout_microseconds=own_microseconds)
    admission = Admission(arrived_at=ARRIVED, deadline=ARRIVED + 2.0)
    dataplane.bound_by_client(admission, request, remaining_seconds)
    assert request.timeout_microseconds == expected_microseconds


def test_a_request_past_the_limit_is_refused_naming_it(dataplane: DataPlane) -> None:
    dataplane.check_request_bytes(4096, "message")
    with pytest.raises(RequestTooLarge) as refused:
        dataplane.check_request_bytes(4097, "message")
    assert refused.value.status == 413
    assert "the request message (4097 bytes) is over the limit of 4096 bytes" in str(refused.value)
    assert "maxRequestBytes" in str(refused.value)


def test_assemble_joins_the_parts_once(dataplane: DataPlane) -> None:
    assert dataplane.shadow is not None
    assert dataplane.shadow.slice_header is dataplane.slice_header is None
    names = {metric.name for metric in dataplane.metrics.registry.collect()}
    assert "kubeinfer_requests" in names  # the requests counter, `_total` left off
    assert any(name.startswith("kubeinfer_shadow") for name in names), sorted(names)
