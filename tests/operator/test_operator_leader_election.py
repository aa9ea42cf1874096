"""Two replicas, one writer: leader election on a coordination.k8s.io/v1 Lease.

- In process: a leader whose Lease is taken (as when it was cut off from the API server
  and a standby took over) stops within its renew deadline, and from then on sends no
  request at all: no handler, no requeue of the reconciler's own, no renewal.
- Two real `kubeinfer operator --leader-election` processes against the emulated API
  server, each with its own token so the request log tells them apart: only the leader
  reconciles; killed (SIGKILL) in the middle of a build, the standby takes over within
  the lease duration and a retry period, adopts the running build Job (one Job, the same
  uid, never deleted), and brings the object to Ready. Each one's writes are counted.
- A leader stopped with SIGTERM releases the Lease: the standby takes over within a
  couple of retry periods, not a lease duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from emulator import ApiCall
from kubeinfer.operator.kube.leader_election import Election, LeadershipLost
from operator_harness import (
    FAST,
    NAMESPACE,
    World,
    condition,
    digest_of,
    eventually,
    manifest,
    start_operator,
)
from test_operator_command import kubeconfig

LEASE = ("coordination.k8s.io/v1", "leases")
LEASE_NAME = "kubeinfer-operator"
TIMINGS = {"lease_duration_seconds": 4.0, "renew_deadline_seconds": 1.5, "retry_period_seconds": 1}
"""The shortest the election allows (a retry period of at least 1 s, a renew deadline
above 1.2 of it, a lease above the deadline plus two retry periods)."""
ENV_TIMINGS = {
    f"KUBEINFER_LEADER_ELECTION_{key.upper()}": str(value) for key, value in TIMINGS.items()
}


def writes_by(world: World, token: str, before: float = float("inf")) -> list[ApiCall]:
    return [c for c in world.api.writes() if c.user == token and c.at < before]


def holder(world: World) -> str | None:
    lease = world.api.get(*LEASE, NAMESPACE, LEASE_NAME)
    return ((lease or {}).get("spec") or {}).get("holderIdentity")


async def test_a_leader_whose_lease_is_taken_stops_requeues_included(world: World) -> None:
    election = Election(NAMESPACE, LEASE_NAME, "replica-a", **TIMINGS)
    # A resync that comes due after kopf has stopped: only the reconciler's own closing
    # can cancel it.
    settings = FAST.model_copy(update={"resync_interval_seconds": 3})
    async with start_operator(world, settings, election=election, tokens=lambda: "a") as task:
        world.api.create("inferencedeployments", manifest(engine={"pin": digest_of("taken")}))
        await eventually(lambda: world.one("apps/v1", "deployments"), what="the children")
        assert holder(world) == "replica-a"
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        world.api.patch(
            *LEASE,
            NAMESPACE,
            LEASE_NAME,
            {"spec": {"holderIdentity": "replica-b", "renewTime": now}},
        )
        taken = time.monotonic()
        await eventually(task.done, within=10, what="the leader to stop")
        stopped = time.monotonic()
        with pytest.raises(LeadershipLost):
            task.result()
    assert (
        stopped - taken < TIMINGS["retry_period_seconds"] + TIMINGS["renew_deadline_seconds"] + 1.5
    )
    await asyncio.sleep(3.5)  # past the pending resync
    after = [c for c in world.api.calls if c.at > stopped]
    assert after == [], f"requests after the Lease was lost: {after}"
    assert holder(world) == "replica-b"


def start_replica(world: World, tmp_path: Path, token: str) -> tuple[asyncio.Future, Path]:
    config = kubeconfig(tmp_path / f"kubeconfig-{token}", world.url, token=token)
    env = {
        **os.environ,
        **ENV_TIMINGS,
        "KUBECONFIG": str(config),
        "POD_NAME": token,
        "KUBEINFER_RESYNC_INTERVAL_SECONDS": "1",
        "KUBEINFER_BUILD_POLL_SECONDS": "0.5",
    }
    log = tmp_path / f"{token}.log"
    process = asyncio.create_subprocess_exec(
        sys.executable, "-m", "kubeinfer.operator", "operator", "--namespace", NAMESPACE,
        "--leader-election", "--lease-namespace", NAMESPACE,
        env=env, stdout=log.open("wb"), stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    return process, log


@contextlib.asynccontextmanager
async def leader_and_standby(world: World, tmp_path: Path):
    """Replica a, once it holds the Lease, and replica b, once it has looked at the Lease
    as a standby: (the leader, a's log, b's log). Both are stopped on the way out."""
    first, first_log = start_replica(world, tmp_path, "replica-a")
    leader = await first
    try:
        await eventually(lambda: (holder(world) or "").startswith("replica-a"), within=30)
        second, second_log = start_replica(world, tmp_path, "replica-b")
        standby = await second
        try:
            await eventually(
                lambda: any(
                    c.user == "replica-b" and c.resource == "leases" for c in world.api.calls
                ),
                within=30,
                what="the standby to look at the Lease",
            )
            yield leader, first_log, second_log
        finally:
            await stop(standby)
    finally:
        await stop(leader)


async def stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=30)


@pytest.mark.slow
async def test_the_standby_takes_over_a_build_when_the_leader_is_killed(
    world: World, tmp_path: Path
) -> None:
    async with leader_and_standby(world, tmp_path) as (leader, first_log, second_log):
        world.api.create("inferencedeployments", manifest())
        (job,) = await eventually(world.jobs, within=10, what="the build Job")
        await eventually(lambda: condition(world.infd(), "EngineReady"), within=10, what="a status")
        leader.send_signal(signal.SIGKILL)
        await leader.wait()
        killed = time.monotonic()
        assert holder(world).startswith("replica-a")

        await eventually(
            lambda: (holder(world) or "").startswith("replica-b"), within=15, what="a takeover"
        )
        took_over = time.monotonic() - killed
        world.finish_build(world.jobs()[0], digest="sha256:" + "ab" * 32)
        await eventually(lambda: world.one("apps/v1", "deployments"), within=15, what="rollout")
        world.make_deployment_ready()
        await eventually(
            lambda: (condition(world.infd(), "Ready") or {}).get("status") == "True", within=15
        )
    lease = TIMINGS["lease_duration_seconds"] + TIMINGS["retry_period_seconds"]
    print(
        f"\nTakeover {took_over:.1f} s after SIGKILL (lease {TIMINGS['lease_duration_seconds']} s)"
    )
    assert took_over < lease + 1.0, second_log.read_text()[-3000:]

    (only,) = world.jobs()
    assert only["metadata"]["uid"] == job["metadata"]["uid"], "the build Job was replaced"
    job_writes = [c for c in world.api.writes() if c.resource == "jobs"]
    assert {c.verb for c in job_writes} == {"patch"}, "a Job was created or deleted"

    before_kill = writes_by(world, "replica-b", before=killed)
    assert before_kill == [], f"the standby wrote while the leader lived: {before_kill}"
    assert writes_by(world, "replica-a") and all(
        c.at < killed for c in writes_by(world, "replica-a")
    )
    counts = {
        token: Counter(f"{c.verb} {c.resource}" for c in writes_by(world, token))
        for token in ("replica-a", "replica-b")
    }
    print(f"Writes: {counts}")
    assert counts["replica-b"]["patch inferencedeployments/status"] >= 1
    assert "Traceback" not in first_log.read_text() + second_log.read_text()


@pytest.mark.slow
async def test_a_leader_stopped_with_sigterm_hands_over_at_once(
    world: World, tmp_path: Path
) -> None:
    async with leader_and_standby(world, tmp_path) as (leader, _, second_log):
        leader.send_signal(signal.SIGTERM)
        await asyncio.wait_for(leader.wait(), timeout=30)
        stopped = time.monotonic()
        assert leader.returncode == 0
        await eventually(lambda: (holder(world) or "").startswith("replica-b"), within=15)
        took_over = time.monotonic() - stopped
    assert took_over < 2 * TIMINGS["retry_period_seconds"] + 0.5, second_log.read_text()[-2000:]
