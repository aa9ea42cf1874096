"""`kubeinfer cluster up` and `kubeinfer cluster down` as a user runs them, as real
subprocesses, on a second cluster beside the session's: `up` makes a network namespace of
the cluster's own, returns once the node is Ready (printing the `export KUBECONFIG=...` line
and kubectl's path) with the API server at a forwarded 127.0.0.1 port, so kubectl works at
once; `--kubeconfig FILE` writes a FILE that did not exist (nor its folder) and names it;
`--simulated-gpu-nodes` adds Ready GPU nodes of the products asked for, where a pod that
tolerates them runs (KWOK plays it); a pod of the runtime image runs as a container on the
real node; `down` leaves no process (the pod's and KWOK's included), mount, cgroup or
namespace behind; the host's network namespace holds the same links, addresses, routes,
rules and firewall rules before, during and after; and `down` where nothing runs says so
and succeeds."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.cluster import cgroups, control_plane, fleet, netns, teardown
from kubeinfer.cluster.processes import read_state
from processes_left import processes_mentioning
from waiting import wait_for

pytestmark = pytest.mark.slow
KUBEINFER = Path(sys.executable).parent / "kubeinfer"
"""The console script of this environment, as a user's shell finds it."""
RUNTIME_IMAGE = "ghcr.io/kubeinfer/kubeinfer-runtime:0.1.0"


def kubeinfer(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KUBEINFER), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def host_network_state() -> dict[str, str]:
    """What the host's network namespace holds, read from inside it."""
    host = netns.host_namespace()
    assert host is not None, "the test process did not leave the host's namespace"
    enter = ["nsenter", f"--net=/proc/{os.getpid()}/fd/{host}", "--"]
    commands = {
        "links": ["ip", "-o", "link", "show"],
        "addresses": ["ip", "-o", "address", "show"],
        "routes": ["ip", "route", "show", "table", "all"],
        "routes6": ["ip", "-6", "route", "show", "table", "all"],
        "rules": ["ip", "rule", "show"],
        "iptables": ["iptables-save"],
        "nftables": ["nft", "list", "ruleset"],
    }
    state = {}
    for name, argv in commands.items():
        try:
            result = subprocess.run(
                enter + argv, capture_output=True, text=True, timeout=30, pass_fds=(host,)
            )
            output = result.stdout + result.stderr
        except FileNotFoundError as error:  # the tool is not installed: nothing to compare
            output = str(error)
        # iptables-save stamps the time of its run: the rules are what is compared.
        state[name] = "\n".join(line for line in output.splitlines() if not line.startswith("#"))
    return state


def namespace_inode(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def commands(pids: list[str]) -> list[str]:
    """Each process's command line, to say what was left."""
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            found.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode())
    return found


def simulated_pod_runs_on_an_l4(kubectl: Callable[..., str], ready: dict[str, str | None]) -> None:
    """A pod asking for an L4's GPU lands on a simulated L4 node and runs there."""
    kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "on-an-l4"},
        "spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4",
                                  fleet.SIMULATED_LABEL[0]: fleet.SIMULATED_LABEL[1]},
                 "tolerations": [fleet.SIMULATED_TOLERATION],
                 "containers": [{"name": "main", "image": RUNTIME_IMAGE,
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }))  # fmt: skip

    def running() -> dict[str, Any] | None:
        pod = json.loads(kubectl("get", "pod", "on-an-l4", "-o", "json"))
        return pod if pod["status"].get("phase") == "Running" else None

    pod = wait_for(running, within=120, what="the pod on a simulated L4 to run")
    assert ready[pod["spec"]["nodeName"]] == "NVIDIA-L4"


@pytest.mark.lifecycle
def test_up_runs_a_node_in_its_own_namespace_and_down_leaves_nothing(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    before = host_network_state()
    directory = tmp_path / "second-cluster"
    kubeconfig = tmp_path / "not-yet" / "kubeconfig"
    try:
        fleet_of = ["--simulated-gpu-nodes", "H100=1", "--simulated-gpu-nodes", "L4=2"]
        up = kubeinfer(
            "cluster", "up", "--directory", str(directory), "--kubeconfig", str(kubeconfig),
            *fleet_of,
        )  # fmt: skip
        assert up.returncode == 0, up.stderr[-3000:]
        lines = up.stdout.splitlines()
        assert lines[0] == f"export KUBECONFIG={kubeconfig}", up.stdout
        assert kubeconfig.stat().st_mode & 0o777 == 0o600
        assert kubeconfig.read_text() == (directory / "admin.kubeconfig").read_text()
        assert lines[1].startswith("# kubectl: ") and "cluster down --directory" in lines[1]
        assert lines[2].startswith("# simulated GPU nodes: 1 H100, 2 L4; "), up.stdout
        kubectl_path = lines[1].removeprefix("# kubectl: ").split()[0]

        def kubectl(*args: str, stdin: str | None = None) -> str:
            result = subprocess.run(
                [kubectl_path, f"--kubeconfig={kubeconfig}", *args], input=stdin,
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert result.returncode == 0, result.stderr
            return result.stdout

        # No waiting: `up` returned once the node was Ready; the API server is a forwarded
        # port of this namespace, the node in the cluster's own.
        nodes = json.loads(kubectl("get", "nodes", "-o", "json"))["items"]
        ready = {
            n["metadata"]["name"]: n["metadata"]["labels"].get("nvidia.com/gpu.product")
            for n in nodes
            if {c["type"]: c["status"] for c in n["status"]["conditions"]}["Ready"] == "True"
        }
        assert sorted(ready.values(), key=str) == [
            "NVIDIA-H100-80GB-HBM3", "NVIDIA-L4", "NVIDIA-L4", None
        ], ready  # fmt: skip
        simulated_pod_runs_on_an_l4(kubectl, ready)
        assert (
            "127.0.0.1"
            in json.loads(kubectl("config", "view", "-o", "json"))["clusters"][0]["cluster"][
                "server"
            ]
        )
        started, _ = read_state(directory / control_plane.STATE_FILE)
        holder = next(p for p in started if p.name == "namespace-holder")
        # The namespace is held open to the end: once a namespace is gone its inode number
        # is given to the next one made (a pod's, in another test's cluster beside this
        # one), and the check after `down` would find that one's processes.
        held = os.open(f"/proc/{holder.pid}/ns/net", os.O_RDONLY)
        request.addfinalizer(lambda: os.close(held))
        cluster_namespace = os.fstat(held).st_ino
        assert cluster_namespace != namespace_inode("self")

        kubectl("apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper"},
            "spec": {"containers": [{"name": "main", "image": RUNTIME_IMAGE,
                                     "imagePullPolicy": "Never",
                                     "command": ["/bin/sleep", "3600"]}]},
        }))  # fmt: skip
        root = control_plane.cgroup_root(directory)

        def pod_processes() -> set[int]:
            phase = json.loads(kubectl("get", "pod", "sleeper", "-o", "json"))["status"]["phase"]
            return cgroups.cgroup_processes(root) if phase == "Running" else set()

        in_pods = wait_for(pod_processes, within=120, what="the pod to run")
        assert host_network_state() == before
    finally:
        down = kubeinfer("cluster", "down", "--directory", str(directory))
    assert down.returncode == 0, down.stderr
    assert processes_mentioning(directory) == []
    assert not any(teardown.is_alive(pid) for pid in in_pods), (
        "a pod's process outlived the cluster"
    )
    node_state = control_plane.node_directory(directory)
    assert teardown.mounts_under(directory) == [] and teardown.mounts_under(node_state) == []
    assert not node_state.exists()
    assert cgroups.cgroup_directories(root) == []
    assert not (directory / control_plane.STATE_FILE).exists()
    holders = [pid for pid in os.listdir("/proc") if namespace_inode(pid) == cluster_namespace]
    assert holders == [], f"the cluster's namespace outlived its processes: {commands(holders)}"
    assert host_network_state() == before

    again = kubeinfer("cluster", "down", "--directory", str(directory))
    assert again.returncode == 0
    assert again.stderr.strip() == f"kubeinfer cluster down: no cluster runs from {directory}"


def test_down_where_no_cluster_ever_ran_says_so_and_succeeds(tmp_path: Path) -> None:
    down = kubeinfer("cluster", "down", "--directory", str(tmp_path / "never-up"), timeout=60)
    assert down.returncode == 0
    assert down.stdout == ""
    assert "no cluster runs from" in down.stderr and str(tmp_path / "never-up") in down.stderr
