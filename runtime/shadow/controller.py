"""The shadow of one serving runtime: which candidate it mirrors to, and its figures.

`ShadowController` is the data plane's one entry point (`offer`, after a request was
answered 200) and the source of `GET /v2/shadow` (`status`). It follows the mirror target
file (`TargetWatcher`) and owns the current candidate's `Mirror` and `RunningAggregates`:

- another candidate (URL, model name, version or digest changed): the old mirror is
  closed (work in flight cancelled, queue discarded, connections closed), its series are
  removed from the registry, and the new candidate starts from zero;
- the same candidate with another share or policy: a new mirror with the new settings,
  the aggregates carried over;
- no target: mirroring stops and the figures go.

`stop()` (on SIGTERM's drain and on app cleanup) cancels all mirrored work at once: it is
best-effort and never holds up the drain of real requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from kubeinfer.contract.runtime_config import MirrorTarget, RuntimeConfig
from kubeinfer.runtime.shadow.aggregates import RunningAggregates, ShadowMetrics, inactive_status
from kubeinfer.runtime.shadow.comparison import Outputs
from kubeinfer.runtime.shadow.mirror import Mirror
from kubeinfer.runtime.shadow.target import TargetWatcher, same_candidate
from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)


class ShadowController:
    """Mirrors this runtime's answered requests to the candidate the target file names."""

    def __init__(
        self,
        config: RuntimeConfig,
        registry: CollectorRegistry,
        *,
        clock: Callable[[], float] = time.monotonic,
        log_interval_seconds: float = 60.0,
    ) -> None:
        self._model = config.model_name
        self._serving_version = config.model_version
        self._metrics = ShadowMetrics(registry)
        self._clock = clock
        self._log_interval = log_interval_seconds
        self._watcher = (
            TargetWatcher(
                config.mirror_target_file,
                config.mirror_poll_interval_milliseconds / 1000,
                self.apply,
            )
            if config.mirror_target_file
            else None
        )
        self._mirror: Mirror | None = None
        self._aggregates: RunningAggregates | None = None
        self._stopped = False
        self._offer_failures = 0
        self._applying = asyncio.Lock()  # one change of target at a time

    @property
    def active(self) -> bool:
        return self._mirror is not None

    @property
    def mirror(self) -> Mirror | None:
        return self._mirror

    async def start(self) -> None:
        """Reads the target file once (mirroring from the first request if it names a
        candidate), then keeps watching it."""
        if self._watcher is not None:
            await self._watcher.start()

    async def stop(self) -> None:
        """Stops watching and mirroring; idempotent."""
        self._stopped = True
        if self._watcher is not None:
            await self._watcher.stop()
        await self.apply(None)

    async def apply(self, target: MirrorTarget | None) -> None:
        """Makes `target` the mirrored candidate (None: none); see the module for what
        carries over."""
        async with self._applying:
            await self._apply(target)

    async def _apply(self, target: MirrorTarget | None) -> None:
        if self._stopped and target is not None:
            return
        old_mirror, old_aggregates = self._mirror, self._aggregates
        if target is not None and old_mirror is not None and old_mirror.target == target:
            return
        same = same_candidate(target, old_aggregates.target if old_aggregates else None)
        self._mirror = None  # offers stop at once, before any await below
        if old_mirror is not None:
            await old_mirror.close()
        if old_aggregates is not None and not same:
            old_aggregates.close()
            self._aggregates = None
        if target is None:
            if old_aggregates is not None:
                log.info("Stopped mirroring url=%s", old_aggregates.target.url)
            return
        if self._aggregates is None:
            self._aggregates = RunningAggregates(
                target, self._model, self._serving_version, self._metrics
            )
        self._aggregates.target = target
        mirror = Mirror(
            target, self._aggregates, clock=self._clock, log_interval_seconds=self._log_interval
        )
        await mirror.start()
        self._mirror = mirror
        log.info(
            "Started mirroring url=%s model=%s candidate_version=%s candidate_digest=%s "
            "traffic_percent=%d kept_aggregates=%s",
            target.url, target.model_name, target.candidate_version, target.candidate_digest,
            target.traffic_percent, same,
        )  # fmt: skip

    def offer(self, inputs: Outputs, outputs: Outputs, seconds: float) -> None:
        """Offers a request answered 200 (its decoded inputs, its outputs, its server
        time) to the current mirror, if any. Never raises and never blocks: the caller is
        the request path."""
        mirror = self._mirror
        if mirror is None:
            return
        try:
            mirror.offer(inputs, outputs, seconds)
        except Exception:
            self._offer_failures += 1
            if self._offer_failures == 1 or self._offer_failures % 10_000 == 0:
                log.warning("Failed to offer a request to the mirror failures=%d",
                            self._offer_failures, exc_info=True)  # fmt: skip

    def status(self) -> dict[str, Any]:
        """The `GET /v2/shadow` body."""
        if self._aggregates is None:
            return inactive_status(self._serving_version)
        return self._aggregates.status()
