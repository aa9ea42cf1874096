"""`values.yaml` and `values.schema.json` rendered from `values.ChartValues`. Pure.

pydantic's JSON Schema (draft 2020-12, which Helm's validator reads, `$defs` and `$ref`
included) is kept as it is but for names: each property becomes its camelCase value
name, `title` goes (the name says it), descriptions become one line, and only scalar
defaults stay (an object's default would carry Python's names; values.yaml has them).
values.yaml is the model's defaults with each field's docstring as its comment.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

from kubeinfer.cli.chart.values import ChartValues
from pydantic import BaseModel
from pydantic.alias_generators import to_camel

CHART = "helm/kubeinfer"
VALUES = f"{CHART}/values.yaml"
SCHEMA = f"{CHART}/values.schema.json"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
HEADER = """\
# Generated from kubeinfer.cli.chart.values by `python -m kubeinfer.cli.chart --write`:
# edit the model, not this file. values.schema.json, from the same model, is what Helm
# checks these values against.
"""
WIDTH = 92


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _camel_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_camel_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    result: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" or (key == "default" and isinstance(value, dict | list) and value):
            continue
        if key == "properties":
            result[key] = {to_camel(name): _camel_schema(sub) for name, sub in value.items()}
        elif key == "required":
            result[key] = [to_camel(name) for name in value]
        elif key == "description":
            result[key] = _one_line(value)
        else:
            result[key] = _camel_schema(value)
    return result


def values_schema(model: type[BaseModel] = ChartValues) -> dict[str, Any]:
    """The chart's values.schema.json, as a dict."""
    schema = _camel_schema(model.model_json_schema(mode="validation"))
    return {"$schema": JSON_SCHEMA_DIALECT, **schema}


def schema_text(model: type[BaseModel] = ChartValues) -> str:
    return json.dumps(values_schema(model), indent=2) + "\n"


def _comment(text: str | None, indent: str) -> list[str]:
    if not text:
        return []
    width = WIDTH - len(indent) - 2
    return [f"{indent}# {line}" for line in textwrap.wrap(_one_line(text), width)]


def _scalar(value: Any) -> str:
    """JSON is YAML: strings quoted, so that no value is read as another type."""
    return json.dumps(value)


def _lines(model: BaseModel, indent: str) -> list[str]:
    lines: list[str] = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        key = to_camel(name)
        # A model's own docstring says what a field of its type is, unless the field has one.
        doc = field.description or (type(value).__doc__ if isinstance(value, BaseModel) else None)
        if lines and (doc or isinstance(value, BaseModel)):
            lines.append("")
        lines += _comment(doc, indent)
        if isinstance(value, BaseModel):
            lines.append(f"{indent}{key}:")
            lines += _lines(value, indent + "  ")
        elif isinstance(value, dict) and value:
            lines.append(f"{indent}{key}:")
            lines += [f"{indent}  {k}: {_scalar(v)}" for k, v in value.items()]
        else:
            lines.append(f"{indent}{key}: {_scalar(value)}")
    return lines


def values_dict(values: BaseModel) -> dict[str, Any]:
    """A model's values with the chart's names: its fields' camelCase names, the keys of
    free-form maps (labels, node selectors) as they are."""
    result: dict[str, Any] = {}
    for name in type(values).model_fields:
        value = getattr(values, name)
        if isinstance(value, BaseModel):
            result[to_camel(name)] = values_dict(value)
        else:
            result[to_camel(name)] = json.loads(json.dumps(value))
    return result


def values_text(values: BaseModel | None = None) -> str:
    """The chart's values.yaml: every default, each under its docstring."""
    return HEADER + "\n" + "\n".join(_lines(values or ChartValues(), "")) + "\n"


def rendered() -> dict[str, str]:
    """Each generated file, by its path from the repository's root."""
    return {VALUES: values_text(), SCHEMA: schema_text()}
