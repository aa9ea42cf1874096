"""The API server's write semantics the emulator needs, as pure functions: merge patch
(RFC 7386), JSON patch (RFC 6902), the field-ownership part of server-side apply, and
label selectors."""

from __future__ import annotations

import copy
import re
from typing import Any


class ApiRejection(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def json_patch(target: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 (add, replace, remove, test)."""
    result = copy.deepcopy(target)
    for op in operations:
        *parents, last = _pointer(op["path"])
        node: Any = result
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.get(part)
            if node is None:
                raise ApiRejection(422, "Invalid", f"path {op['path']} does not exist")
        if op["op"] == "test":
            current = node[int(last)] if isinstance(node, list) else node.get(last)
            if current != op["value"]:
                raise ApiRejection(422, "Invalid", f"test at {op['path']} failed")
        elif op["op"] in ("add", "replace"):
            if isinstance(node, list):
                node.insert(len(node) if last == "-" else int(last), op["value"])
            else:
                node[last] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        else:
            raise ApiRejection(422, "Invalid", f"unsupported op {op['op']}")
    return result


def prune(live: Any, previous: Any, current: Any) -> Any:
    """Removes from `live` what the manager applied before (`previous`) but not now."""
    if not isinstance(live, dict) or not isinstance(previous, dict):
        return live
    result = dict(live)
    for key, value in previous.items():
        if not isinstance(current, dict) or key not in current:
            result.pop(key, None)
        elif key in result:
            result[key] = prune(result[key], value, current[key])
    return result


def deep_merge(live: Any, applied: Any) -> Any:
    if isinstance(live, dict) and isinstance(applied, dict):
        result = dict(live)
        for key, value in applied.items():
            result[key] = deep_merge(live.get(key), value)
        return result
    return copy.deepcopy(applied)


def _requirements(selector: str) -> list[tuple[str, str, set[str]]]:
    """Parses a label selector into (key, operator, values)."""
    result = []
    for part in re.findall(r"[^,(]+(?:\([^)]*\))?", selector or ""):
        part = part.strip()
        if not part:
            continue
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", part):
            values = {v.strip() for v in m.group(3).split(",") if v.strip()}
            result.append((m.group(1), m.group(2), values))
        elif m := re.fullmatch(r"(\S+?)\s*(==|!=|=)\s*(\S*)", part):
            result.append((m.group(1), "!=" if m.group(2) == "!=" else "=", {m.group(3)}))
        elif part.startswith("!"):
            result.append((part[1:].strip(), "!exists", set()))
        else:
            result.append((part, "exists", set()))
    return result


def matches_selector(obj: dict[str, Any], selector: str | None) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for key, op, values in _requirements(selector or ""):
        present, value = key in labels, labels.get(key)
        if op in ("=", "in") and (not present or value not in values):
            return False
        if op in ("!=", "notin") and present and value in values:
            return False
        if (op == "exists") != present and op in ("exists", "!exists"):
            return False
    return True
