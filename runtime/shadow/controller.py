"""The mirrors of one serving runtime: which targets it mirrors to, and their figures.

`ShadowController` is the data plane's one entry point (`offer`, after a request was
answered 200) and the source of `GET /v2/shadow` (`status`), `GET /v2/quality`
(`quality_status`) and `GET /v2/quality/exemplars` (`quality_exemplars`). It follows the
mirror target file (`TargetWatcher`, the whole `MirrorFile`) and drives one mirror per
role (`MIRROR_ROLES`), each a `Mirror` (its own bounded queue, workers and client) with
its `RunningAggregates`: the shadow candidate (`target`, role `shadow`) and the quality
watch's reference (`qualityWatch.reference`, role `quality`, `QualityAggregates`). The two
never share a queue: a reference that cannot keep up drops its own samples. For each:

- another target (URL, model name, version or digest changed; for a watch, also another
  slice header or maxSlices): the old mirror is closed (work in flight cancelled, queue
  discarded, connections closed), its series are removed from the registry, and the new
  target starts from zero;
- the same target with another share or policy (a watch: also other exemplar bounds or
  window): a new mirror with the new settings, the aggregates carried over;
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

from kubeinfer.contract.runtime_config import MirrorFile, MirrorTarget, QualityWatch, RuntimeConfig
from kubeinfer.runtime.shadow.aggregates import RunningAggregates, ShadowMetrics, inactive_status
from kubeinfer.runtime.shadow.comparison import Outputs
from kubeinfer.runtime.shadow.exemplars import encode_exemplars
from kubeinfer.runtime.shadow.mirror import Mirror
from kubeinfer.runtime.shadow.quality import QualityAggregates, inactive_quality_status
from kubeinfer.runtime.shadow.target import TargetWatcher, parse_mirror_content, same_candidate
from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

QUALITY_GATHER_SECONDS = 0.5
"""How long a quality watch's mirror holds a sample for others to go with it to the
reference as one request. The HTTP client and the comparison cost the serving runtime's
CPU per request sent, far more than per row; a watch judges windows of 30 s or more, so
a sample that waits this long costs its verdict nothing. A shadow sends each request
alone: its latency is judged against the serving side's."""


class _RoleMirror:
    """One role's current mirror and aggregates."""

    __slots__ = ("aggregates", "mirror", "role")

    def __init__(self, role: str) -> None:
        self.role = role
        self.mirror: Mirror | None = None
        self.aggregates: RunningAggregates | None = None


def _same_watch(a: QualityWatch, b: QualityWatch) -> bool:
    """Whether a watch's figures carry over: the same reference, sliced the same way."""
    return same_candidate(a.reference, b.reference) and (a.slice_header, a.max_slices) == (
        b.slice_header, b.max_slices,
    )  # fmt: skip


class ShadowController:
    """Mirrors this runtime's answered requests to the targets the target file names."""

    def __init__(
        self,
        config: RuntimeConfig,
        registry: CollectorRegistry,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        log_interval_seconds: float = 60.0,
        metrics: ShadowMetrics | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._model = config.model_name
        self._max_batch_rows = config.batching.max_batch_size  # the reference's too
        self._serving_version = config.model_version
        self._metrics = metrics or ShadowMetrics(registry)
        self._on_change = on_change or (lambda: None)
        self._clock, self._wall_clock = clock, wall_clock
        self._log_interval = log_interval_seconds
        self._watcher = (
            TargetWatcher(
                config.mirror_target_file,
                config.mirror_poll_interval_milliseconds / 1000,
                self.apply_file,
                parse_mirror_content,
            )
            if config.mirror_target_file
            else None
        )
        self._shadow = _RoleMirror("shadow")
        self._quality = _RoleMirror("quality")
        self._watch: QualityWatch | None = None
        self.slice_header: str | None = None
        """The header the data plane reads a request's slice from while a watch with
        slices runs (None: read none)."""
        self._stopped = False
        self._offer_failures = 0
        self._applying = asyncio.Lock()  # one change of target at a time

    @property
    def active(self) -> bool:
        return self._shadow.mirror is not None or self._quality.mirror is not None

    @property
    def mirror(self) -> Mirror | None:
        """The shadow candidate's mirror."""
        return self._shadow.mirror

    @property
    def quality_mirror(self) -> Mirror | None:
        return self._quality.mirror

    async def start(self) -> None:
        """Reads the target file once (mirroring from the first request if it names a
        target), then keeps watching it."""
        if self._watcher is not None:
            await self._watcher.start()

    async def stop(self) -> None:
        """Stops watching and mirroring; idempotent."""
        self._stopped = True
        if self._watcher is not None:
            await self._watcher.stop()
        await self.apply_file(MirrorFile())

    async def apply_file(self, file: MirrorFile) -> None:
        """Makes the file's shadow target and quality watch the mirrored ones."""
        async with self._applying:
            await self._apply_shadow(file.target)
            await self._apply_watch(file.quality_watch)
            self._on_change()

    async def apply(self, target: MirrorTarget | None) -> None:
        """Makes `target` the shadow candidate (None: none), the watch left as it is; see
        the module for what carries over."""
        async with self._applying:
            await self._apply_shadow(target)
            self._on_change()

    async def apply_watch(self, watch: QualityWatch | None) -> None:
        """Makes `watch` the quality watch (None: none), the shadow left as it is."""
        async with self._applying:
            await self._apply_watch(watch)
            self._on_change()

    async def _apply_shadow(self, target: MirrorTarget | None) -> None:
        old = self._shadow.aggregates
        keep = same_candidate(target, old.target if old else None)
        await self._switch(
            self._shadow, target, keep,
            lambda t: RunningAggregates(t, self._model, self._serving_version, self._metrics),
        )  # fmt: skip

    async def _apply_watch(self, watch: QualityWatch | None) -> None:
        old = self._quality.aggregates
        keep = (
            watch is not None
            and isinstance(old, QualityAggregates)
            and _same_watch(watch, old.watch)
        )
        if keep and isinstance(old, QualityAggregates) and watch is not None:
            old.configure(watch)

        def make(_: MirrorTarget) -> RunningAggregates:
            assert watch is not None
            return QualityAggregates(
                watch, self._model, self._serving_version, self._metrics,
                clock=self._clock, wall_clock=self._wall_clock,
            )  # fmt: skip

        await self._switch(self._quality, watch.reference if watch else None, keep, make)
        self._watch = watch if self._quality.mirror is not None else None
        self.slice_header = self._watch.slice_header if self._watch else None

    async def _switch(
        self,
        slot: _RoleMirror,
        target: MirrorTarget | None,
        keep: bool,
        make: Callable[[MirrorTarget], RunningAggregates],
    ) -> None:
        if self._stopped and target is not None:
            return
        old_mirror, old_aggregates = slot.mirror, slot.aggregates
        if target is not None and old_mirror is not None and old_mirror.target == target and keep:
            return
        slot.mirror = None  # offers stop at once, before any await below
        if old_mirror is not None:
            await old_mirror.close()
        if old_aggregates is not None and not keep:
            old_aggregates.close()
            slot.aggregates = None
        if target is None:
            if old_aggregates is not None:
                log.info("Stopped mirroring role=%s url=%s", slot.role, old_aggregates.target.url)
            return
        if slot.aggregates is None:
            slot.aggregates = make(target)
        slot.aggregates.target = target
        gather = slot.role == "quality"
        mirror = Mirror(
            target, slot.aggregates, clock=self._clock, log_interval_seconds=self._log_interval,
            gather_rows=self._max_batch_rows if gather else 1,
            gather_seconds=QUALITY_GATHER_SECONDS if gather else 0.0,
        )  # fmt: skip
        await mirror.start()
        slot.mirror = mirror
        log.info(
            "Started mirroring role=%s url=%s model=%s candidate_version=%s "
            "candidate_digest=%s traffic_percent=%d kept_aggregates=%s",
            slot.role, target.url, target.model_name, target.candidate_version,
            target.candidate_digest, target.traffic_percent, keep,
        )  # fmt: skip

    def offer(
        self, inputs: Outputs, outputs: Outputs, seconds: float, slice_value: str | None = None
    ) -> None:
        """Offers a request answered 200 (its decoded inputs, its outputs, its server
        time, the raw value of the watch's slice header) to the current mirrors, if any.
        Never raises and never blocks: the caller is the request path."""
        for slot in (self._shadow, self._quality):
            mirror, aggregates = slot.mirror, slot.aggregates
            if mirror is None or aggregates is None:
                continue
            aggregates.answered += 1
            try:
                mirror.offer(inputs, outputs, seconds, slice_value)
            except Exception:
                self._offer_failures += 1
                if self._offer_failures == 1 or self._offer_failures % 10_000 == 0:
                    log.warning("Failed to offer a request to the mirror role=%s failures=%d",
                                slot.role, self._offer_failures, exc_info=True)  # fmt: skip

    def mirroring(self) -> list[tuple[str, int, Mirror]]:
        """The roles mirrored to now: each one's name, share and mirror."""
        return [
            (slot.role, slot.mirror.target.traffic_percent, slot.mirror)
            for slot in (self._shadow, self._quality)
            if slot.mirror is not None and slot.aggregates is not None
        ]

    def offer_sampled(
        self,
        answered: int,
        roles: tuple[str, ...],
        sampled: list[tuple[Outputs, Outputs, float, str | None, tuple[str, ...]]],
    ) -> None:
        """`offer` for a data plane that samples itself (the Rust one): `answered`
        requests were answered 200 while `roles` were mirrored to, and `sampled` are those
        a role took, each with the roles that took it. Never raises."""
        for slot in (self._shadow, self._quality):
            mirror, aggregates = slot.mirror, slot.aggregates
            if mirror is None or aggregates is None or slot.role not in roles:
                continue
            aggregates.answered += answered
            for inputs, outputs, seconds, slice_value, taken in sampled:
                if slot.role not in taken:
                    continue
                try:
                    mirror.admit(inputs, outputs, seconds, slice_value)
                except Exception:
                    self._offer_failures += 1
                    if self._offer_failures == 1 or self._offer_failures % 10_000 == 0:
                        log.warning("Failed to offer a request to the mirror role=%s failures=%d",
                                    slot.role, self._offer_failures, exc_info=True)  # fmt: skip

    def count_dropped(self, role: str, count: int) -> None:
        """`count` requests sampled for `role` that never reached its mirror (the data
        plane could not hand them over in time): counted `dropped`."""
        for slot in (self._shadow, self._quality):
            if slot.role == role and slot.aggregates is not None:
                for _ in range(count):
                    slot.aggregates.record_outcome("dropped")

    def status(self) -> dict[str, Any]:
        """The `GET /v2/shadow` body (the shadow candidate only)."""
        aggregates = self._shadow.aggregates
        if aggregates is None:
            return inactive_status(self._serving_version)
        return aggregates.status()

    def quality_status(self) -> dict[str, Any]:
        """The `GET /v2/quality` body."""
        aggregates = self._quality.aggregates
        if not isinstance(aggregates, QualityAggregates):
            return inactive_quality_status(self._serving_version)
        return aggregates.status()

    def quality_exemplars(self) -> bytes:
        """The `GET /v2/quality/exemplars` body: an `.npz` (`encode_exemplars`), empty of
        exemplars while no watch runs."""
        aggregates = self._quality.aggregates
        if not isinstance(aggregates, QualityAggregates):
            return encode_exemplars([])
        return aggregates.exemplars_npz()
