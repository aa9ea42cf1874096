"""Reading manifest files as the API server will read them: YAML 1.2, JSON values, bounded.

`kubectl apply` turns YAML into JSON (go-yaml v2, which still reads YAML 1.1's octal
`010` and its `yes`/`on` booleans) and the API server checks that JSON against the CRD's
structural schema. PyYAML reads YAML 1.1 (`010` is 8, `1:30` is 90) and keeps the last of
duplicate keys, so `kubeinfer validate` used to pass what the cluster reads otherwise.
Here a file is read with ruamel.yaml, the maintained YAML 1.2 library, and:

- a plain scalar that YAML 1.1 and 1.2 read differently is refused rather than guessed:
  an integer with a leading zero (`010`: 8 to kubectl, 10 in YAML 1.2) and the YAML 1.1
  booleans (`yes`, `on`, `n`...: true/false to kubectl, strings in YAML 1.2);
- a duplicate key is an error (ruamel.yaml's default);
- the values are JSON's: timestamps stay the strings they are written as, as kubectl
  sends them; other tags (`!!binary`, `!!set`, custom ones) and NaN/infinity are refused;
- before anything is built, one pass over the parser's events (iterative: no recursion)
  bounds the nesting depth and the size of each document with every alias expanded, so
  an alias bomb or a 500-level nesting is a one-line error, not gigabytes or a
  RecursionError;
- the bytes must be UTF-8 (a byte-order mark is allowed).

Errors are `ManifestSyntaxError`s whose message names the line and column where known.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.constructor import SafeConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    DocumentStartEvent,
    Event,
    ScalarEvent,
)

MAX_DEPTH = 64
"""Nesting levels of mappings and sequences; an InferenceDeployment needs about ten, and a
`kubectl get -o yaml` copy with managedFields about twenty."""

MAX_EXPANDED_BYTES = 3 * 1024 * 1024
"""Size of one document with every alias expanded (roughly its JSON size): the API
server's own limit on a request body, so nothing larger could be applied anyway."""

JSON_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}"
    for name in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp")
)
AMBIGUOUS_OCTAL = re.compile(r"[-+]?0[0-9_]+")
AMBIGUOUS_BOOLEAN = re.compile(r"y|Y|yes|Yes|YES|n|N|no|No|NO|on|On|ON|off|Off|OFF")


class ManifestSyntaxError(ValueError):
    """A file that is not YAML the API server would read the same way; the message says
    where (line and column, 1-based) and what to write instead."""


class _JsonConstructor(SafeConstructor):
    """ruamel.yaml's safe constructor, with timestamps kept as the strings written: the
    API server receives them as strings (metadata.creationTimestamp in a copied object)."""


_JsonConstructor.add_constructor("tag:yaml.org,2002:timestamp", SafeConstructor.construct_yaml_str)


def _yaml() -> YAML:
    yaml = YAML(typ="safe", pure=True)
    yaml.Constructor = _JsonConstructor
    return yaml


def _where(event: Event) -> str:
    mark = event.start_mark
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _short(tag: Any) -> str:
    return str(tag).replace("tag:yaml.org,2002:", "!!")


def _check_tag(event: ScalarEvent | CollectionStartEvent) -> None:
    if event.tag is not None and str(event.tag) not in JSON_TAGS and str(event.tag) != "!":
        raise ManifestSyntaxError(
            f"{_where(event)}: the tag {_short(event.tag)} has no JSON equivalent (a manifest "
            "holds strings, numbers, booleans, null, lists and mappings)"
        )


def _check_scalar(event: ScalarEvent) -> int:
    """Refuses a tag outside JSON's values and a plain scalar that YAML 1.1 (kubectl) and
    1.2 read differently; returns the scalar's size."""
    _check_tag(event)
    plain = event.style is None and event.tag is None
    if plain and AMBIGUOUS_OCTAL.fullmatch(event.value):
        raise ManifestSyntaxError(
            f"{_where(event)}: {event.value} is ambiguous: kubectl (YAML 1.1) reads an octal "
            f"number, YAML 1.2 a decimal one; write it without the leading zero (or 0o... for "
            'octal), or quote it ("...") if a string is meant'
        )
    if plain and AMBIGUOUS_BOOLEAN.fullmatch(event.value):
        raise ManifestSyntaxError(
            f"{_where(event)}: {event.value} is ambiguous: kubectl (YAML 1.1) reads a boolean, "
            f'YAML 1.2 a string; write true or false, or quote it ("{event.value}") if a '
            "string is meant"
        )
    return len(event.value) + 1


def check_events(events: Iterable[Event]) -> None:
    """One pass over a stream's parser events: bounds each document's nesting depth and
    its size with aliases expanded (an alias counts the size its anchor had), and refuses
    ambiguous or non-JSON scalars and recursive aliases. Iterative, and stops at the
    first excess."""
    anchors: dict[str, int] = {}
    open_sizes: list[list[Any]] = []  # [anchor, size so far] of each open collection

    def add(size: int, anchor: Any, event: Event) -> None:
        if anchor is not None:
            anchors[str(anchor)] = size
        if open_sizes:
            open_sizes[-1][1] += size
            if open_sizes[-1][1] > MAX_EXPANDED_BYTES:
                raise ManifestSyntaxError(
                    f"{_where(event)}: the document is larger than {MAX_EXPANDED_BYTES} bytes "
                    "with its aliases expanded (the API server's request limit); an alias "
                    "repeated that often is refused rather than expanded"
                )

    for event in events:
        if isinstance(event, DocumentStartEvent):
            if event.version not in (None, (1, 2)):
                version = ".".join(map(str, event.version))
                raise ManifestSyntaxError(
                    f"{_where(event)}: %YAML {version} is not read here; manifests are "
                    "YAML 1.2 (remove the directive)"
                )
            anchors.clear()
        elif isinstance(event, CollectionStartEvent):
            _check_tag(event)
            open_sizes.append([event.anchor, 1])
            if len(open_sizes) > MAX_DEPTH:
                raise ManifestSyntaxError(
                    f"{_where(event)}: nested deeper than {MAX_DEPTH} levels; no manifest "
                    "needs that many"
                )
        elif isinstance(event, CollectionEndEvent):
            anchor, size = open_sizes.pop()
            add(size, anchor, event)
        elif isinstance(event, ScalarEvent):
            add(_check_scalar(event), event.anchor, event)
        elif isinstance(event, AliasEvent):
            if any(str(anchor) == str(event.anchor) for anchor, _ in open_sizes):
                raise ManifestSyntaxError(
                    f"{_where(event)}: the alias *{event.anchor} is inside its own anchor; "
                    "a recursive value has no JSON form"
                )
            add(anchors.get(str(event.anchor), 1), None, event)


def _check_json(value: Any, path: str) -> None:
    """Mapping keys must be strings and numbers finite, as in JSON (depth is bounded by
    `check_events`, so the recursion is too)."""
    if isinstance(value, dict):
        for key, child in value.items():
            if not isinstance(key, str):
                raise ManifestSyntaxError(
                    f"{path or '(document)'}: the key {key!r} is not a string; quote it"
                )
            _check_json(child, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, child in enumerate(value):
            _check_json(child, f"{path}[{index}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ManifestSyntaxError(f"{path}: {value} is not a number JSON can carry")


def _message(error: YAMLError) -> str:
    if isinstance(error, MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = error.problem or error.context or "invalid YAML"
        return f"{where}YAML syntax error: {problem}"
    return f"YAML syntax error: {str(error).strip().splitlines()[0]}"


def decode(data: bytes) -> str:
    """The file's text; UTF-8 only (with or without a byte-order mark)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ManifestSyntaxError(
            f"line {line}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset "
            f"{error.start}); manifests are UTF-8"
        ) from None


def load_documents(data: bytes) -> list[Any]:
    """Every non-empty document of a YAML stream, as JSON values; raises
    ManifestSyntaxError."""
    text = decode(data)
    yaml = _yaml()
    try:
        check_events(yaml.parse(text))
        documents = [d for d in yaml.load_all(text) if d is not None]
    except YAMLError as error:
        raise ManifestSyntaxError(_message(error)) from None
    for index, document in enumerate(documents):
        _check_json(document, "" if len(documents) == 1 else f"[{index}]")
    return documents
