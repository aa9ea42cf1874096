"""The node's kubelet and kube-proxy: their configuration files.

The kubelet runs with the cgroupfs driver under a cgroup root of the cluster's own (two
clusters side by side never share one), keeps its pods, logs and plugins in the cluster's
directory, and authenticates the API server by the cluster's CA. What this machine needs,
found by trying: `failCgroupV1: false` (cgroups are v1 here), `oomScoreAdj: 0` (lowering
it needs a privilege the machine withholds), and no image garbage collection or disk
eviction, since the node's images cannot be pulled again. GPUs are an extended resource
the node advertises (`nvidia.com/gpu`), with no device behind it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubeinfer.cluster.netns import DNS_SERVICE_ADDRESS, NODE_ADDRESS, POD_SUBNET

KUBELET_PORT = 10250
NODE_NAME = "kubeinfer-node"


def kubelet_configuration(
    directory: Path, ca_file: Path, cert: Path, key: Path, runtime_socket: Path, cgroup_root: str
) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_ADDRESS,
        "port": KUBELET_PORT,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "readOnlyPort": 0,
        "tlsCertFile": str(cert),
        "tlsPrivateKeyFile": str(key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failCgroupV1": False,
        "failSwapOn": False,
        "oomScoreAdj": 0,
        "clusterDNS": [DNS_SERVICE_ADDRESS],
        "clusterDomain": "cluster.local",
        "resolvConf": str(directory / "resolv.conf"),
        "podLogsDir": str(directory / "pod-logs"),
        "podCIDR": POD_SUBNET,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "0%",
            "imagefs.available": "0%",
        },
        "localStorageCapacityIsolation": False,
        "serializeImagePulls": False,
        "syncFrequency": "10s",
        "fileCheckFrequency": "20s",
        "nodeStatusUpdateFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "protectKernelDefaults": False,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "maxPods": 110,
    }


def kubelet_argv(
    kubelet: Path, directory: Path, config: Path, kubeconfig: Path, node_labels: dict[str, str]
) -> list[str]:
    labels = ",".join(f"{k}={v}" for k, v in sorted(node_labels.items()))
    return [
        str(kubelet),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={directory / 'root'}",
        f"--cert-dir={directory / 'pki'}",
        f"--node-ip={NODE_ADDRESS}",
        f"--hostname-override={NODE_NAME}",
        *([f"--node-labels={labels}"] if labels else []),
        "--v=1",
    ]


def kube_proxy_configuration(kubeconfig: Path) -> dict[str, Any]:
    """iptables mode inside the node's namespace; conntrack left as the kernel has it (its
    limits are not the namespace's to set)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": POD_SUBNET,
        "bindAddress": "0.0.0.0",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"masqueradeAll": False, "syncPeriod": "10s", "minSyncPeriod": "0s"},
    }
