"""`runtime.grpcPort`: the serving runtime's config asks `kubeinfer serve` for gRPC on that
port, its pods name it `grpc`, and its Service exposes it (valid Kubernetes objects);
unset, none of them mentions gRPC. The CRD's rule keeps it off the ports already taken.
"""

from __future__ import annotations

import pytest
import yaml
from decide_scenarios import DIGEST_A, Cluster, make_spec, validate_kubernetes
from kubeinfer.contract.runtime_config import RuntimeConfig
from kubeinfer.operator.reconcile.desired import CONFIG_KEY, HTTP_PORT, METRICS_SERVICE_PORT


def served(**runtime: object) -> Cluster:
    cluster = Cluster(make_spec(runtime=runtime) if runtime else make_spec())
    cluster.build_to_ready(DIGEST_A)
    return cluster


def test_a_grpc_port_is_served_by_the_pods_and_exposed_by_the_service() -> None:
    cluster = served(grpcPort=8001)
    config = yaml.safe_load(cluster.get("ConfigMap")["data"][CONFIG_KEY])
    assert RuntimeConfig.model_validate(config).grpc_port == 8001
    deployment, service = cluster.get("Deployment"), cluster.get("Service")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "grpc", "containerPort": 8001, "protocol": "TCP"} in container["ports"]
    assert {"name": "grpc", "port": 8001, "targetPort": "grpc", "protocol": "TCP"} in service[
        "spec"
    ]["ports"]
    validate_kubernetes(deployment)
    validate_kubernetes(service)


def test_without_a_grpc_port_nothing_mentions_grpc() -> None:
    cluster = served()
    assert "grpcPort" not in yaml.safe_load(cluster.get("ConfigMap")["data"][CONFIG_KEY])
    for kind in ("Deployment", "Service"):
        assert "grpc" not in yaml.safe_dump(cluster.get(kind))


@pytest.mark.parametrize("taken", [HTTP_PORT, METRICS_SERVICE_PORT])
def test_the_ports_already_taken_are_refused(taken: int) -> None:
    """The rule's figures are the ports desired.py gives HTTP and metrics."""
    with pytest.raises(ValueError, match="grpcPort must differ"):
        make_spec(runtime={"grpcPort": taken})
