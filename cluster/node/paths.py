"""A pod's file system, as a process on the node sees it. Pure.

A container sees its volumes at their mount paths (`/etc/kubeinfer`, `/cache`, `/tmp`);
here every container of every pod shares the node's one file system, so each mount path
stands for a directory of the pod's own under the node agent's directory. Without mount
namespaces (which need privileges a developer's machine may not grant), the node agent
rewrites the mount paths where a container names them: in its command, args and
environment, and in the text files of its ConfigMap and Secret volumes. A path is
rewritten only as a whole path component (`/tmp` in `/tmp/x` or `file:///tmp/x`, never in
`/var/tmp` or `/tmpfoo`), longest mount path first, so `/etc/kubeinfer-mirror` is not
taken for `/etc/kubeinfer` followed by `-mirror`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class PathMap:
    """Container path → host path, for one container."""

    mounts: Mapping[str, str]

    def _pattern(self) -> re.Pattern[str] | None:
        paths = sorted((p.rstrip("/") for p in self.mounts if p.rstrip("/")), key=len, reverse=True)
        if not paths:
            return None
        alternatives = "|".join(re.escape(p) for p in paths)
        # Not inside a longer path or word; a file:// URL's third slash is its root.
        return re.compile(rf"(?:(?<=file://)|(?<![\w./~-]))({alternatives})(?=$|[/\s\"':,;)\]}}=])")

    def apply(self, text: str) -> str:
        pattern = self._pattern()
        if pattern is None:
            return text
        table = {p.rstrip("/"): h.rstrip("/") for p, h in self.mounts.items()}
        return pattern.sub(lambda m: table[m.group(1)], text)

    def host_path(self, container_path: str) -> str | None:
        """Where an absolute container path lies on the node, or None if in no mount."""
        best = None
        for mount in self.mounts:
            root = mount.rstrip("/")
            if container_path == root or container_path.startswith(root + "/"):
                if best is None or len(root) > len(best):
                    best = root
        if best is None:
            return None
        host = self.mounts.get(best, self.mounts.get(best + "/", "")).rstrip("/")
        return host + container_path[len(best) :]


SERVICE_URL = re.compile(
    r"\b(https?)://([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)"
    r"\.svc(?:\.cluster\.local)?(?![-.\w])(?::(\d+))?"
)
"""A Service's cluster DNS name in a URL: scheme, service, namespace and optional port
(the whole host: `a.b.svc.example.com` is some other machine's name)."""


def service_references(text: str) -> list[tuple[str, str, int | None]]:
    """(namespace, service, port) of each Service URL in the text."""
    found = []
    for match in SERVICE_URL.finditer(text):
        port = int(match.group(6)) if match.group(6) else None
        found.append((match.group(4), match.group(2), port))
    return found


def resolve_services(text: str, endpoints: Mapping[tuple[str, str, int | None], str]) -> str:
    """Replaces each Service URL's host and port with a ready endpoint's `IP:port` (what
    cluster DNS and kube-proxy would route it to); a URL with no ready endpoint stays as
    it is, so a connection to it fails as it would."""

    def replace(match: re.Match[str]) -> str:
        port = int(match.group(6)) if match.group(6) else None
        target = endpoints.get((match.group(4), match.group(2), port))
        return f"{match.group(1)}://{target}" if target else match.group(0)

    return SERVICE_URL.sub(replace, text)
