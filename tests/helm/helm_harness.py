"""The real `helm` (v4, built from its Go module by `kubeinfer cluster build` and cached,
see `kubeinfer.cluster.binaries.ensure_helm`) run on the chart as a user runs it, and the
checks every rendering of the chart must pass.

`Helm` keeps Helm's own config, cache and data folders in a temporary directory, so a
test reads nothing of the user's (repositories, plugins) and leaves nothing behind.
Values are passed as files (`-f`), as typed YAML; `--set` is what the refusal tests use,
as a user would type it.

The rendered objects are checked against the schemas of what will serve them: the
built-in kinds with `kubernetes-validate` (strict: an unknown field is an error) at the
control plane's Kubernetes release, PodMonitor and PrometheusRule with the
openAPIV3Schema of prometheus-operator's own CRDs (`prometheus_operator_crds`), made
strict the same way.
"""

from __future__ import annotations

import copy
import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from kubeinfer.cluster import binaries

REPO = Path(__file__).parents[2]
CHART = REPO / "helm" / "kubeinfer"
KUBE_VERSION = binaries.pinned_versions().kubernetes
"""The control plane's release: what `helm template` assumes the cluster runs."""
SCHEMA_VERSION = ".".join(KUBE_VERSION.lstrip("v").split(".")[:2]) + ".0"
KubeObject = dict[str, Any]


@dataclass(frozen=True)
class Helm:
    binary: Path
    home: Path
    kubeconfig: Path | None = None

    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        env.pop("KUBECONFIG", None)
        if self.kubeconfig:
            env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def run(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result

    def values_file(self, values: Mapping[str, Any], name: str = "values") -> Path:
        path = self.home / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(dict(values)))
        return path

    def template(
        self, values: Mapping[str, Any], release: str = "rel", namespace: str = "ops"
    ) -> list[KubeObject]:
        """The objects `helm template` renders with `values`."""
        rendered = self.run(
            "template", release, str(CHART), "--namespace", namespace,
            "--kube-version", KUBE_VERSION, "-f", str(self.values_file(values)),
        )  # fmt: skip
        return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


@cache
def helm_binary() -> Path:
    return binaries.ensure_helm()


def merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` over `base`, maps merged key by key (Helm's coalescing of values)."""
    result = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


# -- schemas of what the chart renders -------------------------------------------------------


def _strict(schema: Any) -> Any:
    """A CRD's openAPIV3Schema that refuses unknown fields, as the API server's strict
    field validation does: every object node with properties and nothing free-form gets
    `additionalProperties: false`."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in result
        and "additionalProperties" not in result
        and not result.get("x-kubernetes-preserve-unknown-fields")
    ):
        result["additionalProperties"] = False
    return result


@cache
def custom_resource_schema(kind: str) -> dict[str, Any]:
    """The strict served schema of a prometheus-operator kind, from its own CRD."""
    from prometheus_operator_crds import crd_file

    plural = {"PodMonitor": "podmonitors", "PrometheusRule": "prometheusrules"}[kind]
    crd = yaml.safe_load(crd_file(plural).read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strict(served["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # checked as ObjectMeta below
    return schema


def validate(obj: KubeObject) -> None:
    """Raises when `obj` is not what the API server would accept (strict fields)."""
    if obj["apiVersion"] == "monitoring.coreos.com/v1":
        # Not checked as a schema first: the CRDs' patterns are Go's (RE2), some of which
        # Python's re would not compile; those fields are not set by the chart.
        jsonschema.Draft7Validator(custom_resource_schema(obj["kind"])).validate(obj)
        meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
        kubernetes_validate.validate(meta, SCHEMA_VERSION, strict=True)
        return
    kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)


def by_kind(objects: list[KubeObject]) -> dict[str, list[KubeObject]]:
    found: dict[str, list[KubeObject]] = {}
    for obj in objects:
        found.setdefault(obj["kind"], []).append(obj)
    return found


def env_of(container: KubeObject) -> dict[str, str]:
    """A container's plain environment (the downward API's entries left out)."""
    return {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}


def names(objects: list[KubeObject]) -> Iterator[tuple[str, str, str]]:
    for obj in objects:
        yield obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
