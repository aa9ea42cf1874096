"""The layers hold: import-linter's contracts in `.importlinter` (the runtime never imports
the operator; serving and the engine build never import each other; pure decisions import
no I/O; only engines import engine libraries)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_module_grows_past_500_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {lines} lines"
        for folder in ("operator", "runtime")
        for path in (ROOT / folder).rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > 500
    ]
    assert not long, long
