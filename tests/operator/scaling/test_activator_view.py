"""What the operator makes of the activator pods (state/activator_view.py): the ready
pods and their addresses (not ready, terminating or without an IP left out), each pod's
/v2/activator answer (a malformed one is that pod's error, never an exception), the held
requests of a route summed over the pods read, and an object routed only when every
ready pod has loaded its route, with the reason otherwise."""

from __future__ import annotations

from kubeinfer.operator.state.activator_view import ActivatorView, parse_wake, pod_of, ready_pods

ROUTE = ("ml", "resnet")


def pod(name: str, ip: str | None, ready: bool = True, leaving: bool = False) -> dict:
    metadata: dict = {"name": name}
    if leaving:
        metadata["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    status: dict = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": metadata, "status": status}


def test_only_ready_pods_with_an_address_count():
    pods = [pod("b", "10.0.0.2"), pod("a", "10.0.0.1"), pod("c", "10.0.0.3", ready=False),
            pod("d", "10.0.0.4", leaving=True), pod("e", None)]  # fmt: skip
    assert ready_pods(pods) == [("a", "10.0.0.1"), ("b", "10.0.0.2")]


def test_held_requests_sum_over_the_pods_and_routing_needs_every_pod():
    one = pod_of("a", "10.0.0.1", {"routes": [{"namespace": "ml", "service": "resnet", "held": 3}]})
    other = pod_of("b", "10.0.0.2", {"routes": [{"namespace": "ml", "service": "bert", "held": 1}]})
    view = ActivatorView((one, other))
    assert view.held(ROUTE) == 3
    assert "activator pod b has not loaded" in view.not_routing(ROUTE)
    both = ActivatorView(
        (one, pod_of("b", "10.0.0.2", {"routes": [{"namespace": "ml", "service": "resnet"}]}))
    )
    assert both.not_routing(ROUTE) == "" and both.held(ROUTE) == 3
    assert both.addresses() == ("10.0.0.1", "10.0.0.2")


def test_a_malformed_answer_is_the_pods_error_and_nothing_is_routed():
    for answer in ({"routes": "all"}, [], {"routes": [{"service": "resnet"}]},
                   {"routes": [{"namespace": "ml", "service": "resnet", "held": -2}]}):  # fmt: skip
        read = pod_of("a", "10.0.0.1", answer)
        assert read.error, answer
        view = ActivatorView((read,))
        assert view.held(ROUTE) is None
        assert "could not be read" in view.not_routing(ROUTE)
    assert "no activator pod is ready" in ActivatorView().not_routing(ROUTE)
    assert "could not be listed" in ActivatorView(error="403").not_routing(ROUTE)


def test_a_wake_is_a_namespace_and_a_service():
    assert parse_wake({"namespace": "ml", "service": "resnet"}) == ROUTE
    for bad in (
        None,
        [],
        {"namespace": "ml"},
        {"namespace": "", "service": "x"},
        {"namespace": 1, "service": "x"},
    ):
        assert parse_wake(bad) is None
