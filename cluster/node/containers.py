"""What a container's process is made of, on this node: its environment and its argv.

The environment is the image's (`images`), then `envFrom` and `env` in order, with
`$(VAR)` references expanded as Kubernetes expands them, downward-API fields (the pod's
own address included), resource fields, and keys of ConfigMaps and Secrets (a missing one
is a CreateContainerConfigError, in the kubelet's words); then the pod's mount paths are
rewritten to the node's (`paths`), and a pod with a service-account token gets
`KUBECONFIG`. The argv is the image's entrypoint and command as a container runtime
composes them, rewritten likewise; a console script runs through `pod_entry`, which
gives it the pod's address. The process dies with the node agent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import base64
import ctypes
import os
import re
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubeinfer.cluster.node import images
from kubeinfer.cluster.node.api import KubeObject, NodeApi
from kubeinfer.cluster.node.paths import PathMap
from kubeinfer.cluster.node.volumes import field_value

PR_SET_PDEATHSIG = 1
MESSAGE_LIMIT_BYTES = 4096
LOG_FALLBACK_LINES = 80
LOG_FALLBACK_BYTES = 2048
REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


class ConfigError(Exception):
    """A container's configuration refers to something missing (CreateContainerConfigError)."""


def die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when the node agent goes."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: a defined variable is replaced, an undefined
    reference is kept as written, and `$$` is a literal `$`."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return REFERENCE.sub(replace, text)


async def environment(
    spec: Mapping[str, Any],
    pod: KubeObject,
    paths: PathMap,
    extra_images: Mapping[str, images.ImageConfig],
    kubeconfig: Path | None,
    api: NodeApi,
) -> dict[str, str]:
    """The container's environment (see the module docstring); `pod` carries its IP."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    config = images.image_config(spec.get("image", ""), extra_images)
    env: dict[str, str] = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOSTNAME": name,
        **config.env,
    }
    for source in spec.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("configMapRef", "configmaps"), ("secretRef", "secrets")):
            if kind in source:
                data = await object_data(
                    api, namespace, key, source[kind]["name"], bool(source[kind].get("optional"))
                )
                env.update({prefix + k: v for k, v in data.items()})
    for item in spec.get("env") or []:
        if "value" in item or "valueFrom" not in item:
            env[item["name"]] = expand(str(item.get("value", "")), env)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            env[item["name"]] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            env[item["name"]] = resource_value(spec, source["resourceFieldRef"])
        else:
            kind = "configmaps" if "configMapKeyRef" in source else "secrets"
            ref = source.get("configMapKeyRef") or source.get("secretKeyRef") or {}
            data = await object_data(api, namespace, kind, ref["name"], bool(ref.get("optional")))
            if ref["key"] in data:
                env[item["name"]] = data[ref["key"]]
            elif not ref.get("optional"):
                what = "ConfigMap" if kind == "configmaps" else "Secret"  # the kubelet's words
                raise ConfigError(
                    f"couldn't find key {ref['key']} in {what} {namespace}/{ref['name']}"
                )
    env = {k: paths.apply(v) for k, v in env.items()}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return env


def resource_value(spec: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    kind, _, name = str(ref.get("resource", "")).partition(".")
    value = ((spec.get("resources") or {}).get(kind) or {}).get(name)
    return str(value if value is not None else os.cpu_count() if name == "cpu" else 0)


async def object_data(
    api: NodeApi, namespace: str, plural: str, name: str, optional: bool
) -> dict[str, str]:
    found = await api.get(f"/api/v1/namespaces/{namespace}/{plural}/{name}")
    if found is None:
        if optional:
            return {}
        raise ConfigError(f'{plural[:-1]} "{name}" not found')
    data = found.get("data") or {}
    if plural == "secrets":
        return {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}
    return dict(data)


def process_argv(
    spec: Mapping[str, Any],
    env: Mapping[str, str],
    paths: PathMap,
    pod_ip: str,
    extra_images: Mapping[str, images.ImageConfig],
) -> list[str]:
    """The process' argv: a path runs as it is, a console script through `pod_entry`."""
    config = images.image_config(spec.get("image", ""), extra_images)
    argv = [paths.apply(expand(str(a), env)) for a in images.container_argv(spec, config)]
    program, *args = argv
    if os.path.isabs(program):
        if not os.access(program, os.X_OK):
            raise OSError(f'exec: "{program}": no such file or executable')
        return argv
    return [sys.executable, "-m", "kubeinfer.cluster.node.pod_entry", pod_ip, program, *args]


def termination_message(message_file: Path, log_file: Path, policy: str, exit_code: int) -> str:
    """What the kubelet reports of an ended container: its termination message file (at
    most 4 KiB), else, with FallbackToLogsOnError after a failure, the end of its log."""
    try:
        data = message_file.read_bytes()[:MESSAGE_LIMIT_BYTES]
    except OSError:
        data = b""
    text = data.decode(errors="replace")
    if not text and exit_code != 0 and policy == "FallbackToLogsOnError":
        try:
            lines = log_file.read_bytes().decode(errors="replace").splitlines()
        except OSError:
            return text
        text = "\n".join(lines[-LOG_FALLBACK_LINES:])[-LOG_FALLBACK_BYTES:]
    return text
