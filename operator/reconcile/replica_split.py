"""How a mixed GPU fleet's runtime pods are split across its GPU products. Pure.

The total (runtime.replicas, or the autoscaler's count) goes to the products whose engine
serves, in proportion to their weights (`runtime.gpuFleet.replicaSplit`: the GPUs of each
product's usable nodes, or the spec's percentages), rounded by the largest remainder
method, so the shares always add up to the total. A product still building its first
engine gets nothing until it can serve: its share goes to the others meanwhile.

When the shares change (a product's engine arrives, its nodes come or go), a product
whose share shrinks keeps the pods it has until the products that grow have theirs
ready: the serving capacity never drops below the total while pods move between
products (as a Deployment's maxUnavailable 0 keeps it during a roll).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from kubeinfer.operator.api.v1alpha1.gpu_fleet import GpuFleetSpec, ReplicaSplit
from kubeinfer.operator.state.gpu_nodes import ProductCapacity


def largest_remainder(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """`total` split in proportion to `weights` (every key gets a share, 0 for a weight of
    0): each its whole part, then one more to the largest remainders, ties to the first
    name. Without a positive weight, the keys share equally."""
    if not weights:
        return {}
    positive = {key: weight for key, weight in weights.items() if weight > 0}
    if not positive:
        positive = dict.fromkeys(weights, 1.0)
    whole = sum(positive.values())
    exact = {key: total * weight / whole for key, weight in positive.items()}
    shares = {key: math.floor(value) for key, value in exact.items()}
    left = total - sum(shares.values())
    for key in sorted(positive, key=lambda k: (shares[k] - exact[k], k))[:left]:
        shares[key] += 1
    return {key: shares.get(key, 0) for key in weights}


def product_weights(
    fleet: GpuFleetSpec | None, capacities: Iterable[ProductCapacity], serving: Iterable[str]
) -> dict[str, float]:
    """The weight of each product in `serving` (those whose engine serves): its
    replicaWeightPercent with replicaSplit Weights, else its usable GPUs."""
    wanted = set(serving)
    if fleet is not None and fleet.replica_split == ReplicaSplit.WEIGHTS:
        percent = {p.name: float(p.replica_weight_percent or 0) for p in fleet.products}
        return {product: percent.get(product, 0.0) for product in sorted(wanted)}
    gpus = {c.product: float(c.gpus) for c in capacities}
    return {product: gpus.get(product, 0.0) for product in sorted(wanted)}


def hold_while_moving(
    shares: Mapping[str, int], current: Mapping[str, tuple[int, int]]
) -> dict[str, int]:
    """`shares`, but a product whose share is below what its Deployment asks now keeps up
    to that many while other products lack ready pods. `current` maps a product to
    (replicas its Deployment asks, its ready pods); products without one are absent."""
    shortfall = sum(
        max(0, share - current.get(product, (0, 0))[1]) for product, share in shares.items()
    )
    result = dict(shares)
    for product in sorted(shares):
        asked = current.get(product, (0, 0))[0]
        keep = min(max(0, asked - shares[product]), shortfall)
        result[product] += keep
        shortfall -= keep
    return result
