"""`python -m kubeinfer.cli.chart [--write]`: renders the chart's values.yaml and
values.schema.json from `kubeinfer.cli.chart.values` into `helm/kubeinfer/`; without
`--write`, checks that the files there are what the model renders (exit 1 naming the
files that differ otherwise)."""

from __future__ import annotations

import sys

from kubeinfer.cli.chart.render import rendered
from kubeinfer.contract import generated_files


def main(argv: list[str] | None = None) -> int:
    return generated_files.main("python -m kubeinfer.cli.chart", rendered, argv)


if __name__ == "__main__":
    sys.exit(main())
