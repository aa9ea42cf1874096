"""`kubeinfer promote NAME` and `kubeinfer abort NAME`: the shadow test's manual gate.

    kubeinfer promote NAME [-n NS] [--kubeconfig FILE] [--context CTX] [--digest DIGEST]
    kubeinfer abort NAME ...

Each reads the InferenceDeployment's `status.candidate` and sets the annotation
`kubeinfer.io/shadow-gate` to `promote <digest>` or `abort <digest>`; the operator acts on
its next pass, and only on the candidate whose engine digest the annotation names. So a
command that raced a newer candidate does nothing to it: with `--digest`, the command
refuses outright when the candidate is no longer that engine. It writes an annotation,
never the spec (a GitOps tool that owns the spec sees no drift).

Credentials and namespace are found as kubectl finds them: `--kubeconfig`, else
KUBECONFIG, else ~/.kube/config, else the in-cluster service account; the namespace is
`-n`, else the context's, else `default`. Uses the official `kubernetes` client.

Exit codes: 0 once the annotation is written; 1 when the object or a candidate to act on
is missing, the digest is stale, or the API refuses; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, CustomObjectsApi


class GateRefused(Exception):
    """The command cannot act; the message says why, in one line."""


def connect(kubeconfig: str | None, context: str | None) -> tuple[ApiClient, str]:
    """An API client and the namespace of the current context, found as kubectl finds
    them (see the module). `kubectl infd` connects the same way."""
    from kubernetes import client, config

    try:
        api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
        if context is not None:
            active = next(c for c in contexts if c["name"] == context)
        namespace = (active.get("context") or {}).get("namespace") or "default"
    except (config.ConfigException, OSError, StopIteration) as error:
        if kubeconfig is not None or context is not None:
            raise GateRefused(f"cannot load the kubeconfig: {error}") from None
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            raise GateRefused(f"no Kubernetes credentials: {error}") from None
        api_client, namespace = client.ApiClient(configuration), "default"
    return api_client, namespace


def gate_patch(body: dict[str, Any], action: str, digest: str | None) -> tuple[dict[str, Any], str]:
    """The merge patch that sets the gate on the InferenceDeployment `body` (what the
    commands, and Argo CD's promote and abort actions, write), and the digest it names.
    GateRefused when there is no candidate under test, or it is not engine `digest`."""
    from kubeinfer.operator.rollout.shadow import GATE_ANNOTATION

    metadata = body.get("metadata") or {}
    where = f"{metadata.get('namespace')}/{metadata.get('name')}"
    candidate = (body.get("status") or {}).get("candidate") or {}
    current = candidate.get("engineDigest")
    if not current or candidate.get("verdict") != "Pending":
        verdict = candidate.get("verdict") or "none"
        raise GateRefused(
            f"inferencedeployment {where} has no candidate under shadow test "
            f"(last verdict: {verdict})"
        )
    if digest is not None and digest != current:
        raise GateRefused(
            f"the candidate of {where} is now engine {current} (version "
            f"{candidate.get('version')}), not {digest}: nothing done"
        )
    return {"metadata": {"annotations": {GATE_ANNOTATION: f"{action} {current}"}}}, str(current)


def set_gate(
    api: CustomObjectsApi, namespace: str, name: str, action: str, digest: str | None
) -> str:
    """Writes `<action> <digest>` on the InferenceDeployment; returns the digest acted on."""
    from kubeinfer.operator.api.v1alpha1.resource import GROUP, PLURAL, VERSION
    from kubernetes.client.exceptions import ApiException

    try:
        body = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as error:
        if error.status == 404:
            raise GateRefused(f"inferencedeployment {namespace}/{name} not found") from None
        raise GateRefused(
            f"the API server refused the read: {error.status} {error.reason}"
        ) from None
    if not isinstance(body, dict):  # the client types a custom object as `object`
        raise GateRefused(f"the API server answered the read with no object: {body!r}")
    patch, current = gate_patch(body, action, digest)
    try:
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)
    except ApiException as error:
        raise GateRefused(
            f"the API server refused the write: {error.status} {error.reason}"
        ) from None
    return current


def _run(args: argparse.Namespace) -> int:
    try:
        from kubernetes.client import CustomObjectsApi

        api_client, namespace = connect(args.kubeconfig, args.context)
        api = CustomObjectsApi(api_client)
        digest = set_gate(api, args.namespace or namespace, args.name, args.action, args.digest)
    except GateRefused as refused:
        print(f"kubeinfer {args.action}: {refused}", file=sys.stderr)
        return 1
    past = "promoted" if args.action == "promote" else "aborted"
    print(
        f"inferencedeployment {args.name}: candidate {digest} will be {past} on the "
        "operator's next pass"
    )
    return 0


def _digest(text: str) -> str:
    if not (text.startswith("sha256:") and len(text) == 71):
        raise argparse.ArgumentTypeError("expected sha256: followed by 64 hex digits")
    return text


def register(subparsers: argparse._SubParsersAction) -> None:
    for action, summary in (
        ("promote", "promote the shadow candidate now, whatever its figures so far"),
        ("abort", "abort the shadow test: remove the candidate, keep serving as it is"),
    ):
        parser = subparsers.add_parser(
            action,
            help=summary,
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.add_argument("name", help="the InferenceDeployment")
        parser.add_argument("--namespace", "-n", help="its namespace (default: the context's)")
        parser.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG)")
        parser.add_argument("--context", help="kubeconfig context (default: the current one)")
        parser.add_argument(
            "--digest", type=_digest, help="act only if the candidate is this engine"
        )
        parser.set_defaults(handler=_run, action=action)
