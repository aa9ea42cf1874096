"""The host's network namespace as text, to prove a test left it as it was: its links, its
routes in every table, and its firewall rules (iptables-save, and nft's ruleset where nft
is installed). Counters and timestamps are left out: traffic changes them, not rules.
Read from the host's namespace even where the test process has left it (every test
worker runs in a namespace of its own: `netns.in_host_namespace`)."""

from __future__ import annotations

import difflib
import re
import shutil
import subprocess

from kubeinfer.cluster import netns

COMMANDS = {
    "links": ["ip", "-o", "link", "show"],
    "addresses": ["ip", "-o", "address", "show"],
    "routes": ["ip", "-4", "route", "show", "table", "all"],
    "ipv6 routes": ["ip", "-6", "route", "show", "table", "all"],
    "iptables": ["iptables-save"],
    "ip6tables": ["ip6tables-save"],
    "nftables": ["nft", "list", "ruleset"],
}


def _normalized(name: str, text: str) -> list[str]:
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    if name in ("iptables", "ip6tables"):
        lines = [re.sub(r"\[\d+:\d+\]", "", line) for line in lines]
    if name == "nftables":
        lines = [re.sub(r"(packets|bytes) \d+", r"\1", line) for line in lines]
    if name in ("routes", "ipv6 routes", "addresses"):  # learned ones count their life down
        lines = [re.sub(r"(expires|_lft) \d+sec", r"\1", line) for line in lines]
    return lines


def snapshot() -> dict[str, list[str]]:
    """Each view of the host's network that its tool can give (a missing tool: none)."""
    views: dict[str, list[str]] = {}
    for name, argv in COMMANDS.items():
        if shutil.which(argv[0], path="/usr/sbin:/sbin:/usr/bin:/bin"):
            command, descriptors = netns.in_host_namespace(argv)
            result = subprocess.run(
                command, capture_output=True, text=True, check=False, pass_fds=descriptors
            )
            views[name] = _normalized(name, result.stdout + result.stderr)
    return views


def changes(before: dict[str, list[str]], after: dict[str, list[str]]) -> list[str]:
    """The lines that differ between two snapshots, as a unified diff per view."""
    found: list[str] = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name, []), after.get(name, [])
        if old != new:
            found += [f"{name}:", *difflib.unified_diff(old, new, lineterm="", n=0)]
    return found
