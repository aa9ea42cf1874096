"""When a failed build attempt is retried (`engine_state.retry_time`): the backoff after
its failure, doubling per attempt and capped; at once when the Job does not say when it
failed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubeinfer.operator.settings import OperatorSettings
from kubeinfer.operator.state.build_attempt import AttemptPhase, AttemptState
from kubeinfer.operator.state.engine_state import retry_time

FAILED_AT = datetime(2025, 1, 1, tzinfo=UTC)
SETTINGS = OperatorSettings(build={"backoff_seconds": 30, "backoff_max_seconds": 100})


@pytest.mark.parametrize(("attempt", "seconds"), [(0, 30), (1, 60), (2, 100), (40, 100)])
def test_the_backoff_doubles_per_attempt_up_to_its_cap(attempt, seconds):
    failed = AttemptState(AttemptPhase.FAILED, failure="OOMKilled", failed_at=FAILED_AT)
    assert retry_time(failed, attempt, SETTINGS) == FAILED_AT + timedelta(seconds=seconds)


def test_a_failure_of_unknown_time_is_retried_at_once():
    assert retry_time(AttemptState(AttemptPhase.FAILED), 3, SETTINGS) is None
