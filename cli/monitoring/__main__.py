"""`python -m kubeinfer.cli.monitoring [--write]`: renders the chart's alert rules and
Grafana dashboard from `alerts.py` and `dashboard.py` into
`helm/kubeinfer/files/monitoring/`; without `--write`, checks that the files there are
what the code renders (exit 1 and the files that differ otherwise)."""

from __future__ import annotations

import argparse
import sys

from kubeinfer.cli.monitoring.render import FILES, rendered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubeinfer.cli.monitoring")
    parser.add_argument("--write", action="store_true", help="write the files")
    parser.add_argument("--root", default=".", help="the repository root (default: .)")
    args = parser.parse_args(argv)
    from pathlib import Path

    stale = []
    for relative, text in rendered().items():
        path = Path(args.root) / relative
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        elif not path.exists() or path.read_text() != text:
            stale.append(relative)
    if stale:
        print(
            f"Out of date (run python -m kubeinfer.cli.monitoring --write): {stale}",
            file=sys.stderr,
        )
        return 1
    if args.write:
        print("\n".join(FILES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
