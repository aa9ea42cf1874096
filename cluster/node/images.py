"""Which images the node can run, and as what command.

There is no container runtime here: the node runs an image only when it knows what the
image's entrypoint is on this machine. kubeinfer's own images (`ghcr.io/kubeinfer/…`, the
Dockerfile's targets) run the `kubeinfer` console script of the Python environment the node
agent runs in, with the image's entrypoint, default command and environment as the
Dockerfile sets them; `--image NAME=PROGRAM` adds others (a path or a console script).
Any other image fails the way a kubelet reports an image it cannot pull.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ImageConfig:
    """An image's ENTRYPOINT, CMD and ENV (what `docker inspect` would show)."""

    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


PYTHON_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "HOME": "/tmp"}
SERVE_HELP = ("serve", "--help")
KNOWN_IMAGES: dict[str, ImageConfig] = {
    "ghcr.io/kubeinfer/kubeinfer-operator": ImageConfig(("kubeinfer",), ("operator",), PYTHON_ENV),
    "ghcr.io/kubeinfer/kubeinfer-runtime": ImageConfig(("kubeinfer",), SERVE_HELP, PYTHON_ENV),
    "ghcr.io/kubeinfer/kubeinfer-runtime-gpu": ImageConfig(("kubeinfer",), SERVE_HELP, PYTHON_ENV),
}
"""The Dockerfile's targets, by repository (any tag or digest)."""


def repository(image: str) -> str:
    """The image reference without its tag or digest."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


class UnknownImage(LookupError):
    """The node cannot run this image; the message is the kubelet's pull error."""


def image_config(image: str, extra: Mapping[str, ImageConfig] | None = None) -> ImageConfig:
    known = {**KNOWN_IMAGES, **(extra or {})}
    config = known.get(repository(image)) or known.get(image)
    if config is None:
        raise UnknownImage(
            f'Failed to pull image "{image}": this node runs no container runtime, only the '
            f"images it maps to local programs ({', '.join(sorted(known))})"
        )
    return config


def container_argv(container: Mapping[str, object], config: ImageConfig) -> list[str]:
    """The process' argv as a container runtime composes it: `command` replaces the
    entrypoint (and drops the image's CMD), `args` replace the CMD. An empty list is no
    list (the API server never stores one, and the CRI runtimes treat it as unset)."""
    command = container.get("command")
    args = container.get("args")
    if command:
        return [*command, *(args or [])]  # type: ignore[misc]
    return [*config.entrypoint, *(args or config.cmd)]  # type: ignore[misc]
