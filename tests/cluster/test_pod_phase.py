"""The node agent's pod status (`kubeinfer.cluster.node.pod_status`), table-driven against
the kubelet's `getPhase` rules: init containers first (running or waiting keeps the pod
Pending, a failure with restartPolicy Never fails it), then the containers (one never
started: Pending; any running: Running; all terminated: Running while restarts are due,
else Succeeded or Failed by their exit codes), and the conditions and container statuses
`pod_status` builds around the phase."""

from __future__ import annotations

from typing import Any

import pytest
from kubeinfer.cluster.node.pod_status import ContainerView, phase, pod_status

NOW = "2026-01-01T00:00:10Z"
EARLIER = "2026-01-01T00:00:00Z"


def creating() -> dict[str, Any]:
    return {"waiting": {"reason": "ContainerCreating"}}


def running() -> dict[str, Any]:
    return {"running": {"startedAt": EARLIER}}


def exited(code: int) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}}


def back_off() -> dict[str, Any]:
    return {"waiting": {"reason": "CrashLoopBackOff"}}


def view(
    state: dict[str, Any],
    *,
    last: dict[str, Any] | None = None,
    will_restart: bool = False,
    ready: bool = False,
    name: str = "main",
) -> ContainerView:
    return ContainerView(
        name=name, image="ghcr.io/kubeinfer/kubeinfer-runtime:0.1.0", state=state,
        last_state=last or {}, will_restart=will_restart, ready=ready,
    )  # fmt: skip


PHASES = [
    # (case, init containers, containers, restartPolicy, expected phase)
    ("never started", [], [view(creating())], "Always", "Pending"),
    ("image not pulled yet", [], [view({"waiting": {"reason": "ErrImagePull"}})], "Always",
     "Pending"),
    ("running", [], [view(running())], "Always", "Running"),
    ("one running, one never started", [],
     [view(running()), view(creating(), name="side")], "Always", "Pending"),
    ("one running, one in back-off after it ran", [],
     [view(running()), view(back_off(), last=exited(1), will_restart=True, name="side")],
     "Always", "Running"),
    ("Always: exited 0 and about to restart", [], [view(exited(0), will_restart=True)],
     "Always", "Running"),
    ("Always: all exited, none to restart (being stopped)", [], [view(exited(0))], "Always",
     "Running"),
    ("Always: in back-off after a crash", [],
     [view(back_off(), last=exited(1), will_restart=True)], "Always", "Running"),
    ("Never: all exited 0", [], [view(exited(0)), view(exited(0), name="side")], "Never",
     "Succeeded"),
    ("Never: one of two failed", [], [view(exited(0)), view(exited(3), name="side")], "Never",
     "Failed"),
    ("Never: killed by a signal", [], [view(exited(137))], "Never", "Failed"),
    ("Never: one exited 0, one still running", [],
     [view(exited(0)), view(running(), name="side")], "Never", "Running"),
    ("OnFailure: exited 0", [], [view(exited(0))], "OnFailure", "Succeeded"),
    ("OnFailure: failed, restart due", [],
     [view(back_off(), last=exited(1), will_restart=True)], "OnFailure", "Running"),
    ("OnFailure: one exited 0, one restarting after a failure", [],
     [view(exited(0)), view(back_off(), last=exited(2), will_restart=True, name="side")],
     "OnFailure", "Running"),
    ("init running", [view(running(), name="init")], [view(creating())], "Always", "Pending"),
    ("init not started", [view(creating(), name="init")], [view(creating())], "Never",
     "Pending"),
    ("first init done, second running",
     [view(exited(0), name="init-1"), view(running(), name="init-2")], [view(creating())],
     "Always", "Pending"),
    ("init done, container running", [view(exited(0), name="init")], [view(running())],
     "Always", "Running"),
    ("init done, container succeeded", [view(exited(0), name="init")], [view(exited(0))],
     "Never", "Succeeded"),
    ("Never: init failed", [view(exited(1), name="init")], [view(creating())], "Never",
     "Failed"),
    ("OnFailure: init failed, restart planned",
     [view(exited(1), will_restart=True, name="init")], [view(creating())], "OnFailure",
     "Pending"),
    ("OnFailure: init failed, restart due",
     [view(back_off(), last=exited(1), will_restart=True, name="init")], [view(creating())],
     "OnFailure", "Pending"),
    ("Always: init failed, restart due",
     [view(back_off(), last=exited(1), will_restart=True, name="init")], [view(creating())],
     "Always", "Pending"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("init", "containers", "restart_policy", "expected"),
    [case[1:] for case in PHASES],
    ids=[case[0] for case in PHASES],
)
def test_phase_follows_the_kubelets_rules(
    init: list[ContainerView], containers: list[ContainerView], restart_policy: str,
    expected: str,
) -> None:  # fmt: skip
    assert phase(init, containers, restart_policy) == expected


def status_of(init: list[ContainerView], containers: list[ContainerView], **kwargs: Any) -> Any:
    arguments: dict[str, Any] = {
        "restart_policy": "Always", "volumes_ready": True, "pod_ip": "10.244.0.7",
        "host_ip": "127.0.0.1", "start_time": EARLIER, "now": NOW,
    }  # fmt: skip
    return pod_status(init=init, containers=containers, **{**arguments, **kwargs})


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    return {c["type"]: (c["status"], c.get("reason")) for c in status["conditions"]}


def test_ready_needs_every_container_ready() -> None:
    one_unready = status_of([], [view(running(), ready=True), view(running(), name="side")])
    assert conditions(one_unready) == {
        "PodReadyToStartContainers": ("True", None),
        "Initialized": ("True", None),
        "ContainersReady": ("False", "ContainersNotReady"),
        "Ready": ("False", "ContainersNotReady"),
    }
    all_ready = status_of([], [view(running(), ready=True), view(running(), ready=True)])
    assert conditions(all_ready)["Ready"] == ("True", None)
    assert conditions(all_ready)["ContainersReady"] == ("True", None)


def test_initialized_waits_for_every_init_container_to_succeed() -> None:
    status = status_of([view(exited(0), name="a"), view(running(), name="b")], [view(creating())])
    assert conditions(status)["Initialized"] == ("False", "ContainersNotInitialized")
    assert [c["name"] for c in status["initContainerStatuses"]] == ["a", "b"]
    done = status_of([view(exited(0), name="a")], [view(running())])
    assert conditions(done)["Initialized"] == ("True", None)


def test_no_pod_ip_until_the_volumes_are_set_up() -> None:
    status = status_of([], [view(creating())], volumes_ready=False)
    assert conditions(status)["PodReadyToStartContainers"] == ("False", None)
    assert "podIP" not in status and "podIPs" not in status
    assert status["hostIP"] == "127.0.0.1"
    ready = status_of([], [view(creating())])
    assert ready["podIP"] == "10.244.0.7" and ready["podIPs"] == [{"ip": "10.244.0.7"}]


def test_a_condition_keeps_its_transition_time_until_its_status_changes() -> None:
    first = status_of([], [view(running())], now=EARLIER)
    later = status_of([], [view(running())], previous_conditions=first["conditions"])
    assert {c["lastTransitionTime"] for c in later["conditions"]} == {EARLIER}
    flipped = status_of([], [view(running(), ready=True)], previous_conditions=first["conditions"])
    times = {c["type"]: c["lastTransitionTime"] for c in flipped["conditions"]}
    assert times["Ready"] == NOW and times["ContainersReady"] == NOW
    assert times["Initialized"] == EARLIER


def test_container_status_carries_id_restarts_and_last_state() -> None:
    restarted = view(running(), last=exited(137), ready=True)
    restarted.restart_count = 2
    restarted.container_id = "kubeinfer-local://4242"
    [status] = status_of([], [restarted])["containerStatuses"]
    assert status == {
        "name": "main",
        "image": "ghcr.io/kubeinfer/kubeinfer-runtime:0.1.0",
        "imageID": "kubeinfer-local://ghcr.io/kubeinfer/kubeinfer-runtime:0.1.0",
        "state": running(),
        "lastState": exited(137),
        "ready": True,
        "restartCount": 2,
        "started": False,
        "containerID": "kubeinfer-local://4242",
    }


def test_a_container_never_started_has_no_container_id() -> None:
    [status] = status_of([], [view(creating())])["containerStatuses"]
    assert "containerID" not in status
    assert status["state"] == creating() and status["restartCount"] == 0
