"""The shadow rollout: which engine serves, which one runs as the candidate, and the
candidate's record in the status. Pure.

With strategy Shadow, a new engine (a changed spec built, or a new pin) does not replace
the serving one directly. It runs as a *candidate* beside it: its own Deployment and
Service, to which the serving pods mirror `trafficPercent` of their live requests,
comparing the answers with their own. Each pass judges the aggregates
(`verdict.judge`):

- Pending: the candidate runs; the serving pods mirror to it once it is available.
- Passed: the serving Deployment rolls to the candidate's engine (maxUnavailable 0, as
  every roll); the mirror stops; once the roll is complete the candidate is Promoted and
  its children are removed.
- Failed (a threshold, the deadline, or pods that refuse the candidate's engine as built
  by another backend version than their image has: EngineIncompatible, at once), or
  Aborted by `kubeinfer abort`: the candidate's children are removed at once,
  serving is untouched, and the record stays in `status.candidate`, so the same trial
  (same version, engine and shadow settings) is not run again until the spec changes.
- A spec change during a shadow replaces the candidate.

The first engine of an object has nothing to be compared with and serves directly, and
an engine equal to the serving one (same digest) needs no test either.

The manual gate is the annotation `kubeinfer.io/shadow-gate: "<promote|abort> <digest>"`
(written by `kubeinfer promote|abort`): it acts only on the candidate whose engine digest
it names, so a command that raced a newer candidate does nothing to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kubeinfer.operator.api.v1alpha1.conditions import Reason
from kubeinfer.operator.api.v1alpha1.enums import RolloutStrategy, ShadowVerdict
from kubeinfer.operator.api.v1alpha1.inference_deployment import InferenceDeploymentSpec
from kubeinfer.operator.api.v1alpha1.status import CandidateStatus
from kubeinfer.operator.rollout.verdict import Verdict, engine_incompatible, judge
from kubeinfer.operator.state import names
from kubeinfer.operator.state.decision import Event
from kubeinfer.operator.state.engine_state import EngineState, ServingEngine
from kubeinfer.operator.state.observed import KubeObject
from kubeinfer.operator.state.runtime_failures import runtime_failure
from kubeinfer.operator.state.shadow_readings import ShadowReading

GATE_ANNOTATION = "kubeinfer.io/shadow-gate"
"""`promote <digest>` or `abort <digest>`: the manual gate on the candidate with that
engine digest."""

GATE_ACTIONS = ("promote", "abort")
CLOSED = frozenset({ShadowVerdict.FAILED, ShadowVerdict.ABORTED})
"""Verdicts after which the same trial is not run again."""


@dataclass(frozen=True)
class ShadowQuery:
    """What the gather step should read: the aggregates of this candidate since `started`."""

    candidate_digest: str
    candidate_version: str
    started: datetime


@dataclass(frozen=True)
class RolloutPlan:
    """What this pass runs: `serving` (the serving Deployment's engine), `candidate` (a
    candidate Deployment's engine, None: no candidate children), whether the serving pods
    mirror to it, and the candidate's record for the status."""

    serving: ServingEngine | None
    candidate: ServingEngine | None = None
    mirror: bool = False
    record: CandidateStatus | None = None
    replaced: CandidateStatus | None = None
    """A Pending candidate this pass replaced (for its Event)."""
    blocked: bool = False
    """The spec's engine failed (or was aborted in) its shadow test: it will not serve
    until the spec changes."""

    @property
    def shadowing(self) -> bool:
        return self.record is not None and self.record.verdict == ShadowVerdict.PENDING

    @property
    def promoting(self) -> bool:
        return self.record is not None and self.record.verdict == ShadowVerdict.PASSED


def parse_gate(annotations: dict[str, str]) -> tuple[str, str] | None:
    """(action, digest) from the gate annotation; None when absent or malformed (a
    malformed gate is ignored, never half-applied)."""
    parts = (annotations.get(GATE_ANNOTATION) or "").split()
    if len(parts) == 2 and parts[0] in GATE_ACTIONS and parts[1].startswith("sha256:"):
        return parts[0], parts[1]
    return None


def trial_key(spec: InferenceDeploymentSpec, candidate: ServingEngine) -> str:
    """What one shadow test tests: the candidate's version and engine, and the settings it
    is judged by. A failed trial is retried only when this changes."""
    shadow = spec.rollout.shadow.to_wire()
    return names.stable_hash([candidate.version, candidate.digest, shadow], 32)


def metrics_query(status: CandidateStatus | None) -> ShadowQuery | None:
    """The aggregates the next decision needs: those of a candidate the stored status
    says is Pending (no read otherwise, so an object without a shadow costs nothing)."""
    if status is None or status.verdict != ShadowVerdict.PENDING:
        return None
    if not status.engine_digest or status.start_time is None:
        return None
    return ShadowQuery(status.engine_digest, status.version or "", status.start_time)


def _record(
    previous: CandidateStatus, verdict: Verdict, reading: ShadowReading | None
) -> CandidateStatus:
    """The candidate's record with this pass's verdict and figures (figures are kept from
    the last good read when the metrics cannot be read)."""
    update: dict[str, object] = {
        "verdict": verdict.outcome,
        "reason": verdict.reason,
        "message": verdict.message,
    }
    aggregates = reading.aggregates if reading else None
    if aggregates is not None:
        update.update(
            samples=aggregates.compared,
            mismatches=aggregates.mismatches,
            dropped=aggregates.dropped,
            candidate_errors=aggregates.candidate_errors + aggregates.timeouts,
            top1_agreement=aggregates.top1_agreement,
            max_absolute_difference=aggregates.max_abs_difference,
            serving_p99_milliseconds=_milliseconds(aggregates.serving_p99_seconds),
            candidate_p99_milliseconds=_milliseconds(aggregates.candidate_p99_seconds),
        )
    return previous.model_copy(update=update)


def _milliseconds(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


def _manual(previous: CandidateStatus, gate: tuple[str, str] | None) -> Verdict | None:
    """The manual gate's verdict, when it names this candidate's engine."""
    if gate is None or gate[1] != previous.engine_digest:
        return None
    if gate[0] == "promote":
        return Verdict(
            ShadowVerdict.PASSED, Reason.MANUAL_PROMOTION, "Promoted by `kubeinfer promote`."
        )
    return Verdict(ShadowVerdict.ABORTED, Reason.MANUAL_ABORT, "Aborted by `kubeinfer abort`.")


def plan_rollout(
    spec: InferenceDeploymentSpec,
    engine: EngineState,
    current: ServingEngine | None,
    previous: CandidateStatus | None,
    annotations: dict[str, str],
    reading: ShadowReading | None,
    candidate_available: bool,
    now: datetime,
    candidate_pods: tuple[KubeObject, ...] = (),
) -> RolloutPlan:
    """Which engine serves and which runs as the candidate after this pass.

    `current` is what the serving children run now, `previous` the stored candidate
    record, `reading` this pass's aggregates (None when none were read),
    `candidate_available` whether the candidate Deployment has an available pod (the
    mirror is switched on only then, so requests are not mirrored into nothing), and
    `candidate_pods` the candidate's pods as listed (their container statuses say when
    they cannot start)."""
    if engine.digest is None:
        # The spec's engine is not built yet: serving stays; a Pending candidate of an
        # older spec is no longer what the spec asks for.
        return RolloutPlan(current, record=_superseded(previous))
    new = ServingEngine(spec.model.version, engine.digest, engine.build_key)
    if current is None or current.digest == new.digest:
        return _unchallenged(new, previous)
    if spec.rollout.strategy != RolloutStrategy.SHADOW:
        return RolloutPlan(new, record=_superseded(previous))
    trial = trial_key(spec, new)
    if previous is None or previous.trial != trial:
        return _new_trial(current, new, previous, trial, now)
    if previous.verdict != ShadowVerdict.PENDING:
        return _plan_for(previous, current, new, candidate_available)
    verdict = pending_verdict(spec, previous, new.digest, annotations, reading, candidate_pods, now)
    return _plan_for(_record(previous, verdict, reading), current, new, candidate_available)


def _unchallenged(new: ServingEngine, previous: CandidateStatus | None) -> RolloutPlan:
    """The plan when nothing serves yet, or the spec's engine is the serving one: nothing
    to compare with, or nothing that could answer differently."""
    if previous is not None and previous.engine_digest != new.digest:
        # A candidate of another engine (the spec went back to the serving one).
        return RolloutPlan(new, record=_superseded(previous))
    if previous is not None and previous.verdict == ShadowVerdict.PASSED:
        # Promotion under way: the serving children already name the candidate's
        # engine, but their pods may not run it yet. The candidate keeps running
        # until they do (`promotion_complete`), so capacity never drops mid-roll.
        return RolloutPlan(new, candidate=new, record=previous)
    return RolloutPlan(new, record=previous)


def _new_trial(
    current: ServingEngine,
    new: ServingEngine,
    previous: CandidateStatus | None,
    trial: str,
    now: datetime,
) -> RolloutPlan:
    """A shadow test of `new` starts (replacing a Pending one of another trial)."""
    record = CandidateStatus(
        version=new.version,
        engine_digest=new.digest,
        verdict=ShadowVerdict.PENDING,
        reason=Reason.SHADOW_RUNNING,
        message="The candidate is starting; the serving pods mirror to it once it is available.",
        start_time=now,
        trial=trial,
    )
    replaced = previous if previous and previous.verdict == ShadowVerdict.PENDING else None
    return RolloutPlan(current, candidate=new, record=record, replaced=replaced)


def pending_verdict(
    spec: InferenceDeploymentSpec,
    previous: CandidateStatus,
    digest: str,
    annotations: dict[str, str],
    reading: ShadowReading | None,
    candidate_pods: tuple[KubeObject, ...],
    now: datetime,
) -> Verdict:
    """This pass's verdict on a Pending candidate of engine `digest`: pods that cannot load
    its engine fail it first (no manual promotion makes it servable), then the manual
    gate, then the thresholds over `reading`. A verdict still Pending says why the reading
    or the pods fell short."""
    failure = runtime_failure(candidate_pods, "shadow candidate", digest)
    if failure is not None and failure.engine_incompatible:
        return engine_incompatible(failure.message)
    started = previous.start_time or now
    verdict = _manual(previous, parse_gate(annotations)) or judge(
        spec.rollout.shadow, reading.aggregates if reading else None, started, now
    )
    if verdict.outcome != ShadowVerdict.PENDING:
        return verdict
    notes = [
        *([reading.error] if reading is not None and reading.error else []),
        *([failure.message] if failure is not None else []),
    ]
    message = " ".join([verdict.message, *notes])
    return Verdict(verdict.outcome, verdict.reason, message)


def _plan_for(
    record: CandidateStatus,
    current: ServingEngine,
    new: ServingEngine,
    candidate_available: bool,
) -> RolloutPlan:
    """The plan a candidate's verdict leads to. Passed: serving rolls to the candidate's
    engine, the candidate keeps running (not mirrored to) until the roll is complete.
    Failed or Aborted: serving stays, blocked until the spec changes. Promoted: the
    candidate's engine serves. Pending: the serving pods mirror to the candidate."""
    if record.verdict in CLOSED:
        return RolloutPlan(current, record=record, blocked=True)
    if record.verdict == ShadowVerdict.PROMOTED:
        return RolloutPlan(new, record=record)
    if record.verdict == ShadowVerdict.PASSED:
        return RolloutPlan(new, candidate=new, record=record)
    return RolloutPlan(current, candidate=new, mirror=candidate_available, record=record)


def _superseded(previous: CandidateStatus | None) -> CandidateStatus | None:
    """A Pending or Passed record whose candidate the spec no longer asks for."""
    if previous is None or previous.verdict not in (ShadowVerdict.PENDING, ShadowVerdict.PASSED):
        return previous
    return previous.model_copy(
        update={
            "verdict": ShadowVerdict.ABORTED,
            "reason": "Superseded",
            "message": "The spec changed during the shadow; this candidate was replaced.",
        }
    )


def promotion_complete(plan: RolloutPlan, serving_rolled_out: bool) -> RolloutPlan:
    """Once the serving Deployment runs the passed candidate's engine on every pod, the
    candidate is Promoted and its children go."""
    record = plan.record
    if (
        record is None
        or record.verdict != ShadowVerdict.PASSED
        or plan.serving is None
        or plan.serving.digest != record.engine_digest
        or not serving_rolled_out
    ):
        return plan
    promoted = record.model_copy(
        update={
            "verdict": ShadowVerdict.PROMOTED,
            "reason": Reason.SHADOW_PROMOTED,
            "message": f"{record.message} Serving runs it on every pod now.".strip(),
        }
    )
    return RolloutPlan(plan.serving, record=promoted)


def shadow_replaced_event(replaced: CandidateStatus, record: CandidateStatus | None) -> Event:
    """The Event of a Pending candidate replaced by a newer one (its condition stays
    ShadowRunning, so no transition announces it)."""
    new = f"version {record.version} (engine {record.engine_digest})" if record else "none"
    return Event(
        "Normal",
        "ShadowReplaced",
        f"The spec changed during the shadow of version {replaced.version} (engine "
        f"{replaced.engine_digest}); the candidate is now {new}.",
    )
