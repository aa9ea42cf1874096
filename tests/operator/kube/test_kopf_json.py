"""kopf's watch streams parsed with orjson (`kube.kopf_json`): once the operator has set kopf
up, the lines kopf's stream reads give the same values the standard library's json gave,
for what the API server sends (unicode, floats, 64-bit integers, nulls, nesting)."""

from __future__ import annotations

import json

import kopf
from kopf._cogs.clients import api
from kubeinfer.operator.handlers import configure_kopf
from kubeinfer.operator.kube import kopf_json

LINE = json.dumps({
    "type": "MODIFIED",
    "object": {
        "metadata": {"name": "modèle-ü", "resourceVersion": "9223372036854775807",
                     "generation": 9_223_372_036_854_775_807, "labels": None},
        "status": {"ratio": 0.1 + 0.2, "tiny": 5e-324, "items": [[], {}, True, -0.0]},
    },
}, ensure_ascii=False)  # fmt: skip


def test_the_operators_kopf_parses_watch_lines_with_orjson_and_the_same_values() -> None:
    configure_kopf(kopf.OperatorSettings())
    assert kopf_json.installed()
    assert api.json.loads(LINE) == json.loads(LINE)
    assert api.json.loads.__module__ == "orjson"
