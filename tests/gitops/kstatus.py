"""kstatus' rules for a custom resource (sigs.k8s.io/cli-utils/pkg/kstatus/status), what
Flux's health checks and `kubectl wait`-style pollers built on kstatus read. Pure.

No Python port of kstatus exists on PyPI, so this is the documented rule set, in the
order `checkGenericProperties` applies it (a custom kind has no type-specific rules):

1. metadata.deletionTimestamp set: Terminating;
2. status.observedGeneration present and not metadata.generation: InProgress
   (reason LatestGenerationNotObserved); absent: not checked;
3. a Reconciling condition True: InProgress; a Stalled condition True: Failed (the first
   of the two found in the list wins);
4. the `Ready` fallback of kstatus' README, for resources that have adopted neither standard
   condition: Ready True is Current, Ready False InProgress;
5. otherwise Current.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Result:
    status: str
    """InProgress, Failed, Current or Terminating."""
    message: str


def compute(obj: dict[str, Any]) -> Result:
    metadata = obj.get("metadata") or {}
    status = obj.get("status") or {}
    if metadata.get("deletionTimestamp"):
        return Result("Terminating", "Resource scheduled for deletion")
    generation = metadata.get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and observed is not None and observed != generation:
        kind = obj.get("kind", "")
        return Result(
            "InProgress",
            f"{kind} generation is {generation}, but latest observed generation is {observed}",
        )
    conditions = status.get("conditions") or []
    for condition in conditions:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Reconciling":
            return Result("InProgress", condition.get("message", ""))
        if condition.get("type") == "Stalled":
            return Result("Failed", condition.get("message", ""))
    types = {condition.get("type") for condition in conditions}
    if not types & {"Reconciling", "Stalled"}:
        ready = next((c for c in conditions if c.get("type") == "Ready"), None)
        if ready is not None and ready.get("status") == "False":
            return Result("InProgress", ready.get("message", ""))
    return Result("Current", "Resource is current")
