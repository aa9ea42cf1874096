"""`python -m kubeinfer.cli.chart [--write]`: renders the chart's values.yaml and
values.schema.json from `kubeinfer.cli.chart.values` into `helm/kubeinfer/`; without
`--write`, checks that the files there are what the model renders (exit 1 naming the
files that differ otherwise)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kubeinfer.cli.chart.render import rendered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubeinfer.cli.chart")
    parser.add_argument("--write", action="store_true", help="write the files")
    parser.add_argument("--root", default=".", help="the repository root (default: .)")
    args = parser.parse_args(argv)
    stale = []
    for relative, text in rendered().items():
        path = Path(args.root) / relative
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(relative)
        elif not path.exists() or path.read_text() != text:
            stale.append(relative)
    if stale:
        print(f"Out of date (run python -m kubeinfer.cli.chart --write): {stale}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
