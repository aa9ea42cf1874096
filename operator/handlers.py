"""kopf handlers: every trigger ends in the same level-triggered pass.

Any event on an InferenceDeployment that changed what a pass reads of it (its first
sight, a new generation, labels or annotations, its deletion: `kube.owner_events`), and
any event on a child that carries something a pass reads (the runtime Deployment,
ConfigMap, Service, cache claim; a build Job once it has finished and its pod once the
build has terminated, a runtime pod only when it fails, any of them when it goes; a
budget not for its status: `kube.child_events`), asks the reconciler for a pass
over the object (`Reconciler.trigger`) without waiting for it, so a burst of events
costs one pass; the reconciler schedules the periodic resync and the retries after a
failed pass itself (see its docstring for why not a kopf timer). Beyond selecting the
events, the handlers decide nothing. Each child kind also has a kopf index, which the
passes read instead of listing (`kube.cache`).

kopf writes nothing on the objects: with no create, update or resume handler it keeps no
last-handled spec and no progress in their annotations, so what a user (or a GitOps
tool) applied stays exactly as applied, metadata included.

Credentials: kopf's login handler here returns what `login` finds (default
`kopf.login_via_client`: the in-cluster service account, else KUBECONFIG), and kopf keeps
it in its credentials vault, which the operator's own API client shares (see
`kube.client`): a 401 on either side makes kopf log in again.

`register` adds the handlers to a registry instead of decorating at import time, so the
operator command and each test build their own registry, settings and credentials.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf
from kubeinfer.operator.api.v1alpha1.resource import GROUP, PLURAL, VERSION
from kubeinfer.operator.controller import Reconciler
from kubeinfer.operator.kube import kopf_json, kopf_toggles
from kubeinfer.operator.kube.cache import (
    OWNERS_INDEX,
    CachedReader,
    index_entry,
    index_name,
    without_managed_fields,
)
from kubeinfer.operator.kube.child_events import ChildEvents
from kubeinfer.operator.kube.client import (
    CONFIGMAP,
    DEPLOYMENT,
    ENDPOINT_SLICE,
    JOB,
    PDB,
    POD,
    PVC,
    SERVICE,
    KubeClient,
    ResourceType,
    Vault,
)
from kubeinfer.operator.kube.owner_events import OwnerEvents
from kubeinfer.operator.kube.resources import NODE
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state.gpu_nodes import GPU_PRODUCT_LABEL
from kubeinfer.operator.state.names import LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY
from kubeinfer.operator.telemetry.activity import Activity
from kubeinfer.operator.telemetry.exporter import StatusBoard

CHILD_RESOURCES = (JOB, POD, DEPLOYMENT, CONFIGMAP, SERVICE, PVC, PDB, ENDPOINT_SLICE)

Login = Callable[..., Awaitable[kopf.ConnectionInfo | None] | kopf.ConnectionInfo | None]


@dataclass
class OperatorContext:
    """What the handlers share: the settings, the API client over kopf's credentials
    vault, and the reconciler."""

    settings: OperatorSettings
    vault: Vault
    board: StatusBoard | None = None
    client: KubeClient = field(init=False)
    cache: CachedReader = field(init=False)
    reconciler: Reconciler = field(init=False)

    def __post_init__(self) -> None:
        if self.board is None:
            self.board = StatusBoard()
        self.client = KubeClient(
            self.vault,
            field_manager=self.settings.api.field_manager,
            timeout_seconds=self.settings.api.timeout_seconds,
            page_size=self.settings.api.page_size,
            activity=self.board.activity,
        )
        self.cache = CachedReader(self.client)
        self.reconciler = Reconciler(
            self.client, self.settings, board=self.board, reader=self.cache
        )
        self.board.wake = self.reconciler.wake

    async def close(self) -> None:
        """Stops the reconciler (its requeues included); the vault, which holds the
        sessions, is kopf's to close."""
        if self.board is not None:
            self.board.wake = None
        await self.reconciler.close()


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff base, kept nowhere. kopf builds one (a deep copy of the object's
    essence) on every event of every kind it watches, to detect what its create and
    update handlers are for; the operator has none of those (`kube.owner_events`
    selects the events that ask for a pass), and a pod's or a Job's essence, compared
    with nothing, was most of the operator's CPU with a thousand objects."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        raise AssertionError("kopf stores a diff base only for create and update handlers")


def configure_kopf(kopf_settings: kopf.OperatorSettings) -> kopf.OperatorSettings:
    """Applies the operator's choices to the settings given to `kopf.operator`: kopf's
    diff base built from nothing (`NoDiffBase`); no Events posted by kopf (the
    operator posts one per status transition); child watches filtered by the API server
    to the operator's objects; no scanning of CRDs and namespaces (the resources are
    known, the namespaces named), which keeps the RBAC rules to what reconciling needs;
    kopf's readiness toggles counted (`kopf_toggles`); and its watch streams parsed with
    orjson (`kopf_json`)."""
    kopf_toggles.install()  # kopf's start with thousands of objects, linear again
    kopf_json.install()  # kopf's watch events parsed with orjson
    kopf_settings.persistence.diffbase_storage = NoDiffBase()
    kopf_settings.posting.enabled = False
    for child in CHILD_RESOURCES:
        kopf_settings.watching.label_selectors[_is(child)] = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
    # Only the nodes GPU feature discovery labelled with their GPU product (`kube.nodes`).
    kopf_settings.watching.label_selectors[_is(NODE)] = GPU_PRODUCT_LABEL
    kopf_settings.scanning.disabled = True
    return kopf_settings


def _is(child: ResourceType) -> Callable[[kopf.Resource], bool]:
    return lambda resource: (resource.group, resource.plural) == (child.group, child.plural)


def register(
    registry: kopf.OperatorRegistry,
    settings: OperatorSettings,
    login: Login | None = None,
    vault: Vault | None = None,
    board: StatusBoard | None = None,
) -> OperatorContext:
    """Adds every handler to `registry`. `login` returns the API credentials (default:
    kubeconfig or the in-cluster service account, as kopf finds them); `vault` is the
    credentials vault given to `kopf.operator` (a new one by default); `board` receives
    each pass's status, for the operator's /metrics."""
    context = OperatorContext(settings, vault if vault is not None else Vault(), board)
    _register_login(registry, login)

    @kopf.on.cleanup(registry=registry)
    async def close(**_: Any) -> None:
        await context.close()

    @kopf.on.startup(registry=registry)
    async def attach_cache(**kwargs: Any) -> None:
        context.cache.attach(kwargs)  # kopf's indexes, by name, among the arguments

    activity = context.reconciler.board.activity
    _register_owner(registry, context.reconciler, activity)
    _register_children(registry, context.reconciler, activity)
    _register_gpu_nodes(registry, context.reconciler)
    return context


def _register_login(registry: kopf.OperatorRegistry, login: Login | None) -> None:
    """kopf's login handler: what `login` finds (default `kopf.login_via_client`); no
    credentials at all stop the operator with the reason."""

    @kopf.on.login(registry=registry)
    async def authenticate(**kwargs: Any) -> kopf.ConnectionInfo:
        try:
            result = (login or kopf.login_via_client)(**kwargs)
            connection = await result if isinstance(result, Awaitable) else result
        except kopf.LoginError as error:
            # No credentials at all will not appear by retrying: stop with the reason.
            raise kopf.PermanentError(f"No Kubernetes credentials: {error}") from None
        if connection is None:  # kopf.login_via_client without the `kubernetes` package
            raise kopf.PermanentError("No Kubernetes credentials: the login found none.")
        return connection


def _register_owner(
    registry: kopf.OperatorRegistry, reconciler: Reconciler, activity: Activity
) -> None:
    """The InferenceDeployments' watch: an event that changed what a pass reads of the
    object asks for one at once (`kube.owner_events`); the operator's own status writes,
    coming back, ask for nothing."""
    events = OwnerEvents()

    @kopf.index(GROUP, VERSION, PLURAL, registry=registry, id=OWNERS_INDEX)
    async def index_owner(
        namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> dict[Any, Any]:
        return {(namespace or "", name): without_managed_fields(body)}

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="reconcile")
    async def owner_changed(
        type: str | None, namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> None:
        assert namespace is not None  # InferenceDeployment is namespaced: kopf gives it one
        activity.watch_events[PLURAL] += 1
        if events.asks_for_pass(type, body):
            reconciler.trigger(namespace, name, 0.0)


def _register_children(
    registry: kopf.OperatorRegistry, reconciler: Reconciler, activity: Activity
) -> None:
    """Each child kind's kopf index (`kube.cache`: what passes read instead of listing),
    and its events: an event on one of the operator's children asks for a pass over its
    owner (the instance label names it), without waiting for it, unless it carries
    nothing a pass reads (`kube.child_events`)."""
    events = ChildEvents()
    for child in CHILD_RESOURCES:
        selected: dict[str, Any] = {
            LABEL_MANAGED_BY: MANAGED_BY,
            LABEL_INSTANCE: kopf.PRESENT,
        }

        @kopf.index(
            child.group, child.version, child.plural, registry=registry, labels=selected,
            id=index_name(child),
        )  # fmt: skip
        async def index_child(  # async: kopf runs a plain function in a thread
            namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
        ) -> dict[Any, Any]:
            return index_entry(namespace or "", labels, body)

        @kopf.on.event(
            child.group,
            child.version,
            child.plural,
            registry=registry,
            labels=selected,
            id=f"reconcile_owner_of_{child.plural}",
        )
        async def reconcile_owner(
            resource: kopf.Resource,
            type: str | None,
            namespace: str | None,
            labels: Mapping[str, str],
            body: kopf.Body,
            **_: Any,
        ) -> None:
            assert namespace is not None  # every child resource is namespaced
            activity.watch_events[resource.plural] += 1
            if events.asks_for_pass(resource.plural, type, labels, body):
                reconciler.trigger(namespace, labels[LABEL_INSTANCE])


def _register_gpu_nodes(registry: kopf.OperatorRegistry, reconciler: Reconciler) -> None:
    """The GPU nodes' watch: each event goes to the reconciler, which asks for a pass over
    the objects on a mixed GPU fleet when it changed what their decisions read."""

    @kopf.on.event(NODE.group, NODE.version, NODE.plural, registry=registry, id="gpu_nodes")
    async def gpu_node_changed(body: kopf.Body, type: str | None, **_: Any) -> None:
        reconciler.node_event(body, deleted=type == "DELETED")
