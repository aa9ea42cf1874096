"""The Events of one pass: news of the InferenceDeployment's conditions, and on a mixed
GPU fleet of each product's engine. Pure.

An Event says what changed, once: a condition whose status or reason changed (Warning for
a failure's reason), never one that only says the same again, so a pass that finds
nothing new emits none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from kubeinfer.operator.api.v1alpha1.conditions import (
    Condition,
    ConditionStatus,
    ConditionType,
    Reason,
)
from kubeinfer.operator.api.v1alpha1.gpu_fleet import ProductEnginePhase, ProductEngineStatus
from kubeinfer.operator.reconcile.situation import cut
from kubeinfer.operator.state.decision import Event

FALSE = ConditionStatus.FALSE

WARNING_REASONS = frozenset(
    {
        Reason.INVALID_SPEC,
        Reason.FORBIDDEN,
        Reason.ENGINE_BUILD_FAILED,
        Reason.ROLLOUT_STALLED,
        Reason.SHADOW_FAILED,
        Reason.SHADOW_ABORTED,
        Reason.READ_WRITE_ONCE_ACROSS_NODES,
        Reason.ENGINE_INCOMPATIBLE,
        Reason.RUNTIME_FAILING,
        Reason.QUALITY_DRIFT,
        Reason.QUALITY_FALLBACK,
        Reason.SLO_MISSED,
    }
)
EVENT_MESSAGE_LIMIT = 1024
MIRRORED = frozenset({ConditionType.RECONCILING, ConditionType.STALLED})


def transition_events(before: list[Condition], after: list[Condition]) -> tuple[Event, ...]:
    """An Event per piece of news: the conditions whose status or reason changed (or that
    are new), one Event per reason, Warning for failure reasons. Conditions that change
    together for one reason are one piece of news (an engine starting to build makes
    Ready, EngineReady and Progressing say EngineBuilding: one Event names the three).
    Not news: Reconciling and Stalled, which mirror Progressing and Degraded; a new object
    not being Degraded, or not yet Available; and Available changing its reason while it
    stays False (it announces when pods start or stop serving; why none serve is Ready's
    and Degraded's news)."""
    old = {c.type: c for c in before}
    news: dict[str, list[Condition]] = {}
    for condition in after:
        previous = old.get(condition.type)
        if condition.type in MIRRORED or not _is_news(previous, condition):
            continue
        news.setdefault(condition.reason, []).append(condition)
    return tuple(_event(reason, conditions) for reason, conditions in news.items())


def _is_news(previous: Condition | None, condition: Condition) -> bool:
    if previous is None:
        quiet = {ConditionType.DEGRADED, ConditionType.AVAILABLE}
        return not (condition.type in quiet and condition.status == FALSE)
    if previous.status != condition.status:
        return True
    return previous.reason != condition.reason and not (
        condition.type == ConditionType.AVAILABLE and condition.status == FALSE
    )


def _event(reason: str, conditions: list[Condition]) -> Event:
    """One Event for the conditions that changed for `reason`: `A is S, B is T: message`
    when they say the same, each one's `A is S: message` otherwise."""
    said = [f"{c.type} is {c.status}" for c in conditions]
    messages = [c.message for c in conditions]
    if len(set(messages)) == 1:
        text = ", ".join(said) + (f": {messages[0]}" if messages[0] else "")
    else:
        text = "; ".join(f"{s}: {m}" if m else s for s, m in zip(said, messages, strict=True))
    if len(text) > EVENT_MESSAGE_LIMIT:
        text = text[: EVENT_MESSAGE_LIMIT - 3] + "..."
    kind: Literal["Normal", "Warning"] = "Warning" if reason in WARNING_REASONS else "Normal"
    return Event(type=kind, reason=reason, message=text)


PRODUCT_EVENTS: dict[ProductEnginePhase, tuple[Literal["Normal", "Warning"], Reason]] = {
    ProductEnginePhase.BUILT: ("Normal", Reason.ENGINE_BUILT),
    ProductEnginePhase.BUILDING: ("Normal", Reason.ENGINE_BUILDING),
    ProductEnginePhase.FAILED: ("Warning", Reason.ENGINE_BUILD_FAILED),
}


def product_events(
    before: Sequence[ProductEngineStatus], after: Sequence[ProductEngineStatus]
) -> tuple[Event, ...]:
    """On a fleet, an Event per product whose engine changed phase or digest (or that is
    new): the summary conditions say how many are built, these say which."""
    old = {e.gpu_product: (e.phase, e.digest) for e in before}
    events = []
    for engine in after:
        if old.get(engine.gpu_product) == (engine.phase, engine.digest):
            continue
        kind, reason = PRODUCT_EVENTS[engine.phase]
        events.append(Event(kind, reason, cut(f"{engine.gpu_product}: {engine.message}")))
    return tuple(events)
