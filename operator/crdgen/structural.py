"""Rewrites pydantic's JSON Schema (2020-12) into a Kubernetes structural schema.

Pydantic emits `$defs`/`$ref`, `anyOf` with null for optionals, `title` everywhere,
numeric `exclusiveMinimum`, `const` and `default: null`; none of these is allowed (or
means the same) in an apiextensions.k8s.io/v1 schema (KEP-2335). The rewrite is a
visitor in the manner of kube-rs's StructuralSchemaRewriter, and it refuses any keyword it
does not know, so it never emits something the API server would reject or silently prune.
"""

from __future__ import annotations

from typing import Any

# Keywords copied through unchanged (after their children are rewritten).
_PASSTHROUGH = {
    "type",
    "description",
    "format",
    "pattern",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "uniqueItems",
    "default",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string",
    "x-kubernetes-map-type",
}
_DROPPED = {"title", "$defs", "additionalProperties", "properties", "required", "items"}


class SchemaError(ValueError):
    """The model uses a JSON Schema feature that has no structural equivalent."""


def to_structural(schema: dict[str, Any]) -> dict[str, Any]:
    """Returns the structural form of a pydantic `model_json_schema(by_alias=True)`."""
    definitions = schema.get("$defs", {})
    return _rewrite(schema, definitions, path="")


def _resolve(node: dict[str, Any], definitions: dict[str, Any], path: str) -> dict[str, Any]:
    """Inlines a `$ref`, keeping the referring node's own keywords (its description)."""
    if "$ref" not in node:
        return node
    name = node["$ref"].removeprefix("#/$defs/")
    if name not in definitions:
        raise SchemaError(f"{path}: unresolved reference {node['$ref']}")
    merged = {**definitions[name], **{k: v for k, v in node.items() if k != "$ref"}}
    return _resolve(merged, definitions, path)


def _collapse_nullable(node: dict[str, Any], path: str) -> dict[str, Any]:
    """`anyOf: [X, {type: null}]` (an Optional field) becomes X; the field is simply left
    out of `required`, which is how a structural schema says optional."""
    if "anyOf" not in node:
        return node
    branches = [b for b in node["anyOf"] if b.get("type") != "null"]
    if len(branches) != 1:
        raise SchemaError(f"{path}: a union of several types has no structural form")
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    return {**branches[0], **rest}


def _rewrite(node: dict[str, Any], definitions: dict[str, Any], path: str) -> dict[str, Any]:
    node = _collapse_nullable(_resolve(node, definitions, path), path)
    node = _resolve(node, definitions, path)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "description":
            # Docstrings wrap at the source's line length; kubectl explain rewraps.
            out[key] = " ".join(value.split())
        elif key in _PASSTHROUGH:
            out[key] = value
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        elif key not in _DROPPED:
            raise SchemaError(f"{path or '.'}: JSON Schema keyword {key!r} is not supported")
    if out.get("default", ...) is None:
        del out["default"]
    if "enum" in out and "type" not in out:
        out["type"] = _type_of(out["enum"][0], path)

    if "properties" in node or node.get("type") == "object":
        out["type"] = "object"
        properties = node.get("properties", {})
        if properties:
            out["properties"] = {
                name: _rewrite(child, definitions, f"{path}.{name}")
                for name, child in properties.items()
            }
            required = [n for n in node.get("required", []) if n in properties]
            if required:
                out["required"] = required
        additional = node.get("additionalProperties")
        if isinstance(additional, dict):
            # dict[str, X]: a typed map.
            out["additionalProperties"] = _rewrite(additional, definitions, f"{path}.*")
        elif not properties and not out.get("x-kubernetes-preserve-unknown-fields"):
            raise SchemaError(f"{path}: an object needs properties or a typed map")
    if node.get("type") == "array":
        if "items" not in node:
            raise SchemaError(f"{path}: an array needs items")
        out["items"] = _rewrite(node["items"], definitions, f"{path}[]")
    if "type" not in out and not out.get("x-kubernetes-int-or-string"):
        raise SchemaError(f"{path}: every node needs a type")
    if "description" not in out and path and not path.endswith(("[]", "*")):
        raise SchemaError(f"{path}: every field needs a description (a field docstring)")
    # A stable, readable key order: what a node is first, then its constraints.
    first = [k for k in ("type", "description") if k in out]
    return {**{k: out[k] for k in first}, **{k: v for k, v in out.items() if k not in first}}


def _type_of(value: Any, path: str) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    raise SchemaError(f"{path}: enum of unsupported value {value!r}")
