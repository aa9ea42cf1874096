"""Files the code generates and the repository keeps a copy of (the CRD and the chart's
copy of it, the chart's values and their schema, its alert rules and dashboard): each
generator's command writes them or checks them the same way, through `write_or_check`, so
a stale copy is named alike whichever command made it. Here, below both planes and the
command line, because the operator's `kubeinfer crds` and the command line's chart and
monitoring generators all use it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path


def stale_files(files: Mapping[str, str], root: Path) -> dict[str, str]:
    """Those of `files` (a path relative to `root` -> the text it should hold) missing
    under `root` or holding other text, each with what is wrong with it."""
    found = {}
    for relative, text in files.items():
        path = root / relative
        if not path.exists():
            found[relative] = "missing"
        elif path.read_text() != text:
            found[relative] = "stale"
    return found


def write_or_check(files: Mapping[str, str], root: Path, *, write: bool, command: str) -> int:
    """With `write`, writes each of `files` under `root` (making its folder) and says so on
    stderr. Otherwise checks them, naming on stderr each one missing or stale and the
    `command` that writes it; 1 when any is. 0 otherwise."""
    if write:
        for relative, text in files.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {relative}", file=sys.stderr)
        return 0
    stale = stale_files(files, root)
    for relative, wrong in stale.items():
        print(f"{relative} is {wrong}: run `{command}`", file=sys.stderr)
    return 1 if stale else 0


def main(prog: str, render: Callable[[], Mapping[str, str]], argv: list[str] | None) -> int:
    """The command line of a generator run as `prog [--write] [--root DIR]`: checks the
    files `render` makes (write them with `--write`); `write_or_check`'s exit status."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--write", action="store_true", help="write the files")
    parser.add_argument("--root", default=".", help="the repository root (default: .)")
    args = parser.parse_args(argv)
    return write_or_check(render(), Path(args.root), write=args.write, command=f"{prog} --write")
