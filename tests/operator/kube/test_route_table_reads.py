"""The activator's route table reads nothing for an object without a route: an operator
whose objects never scale to zero needs no access to the activator's namespace (the
namespaced operator was refused that read on every pass of every object before)."""

from __future__ import annotations

from typing import Any

from kubeinfer.operator.kube.activator import RouteTable
from kubeinfer.operator.settings import Activator


class RefusingClient:
    """A client whose every call is refused, as the API server refuses a Role without it."""

    async def list(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the route table was read")

    async def apply(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the route table was written")


async def test_an_object_without_a_route_reads_and_writes_nothing() -> None:
    table = RouteTable(RefusingClient(), Activator(namespace="kubeinfer-system"))  # type: ignore[arg-type]
    await table.set(("ml", "resnet"), None)
