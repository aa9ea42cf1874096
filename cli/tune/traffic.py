"""The traffic a tuning sweep offers the server: request sizes, arrivals, a recorded trace.

Pure: every function takes what it needs (a seeded generator included) and returns values.

Request sizes (`--rows`): `1,8,32` gives each size an equal share of the requests;
`1:6,8:3,32:1` weights them (rows:weight, weights relative to each other). Rows are the
request's first (batch) dimension.

A recorded trace (`--trace FILE`) is JSON lines, one request per line, in the order of
the recording or any other:

    {"offsetSeconds": 0.0, "rows": 1}
    {"offsetSeconds": 0.0123, "rows": 8}

`offsetSeconds` is when the request arrived, in seconds from the start of the recording
(at least 0); `rows` its batch dimension (at least 1). Blank lines are skipped; any other
field is an error, so a misspelt one is not silently ignored. Each sweep point replays the
trace from its start for its warm-up and measured window; a trace shorter than that plays
again right after itself, one period being its last offset plus its mean gap between
arrivals, so every point is offered the same arrivals.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from kubeinfer.contract.api_model import ApiModel
from pydantic import Field, ValidationError


class TrafficError(ValueError):
    """A traffic description that cannot be used; the message says what to change."""


@dataclass(frozen=True)
class RowsMix:
    """Request sizes and the share of requests of each (shares sum to 1)."""

    rows: tuple[int, ...]
    shares: tuple[float, ...]

    @property
    def largest(self) -> int:
        return max(self.rows)


def parse_rows_mix(text: str) -> RowsMix:
    """`1,8,32` or `1:6,8:3,32:1` (see the module docstring)."""
    weights: dict[int, float] = {}
    for part in (p.strip() for p in text.split(",")):
        size_text, colon, weight_text = part.partition(":")
        try:
            rows = int(size_text)
            weight = float(weight_text) if colon else 1.0
        except ValueError:
            raise TrafficError(
                f"--rows: {part!r} is not ROWS or ROWS:WEIGHT (e.g. 1,8,32 or 1:6,8:3,32:1)"
            ) from None
        if rows < 1:
            raise TrafficError(f"--rows: a request has at least 1 row, not {rows}")
        if not weight > 0 or weight == float("inf"):
            raise TrafficError(f"--rows: the weight of {rows} rows must be positive, not {weight}")
        if rows in weights:
            raise TrafficError(f"--rows: {rows} rows is listed twice")
        weights[rows] = weight
    total = sum(weights.values())
    return RowsMix(tuple(weights), tuple(w / total for w in weights.values()))


def sample_rows(mix: RowsMix, count: int, rng: np.random.Generator) -> list[int]:
    """`count` request sizes drawn from the mix."""
    return [int(r) for r in rng.choice(mix.rows, size=count, p=mix.shares)]


@dataclass(frozen=True)
class Arrival:
    """One request of an open-loop schedule: when it is due, and its rows."""

    offset_seconds: float
    rows: int


def poisson_arrivals(
    rate_per_second: float, until_seconds: float, mix: RowsMix, rng: np.random.Generator
) -> list[Arrival]:
    """Arrivals of a Poisson process (exponential gaps, as independent users make them)
    at `rate_per_second` from 0 until `until_seconds`, sizes drawn from the mix."""
    if not rate_per_second > 0:
        raise TrafficError(f"--rate must be positive, not {rate_per_second}")
    expected = rate_per_second * until_seconds
    # Enough gaps that their sum passes `until_seconds` all but surely; topped up if not.
    gaps = rng.exponential(1 / rate_per_second, size=int(expected + 6 * expected**0.5 + 16))
    offsets = np.cumsum(gaps)
    while offsets[-1] < until_seconds:
        more = rng.exponential(1 / rate_per_second, size=len(gaps))
        offsets = np.concatenate([offsets, offsets[-1] + np.cumsum(more)])
    offsets = offsets[offsets < until_seconds]
    sizes = sample_rows(mix, len(offsets), rng)
    return [Arrival(float(t), rows) for t, rows in zip(offsets, sizes, strict=True)]


class TraceLine(ApiModel):
    """One line of a trace file."""

    offset_seconds: float = Field(ge=0, allow_inf_nan=False)
    """When the request arrived, in seconds from the start of the recording."""

    rows: int = Field(ge=1)
    """The request's first (batch) dimension."""


def parse_trace(text: str, source: str = "the trace") -> list[Arrival]:
    """The arrivals of a trace file's text, sorted by offset (format: module docstring)."""
    arrivals = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            parsed = TraceLine.model_validate(json.loads(line))
        except (ValueError, ValidationError) as error:
            detail = (
                "; ".join(
                    f"{'.'.join(map(str, e['loc'])) or 'line'}: {e['msg']}" for e in error.errors()
                )
                if isinstance(error, ValidationError)
                else f"not JSON ({error})"
            )
            raise TrafficError(
                f"{source}, line {number}: {detail}; each line is "
                '{"offsetSeconds": SECONDS, "rows": ROWS}'
            ) from None
        arrivals.append(Arrival(parsed.offset_seconds, parsed.rows))
    if len(arrivals) < 2:
        raise TrafficError(
            f"{source} has {len(arrivals)} request(s): it needs at least 2 (their spacing "
            "is the rate it replays)"
        )
    arrivals.sort(key=lambda a: a.offset_seconds)
    if arrivals[-1].offset_seconds == arrivals[0].offset_seconds:
        raise TrafficError(f"{source}: every request has the same offset, so it has no rate")
    return arrivals


def trace_period_seconds(trace: Sequence[Arrival]) -> float:
    """How long one play of the trace lasts: its last offset plus its mean gap."""
    span = trace[-1].offset_seconds - trace[0].offset_seconds
    return trace[-1].offset_seconds + span / (len(trace) - 1)


def replay_trace(trace: Sequence[Arrival], until_seconds: float) -> list[Arrival]:
    """The trace's arrivals from 0 until `until_seconds`, played again after itself as
    often as it takes (see the module docstring)."""
    period = trace_period_seconds(trace)
    arrivals = []
    play = 0
    while play * period < until_seconds:
        for arrival in trace:
            offset = play * period + arrival.offset_seconds
            if offset >= until_seconds:
                break
            arrivals.append(Arrival(offset, arrival.rows))
        play += 1
    return arrivals
