"""`python -m kubeinfer.cli.monitoring [--write]`: renders the chart's alert rules and
Grafana dashboard from `alerts.py` and `dashboard.py` into
`helm/kubeinfer/files/monitoring/`; without `--write`, checks that the files there are
what the code renders (exit 1 naming the files that differ otherwise)."""

from __future__ import annotations

import sys

from kubeinfer.cli.monitoring.render import rendered
from kubeinfer.contract import generated_files


def main(argv: list[str] | None = None) -> int:
    return generated_files.main("python -m kubeinfer.cli.monitoring", rendered, argv)


if __name__ == "__main__":
    sys.exit(main())
