"""The emulator's validation of built-in kinds: kubernetes-validate's strict schemas of
one Kubernetes version, each compiled once."""

from __future__ import annotations

import functools
import re

import jsonschema
from kubernetes_validate import utils
from referencing import Registry, Resource

KUBERNETES_VERSION = "1.33"


@functools.cache
def builtin_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    """kubernetes-validate's strict schema of one kind, compiled once: its own `validate`
    reloads and recompiles the schema on every call (about 80 ms, on the event loop)."""
    version = [
        v
        for v in utils.all_versions()
        if utils.major_minor(v) <= utils.major_minor(KUBERNETES_VERSION)
    ][-1]
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = utils.schema_contents(f"{folder}/{kind.lower()}-{group_version}.json", version)
    definitions = utils.schema_contents(f"{folder}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)
