"""Where a session runs: it builds in the host's network namespace, then leaves it.

Everything the cluster runs is built (or found in the cache) first, with progress, where
the package registries are: the control plane's and the node's binaries, Prometheus, and
the images the node imports (`kubeinfer cluster build` builds the same). Then the session
process moves into a network namespace of its own (`netns.enter_new_namespace`), where
the cluster runs as on a node of its own (`control_plane.up(in_this_namespace=True)`) and
the session reaches pods, Services and Prometheus directly. Only the main thread moves,
and threads inherit their creator's namespace, so this happens before any other thread
exists (asyncio's executor threads included: before the event loop runs).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kubeinfer.cli.local import prometheus
from kubeinfer.cluster import binaries, control_plane, netns


class NamespaceProblem(RuntimeError):
    """The session could not move into a namespace of its own; the message says why."""


@dataclass(frozen=True)
class Entered:
    """The two namespaces of a session, as descriptors, and what was built for it."""

    host: int
    """The namespace the session started in: the user's, where its ports listen."""
    inside: int
    """The session's own, where the cluster runs."""
    prometheus_binary: str | None
    prometheus_problem: str
    """Why there is no Prometheus binary ("" when there is one)."""


def build(say: Callable[[str], None]) -> tuple[str | None, str]:
    """Builds or finds what the cluster runs; the Prometheus binary or why there is none
    (the session then goes on with the operator's direct read of the pods)."""
    found = {**binaries.ensure_binaries(), **binaries.ensure_node_binaries()}
    control_plane.node_images(found, progress=say)
    return prometheus.prometheus_binary()


def build_then_enter(say: Callable[[str], None]) -> Entered:
    """`build`, then this process' main thread in a new network namespace."""
    binary, problem = build(say)
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    if others:
        raise NamespaceProblem(
            f"threads already run ({', '.join(others)}): they would stay in the host's "
            "namespace; the session must enter its own before any thread starts"
        )
    host = netns.enter_new_namespace()
    inside = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    return Entered(host, inside, binary, problem)
