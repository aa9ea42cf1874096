"""Fixtures of the operator scenarios: `world`, an emulated API server on a real HTTP
port (see `operator_harness`), and kopf's logs kept to warnings."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import kmock
import pytest
from emulator import ApiServerEmulator
from operator_harness import RECORDED_CALLS, World


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with ApiServerEmulator() as api, kmock.Server(api) as server:
        yield World(api, str(server.url).rstrip("/"))
        RECORDED_CALLS.update(api.calls)


@pytest.fixture(autouse=True)
def _quiet_kopf(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kopf")
