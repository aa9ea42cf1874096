"""Where the batcher reports what it does: `BatchObserver`, which the Prometheus metrics
(`kubeinfer.runtime.metrics.RuntimeMetrics`) implement, and a no-op for batchers without
metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class BatchObserver(Protocol):
    """Where the batcher reports what it does (the Prometheus metrics implement it)."""

    def queue_depth(self, depth: int) -> None: ...

    def inflight_batches(self, count: int) -> None: ...

    def inflight_requests(self, count: int) -> None: ...

    def batch_started(self, rows: int, queue_seconds: Sequence[float]) -> None: ...

    def batch_finished(self, compute_seconds: float) -> None: ...

    def stuck_batches(self, count: int) -> None: ...

    def output_rows_mismatched(self) -> None:
        """A batch failed: an output's first axis did not hold the batch's rows."""
        ...

    def slo_p99_latency(self, seconds: float) -> None: ...

    def engine_buffers(self, total_bytes: int) -> None: ...

    def batching_setting(
        self, queue_delay_seconds: float, preferred_batch_size: int, concurrent_batches: int
    ) -> None: ...


class NoObserver:
    """Reports nowhere (a batcher without metrics, in tests)."""

    def queue_depth(self, depth: int) -> None:
        pass

    def inflight_batches(self, count: int) -> None:
        pass

    def inflight_requests(self, count: int) -> None:
        pass

    def batch_started(self, rows: int, queue_seconds: Sequence[float]) -> None:
        pass

    def batch_finished(self, compute_seconds: float) -> None:
        pass

    def stuck_batches(self, count: int) -> None:
        pass

    def output_rows_mismatched(self) -> None:
        pass

    def slo_p99_latency(self, seconds: float) -> None:
        pass

    def engine_buffers(self, total_bytes: int) -> None:
        pass

    def batching_setting(
        self, queue_delay_seconds: float, preferred_batch_size: int, concurrent_batches: int
    ) -> None:
        pass
