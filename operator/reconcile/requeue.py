"""How soon one pass asks for the next when no event may say so. Pure.

A build under way is polled (its pod's termination message is not always announced by an
event on the Job), a failed build is looked at again when its backoff ends, and what is
judged over a sliding window (a shadow test, a promotion, the quality watch, the
autoscaler's signals) is read at its own poll interval: the pass asks for the soonest of
those that apply, or for nothing (the resync timer still runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from kubeinfer.operator.settings import Requeue
from kubeinfer.operator.state.engine_state import EnginePhase, EngineState


def build_wait_seconds(
    polls: Requeue, engine: EngineState, fallback: EngineState | None, now: datetime
) -> float | None:
    """The builds' say: a build under way (the spec's engine or the quality watch's
    fallback) is polled; else a failed build is looked at once its backoff ends (at least
    a second from now)."""
    building = (engine, *((fallback,) if fallback is not None else ()))
    if any(state.phase == EnginePhase.BUILDING for state in building):
        return polls.build_poll_seconds
    if engine.phase == EnginePhase.FAILED and engine.retry_at is not None:
        return max(1.0, (engine.retry_at - now).total_seconds())
    return None


def requeue_after(
    polls: Requeue,
    engines: Sequence[tuple[EngineState, EngineState | None]],
    now: datetime,
    *,
    shadowing: bool,
    autoscaling: bool,
    watching: bool,
) -> float | None:
    """The soonest next pass any part of this one wants: the builds' of each of `engines`
    (an engine and its fallback, `build_wait_seconds`), a shadow test or promotion under
    way (`shadowing`) and the quality watch (`watching`, whose window slides: judged as
    often as a shadow) at the shadow poll, autoscaling at the autoscaler's; None when
    nothing asks."""
    wanted = (
        *(build_wait_seconds(polls, engine, fallback, now) for engine, fallback in engines),
        polls.shadow_poll_seconds if shadowing or watching else None,
        polls.autoscale_poll_seconds if autoscaling else None,
    )
    return min((seconds for seconds in wanted if seconds is not None), default=None)
