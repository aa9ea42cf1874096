"""Fixtures of the chart's tests: `helm`, the real binary (built once per machine by
`kubeinfer cluster build`, which `make test` runs first) with folders of its own."""

from __future__ import annotations

import pytest
from helm_harness import Helm, helm_binary


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(helm_binary(), tmp_path_factory.mktemp("helm"))
