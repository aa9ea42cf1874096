"""Which watch events on a child ask for a pass over its owner. Most do; these carry
nothing a pass reads that another event does not bring:

- **A runtime pod's** (serving, shadow candidate, quality reference: the pods with a
  role) **while it shows no failure.** What a pass reads of these pods is why they
  cannot start (`state.runtime_failures`); their readiness and their coming and going
  reach it through their Deployment's status, whose event follows. So a runtime pod's
  event asks for a pass when the pod is failing, or deleted.
- **A build Job's before it has finished, and its pod's before the build container
  has terminated.** A pass reads of a build attempt whether its Job is Complete or
  Failed, and then its pod's termination message: the engine's digest, or what the
  build said as it failed (`state.build_attempt`). The Job's and the pod's progress
  until then (created, scheduled, running) changes nothing it decides, and their
  appearance is the pass's own doing. Their deletion still asks: a Job lost before its
  engine was recorded is built again.
- **A PodDisruptionBudget's status write** by the disruption controller, which recounts
  the healthy pods at every pod event: the pass reads the budget's spec, labels and
  annotations only (`OwnerEvents`' comparison: the generation, labels, annotations).

With a thousand objects these were most of the children's events (docs/fleet.md),
each a pass that found nothing to do. Events of the watch's first listing (no type)
always ask.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from kubeinfer.operator.kube.client import JOB, PDB, POD
from kubeinfer.operator.kube.owner_events import OwnerEvents
from kubeinfer.operator.state import names
from kubeinfer.operator.state.build_attempt import build_terminations, finished
from kubeinfer.operator.state.known_answers import awaits_answer_check
from kubeinfer.operator.state.observed import KubeObject
from kubeinfer.operator.state.runtime_failures import runtime_failure


class ChildEvents:
    """What the children's events ask for; keeps each budget's last seen generation,
    labels and annotations."""

    def __init__(self) -> None:
        self._budgets = OwnerEvents()

    def asks_for_pass(
        self,
        plural: str,
        event_type: str | None,
        labels: Mapping[str, str],
        body: Mapping[str, Any],
    ) -> bool:
        """Whether this event on a child (of resource `plural`) asks for a pass."""
        # kopf's body is a read-only mapping; what reads it here uses .get only.
        child = cast(KubeObject, body)
        if plural == PDB.plural:
            return self._budgets.asks_for_pass(event_type, body)
        if event_type in (None, "DELETED"):
            return True
        if plural == POD.plural and names.LABEL_ROLE in labels:
            return runtime_failure([child]) is not None or awaits_answer_check(child)
        if plural == POD.plural:
            return bool(build_terminations([child]))
        if plural == JOB.plural:
            return finished(child)
        return True
