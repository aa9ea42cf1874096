"""What a manifest asks that this machine lacks, said up front, one line each, and what
`kubeinfer up --cpu` changes so it runs anyway. Pure.

The machine has no GPU and no TensorRT: a `tensorrt` engine cannot be built and a pod
that requests `nvidia.com/gpu` cannot be scheduled (it would wait Pending, as on a
cluster without GPU nodes). With `--cpu` the manifest is applied with ONNX Runtime, no
GPU request and no GPU product, and the object is annotated with what was changed (the
session also says so in the object's Events). A model or calibration source that needs
credentials or a network the machine may not have is named, never rewritten.
"""

from __future__ import annotations

import copy
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


def _source_notes(where: str, source: dict[str, Any] | None) -> list[str]:
    uri = str((source or {}).get("uri", ""))
    if uri.startswith(("s3://", "gs://")) and not (source or {}).get("secretRef"):
        return [
            f"{where} {uri}: no credentials (secretRef) are given, and this machine has "
            "none of its own; the build will fail to fetch it"
        ]
    if uri.startswith("https://"):
        return [f"{where} {uri}: this machine may not reach it; a file:// source always works"]
    path = uri.removeprefix("file://")
    if uri.startswith("file://") and (path == "/tmp" or path.startswith("/tmp/")):
        return [
            f"{where} {uri}: every pod mounts its own /tmp (an emptyDir), which hides "
            "this file from the build; put the model outside /tmp"
        ]
    return []


def adapt(manifest: dict[str, Any], cpu: bool) -> Adapted:
    """The notes for `manifest`, and with `cpu` the manifest changed to run on CPU."""
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
    notes += _source_notes(f"{name}: model source", (spec.get("model") or {}).get("source"))
    notes += _source_notes(f"{name}: calibration", engine.get("calibration"))
    if changes:
        metadata = result.setdefault("metadata", {})
        metadata.setdefault("annotations", {})[ANNOTATION] = "; ".join(changes)
    return Adapted(result, notes, changes)
