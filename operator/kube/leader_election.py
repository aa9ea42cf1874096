"""Two replicas, one writer: the operator runs only while it holds a coordination.k8s.io/v1
Lease in its own namespace.

The election is the official client's (`kubernetes.aio.leaderelection.LeaderElection`:
acquire, renew every retry period, give up after the renew deadline, take over a lease
not renewed for the lease duration). Its lock, `LeaseLock`, is ours: the official one is
bound to one `ApiClient` for life and turns every refusal into a silent False, while this
one goes through `KubeClient` (bounded requests, a 401 that logs in again) and writes the
Lease with a resourceVersion-guarded PUT, so two candidates cannot both win a race.

The election runs in a thread of its own, so that a busy operator loop never delays a
renewal. What runs while leading is the whole kopf operator (`run_as_leader(run, ...)`).
A standby runs nothing but the election: no watch, no handler, no requeue of the reconciler's own.
Taking over starts kopf afresh, which lists every object and resumes each (its resume
handler), so the new leader converges from what exists; a build Job in flight is found
by its deterministic name and adopted, never duplicated. Losing the lease stops kopf at
once (cancelled, not drained: nothing more may be written) and raises `LeadershipLost`;
the command exits, and the pod restarts as a standby. A graceful stop (SIGTERM) releases
the Lease, so a standby takes over within a retry period instead of a lease duration.

The standby's credentials: kopf is not running to log in, so `keep_logged_in` fills the
election's own vault from the same login function, again whenever a 401 empties it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf
from kubeinfer.operator.kube.client import LEASE, ApiError, KubeClient, Vault
from kubernetes.aio.client.exceptions import ApiException
from kubernetes.aio.leaderelection.electionconfig import Config
from kubernetes.aio.leaderelection.leaderelection import LeaderElection
from kubernetes.aio.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.aio.leaderelection.resourcelock.baselock import BaseLock

logger = logging.getLogger(__name__)

LOGIN_KEY = "leader-election"


class LeadershipLost(Exception):
    """This replica stopped renewing its Lease (another took it, or the API server could
    not be reached within the renew deadline): it has stopped reconciling."""


@dataclass(frozen=True)
class Election:
    """Where the Lease lives, who this replica is, and the timings (seconds)."""

    namespace: str
    name: str
    identity: str
    lease_duration_seconds: float
    renew_deadline_seconds: float
    retry_period_seconds: float


def _micro_time(value: str | None) -> str | None:
    """The election's time strings (`str(datetime)`, naive local time, or what a Lease
    held) as a Lease's MicroTime (RFC 3339 in UTC, microseconds)."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseLock(BaseLock):
    """The election's record in a Lease, read and written as a dict through `KubeClient`."""

    def __init__(self, name: str, namespace: str, identity: str, client: KubeClient) -> None:
        super().__init__(name, namespace, identity)
        self.client = client
        self._lease: dict[str, Any] | None = None
        """The Lease as last read: an update replaces exactly that version."""

    async def get(
        self, name: str, namespace: str
    ) -> tuple[bool, LeaderElectionRecord] | tuple[bool, Exception] | tuple[bool, None]:
        try:
            lease = await self.client.get(LEASE, namespace, name)
        except (ApiError, kopf.LoginError) as error:
            logger.warning("Lease not read: Lease=%s/%s error=%s", namespace, name, error)
            return False, ApiException(status=getattr(error, "status", 0), reason=str(error))
        if lease is None:  # the election creates the Lease only on a 404 with this body
            return False, ApiException(status=404, reason="NotFound", body='{"code": 404}')
        self._lease = lease
        spec = lease.get("spec") or {}
        duration = spec.get("leaseDurationSeconds")
        return True, LeaderElectionRecord(
            spec.get("holderIdentity") or None,
            str(duration) if duration else None,
            spec.get("acquireTime"),
            spec.get("renewTime"),
        )

    def _spec(self, record: LeaderElectionRecord, transitions: int) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": record.holder_identity,
            "leaseDurationSeconds": max(1, round(float(record.lease_duration or 1))),
            "leaseTransitions": transitions,
        }
        times = {"acquireTime": record.acquire_time, "renewTime": record.renew_time}
        for field, value in times.items():
            if (moment := _micro_time(value)) is not None:
                spec[field] = moment
        return spec

    async def create(
        self, name: str, namespace: str, election_record: LeaderElectionRecord
    ) -> bool:
        lease = {
            "apiVersion": LEASE.api_version,
            "kind": LEASE.kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": self._spec(election_record, 0),
        }
        try:
            self._lease = await self.client.create(lease)
        except (ApiError, kopf.LoginError) as error:
            logger.info("Lease not created: Lease=%s/%s error=%s", namespace, name, error)
            return False
        return True

    async def update(self, name: str, namespace: str, updated_record: LeaderElectionRecord) -> bool:
        if self._lease is None:
            return False
        spec = self._lease.get("spec") or {}
        transitions = int(spec.get("leaseTransitions") or 0)
        if spec.get("holderIdentity") != updated_record.holder_identity:
            transitions += 1
        lease = {**self._lease, "spec": self._spec(updated_record, transitions)}
        try:
            self._lease = await self.client.replace(lease)
        except (ApiError, kopf.LoginError) as error:
            logger.info("Lease not updated: Lease=%s/%s error=%s", namespace, name, error)
            return False
        return True

    async def release(self) -> None:
        """Gives the Lease up if this replica holds it (client-go's ReleaseOnCancel): an
        empty holder lets a standby acquire at its next try."""
        found, _ = await self.get(self.name, self.namespace)
        if not found or self._lease is None:
            return
        spec = self._lease.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return
        released = {key: value for key, value in spec.items() if key != "holderIdentity"}
        lease = {**self._lease, "spec": {**released, "leaseDurationSeconds": 1}}
        try:
            await self.client.replace(lease)
        except (ApiError, kopf.LoginError) as error:
            logger.warning(
                "Lease not released: Lease=%s/%s error=%s", self.namespace, self.name, error
            )
            return
        logger.info("Released the Lease: Lease=%s/%s", self.namespace, self.name)


Login = Callable[[], Awaitable[kopf.ConnectionInfo | None]]


async def keep_logged_in(vault: Vault, login: Login) -> None:
    """Fills `vault` with what `login` finds, now and whenever it runs empty (a 401
    invalidated the credential). A login that finds nothing is raised: without
    credentials the election cannot go on, and the command exits with the reason."""
    while True:
        await vault.wait_for_emptiness()
        try:
            connection = await login()
        except kopf.LoginError:
            await vault.populate({})  # wakes the waiting requests, which then fail too
            raise
        if connection is None:
            await vault.populate({})
            raise kopf.LoginError("The login found no credentials.")
        await vault.populate({LOGIN_KEY: connection})


async def run_as_leader(
    run: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
    election: Election,
    login: Login,
    stop: asyncio.Event,
) -> None:
    """Runs `run(stopping)` only while this replica holds the Lease, until `stop` is set or
    `run` ends by itself (kopf stops on SIGTERM); then gives the Lease up. `run` must stop
    when `stopping` is set, and must be safe to cancel. Raises LeadershipLost when the
    Lease is lost while leading (after cancelling `run`).

    The election runs in a thread of its own, on an event loop of its own, with its own
    client: the operator's loop can be busy for seconds (a fresh leader takes in the
    listing of every object it watches, thousands at a fleet's scale), and a renewal that
    waited its turn there would time out and lose the Lease of a leader that is working,
    as client-go's election runs beside the controllers, not among them."""
    leader = _Leader(run, election, asyncio.get_running_loop())
    candidate = _Candidate(election, login, leader)
    logger.info(
        "Waiting for the Lease: Lease=%s/%s identity=%s",
        election.namespace, election.name, election.identity,
    )  # fmt: skip
    thread = threading.Thread(target=candidate.main, name="leader election", daemon=True)
    thread.start()
    waits = {
        "election": asyncio.ensure_future(candidate.ended.wait()),
        "stop": asyncio.ensure_future(stop.wait()),
        "operator": asyncio.ensure_future(leader.done.wait()),
    }
    try:
        done, _ = await asyncio.wait(waits.values(), return_when=asyncio.FIRST_COMPLETED)
        if waits["election"] in done:
            # The election ends by itself only once the Lease is lost, or the login failed.
            await leader.cancel()
            if candidate.error is not None:
                raise candidate.error
            raise LeadershipLost(f"Lease {election.namespace}/{election.name} lost")
        await leader.finish()
        candidate.stop(release=leader.operator is not None)
        await candidate.ended.wait()
    finally:
        candidate.stop(release=False)
        for wait in waits.values():
            wait.cancel()
        await asyncio.gather(*waits.values(), return_exceptions=True)
        await asyncio.to_thread(thread.join)


class _Candidate:
    """The election, its login and its Lease client, on the election thread's own loop;
    `ended` (an Event of the operator's loop) is set when it stops, `error` holds the
    login's failure if that is why."""

    def __init__(self, election: Election, login: Login, leader: _Leader) -> None:
        self.election, self.login, self.leader = election, login, leader
        self.ended = asyncio.Event()
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._release = False
        self._stopping = threading.Event()

    def main(self) -> None:
        try:
            asyncio.run(self._campaign())
        finally:
            self.leader.loop.call_soon_threadsafe(self.ended.set)

    def stop(self, release: bool) -> None:
        """Ends the election (from the operator's loop); with `release`, the Lease is
        given up first."""
        if self._stopping.is_set():
            return
        self._release = release
        self._stopping.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # the election ended: its loop is closed
                loop.call_soon_threadsafe(task.cancel)

    async def _campaign(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        if self._stopping.is_set():
            return
        election = self.election
        vault = Vault()
        timeout = election.retry_period_seconds / 2  # see the settings' lease duration check
        lock = LeaseLock(
            election.name,
            election.namespace,
            election.identity,
            KubeClient(vault, timeout_seconds=timeout),
        )
        tasks = [
            asyncio.create_task(LeaderElection(self.leader.config(lock)).run(), name="election"),
            asyncio.create_task(keep_logged_in(vault, self.login), name="election login"),
        ]
        stopped = False
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and (error := task.exception()) is not None:
                    self.error = error
        except asyncio.CancelledError:
            stopped = True  # by `stop`: the operator's loop has finished with the Lease
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if stopped and self._release:
                await lock.release()
            await vault.close()


class _Leader:
    """The operator's task while this replica leads: started when the Lease is acquired,
    shielded from the election's cancellation, and stopped by `finish` (a graceful stop)
    or `cancel` (the Lease was lost)."""

    def __init__(
        self,
        run: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
        election: Election,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.run, self.election, self.loop = run, election, loop
        """`loop`: the operator's, where `run` runs; the election calls `leading` and
        `stopped_leading` on its own."""
        self.stopping = asyncio.Event()
        self.done = asyncio.Event()
        self.operator: asyncio.Task[None] | None = None

    def config(self, lock: LeaseLock) -> Config:
        election = self.election
        return Config(
            lock=lock,
            lease_duration=election.lease_duration_seconds,
            renew_deadline=election.renew_deadline_seconds,
            retry_period=election.retry_period_seconds,
            onstarted_leading=self.leading,
            onstopped_leading=self.stopped_leading,
        )

    async def leading(self) -> None:
        """Starts the operator on its own loop (the election cancels this coroutine when
        the Lease is lost, which must not reach the operator: `cancel` stops it)."""
        election = self.election
        logger.info(
            "Acquired the Lease, reconciling: Lease=%s/%s identity=%s",
            election.namespace, election.name, election.identity,
        )  # fmt: skip
        self.loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        if self.stopping.is_set():
            return
        self.operator = asyncio.create_task(self.run(self.stopping), name="operator (leading)")
        self.operator.add_done_callback(lambda _: self.done.set())

    async def stopped_leading(self) -> None:
        election = self.election
        logger.warning(
            "Lost the Lease, stopping: Lease=%s/%s identity=%s",
            election.namespace, election.name, election.identity,
        )  # fmt: skip

    async def finish(self) -> None:
        """A graceful stop: kopf drains its handlers."""
        self.stopping.set()
        if self.operator is not None:
            await self.operator

    async def cancel(self) -> None:
        """Tells kopf this is a stop, not a crash, then cancels it; an error it stops with
        is logged (the lost Lease is what the caller must hear)."""
        self.stopping.set()
        if self.operator is None or self.operator.done():
            return
        self.operator.cancel()
        try:
            await self.operator
        except asyncio.CancelledError:
            pass
        except Exception as error:
            logger.warning("The operator stopped with an error: %r", error)
