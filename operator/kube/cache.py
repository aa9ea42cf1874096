"""The operator's children as its watches deliver them, by owner: what a reconcile pass
reads instead of listing each kind from the API server.

kopf already watches every child kind (filtered by the API server to the operator's
label); kopf indexes (`kopf.index`) keep each object there, keyed by (namespace, owner),
as client-go's informers do for controller-runtime. kopf runs no handler until every
index has its initial listing, so the first pass after a start or a failover sees every
child that exists, and never recreates (or rebuilds) one that was merely not yet listed.
Each object is kept without its `managedFields`, which no decision reads and which is
often the larger part of it.

The InferenceDeployments themselves have an index too (`CachedReader.owner`): a pass
reads its object there when the index is at least as new as what the operator itself
last read and wrote of it (the reconciler checks), from the API otherwise.

`CachedReader.list` answers the same calls as `KubeClient.list`: from an index where one
holds the kind and the selector names an owner, from the API otherwise (PodMonitors,
which kopf does not watch). What it returns may trail the API by the watch's delay: a
pass can see a child it just wrote without that write. Every write is a server-side
apply of a deterministic name, so acting again on the older view writes the same
object, and the watch event that follows triggers a pass that sees it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from kubeinfer.operator.kube.client import KubeClient, KubeObject, ResourceType
from kubeinfer.operator.state.names import LABEL_INSTANCE

INDEX_PREFIX = "kubeinfer_children_"
"""The kopf index of one child kind is `<prefix><plural>` (a handler's keyword argument)."""

IndexKey = tuple[str, str]
"""(namespace, owner): the owner is the child's `app.kubernetes.io/instance` label."""


class Lister(Protocol):
    """What a pass reads children with: `KubeClient` (the API) or `CachedReader`."""

    async def list(
        self, resource: ResourceType, namespace: str, label_selector: str
    ) -> list[KubeObject]: ...


OWNERS_INDEX = "kubeinfer_owners"
"""kopf's index of the InferenceDeployments themselves, by (namespace, name)."""


def index_name(resource: ResourceType) -> str:
    return INDEX_PREFIX + resource.plural


def without_managed_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in body["metadata"].items() if k != "managedFields"}
    return {**{k: v for k, v in body.items() if k != "metadata"}, "metadata": meta}


def index_entry(namespace: str, labels: Mapping[str, str], body: Mapping[str, Any]) -> dict:
    """What a child's index holds for it: {(namespace, owner): the object without its
    managedFields}."""
    return {(namespace, labels[LABEL_INSTANCE]): without_managed_fields(body)}


def parse_selector(selector: str) -> dict[str, str] | None:
    """`k=v,k=v` as a dict; None for anything else (set-based terms), which the cache
    leaves to the API."""
    terms: dict[str, str] = {}
    for term in filter(None, (part.strip() for part in selector.split(","))):
        key, sep, value = term.partition("=")
        if not sep or key.endswith("!") or value.startswith("="):
            return None
        terms[key] = value
    return terms


def matches(obj: KubeObject, selector: Mapping[str, str]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())


class CachedReader:
    """Lists children from kopf's indexes once `attach`ed to them, from the API before
    and for kinds without an index."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self._indices: dict[str, Mapping[IndexKey, Iterable[KubeObject]]] = {}
        self._owners: Mapping[IndexKey, Iterable[KubeObject]] | None = None

    def attach(self, indices: Mapping[str, Any]) -> None:
        """Takes kopf's indexes from a handler's keyword arguments (kopf fills them in
        place for as long as the operator runs)."""
        self._indices = {
            name.removeprefix(INDEX_PREFIX): index
            for name, index in indices.items()
            if name.startswith(INDEX_PREFIX)
        }
        self._owners = indices.get(OWNERS_INDEX)

    def owner(self, namespace: str, name: str) -> KubeObject | None:
        """The InferenceDeployment as the watch last delivered it; None when there is no
        index yet or it holds no such object (not seen yet, or deleted): the API knows."""
        if self._owners is None:
            return None
        return next(iter(self._owners.get((namespace, name), ())), None)

    def owners_listed(self) -> list[KubeObject] | None:
        """Every InferenceDeployment the watch holds; None before there is an index (kopf
        fills it with its initial listing before any handler runs, so from then on it
        holds every object the operator watches)."""
        if self._owners is None:
            return None
        return [body for bodies in self._owners.values() for body in bodies]

    def cached(self, resource: ResourceType) -> bool:
        return resource.plural in self._indices

    async def list(
        self, resource: ResourceType, namespace: str, label_selector: str
    ) -> list[KubeObject]:
        index = self._indices.get(resource.plural)
        selector = parse_selector(label_selector)
        if index is None or selector is None or LABEL_INSTANCE not in selector:
            return await self.client.list(resource, namespace, label_selector)
        found = index.get((namespace, selector[LABEL_INSTANCE]), ())
        return [obj for obj in found if matches(obj, selector)]
