"""Files of this machine made reachable to the cluster's pods, over HTTP.

A pod sees its image and its volumes, never the machine's files, and the restricted Pod
Security level it runs under allows no hostPath: so a model that is a file here (a
`file://` source of `kubeinfer up`, a test's model) is served to the pods instead. The
cluster runs Python's own HTTP file server inside its namespace, on the node's address,
over a folder of links: `publish` links one file (with the files beside it that an ONNX
model's external data may name) or one folder there and returns its URL. Nothing is
served that was not published.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from kubeinfer.cluster.netns import NODE_ADDRESS

PORT = 8180
FOLDER = "files"


def server_argv(directory: Path) -> list[str]:
    root = directory / FOLDER
    root.mkdir(parents=True, exist_ok=True)
    return [sys.executable, "-m", "http.server", str(PORT), "--bind", NODE_ADDRESS,
            "--directory", str(root)]  # fmt: skip


def publish(directory: Path, path: Path) -> str:
    """The URL at which the cluster's pods read `path` (a file, served with the other
    files of its folder, or a folder); the same path gets the same URL."""
    path = path.resolve()
    folder = path if path.is_dir() else path.parent
    token = hashlib.sha256(str(folder).encode()).hexdigest()[:16]
    link = directory / FOLDER / token
    if not link.is_symlink():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(folder, target_is_directory=True)
    suffix = "" if path.is_dir() else f"/{path.name}"
    return f"http://{NODE_ADDRESS}:{PORT}/{token}{suffix}"
