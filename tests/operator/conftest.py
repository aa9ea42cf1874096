"""Fixtures of the operator scenarios: `world`, an emulated API server on a real HTTP
port (see `operator_harness`), and kopf's logs kept to warnings."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
from operator_harness import RECORDED_CALLS, SPEC_WRITES, World, emulated_world, pod_monitor_api


@pytest.fixture
async def world(request: pytest.FixtureRequest) -> AsyncIterator[World]:
    extra = pod_monitor_api() if request.node.get_closest_marker("serves_pod_monitors") else None
    async with emulated_world(extra) as world:
        yield world
        RECORDED_CALLS[request.node.name] = set(world.api.calls)
        SPEC_WRITES[request.node.name] = list(world.api.spec_writes)


@pytest.fixture(autouse=True)
def _quiet_kopf(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kopf")
