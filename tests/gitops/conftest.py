"""The GitOps tests reuse the operator scenarios' harness (`tests/operator`)."""

from __future__ import annotations

import sys
from pathlib import Path

OPERATOR_TESTS = str(Path(__file__).resolve().parents[1] / "operator")
if OPERATOR_TESTS not in sys.path:
    sys.path.insert(0, OPERATOR_TESTS)
