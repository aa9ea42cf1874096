"""`kubeinfer cluster up` and `kubeinfer cluster down` as a user runs them, as real
subprocesses on a second cluster in a directory of its own (beside the session's): `up`
returns once the node is Ready, printing the `export KUBECONFIG=...` line and kubectl's
path, and kubectl works at once; `down` stops every process `up` started (etcd,
kube-apiserver, kube-controller-manager, the node agent) and the pods' processes, so no
live process (a zombie runs nothing) mentions the directory afterwards; and `down` where
nothing runs says so and succeeds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kubeinfer.cluster import control_plane
from kubeinfer.cluster.processes import read_state, start_ticks
from node_harness import RUNTIME_IMAGE, alive, wait_for

KUBEINFER = Path(sys.executable).parent / "kubeinfer"
"""The console script of this environment, as a user's shell finds it."""


def kubeinfer(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KUBEINFER), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def live_processes_mentioning(text: str) -> dict[int, str]:
    """pid → command line of every process (not a zombie) whose command line holds `text`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        if text in command and start_ticks(int(entry.name)) is not None:
            found[int(entry.name)] = command
    return found


def test_up_returns_a_ready_cluster_and_down_leaves_no_process_behind(tmp_path: Path) -> None:
    directory = tmp_path / "second-cluster"
    try:
        up = kubeinfer("cluster", "up", "--directory", str(directory))
        assert up.returncode == 0, up.stderr
        kubeconfig = directory / "admin.kubeconfig"
        lines = up.stdout.splitlines()
        assert lines[0] == f"export KUBECONFIG={kubeconfig}", up.stdout
        assert (
            lines[1].startswith("# kubectl: ") and "kubeinfer cluster down --directory" in lines[1]
        )
        kubectl_path = lines[1].removeprefix("# kubectl: ").split()[0]

        def kubectl(*args: str, stdin: str | None = None) -> str:
            result = subprocess.run(
                [kubectl_path, f"--kubeconfig={kubeconfig}", *args], input=stdin,
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert result.returncode == 0, result.stderr
            return result.stdout

        # No waiting: `up` returned once the node was Ready.
        [node] = json.loads(kubectl("get", "nodes", "-o", "json"))["items"]
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True"

        started, _ = read_state(directory / control_plane.STATE_FILE)
        assert [p.name for p in started] == [
            "etcd", "kube-apiserver", "kube-controller-manager", "node-agent",
        ]  # fmt: skip
        running = live_processes_mentioning(str(directory))
        assert {p.pid for p in started} <= running.keys(), running

        # A pod's process, which names nothing of the directory: found by its pid.
        kubectl("apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper"},
            "spec": {"containers": [{"name": "main", "image": RUNTIME_IMAGE,
                                     "command": ["/bin/sleep", "3600"]}]},
        }))  # fmt: skip

        def pod_pid() -> int | None:
            found = json.loads(kubectl("get", "pod", "sleeper", "-o", "json"))
            for status in found.get("status", {}).get("containerStatuses") or []:
                if "running" in status["state"]:
                    return int(status["containerID"].removeprefix("kubeinfer-local://"))
            return None

        pid = wait_for("the pod to run", pod_pid)
        ticks = start_ticks(pid)

        down = kubeinfer("cluster", "down", "--directory", str(directory))
        assert down.returncode == 0, down.stderr
        assert live_processes_mentioning(str(directory)) == {}
        assert not alive(pid, ticks), "the pod's process outlived the cluster"
        assert not (directory / control_plane.STATE_FILE).exists()

        again = kubeinfer("cluster", "down", "--directory", str(directory))
        assert again.returncode == 0
        assert again.stderr.strip() == f"kubeinfer cluster down: no cluster runs from {directory}"
    finally:
        control_plane.down(directory)  # whatever a failed assertion left running


def test_down_where_no_cluster_ever_ran_says_so_and_succeeds(tmp_path: Path) -> None:
    down = kubeinfer("cluster", "down", "--directory", str(tmp_path / "never-up"), timeout=60)
    assert down.returncode == 0
    assert down.stdout == ""
    assert "no cluster runs from" in down.stderr and str(tmp_path / "never-up") in down.stderr
