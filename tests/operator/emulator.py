"""KMock's KubernetesEmulator, extended with the API-server semantics the operator relies on.

KMock's emulator stores objects as plain dicts and merges every write into them: a PATCH
of a missing object fails (so a server-side apply cannot create), and it keeps no uid,
resourceVersion or generation and ignores label selectors. `ApiServerEmulator` keeps
KMock's HTTP surface, discovery (`load_bundled()`) and request log, and replaces the
write path and the reads with what a kube-apiserver does, in the small:

- POST creates (409 if present; `generateName`), assigning uid, resourceVersion (one
  counter for the whole server), generation 1 and creationTimestamp;
- PATCH understands server-side apply (creates a missing object; requires
  `fieldManager`; a manager's fields it no longer applies are removed; lists are atomic,
  a simplification), merge patch (RFC 7386; strategic merge is treated the same) and
  JSON patch (RFC 6902, a failed `test` is 422);
- a write that changes nothing bumps nothing and emits no watch event; generation grows
  only when something outside metadata and status changes;
- with a `status` subresource, writes to the object keep the stored status and writes to
  `/status` change only the status;
- immutable fields: a Job's `spec.template` and `spec.selector`, a Deployment's
  `spec.selector` (422, as the real validation does);
- DELETE removes the object (or marks it while finalizers remain) and garbage-collects
  its dependents by ownerReference uid (background propagation); an object created with
  owners that no longer exist (a write that raced the owner's deletion) is collected too;
- LIST items of built-in kinds carry no `kind`/`apiVersion` (typed lists);
- LIST and WATCH honour `labelSelector` (=, ==, !=, in, notin, exists, !exists) and WATCH
  honours `resourceVersion` (replays later events only);
- every object written is validated, built-in kinds with `kubernetes-validate` (strict,
  Kubernetes 1.33), InferenceDeployments (status included) against the CRD's own
  openAPIV3Schema, and refused with 422 when invalid (`rejections` lists them).

- LIST honours `limit` and `continue` (pages in name order; `list_pages` records the
  size of every page served);
- a token in `revoked` is refused with 401 on every request, and `interceptors` may answer
  a request instead of the server (a 429 with Retry-After, a request that hangs).

Not modelled: defaulting, admission (CEL included: so a spec the model refuses reaches
the operator, as on a cluster without CEL), managedFields, strategic merge by list keys,
bookmarks, watch expiry (410), rate limits and authorization.

Every request is logged as an `ApiCall` (RBAC verb, group, resource[/subresource], and
the bearer token that made it, which tells two operator processes apart). The
tests change the world (a Job succeeding, a Deployment becoming ready) through the
`create` / `patch` / `delete` helpers, which go through the same code without HTTP, so
the log holds the operator's requests only.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonschema
import kmock
import yaml
from api_semantics import (
    ApiRejection,
    deep_merge,
    json_patch,
    matches_selector,
    merge_patch,
    prune,
)
from builtin_schemas import builtin_validator
from kmock._internal import apps, rendering

Key = tuple[tuple[str, str, str], str | None, str]
"""((group, version, plural), namespace, name)"""

CRD_PATH = Path(__file__).parents[2] / "crds" / "inferencedeployments.kubeinfer.io.yaml"
PREWARMED = (
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "Pod"),
    ("v1", "Event"),
    ("apps/v1", "Deployment"),
    ("batch/v1", "Job"),
)
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
IMMUTABLE = {
    ("batch", "jobs"): (("spec", "template"), ("spec", "selector")),
    ("apps", "deployments"): (("spec", "selector"),),
}


@dataclass(frozen=True)
class ApiCall:
    """One request as RBAC sees it."""

    verb: str
    group: str
    resource: str
    """The plural, with `/subresource` when there is one."""
    user: str = ""
    """The bearer token the request carried."""
    at: float = 0.0
    """When it arrived (time.monotonic())."""
    name: str = ""
    """The object's name, for requests about one object."""


Interceptor = Callable[
    [rendering.Request, ApiCall], Awaitable[aiohttp.web.StreamResponse | None]
]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesEmulator):
    calls: list[ApiCall] = attrs.field(factory=list, init=False)
    spec_writes: list[str] = attrs.field(factory=list, init=False)
    """Requests over HTTP that changed an InferenceDeployment's spec (the operator never
    should; the tests change specs without HTTP)."""
    rejections: list[str] = attrs.field(factory=list, init=False)
    store: dict[Key, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _applied: dict[tuple[Key, str, str], dict[str, Any]] = attrs.field(factory=dict, init=False)
    _log: list[tuple[int, tuple[str, str, str], dict[str, Any]]] = attrs.field(
        factory=list, init=False
    )
    _watchers: defaultdict[tuple[str, str, str], set[asyncio.Queue[dict[str, Any]]]] = attrs.field(
        factory=lambda: defaultdict(set), init=False
    )
    _counter: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    _crd_schema: dict[str, Any] = attrs.field(factory=dict, init=False)
    list_pages: list[int] = attrs.field(factory=list, init=False)
    """The number of items in each LIST response served, in order."""
    revoked: set[str] = attrs.field(factory=set, init=False)
    """Bearer tokens refused with 401 Unauthorized."""
    interceptors: list[Interceptor] = attrs.field(factory=list, init=False)
    """Called with each API request and its logged call; the first to return a response
    answers it (the request is still logged)."""
    validate_extra: dict[str, Callable[[dict[str, Any]], None]] = attrs.field(factory=dict)
    """Extra API groups this cluster serves, each with the validator of its objects (which
    raises AssertionError with the problems): e.g. the prometheus-operator's
    monitoring.coreos.com/v1 PodMonitors, validated against that project's schema."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for api_version, kind in PREWARMED:  # compiled once per process, outside timings
            builtin_validator(api_version, kind)
        self.resources.load_bundled()
        crd = yaml.safe_load(CRD_PATH.read_text())
        version = crd["spec"]["versions"][0]
        self._crd_schema = version["schema"]["openAPIV3Schema"]
        self.resources[
            f"{crd['spec']['group']}/{version['name']}/{crd['spec']['names']['plural']}"
        ] = kmock.ResourceInfo(
            kind=crd["spec"]["names"]["kind"],
            singular=crd["spec"]["names"]["singular"],
            namespaced=True,
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            shortnames=set(crd["spec"]["names"].get("shortNames", [])),
            subresources=set(version.get("subresources", {})),
        )
        for resource in self.validate_extra:  # "group/version/plural:Kind"
            path, kind = resource.split(":")
            self.resources[path] = kmock.ResourceInfo(
                kind=kind,
                singular=kind.lower(),
                namespaced=True,
                verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
            )

    # -- bookkeeping -----------------------------------------------------------------------

    def writes(self) -> list[ApiCall]:
        return [call for call in self.calls if call.verb in WRITE_VERBS]

    def _info(self, gvp: tuple[str, str, str]) -> kmock.ResourceInfo:
        return self.resources[f"{gvp[0]}/{gvp[1]}/{gvp[2]}" if gvp[0] else f"{gvp[1]}/{gvp[2]}"]

    def _emit(self, gvp: tuple[str, str, str], kind: str, obj: dict[str, Any]) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        event = {"type": kind, "object": copy.deepcopy(obj)}
        self._log.append((rv, gvp, event))
        for queue in self._watchers[gvp]:
            queue.put_nowait(event)

    def _validate(self, gvp: tuple[str, str, str], obj: dict[str, Any]) -> None:
        extra = next(
            (check for key, check in self.validate_extra.items()
             if key.startswith(f"{gvp[0]}/{gvp[1]}/{gvp[2]}:")),
            None,
        )  # fmt: skip
        if gvp[0] == "kubeinfer.io":
            errors = jsonschema.Draft7Validator(self._crd_schema).iter_errors(obj)
            problems = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors]
        elif extra is not None:
            try:
                extra(obj)
                problems = []
            except AssertionError as invalid:
                problems = [str(invalid)]
        else:
            errors = builtin_validator(obj["apiVersion"], obj["kind"]).iter_errors(obj)
            problems = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors]
        if problems:
            message = f"{obj.get('kind')} {obj['metadata'].get('name')}: {'; '.join(problems)}"
            self.rejections.append(message)
            raise ApiRejection(422, "Invalid", message)

    # -- the write path --------------------------------------------------------------------

    def _commit(
        self, key: Key, old: dict[str, Any] | None, new: dict[str, Any], subresource: str | None
    ) -> dict[str, Any]:
        gvp = key[0]
        if old is not None:
            if "status" in self._info(gvp).subresources:
                if subresource == "status":
                    new = {**old, "status": new.get("status")}
                    if new["status"] is None:
                        del new["status"]
                else:
                    new = {k: v for k, v in new.items() if k != "status"}
                    if "status" in old:
                        new["status"] = old["status"]
            for path in IMMUTABLE.get((gvp[0], gvp[2]), ()):
                before, after = old, new
                for part in path:
                    before, after = (before or {}).get(part), (after or {}).get(part)
                if before != after:
                    raise ApiRejection(422, "Invalid", f"{'.'.join(path)}: field is immutable")
            new["metadata"] = {**new.get("metadata", {})}
            for field in ("uid", "creationTimestamp", "generation", "resourceVersion"):
                if field in old["metadata"]:
                    new["metadata"][field] = old["metadata"][field]
            if new == old:
                return old  # a no-op write: nothing bumps, nobody is told
            spec_of = lambda o: {k: v for k, v in o.items() if k not in ("metadata", "status")}  # noqa: E731
            if spec_of(new) != spec_of(old):
                new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        else:
            new = copy.deepcopy(new)
            if "status" in self._info(gvp).subresources:
                new.pop("status", None)
            meta = new.setdefault("metadata", {})
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        self._validate(gvp, new)
        new["metadata"]["resourceVersion"] = str(next(self._counter))
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self.store.pop(key, None)
            self._emit(gvp, "DELETED", new)
            self._collect_garbage(new["metadata"]["uid"])
        else:
            self.store[key] = new
            self._emit(gvp, "ADDED" if old is None else "MODIFIED", new)
            if old is None and self._dangling(new):
                self._remove(key)  # what the garbage collector does a moment later
        return new

    def _dangling(self, obj: dict[str, Any]) -> bool:
        """Created with ownerReferences of which none exists any more (the owner was deleted
        while a write was in flight): the real garbage collector deletes such objects."""
        refs = obj["metadata"].get("ownerReferences") or []
        live = {o["metadata"].get("uid") for o in self.store.values()}
        return bool(refs) and not any(ref.get("uid") in live for ref in refs)

    def _collect_garbage(self, uid: str) -> None:
        for key, obj in list(self.store.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in refs):
                self._remove(key)

    def _remove(self, key: Key) -> dict[str, Any]:
        obj = self.store.get(key)
        if obj is None:
            raise ApiRejection(404, "NotFound", f"{key[0][2]} {key[2]} not found")
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                marked = copy.deepcopy(obj)
                marked["metadata"]["deletionTimestamp"] = _now()
                return self._commit(key, obj, marked, None)
            return obj
        del self.store[key]
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = str(next(self._counter))
        self._emit(key[0], "DELETED", gone)
        self._collect_garbage(obj["metadata"]["uid"])
        return gone

    def write(
        self,
        method: str,
        key: Key,
        body: Any,
        params: dict[str, str],
        content_type: str,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        gvp, namespace, name = key
        old = self.store.get(key)
        if method == "POST":
            meta = body.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            if namespace is not None:
                meta["namespace"] = namespace
            key = (gvp, namespace, meta["name"])
            if key in self.store:
                raise ApiRejection(409, "AlreadyExists", f"{gvp[2]} {meta['name']} exists")
            return self._commit(key, None, body, None)
        if method == "DELETE":
            return self._remove(key)
        if method == "PUT":
            if old is None:
                raise ApiRejection(404, "NotFound", f"{gvp[2]} {name} not found")
            expected = (body.get("metadata") or {}).get("resourceVersion")
            if expected and expected != old["metadata"]["resourceVersion"]:
                raise ApiRejection(409, "Conflict", "the object has been modified")
            return self._commit(key, old, body, subresource)
        if content_type.startswith("application/apply-patch"):
            manager = params.get("fieldManager")
            if not manager:
                raise ApiRejection(400, "BadRequest", "fieldManager: Required value")
            meta = body.get("metadata") or {}
            if meta.get("name") != name or body.get("kind") is None or "apiVersion" not in body:
                raise ApiRejection(400, "BadRequest", "apply needs apiVersion, kind and name")
            previous = self._applied.get((key, manager, subresource or ""), {})
            base = prune(copy.deepcopy(old or {}), previous, body)
            new = deep_merge(base, body)
            new.setdefault("metadata", {})["namespace"] = namespace
            result = self._commit(key, old, new, subresource)
            self._applied[(key, manager, subresource or "")] = copy.deepcopy(body)
            return result
        if old is None:
            raise ApiRejection(404, "NotFound", f"{gvp[2]} {name} not found")
        if content_type.startswith("application/json-patch"):
            return self._commit(key, old, json_patch(old, body), subresource)
        return self._commit(key, old, merge_patch(old, body), subresource)

    # -- HTTP ------------------------------------------------------------------------------

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        authorization = request.headers.get("Authorization") or ""
        token = authorization.removeprefix("Bearer ")
        unauthorized = self._status_response(401, "Unauthorized", "Unauthorized")
        if request.resource is None or request.resource.plural is None:
            if token and token in self.revoked:
                return unauthorized
            return await apps.RawHandler._handle(self, request)
        res = request.resource
        gvp = (res.group or "", res.version or "", res.plural)
        method = str(request.method.value).upper()
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
            method,
            "watch"
            if request.params.get("watch") in ("true", "1")
            else ("get" if request.name else "list"),
        )
        if verb == "delete" and not request.name:
            verb = "deletecollection"
        plural = f"{res.plural}/{request.subresource}" if request.subresource else res.plural
        call = ApiCall(verb, gvp[0], plural, token, time.monotonic(), request.name or "")
        self.calls.append(call)
        if token and token in self.revoked:
            return unauthorized
        for intercept in self.interceptors:
            if (answer := await intercept(request, call)) is not None:
                return answer
        if verb in ("get", "list", "watch"):
            return await apps.RawHandler._handle(self, request)
        try:
            content_type = request.headers.get("Content-Type", "application/json")
            body = json.loads(request.text) if request.text else {}
            key = (gvp, request.namespace, request.name or "")
            before = copy.deepcopy(self.store.get(key, {}).get("spec"))
            result = self.write(
                method, key, body, dict(request.params), content_type, request.subresource
            )
            if gvp[0] == "kubeinfer.io" and key in self.store and result.get("spec") != before:
                self.spec_writes.append(f"{method} {request.url.path}")
        except ApiRejection as rejection:
            return self._status_response(rejection.status, rejection.reason, rejection.message)
        return aiohttp.web.json_response(result, status=201 if method == "POST" else 200)

    @staticmethod
    def _status_response(code: int, reason: str, message: str) -> aiohttp.web.Response:
        status = {
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": message,
            "metadata": {},
        }
        return aiohttp.web.json_response(status, status=code)

    def _select(self, request: rendering.Request) -> list[dict[str, Any]]:
        res = request.resource
        assert res is not None
        gvp = (res.group or "", res.version or "", res.plural or "")
        selector = request.params.get("labelSelector")
        return [
            obj
            for (g, ns, name), obj in sorted(self.store.items(), key=lambda i: i[0][2])
            if g == gvp
            and (request.namespace is None or ns == request.namespace)
            and (request.name is None or name == request.name)
            and matches_selector(obj, selector)
        ]

    async def _serve_fetch(self, request: rendering.Request) -> rendering.Payload:
        found = self._select(request)
        if not found:
            raise kmock.KubernetesObjectNotFoundError()
        return found[0]

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        rv = self._log[-1][0] if self._log else 0
        items = self._select(request)
        res = request.resource
        if res is not None and res.group != "kubeinfer.io":
            # Built-in kinds are listed as typed lists, whose items carry no kind.
            items = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items]
        metadata: dict[str, Any] = {"resourceVersion": str(rv)}
        after = request.params.get("continue")
        if after:  # the token is the last name served (opaque to clients)
            items = [o for o in items if o["metadata"]["name"] > after]
        limit = request.params.get("limit")
        if limit and limit.isdigit() and 0 < int(limit) < len(items):
            items = items[: int(limit)]
            metadata["continue"] = items[-1]["metadata"]["name"]
        self.list_pages.append(len(items))
        return {"kind": "List", "apiVersion": "v1", "metadata": metadata, "items": items}

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""
        res = request.resource
        assert res is not None
        gvp = (res.group or "", res.version or "", res.plural or "")
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        since = request.params.get("resourceVersion")
        if since and since.isdigit():
            backlog = [e for rv, g, e in self._log if g == gvp and rv > int(since)]
        else:
            backlog = [{"type": "ADDED", "object": obj} for obj in self._select(request)]
        self._watchers[gvp].add(queue)
        selector = request.params.get("labelSelector")
        try:
            for event in backlog:
                queue.put_nowait(event)
            while True:
                event = await queue.get()
                obj = event["object"]
                if request.namespace not in (None, obj["metadata"].get("namespace")):
                    continue
                if matches_selector(obj, selector):
                    yield event
        finally:
            self._watchers[gvp].discard(queue)

    # -- what the tests use to change the world (no HTTP, not logged) ------------------------

    @staticmethod
    def key_of(api_version: str, plural: str, namespace: str, name: str) -> Key:
        group, _, version = api_version.rpartition("/")
        return ((group, version, plural), namespace, name)

    def get(
        self, api_version: str, plural: str, namespace: str, name: str
    ) -> dict[str, Any] | None:
        return copy.deepcopy(self.store.get(self.key_of(api_version, plural, namespace, name)))

    def list(self, api_version: str, plural: str, namespace: str) -> list[dict[str, Any]]:
        group, _, version = api_version.rpartition("/")
        return [
            copy.deepcopy(o)
            for (g, ns, _), o in sorted(self.store.items(), key=lambda i: i[0][2])
            if g == (group, version, plural) and ns == namespace
        ]

    def create(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        key = self.key_of(obj["apiVersion"], plural, obj["metadata"]["namespace"], "")
        return self.write("POST", key, copy.deepcopy(obj), {}, "application/json")

    def patch(
        self,
        api_version: str,
        plural: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        key = self.key_of(api_version, plural, namespace, name)
        return self.write("PATCH", key, patch, {}, "application/merge-patch+json", subresource)

    def delete(self, api_version: str, plural: str, namespace: str, name: str) -> None:
        self.write("DELETE", self.key_of(api_version, plural, namespace, name), {}, {}, "")
