"""The demo's scale to zero: a model with `minReplicas: 0` goes to zero pods once idle, its
Service handed to the activator (which `kubeinfer up` installs), and its next request is
held there while a pod starts, then answered (docs/scale-to-zero.md).

The object goes to zero only once both activator pods have loaded its route, which the
kubelet delivers through a ConfigMap volume on its own period (up to about a minute): the
step waits for that, then for the idle window, then shows `kubectl get infd` (READY 0/0,
ZERO True), sends one request to the Service and prints how long its answer took: the
cold start, with the engine in the node's cache.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import numpy as np
from kubeinfer.cli.demo.step_protocol import Demo, Step

NAME = "idle"
WINDOW_SECONDS = 10
ZERO_WITHIN_SECONDS = 180
"""The route's delivery to the activator pods, then the idle window."""


def spec_of(source: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": {"name": NAME, "version": "1", "source": source},
        "engine": {"backend": "onnxruntime", "precision": "fp32", "maxBatchSize": 8},
        "runtime": {"batching": {"maxBatchSize": 8}},
        "autoscaling": {
            "enabled": True,
            "minReplicas": 0,
            "maxReplicas": 2,
            "scaleToZeroAfterSeconds": WINDOW_SECONDS,
        },
    }


def _body(rows: np.ndarray) -> dict[str, Any]:
    return {"inputs": [{"name": "input", "shape": list(rows.shape), "datatype": "FP32",
                        "data": rows.ravel().tolist()}]}  # fmt: skip


async def _ask(url: str, rows: np.ndarray) -> int:
    timeout = aiohttp.ClientTimeout(total=120)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(url, json=_body(rows)) as answer,
    ):
        await answer.read()
        return answer.status


async def scale_to_zero(
    demo: Demo, step: Step, manifest: Callable[[str, dict[str, Any]], dict[str, Any]],
    source: dict[str, Any],
) -> None:  # fmt: skip
    """The step: serve, go to zero, answer the next request from zero."""
    await demo.apply([manifest(NAME, spec_of(source))])
    await demo.until(lambda: demo.ready(NAME), 120, f"{NAME} to be Ready")
    url = await demo.endpoint(NAME)
    rows = np.random.default_rng(5).standard_normal((1, 512)).astype(np.float32)

    async def answered() -> bool:
        # kube-proxy refuses a new Service's cluster IP until it has programmed its rules.
        try:
            return await _ask(url, rows) == 200
        except aiohttp.ClientConnectorError:
            return False

    await demo.until(answered, 60, f"{NAME}'s Service to answer")
    demo.say(f"  idle for scaleToZeroAfterSeconds {WINDOW_SECONDS}: zero pods once the "
             "activator routes it")  # fmt: skip

    async def at_zero() -> bool:
        infd = await demo.infd(NAME)
        return demo.condition(infd, "ScaledToZero").get("status") == "True" and (
            (infd.get("status") or {}).get("ready") == "0/0"
        )

    async def no_pod_left() -> bool:
        # Its last pod gone, draining included: zero pods indeed.
        serving = f"app.kubernetes.io/instance={NAME},kubeinfer.io/role=serving"
        listing = await demo.kubectl("get", "pods", "-l", serving,
                                     "-o", "json")  # fmt: skip
        return not json.loads(listing)["items"]

    await demo.until(at_zero, ZERO_WITHIN_SECONDS, f"{NAME} at zero pods")
    await demo.until(no_pod_left, 60, f"the last pod of {NAME} gone")
    await demo.show("get", "infd", NAME)
    sent = time.monotonic()
    status = await _ask(url, rows)
    cold = time.monotonic() - sent
    assert status == 200, f"the request from zero was answered {status}"
    demo.say(f"  the request from zero: {status} after {cold:.1f} s (a pod started for it)")
    await demo.show("get", "infd", NAME)
    step.outcome = f"zero pods when idle; the next request answered in {cold:.1f} s"
