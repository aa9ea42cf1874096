"""`kubeinfer render FILE`: the children the operator would create, as YAML, offline.

It runs the operator's own pure `decide` over an empty world, so what it prints is what
the operator applies, not a template kept beside it. An engine that is not pinned is
built by a Job whose digest is known only once it has run; render then plays that Job
succeeding with `--engine-digest` (by default a placeholder derived from the build key,
said so in a comment) to show the runtime's ConfigMap, Deployment and Service as well.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from kubeinfer.operator.settings import OperatorSettings
    from kubeinfer.operator.state.decision import Decision
    from kubeinfer.operator.state.observed import ObservedState

RENDER_TIME = datetime(2026, 1, 1, tzinfo=UTC)
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
KIND_ORDER = (
    "PersistentVolumeClaim",
    "Job",
    "ConfigMap",
    "Deployment",
    "Service",
    "PodDisruptionBudget",
)


class RenderError(ValueError):
    """A file that cannot be rendered; the message says why, one problem per line."""


def render_manifest(
    document: dict[str, Any], engine_digest: str | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """(children, notes) for one InferenceDeployment document; raises InvalidManifest."""
    from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentStatus
    from kubeinfer.operator.api.v1alpha1.inference_deployment import in_fleet_mode
    from kubeinfer.operator.api.v1alpha1.validation import parse_inference_deployment
    from kubeinfer.operator.reconcile.decide import decide
    from kubeinfer.operator.settings import OperatorSettings
    from kubeinfer.operator.state.observed import ObservedState, OwnerRef

    manifest = parse_inference_deployment(document)
    meta = manifest.metadata
    uid = meta.uid or PLACEHOLDER_UID
    owner = OwnerRef(meta.name, meta.namespace or "default", uid, 1)
    settings = OperatorSettings.from_env()
    empty = ObservedState(owner=owner, spec=manifest.spec, status=InferenceDeploymentStatus())
    first = decide(empty, settings, RENDER_TIME)
    children = {(c["kind"], c["metadata"]["name"]): c for c in first.desired}
    notes = []
    if uid == PLACEHOLDER_UID:
        notes.append(
            "ownerReferences carry a placeholder uid: the API server assigns the real one."
        )
    if in_fleet_mode(manifest.spec):
        notes.append(
            "A mixed GPU fleet (backend tensorrt without runtime.gpuProduct or engine.pin) "
            "builds an engine, a Job and a Deployment per GPU product found among the "
            "cluster's nodes: offline there are none to render (docs/gpu-fleets.md)."
        )
    if any(c["kind"] == "Job" for c in first.desired):
        after, note = _after_the_build(first, empty, settings, engine_digest)
        notes.append(note)
        children.update({(c["kind"], c["metadata"]["name"]): c for c in after})
    ordered = sorted(
        children.values(), key=lambda c: (KIND_ORDER.index(c["kind"]), c["metadata"]["name"])
    )
    return ordered, notes


def _after_the_build(
    first: Decision, empty: ObservedState, settings: OperatorSettings, engine_digest: str | None
) -> tuple[tuple[dict[str, Any], ...], str]:
    """The children once the first pass's build Job has succeeded with `engine_digest`
    (else a placeholder derived from the build key), and the note that says which: the
    runtime's objects exist only once the operator knows the engine's digest."""
    from kubeinfer.operator.reconcile.decide import decide
    from kubeinfer.operator.state.engine_state import build_key
    from kubeinfer.operator.state.observed import ObservedState

    digest = (
        engine_digest
        or "sha256:" + hashlib.sha256(build_key(empty.spec, settings).encode()).hexdigest()
    )
    note = (
        f"The runtime objects assume the build Job reports engine {digest}"
        + ("" if engine_digest else " (a placeholder; set --engine-digest)")
        + "."
    )
    built = _job_succeeded(next(c for c in first.desired if c["kind"] == "Job"), digest)
    after = ObservedState(
        owner=empty.owner,
        spec=empty.spec,
        status=first.status,
        pvc=next((c for c in first.desired if c["kind"] == "PersistentVolumeClaim"), None),
        jobs=(built,),
        job_pods=(_build_pod(built, digest),),
    )
    return decide(after, settings, RENDER_TIME).desired, note


def _job_succeeded(job: dict[str, Any], digest: str) -> dict[str, Any]:
    stamp = RENDER_TIME.strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {"type": "Complete", "status": "True", "lastTransitionTime": stamp}
    return {**job, "status": {"succeeded": 1, "completionTime": stamp, "conditions": [condition]}}


def _build_pod(job: dict[str, Any], digest: str) -> dict[str, Any]:
    terminated = {"exitCode": 0, "reason": "Completed", "message": digest}
    return {
        "metadata": {"labels": {"batch.kubernetes.io/job-name": job["metadata"]["name"]}},
        "status": {"containerStatuses": [{"name": "build", "state": {"terminated": terminated}}]},
    }


def _literal_blocks() -> type:
    """A safe dumper that prints multi-line strings (the ConfigMap's runtime.yaml) as
    literal blocks, so the rendered config reads as the YAML it is."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, represent_str)
    return Dumper


def render_file(path: Path, engine_digest: str | None = None) -> str:
    """The YAML stream for every InferenceDeployment in `path`, read as the API server
    reads it (`api.manifest_loader`); raises RenderError."""
    import yaml
    from kubeinfer.operator.api.manifest_loader import ManifestSyntaxError, load_documents
    from kubeinfer.operator.api.v1alpha1.validation import InvalidManifest

    _Dumper = _literal_blocks()
    try:
        documents = load_documents(path.read_bytes())
    except OSError as error:
        raise RenderError(f"{path}: cannot read: {error.strerror or error}") from None
    except ManifestSyntaxError as error:
        raise RenderError(f"{path}: {error}") from None
    if not documents:
        raise RenderError(f"{path}: no YAML document in the file")
    out, problems = [], []
    for index, document in enumerate(documents):
        suffix = "" if len(documents) == 1 else f"[{index}]"
        try:
            children, notes = render_manifest(document, engine_digest)
        except InvalidManifest as invalid:
            problems += [f"{path}{suffix}: {error}" for error in invalid.errors]
            continue
        meta = document["metadata"]  # validated: a mapping with a name
        out.append(
            f"# Children of InferenceDeployment {meta.get('namespace') or 'default'}/"
            f"{meta['name']} ({path.name}{suffix}), as the operator decides them.\n"
            + "".join(f"# {note}\n" for note in notes)
        )
        for child in children:
            out.append("---\n" + yaml.dump(child, Dumper=_Dumper, sort_keys=False, width=100))
    if problems:
        raise RenderError("\n".join(problems))
    return "".join(out)


def run(
    path: Path, engine_digest: str | None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Prints the rendering of `path` to `out` (stdout); 1 on a bad file, 2 on a bad flag."""
    out, err = out or sys.stdout, err or sys.stderr
    if engine_digest is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", engine_digest):
        print(
            "kubeinfer render: --engine-digest must be sha256: followed by 64 lowercase hex digits",
            file=err,
        )
        return 2
    try:
        text = render_file(path, engine_digest)
    except RenderError as error:
        print(error, file=err)
        return 1
    out.write(text)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "render",
        help="print the objects the operator would create for a manifest (no cluster needed)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("file", type=Path, metavar="FILE")
    parser.add_argument(
        "--engine-digest",
        metavar="DIGEST",
        help="the digest the build Job is assumed to report (sha256:...); a placeholder otherwise",
    )
    parser.set_defaults(handler=lambda args: run(args.file, args.engine_digest))
