"""Which watch events on an InferenceDeployment ask for a pass: controller-runtime's
GenerationChanged, LabelChanged and AnnotationChanged predicates in one, plus the
object's first sight, its deletion and the start of its deletion.

The operator's own status writes come back as events too. They change none of these, so
they ask for nothing: the pass that wrote one has already scheduled what follows, and
the children's events ask for the rest.

Why not kopf's create, update and resume handlers, which select the same events by a
diff: kopf keeps the last handled spec as an annotation written on the object. That is
a write to every object a user applies (which a GitOps tool then sees as a change it did
not make), and at each spec change one more update of the custom resource, which the
API server validates whole, CEL rules included.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Key = tuple[str, str]
Seen = tuple[Any, ...]


class OwnerEvents:
    """What each object last looked like, as far as asking for a pass goes."""

    def __init__(self) -> None:
        self._seen: dict[Key, Seen] = {}

    def asks_for_pass(self, event_type: str | None, body: Mapping[str, Any]) -> bool:
        """True for the first event of an object (a listing's, or ADDED, or one made
        again under the same name), for a new generation, labels or annotations, for the
        start of its deletion and for its deletion (the pass then finds it gone and
        forgets it); False for the rest, status writes among them."""
        metadata = body.get("metadata") or {}
        key = (metadata.get("namespace") or "", metadata.get("name") or "")
        if event_type == "DELETED":
            self._seen.pop(key, None)
            return True
        seen = (
            metadata.get("uid"),  # deleted and made again under its name, DELETED missed
            metadata.get("generation"),
            sorted((metadata.get("labels") or {}).items()),
            sorted((metadata.get("annotations") or {}).items()),
            metadata.get("deletionTimestamp") is not None,
        )
        if self._seen.get(key) == seen:
            return False
        self._seen[key] = seen
        return True

    def __len__(self) -> int:
        return len(self._seen)
