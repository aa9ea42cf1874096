"""`OperatorSettings` through pydantic-settings: the `KUBEINFER_` prefix, groups set by
their nested names (`KUBEINFER_BUILD__BACKOFF_SECONDS`) or by the flat names the Helm
chart, the local mode and the README use, a bad value reported by its variable, and the
flat Python names today's call sites still use."""

from __future__ import annotations

import pytest
from kubeinfer.operator.settings import FLAT_NAMES, InvalidSettings, OperatorSettings
from pydantic import ValidationError


def test_unset_variables_keep_the_defaults() -> None:
    settings = OperatorSettings.from_env({"HOME": "/tmp", "BUILD_POLL_SECONDS": "1"})
    assert settings == OperatorSettings.from_env({})
    assert settings.requeue.build_poll_seconds == 10 and settings.watching.namespaces == ()


def test_flat_names_set_grouped_fields() -> None:
    settings = OperatorSettings.from_env(
        {
            "KUBEINFER_RUNTIME_IMAGE": "registry.local/runtime:1",
            "KUBEINFER_NAMESPACES": "a, b",
            "KUBEINFER_BUILD_BACKOFF_SECONDS": "3",
            "KUBEINFER_METRICS_TIMEOUT_SECONDS": "2",
            "KUBEINFER_POD_MONITOR_LABELS": "release=kps,team=ml",
            "kubeinfer_api_page_size": "50",  # names are case-insensitive, as before
        }
    )
    assert settings.images.runtime == "registry.local/runtime:1"
    assert settings.watching.namespaces == ("a", "b")
    assert settings.build.backoff_seconds == 3
    assert settings.metrics.timeout_seconds == 2
    assert settings.metrics.pod_monitor_labels == {"release": "kps", "team": "ml"}
    assert settings.api.page_size == 50


def test_nested_names_set_grouped_fields_and_win_over_flat_ones() -> None:
    settings = OperatorSettings.from_env(
        {
            "KUBEINFER_BUILD__BACKOFF_SECONDS": "4",
            "KUBEINFER_BUILD_BACKOFF_SECONDS": "3",
            "KUBEINFER_WATCHING__NAMESPACES": "c,d",
            "KUBEINFER_LEADER_ELECTION": '{"lease_duration_seconds": 30}',
        }
    )
    assert settings.build.backoff_seconds == 4
    assert settings.watching.namespaces == ("c", "d")
    assert settings.leader_election.lease_duration_seconds == 30


def test_every_flat_name_the_chart_and_the_local_mode_set_is_known() -> None:
    for name in (
        "RUNTIME_IMAGE", "GPU_RUNTIME_IMAGE", "PROMETHEUS_URL", "POD_MONITORS",
        "POD_MONITOR_LABELS", "AUTOSCALE_POLL_SECONDS", "SHADOW_POLL_SECONDS",
        "PRE_STOP_SLEEP_SECONDS", "DRAIN_GRACE_PERIOD_SECONDS", "RESYNC_INTERVAL_SECONDS",
        "BUILD_POLL_SECONDS", "API_TIMEOUT_SECONDS", "API_PAGE_SIZE", "IMAGE_PULL_POLICY",
        "LEADER_ELECTION_LEASE_DURATION_SECONDS", "LEADER_ELECTION_RENEW_DEADLINE_SECONDS",
        "LEADER_ELECTION_RETRY_PERIOD_SECONDS", "FIELD_MANAGER",
    ):  # fmt: skip
        assert name.lower() in FLAT_NAMES, name


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"KUBEINFER_RESYNC_INTERVAL_SECONDS": "soon"}, "KUBEINFER_RESYNC_INTERVAL_SECONDS: "),
        ({"KUBEINFER_BUILD_BACKOFF_SECONDS": "-1"}, "KUBEINFER_BUILD_BACKOFF_SECONDS: "),
        ({"KUBEINFER_BUILD__BACKOFF_SECONDS": "x"}, "KUBEINFER_BUILD__BACKOFF_SECONDS: "),
        ({"KUBEINFER_POD_MONITOR_LABELS": "nope"}, "KUBEINFER_POD_MONITOR_LABELS: expected"),
        ({"KUBEINFER_IMAGE_PULL_POLICY": "Sometimes"}, "KUBEINFER_IMAGE_PULL_POLICY: "),
        ({"KUBEINFER_BUILD": "{not json"}, "KUBEINFER_BUILD: not a JSON object"),
        ({"KUBEINFER_LEADER_ELECTION_LEASE_DURATION_SECONDS": "11"},
         "KUBEINFER_LEADER_ELECTION_LEASE_DURATION_SECONDS: must exceed"),
    ],
)  # fmt: skip
def test_a_bad_value_is_reported_by_its_variable(environ: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidSettings) as raised:
        OperatorSettings.from_env(environ)
    assert str(raised.value).startswith(message), raised.value


def test_the_constructor_reads_the_process_environment(monkeypatch) -> None:
    monkeypatch.setenv("KUBEINFER_SHADOW_POLL_SECONDS", "3")
    monkeypatch.setenv("KUBEINFER_API__TIMEOUT_SECONDS", "9")
    settings = OperatorSettings(requeue={"autoscale_poll_seconds": 1})  # arguments win
    assert settings.requeue.shadow_poll_seconds == 3 and settings.api.timeout_seconds == 9
    assert settings.requeue.autoscale_poll_seconds == 1
    assert OperatorSettings.from_env().requeue.shadow_poll_seconds == 3


def test_a_copy_refuses_a_field_it_does_not_have() -> None:
    settings = OperatorSettings.from_env({})
    with pytest.raises(ValidationError, match="shadow_poll_seconds"):
        settings.model_copy(update={"shadow_poll_seconds": 0.5})
    copied = settings.model_copy(update={"requeue": {"shadow_poll_seconds": 0.5}})
    assert copied.requeue.shadow_poll_seconds == 0.5
    assert copied.build == settings.build
