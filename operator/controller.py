"""The controller: the I/O shell around the pure core (`reconcile/`). It runs each
reconcile pass, gather (I/O) → decide (pure) → apply (I/O) → status, if changed, and
schedules the next.

This is the only module that joins the pure core with the API (and with the metrics
source: a running shadow's aggregates and an autoscaled object's load are read in the
gather step, so the verdict and the recommendation stay pure functions of what was read).
It also keeps what must outlive a pass: the autoscaler's history per object, and whether
the cluster serves PodMonitors. Every trigger (an event on the object or on a child, the
periodic resync, a retry) ends in
`Reconciler.reconcile(namespace, name)`, which reads the InferenceDeployment afresh: from
the watch's index when that is at least as new as what the operator last read and wrote
of it, from the API otherwise (`_read`), so a pass never acts on a copy older than one a
pass acted on, nor on one that lacks the operator's own last status write. Passes over
one object are serialised by a lock: two triggers arriving together cannot both create a
child. Passes over all objects share `api.max_concurrent_passes` slots, so a thousand
objects created at once queue in the operator, not in the API server.

The periodic resync is scheduled here, after each pass: sooner when the decision asks
for it (a running build is polled, a failed one retried after its backoff), else after
`resync_interval_seconds`. A kopf timer would do the same, but kopf puts a finalizer on
every object with a timer, which blocks `kubectl delete` whenever the operator is down;
children need no finalizer, since their ownerReferences let the garbage collector
remove them. A pass that failed is tried again after the delay its error asks for
(`ApiError.retry_delay_seconds`: the server's `Retry-After`, else soon for conflicts,
throttling and unanswered requests, later for refusals); one that found the spec invalid
waits for a new spec. On a restart, the watch's first listing asks for a pass over every
object, which starts the cycle again. Since these
requeues are the reconciler's own, kopf cannot pause them: the reconciler lives only as
long as the kopf run it serves, and `close()` (called when that run ends, and when a
leader loses its lease) cancels them and refuses further passes.

What is kept per object (its lock, its pending requeue, the autoscaler's history) is
dropped once a pass finds the object gone, so the maps do not grow with every object
ever seen.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec, InferenceDeploymentStatus
from kubeinfer.operator.api.v1alpha1.validation import InvalidManifest, parse_spec
from kubeinfer.operator.kube import apply
from kubeinfer.operator.kube.activator import ActivatorReader, RouteTable
from kubeinfer.operator.kube.cache import CachedReader, Lister
from kubeinfer.operator.kube.client import INFERENCE_DEPLOYMENT, POD_MONITOR, ApiError, KubeClient
from kubeinfer.operator.kube.cost_reads import CostInputs, PricedNodes
from kubeinfer.operator.kube.gather import gather, pods_lister
from kubeinfer.operator.kube.known_answers import apply_answers, gather_answers
from kubeinfer.operator.kube.node_taints import SuspectNodeTaints
from kubeinfer.operator.kube.nodes import GpuNodes
from kubeinfer.operator.metrics_sources.factory import MetricsSources
from kubeinfer.operator.reconcile.decide import decide, decide_forbidden, decide_invalid
from kubeinfer.operator.reconcile.node_taints import suspects
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state.cost_readings import CostHistory
from kubeinfer.operator.state.decision import Decision
from kubeinfer.operator.state.known_answers import AnswerMemory, AnswerReadings
from kubeinfer.operator.state.observed import (
    ObservedState,
    OwnerRef,
    owner_ref_from_body,
    stored_status,
)
from kubeinfer.operator.state.quality_readings import QualityHistory
from kubeinfer.operator.state.scaling_inputs import ScalingHistory
from kubeinfer.operator.telemetry.exporter import Report, StatusBoard, metrics_readers, pod_prices

logger = logging.getLogger(__name__)

DISCOVERY_SECONDS = 300
"""How long a discovery of the PodMonitor API is trusted."""
CLOSE_GRACE_SECONDS = 1.0
"""How long `close` lets the passes in flight end: kopf gives its own handlers as long
(its exit timeout) and a leader that lost its Lease must stop well before another takes
over (its renew deadline falls short of the Lease's duration by a few seconds)."""
TRIGGER_DELAY_SECONDS = 0.2
"""How long a pass asked for by a watch event waits for the events after it: a child's
change comes in bursts (a pod scheduled, started, ready; its ReplicaSet, its Deployment),
and one pass after the burst sees all of it."""


class ReconcilerClosed(Exception):
    """A pass was asked of a reconciler whose kopf run has ended (or whose leader lost
    its lease): nothing is read or written."""


def utc_now() -> datetime:
    """Now, to the second: Kubernetes timestamps carry no fraction."""
    return datetime.now(UTC).replace(microsecond=0)


@dataclass(frozen=True)
class Outcome:
    """What one pass did; `decision` is None when the object no longer exists."""

    decision: Decision | None
    writes: int = 0


class Reconciler:
    """Reconciles InferenceDeployments through one client; schedules requeues itself."""

    def __init__(
        self,
        client: KubeClient,
        settings: OperatorSettings,
        clock: Callable[[], datetime] = utc_now,
        board: StatusBoard | None = None,
        reader: Lister | None = None,
    ) -> None:
        self.client = client
        self.reader: Lister = reader if reader is not None else client
        """Where a pass reads the children: the API, or the cache of the watches (which
        also holds the objects themselves, read when fresh enough: `_read`)."""
        self.owners = reader if isinstance(reader, CachedReader) else None
        self._acted_on: dict[tuple[str, str], int] = {}
        """The generation each object's last pass read."""
        self._written: dict[tuple[str, str], Any] = {}
        """The status each object's last status write stored, as the API returned it."""
        self.board = board if board is not None else StatusBoard()
        """What each object's last pass wrote, for the operator's /metrics."""
        self.settings = settings
        self.clock = clock
        self._locks: defaultdict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        self._slots = asyncio.Semaphore(settings.api.max_concurrent_passes)
        """Passes in flight over all objects: a pass holds its object's lock, then a slot."""
        self._requeues: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Outcome]] = set()
        self._queued: dict[tuple[str, str], asyncio.Future[Outcome]] = {}
        self._passes: set[asyncio.Future[Outcome]] = set()
        self._histories: dict[tuple[str, str], ScalingHistory] = {}
        """The autoscaler's memory per object (as the HPA controller keeps it: in memory)."""
        self._quality_histories: dict[tuple[str, str], QualityHistory] = {}
        """The quality watch's past counts per object, for a direct read's window."""
        self._cost_histories: dict[tuple[str, str], CostHistory] = {}
        """The pods of each object's cost window (and a direct read's past counts)."""
        self._answers: dict[tuple[str, str], AnswerMemory] = {}
        """When each serving pod was last asked its known answers, and what it answered."""
        self._pod_monitors: tuple[float, bool] | None = None
        """(when, whether) the cluster serves PodMonitors, rediscovered every few minutes."""
        self.metrics = MetricsSources(settings, pods_lister(self.reader), self.board.activity)
        """The metrics sources, made once and kept for the operator's life."""
        self.gpu_nodes = GpuNodes(client, settings.requeue.resync_interval_seconds)
        """The cluster's GPU nodes, for objects on a mixed GPU fleet (one list for all)."""
        self.taints = SuspectNodeTaints(client, settings.requeue.resync_interval_seconds)
        """The suspect nodes' taints, with known_answers.taint_suspect_nodes (all objects)."""
        self.priced_nodes = PricedNodes(client, settings.requeue.resync_interval_seconds)
        """Every node, for the cost's prices where the settings set any (one list for all)."""
        self.activator = ActivatorReader(
            client, settings.activator, settings.metrics.timeout_seconds
        )
        """The activator pods' routes and held requests (objects with minReplicas 0)."""
        self.routes = RouteTable(client, settings.activator)
        """The activator's route table: one route per object with minReplicas 0."""
        self._closed = False

    def tracked(self) -> set[tuple[str, str]]:
        """The (namespace, name) of every object the reconciler keeps something for."""
        return {
            *self._locks,
            *self._requeues,
            *self._queued,
            *self._histories,
            *self._quality_histories,
            *self._cost_histories,
            *self._answers,
            *self._acted_on,
            *self._written,
        }

    async def reconcile(self, namespace: str, name: str) -> Outcome:
        """One pass. Raises InvalidManifest (after recording it in the status) for a spec
        the model refuses, ApiError for a request the API server refused.

        A trigger that arrives while a pass for the same object is still waiting for the
        lock joins that pass instead of queueing another: the waiting pass has not read
        anything yet, so it sees whatever the new trigger was about. A burst of child
        events thus costs two passes, not one per event."""
        if self._closed:
            raise ReconcilerClosed(f"InferenceDeployment {namespace}/{name} not reconciled")
        key = (namespace, name)
        queued = self._queued.get(key)
        if queued is None:
            queued = asyncio.ensure_future(self._timed(key))
            self._queued[key] = queued
            self._passes.add(queued)
            queued.add_done_callback(self._pass_done)
        return await asyncio.shield(queued)

    def _pass_done(self, task: asyncio.Future[Outcome]) -> None:
        self._passes.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved here too: every waiter may have gone

    async def _timed(self, key: tuple[str, str]) -> Outcome:
        """A serialised pass, counted by result with its time from being queued."""
        activity = self.board.activity
        started = time.monotonic()
        result = "error"
        try:
            outcome = await self._serialised(key)
            result = "ok" if outcome.decision is not None else "gone"
            return outcome
        except InvalidManifest:
            result = "invalid"
            raise
        finally:
            activity.passes[result] += 1
            activity.pass_seconds.observe(time.monotonic() - started)

    async def _serialised(self, key: tuple[str, str]) -> Outcome:
        namespace, name = key
        # The object's lock first, then a slot: a pass waiting for a slot still joins the
        # triggers that arrive meanwhile, and a slot is never held while waiting for a lock.
        async with self._locks[key], self._slots:
            self._queued.pop(key, None)  # from now on, a new trigger queues a new pass
            try:
                outcome = await self._pass(namespace, name)
            except InvalidManifest:
                self._schedule(namespace, name, None)  # only a new spec can help
                raise
            except ApiError as error:
                self._schedule(namespace, name, error.retry_delay_seconds)
                raise
            except Exception:
                self._schedule(namespace, name, self.settings.requeue.resync_interval_seconds)
                raise
            if self.settings.known_answers.taint_suspect_nodes:
                await self._sync_taints()  # before `_forget`: no await may follow that
            if outcome.decision is None:
                self._forget(key)
            else:
                delay = outcome.decision.requeue_after_seconds
                self._schedule(
                    namespace, name, delay or self.settings.requeue.resync_interval_seconds
                )
            return outcome

    def _forget(self, key: tuple[str, str]) -> None:
        """Drops what is kept for an object that is gone. Called by the pass holding the
        object's lock, with no await before the lock is released: the lock itself is
        dropped only when no other pass is queued for it (a queued pass has not taken the
        lock yet, and would otherwise take a new one while this pass still holds the old)."""
        self._schedule(*key, None)
        self._histories.pop(key, None)
        self._quality_histories.pop(key, None)
        self._cost_histories.pop(key, None)
        self._answers.pop(key, None)
        self._acted_on.pop(key, None)
        self._written.pop(key, None)
        self.board.forget(key)
        if key not in self._queued:
            self._locks.pop(key, None)

    async def _sync_taints(self) -> None:
        """The suspect nodes of every object (the board's fresher statuses over the watch's
        copies) tainted, the others' taints removed; only with the watch's index can the
        operator know no object names a node any more."""
        listed = self.owners.owners_listed() if self.owners is not None else None
        stored = {
            (body["metadata"].get("namespace") or "", body["metadata"]["name"]):
            (body.get("status") or {}).get("suspectNodes") or []
            for body in listed or () if not body["metadata"].get("deletionTimestamp")
        }  # fmt: skip
        fresh = {key: report.status.suspect_nodes for key, report in self.board.items()}
        complete = listed is not None
        fresh = {key: nodes for key, nodes in fresh.items() if not complete or key in stored}
        await self.taints.sync(suspects(stored, fresh), complete, self.clock())

    async def _read(self, key: tuple[str, str]) -> dict[str, Any] | None:
        """The object from the watch's index when it is at least as new as what the
        operator itself knows of it: the generation its last pass read, and the status
        it last wrote (only the operator writes the status, so another one there means
        the watch has not delivered that write yet). From the API otherwise, as when the
        index does not hold it (not seen yet, or deleted)."""
        cached = self.owners.owner(*key) if self.owners is not None else None
        if cached is not None:
            generation = int(cached["metadata"].get("generation") or 0)
            written = self._written.get(key)
            if generation >= self._acted_on.get(key, 0) and (
                written is None or cached.get("status") == written
            ):
                self.board.activity.owner_reads["cache"] += 1
                return cached
        self.board.activity.owner_reads["api"] += 1
        return await self.client.get(INFERENCE_DEPLOYMENT, *key)

    async def _pass(self, namespace: str, name: str) -> Outcome:
        key = (namespace, name)
        body = await self._read(key)
        if body is None or body["metadata"].get("deletionTimestamp"):
            await self.routes.set(key, None)
            return Outcome(None)
        self._acted_on[key] = int(body["metadata"].get("generation") or 0)
        owner = owner_ref_from_body(body)
        try:
            spec = parse_spec(body.get("spec"))
        except InvalidManifest as invalid:
            current = stored_status(body)
            decision = decide_invalid(owner, current, invalid, self.clock())
            await self._carry_out(body, decision, current)
            raise
        now = self.clock()
        observed = await gather(
            self.reader,
            self.metrics,
            body,
            spec,
            self._histories.get(key, ScalingHistory()),
            await self._serves_pod_monitors(),
            now,
            self._quality_histories.get(key),
            gpu_nodes=lambda: self.gpu_nodes.read(key),
            answers=self._answers_reader(key, owner, spec),
            cost=self._cost_inputs(key),
            activator=self.activator.read,
        )
        if spec.quality_watch.enabled:
            self._quality_histories[key] = observed.quality_history
        else:
            self._quality_histories.pop(key, None)
        if spec.known_answers is None:
            self._answers.pop(key, None)
        if observed.cost_history.runs or observed.cost_history.snapshots:
            self._cost_histories[key] = observed.cost_history
        else:
            self._cost_histories.pop(key, None)
        decision = decide(observed, self.settings, now)
        if decision.scaling_history is not None:
            self._histories[key] = decision.scaling_history
        else:
            self._histories.pop(key, None)
        try:
            # The route first: an object goes to zero only once the activator serves it.
            await self.routes.set(key, decision.activator_route)
            writes = await apply.apply_children(self.client, decision.apply)
            writes += await apply.delete_children(self.client, decision.delete, observed)
            if decision.answers is not None:
                answered, taken = await apply_answers(self.client, owner, decision.answers, now)
                writes += answered
                self._remember_taken_out(key, taken)
        except ApiError as error:
            if error.status != 403:
                raise
            # A verb the operator's Role lacks: said where `kubectl describe` shows it, not
            # only in the operator's log; the pass still fails and is retried.
            refused = decide_forbidden(owner, decision, observed.status, error.message, now)
            await self._carry_out(body, refused, observed.status)
            raise
        writes += await self._carry_out(body, decision, observed.status, observed)
        return Outcome(decision, writes)

    def _cost_inputs(self, key: tuple[str, str]) -> CostInputs | None:
        """The cost's reads where the settings price nodes (None: no cost at all)."""
        cost = self.settings.cost
        if not cost.priced:
            return None
        history = self._cost_histories.get(key, CostHistory())
        return CostInputs(cost, self.priced_nodes.read, history)

    def _answers_reader(
        self, key: tuple[str, str], owner: OwnerRef, spec: InferenceDeploymentSpec
    ) -> Callable[[], Awaitable[AnswerReadings]] | None:
        """The read of the serving pods' known answers where spec.knownAnswers turns the
        checks on; None where they are off (no pod is asked)."""
        if spec.known_answers is None:
            return None
        interval_seconds = spec.known_answers.interval_seconds
        return lambda: self._read_answers(key, owner, interval_seconds)

    async def _read_answers(
        self, key: tuple[str, str], owner: OwnerRef, interval_seconds: float
    ) -> AnswerReadings:
        """The serving pods' known answers, the due ones asked (on the monotonic clock);
        keeps their schedule for the next pass."""
        memory = self._answers.get(key, AnswerMemory())
        readings, self._answers[key] = await gather_answers(
            self.client, self.reader, owner, memory, interval_seconds, time.monotonic
        )
        return readings

    def _remember_taken_out(self, key: tuple[str, str], uids: set[str]) -> None:
        """The pods just taken out, so that a pass reading a lagging watch does not take
        them out again."""
        memory = self._answers.get(key)
        if memory is not None and uids:
            self._answers[key] = replace(memory, taken_out=memory.taken_out | uids)

    async def _carry_out(
        self,
        body: dict[str, Any],
        decision: Decision,
        current: InferenceDeploymentStatus,
        observed: ObservedState | None = None,
    ) -> int:
        """Writes the status if it changed, then the events; returns the writes made.

        The status write is guarded by the resourceVersion the pass read. When something
        else wrote the object meanwhile without changing its spec (kopf's progress
        annotations, `kubeinfer promote`), the status this pass computed still describes
        it, so it is written once more at the new version rather than the whole pass
        being retried: the children are already written, and a retried pass would find
        nothing to do and lose the Events of what this one did (a scale change)."""
        owner = owner_ref_from_body(body)
        writes = 0
        if decision.status != current:
            version = body["metadata"]["resourceVersion"]
            try:
                stored = await apply.patch_status(self.client, owner, decision.status, version)
            except ApiError as error:
                fresh = await self.client.get(INFERENCE_DEPLOYMENT, owner.namespace, owner.name)
                if error.status != 409 or fresh is None or owner_ref_from_body(fresh) != owner:
                    raise
                version = fresh["metadata"]["resourceVersion"]
                stored = await apply.patch_status(self.client, owner, decision.status, version)
            self._written[(owner.namespace, owner.name)] = stored.get("status")
            writes += 1
        readers = metrics_readers(observed) if observed is not None else ()
        prices = pod_prices(observed) if observed is not None else ()
        self.board.record((owner.namespace, owner.name), Report(decision.status, readers, prices))
        await apply.post_events(self.client, owner, decision.events, self.clock())
        return writes + len(decision.events)

    async def _serves_pod_monitors(self) -> bool:
        """Whether to create PodMonitors: the settings allow it and the cluster serves the
        API (discovery is cached for DISCOVERY_SECONDS; a failed discovery keeps the last
        answer, so a hiccup never rolls the pods' scrape annotations back and forth)."""
        if self.settings.metrics.pod_monitors == "off":
            return False
        clock = asyncio.get_running_loop().time()
        if self._pod_monitors is not None and clock - self._pod_monitors[0] < DISCOVERY_SECONDS:
            return self._pod_monitors[1]
        try:
            serves = await self.client.serves(POD_MONITOR)
        except ApiError as error:
            logger.warning("PodMonitor discovery failed, keeping the last answer: %s", error)
            return self._pod_monitors[1] if self._pod_monitors else False
        self._pod_monitors = (clock, serves)
        return serves

    def wake(self, namespace: str, service: str) -> bool:
        """An activator holds a request for the object of `service`: a pass now, reading
        the activator afresh (the pass checks the held count itself: a wake is only a
        hint, so a forged one costs a read)."""
        if self._closed:
            return False
        self.activator.forget()
        self.trigger(namespace, service, delay=0)  # the Service keeps the object's name
        return True

    def trigger(self, namespace: str, name: str, delay: float = TRIGGER_DELAY_SECONDS) -> None:
        """Asks for a pass within `delay` seconds without waiting for it (a watch event's
        way in): a pass already due sooner stands, so a burst of events costs one pass,
        and the event's handler returns at once (kopf keeps the object's cache entry
        current only between its handler's calls). Its errors are the pass' own: logged,
        and retried by the requeue it schedules."""
        self._schedule(namespace, name, delay)

    def node_event(self, body: Mapping[str, Any], deleted: bool) -> None:
        """A GPU node's watch event: a pass over every object on a mixed GPU fleet that read
        the nodes, when the event changed what they read (`kube.nodes`)."""
        for namespace, name in sorted(self.gpu_nodes.observe(body, deleted)):
            self._schedule(namespace, name, 0.0)

    def _schedule(self, namespace: str, name: str, delay: float | None) -> None:
        """Arranges one more pass after `delay` seconds, unless one is already due sooner
        (a pass never postpones another: an event that came in while it ran asked for
        one); None cancels the pending one."""
        key = (namespace, name)
        loop = asyncio.get_running_loop()
        previous = self._requeues.get(key)
        if delay is not None and previous is not None:
            if previous.when() <= loop.time() + max(delay, 0.0):
                return
        if previous is not None:
            self._requeues.pop(key).cancel()
        if delay is not None and not self._closed:
            self._requeues[key] = loop.call_later(max(delay, 0.0), self._requeue, key)

    def _requeue(self, key: tuple[str, str]) -> None:
        self._requeues.pop(key, None)
        task = asyncio.get_running_loop().create_task(self.reconcile(*key))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Outcome]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or (error := task.exception()) is None:
            return
        if isinstance(error, InvalidManifest):  # in the status; a new spec asks again
            logger.info("Invalid spec, not retried until it changes: %s", error)
        elif not isinstance(error, ReconcilerClosed):
            logger.warning("Pass failed and is retried: %s", error)

    async def close(self, grace_seconds: float = CLOSE_GRACE_SECONDS) -> None:
        """Refuses new passes and cancels pending requeues at once; the passes in flight
        get `grace_seconds` to end (a pass cut in the middle leaves a request the API
        server answers 504 to nobody), then are cancelled."""
        self._closed = True
        for handle in self._requeues.values():
            handle.cancel()
        self._requeues.clear()
        pending = [*self._tasks, *self._passes]
        if pending and grace_seconds > 0:
            await asyncio.wait(pending, timeout=grace_seconds)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self.metrics.close()
        await self.activator.close()
