"""The metadata of an InferenceDeployment manifest, typed as the API server types it.

`kubeinfer render` copies name, namespace and uid into every child (names, labels,
ownerReferences) and the operator reads annotations (the shadow gate), so these are
checked with the types and limits of Kubernetes' ObjectMeta: a list where the uid
belongs, a label value of 64 characters or an unknown metadata field is refused with its
path, as `kubectl apply` (strict field validation) refuses it, instead of being copied.
The CRD cannot constrain metadata beyond the name; ROOT_RULES are its CEL rules for it.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Self

from kubeinfer.contract.api_model import ApiModel
from kubeinfer.operator.api.v1alpha1.patterns import (
    DNS1035_LABEL,
    DNS1123_LABEL,
    QUALIFIED_NAME,
)
from pydantic import Field, field_validator, model_validator

OWNER_NAME_LENGTH = 52
"""Longest InferenceDeployment name: its longest fixed-suffix child name
(`<name>-candidate`) then stays within 63 characters, the limit of a label value and of
a Service's name (see `reconcile.names`)."""

ANNOTATIONS_TOTAL_BYTES = 256 * 1024
"""The API server's limit on the keys and values of an object's annotations together."""

NAME_LENGTH_MESSAGE = (
    f"metadata.name must be at most {OWNER_NAME_LENGTH} characters, so that the names of "
    "its children stay valid"
)
NAME_FORM_MESSAGE = (
    "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting "
    "with a letter), since the Service that serves it takes its name"
)
ROOT_RULES = (
    {"rule": f"size(self.metadata.name) <= {OWNER_NAME_LENGTH}", "message": NAME_LENGTH_MESSAGE},
    {"rule": f"self.metadata.name.matches('{DNS1035_LABEL}')", "message": NAME_FORM_MESSAGE},
)
"""The CRD's rules on metadata (the root's x-kubernetes-validations); `ObjectMeta` checks
the name with the same messages."""

QualifiedName = Annotated[str, Field(pattern=QUALIFIED_NAME, max_length=317)]
LabelValue = Annotated[
    str, Field(pattern=r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$", max_length=63)
]


class OwnerReference(ApiModel):
    """An ownerReference, as in a copy of an object read from the cluster."""

    api_version: str = Field(max_length=253)
    """The owner's apiVersion."""

    kind: str = Field(max_length=63)
    """The owner's kind."""

    name: str = Field(max_length=253)
    """The owner's name."""

    uid: str = Field(max_length=128)
    """The owner's uid."""

    controller: bool | None = None
    """Whether the owner is the managing controller."""

    block_owner_deletion: bool | None = None
    """Whether the owner's deletion waits for this object's."""


class ObjectMeta(ApiModel):
    """Standard object metadata (core/v1 ObjectMeta), with the name limited further."""

    name: str
    """The object's name: a DNS-1035 label (it starts with a letter, since the Service
    that serves the model takes this name) of at most 52 characters, so that child names
    with suffixes stay valid."""

    @field_validator("name")
    @classmethod
    def _name_as_the_crd_says(cls, name: str) -> str:
        if len(name) > OWNER_NAME_LENGTH:
            raise ValueError(NAME_LENGTH_MESSAGE)
        if re.fullmatch(DNS1035_LABEL, name) is None:
            raise ValueError(NAME_FORM_MESSAGE)
        return name

    generate_name: str | None = Field(default=None, max_length=253)
    """A prefix for a server-generated name (the name above is still required here)."""

    namespace: str | None = Field(default=None, pattern=DNS1123_LABEL, max_length=63)
    """The object's namespace; `default` when unset."""

    uid: str | None = Field(default=None, min_length=1, max_length=128)
    """Set by the API server; `kubeinfer render` copies it into ownerReferences."""

    resource_version: str | None = Field(default=None, max_length=128)
    """Set by the API server."""

    generation: int | None = Field(default=None, ge=0)
    """Set by the API server."""

    creation_timestamp: datetime | None = None
    """Set by the API server."""

    deletion_timestamp: datetime | None = None
    """Set by the API server."""

    deletion_grace_period_seconds: int | None = Field(default=None, ge=0)
    """Set by the API server."""

    self_link: str | None = Field(default=None, max_length=2048)
    """Deprecated; set by old API servers."""

    labels: dict[QualifiedName, LabelValue] = Field(default_factory=dict)
    """Labels: keys are qualified names, values at most 63 characters."""

    annotations: dict[QualifiedName, str] = Field(default_factory=dict)
    """Annotations: keys are qualified names; keys and values together at most 256 KiB."""

    finalizers: list[QualifiedName] = Field(default_factory=list)
    """Finalizers."""

    owner_references: list[OwnerReference] = Field(default_factory=list)
    """Owners of this object."""

    managed_fields: list[dict[str, Any]] = Field(default_factory=list)
    """Server-side apply's field ownership, as in a copy read from the cluster."""

    @model_validator(mode="after")
    def _annotations_fit(self) -> Self:
        size = sum(len(k.encode()) + len(v.encode()) for k, v in self.annotations.items())
        if size > ANNOTATIONS_TOTAL_BYTES:
            raise ValueError(
                f"annotations hold {size} bytes; the API server accepts at most "
                f"{ANNOTATIONS_TOTAL_BYTES}"
            )
        return self
