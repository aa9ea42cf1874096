"""The operator's own /metrics (`run_operator(metrics_port=...)`, the chart's
`--metrics-port`) on the real control plane: a served object's Ready condition and its
replicas, a failed build's EngineReady=False EngineBuildFailed, each labelled with the
object's namespace and name, as the chart's alerts select them; a deleted object's series
go with it. Series names and labels come from `kubeinfer.contract.metric_series`.
"""

from __future__ import annotations

import asyncio
import http.client
from pathlib import Path

from decide_scenarios import tuned
from kubeinfer.contract import metric_series as series
from operator_harness import FAST, IDS, Model, World, eventually, manifest, start_operator
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, frozenset[tuple[str, str]], float]


def scrape(port: int) -> list[Sample]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        assert response.status == 200
        text = response.read().decode()
    finally:
        connection.close()
    return [
        (s.name, frozenset(s.labels.items()), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def value(samples: list[Sample], family: series.Series, **labels: str) -> float | None:
    for name, found, figure in samples:
        if name == family.name and set(labels.items()) <= found:
            return figure
    return None


async def test_conditions_and_replicas_of_each_object_until_it_is_deleted(
    world: World, tiny: Model, model_directory: Path
) -> None:
    broken = Model(model_directory / f"{world.namespace}-broken.onnx")
    broken.path.write_bytes(b"not an ONNX model")
    failing = manifest(broken, name="broken")
    no_retry = tuned(
        FAST, build={"backoff_seconds": 60, "backoff_max_seconds": 60, "backoff_limit": 0}
    )
    port = free_port()
    ns = world.namespace
    try:
        async with start_operator(world, no_retry, metrics_port=port):
            world.create(manifest(tiny, runtime={"replicas": 2}))
            world.create(failing)

            def settled() -> list[Sample] | None:
                samples = scrape(port)
                ready = value(samples, series.INFERENCE_DEPLOYMENT_CONDITION, namespace=ns,
                              name="resnet", type="Ready", status="True")  # fmt: skip
                failed = value(samples, series.INFERENCE_DEPLOYMENT_CONDITION, namespace=ns,
                               name="broken", type="EngineReady", status="False",
                               reason="EngineBuildFailed")  # fmt: skip
                return samples if ready == 1 and failed == 1 else None

            samples = await eventually(settled, 90, "Ready and EngineBuildFailed exported")
            for name in ("resnet", "broken"):
                status = world.infd(name)["status"]
                for kind, key in (
                    (series.INFERENCE_DEPLOYMENT_REPLICAS, "replicas"),
                    (series.INFERENCE_DEPLOYMENT_READY_REPLICAS, "readyReplicas"),
                ):
                    assert value(samples, kind, namespace=ns, name=name) == status[key]
                exported = {
                    (dict(labels)["type"], dict(labels)["status"], dict(labels)["reason"])
                    for n, labels, _ in samples
                    if n == series.INFERENCE_DEPLOYMENT_CONDITION.name
                    and dict(labels)["name"] == name
                }
                written = {(c["type"], c["status"], c["reason"]) for c in status["conditions"]}
                assert exported == written, name
            assert value(samples, series.INFERENCE_DEPLOYMENT_REPLICAS, name="resnet") == 2

            world.kube.delete(*IDS, "resnet", namespace=ns)
            await eventually(
                lambda: (
                    value(scrape(port), series.INFERENCE_DEPLOYMENT_REPLICAS, name="resnet") is None
                ),
                30,
                "the deleted object's series gone",
            )
            left = await asyncio.to_thread(scrape, port)
            assert value(left, series.INFERENCE_DEPLOYMENT_REPLICAS, name="broken") is not None
    finally:
        broken.path.unlink(missing_ok=True)
