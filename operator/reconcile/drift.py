"""Whether an observed child still carries everything the operator owns on it. Pure.

The operator applies each child with server-side apply, so it owns exactly the fields of
the desired object. Comparing only the input-hash annotation missed a hand edit (`kubectl
edit` of an image, a selector, a ConfigMap's data): the hash stays, so nothing was ever
re-applied. Comparing whole objects would write on every pass instead, since the stored
object holds more than was applied: fields the API server defaults (a container's
terminationMessagePath, a Service's clusterIP), other managers' labels and annotations,
status. So the comparison is the one controller-runtime's `equality.Semantic.
DeepDerivative` makes: every field of the desired object must be in the observed one
with the same value, where

- a list matches a list of the same length whose elements match in order (the API
  server keeps the order of containers, ports, volumes...);
- an empty list or mapping, `false`, `0` or `""` matches an absent field (Go's
  `omitempty` drops them when the object is stored);
- a resource quantity (under `requests`/`limits`) matches any spelling of its value
  (`1000m` is stored as `1`, `1024Mi` as `1Gi`).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

QUANTITY_PARENTS = frozenset({"requests", "limits"})
_QUANTITY = re.compile(r"([+-]?[0-9]*\.?[0-9]+)([eE][+-]?[0-9]+|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_SUFFIX = {
    "m": Decimal("0.001"), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9, "T": Decimal(10) ** 12, "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18, "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}  # fmt: skip


def quantity_value(text: str) -> Decimal | None:
    """A Kubernetes quantity's value (`500m` -> 0.5, `1Gi` -> 1073741824), None if `text`
    is not one."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        return None
    number, suffix = match.groups()
    try:
        value = Decimal(number)
        if suffix and suffix[0] in "eE":
            return value * Decimal(10) ** int(suffix[1:])
        return value * _SUFFIX[suffix] if suffix else value
    except (InvalidOperation, ValueError):
        return None


def _absent_equivalent(desired: Any) -> bool:
    """Would the API server store `desired` as no field at all (Go's omitempty)?"""
    if desired is None or desired is False:
        return True
    if isinstance(desired, bool):
        return False
    if isinstance(desired, int | float):
        return desired == 0
    return isinstance(desired, str | list | dict) and not desired


def carries(observed: Any, desired: Any, quantities: bool = False) -> bool:
    """Does `observed` hold every field of `desired` with the same value (see above)?
    `quantities`: the values are resource quantities (a `requests`/`limits` mapping's)."""
    if isinstance(desired, dict):
        if not isinstance(observed, dict):
            return False
        return all(
            carries(observed[key], value, quantities or key in QUANTITY_PARENTS)
            if key in observed
            else _absent_equivalent(value)
            for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(observed, list)
            and len(observed) == len(desired)
            and all(carries(o, d) for o, d in zip(observed, desired, strict=True))
        )
    if isinstance(desired, bool) or isinstance(observed, bool):
        return type(desired) is type(observed) and desired == observed
    if desired == observed:
        return True
    if quantities and isinstance(desired, str) and isinstance(observed, str):
        wanted = quantity_value(desired)
        return wanted is not None and wanted == quantity_value(observed)
    return False
