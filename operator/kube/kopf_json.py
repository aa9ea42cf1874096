"""kopf's watch streams parsed with orjson: at fleet scale, parsing them was the largest
single cost in the operator's profile (the standard library's `json.loads` of every
event kopf receives, on the one event loop; docs/fleet.md).

kopf 1.45 parses each line of a watch stream with `json.loads` in
`_cogs/clients/api.py`, the module's only use of `json`. `install` points that module's
`json` at one whose `loads` is orjson's (the same Python values for what the API server
sends: objects, arrays, strings, 64-bit integers and floats); `dumps` stays the standard
library's. Like `kopf_toggles`, a patch of a private module: remove it once kopf parses
with a faster library itself. `tests/benchmarks/bench_kopf_watch_json.py` measures the
two on the events a fleet's watches carry.
"""

from __future__ import annotations

import json
import types

import orjson
from kopf._cogs.clients import api

FAST_JSON = types.SimpleNamespace(loads=orjson.loads, dumps=json.dumps)


def install() -> None:
    """Makes kopf's watch streams parse with orjson; idempotent."""
    api.json = FAST_JSON  # type: ignore[assignment]


def installed() -> bool:
    return api.json is FAST_JSON
