"""What the scenarios of `test_operator_real_models` share: InferenceDeployments of a
model as a user writes them (gRPC on, a memory limit), the waits on what the operator
reports, live traffic to the serving pods, and the check of their answers through
tritonclient over HTTP and gRPC against ONNX Runtime on the engine file they serve (read
from the cache claim on the node, with the runtime's own session options).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from cluster_harness import file_url
from decide_scenarios import tuned
from kubeinfer.operator.state import names
from kubeinfer.runtime.engine_cache import resolve_engine
from kubeinfer.runtime.engines.onnx_text import open_session
from kubeinfer.runtime.engines.onnxruntime import serving_session_options
from operator_harness import FAST, IDS, Model, World, condition, eventually
from test_operator_shadow_rollout import ready_urls, runs_engine, traffic_to
from tritonclient.utils import np_to_triton_dtype

SETTINGS = tuned(
    FAST,
    requeue={"shadow_poll_seconds": 0.5},
    pods={"pre_stop_sleep_seconds": 3},
    # A refused model fails its Job at once rather than on a second pod.
    build={"backoff_limit": 0},
)
OWNER = "resnet"  # the shadow harness's helpers name the object so
SERVICE = names.service_name(OWNER)
HTTP_PORT, GRPC_PORT = 8000, 8001
SAMPLES = 40
RUNTIME = {"replicas": 1, "grpcPort": GRPC_PORT, "resources": {"memory": "1Gi"}}
WATCH = {
    "enabled": True,
    "samplePercent": 100,
    "windowSeconds": 30,
    "minSamples": SAMPLES,
    "minTop1Agreement": 0.8,
    "minClassAgreement": 0.0,
}


def digest_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source(path: Path) -> dict[str, str]:
    return {"uri": file_url(path), "sha256": digest_of(path)}


def document(
    model: Model,
    version: str,
    engine: dict[str, Any],
    batching: dict[str, Any] | None = None,
    name: str = OWNER,
    **spec: Any,
) -> dict[str, Any]:
    """An InferenceDeployment of `model` as a user writes one: the engine given, gRPC on,
    a memory limit, one replica."""
    body = {
        "model": {"name": "resnet", "version": version, "source": source(model.path)},
        "engine": {"backend": "onnxruntime", "maxBatchSize": 8, **engine},
        "runtime": {**RUNTIME, "batching": {"maxBatchSize": 8, **(batching or {})}},
        **spec,
    }
    return {
        "apiVersion": IDS[0],
        "kind": "InferenceDeployment",
        "metadata": {"name": name},
        "spec": body,
    }


def shadow(**thresholds: float) -> dict[str, Any]:
    return {
        "strategy": "Shadow",
        "shadow": {
            "trafficPercent": 100,
            "minSamples": SAMPLES,
            "maxDurationSeconds": 300,
            "thresholds": {"maxP99LatencyRegressionPercent": 1000, **thresholds},
        },
    }


# -- what the pods answer -----------------------------------------------------------------


def engine_session(world: World, digest: str) -> tuple[ort.InferenceSession, str]:
    """ONNX Runtime on the engine file the pods serve, from the cache claim on the node,
    with the runtime's session options (one thread), and the engine's precision."""
    cache = world.cluster.claim_directory(world.namespace, names.cache_claim_name(OWNER))
    resolved = resolve_engine(cache, digest)
    session = open_session(
        str(resolved.engine_path), serving_session_options(1), providers=["CPUExecutionProvider"]
    )
    return session, str(resolved.manifest.key.precision)


def tolerance(want: np.ndarray, precision: str) -> dict[str, float]:
    """Equal up to float32 rounding, or an fp16 engine's answer up to fp16's: a request
    padded to a bucket (PadToBuckets) sums in another order, a last-bit change in float32
    can flip a value the engine rounds to fp16, and later layers carry that step on (a
    GPT-2 exported by torch: one fp16 step on some logits and caches). The fp16 bound is
    relative to the tensor's largest value, so a wrong row or unmasked padding still fails."""
    if precision != "fp16":
        return {"rtol": 1e-4, "atol": 1e-4}
    return {"rtol": 1e-3, "atol": max(1e-4, 1e-3 * float(np.abs(want).max(initial=0)))}


def engine_report(world: World, digest: str) -> dict[str, dict[str, Any]]:
    """The engine's accuracy report, per output, as its manifest in the cache records it."""
    cache = world.cluster.claim_directory(world.namespace, names.cache_claim_name(OWNER))
    report = resolve_engine(cache, digest).manifest.accuracy
    assert report is not None, f"engine {digest} has no accuracy report"
    return {o["name"]: o for o in report.to_wire()["outputs"]}


def gated_by_the_build_job(world: World, precision: str) -> list[str]:
    """The outputs the object's build Job of `precision` was told to gate (`--gate-outputs`)."""
    (job,) = [
        j for j in world.jobs()
        if j["metadata"]["labels"].get(names.LABEL_INSTANCE) == OWNER
        and "--precision" in (args := j["spec"]["template"]["spec"]["containers"][0]["args"])
        and args[args.index("--precision") + 1] == precision
    ]  # fmt: skip
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index("--gate-outputs") + 1].split(",") if "--gate-outputs" in args else []


def ask(ip: str, feed: dict[str, np.ndarray], outputs: list[str]) -> dict[str, dict[str, Any]]:
    """One request to the pod at `ip` through tritonclient over HTTP (binary tensors) and
    over gRPC; each transport's outputs."""
    answers = {}
    for module, port in ((triton_http, HTTP_PORT), (triton_grpc, GRPC_PORT)):
        client = module.InferenceServerClient(f"{ip}:{port}")
        try:
            inputs = []
            for name, array in feed.items():
                tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            wanted = [module.InferRequestedOutput(name) for name in outputs]
            result = client.infer("resnet", inputs, outputs=wanted)
            answers[module.__name__] = {name: result.as_numpy(name) for name in outputs}
        finally:
            client.close()
    return answers


def plain(array: np.ndarray) -> np.ndarray:
    """Strings as text, whichever side decoded them (tritonclient gives bytes)."""
    if array.dtype != object:
        return array
    return np.vectorize(lambda e: e.decode() if isinstance(e, bytes) else str(e))(array)


def answers_as_the_engine(
    world: World, digest: str, feeds: list[dict[str, np.ndarray]]
) -> list[dict[str, np.ndarray]]:
    """Asks every serving pod each feed over both transports, checks each answer against
    ONNX Runtime on the engine, and returns the engine's answers."""
    session, precision = engine_session(world, digest)
    outputs = [o.name for o in session.get_outputs()]
    ips = [re.sub(r"^http://|:\d+$", "", url) for url in ready_urls(world, SERVICE)]
    assert ips, "no ready serving pod"
    found = []
    for feed in feeds:
        # ONNX Runtime takes text as str, the wire as bytes.
        direct_feed = {k: plain(v).astype(str) if v.dtype == object else v for k, v in feed.items()}
        direct = dict(zip(outputs, session.run(outputs, direct_feed), strict=True))
        found.append(direct)
        for ip in ips:
            for transport, answer in ask(ip, feed, outputs).items():
                for name in outputs:
                    got, want = plain(answer[name]), plain(direct[name])
                    what = f"{name} from {ip} over {transport}"
                    if want.dtype.kind in "fc":
                        limits = tolerance(want, precision)
                        np.testing.assert_allclose(got, want, **limits, err_msg=what)
                    else:
                        np.testing.assert_array_equal(got, want, err_msg=what)
    return found


async def serving(world: World, digest: str) -> None:
    """Every live serving pod runs `digest`, and one is ready."""
    await eventually(
        lambda: (
            all(runs_engine(p, digest) for p in serving_pods(world)) and ready_urls(world, SERVICE)
        ),
        120,
        f"the serving pods on {digest}",
    )


def serving_pods(world: World) -> list[dict[str, Any]]:
    selector = names.selector_string(names.serving_selector(OWNER))
    return [p for p in world.pods(selector) if not p["metadata"].get("deletionTimestamp")]


def served(world: World) -> str | None:
    return (((world.infd() or {}).get("status") or {}).get("serving") or {}).get("engineDigest")


def explained(world: World) -> str:
    """The object's conditions and its pods' container states, for a failure message."""
    conditions = [
        (c["type"], c["status"], c["reason"], c.get("message", "")[:300])
        for c in ((world.infd() or {}).get("status") or {}).get("conditions") or []
    ]
    pods = {
        p["metadata"]["name"]: [
            (c["name"], c.get("state"), c.get("lastState"), c.get("restartCount"))
            for c in (p.get("status") or {}).get("containerStatuses") or []
        ]
        for p in world.pods()
    }
    return f"conditions: {conditions}; pods: {pods}"


async def waiting(world: World, check: Callable[[], Any], what: str, within: float = 180) -> Any:
    """`eventually`, saying on a timeout where the object and its pods stood."""
    try:
        return await eventually(check, within, what)
    except AssertionError as error:
        raise AssertionError(f"{error}; {explained(world)}") from None


async def ready(world: World, what: str) -> str:
    """Waits for the object Ready with a serving pod; the served engine's digest."""
    await waiting(
        world, lambda: (condition(world.infd(), "Ready") or {}).get("status") == "True", what
    )
    digest = served(world)
    assert digest
    await serving(world, digest)
    return digest


async def refused(world: World, name: str, words: str) -> str:
    """Waits for the object `name`'s EngineReady=False EngineBuildFailed condition and
    returns its message, which must contain `words`; then deletes the object (a refused
    build is retried on the operator's back-off, and nothing here will fix it)."""

    def failed() -> str | None:
        engine = condition(world.infd(name), "EngineReady") or {}
        return engine.get("reason") == "EngineBuildFailed" and engine.get("message")

    message = await eventually(failed, 120, f"{name}'s build refused")
    assert words in message, message
    assert (condition(world.infd(name), "Ready") or {}).get("status") != "True"
    world.kube.delete(*IDS, name)
    return str(message)


def traffic(
    world: World, bodies: list[dict[str, Any]]
) -> contextlib.AbstractAsyncContextManager[Counter[int | str]]:
    """`bodies` (JSON requests) in turn to the serving Service's ready pods (`traffic_to`)."""
    return traffic_to(
        world, SERVICE, lambda index, count: bodies[(index * 7 + count) % len(bodies)]
    )


def body(feed: dict[str, np.ndarray]) -> dict[str, Any]:
    """A JSON inference request of `feed`."""
    tensors = []
    for name, array in feed.items():
        data = plain(array).ravel().tolist()
        tensors.append(
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": np_to_triton_dtype(array.dtype),
                "data": data,
            }
        )
    return {"inputs": tensors}


def watch_status(world: World) -> dict[str, Any]:
    return ((world.infd() or {}).get("status") or {}).get("qualityWatch") or {}


async def healthy(world: World) -> dict[str, Any]:
    """Waits for the quality watch to judge a full window Healthy; its status."""
    status: dict[str, Any] = await eventually(
        lambda: (s := watch_status(world)).get("state") == "Healthy" and s, 180, "the watch Healthy"
    )
    assert status["samples"] >= SAMPLES, status
    assert (condition(world.infd(), "Degraded") or {}).get("status") == "False"
    return status
