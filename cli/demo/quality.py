"""The demo's quality watch: the promoted int8 engine compared with its fp32 reference on
a sample of live traffic, a drift on one class caught while the overall agreement holds,
and the inputs behind it fetched from the serving pod.

The int8 version's spec carries `WATCH`, so the operator builds the fp32 reference
engine while the shadow test runs, and the watch starts once the int8 engine serves. The
traffic is single rows of the demo model's input: in-distribution rows (standard normal,
as the calibration data) from tenants `a` and `c`; then also rows scaled by `SHIFT`, far
beyond what the int8 engine was calibrated on (its calibrated ranges clip them), all of
one fp32 class and from tenant `b`, one request in ten. The int8 engine then disagrees
with the reference on nearly every shifted row: that class and that tenant drift, the
others do not, and the overall agreement stays above minTop1Agreement, where the
aggregate alone would hide it.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from kubeinfer.cli.demo.load import drive


class _Models(Protocol):
    @property
    def small(self) -> Path: ...


class Demo(Protocol):
    """What this step uses of the story that runs it (`story.Demo`, which imports this
    module for its steps)."""

    @property
    def models(self) -> _Models: ...
    def say(self, text: str) -> None: ...
    async def show(self, *args: str) -> None: ...
    async def infd(self, name: str) -> dict[str, Any]: ...
    def condition(self, infd: dict[str, Any], kind: str) -> dict[str, Any]: ...
    def shown_endpoint(self, name: str) -> str: ...
    async def endpoint(self, name: str) -> str: ...
    async def from_host(self, url: str, body: bytes | None = None) -> bytes: ...


class Step(Protocol):
    """What this step writes of its line in the story's summary (`story.Step`)."""

    outcome: str


SHIFT = 6.0
SLICE_HEADER = "X-Tenant"
WATCH: dict[str, Any] = {
    "enabled": True,
    "samplePercent": 20,
    "windowSeconds": 30,
    "minSamples": 50,
    "minTop1Agreement": 0.8,
    "minClassAgreement": 0.8,
    "sliceHeader": SLICE_HEADER,
    "onDrift": "Alert",
}
"""The demo's watch: one request in five compared, over the shortest window the API
allows (30 s; an hour by default), so a drift shows within seconds and the earlier
traffic soon leaves the window. In distribution int8 agrees with fp32 on about 19 rows in
20 here; the shifted rows of the chosen class on almost none: the floors sit between."""

MIXED_EVERY = 10
"""One request in this many carries a shifted row once the drift starts."""


@dataclass
class Traffic:
    normal: list[bytes]
    """In-distribution single-row requests."""
    shifted: list[bytes]
    """Single rows of the chosen class, scaled by SHIFT."""
    shifted_class: int
    """The fp32 model's top-1 class of every shifted row."""


def body_of(row: np.ndarray) -> bytes:
    tensor = {"name": "input", "shape": [1, row.size], "datatype": "FP32",
              "data": row.ravel().tolist()}  # fmt: skip
    return json.dumps({"inputs": [tensor]}).encode()


def make_traffic(model: Path, seed: int = 5) -> Traffic:
    """The rows, and the class the shifted ones share: of the classes shifted rows fall
    in most, the first that in-distribution traffic seldom reaches (under a tenth of its
    rows), so its drift is not diluted by the in-distribution rows of the same class."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    # Many distinct rows: a class's agreement over the window is then int8's on that class,
    # not that of the few rows that happen to fall in it, sent again and again.
    normal = rng.standard_normal((1000, 512)).astype(np.float32)
    shifted = rng.standard_normal((2000, 512)).astype(np.float32) * SHIFT
    logits = session.run(None, {"input": normal})[0]
    shifted_classes = session.run(None, {"input": shifted})[0].argmax(axis=1)
    share = np.bincount(logits.argmax(axis=1), minlength=logits.shape[1]) / len(normal)
    chosen = next(int(c) for c in np.bincount(shifted_classes).argsort()[::-1] if share[c] < 0.1)
    rows = shifted[shifted_classes == chosen][:100]
    return Traffic([body_of(r) for r in normal], [body_of(r) for r in rows], chosen)


def in_distribution(traffic: Traffic) -> tuple[list[bytes], list[dict[str, str]]]:
    """The in-distribution requests, from tenants `a` and `c` in turn."""
    return traffic.normal, [{SLICE_HEADER: "ac"[i % 2]} for i in range(len(traffic.normal))]


def with_shift(traffic: Traffic) -> tuple[list[bytes], list[dict[str, str]]]:
    """In-distribution requests with every MIXED_EVERY-th one a shifted row, from `b`."""
    bodies, headers = [], []
    normal = itertools.cycle(zip(*in_distribution(traffic), strict=True))
    for row in traffic.shifted:
        for _ in range(MIXED_EVERY - 1):
            body, header = next(normal)
            bodies.append(body)
            headers.append(header)
        bodies.append(row)
        headers.append({SLICE_HEADER: "b"})
    return bodies, headers


def group_text(group: dict[str, Any] | None) -> str:
    if not group:
        return "none yet"
    return (
        f"{group.get('name')}: {group.get('top1Agreement', 0):.3f} over "
        f"{group.get('samples')} rows (threshold {group.get('threshold', 0):.2f})"
    )


def watch_text(watch: dict[str, Any]) -> str:
    agreement = watch.get("top1Agreement")
    return (
        f"{watch.get('state')}, {watch.get('samples', 0)} rows compared in the window, "
        f"overall top-1 agreement {'n/a' if agreement is None else f'{agreement:.3f}'}, "
        f"worst class {group_text(watch.get('worstClass'))}, "
        f"worst slice {group_text(watch.get('worstSlice'))}"
    )


def exemplar_lines(body: bytes, traffic: Traffic) -> tuple[list[str], int, int]:
    """What an `.npz` of exemplars holds, in a few lines; how many rows it has, and how
    many of them are shifted inputs."""
    archive = np.load(io.BytesIO(body), allow_pickle=False)
    metadata = json.loads(str(archive["__metadata__"]))
    inputs = archive["input"] if "input" in archive.files else np.zeros((0, 512), np.float32)
    # An in-distribution row's norm is about sqrt(512); a shifted one's SHIFT times that.
    shifted = int(np.count_nonzero(np.linalg.norm(inputs, axis=1) > SHIFT / 2 * np.sqrt(512)))
    classes = Counter(m["referenceClass"] for m in metadata)
    slices = Counter(m["slice"] for m in metadata)
    kl = [m["klDivergence"] for m in metadata if m["klDivergence"] is not None]
    largest = max((m["maxAbsDifference"] for m in metadata), default=0.0)
    lines = [
        f"{len(metadata)} rows: members {sorted(archive.files)}; input {list(inputs.shape)} "
        f"{inputs.dtype}, stacked as a calibration file is (`kubeinfer build --calibration` "
        "takes it)",
        "their reference class: " + ", ".join(f"{c}: {n} rows" for c, n in classes.most_common()),
        "their slice: " + ", ".join(f"{s}: {n} rows" for s, n in slices.most_common()),
        f"top-1 disagreements per row {sorted({m['disagreements'] for m in metadata})}, "
        f"KL(reference || int8) {min(kl, default=0):.2f} to {max(kl, default=0):.2f} nats, "
        f"max |diff| up to {largest:.2f}",
        f"{shifted} of the {len(metadata)} are shifted inputs (a norm {SHIFT:g} times an "
        "in-distribution row's)",
    ]
    return lines, len(metadata), shifted


async def drive_until(
    demo: Demo,
    url: str,
    load: tuple[list[bytes], list[dict[str, str]]],
    done: Callable[[dict[str, Any], dict[str, Any]], bool],
    what: str,
    min_rounds: int = 1,
) -> dict[str, Any]:
    """Drives `load` with 4 clients, 2 s at a time, printing the watch's status as it
    changes, until `done(infd, status.qualityWatch)` after `min_rounds` at least: the
    operator judges a window of live traffic, so the load must go on while it looks."""
    deadline, last = time.monotonic() + 120, ""
    for rounds in itertools.count(1):
        await drive(url, load[0], 4, 2.0, load[1])
        infd = await demo.infd("demo")
        watch = (infd.get("status") or {}).get("qualityWatch") or {}
        text = watch_text(watch)
        if text != last:
            demo.say(f"$ kubectl get infd demo -o jsonpath='{{.status.qualityWatch}}'  →  {text}")
            last = text
        if rounds >= min_rounds and done(infd, watch):
            return infd
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}: {text}")
    raise AssertionError("unreachable")


def say_the_drift(demo: Demo, infd: dict[str, Any]) -> float:
    """Prints the Degraded condition, the groups drifting and the overall agreement,
    against its floor: the point of the step is that the aggregate alone would pass.
    Returns the overall agreement."""
    degraded = demo.condition(infd, "Degraded")
    watch = infd["status"]["qualityWatch"]
    message = f"Degraded=True QualityDrift: {degraded.get('message', '')}"
    demo.say(textwrap.fill(message, 100, initial_indent="  ", subsequent_indent="    "))
    drifting = [f"{g['kind']} {g.get('name', '')}".strip() for g in watch.get("drifting") or []]
    overall, floor = watch.get("top1Agreement") or 0.0, WATCH["minTop1Agreement"]
    hidden = "above" if overall >= floor else "below"
    demo.say(
        f"  drifting: {', '.join(drifting)}; overall top-1 agreement {overall:.3f}, {hidden} "
        f"minTop1Agreement {floor}"
        + (": the aggregate alone would hide it" if overall >= floor else "")
    )
    return float(overall)


async def show_exemplars(demo: Demo, traffic: Traffic) -> tuple[int, int]:
    """Fetches the serving pod's worst rows as a user would and says what they hold;
    most must be the shifted inputs, or the exemplars would not lead to the cause.
    Returns how many rows there are and how many of them are shifted."""
    exemplars_url = demo.shown_endpoint("demo").rsplit("/v2/", 1)[0] + "/v2/quality/exemplars"
    demo.say(f"\n$ curl -o exemplars.npz {exemplars_url}   (the serving pod's worst rows)")
    lines, rows, shifted = exemplar_lines(await demo.from_host(exemplars_url), traffic)
    for line in lines:
        demo.say(f"  {line}")
    assert rows and shifted * 4 >= rows * 3, f"{shifted} of {rows} exemplars are shifted rows"
    return rows, shifted


async def watch_quality(demo: Demo, step: Step) -> None:
    say = demo.say
    traffic = await asyncio.to_thread(make_traffic, demo.models.small)
    say(
        f"  spec.qualityWatch (applied with version 2): {json.dumps(WATCH)}\n"
        f"  (windowSeconds {WATCH['windowSeconds']}: the shortest allowed, for the demo; "
        "a watch's default is an hour)"
    )
    await demo.show("get", "pods", "-l", "app.kubernetes.io/instance=demo")
    url = await demo.endpoint("demo")

    def healthy(_: dict[str, Any], watch: dict[str, Any]) -> bool:
        return watch.get("state") == "Healthy"

    say(f"\n  in-distribution traffic from tenants a and c ({SLICE_HEADER} header), 4 clients:")
    # Two rounds at least: the operator's first look may still judge the window's
    # earlier traffic (the shadow step's, without the header: slice `other`).
    await drive_until(
        demo, url, in_distribution(traffic), healthy, "the watch Healthy", min_rounds=2
    )
    say(
        f"\n  now one request in {MIXED_EVERY} from tenant b, its row scaled by {SHIFT:g} "
        f"(far beyond the calibration data), every one of fp32 class {traffic.shifted_class}:"
    )

    expected = {("class", str(traffic.shifted_class)), ("slice", "b")}

    def drifted(infd: dict[str, Any], watch: dict[str, Any]) -> bool:
        """Degraded for drift, the shifted class and tenant among the groups drifting (the
        class, which in-distribution rows reach too, may show first)."""
        degraded = demo.condition(infd, "Degraded")
        drifting = {(g["kind"], g.get("name", "")) for g in watch.get("drifting") or []}
        return (
            degraded.get("status") == "True"
            and degraded.get("reason") == "QualityDrift"
            and expected <= drifting
        )

    infd = await drive_until(
        demo, url, with_shift(traffic), drifted, f"Degraded=True QualityDrift on {sorted(expected)}"
    )
    await demo.show("get", "infd", "demo")
    overall = say_the_drift(demo, infd)
    rows, shifted = await show_exemplars(demo, traffic)
    step.outcome = (
        f"Healthy, then QualityDrift: class {traffic.shifted_class} and slice b drift "
        f"(overall {overall:.2f}); {shifted} of {rows} exemplars are the shifted rows"
    )
