"""The chart's monitoring files are what `kubeinfer.cli.monitoring` renders (a drift test:
edit the code, then `python -m kubeinfer.cli.monitoring --write`), and every series they
read is one the contract names (the runtime's or the operator's), with `_total`,
`_bucket`, `_count` or `_sum` where its kind has them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kubeinfer.cli.monitoring import dashboard
from kubeinfer.cli.monitoring.__main__ import main
from kubeinfer.cli.monitoring.render import DASHBOARD, RULES, rendered
from kubeinfer.contract import metric_series as series

ROOT = Path(__file__).resolve().parents[2]


def test_the_checked_in_files_are_what_the_code_renders() -> None:
    for relative, text in rendered().items():
        on_disk = (ROOT / relative).read_text()
        assert on_disk == text, (
            f"{relative} is stale: run python -m kubeinfer.cli.monitoring --write"
        )


def test_the_check_mode_names_a_stale_file(tmp_path: Path, capsys) -> None:
    assert main(["--write", "--root", str(tmp_path)]) == 0
    assert main(["--root", str(tmp_path)]) == 0
    (tmp_path / RULES).write_text("groups: []\n")
    assert main(["--root", str(tmp_path)]) == 1
    assert RULES in capsys.readouterr().err


def exported_samples() -> set[str]:
    names = set()
    for value in vars(series).values():
        if isinstance(value, series.Series):
            if value.kind == "counter":
                names.add(value.total)
            elif value.kind == "histogram":
                names |= {f"{value.name}_{part}" for part in ("bucket", "count", "sum")}
            else:
                names.add(value.name)
    return names


def test_every_series_read_is_one_the_contract_names() -> None:
    exported = exported_samples()
    for relative in (RULES, DASHBOARD):
        read = set(re.findall(r"\bkubeinfer_[a-z0-9_]+", (ROOT / relative).read_text()))
        assert read and read <= exported, (relative, read - exported)


def test_the_dashboard_has_every_panel_its_sections_list_with_a_query_each() -> None:
    built = json.loads((ROOT / DASHBOARD).read_text())
    titles = [p["title"] for p in built["panels"] if p["type"] != "row"]
    assert titles == [spec.title for spec in dashboard.panels()]
    assert all(p["targets"] for p in built["panels"] if p["type"] != "row")
    ids = [p["id"] for p in built["panels"]]
    assert len(set(ids)) == len(ids)
    assert {v["name"] for v in built["templating"]["list"]} == {"datasource", "namespace", "model"}
