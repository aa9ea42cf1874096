"""Which watch events on a child ask for a pass over its owner. Most do; two kinds of
event carry nothing a pass reads that another event does not bring:

- **A runtime pod's** (serving, shadow candidate, quality reference: the pods with a
  role) **while it shows no failure.** What a pass reads of these pods is why they
  cannot start (`state.runtime_failures`); their readiness and their coming and going
  reach it through their Deployment's status, whose event follows. So a runtime pod's
  event asks for a pass when the pod is failing, or deleted. (A build pod's every event
  still asks: its termination message is the engine's digest.)
- **A PodDisruptionBudget's status write** by the disruption controller, which recounts
  the healthy pods at every pod event: the pass reads the budget's spec, labels and
  annotations only (`OwnerEvents`' comparison: the generation, labels, annotations).

With a thousand objects these were a third of the children's events (docs/fleet.md),
each a pass that found nothing to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from kubeinfer.operator.kube.client import PDB, POD
from kubeinfer.operator.kube.owner_events import OwnerEvents
from kubeinfer.operator.state import names
from kubeinfer.operator.state.runtime_failures import runtime_failure
from kubeinfer.operator.state.snapshot import KubeObject


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
        if plural == POD.plural and names.LABEL_ROLE in labels:
            # kopf's body is a read-only mapping; the failure reads it with .get only.
            pod = cast(KubeObject, body)
            return event_type == "DELETED" or runtime_failure([pod]) is not None
        if plural == PDB.plural:
            return self._budgets.asks_for_pass(event_type, body)
        return True
