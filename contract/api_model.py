"""The base of every API and config model: `ApiModel`, and the cross-field rules it checks.

Both planes build on it: the operator's InferenceDeployment models
(`kubeinfer.operator.api.v1alpha1`) and the runtime's own config and engine manifest. An
`ApiModel` is camelCase on the wire, refuses unknown fields, is immutable once validated,
takes its field docstrings as descriptions (the CRD's, which `kubectl explain` prints),
and validates integers, numbers and booleans as strictly as the API server does.

Cross-field rules are declared once as `CrossFieldRule`s: the same rule yields the CRD's
CEL `x-kubernetes-validations` entry and the pydantic check, with one message, so the API
server, `kubeinfer validate` and the operator reject a manifest in the same words.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import CoreSchema


class CrossFieldRuleViolation(ValueError):
    """A cross-field rule did not hold; `field` is the camelCase path below the model."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class CrossFieldRule:
    """One rule over several fields of a model, checked by the API server and by pydantic.

    `cel` is evaluated by the API server with `self` bound to the model's object; `holds`
    is the same predicate over the pydantic instance. `field` (camelCase, dotted, relative
    to the model) is where the error is reported, in both places.
    """

    cel: str
    message: str
    field: str
    holds: Callable[[Any], bool]

    def to_schema(self) -> dict[str, str]:
        return {"rule": self.cel, "message": self.message, "fieldPath": f".{self.field}"}


STRICT_SCALARS = frozenset({"int", "float", "bool"})
"""Core-schema types validated strictly: as the API server's structural schema does, an
integer field refuses `"2"`, `true` and `2.5`, a number refuses `"0.5"` (an integer is a
number), and a boolean refuses `"yes"` and `1`. Strings already refuse numbers; enums,
dates and nested models keep reading their JSON forms."""


def _strict_scalars(schema: Any) -> None:
    """Marks every int, float and bool node of a pydantic core schema strict, in place."""
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if isinstance(node.get("type"), str) and node["type"] in STRICT_SCALARS:
                node["strict"] = True
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)


class ApiModel(BaseModel):
    """Base of every API and config model: camelCase on the wire, unknown fields refused,
    immutable once validated, field docstrings used as descriptions, and integers,
    numbers and booleans of the JSON type only (see STRICT_SCALARS): pydantic's lax mode
    would take `replicas: "2"` or `true` that the CRD refuses, so `kubeinfer validate`
    would pass what `kubectl apply` fails."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        validate_default=True,
    )

    cross_field_rules: ClassVar[tuple[CrossFieldRule, ...]] = ()

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[BaseModel], handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        schema = handler(source)
        _strict_scalars(schema)
        return schema

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.cross_field_rules:
            extra = cls.model_config.get("json_schema_extra") or {}
            validations: list[Any] = [r.to_schema() for r in cls.cross_field_rules]
            assert isinstance(extra, dict)
            cls.model_config = {
                **cls.model_config,
                "json_schema_extra": {
                    **extra,
                    "x-kubernetes-validations": validations,
                },
            }

    @model_validator(mode="after")
    def _check_cross_field_rules(self) -> Self:
        for rule in self.cross_field_rules:
            if not rule.holds(self):
                raise CrossFieldRuleViolation(rule.message, rule.field)
        return self

    def to_wire(self) -> dict[str, Any]:
        """The camelCase JSON form, without unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
