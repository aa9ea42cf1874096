"""Two replicas, one writer: leader election on a real coordination.k8s.io/v1 Lease.

- In process: a leader whose Lease is taken (as when it was cut off from the API server
  and a standby took over) stops at its next renewal (its own Lease would not expire for
  ten minutes), and from then on sends no request at all: no handler, no requeue of the
  reconciler's own, no renewal (the API server's audit log has nothing from it after).
- Two real `kubeinfer operator --leader-election` processes against the real API server,
  each logged in with its own token of the operator's ServiceAccount, so that the audit
  log tells them apart (it records each token's id): only the leader reconciles; killed
  (SIGKILL) in the middle of a build, the standby takes over once the Lease expires (and
  wrote nothing before), adopts the running build Job (one Job, the same uid, never
  created again or deleted), and brings the object to Ready once the build can finish.
  Each one's writes are counted.
- A leader stopped with SIGTERM releases the Lease: with a lease of ten minutes, the
  standby takes over at once, not when it expires.
- A leader whose event loop is blocked for three lease durations (as a fresh leader's is
  while it takes in thousands of objects) renews its Lease meanwhile, from the election's
  own thread, and goes on leading.

The build is held in progress by a model on a claim that does not exist yet (its pod
waits in ContainerCreating), until the test provides the claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from decide_scenarios import tuned
from kubeinfer.operator.kube.leader_election import Election, LeadershipLost
from operator_harness import (
    FAST,
    Model,
    World,
    condition,
    eventually,
    manifest,
    start_operator,
)
from test_operator_command import start_operator_process
from test_operator_relogin import audit_events, made_with
from test_operator_scenarios import from_missing_claim, provide_claim

pytestmark = pytest.mark.lifecycle  # operators' lifecycles: leaders lost, killed, stopped

LEASE = ("coordination.k8s.io/v1", "leases")
PIN = "sha256:" + "d" * 64
TIMINGS = {"lease_duration_seconds": 4.0, "renew_deadline_seconds": 1.5, "retry_period_seconds": 1}
"""The shortest the election allows (a retry period of at least 1 s, a renew deadline
above 1.2 of it, a lease above the deadline plus two retry periods)."""
LONG_LEASE = {**TIMINGS, "lease_duration_seconds": 600.0}
"""A Lease that outlives the test: a change of holder during it is never an expiry."""


def env_timings(timings: dict[str, float]) -> dict[str, str]:
    return {
        f"KUBEINFER_LEADER_ELECTION__{key.upper()}": str(value) for key, value in timings.items()
    }


READS = ("get", "list", "watch")


def received(event: dict[str, Any]) -> float:
    """When the API server received the request (seconds since the epoch)."""
    return datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()


def requests_with(world: World, token: str) -> list[dict[str, Any]]:
    return [e for e in audit_events(world.cluster) if made_with(e, token)]


def writes_with(world: World, token: str, before: float = float("inf")) -> list[str]:
    """`verb resource[/subresource]` of each write made with `token`, received before
    `before` (time.time())."""
    found = []
    for event in requests_with(world, token):
        if event["verb"] in READS or received(event) >= before:
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "") + (
            f"/{ref['subresource']}" if "subresource" in ref else ""
        )
        found.append(f"{event['verb']} {resource}")
    return found


def situation(world: World) -> str:
    """The object's conditions and its pods' phases, to say where a wait stopped."""
    conditions = ((world.infd() or {}).get("status") or {}).get("conditions") or []
    said = [f"{c['type']}={c['status']} {c.get('reason')}: {c.get('message')}" for c in conditions]
    pods = [
        f"{p['metadata']['name']} {p['status'].get('phase')} "
        f"{[s.get('state') for s in p['status'].get('containerStatuses') or []]}"
        for p in world.pods()
    ]
    return f"conditions {said}; pods {pods}"


def holder(world: World) -> str:
    lease = world.kube.get(*LEASE, world.lease_name)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


async def test_a_leader_whose_lease_is_taken_stops_requeues_included(
    world: World, tiny: Model
) -> None:
    election = Election(world.namespace, world.lease_name, "replica-a", **LONG_LEASE)
    # A resync that comes due after kopf has stopped: only the reconciler's own closing
    # can cancel it.
    settings = tuned(FAST, requeue={"resync_interval_seconds": 3})
    async with start_operator(world, settings, election=election) as task:
        world.create(manifest(tiny, engine={"pin": PIN}))
        await eventually(lambda: world.one("apps/v1", "deployments"), what="the children")
        assert holder(world) == "replica-a"
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        world.kube.patch(
            *LEASE, world.lease_name, {"spec": {"holderIdentity": "replica-b", "renewTime": now}}
        )
        await eventually(task.done, within=60, what="the leader to stop")
        stopped_at = time.time()
        with pytest.raises(LeadershipLost):
            task.result()
    await asyncio.sleep(3.5)  # not a wait: past the pending resync, whose requests must not come
    after = [
        f"{e['verb']} {e['requestURI']}"
        for e in audit_events(world.cluster)
        if (e.get("user") or {}).get("username") == world.operator_user and received(e) > stopped_at
    ]
    assert after == [], f"requests after the Lease was lost: {after}"
    assert holder(world) == "replica-b"


async def test_a_leader_whose_loop_is_busy_keeps_renewing_its_lease(world: World) -> None:
    election = Election(world.namespace, world.lease_name, "replica-a", **TIMINGS)
    async with start_operator(world, FAST, election=election) as task:
        await eventually(lambda: holder(world) == "replica-a", what="the Lease acquired")
        renewals: list[str] = []
        blocked = threading.Event()

        def read_the_lease() -> None:
            while blocked.is_set():
                lease = world.kube.get(*LEASE, world.lease_name) or {}
                renewals.append(str((lease.get("spec") or {}).get("renewTime")))
                time.sleep(0.25)  # not a wait: the Lease read every 0.25 s

        blocked.set()
        reader = threading.Thread(target=read_the_lease)
        reader.start()
        try:
            # not a wait: the loop blocked this long is the test
            time.sleep(3 * TIMINGS["lease_duration_seconds"])  # noqa: ASYNC251 (blocks the loop)
        finally:
            blocked.clear()
            reader.join()
        assert len(set(renewals)) >= 3, f"renewed while the loop was blocked: {renewals}"
        # not a wait: retry periods pass, in which it must keep leading
        await asyncio.sleep(2 * TIMINGS["retry_period_seconds"])
        assert not task.done() and holder(world) == "replica-a", "still leading"


async def start_replica(
    world: World, tmp_path: Path, name: str, timings: dict[str, float]
) -> tuple[asyncio.subprocess.Process, str, Path]:
    """A `kubeinfer operator --leader-election` process whose identity starts with `name`,
    logged in with a token of its own: (the process, its token, its log)."""
    token = world.token()
    kubeconfig = world.cluster.kubeconfig_for(
        tmp_path / f"kubeconfig-{name}", token, world.namespace
    )
    log = tmp_path / f"{name}.log"
    process = await start_operator_process(
        world, kubeconfig, log, "--leader-election", "--lease-namespace", world.namespace,
        **env_timings(timings), POD_NAME=name, KUBEINFER_REQUEUE__RESYNC_INTERVAL_SECONDS="1",
        KUBEINFER_REQUEUE__BUILD_POLL_SECONDS="0.5",
    )  # fmt: skip
    return process, token, log


@contextlib.asynccontextmanager
async def leader_and_standby(
    world: World, tmp_path: Path, timings: dict[str, float] = TIMINGS
) -> AsyncIterator[tuple[asyncio.subprocess.Process, dict[str, str], dict[str, Path]]]:
    """Replica a, once it holds the Lease, and replica b, once it has read the Lease as a
    standby: (a's process, each one's token, each one's log). Both are stopped on the way
    out."""
    leader, first_token, first_log = await start_replica(world, tmp_path, "replica-a", timings)
    try:
        await eventually(lambda: holder(world).startswith("replica-a"), within=60, what="a to lead")
        standby, second_token, second_log = await start_replica(
            world, tmp_path, "replica-b", timings
        )
        try:
            await eventually(
                lambda: any(
                    (e.get("objectRef") or {}).get("resource") == "leases"
                    for e in requests_with(world, second_token)
                ),
                within=60,
                what="the standby to read the Lease",
            )
            tokens = {"replica-a": first_token, "replica-b": second_token}
            yield leader, tokens, {"replica-a": first_log, "replica-b": second_log}
        finally:
            await stop(standby)
    finally:
        await stop(leader)


async def stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=60)


@pytest.mark.slow
async def test_the_standby_takes_over_a_build_when_the_leader_is_killed(
    world: World, tiny: Model, tmp_path: Path
) -> None:
    async with leader_and_standby(world, tmp_path) as (leader, tokens, logs):
        world.create(from_missing_claim(tiny))
        (job,) = await eventually(world.jobs, within=30, what="the build Job")
        await eventually(lambda: condition(world.infd(), "EngineReady"), within=30, what="a status")
        leader.send_signal(signal.SIGKILL)
        await leader.wait()
        killed_at = time.time()
        assert holder(world).startswith("replica-a")

        await eventually(
            lambda: holder(world).startswith("replica-b"), within=60, what="a takeover"
        )
        provide_claim(world, tiny)  # the build can finish now
        try:
            await eventually(
                lambda: (condition(world.infd(), "Ready") or {}).get("status") == "True",
                within=120,
                what="Ready=True, from the standby",
            )
        except AssertionError:
            raise AssertionError(f"not Ready after 120 s: {situation(world)}") from None
    (only,) = world.jobs()
    assert only["metadata"]["uid"] == job["metadata"]["uid"], "the build Job was replaced"
    job_writes = {c.verb for c in world.writes() if c.resource == "jobs"}
    assert job_writes == {"patch"}, "a Job was created or deleted other than by one apply"

    standby_early = writes_with(world, tokens["replica-b"], before=killed_at)
    assert standby_early == [], f"the standby wrote while the leader lived: {standby_early}"
    leader_writes = writes_with(world, tokens["replica-a"])
    assert leader_writes and leader_writes == writes_with(
        world, tokens["replica-a"], before=killed_at
    ), "the leader wrote nothing after it was killed"
    counts = {name: Counter(writes_with(world, token)) for name, token in tokens.items()}
    print(f"Writes: {counts}")
    assert counts["replica-b"]["patch inferencedeployments/status"] >= 1
    assert "Traceback" not in logs["replica-a"].read_text() + logs["replica-b"].read_text()


@pytest.mark.slow
async def test_a_leader_stopped_with_sigterm_hands_over_at_once(
    world: World, tmp_path: Path
) -> None:
    async with leader_and_standby(world, tmp_path, LONG_LEASE) as (leader, _, logs):
        leader.send_signal(signal.SIGTERM)
        await asyncio.wait_for(leader.wait(), timeout=60)
        assert leader.returncode == 0, logs["replica-a"].read_text()[-3000:]
        try:  # the Lease lasts ten minutes: a takeover now is one of a released Lease
            await eventually(lambda: holder(world).startswith("replica-b"), within=60)
        except AssertionError:
            raise AssertionError(logs["replica-b"].read_text()[-2000:]) from None
