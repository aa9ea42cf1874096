"""`kubeinfer demo` (`make demo`): the product doing its job, through the real operator on
the real API server, on a built-in model.

`kubeinfer up`'s session (`kubeinfer.cli.local`) builds what it needs, starts the control
plane and node in a network namespace of its own and installs the operator; the demo then
tells the story an SRE lives, printing what `kubectl get infd` prints at each step (the
session's watch prints a row whenever it changes; at each step's end the demo runs the
cluster's own kubectl). The requests it shows go to the endpoints it prints, 127.0.0.1
ports of the namespace it was started in; its load goes to the Services' ClusterIPs,
from inside, sparing the two cores the relay:

1. apply an InferenceDeployment of a generated model (a `file://` source, which the
   session serves to the pods over HTTP): the operator builds its engine in a Job and
   rolls out a runtime pod: BuildingEngine, then Ready;
2. requests answered at its local endpoint, checked against ONNX Runtime in-process;
3. a burst of load on a heavier model: the autoscaler scales up on the requests in
   progress, and back down once the burst is over and its window has passed;
4. a new version, int8, with `strategy: Shadow`: live traffic mirrored to the candidate
   and compared request by request (the agreement read from the status as it grows),
   then Promoted, the serving pods rolled to it;
5. its quality watch (`quality`): the int8 engine compared with its fp32 reference on a
   sample of live traffic, Healthy, then a drift on one class and one tenant caught
   (Degraded=True QualityDrift) while the overall agreement holds, and the exemplars
   behind it fetched from the serving pod;
6. a bad candidate (another model behind the same tensor names): Failed, and the serving
   pods untouched;
7. with autoscaling off, `kubectl scale infd` sets the pods;
8. a replica that answers wrong (`answers`): an object of two pods with the operator's
   known-answer checks on, whose pods alone get the tests' fault (the operator is
   installed with it for that object only), one pod driven past its clean batches: the
   operator's next check takes it out of the Service's endpoints, its ReplicaSet starts
   a replacement, AnswersCorrect turns False naming it and `kubectl infd answers` shows
   its node and engine, while the other pod serves throughout; the object is deleted;
and a summary. Everything stops at the end, success or not.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from kubeinfer.cli.demo import answers, zero
from kubeinfer.cli.demo.load import drive
from kubeinfer.cli.demo.quality import WATCH, watch_quality
from kubeinfer.cli.local import forward
from kubeinfer.cli.local.session import LocalSession
from kubeinfer.operator.state import names

NAMESPACE = "default"
THRESHOLDS = {
    "maxAbsoluteOutputDifference": 0.5,
    "minTop1Agreement": 0.9,
    "maxP99LatencyRegressionPercent": 400,
}
"""On this model's logits int8 moves single values by up to about 0.15 and changes about
one top-1 class in 40; another model moves them by about 2: the limits sit between. The
pods share two cores with the load, where a candidate's p99 alone can run past three times
serving's: the latency allowance is wide, so the demo's candidates are judged on their
answers."""


@dataclass
class Step:
    title: str
    ok: bool = False
    seconds: float = 0.0
    outcome: str = ""


@dataclass
class Models:
    small: Path
    calibration: Path
    other: Path
    heavy: Path

    @staticmethod
    def build(folder: Path) -> Models:
        from kubeinfer.cli.demo.mlp_models import build_mlp, build_small_mlp
        from kubeinfer.runtime.building.calibration import write_demo_samples

        folder.mkdir(parents=True, exist_ok=True)
        small = build_small_mlp(folder / "small-mlp.onnx")
        return Models(
            small=small,
            calibration=write_demo_samples(small, folder / "calibration.npz"),
            other=build_small_mlp(folder / "small-mlp-other.onnx", seed=1),
            # 67 MB of weights, several ms a request on a CPU: a burst queues in the pods.
            heavy=build_mlp(folder / "burst-mlp.onnx", 16, (4096, 4096), 10),
        )


def infer_body(rows: np.ndarray) -> bytes:
    """A v2 JSON request of `rows` for the demo models' one input."""
    tensor = {
        "name": "input",
        "shape": list(rows.shape),
        "datatype": "FP32",
        "data": rows.ravel().tolist(),
    }
    return json.dumps({"inputs": [tensor]}).encode()


def source(path: Path) -> dict[str, str]:
    return {
        "uri": f"file://{path.resolve()}",
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def manifest(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kubeinfer.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


@dataclass
class Demo:
    session: LocalSession
    models: Models
    say: Callable[[str], None] = print
    steps: list[Step] = field(default_factory=list)

    # -- reading the cluster as a user would -------------------------------------------------
    async def kubectl(self, *args: str) -> str:
        return await self.session.kubectl("-n", NAMESPACE, *args)

    async def show(self, *args: str) -> None:
        """Runs kubectl and prints its output, as typed."""
        self.say(f"\n$ kubectl {' '.join(args)}")
        for line in (await self.kubectl(*args)).rstrip().splitlines():
            self.say(f"  {line}")

    async def show_plugin(self, *args: str) -> None:
        """`kubectl infd ...`, the plugin found on PATH beside this Python, as typed."""
        cluster = self.session.cluster
        assert cluster is not None
        self.say(f"\n$ kubectl {' '.join(args)}")
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        result = await asyncio.to_thread(
            subprocess.run,
            [str(cluster.kubectl), *args, "-n", NAMESPACE],
            env={**os.environ, "PATH": path, "KUBECONFIG": str(cluster.kubeconfig)},
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr.strip()}"
        for line in result.stdout.rstrip().splitlines():
            self.say(f"  {line}")

    async def infd(self, name: str) -> dict[str, Any]:
        return dict(json.loads(await self.kubectl("get", "infd", name, "-o", "json")))

    async def until(self, check: Callable[[], Awaitable[Any]], seconds: float, what: str) -> Any:
        deadline = time.monotonic() + seconds
        while True:
            result = await check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up after {seconds:.0f} s waiting for {what}")
            await asyncio.sleep(0.5)

    def condition(self, infd: dict[str, Any], kind: str) -> dict[str, Any]:
        for item in (infd.get("status") or {}).get("conditions") or []:
            if item["type"] == kind:
                return dict(item)
        return {}

    async def ready(self, name: str, generation: int | None = None) -> bool:
        infd = await self.infd(name)
        ready = self.condition(infd, "Ready")
        wanted = generation or infd["metadata"]["generation"]
        return ready.get("status") == "True" and ready.get("observedGeneration") == wanted

    def shown_endpoint(self, name: str) -> str:
        """The endpoint the session printed: a port of the host's namespace."""
        forwarder = self.session.forwarders[(NAMESPACE, name)]
        return f"{forwarder.url}/v2/models/{name}/infer"

    async def endpoint(self, name: str) -> str:
        """The same endpoint from inside the session's namespace: its Service's ClusterIP."""
        address = await self.session.service_address(NAMESPACE, names.service_name(name))
        assert address is not None, f"the Service of {name} does not exist"
        return f"http://{address[0]}:{address[1]}/v2/models/{name}/infer"

    async def from_host(self, url: str, body: bytes | None = None) -> bytes:
        """`url` (a printed endpoint) asked from the host's namespace, as curl would."""
        entered = self.session.entered
        assert entered is not None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        status, answer = await asyncio.to_thread(
            forward.request_from, entered.host, url, body, headers, 10.0
        )
        assert status == 200, f"{url}: {status} {answer[:200]!r}"
        return answer

    async def pods(self, name: str) -> list[dict[str, Any]]:
        listing = json.loads(
            await self.kubectl(
                "get",
                "pods",
                "-l",
                f"app.kubernetes.io/instance={name},kubeinfer.io/role=serving",
                "-o",
                "json",
            )
        )
        return [p for p in listing["items"] if not p["metadata"].get("deletionTimestamp")]

    # -- the steps ---------------------------------------------------------------------------
    async def step(self, title: str, body: Callable[[Step], Awaitable[None]]) -> None:
        step = Step(title)
        self.steps.append(step)
        self.say(f"\n== {len(self.steps)}. {title}\n")
        started = time.monotonic()
        try:
            await body(step)
            step.ok = True
        except (TimeoutError, AssertionError, OSError) as error:
            step.outcome = f"FAILED: {error}"
            self.say(f"  step failed: {error}")
        step.seconds = time.monotonic() - started

    async def apply(self, objects: list[dict[str, Any]]) -> None:
        self.say(f"$ kubectl apply -f - ({', '.join(o['metadata']['name'] for o in objects)})")
        _, output = await self.session.apply(objects)
        for line in output.splitlines():
            self.say(f"  {line}")

    def demo_spec(self, version: str, **changes: Any) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "model": {"name": "demo", "version": version, "source": source(self.models.small)},
            "engine": {"backend": "onnxruntime", "precision": "fp32", "maxBatchSize": 32},
            "runtime": {
                "replicas": 1,
                "batching": {"maxBatchSize": 32, "maxQueueDelayMicroseconds": 2000},
            },
        }
        for key, value in changes.items():
            spec[key] = {**spec.get(key, {}), **value}
        return spec

    async def create_and_serve(self, step: Step) -> None:
        await self.apply([manifest("demo", self.demo_spec("1"))])
        await self.until(lambda: self.ready("demo"), 120, "demo to be Ready")
        await self.show("get", "infd")
        infd = await self.infd("demo")
        step.outcome = f"Ready, engine {infd['status']['engine']['digest'][:19]}..."

    async def answer_requests(self, step: Step) -> None:
        import onnxruntime

        rows = np.random.default_rng(7).standard_normal((4, 512)).astype(np.float32)
        body = infer_body(rows)
        shown = self.shown_endpoint("demo")
        self.say(f"$ curl -d @request.json {shown}")
        served = json.loads(await self.from_host(shown, body))["outputs"][0]
        local = onnxruntime.InferenceSession(str(self.models.small)).run(None, {"input": rows})[0]
        difference = float(np.abs(np.asarray(served["data"]).reshape(local.shape) - local).max())
        self.say(
            f"  a 4-row request answered through the Service: shape {served['shape']}, "
            f"max |diff| against ONNX Runtime in-process {difference:.1e}"
        )
        single = infer_body(rows[:1])
        result = await drive(await self.endpoint("demo"), single, 8, 3.0)
        self.say(
            f"  8 clients for 3 s: {result.requests_per_second:.0f} req/s, p50 "
            f"{result.percentile_milliseconds(50):.1f} ms, p99 "
            f"{result.percentile_milliseconds(99):.1f} ms, codes {dict(result.codes)}"
        )
        assert difference < 1e-3 and set(result.codes) == {200}, "wrong answers"
        step.outcome = f"{result.requests_per_second:.0f} req/s at 8 clients, all 200"

    async def burst(self, step: Step) -> None:
        spec = {
            "model": {"name": "burst", "version": "1", "source": source(self.models.heavy)},
            "engine": {"backend": "onnxruntime", "precision": "fp32", "maxBatchSize": 32},
            "runtime": {"replicas": 1, "batching": {"maxBatchSize": 32}},
            "autoscaling": {
                "enabled": True,
                "minReplicas": 1,
                "maxReplicas": 3,
                "targetRequestsInProgressPerReplica": 4,
                "scaleDownStabilizationSeconds": 6,
                "scaleDownMaxPercent": 100,
                "scaleDownPeriodSeconds": 5,
            },
        }
        await self.apply([manifest("burst", spec)])
        await self.until(lambda: self.ready("burst"), 120, "burst to be Ready")
        rows = np.random.default_rng(3).standard_normal((1, 16)).astype(np.float32)
        body = infer_body(rows)
        self.say("  24 closed-loop clients for 10 s at the burst endpoint...")
        peak = 1

        async def watch_peak() -> None:
            nonlocal peak
            while True:
                deployment = json.loads(
                    await self.kubectl("get", "deployment", "burst-runtime", "-o", "json")
                )
                peak = max(peak, int(deployment["spec"]["replicas"]))
                await asyncio.sleep(1)

        watcher = asyncio.create_task(watch_peak())
        try:
            result = await drive(await self.endpoint("burst"), body, 24, 10.0)
            self.say(
                f"  the burst: {result.requests_per_second:.0f} req/s, codes "
                f"{dict(result.codes)}; the runtime went from 1 to {peak} pods"
            )
            await self.show("get", "infd", "burst")
            active = self.condition(await self.infd("burst"), "ScalingActive")
            self.say(f"  ScalingActive: {active.get('message', '')}")
            await self.until(self._scaled_down, 90, "the scale-down after the window")
        finally:
            watcher.cancel()
        await self.show("get", "infd", "burst")
        assert peak > 1, "the burst did not scale the runtime up"
        step.outcome = f"1 → {peak} pods under the burst, back to 1 after the window"

    async def _scaled_down(self) -> bool:
        deployment = json.loads(
            await self.kubectl("get", "deployment", "burst-runtime", "-o", "json")
        )
        return int(deployment["spec"]["replicas"]) == 1

    async def shadow(self, step: Step, version: str, spec: dict[str, Any], passes: bool) -> None:
        before = {p["metadata"]["uid"] for p in await self.pods("demo")}
        await self.apply([manifest("demo", spec)])
        rows = np.random.default_rng(11).standard_normal((1, 512)).astype(np.float32)
        body = infer_body(rows)
        verdict = "Passed" if passes else "Failed"
        deadline = time.monotonic() + 150
        shown = 0
        url = await self.endpoint("demo")
        while time.monotonic() < deadline:
            await drive(url, body, 4, 2.0)
            candidate = (await self.infd("demo")).get("status", {}).get("candidate") or {}
            if candidate.get("version") != version:
                continue  # the previous trial's record, until this version's candidate runs
            if candidate.get("samples", 0) > shown:
                shown = candidate["samples"]
                self.say(
                    "$ kubectl get infd demo -o jsonpath='{.status.candidate}'  →  "
                    f"verdict {candidate.get('verdict')}, samples {candidate.get('samples')}, "
                    f"top-1 agreement {candidate.get('top1Agreement')}, max |diff| "
                    f"{candidate.get('maxAbsoluteDifference')}"
                )
            if candidate.get("verdict") in ("Promoted", "Failed", "Aborted"):
                break
            if candidate.get("verdict") == "Passed" and not passes:
                raise AssertionError("the bad candidate passed")
        candidate = (await self.infd("demo"))["status"].get("candidate") or {}
        assert candidate.get("version") == version, f"no verdict on version {version} in time"
        await self.show("get", "infd", "demo")
        if passes:
            assert candidate.get("verdict") == "Promoted", candidate.get("message")
            await self.until(lambda: self.ready("demo"), 90, "Ready on the promoted version")
            serving = (await self.infd("demo"))["status"]["serving"]
            assert serving["version"] == version, serving
            step.outcome = (
                f"Promoted after {candidate.get('samples')} mirrored requests, "
                f"top-1 agreement {candidate.get('top1Agreement')}"
            )
        else:
            assert candidate.get("verdict") == verdict, candidate.get("message")
            after = {p["metadata"]["uid"] for p in await self.pods("demo")}
            assert after == before, "the serving pods were touched"
            self.say(f"  {candidate.get('reason')}: {candidate.get('message', '')[:160]}")
            self.say("  the serving pods are the same pods as before the candidate")
            step.outcome = f"Failed ({candidate.get('reason')}), serving untouched"

    async def kubectl_scale(self, step: Step) -> None:
        self.say(
            "$ kubectl patch infd burst --type merge -p "
            '\'{"spec":{"autoscaling":{"enabled":false}}}\''
        )
        await self.kubectl(
            "patch",
            "infd",
            "burst",
            "--type",
            "merge",
            "-p",
            '{"spec":{"autoscaling":{"enabled":false}}}',
        )
        await self.show("scale", "infd/burst", "--replicas=2")
        await self.until(lambda: self._ready_pods("burst", 2), 90, "2 ready burst pods")
        await self.show("get", "infd", "burst")
        await self.show("get", "pods", "-l", "app.kubernetes.io/instance=burst")
        step.outcome = "2 pods, as `kubectl scale` asked"

    async def _ready_pods(self, name: str, count: int) -> bool:
        status = (await self.infd(name)).get("status") or {}
        return status.get("readyReplicas") == count and status.get("replicas") == count

    async def tell(self) -> bool:
        await self.step(
            "Apply an InferenceDeployment: the operator builds its engine, then serves it",
            self.create_and_serve,
        )
        if not self.steps[-1].ok:
            return False
        await self.step("Requests answered at its endpoint", self.answer_requests)
        await self.step("A burst of load: the autoscaler scales up, then back down", self.burst)
        int8 = self.demo_spec(
            "2",
            engine={"precision": "int8", "calibration": source(self.models.calibration)},
            rollout={
                "strategy": "Shadow",
                "shadow": {
                    "trafficPercent": 100,
                    "minSamples": 100,
                    "maxDurationSeconds": 120,
                    "thresholds": THRESHOLDS,
                },
            },
            qualityWatch=WATCH,
        )
        await self.step(
            "Version 2, int8, shadow-tested on live traffic, then promoted",
            lambda step: self.shadow(step, "2", int8, passes=True),
        )
        await self.step(
            "Its quality watch against fp32 on live traffic: a drift caught, and its exemplars",
            lambda step: watch_quality(self, step),
        )
        bad = self.demo_spec(
            "3",
            model={"source": source(self.models.other)},
            engine={"precision": "fp32", "calibration": None},
            rollout={
                "strategy": "Shadow",
                "shadow": {
                    "trafficPercent": 100,
                    "minSamples": 100,
                    "maxDurationSeconds": 120,
                    "thresholds": THRESHOLDS,
                },
            },
        )
        bad["engine"].pop("calibration")
        await self.step(
            "Version 3, another model: the shadow test fails it, serving untouched",
            lambda step: self.shadow(step, "3", bad, passes=False),
        )
        await self.step("Autoscaling off: `kubectl scale infd` sets the pods", self.kubectl_scale)
        await self.step(
            "A replica that answers wrong is caught, taken out of serving, replaced and named",
            lambda step: answers.wrong_answers(self, step),
        )
        await self.step(
            "Idle, a model goes to zero pods; its next request starts one and is answered",
            lambda step: zero.scale_to_zero(self, step, manifest, source(self.models.small)),
        )
        await self.show("get", "infd")
        return all(step.ok for step in self.steps)

    def summary(self, total_seconds: float) -> None:
        self.say("\n== Summary\n")
        self.say("| step | outcome | seconds |")
        self.say("|---|---|---:|")
        for index, step in enumerate(self.steps, 1):
            self.say(f"| {index}. {step.title} | {step.outcome} | {step.seconds:.0f} |")
        self.say(
            f"\n{len([s for s in self.steps if s.ok])} of {len(self.steps)} steps passed "
            f"in {total_seconds:.0f} s."
        )


def run_story(workdir: Path, directory: Path) -> bool:
    """The story, from building the models to stopping everything; True if every step
    passed. Synchronous: the session enters its namespace before the event loop runs."""
    started = time.monotonic()
    print("== 0. The built-in models (generated ONNX files, served through file:// sources)\n")
    models = Models.build((workdir / "models").resolve())
    for path in (models.small, models.other, models.heavy):
        print(f"  {path} ({path.stat().st_size / 1e6:.1f} MB)")
    print("\n$ kubeinfer up   (a control plane, a node, the CRD and the operator)")
    session = LocalSession(
        directory, say=lambda line: print(line, flush=True), operator_settings=answers.FAULTS
    )
    session.prepare()
    try:
        return asyncio.run(_tell(session, models, started))
    except (asyncio.CancelledError, KeyboardInterrupt):
        print("\nDemo interrupted; everything it started is stopped.", flush=True)
        return False


async def _tell(session: LocalSession, models: Models, started: float) -> bool:
    stop = asyncio.Event()
    watcher: asyncio.Task[None] | None = None
    demo = Demo(session, models)
    ok = False
    main = asyncio.current_task()
    if main is not None:  # SIGTERM as Ctrl-C (asyncio.run's own): stop everything first
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
    try:
        await session.start()
        print(f"\n  export KUBECONFIG={session.kubeconfig}   (kubectl works in another terminal)")
        print("  (rows below: the `kubectl get infd` view, printed whenever a row changes)")
        watcher = asyncio.create_task(session.watch(stop, interval_seconds=0.5))
        ok = await demo.tell()
    finally:
        stop.set()
        if watcher is not None:
            await watcher
        await session.stop()
    demo.summary(time.monotonic() - started)
    print("\nDemo finished." if ok else "\nDemo finished with problems (see above).")
    return ok
