"""What is going on with an InferenceDeployment, and what that makes of its summary
conditions and phase. Pure.

One chain, most pressing first, picks the single situation that applies (`situation_of`),
over every engine the object runs (its own, or each GPU product's on a mixed fleet):

    no eligible GPU product (a fleet) > a build failed > builds under way > runtime pods
    failing > a rollout stalled > a shadow rollout's say > quality fallback > quality
    drift > rolled out everywhere > rolling out

and one table (`summary_conditions`) turns that situation into Ready, Progressing,
Degraded, Reconciling, Stalled and the phase. The order is written once, so the
conditions and the phase can never disagree about which situation they describe.

Ready and the phase also answer a question beside the chain: does the spec's engine
serve on every desired replica (on a fleet, each product's engine on every pod wanted
there)? When it does, they say so whatever else the situation reports (a promotion whose
record still says Passed, a leftover pod that crashes, a deadline the Deployment's
controller has not cleared yet): Ready is what `kubectl wait` and Argo CD read, and those
want to know whether the spec is served, while Progressing and Degraded tell the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from kubeinfer.operator.api.v1alpha1.conditions import (
    ConditionStatus,
    ConditionValue,
    Reason,
)
from kubeinfer.operator.api.v1alpha1.enums import Phase
from kubeinfer.operator.reconcile.rollout_progress import RolloutProgress
from kubeinfer.operator.rollout.report import ShadowReport
from kubeinfer.operator.state.engine_state import EnginePhase, EngineState, ServingEngine
from kubeinfer.operator.state.runtime_failures import RuntimeFailure

TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE
AS_EXPECTED: ConditionValue = (FALSE, Reason.AS_EXPECTED, "")
"""Degraded or Stalled when nothing needs attention."""


class SituationKind(StrEnum):
    """The situations, in the order the chain tries them."""

    BUILD_FAILED = "BuildFailed"
    BUILDING = "Building"
    RUNTIME_FAILING = "RuntimeFailing"
    ROLLOUT_STALLED = "RolloutStalled"
    SHADOW = "Shadow"
    QUALITY_FALLBACK = "QualityFallback"
    QUALITY_DRIFT = "QualityDrift"
    ROLLED_OUT = "RolledOut"
    ROLLING_OUT = "RollingOut"


MESSAGE_LIMIT = 1024
"""The longest message a fleet's joined sentences make (one per GPU product)."""


def cut(text: str) -> str:
    """`text`, cut to MESSAGE_LIMIT."""
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


@dataclass(frozen=True)
class EngineFacts:
    """What the chain reads of one engine: the engine, the one its runtime runs
    (`serving`), why runtime pods of that engine cannot start (`failure`) and its roll.
    `product` is a mixed fleet's GPU product (None: the object's own engine), `nodes`
    its eligible nodes."""

    engine: EngineState
    serving: ServingEngine | None
    version: str
    """The spec's model version."""
    failure: RuntimeFailure | None
    rollout: RolloutProgress
    product: str | None = None
    nodes: int = 0

    @property
    def current(self) -> bool:
        """Whether the runtime runs the spec's engine and model version."""
        return (
            self.engine.ready
            and self.serving is not None
            and self.serving.digest == self.engine.digest
            and self.serving.version == self.version
        )


@dataclass(frozen=True)
class Facts:
    """What the chain reads: each engine's facts (the object's own, or on a mixed GPU
    fleet each eligible product's: `fleet`), the replicas wanted over all of them, and
    what the deciders report. An object on a fleet with no eligible product has no
    engine, and `no_products` says why. How the engines' sentences join into one message
    is said here too: one engine's message is its own; a fleet's name each product."""

    engines: tuple[EngineFacts, ...]
    version: str
    """The spec's model version."""
    replicas: int
    shadow: ShadowReport = field(default_factory=ShadowReport)
    quality_drift: str | None = None
    """The quality watch's message when it finds the served engine drifting, else None."""
    fallback: str | None = None
    """What serving falling back to the reference-precision engine says, while it does."""
    fleet: bool = False
    no_products: str = ""

    @property
    def current(self) -> bool:
        """Whether every engine's runtime runs the spec's engine and model version."""
        return bool(self.engines) and all(each.current for each in self.engines)

    @property
    def complete(self) -> bool:
        """Whether every engine's roll is complete."""
        return all(each.rollout.complete for each in self.engines)

    @property
    def ready(self) -> bool:
        """Whether the spec's engines serve on every desired replica."""
        return self.current and self.complete

    @property
    def failure(self) -> RuntimeFailure | None:
        """The first engine's runtime failure, if any engine has one."""
        return next((each.failure for each in self.engines if each.failure), None)

    @property
    def ready_replicas(self) -> int:
        return sum(each.rollout.ready_replicas for each in self.engines)

    @property
    def keeps_serving(self) -> str:
        """A sentence naming the older versions that serve meanwhile, or ""."""
        older = sorted({e.serving.version for e in self.engines if e.serving and not e.current})
        if not older:
            return ""
        if self.fleet:
            return f" Version {', '.join(older)} keeps serving meanwhile."
        return f" Version {older[0]} keeps serving."

    def said(self, phase: EnginePhase) -> str:
        """What the engines in `phase` say (on a fleet, each after its product's name)."""
        engines = [each for each in self.engines if each.engine.phase == phase]
        if not self.fleet:
            return " ".join(each.engine.message for each in engines)
        return cut(" ".join(f"{each.product}: {each.engine.message}" for each in engines))

    @property
    def stalled(self) -> str | None:
        """What the stalled rolls say; None while none is."""
        stalled = [each.rollout.message for each in self.engines if each.rollout.stalled]
        if not stalled:
            return None
        return cut("; ".join(stalled)) if self.fleet else f"{stalled[0]}."

    @property
    def rollouts_said(self) -> str:
        """What each engine's roll says."""
        return cut(" ".join(f"{each.rollout.message}." for each in self.engines))

    @property
    def serves(self) -> str:
        """Ready's message once the spec's engines serve on every desired replica."""
        if self.fleet:
            nodes = sum(each.nodes for each in self.engines)
            return (
                f"Version {self.version} serves on {len(self.engines)} GPU products "
                f"({nodes} nodes), each on its own engine."
            )
        digests = ", ".join(str(each.engine.digest) for each in self.engines)
        return (
            f"Version {self.version} (engine {digests}) serves on "
            f"{self.replicas} of {self.replicas} pods."
        )

    @property
    def replacing(self) -> bool:
        """The spec's engines run everywhere and every roll that is not complete is only
        replacing pods (`RolloutProgress.replacing`): nothing rolls."""
        return self.current and all(
            each.rollout.complete or each.rollout.replacing for each in self.engines
        )


@dataclass(frozen=True)
class Situation:
    """The one situation that applies, with its reason and message. `keeps_serving` and
    `meanwhile` are what the summary and Progressing add to the message;
    `still_serving` tells a Degraded phase from a Failed one; `serves` is Ready's message
    when the spec's engine serves on every replica ("" when it does not)."""

    kind: SituationKind
    reason: Reason
    message: str
    keeps_serving: str = ""
    meanwhile: str = ""
    still_serving: bool = False
    serves: str = ""
    shadow: ShadowReport = field(default_factory=ShadowReport)


def situation_of(facts: Facts) -> Situation:
    """The first situation of the chain that applies, with Ready's message when the spec's
    engines serve on every replica."""
    if facts.fleet and not facts.engines:  # no eligible GPU product: nothing else to say
        return Situation(SituationKind.ROLLOUT_STALLED, Reason.NO_GPU_NODES, facts.no_products)
    situation = _first_that_applies(facts)
    if not facts.ready:
        return situation
    return replace(situation, serves=facts.serves)


def _first_that_applies(facts: Facts) -> Situation:
    phases = {each.engine.phase for each in facts.engines}
    failure, shadow, stalled = facts.failure, facts.shadow, facts.stalled
    if EnginePhase.FAILED in phases:
        return Situation(
            SituationKind.BUILD_FAILED,
            Reason.ENGINE_BUILD_FAILED,
            facts.said(EnginePhase.FAILED),
            keeps_serving=facts.keeps_serving,
            still_serving=any(each.serving for each in facts.engines),
        )
    if EnginePhase.BUILDING in phases:
        # A new image rolls the pods before its engine is built, and they refuse the old
        # engine until it is: worth a mention, not a failure.
        return Situation(
            SituationKind.BUILDING,
            Reason.ENGINE_BUILDING,
            facts.said(EnginePhase.BUILDING),
            keeps_serving=facts.keeps_serving,
            meanwhile=f" Meanwhile: {failure.message}" if failure else "",
        )
    if failure is not None:
        return Situation(
            SituationKind.RUNTIME_FAILING,
            failure.reason,
            failure.message,
            keeps_serving=facts.keeps_serving,
            still_serving=facts.ready_replicas > 0,
        )
    if stalled is not None:
        return Situation(SituationKind.ROLLOUT_STALLED, Reason.ROLLOUT_STALLED, stalled)
    if shadow.progress is not None:
        _, reason, message = shadow.progress
        return Situation(SituationKind.SHADOW, reason, message, shadow=shadow)
    if facts.fallback is not None:
        # The spec's engine drifted and serving runs (or rolls to) the fallback engine.
        return Situation(
            SituationKind.QUALITY_FALLBACK,
            Reason.QUALITY_DRIFT,
            facts.fallback,
            meanwhile="" if facts.complete else facts.rollouts_said,
            still_serving=True,
        )
    if facts.current and facts.quality_drift is not None:
        # Judged while the spec's engine serves, rolled out or scaling: a scale-up must
        # not clear the condition and raise it again.
        return Situation(
            SituationKind.QUALITY_DRIFT,
            Reason.QUALITY_DRIFT,
            facts.quality_drift,
            meanwhile="" if facts.complete else facts.rollouts_said,
        )
    if facts.ready:
        return Situation(SituationKind.ROLLED_OUT, Reason.ROLLOUT_COMPLETE, facts.rollouts_said)
    return Situation(
        SituationKind.ROLLING_OUT,
        Reason.PODS_NOT_READY if facts.replacing else Reason.ROLLING_OUT,
        facts.rollouts_said,
        keeps_serving=facts.keeps_serving,
    )


QUALITY_SITUATIONS = (SituationKind.QUALITY_DRIFT, SituationKind.QUALITY_FALLBACK)


@dataclass(frozen=True)
class SummaryConditions:
    """The conditions and phase a situation determines."""

    ready: ConditionValue
    progressing: ConditionValue
    degraded: ConditionValue
    reconciling: ConditionValue
    stalled: ConditionValue
    phase: Phase


def summary_conditions(situation: Situation) -> SummaryConditions:
    """The one table from situation to conditions and phase. Reconciling and Stalled, all
    that kstatus (and so a Flux health check) reads, mirror Progressing and Degraded."""
    said = (situation.reason, situation.message)
    with_older = (situation.reason, situation.message + situation.keeps_serving)
    failed_or_degraded = Phase.DEGRADED if situation.still_serving else Phase.FAILED
    match situation.kind:
        case SituationKind.BUILD_FAILED:
            ready, progressing = (FALSE, *with_older), (FALSE, *said)
            degraded, phase = (TRUE, *with_older), failed_or_degraded
        case SituationKind.BUILDING:
            ready = (FALSE, *with_older)
            progressing = (TRUE, situation.reason, situation.message + situation.meanwhile)
            degraded, phase = AS_EXPECTED, Phase.BUILDING_ENGINE
        case SituationKind.RUNTIME_FAILING:
            ready, progressing = (FALSE, *with_older), (FALSE, *said)
            degraded, phase = (TRUE, *said), failed_or_degraded
        case SituationKind.ROLLOUT_STALLED:
            ready, progressing = (FALSE, *said), (FALSE, *said)
            degraded, phase = (TRUE, *said), Phase.DEGRADED
        case SituationKind.SHADOW:
            shadow = situation.shadow
            ready, progressing = (FALSE, *said), shadow.progress or (FALSE, *said)
            degraded, phase = shadow.degraded or AS_EXPECTED, shadow.phase or Phase.DEPLOYING
        case SituationKind.QUALITY_DRIFT | SituationKind.QUALITY_FALLBACK:
            ready, progressing, degraded, phase = _quality_conditions(situation)
        case SituationKind.ROLLED_OUT:
            ready, progressing = (TRUE, Reason.READY, situation.serves), (FALSE, *said)
            degraded, phase = AS_EXPECTED, Phase.READY
        case SituationKind.ROLLING_OUT:
            ready, progressing = (FALSE, *with_older), (TRUE, *said)
            degraded, phase = AS_EXPECTED, Phase.DEPLOYING
    if situation.serves:  # whatever else the situation says: see the module's docstring
        ready, phase = (TRUE, Reason.READY, situation.serves), Phase.READY
    reconciling, stalled = kstatus_conditions(situation.kind, progressing, degraded)
    return SummaryConditions(ready, progressing, degraded, reconciling, stalled, phase)


def _quality_conditions(
    situation: Situation,
) -> tuple[ConditionValue, ConditionValue, ConditionValue, Phase]:
    """Ready, Progressing, Degraded and the phase when the quality watch found drift.
    Drift: the spec's engine serves, its answers drift from the reference's. Fallback:
    Ready says whether the spec's engine serves; it does not, by the operator's choice,
    until the spec changes. Degraded carries the drift (and the fallback); Progressing
    says what the rollout does (`meanwhile`: the rollout's sentence while it rolls)."""
    rolling = bool(situation.meanwhile)
    degraded: ConditionValue = (TRUE, situation.reason, situation.message)
    if situation.kind == SituationKind.QUALITY_FALLBACK:
        ready: ConditionValue = (FALSE, Reason.QUALITY_FALLBACK, situation.message)
        done, phase = "The fallback engine serves on every pod.", Phase.DEGRADED
    else:
        ready = (FALSE, Reason.ROLLING_OUT, situation.meanwhile)
        done = "The spec's engine serves on every pod."
        phase = Phase.DEPLOYING if rolling else Phase.READY
    progressing: ConditionValue = (
        (TRUE, Reason.ROLLING_OUT, situation.meanwhile)
        if rolling
        else (FALSE, Reason.ROLLOUT_COMPLETE, done)
    )
    return ready, progressing, degraded, phase


def kstatus_conditions(
    kind: SituationKind, progressing: ConditionValue, degraded: ConditionValue
) -> tuple[ConditionValue, ConditionValue]:
    """Reconciling and Stalled, all that kstatus (and so a Flux health check) reads: they
    mirror Progressing and Degraded. Drift is no reconcile failure (the object is
    reconciled, its engine's answers moved), so with the quality situations Stalled stays
    False; a degraded object is not reconciling."""
    as_progressing = progressing if progressing[0] == TRUE else (FALSE, *progressing[1:])
    if degraded[0] == TRUE and kind not in QUALITY_SITUATIONS:
        return (FALSE, degraded[1], degraded[2]), degraded
    return as_progressing, AS_EXPECTED
