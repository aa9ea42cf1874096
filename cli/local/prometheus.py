"""Prometheus for `kubeinfer up`, discovering the runtime pods as a cluster's Prometheus
does: Kubernetes service discovery (role pod) against the local API server,
as its own ServiceAccount, keeping the pods whose `prometheus.io/scrape` annotation says
so (the operator sets it when no PodMonitor API exists) at the port and path their
annotations name, labelled with `namespace` and `pod` as the operator's queries expect.
The binary is upstream's, built with Kubernetes discovery by `kubeinfer cluster build`
(Debian's package has none). `kubeinfer up` starts it in the session's network namespace,
on the node's address, where it reaches the API server and the pods directly and the
operator's pod reaches it, and forwards a port of the host's namespace to it for the user."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SCRAPE_INTERVAL = "2s"


def prometheus_binary() -> tuple[str | None, str]:
    """The binary, or None and why not (a build that failed: the session goes on with the
    operator's direct read of the pods)."""
    from kubeinfer.cluster.binaries import BuildError, ensure_prometheus

    try:
        return str(ensure_prometheus()), ""
    except BuildError as error:
        return None, str(error).splitlines()[0]


def kubernetes_sd_config(
    server: str, ca_file: Path, token_file: Path, interval: str = SCRAPE_INTERVAL
) -> dict[str, Any]:
    """prometheus.yml: the annotated pods of every namespace."""
    annotation = "__meta_kubernetes_pod_annotation_prometheus_io_"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": "kubernetes-pods",
                "kubernetes_sd_configs": [
                    {
                        "role": "pod",
                        "api_server": server,
                        "tls_config": {"ca_file": str(ca_file)},
                        "authorization": {"credentials_file": str(token_file)},
                    }
                ],
                "relabel_configs": [
                    {"source_labels": [f"{annotation}scrape"], "action": "keep", "regex": "true"},
                    {
                        "source_labels": ["__meta_kubernetes_pod_phase"],
                        "action": "keep",
                        "regex": "Running",
                    },
                    {
                        "source_labels": [f"{annotation}path"],
                        "target_label": "__metrics_path__",
                        "regex": "(.+)",
                    },
                    {
                        "source_labels": ["__meta_kubernetes_pod_ip", f"{annotation}port"],
                        "regex": r"(.+);(\d+)",
                        "replacement": "$1:$2",
                        "target_label": "__address__",
                    },
                    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                ],
            }
        ],
    }


def write_config(path: Path, server: str, ca_file: Path, token_file: Path) -> Path:
    path.write_text(yaml.safe_dump(kubernetes_sd_config(server, ca_file, token_file)))
    return path


def command(binary: str, config: Path, data: Path, address: str) -> list[str]:
    """Prometheus listening at `address` (host:port)."""
    return [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        f"--web.listen-address={address}",
        "--storage.tsdb.retention.time=1d",
        "--log.level=warn",
    ]
