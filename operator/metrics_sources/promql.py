"""PromQL text built from values: string literals, RE2 escapes, and the regex that selects
the serving pods of one InferenceDeployment by name. Pure.

Why select by pod name: PodMonitors and the prometheus-community chart's `kubernetes-pods`
scrape job both attach `namespace` and `pod` labels (from Kubernetes service discovery's
`__meta_kubernetes_namespace` and `__meta_kubernetes_pod_name`), but a PodMonitor copies
none of our pod labels by default, so the pod name is the one handle every setup has.
"""

from __future__ import annotations

from string import Template

RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")

MAX_GENERATED_NAME_BASE = 58
"""Kubernetes cuts a `generateName` base to 63 - 5 characters before appending five random
ones (apiserver `names.SimpleNameGenerator`), so long pod names lose their tail."""

SAFE = "[bcdfghjklmnpqrstvwxz2456789]"
"""Kubernetes' alphabet for generated names (`rand.SafeEncodeString`, `rand.String`): no
vowels, so no word of ours (`runtime`) can pass for a hash or a random suffix."""
POD_SUFFIX = SAFE + "{5}"
TEMPLATE_HASH_MAX = 10
"""A pod-template-hash is a uint32's decimal digits, each encoded: 1 to 10 characters."""


def promql_string(value: str) -> str:
    """A double-quoted PromQL string literal holding exactly `value`."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def string_contents(value: str) -> str:
    """`value` escaped as the inside of a double-quoted PromQL string literal."""
    return promql_string(value)[1:-1]


def substitute_placeholders(template: str, *, namespace: str, pods: str) -> str:
    """A user's PromQL with `$namespace` and `$pods` (or `${namespace}`, `${pods}`)
    replaced by `namespace` and the regex `pods`, each escaped as the contents of a
    double-quoted string, where the placeholders belong: `{namespace="$namespace",
    pod=~"$pods"}`. Other `$` words are left as written and `$$` is one `$`
    (`string.Template`), so the text cannot reach outside its quotes whatever the values."""
    return Template(template).safe_substitute(
        namespace=string_contents(namespace), pods=string_contents(pods)
    )


def re2_escape(text: str) -> str:
    """`text` as a regex matching itself literally (RE2 syntax, as Prometheus uses)."""
    return "".join(f"\\{char}" if char in RE2_SPECIAL else char for char in text)


def deployment_pod_regex(deployment: str) -> str:
    """A regex matching exactly the names of the pods a Deployment's ReplicaSets create:
    `<deployment>-<template hash>-<5 random>`, or, where that is longer than Kubernetes
    allows a generated name, its first 58 characters and 5 random ones.

    It cannot match another owner's pods (`<other>-runtime-...`, owners up to 52
    characters): Prometheus anchors `=~` at both ends, the hash and the suffix hold
    neither `-` nor vowels, so where ours has a hash the other's name must too, and a
    name that extends ours carries `-runtime` where ours has one. Cut names included:
    `tests/metrics` checks it as a property over owner names."""
    prefix = f"{deployment}-"
    if len(prefix) >= MAX_GENERATED_NAME_BASE:
        return re2_escape(prefix[:MAX_GENERATED_NAME_BASE]) + POD_SUFFIX
    room = MAX_GENERATED_NAME_BASE - len(prefix)  # characters left for "<hash>-"
    longest_whole = min(TEMPLATE_HASH_MAX, room - 1)
    alternatives = []
    if longest_whole >= 1:
        alternatives.append(f"{SAFE}{{1,{longest_whole}}}-{POD_SUFFIX}")
    if longest_whole < TEMPLATE_HASH_MAX:
        # A longer hash is cut, with the "-" after it: `room` hash characters, then 5.
        alternatives.append(f"{SAFE}{{{room + 5}}}")
    body = alternatives[0] if len(alternatives) == 1 else f"(?:{'|'.join(alternatives)})"
    return re2_escape(prefix) + body
