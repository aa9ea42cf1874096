"""`kubeinfer up [FILE...]` and `kubeinfer down`: the whole operator on this machine.

`up` runs in the foreground until Ctrl-C, printing the `kubectl get infd` view as it
changes and each object's endpoint; `--detach` starts the same session as a background
process, returns once the manifests are applied and every endpoint is open, and
`kubeinfer down` stops it later. Either way, stopping stops every process the session
started: Prometheus, the control plane, the node and the pods it runs. The session
process builds what it needs first (the first time: minutes, with progress), then runs
the cluster in a network namespace of its own; what it prints are 127.0.0.1 ports of the
namespace it was started in.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubeinfer.cli.local.session import LocalSession

QUIET_LIMIT_SECONDS = 900.0
"""How long a detached start may print nothing before it counts as stuck (a first build
prints its progress every few seconds)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    up = subparsers.add_parser(
        "up",
        help="run the operator on this machine and apply manifests to it",
        description="Starts a local control plane and node, installs the CRD and the "
        "operator, applies the manifests, and shows `kubectl get infd` as it changes, with "
        "a local endpoint per InferenceDeployment. Ctrl-C stops everything.",
    )
    up.add_argument("files", nargs="*", type=Path, metavar="FILE", help="manifests to apply")
    up.add_argument(
        "--cpu",
        action="store_true",
        help="run TensorRT/GPU manifests with ONNX Runtime and no GPU request",
    )
    up.add_argument(
        "--detach",
        action="store_true",
        help="return once applied; stop later with `kubeinfer down`",
    )
    up.add_argument(
        "--directory",
        type=Path,
        default=None,
        help="the session's files (default: $XDG_STATE_HOME/kubeinfer/local)",
    )
    up.add_argument("--session-process", action="store_true", help=argparse.SUPPRESS)
    up.set_defaults(handler=_up)

    down = subparsers.add_parser("down", help="stop what `kubeinfer up --detach` started")
    down.add_argument("--directory", type=Path, default=None)
    down.set_defaults(handler=_down)


def _directory(args: argparse.Namespace) -> Path:
    from kubeinfer.cli.local.session import default_directory

    return (args.directory or default_directory()).resolve()


def _up(args: argparse.Namespace) -> int:
    directory = _directory(args)
    if args.detach:
        return _detach(args, directory)
    from kubeinfer.cli.local.namespace import NamespaceProblem
    from kubeinfer.cli.local.session import LocalSession, UpError
    from kubeinfer.cluster.binaries import BuildError
    from kubeinfer.cluster.control_plane import ClusterError
    from kubeinfer.cluster.netns import NamespaceError

    def say(line: str) -> None:
        print(line, flush=True)

    session = LocalSession(directory, cpu=args.cpu, say=say)
    try:
        say("kubeinfer up: starting a control plane and a node on this machine")
        session.prepare()  # before the event loop: it may start no thread first
        asyncio.run(_session(args, session))
    except (UpError, BuildError, ClusterError, NamespaceProblem, NamespaceError) as error:
        print(f"kubeinfer up: {error}", file=sys.stderr)
        return 1
    return 0


async def _session(args: argparse.Namespace, session: LocalSession) -> None:
    say = session.say
    stop = asyncio.Event()
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    started = False

    def interrupt() -> None:
        if started:
            stop.set()
        elif main is not None:
            main.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, interrupt)
    try:
        await session.start()
        await session.apply_files(args.files)
        say(f"\nexport KUBECONFIG={session.kubeconfig}")
        say(
            "# then: kubectl get infd, kubectl describe infd NAME, kubeinfer promote|abort NAME"
            + ("" if args.session_process else "; Ctrl-C stops everything")
            + "\n"
        )
        started = True
        await session.watch(stop)
    except asyncio.CancelledError:
        say("kubeinfer up: interrupted while starting")
    finally:
        say("kubeinfer up: stopping")
        await session.stop()


def _detach(args: argparse.Namespace, directory: Path) -> int:
    from kubeinfer.cli.local.session import (
        SESSION_FILE,
        UpError,
        python_command,
        refuse_a_second_session,
        stop_directory,
    )
    from kubeinfer.cluster import processes

    try:
        refuse_a_second_session(directory)
    except UpError as error:
        print(f"kubeinfer up: {error}", file=sys.stderr)
        return 1
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SESSION_FILE).unlink(missing_ok=True)
    log = directory / "up.log"
    log.unlink(missing_ok=True)
    argv = [
        *python_command(),
        "up",
        "--session-process",
        f"--directory={directory}",
        *(["--cpu"] if args.cpu else []),
        *(str(f.resolve()) for f in args.files),
    ]
    child, _ = processes.spawn("kubeinfer up", argv, log)
    shown = 0
    deadline = time.monotonic() + QUIET_LIMIT_SECONDS
    wanted = _object_count(args.files)
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        print(text[shown:], end="", flush=True)
        if len(text) > shown:
            deadline = time.monotonic() + QUIET_LIMIT_SECONDS
        shown = len(text)
        state = _state(directory / SESSION_FILE)
        if state and state.get("phase") == "applied" and len(state.get("endpoints", {})) >= wanted:
            time.sleep(0.2)
            print(log.read_text(errors="replace")[shown:], end="")
            print(
                f"kubeinfer up: running in the background (pid {child.pid}); "
                f"stop with: kubeinfer down"
                + (f" --directory {args.directory}" if args.directory else "")
            )
            return 0
        if not processes.is_running(child) or time.monotonic() > deadline:
            print("kubeinfer up: the session did not come up (see above)", file=sys.stderr)
            stop_directory(directory)
            return 1
        time.sleep(0.2)


def _object_count(files: list[Path]) -> int:
    import yaml

    count = 0
    for path in files:
        try:
            documents = list(yaml.safe_load_all(path.read_text()))
        except (OSError, yaml.YAMLError):
            continue
        count += sum(1 for d in documents if (d or {}).get("kind") == "InferenceDeployment")
    return count


def _state(path: Path) -> dict | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def _down(args: argparse.Namespace) -> int:
    from kubeinfer.cli.local.session import stop_directory

    directory = _directory(args)
    if not stop_directory(directory):
        print(f"kubeinfer down: nothing runs from {directory}", file=sys.stderr)
    return 0
