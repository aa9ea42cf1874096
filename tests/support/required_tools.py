"""A tool from the machine's packages that some tests need (`make test` installs the
Debian ones it can): without it those tests skip, except under `CI=true`, where they fail,
since CI must run them."""

from __future__ import annotations

import os
import shutil

import pytest


def require_tool(command: str, missing: str, tests: str) -> str:
    """The path of `command`; otherwise skips the test saying `missing` (what it is and
    how to get it), or under CI=true fails it as one of `tests`."""
    binary = shutil.which(command)
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing}: CI must run {tests}", pytrace=False)
        pytest.skip(missing)
    return binary
