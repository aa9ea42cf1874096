"""Mirroring (the shadow candidate, the quality watch) for the Rust data plane: the Python
data plane's own mirrors (`kubeinfer.runtime.shadow`), fed by the Rust server.

The `ShadowController` follows the mirror target file and runs its mirrors on an event
loop of this module's thread (`kubeinfer-mirror`), as it does on the Python data plane's
loop. Whenever it changes a mirror it tells the server which roles mirror at which share
(`Server.set_mirroring`: each role's share, a token naming its mirror, the watch's slice
header), and the server samples each answered request itself, with the same credit
accumulator as `sampling.Sampler`. The requests a batch answered and its sampled ones
come back once per batch, from the slot's thread inside the batch's one GIL crossing
(`Server.set_mirror`): `RustMirrors.hand_over` only schedules them on the mirrors' loop,
where their tensors become arrays and are offered (`ShadowController.offer_sampled`), so
the sends and comparisons never delay or fail an answer. Past `MAX_PENDING_BATCHES`
hand-overs not yet offered, a batch's sampled requests are counted `dropped` instead.

The mirrors' series are the server's: the families `ShadowMetrics` makes here write to the
Rust registry (`Server.metric_*`), so its `/metrics` exports them as the Python data plane
does. `/v2/shadow`, `/v2/quality` and `/v2/quality/exemplars` are answered from the
controller, on its loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from kubeinfer.contract.metric_series import Series
from kubeinfer.contract.runtime_config import RuntimeConfig
from kubeinfer.runtime.engines.base import V2_TO_NUMPY
from kubeinfer.runtime.shadow.aggregates import ShadowMetrics
from kubeinfer.runtime.shadow.comparison import Outputs
from kubeinfer.runtime.shadow.controller import ShadowController
from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

MAX_PENDING_BATCHES = 1024
"""Hand-overs waiting for the mirrors' loop past which a batch's samples are dropped (a
loop that cannot keep up must not grow memory without bound)."""

_WAIT_SECONDS = 10.0
Result = TypeVar("Result")

Tensors = list[tuple[str, str, tuple[int, ...], Any]]
"""Tensors as the server hands them over: (name, datatype, shape, bytes or list of bytes)."""


class NativeSeries:
    """One series of a family of the Rust server's registry."""

    __slots__ = ("_labels", "_name", "_server")

    def __init__(self, server: Any, name: str, labels: list[tuple[str, str]]) -> None:
        self._server, self._name, self._labels = server, name, labels

    def inc(self, amount: float = 1.0) -> None:
        self._server.metric_add(self._name, self._labels, float(amount))

    def set(self, value: float) -> None:
        self._server.metric_set(self._name, self._labels, float(value))

    def observe(self, value: float) -> None:
        self._server.metric_observe(self._name, self._labels, float(value))


class NativeFamily:
    """A contract family in the Rust server's registry, with the prometheus_client calls
    `RunningAggregates` makes: `labels(*values)` (the series made at zero, as there) and
    `remove(*values)` (KeyError when it was not there)."""

    def __init__(self, server: Any, spec: Series) -> None:
        self._server, self._spec = server, spec

    def _labels(self, values: tuple[str, ...]) -> list[tuple[str, str]]:
        return list(zip(self._spec.labels, (str(v) for v in values), strict=True))

    def labels(self, *values: str) -> NativeSeries:
        labels = self._labels(values)
        self._server.metric_touch(self._spec.name, labels)
        return NativeSeries(self._server, self._spec.name, labels)

    def remove(self, *values: str) -> None:
        if not self._server.metric_remove(self._spec.name, self._labels(values)):
            raise KeyError(values)


def native_shadow_metrics(server: Any) -> ShadowMetrics:
    """The mirrors' families, written to `server`'s registry."""
    return ShadowMetrics(CollectorRegistry(), make=lambda spec, _: NativeFamily(server, spec))


def to_arrays(tensors: Tensors) -> Outputs:
    """Handed-over tensors as the mirrors take them: by name, (datatype, array); BYTES
    as object arrays of bytes, as the Python data plane decodes them."""
    arrays: dict[str, tuple[str, np.ndarray]] = {}
    for name, datatype, shape, data in tensors:
        if datatype == "BYTES":
            array = np.empty(len(data), dtype=object)
            array[:] = data
        else:
            array = np.frombuffer(data, dtype=V2_TO_NUMPY[datatype])
        arrays[name] = (datatype, array.reshape(shape))
    return arrays


Sampled = tuple[Tensors, Tensors, float, "str | None", tuple[str, ...]]


class RustMirrors:
    """The mirrors of one Rust server: `start()` once it serves, `stop()` before it
    drains (mirrored work cancelled at once, never holding up the drain)."""

    def __init__(self, config: RuntimeConfig, server: Any) -> None:
        self._server = server
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kubeinfer-mirror", daemon=True
        )
        self.controller = ShadowController(
            config, CollectorRegistry(), metrics=native_shadow_metrics(server),
            on_change=self._publish,
        )  # fmt: skip
        self._pending = 0  # hand-overs scheduled, not yet offered (changed with the GIL)
        self._dropped: dict[str, int] = {}  # samples dropped per role, not yet counted

    def start(self) -> None:
        """Reads the target file once (mirroring from the first request when it names a
        target), keeps following it, and takes the server's hand-overs."""
        self._thread.start()
        self._server.set_mirror(self.hand_over)
        self._on_loop_async(self.controller.start())

    def stop(self) -> None:
        """Stops following the file and mirroring (the server samples nothing more), then
        the loop's thread."""
        if not self._thread.is_alive():
            return
        try:
            self._on_loop_async(self.controller.stop())
        except Exception:  # best-effort: the drain of real requests goes on
            log.exception("Failed to stop mirroring")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def _publish(self) -> None:
        """Tells the server the roles mirrored to now (on the loop, on each change)."""
        controller = self.controller
        roles = [(role, percent, id(mirror)) for role, percent, mirror in controller.mirroring()]
        self._server.set_mirroring(roles, controller.slice_header if roles else None)

    def hand_over(self, answered: int, roles: tuple[str, ...], sampled: list[Sampled]) -> None:
        """A batch's answered count and sampled requests (the server's call, on a slot's
        thread inside the batch's GIL crossing): scheduled on the mirrors' loop, no more."""
        if self._pending >= MAX_PENDING_BATCHES:
            for *_, taken in sampled:
                for role in taken:
                    self._dropped[role] = self._dropped.get(role, 0) + 1
            sampled = []
        self._pending += 1
        self._loop.call_soon_threadsafe(self._offer, answered, roles, sampled)

    def _offer(self, answered: int, roles: tuple[str, ...], sampled: list[Sampled]) -> None:
        self._pending -= 1
        dropped, self._dropped = self._dropped, {}
        for role, count in dropped.items():
            self.controller.count_dropped(role, count)
        try:
            offered = [
                (to_arrays(inputs), to_arrays(outputs), seconds, slice_value, taken)
                for inputs, outputs, seconds, slice_value, taken in sampled
            ]
        except Exception:
            log.warning("Failed to read a batch's mirrored requests", exc_info=True)
            return
        self.controller.offer_sampled(answered, roles, offered)

    def status(self) -> dict[str, Any]:
        """The `GET /v2/shadow` body."""
        return self._on_loop(self.controller.status)

    def quality_status(self) -> dict[str, Any]:
        """The `GET /v2/quality` body."""
        return self._on_loop(self.controller.quality_status)

    def quality_exemplars(self) -> bytes:
        """The `GET /v2/quality/exemplars` body."""
        return self._on_loop(self.controller.quality_exemplars)

    def _on_loop(self, fn: Callable[[], Result]) -> Result:
        """`fn()` on the mirrors' loop (their state is the loop's), waited for here."""
        done: concurrent.futures.Future[Result] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as error:
                done.set_exception(error)

        self._loop.call_soon_threadsafe(run)
        return done.result(timeout=_WAIT_SECONDS)

    def _on_loop_async(self, coroutine: Any) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=_WAIT_SECONDS)
