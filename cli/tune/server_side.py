"""A run seen from the server's side: its CPU (Linux /proc) and its own counters
(`/metrics`: the requests it answered, the batch-size histogram's rows and batches), read
just before and just after the measured run, so the figures beside the load generator's
are the server's own, over one span.

`kubeinfer tune` reads `kubeinfer serve`'s; the benchmarks read other servers' too (the
metric names are parameters: MLServer's batch sizes come from our runtime's own metric).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from kubeinfer.cli.tune.server import http_get

BATCH_SIZE = "kubeinfer_batch_size"
REQUESTS = "kubeinfer_requests"


def process_cpu_seconds(pids: Sequence[int]) -> float | None:
    """User plus system CPU of processes and their threads (Linux /proc; None where it
    cannot be read)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Counts:
    """A server's counters at one moment (None: it has no such series)."""

    rows: float | None
    batches: float | None
    answered: float | None
    """Requests answered 200."""


def read_counts(
    metrics_text: str, model: str | None = None, batch_size: str = BATCH_SIZE
) -> Counts:
    """The counters of a Prometheus exposition, text or OpenMetrics (of one model's series,
    when named). Samples are matched by their own names: the text-format parser names an
    OpenMetrics counter's family after its `_total` sample."""
    from prometheus_client.parser import text_string_to_metric_families

    rows = batches = answered = None
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if model is not None and model not in sample.labels.values():
                continue
            if sample.name == f"{batch_size}_sum":
                rows = (rows or 0.0) + sample.value
            elif sample.name == f"{batch_size}_count":
                batches = (batches or 0.0) + sample.value
            elif sample.name == f"{REQUESTS}_total" and sample.labels.get("code") == "200":
                answered = (answered or 0.0) + sample.value
    return Counts(rows, batches, answered)


@dataclass(frozen=True)
class Snapshot:
    cpu_seconds: float | None
    counts: Counts


def snapshot(
    pids: Sequence[int], metrics_url: str | None, model: str | None = None,
    batch_size: str = BATCH_SIZE,
) -> Snapshot:  # fmt: skip
    """The server's CPU and counters now (counters all None when /metrics cannot be read)."""
    counts = Counts(None, None, None)
    if metrics_url is not None:
        try:
            status, body = http_get(metrics_url)
            if status == 200:
                counts = read_counts(body.decode(), model, batch_size)
        except OSError:
            pass
    return Snapshot(process_cpu_seconds(pids), counts)


@dataclass(frozen=True)
class ServerSide:
    """Between two snapshots."""

    cpu_seconds: float | None
    answered: float | None
    mean_batch_rows: float | None

    @property
    def requests_per_cpu_second(self) -> float | None:
        if not self.cpu_seconds or not self.answered:
            return None
        return self.answered / self.cpu_seconds


def between(before: Snapshot, after: Snapshot) -> ServerSide:
    def delta(a: float | None, b: float | None) -> float | None:
        return b - a if a is not None and b is not None else None

    rows = delta(before.counts.rows, after.counts.rows)
    batches = delta(before.counts.batches, after.counts.batches)
    return ServerSide(
        cpu_seconds=delta(before.cpu_seconds, after.cpu_seconds),
        answered=delta(before.counts.answered, after.counts.answered),
        mean_batch_rows=rows / batches if rows is not None and batches else None,
    )
