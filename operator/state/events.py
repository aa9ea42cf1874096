"""A Kubernetes Event the operator emits: a plain frozen value (its own module, so every
state value that carries one can import it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to emit on the InferenceDeployment."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str
