"""`kubeinfer operator` as a real process: started from the console script with a
kubeconfig that points at the session's real API server and carries the operator's
ServiceAccount token, it opens its watches, reconciles an InferenceDeployment into its
children, and exits cleanly (0, no traceback) on SIGTERM. Also: bad flags and bad
settings are refused with a message, not a traceback, and so are missing credentials,
leader election timings under which two leaders could overlap, and a Lease without a
namespace. (Leader election between two such processes: `test_operator_leader_election.py`.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
from kubeinfer.cli.main import main
from operator_harness import WATCHED, Model, World, condition, eventually, manifest

PIN = "sha256:" + "c" * 64
"""A pinned engine: the children follow at once, with no build."""


def start_operator_process(
    world: World, kubeconfig: Path, log: Path, *flags: str, **env: str
) -> asyncio.Future[asyncio.subprocess.Process]:
    """`python -m kubeinfer.cli operator --namespace <the test's> *flags`, logged in by
    `kubeconfig`, its output in `log` (a file: a full pipe would block kopf)."""
    return asyncio.create_subprocess_exec(
        sys.executable, "-m", "kubeinfer.cli", "operator", "--namespace", world.namespace, *flags,
        env={**os.environ, "KUBECONFIG": str(kubeconfig), **env},
        stdout=log.open("wb"), stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip


def watching(world: World, since: int = 0) -> bool:
    """Whether the operator's watches of every kind it follows are open."""
    watched = {c.resource for c in world.calls()[since:] if c.verb == "watch"}
    return WATCHED <= watched


@pytest.mark.slow
async def test_the_operator_process_reconciles_and_stops_on_sigterm(
    world: World, tiny: Model, tmp_path: Path
) -> None:
    kubeconfig = world.cluster.kubeconfig_for(
        tmp_path / "kubeconfig", world.token(), world.namespace
    )
    log = tmp_path / "operator.log"
    process = await start_operator_process(
        world, kubeconfig, log, "--standalone", KUBEINFER_REQUEUE__RESYNC_INTERVAL_SECONDS="1"
    )
    try:
        await eventually(lambda: watching(world), within=60, what="the operator's watches")
        world.create(manifest(tiny, engine={"pin": PIN}))
        await eventually(
            lambda: world.one("apps/v1", "deployments") and world.one("v1", "services"),
            within=30,
            what="the children",
        )
        await eventually(
            lambda: (condition(world.infd(), "EngineReady") or {}).get("reason") == "EnginePinned",
            within=30,
            what="the status",
        )
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=60)
    output = log.read_text()
    assert process.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    owner = world.infd()["metadata"]["uid"]
    assert world.one("apps/v1", "deployments")["metadata"]["ownerReferences"][0]["uid"] == owner
    assert world.writes(), "written as the operator's ServiceAccount, from its kubeconfig"


def test_conflicting_scope_flags_are_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["operator", "--namespace", "a", "--all-namespaces"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_bad_setting_is_reported_by_its_variable(monkeypatch, capsys) -> None:
    monkeypatch.setenv("KUBEINFER_REQUEUE__RESYNC_INTERVAL_SECONDS", "soon")
    assert main(["operator", "--namespace", "a"]) == 2
    assert "KUBEINFER_REQUEUE__RESYNC_INTERVAL_SECONDS: " in capsys.readouterr().err


def test_missing_credentials_are_one_line_not_a_hang(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["operator", "--namespace", "a"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kubeinfer operator: no Kubernetes credentials")
    assert "Traceback" not in err


def test_leader_election_timings_that_could_overlap_two_leaders_are_refused(
    monkeypatch, capsys
) -> None:
    monkeypatch.setenv("KUBEINFER_LEADER_ELECTION__LEASE_DURATION_SECONDS", "11")
    assert main(["operator", "--namespace", "a", "--leader-election"]) == 2
    assert "KUBEINFER_LEADER_ELECTION__LEASE_DURATION_SECONDS: " in capsys.readouterr().err


def test_leader_election_needs_the_leases_namespace(monkeypatch, capsys) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    assert main(["operator", "--namespace", "a", "--leader-election"]) == 2
    assert "--lease-namespace" in capsys.readouterr().err


def test_the_operator_collects_cyclic_garbage_less_often(monkeypatch) -> None:
    """The collector's thresholds as the operator process runs (docs/fleet.md: with
    Python's defaults the collector took about a quarter of its CPU on a fleet): seen
    from inside `kubeinfer operator`, where the serving would start."""
    import gc

    import kopf
    from kubeinfer.operator.commands import run as operator_command

    monkeypatch.setattr(kopf, "login_via_client", lambda **_: None)  # credentials found
    seen = []

    async def serve(*_: object) -> None:
        seen.append(gc.get_threshold())

    monkeypatch.setattr(operator_command, "_serve", serve)
    before = gc.get_threshold()
    try:
        assert main(["operator", "--namespace", "a"]) == 0
    finally:
        gc.set_threshold(*before)
    assert seen == [operator_command.GC_THRESHOLDS]
    assert all(ours > default for ours, default in zip(seen[0], (700, 10, 10), strict=True))
