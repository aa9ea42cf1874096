"""The node's container runtime: containerd 2 with runc and the CNI reference plugins.

Everything containerd keeps is under the cluster's directory (its root, its state, its
socket, the pods' network namespace mounts and the CNI plugins' address leases), so two
clusters run side by side and `cluster down` finds all of it. What this machine needs,
found by trying: lowering an OOM score needs a privilege the machine withholds
(`restrict_oom_score_adj`), NRI is off (its socket has one fixed path per machine), and
the sandbox image is the node's own `pause`, since no registry is reachable.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kubeinfer.cluster.netns import NODE_ADDRESS, NODE_BRIDGE, POD_SUBNET

NAMESPACE = "k8s.io"
"""containerd's namespace for what the CRI plugin runs (and where images must be)."""
PAUSE_IMAGE = "localhost/kubeinfer/pause:1"


@dataclass(frozen=True)
class ContainerdPaths:
    directory: Path

    @property
    def config(self) -> Path:
        return self.directory / "config.toml"

    @property
    def socket(self) -> Path:
        return self.directory / "containerd.sock"

    @property
    def root(self) -> Path:
        return self.directory / "root"

    @property
    def state(self) -> Path:
        return self.directory / "state"

    @property
    def cni_config_directory(self) -> Path:
        return self.directory / "cni" / "net.d"

    @property
    def cni_leases(self) -> Path:
        return self.directory / "cni" / "leases"


def _string(value: object) -> str:
    """A TOML basic string (JSON's escapes are TOML's for these values)."""
    return json.dumps(str(value))


def containerd_config(paths: ContainerdPaths, runc: Path, cni_bin_dir: Path) -> str:
    """containerd's configuration (version 3, containerd 2's)."""
    cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""version = 3
root = {_string(paths.root)}
state = {_string(paths.state)}
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp",
                    "io.containerd.internal.v1.tracing"]

[grpc]
  address = {_string(paths.socket)}

[ttrpc]
  address = {_string(f"{paths.socket}.ttrpc")}

[plugins.'io.containerd.internal.v1.opt']
  path = {_string(paths.directory / "opt")}

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = {_string(PAUSE_IMAGE)}

[{cri_runtime}]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false
  cdi_spec_dirs = []
  enable_criu = false
  [{cri_runtime}.containerd]
    default_runtime_name = "runc"
    [{cri_runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri_runtime}.containerd.runtimes.runc.options]
        BinaryName = {_string(runc)}
        Root = {_string(paths.state / "runc")}
        SystemdCgroup = false
  [{cri_runtime}.cni]
    bin_dirs = [{_string(cni_bin_dir)}]
    conf_dir = {_string(paths.cni_config_directory)}
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def cni_config(paths: ContainerdPaths) -> dict[str, object]:
    """One bridge for the node's pods: addresses from the pod subnet (leases kept in the
    cluster's directory), the node's address as their gateway, hairpin so a pod reaches
    itself through its Service."""
    return {
        "cniVersion": "1.0.0",
        "name": "kubeinfer",
        "plugins": [
            {
                "type": "bridge",
                "bridge": NODE_BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_ADDRESS}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(paths.cni_leases),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def write_configuration(paths: ContainerdPaths, runc: Path, cni_bin_dir: Path) -> None:
    paths.directory.mkdir(parents=True, exist_ok=True)
    paths.config.write_text(containerd_config(paths, runc, cni_bin_dir))
    paths.cni_config_directory.mkdir(parents=True, exist_ok=True)
    (paths.cni_config_directory / "10-kubeinfer.conflist").write_text(
        json.dumps(cni_config(paths), indent=2) + "\n"
    )


def import_images(
    ctr: Path,
    paths: ContainerdPaths,
    archives: Iterable[Path],
    command: Callable[[list[str]], list[str]],
    progress: Callable[[str], None],
) -> None:
    """Imports each OCI archive into the CRI plugin's namespace, so pods run them with no
    registry (their pull policy finds them present)."""
    for archive in archives:
        started = time.monotonic()
        argv = [str(ctr), "--address", str(paths.socket), "--namespace", NAMESPACE,
                "images", "import", "--no-unpack=false", "--local", str(archive)]  # fmt: skip
        result = subprocess.run(
            command(argv), capture_output=True, text=True, timeout=600, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"importing {archive.name} into containerd: {result.stderr[-2000:]}")
        progress(f"imported {archive.name} ({time.monotonic() - started:.1f} s)")
