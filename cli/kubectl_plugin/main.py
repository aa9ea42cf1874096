"""The `kubectl-infd` console script: `kubectl infd COMMAND NAME [flags]`.

    kubectl infd status NAME       the engine, serving and candidate figures, the quality
                                   watch and the conditions, as a table
    kubectl infd answers NAME      the replicas taken out for answering wrong (pod, node,
                                   device, engine, probe, error) and the suspect nodes
    kubectl infd promote NAME      promote the shadow candidate now (--digest: only if it
                                   is still that engine)
    kubectl infd abort NAME        abort the shadow test
    kubectl infd exemplars NAME    download the serving pods' quality-watch exemplars
                                   (.npz, the rows that disagreed most with the reference)
    kubectl infd build-logs NAME   print the engine build Job's pod logs

Flags as kubectl's, anywhere on the line: -n/--namespace, --context, --kubeconfig.

Exit codes: 0 done; 1 the object, a candidate or a pod to read is missing, or the API
server refused; 2 bad arguments or a missing library.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PROG = "kubectl infd"


def _common() -> argparse.ArgumentParser:
    """kubectl's connection flags; SUPPRESS, so a flag given before the command is not
    reset by the command's own parser."""
    common = argparse.ArgumentParser(add_help=False)
    for flags, meaning in (
        (("-n", "--namespace"), "the namespace (default: the context's)"),
        (("--context",), "the kubeconfig context (default: the current one)"),
        (("--kubeconfig",), "the kubeconfig file (default: KUBECONFIG, else ~/.kube/config)"),
    ):
        common.add_argument(*flags, default=argparse.SUPPRESS, help=meaning)
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog=PROG,
        parents=[common],
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=summary, description=summary)
        sub.add_argument("name", metavar="NAME", help="the InferenceDeployment")
        return sub

    command("status", "show the engine, serving and candidate figures and the quality watch")
    command("answers", "show the replicas taken out for answering wrong, and suspect nodes")
    for action, summary in (
        ("promote", "promote the shadow candidate now, whatever its figures so far"),
        ("abort", "abort the shadow test: remove the candidate, keep serving as it is"),
    ):
        gate = command(action, summary)
        gate.add_argument("--digest", help="act only if the candidate is this engine")
    exemplars = command("exemplars", "download the serving pods' quality-watch exemplars")
    exemplars.add_argument(
        "-o", "--output", type=Path,
        help="the .npz to write (default: NAME-exemplars.npz; with several serving pods, "
        "one file per pod, its name before the suffix)",
    )  # fmt: skip
    exemplars.add_argument("--pod", help="only this serving pod")
    logs = command("build-logs", "print the logs of the spec's engine build Job's pods")
    logs.add_argument(
        "--all", action="store_true",
        help="every build Job of the object (earlier attempts, the quality reference's)",
    )  # fmt: skip
    return parser


class Refused(Exception):
    """The command cannot do what was asked; the message says why, in one line."""


def _read(api_client: Any, namespace: str, name: str) -> dict[str, Any]:
    from kubeinfer.operator.api.v1alpha1.resource import GROUP, PLURAL, VERSION
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    try:
        found = CustomObjectsApi(api_client).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
    except ApiException as error:
        if error.status == 404:
            raise Refused(f"inferencedeployment {namespace}/{name} not found") from None
        raise Refused(
            f"the API server refused the read of inferencedeployment {namespace}/{name}: "
            f"{error.status} {error.reason}"
        ) from None
    if not isinstance(found, dict):  # the client types a custom object as `object`
        raise Refused(f"the API server answered the read with no object: {found!r}")
    return found


def status(api_client: Any, namespace: str, args: argparse.Namespace) -> int:
    from kubeinfer.cli.kubectl_plugin.status_view import render

    print(render(_read(api_client, namespace, args.name), datetime.now(UTC)), end="")
    return 0


def answers(api_client: Any, namespace: str, args: argparse.Namespace) -> int:
    from kubeinfer.cli.kubectl_plugin.status_view import wrong_answers

    found = _read(api_client, namespace, args.name)
    name = (found.get("metadata") or {}).get("name", args.name)
    lines = [f"Name:       {name}", "", *wrong_answers(found, datetime.now(UTC), always=True)]
    print("\n".join(lines))
    return 0


def gate(api_client: Any, namespace: str, args: argparse.Namespace) -> int:
    from kubeinfer.operator.commands.gate import set_gate
    from kubernetes.client import CustomObjectsApi

    api = CustomObjectsApi(api_client)
    digest = set_gate(api, namespace, args.name, args.command, args.digest)
    past = "promoted" if args.command == "promote" else "aborted"
    print(
        f"inferencedeployment {args.name}: candidate {digest} will be {past} on the "
        "operator's next pass"
    )
    return 0


def exemplars(api_client: Any, namespace: str, args: argparse.Namespace) -> int:
    from kubeinfer.cli.kubectl_plugin import pods
    from kubernetes.client import CoreV1Api

    core = CoreV1Api(api_client)
    chosen = pods.serving_pods(core, namespace, args.name)
    if args.pod is not None:
        chosen = [p for p in chosen if pods.name_of(p) == args.pod]
    if not chosen:
        which = f"pod {args.pod}" if args.pod else "pod"
        raise Refused(f"inferencedeployment {namespace}/{args.name} has no ready serving {which}")
    output = args.output or Path(f"{args.name}-exemplars.npz")
    for pod in chosen:
        path = output
        if len(chosen) > 1:
            path = output.with_name(f"{output.stem}-{pods.name_of(pod)}{output.suffix}")
        body = pods.exemplars(core, namespace, pod)
        path.write_bytes(body)
        print(f"Wrote {path} ({len(body)} bytes, {_count(body)}) from pod {pods.name_of(pod)}")
    return 0


def _count(npz: bytes) -> str:
    """How many exemplars the file holds, where numpy is installed to read it."""
    try:
        import io
        import json

        import numpy as np
    except ImportError:
        return "exemplars"
    with np.load(io.BytesIO(npz)) as archive:
        return f"{len(json.loads(str(archive['__metadata__'])))} exemplars"


def build_logs(api_client: Any, namespace: str, args: argparse.Namespace) -> int:
    from kubeinfer.cli.kubectl_plugin import pods
    from kubernetes.client import CoreV1Api

    core = CoreV1Api(api_client)
    key = None
    if not args.all:
        obj = _read(api_client, namespace, args.name)
        pin = ((obj.get("spec") or {}).get("engine") or {}).get("pin")
        if pin:
            raise Refused(
                f"inferencedeployment {namespace}/{args.name} runs the pinned engine {pin}: "
                "nothing was built for it (--all lists every build Job of the object)"
            )
        key = ((obj.get("status") or {}).get("engine") or {}).get("buildKey")
        if not key:
            raise Refused(f"inferencedeployment {namespace}/{args.name} has no engine yet")
    found = pods.build_pods(core, namespace, args.name, key)
    if not found:
        raise Refused(
            f"no build pod of inferencedeployment {namespace}/{args.name} is left (a Job "
            "finished long ago is removed with its pods)"
        )
    for pod in found:
        job = (pod["metadata"].get("labels") or {}).get("job-name", "?")
        print(f"==> job/{job} pod/{pods.name_of(pod)} <==")
        text = pods.logs(core, namespace, pod)
        print(text, end="" if text.endswith("\n") or not text else "\n")
    return 0


HANDLERS = {
    "status": status,
    "answers": answers,
    "promote": gate,
    "abort": gate,
    "exemplars": exemplars,
    "build-logs": build_logs,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from kubeinfer.cli.kubectl_plugin.pods import PodsRefused
        from kubeinfer.operator.commands.gate import GateRefused, connect
        from urllib3.exceptions import HTTPError

        api_client, namespace = connect(
            getattr(args, "kubeconfig", None), getattr(args, "context", None)
        )
        with api_client:
            namespace = getattr(args, "namespace", None) or namespace
            return HANDLERS[args.command](api_client, namespace, args)
    except ModuleNotFoundError as error:
        print(
            f"{PROG}: needs {error.name}, which this installation lacks: "
            "pip install 'kubeinfer[operator]'",
            file=sys.stderr,
        )
        return 2
    except (Refused, GateRefused, PodsRefused, OSError) as refused:
        print(f"{PROG} {args.command}: {refused}", file=sys.stderr)
        return 1
    except HTTPError as error:  # no answer at all: kubectl's "Unable to connect"
        print(f"{PROG} {args.command}: unable to connect to the server: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
