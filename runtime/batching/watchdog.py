"""The engine watchdog's state: batches that outlived their requests, and what that means
for readiness and liveness. Pure: time is passed in.

An engine call cannot be interrupted (it runs in a worker thread, inside ONNX Runtime or
TensorRT), so a batch that never returns would leave its requests waiting forever while
the health routes kept answering 200. The batcher bounds every running batch by the
latest deadline of its requests (`batch_bound`): past it, its requests are answered
with a timeout (nobody waits for them any more) and the batch counts as stuck here.
While one is stuck the runtime is not ready, so Kubernetes stops routing to it; if it has
not returned `liveness_seconds` after it got stuck, the runtime is not live either, so
Kubernetes restarts the pod. A stuck batch that returns clears both.

Not watched: a batch small and fast enough to run inline on the event loop
(`policy.runs_inline`: at most 4 rows, alone, when such batches have measured under the
inline bound). If one of those hangs, the event loop hangs with it, the health probes
get no answer at all, and Kubernetes restarts the pod once the liveness probe's
failureThreshold is reached; its requests get no error first.
"""

from __future__ import annotations

from collections.abc import Iterable


def batch_bound(deadlines: Iterable[float]) -> float:
    """When a running batch counts as stuck: the latest deadline of its requests (each
    counted from its arrival), so no request is answered late by the watchdog and none
    waits past its own deadline plus the batch's other requests' slack."""
    return max(deadlines)


class EngineWatchdog:
    """Counts the stuck batches and says since when the engine has been stuck."""

    def __init__(self, liveness_seconds: float) -> None:
        self.liveness_seconds = liveness_seconds
        self.stuck_batches = 0
        self.stuck_since: float | None = None

    @property
    def stuck(self) -> bool:
        return self.stuck_batches > 0

    def batch_stuck(self, now: float) -> None:
        self.stuck_batches += 1
        if self.stuck_since is None:
            self.stuck_since = now

    def batch_returned(self) -> None:
        self.stuck_batches -= 1
        if self.stuck_batches == 0:
            self.stuck_since = None

    def stuck_for(self, now: float) -> float:
        """Seconds since the engine got stuck; 0 when it is not."""
        return 0.0 if self.stuck_since is None else now - self.stuck_since

    def live(self, now: float) -> bool:
        """False once a stuck batch has not returned within `liveness_seconds`."""
        return self.stuck_since is None or now - self.stuck_since < self.liveness_seconds
