"""The `kubectl get infd` view, as the API server renders it: the Table of the CRD's
printer columns (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), printed in
kubectl's layout, so what `kubeinfer up` shows is what kubectl would."""

from __future__ import annotations

from typing import Any

TABLE = "application/json;as=Table;g=meta.k8s.io;v=v1"


def changing_cells(table: dict[str, Any]) -> list[int]:
    """Indexes of the columns that change with time alone (AGE), which must not count as a
    change of the row."""
    return [
        i
        for i, c in enumerate(table.get("columnDefinitions") or [])
        if c.get("format") == "date-time" or c["name"].lower() == "age"
    ]


def row_key(table: dict[str, Any], row: dict[str, Any]) -> tuple[str, ...]:
    ageing = set(changing_cells(table))
    return tuple("" if i in ageing else str(c) for i, c in enumerate(row["cells"]))


def render(table: dict[str, Any], namespaces: bool = True) -> list[str]:
    """Aligned lines, header first: kubectl's columns (priority 0), NAMESPACE first when
    several namespaces are listed."""
    columns = [c for c in table.get("columnDefinitions") or [] if not c.get("priority")]
    indexes = [
        i for i, c in enumerate(table.get("columnDefinitions") or []) if not c.get("priority")
    ]
    header = [c["name"].upper() for c in columns]
    rows = []
    for row in table.get("rows") or []:
        cells = ["" if row["cells"][i] is None else str(row["cells"][i]) for i in indexes]
        namespace = (row.get("object") or {}).get("metadata", {}).get("namespace", "")
        rows.append([namespace, *cells] if namespaces else cells)
    if namespaces:
        header = ["NAMESPACE", *header]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return [
        "   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
