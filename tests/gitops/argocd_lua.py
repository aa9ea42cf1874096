"""What Argo CD does with a `resource_customizations/<group>/<Kind>/` folder, in Python, so
the Lua itself runs in the tests (PyPI `lupa`, Lua 5.1 as Argo CD's gopher-lua is):

- the script runs with the object as the global `obj` and only the libraries Argo CD opens
  for a `resource.customizations` entry without `useOpenLibs`: base, table, package and a
  safe os (no string, math, io, debug or coroutine, and no string methods), so a script
  that passes here also runs pasted into argocd-cm;
- its returned table is read as Argo CD's JSON encoder reads it (an empty table is `[]`,
  a table with keys 1..n a list), a health status outside Argo CD's set becomes Unknown,
  and an action's result goes through Argo CD's `cleanReturnedObj` (an empty table put
  where the object had a map keeps the map);
- `merge_patch(live, new)` is the RFC 7386 merge patch Argo CD computes from the live
  object to the action's result and sends to the API server (the status part, if any, to
  the status subresource).

The shape follows argo-cd's util/lua/lua.go (`runLua`, `ExecuteHealthLua`,
`ExecuteResourceAction`, `ExecuteResourceActionDiscovery`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lupa.lua51 as lua51

HEALTH_STATUSES = {"Unknown", "Progressing", "Suspended", "Healthy", "Degraded", "Missing"}
"""gitops-engine's health codes: anything else is Unknown (`isValidHealthStatusCode`)."""
CLOSED_LIBRARIES = ("string", "math", "io", "debug", "coroutine", "python")
SAFE_OS = ("time", "clock", "date", "difftime")


class LuaScriptError(Exception):
    """The script raised (`error(...)`); Argo CD shows the message and changes nothing."""


def _runtime() -> lua51.LuaRuntime:
    lua = lua51.LuaRuntime(unpack_returned_tuples=True, register_eval=False)
    lua.execute(
        # Without the string library a string has no methods: drop its metatable first.
        "debug.setmetatable('', nil)\n"
        + "".join(f"{name} = nil\n" for name in CLOSED_LIBRARIES)
        + "local safe = {}\n"
        + "".join(f"safe.{name} = os.{name}\n" for name in SAFE_OS)
        + "os = safe\n"
    )
    return lua


def _to_lua(lua: lua51.LuaRuntime, value: Any) -> Any:
    """As argo-cd's `decodeValue`: maps and lists become tables, null becomes nil."""
    if isinstance(value, dict):
        return lua.table_from({k: _to_lua(lua, v) for k, v in value.items() if v is not None})
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) for v in value])
    return value


def _to_python(value: Any) -> Any:
    """As gopher-json encodes a Lua value: an empty table or keys 1..n make a list."""
    if lua51.lua_type(value) != "table":
        return value
    keys = list(value.keys())
    if all(isinstance(k, int) for k in keys) and sorted(keys) == list(range(1, len(keys) + 1)):
        return [_to_python(value[k]) for k in range(1, len(keys) + 1)]
    return {str(k): _to_python(v) for k, v in value.items()}


def run(script: Path, obj: dict[str, Any]) -> Any:
    """The script's returned value, in Python; LuaScriptError when it raises."""
    lua = _runtime()
    lua.globals().obj = _to_lua(lua, obj)
    try:
        return _to_python(lua.execute(script.read_text()))
    except lua51.LuaError as error:
        raise LuaScriptError(str(error)) from None


def health(folder: Path, obj: dict[str, Any]) -> dict[str, str]:
    """`{status, message}` from the folder's health.lua."""
    result = run(folder / "health.lua", obj)
    if not isinstance(result, dict):
        raise LuaScriptError(f"expect table output from Lua script, not {result!r}")
    if result.get("status") not in HEALTH_STATUSES:
        return {"status": "Unknown", "message": "Lua returned an invalid health status"}
    return {"status": result["status"], "message": result.get("message", "")}


def discover(folder: Path, obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Action name -> `{disabled, displayName...}` from actions/discovery.lua."""
    result = run(folder / "actions" / "discovery.lua", obj)
    if result == []:
        return {}
    return {name: ({} if value == [] else value) for name, value in result.items()}


def act(folder: Path, action: str, obj: dict[str, Any]) -> dict[str, Any]:
    """The object actions/<action>/action.lua returns, cleaned as Argo CD cleans it."""
    result = run(folder / "actions" / action / "action.lua", obj)
    if not isinstance(result, dict):
        raise LuaScriptError(f"expect an object from the {action} action, not {result!r}")
    return _clean(result, obj)


def _clean(new: Any, old: Any) -> Any:
    """argo-cd's `cleanReturnedObj`: Lua cannot tell an empty map from an empty list."""
    if isinstance(new, dict) and isinstance(old, dict):
        return {
            key: (old[key] if value == [] and isinstance(old.get(key), dict) else
                  _clean(value, old.get(key)))
            for key, value in new.items()
        }  # fmt: skip
    if isinstance(new, list) and isinstance(old, list):
        return [_clean(n, o) for n, o in zip(new, old, strict=False)] + new[len(old) :]
    return new


def merge_patch(live: Any, new: Any) -> Any:
    """The RFC 7386 merge patch that turns `live` into `new` (what Argo CD sends)."""
    if not (isinstance(live, dict) and isinstance(new, dict)):
        return new
    patch: dict[str, Any] = {key: None for key in live if key not in new}
    for key, value in new.items():
        if key not in live:
            patch[key] = value
        elif live[key] != value:
            patch[key] = merge_patch(live[key], value)
    return patch
