"""Assembles the CustomResourceDefinition from the models and the resource descriptor,
and renders it as the YAML committed in `crds/`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubeinfer.operator.api.v1alpha1 import resource
from kubeinfer.operator.api.v1alpha1.inference_deployment import (
    InferenceDeploymentSpec,
    InferenceDeploymentStatus,
)
from kubeinfer.operator.api.v1alpha1.metadata import ROOT_RULES
from kubeinfer.operator.crdgen.structural import to_structural
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import core_schema


class _ApiServerDefaults(GenerateJsonSchema):
    """Emits defaults for `default_factory` fields, which pydantic leaves out.

    Without them the API server would not default a missing `runtime` or `engine`, and a
    CEL rule such as `self.runtime.batching.maxBatchSize <= ...` would fail to evaluate on
    a manifest that omits them. A nested model defaults to its whole default object, not
    `{}`: kube-apiserver checks each default against the schema's CEL rules as written,
    without filling in the nested fields' own defaults first, so a rule such as
    `self.minReplicas <= self.maxReplicas` refuses a `{}` default ("no such key") and with
    it the whole CRD.
    """

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and "default" not in schema:
            value = factory()  # type: ignore[call-arg]
            if isinstance(value, BaseModel):
                return value.model_dump(mode="json", by_alias=True, exclude_none=True)
            return value
        return super().get_default_value(schema)


CRD_FILE = Path("crds") / f"{resource.CRD_NAME}.yaml"
HELM_CRD_FILE = Path("helm") / "kubeinfer" / "crds" / f"{resource.CRD_NAME}.yaml"


def _schema_of(model: type[Any], description: str) -> dict[str, Any]:
    schema = to_structural(
        model.model_json_schema(
            by_alias=True, mode="validation", schema_generator=_ApiServerDefaults
        )
    )
    schema["description"] = description
    return schema


def build_crd() -> dict[str, Any]:
    """The CRD as a dict (apiextensions.k8s.io/v1)."""
    spec_schema = _schema_of(InferenceDeploymentSpec, "The desired state of the deployment.")
    status_schema = _schema_of(
        InferenceDeploymentStatus, "The observed state, written only by the operator."
    )
    # Status defaults would make the API server invent a status the operator never wrote.
    _strip_defaults(status_schema)
    root = {
        "type": "object",
        "description": "InferenceDeployment serves one ONNX model on Kubernetes: it builds "
        "(or pins) an optimised engine, runs dynamic-batching runtime pods, shadow-tests new "
        "versions and autoscales on requests in progress and GPU memory.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
        "x-kubernetes-validations": [dict(rule) for rule in ROOT_RULES],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": resource.CRD_NAME,
            "labels": {"app.kubernetes.io/name": "kubeinfer"},
        },
        "spec": {
            "group": resource.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": resource.KIND,
                "listKind": f"{resource.KIND}List",
                "plural": resource.PLURAL,
                "singular": resource.SINGULAR,
                "shortNames": resource.SHORT_NAMES,
                "categories": resource.CATEGORIES,
            },
            "versions": [
                {
                    "name": resource.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {"status": {}, "scale": resource.SCALE_SUBRESOURCE},
                    "additionalPrinterColumns": resource.PRINTER_COLUMNS,
                }
            ],
        },
    }


def _strip_defaults(node: dict[str, Any]) -> None:
    node.pop("default", None)
    for child in node.get("properties", {}).values():
        _strip_defaults(child)
    if isinstance(node.get("items"), dict):
        _strip_defaults(node["items"])


class _PlainDumper(yaml.SafeDumper):
    """Writes a list the schema shares (an enum's values) in full at every use: YAML
    anchors and aliases are valid, but a CRD is read by people and by tools that do not
    all follow them."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render_crd_yaml() -> str:
    """The exact text of `crds/inferencedeployments.kubeinfer.io.yaml`."""
    header = "# Generated by `kubeinfer crds` from kubeinfer.operator.api.v1alpha1: do not edit.\n"
    body = yaml.dump(build_crd(), Dumper=_PlainDumper, sort_keys=False, width=100)
    return header + body
