"""`kubeinfer operator` as a real process: started from the console script with a
kubeconfig that points at the emulated API server, it reconciles an InferenceDeployment
into its children, and exits cleanly on SIGTERM. Also: bad flags and bad settings are
refused with a message, not a traceback, and so are missing credentials, leader election
timings under which two leaders could overlap, and a Lease without a namespace. (Leader
election between two such processes: `test_operator_leader_election.py`.)"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
import yaml
from kubeinfer.operator.cli import main
from operator_harness import NAMESPACE, World, digest_of, eventually, manifest


def kubeconfig(path: Path, server: str, token: str = "not-checked") -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "operator", "namespace": NAMESPACE},
            }
        ],
        "current-context": "emulator",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
async def test_the_operator_process_reconciles_and_stops_on_sigterm(
    world: World, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig(tmp_path / "kubeconfig", world.url)),
        "KUBEINFER_RESYNC_INTERVAL_SECONDS": "1",
    }
    log = (tmp_path / "operator.log").open("wb")  # a file: a full pipe would block kopf
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kubeinfer.operator",
        "operator",
        "--namespace",
        NAMESPACE,
        "--standalone",
        env=env,
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await eventually(lambda: len(world.watched()) >= 7, within=30, what="the watches")
        world.api.create("inferencedeployments", manifest(engine={"pin": digest_of("cli")}))
        await eventually(
            lambda: world.one("apps/v1", "deployments") and world.one("v1", "services"),
            within=10,
            what="the children",
        )
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=30)
        log.close()
    output = (tmp_path / "operator.log").read_text()
    assert process.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]


def test_conflicting_scope_flags_are_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["operator", "--namespace", "a", "--all-namespaces"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_bad_setting_is_reported_by_its_variable(monkeypatch, capsys) -> None:
    monkeypatch.setenv("KUBEINFER_RESYNC_INTERVAL_SECONDS", "soon")
    assert main(["operator", "--namespace", "a"]) == 2
    assert "KUBEINFER_RESYNC_INTERVAL_SECONDS" in capsys.readouterr().err


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
    monkeypatch.setenv("KUBEINFER_LEADER_ELECTION_LEASE_DURATION_SECONDS", "11")
    assert main(["operator", "--namespace", "a", "--leader-election"]) == 2
    assert "KUBEINFER_LEADER_ELECTION_LEASE_DURATION_SECONDS" in capsys.readouterr().err


def test_leader_election_needs_the_leases_namespace(monkeypatch, capsys) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    assert main(["operator", "--namespace", "a", "--leader-election"]) == 2
    assert "--lease-namespace" in capsys.readouterr().err
