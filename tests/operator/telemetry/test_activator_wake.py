"""The operator's wake endpoint for the activator (`serve_metrics` with its board) over
real HTTP: a wake of the right shape reaches the reconciler's handler and is answered 202;
a body of another shape is a 400 with a JSON message, reaching nothing; a replica that
does not reconcile (no handler, or one that declines) answers 503, so the activator
posts again."""

from __future__ import annotations

import aiohttp
from kubeinfer.operator.telemetry.exporter import (
    WAKE_PATH,
    StatusBoard,
    board_registry,
    serve_metrics,
)


async def test_a_wake_reaches_the_reconciler_and_a_bad_one_is_refused() -> None:
    board = StatusBoard()
    woken: list[tuple[str, str]] = []
    async with (
        serve_metrics(board_registry(board), 0, host="127.0.0.1", board=board) as port,
        aiohttp.ClientSession() as session,
    ):
        url = f"http://127.0.0.1:{port}{WAKE_PATH}"
        async with session.post(url, json={"namespace": "ml", "service": "resnet"}) as answer:
            assert answer.status == 503, "a standby: nothing reconciles here"
            assert "error" in await answer.json()
        board.wake = lambda namespace, service: woken.append((namespace, service)) is None
        async with session.post(url, json={"namespace": "ml", "service": "resnet"}) as answer:
            assert answer.status == 202
        for bad in (
            "not json",
            '{"namespace": "ml"}',
            '["ml", "resnet"]',
            '{"namespace": 1, "service": "x"}',
        ):
            async with session.post(url, data=bad) as answer:
                assert answer.status == 400, bad
                assert "namespace" in (await answer.json())["error"]
        board.wake = lambda namespace, service: False  # the reconciler is closing
        async with session.post(url, json={"namespace": "ml", "service": "resnet"}) as answer:
            assert answer.status == 503
    assert woken == [("ml", "resnet")]
