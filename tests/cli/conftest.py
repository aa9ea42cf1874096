"""What the command line's tests share: perf_analyzer, which `kubeinfer tune` drives its
load with, required by the tests that run it."""

from __future__ import annotations

import os

import pytest
from kubeinfer.cli.tune import perf


@pytest.fixture
def perf_analyzer() -> str:
    """perf_analyzer's path; skips the test without one, or fails it when CI=true."""
    try:
        return perf.find_perf_analyzer()
    except perf.PerfAnalyzerMissing as missing:
        message = f"{missing} (`make test` installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}: CI must run the tests that use it", pytrace=False)
        pytest.skip(message)
