"""Validating manifests against the models, with errors that name the offending field.

`kubeinfer validate` and the operator both go through here, so a manifest is rejected
with the same field path and message offline and in the cluster's status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubeinfer.contract.api_model import CrossFieldRuleViolation
from kubeinfer.operator.api.v1alpha1.inference_deployment import (
    InferenceDeployment,
    InferenceDeploymentSpec,
)
from kubeinfer.operator.api.v1alpha1.resource import API_VERSION, KIND
from pydantic import ValidationError


@dataclass(frozen=True)
class FieldError:
    """One problem: `path` is the dotted camelCase path from the document's root."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class InvalidManifest(ValueError):
    """A document that is not a valid InferenceDeployment; carries every problem found."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors


def _join(path: list[str | int]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(document)"


def field_errors(error: ValidationError, prefix: tuple[str, ...] = ()) -> list[FieldError]:
    """Turns a pydantic error into field errors; a cross-field rule reports at its field."""
    result = []
    for detail in error.errors(include_url=False):
        path: list[str | int] = [*prefix, *detail["loc"]]
        message = detail["msg"]
        cause = (detail.get("ctx") or {}).get("error")
        if isinstance(cause, CrossFieldRuleViolation):
            path.extend(cause.field.split("."))
            message = str(cause)
        elif message.startswith("Value error, "):
            message = message.removeprefix("Value error, ")
        result.append(FieldError(_join(path), message))
    return result


def parse_inference_deployment(document: Any) -> InferenceDeployment:
    """Validates one parsed YAML/JSON document; raises InvalidManifest."""
    if not isinstance(document, dict):
        raise InvalidManifest([FieldError("(document)", "expected a mapping (an object)")])
    api_version, kind = document.get("apiVersion"), document.get("kind")
    if kind != KIND or api_version != API_VERSION:
        raise InvalidManifest(
            [
                FieldError(
                    "kind",
                    f"expected apiVersion {API_VERSION} and kind {KIND}, "
                    f"got apiVersion {api_version!r} and kind {kind!r}",
                )
            ]
        )
    try:
        return InferenceDeployment.model_validate(document)
    except ValidationError as error:
        raise InvalidManifest(field_errors(error)) from None


def parse_spec(spec: Any) -> InferenceDeploymentSpec:
    """Validates a spec read from the cluster; paths start at `spec`."""
    try:
        return InferenceDeploymentSpec.model_validate(spec)
    except ValidationError as error:
        raise InvalidManifest(field_errors(error, prefix=("spec",))) from None
