"""kopf handlers: every trigger calls the same level-triggered reconcile.

Create, update and resume call `Reconciler.reconcile` for the InferenceDeployment
concerned; any event on a child (a build Job, its pods, the runtime Deployment,
ConfigMap, Service, cache claim) asks the reconciler for a pass over its owner
(`Reconciler.trigger`) without waiting for it, so a burst of events costs one pass; the
reconciler schedules the periodic resync itself (see its docstring for why not a kopf
timer). The handlers never branch on what happened. Each child kind also has a kopf
index, which the passes read instead of listing (`kube.cache`).

Errors map to kopf's retry classes here and only here: a spec the
model refuses has been written into the status and is a `PermanentError` (kopf does not
retry it until the spec changes); anything else is a `TemporaryError`, retried after the
delay the API server asked for (`Retry-After`), else one that is short for conflicts,
throttling and unanswered requests and longer otherwise.

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
from kubeinfer.operator.activity import Activity
from kubeinfer.operator.api.v1alpha1.resource import GROUP, KIND, PLURAL, VERSION
from kubeinfer.operator.api.v1alpha1.validation import InvalidManifest
from kubeinfer.operator.exporter import StatusBoard
from kubeinfer.operator.kube import kopf_toggles
from kubeinfer.operator.kube.cache import (
    OWNERS_INDEX,
    CachedReader,
    index_entry,
    index_name,
    without_managed_fields,
)
from kubeinfer.operator.kube.client import (
    CONFIGMAP,
    DEPLOYMENT,
    JOB,
    PDB,
    POD,
    PVC,
    SERVICE,
    ApiError,
    KubeClient,
    ResourceType,
    Vault,
)
from kubeinfer.operator.kube.resources import NODE
from kubeinfer.operator.reconciler import Reconciler, ReconcilerClosed
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state.gpu_nodes import GPU_PRODUCT_LABEL
from kubeinfer.operator.state.names import LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY

ANNOTATION_PREFIX = "kubeinfer.io"
"""kopf keeps its progress and last-handled spec in annotations under this prefix, so
nothing but the operator's own fields ever appears in the status."""

RETRY_SOON_SECONDS = 2.0
RETRY_LATER_SECONDS = 30.0

CHILD_RESOURCES = (JOB, POD, DEPLOYMENT, CONFIGMAP, SERVICE, PVC, PDB)

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

    async def close(self) -> None:
        """Stops the reconciler (its requeues included); the vault, which holds the
        sessions, is kopf's to close."""
        await self.reconciler.close()


def retry_delay(error: ApiError) -> float:
    """How long kopf waits before retrying after `error`: what the server asked for
    (`Retry-After`), else soon for what passes by itself, else later."""
    if error.retry_after_seconds is not None:
        return error.retry_after_seconds
    return RETRY_SOON_SECONDS if error.retryable else RETRY_LATER_SECONDS


class OwnerEssenceStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's last-handled-configuration in annotations, whose essence (what an update is
    detected from) is built for InferenceDeployments only. kopf builds one, a deep copy
    of the whole object, on every event of every kind it watches; only the
    InferenceDeployment has update handlers, and a pod's or a Job's essence, compared
    with nothing, was most of the operator's CPU with a thousand objects."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        if body.get("kind") != KIND:
            return cast(kopf.BodyEssence, {})
        if extra_fields:  # no handler of ours asks for any: kopf's own way, then
            return super().build(body=body, extra_fields=extra_fields)
        # kopf deep-copies what it is given, then drops the status and the metadata but
        # labels and annotations: given only what it keeps, it copies that alone (a
        # status patch is an event too, and managedFields are often the larger part).
        metadata = body.get("metadata") or {}
        keys = ("name", "namespace", "labels", "annotations")
        kept = {k: metadata[k] for k in keys if k in metadata}
        essential = {k: v for k, v in body.items() if k not in ("metadata", "status")}
        return super().build(body=kopf.Body(cast(kopf.RawBody, {**essential, "metadata": kept})))


def configure_kopf(kopf_settings: kopf.OperatorSettings) -> kopf.OperatorSettings:
    """Applies the operator's choices to the settings given to `kopf.operator`: kopf's
    own bookkeeping in `kubeinfer.io/` annotations; no Events posted by kopf (the
    operator posts one per status transition); child watches filtered by the API server
    to the operator's objects; no scanning of CRDs and namespaces (the resources are
    known, the namespaces named), which keeps the RBAC rules to what reconciling needs;
    and kopf's readiness toggles counted (`kopf_toggles`)."""
    kopf_toggles.install()  # kopf's start with thousands of objects, linear again
    kopf_settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    kopf_settings.persistence.diffbase_storage = OwnerEssenceStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
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

    reconcile = _reconcile_of(context)
    activity = context.reconciler.board.activity
    _register_owner(registry, reconcile, activity)
    _register_children(registry, context.reconciler, activity)
    _register_gpu_nodes(registry, context.reconciler)
    return context


Reconcile = Callable[[str, str], Awaitable[None]]
"""(namespace, name) -> one pass over that InferenceDeployment, its errors as kopf's."""


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


def _reconcile_of(context: OperatorContext) -> Reconcile:
    """The reconciler's pass with its errors mapped to kopf's retry classes (here only)."""

    async def reconcile(namespace: str, name: str) -> None:
        try:
            await context.reconciler.reconcile(namespace, name)
        except InvalidManifest as invalid:
            raise kopf.PermanentError(f"Invalid spec: {invalid}") from None
        except ApiError as error:
            message = f"API request failed: {error}"
            raise kopf.TemporaryError(message, delay=retry_delay(error)) from None
        except ReconcilerClosed as closed:
            message = f"Operator stopping: {closed}"
            raise kopf.TemporaryError(message, delay=RETRY_LATER_SECONDS) from None

    return reconcile


def _register_owner(
    registry: kopf.OperatorRegistry, reconcile: Reconcile, activity: Activity
) -> None:
    """Create, update and resume of an InferenceDeployment: one handler, one id, so
    kopf's progress annotation reads kubeinfer.io/reconcile for all three causes."""

    @kopf.index(GROUP, VERSION, PLURAL, registry=registry, id=OWNERS_INDEX)
    async def index_owner(
        namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> dict[Any, Any]:
        return {(namespace or "", name): without_managed_fields(body)}

    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry, id="reconcile")
    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry, id="reconcile")
    @kopf.on.update(GROUP, VERSION, PLURAL, registry=registry, id="reconcile")
    async def reconcile_on_change(namespace: str | None, name: str, **_: Any) -> None:
        assert namespace is not None  # InferenceDeployment is namespaced: kopf gives it one
        activity.watch_events[PLURAL] += 1
        await reconcile(namespace, name)


def _register_children(
    registry: kopf.OperatorRegistry, reconciler: Reconciler, activity: Activity
) -> None:
    """Each child kind's kopf index (`kube.cache`: what passes read instead of listing),
    and its events: any event on one of the operator's children asks for a pass over its
    owner (the instance label names it), without waiting for it."""
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
            resource: kopf.Resource, namespace: str | None, labels: Mapping[str, str], **_: Any
        ) -> None:
            assert namespace is not None  # every child resource is namespaced
            activity.watch_events[resource.plural] += 1
            reconciler.trigger(namespace, labels[LABEL_INSTANCE])


def _register_gpu_nodes(registry: kopf.OperatorRegistry, reconciler: Reconciler) -> None:
    """The GPU nodes' watch: each event goes to the reconciler, which asks for a pass over
    the objects on a mixed GPU fleet when it changed what their decisions read."""

    @kopf.on.event(NODE.group, NODE.version, NODE.plural, registry=registry, id="gpu_nodes")
    async def gpu_node_changed(body: kopf.Body, type: str | None, **_: Any) -> None:
        reconciler.node_event(body, deleted=type == "DELETED")
