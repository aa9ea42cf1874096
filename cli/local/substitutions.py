"""What a manifest asks that this machine lacks, said up front, one line each, and what
`kubeinfer up` changes so it runs anyway. Pure.

The machine has no GPU and no TensorRT: a `tensorrt` engine cannot be built and a pod
that requests `nvidia.com/gpu` cannot be scheduled (it would wait Pending, as on a
cluster without GPU nodes). With `--cpu` the manifest is applied with ONNX Runtime, no
GPU request and no GPU product. A `file://` source names a file of this machine, which
no pod can see: the session publishes it on the cluster's file server (with its folder,
for external data) and the manifest is applied with that `http://` URL (`published`
maps one to the other). Either way the object is annotated with what was changed, and
the session says so in its Events. A source that needs credentials or a network the
machine may not have is named, never rewritten.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ANNOTATION = "kubeinfer.io/local-substitutions"


@dataclass(frozen=True)
class Adapted:
    """A manifest as it will be applied, and what was said about it."""

    manifest: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    """One line per thing the machine lacks (and, with --cpu, what was done instead)."""
    changes: list[str] = field(default_factory=list)
    """What --cpu changed, for the object's annotation and Event."""
    published: list[str] = field(default_factory=list)
    """Which file:// sources were applied as the file server's http:// URLs (the same)."""

    def event_message(self) -> str:
        """What the object's Event says was changed, or "" when nothing was."""
        parts = []
        if self.changes:
            parts.append("kubeinfer up --cpu ran this on CPU with ONNX Runtime and no GPU "
                         f"request: {'; '.join(self.changes)}")  # fmt: skip
        if self.published:
            parts.append("kubeinfer up served this machine's files to the pods over HTTP: "
                         + "; ".join(self.published))  # fmt: skip
        return ". ".join(parts)


SOURCE_FIELDS = (("model source", ("model", "source")), ("calibration", ("engine", "calibration")))
"""The fields of an InferenceDeployment's spec that name a file to fetch, as said and as
found."""


def _sources(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for label, (group, key) in SOURCE_FIELDS:
        source = (spec.get(group) or {}).get(key)
        if isinstance(source, dict):
            found.append((label, f"{group}.{key}.uri", source))
    return found


def local_files(manifest: dict[str, Any]) -> list[str]:
    """The `file://` URIs an InferenceDeployment's sources name, to publish."""
    if manifest.get("kind") != "InferenceDeployment":
        return []
    uris = [str(s.get("uri", "")) for _, _, s in _sources(manifest.get("spec") or {})]
    return [uri for uri in uris if uri.startswith("file://")]


def _source_notes(where: str, source: dict[str, Any]) -> list[str]:
    uri = str(source.get("uri", ""))
    if uri.startswith(("s3://", "gs://")) and not source.get("secretRef"):
        return [
            f"{where} {uri}: no credentials (secretRef) are given, and this machine has "
            "none of its own; the build will fail to fetch it"
        ]
    if uri.startswith("https://"):
        return [f"{where} {uri}: this machine may not reach it; a file:// source always works"]
    if uri.startswith("file://"):
        return [f"{where} {uri}: no such file on this machine; the build will fail to fetch it"]
    return []


def _publish(
    where: str, field_path: str, source: dict[str, Any], published: Mapping[str, str]
) -> tuple[list[str], list[str]]:
    """(notes, published) for one source: a file:// URI the session published is applied
    as its http:// URL; any other source is only named where the machine may lack it."""
    uri = str(source.get("uri", ""))
    url = published.get(uri)
    if url is None:
        return _source_notes(where, source), []
    source["uri"] = url
    note = f"{where} {uri}: a file of this machine, which pods cannot see; they read it at {url}"
    return [note], [f"{field_path} {uri} -> {url}"]


def adapt(
    manifest: dict[str, Any], cpu: bool, published: Mapping[str, str] | None = None
) -> Adapted:
    """The notes for `manifest`, with `cpu` the manifest changed to run on CPU, and each
    file:// source that `published` maps applied as its URL."""
    if manifest.get("kind") != "InferenceDeployment":
        return Adapted(manifest)
    result = copy.deepcopy(manifest)
    name = f"{manifest.get('kind')}/{(manifest.get('metadata') or {}).get('name', '?')}"
    spec = result.get("spec") or {}
    engine, runtime = spec.get("engine") or {}, spec.get("runtime") or {}
    resources = runtime.get("resources") or {}
    notes: list[str] = []
    changes: list[str] = []
    if engine.get("backend") == "tensorrt":
        if cpu:
            engine["backend"] = "onnxruntime"
            changes.append("engine.backend tensorrt -> onnxruntime")
            notes.append(
                f"{name}: tensorrt needs TensorRT and a GPU, which this machine "
                "lacks: --cpu builds it with ONNX Runtime"
            )
        else:
            notes.append(
                f"{name}: engine.backend tensorrt needs TensorRT and a GPU, which "
                "this machine lacks; its build will not run (use --cpu)"
            )
    if resources.get("gpus"):
        if cpu:
            changes.append(f"runtime.resources.gpus {resources['gpus']} -> none")
            del resources["gpus"]
        else:
            notes.append(
                f"{name}: requests {resources['gpus']} nvidia.com/gpu per pod and this "
                "node has none: its pods will wait Pending (use --cpu)"
            )
    if runtime.get("gpuProduct") and cpu:
        changes.append(f"runtime.gpuProduct {runtime['gpuProduct']} -> none")
        del runtime["gpuProduct"]
    served: list[str] = []
    for label, field_path, source in _sources(spec):
        said, done = _publish(f"{name}: {label}", field_path, source, published or {})
        notes += said
        served += done
    if changes or served:
        metadata = result.setdefault("metadata", {})
        metadata.setdefault("annotations", {})[ANNOTATION] = "; ".join(changes + served)
    return Adapted(result, notes, changes, served)
