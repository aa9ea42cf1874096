"""`OperatorSettings` through pydantic-settings: each field set by one variable,
`KUBEINFER_<GROUP>__<FIELD>` (the name the Helm chart passes), names case-insensitive; a
group given as one variable refused; a variable spelt like a setting but not one (the
flat names of earlier versions) refused naming the one meant; a bad value reported by its
variable; and a copy that refuses a field it does not have."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from kubeinfer.operator.settings import (
    InvalidSettings,
    KnownAnswers,
    OperatorSettings,
    Pods,
    misspelt,
)
from pydantic import ValidationError

Environ = Callable[[dict[str, str]], None]


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> Environ:
    """Sets the process environment's `KUBEINFER_` variables to exactly those given."""

    def set_only(variables: dict[str, str]) -> None:
        for name in [n for n in os.environ if n.upper().startswith("KUBEINFER_")]:
            monkeypatch.delenv(name)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return set_only


def test_unset_variables_keep_the_defaults(environ: Environ) -> None:
    environ({"BUILD_POLL_SECONDS": "1"})
    settings = OperatorSettings.from_env()
    assert settings == OperatorSettings()
    assert settings.requeue.build_poll_seconds == 10 and settings.watching.namespaces == ()


def test_each_field_is_set_by_its_group_and_name(environ: Environ) -> None:
    environ(
        {
            "KUBEINFER_IMAGES__RUNTIME": "registry.local/runtime:1",
            "KUBEINFER_WATCHING__NAMESPACES": "a, b",
            "KUBEINFER_BUILD__BACKOFF_SECONDS": "3",
            "KUBEINFER_METRICS__TIMEOUT_SECONDS": "2",
            "KUBEINFER_METRICS__POD_MONITOR_LABELS": "release=kps,team=ml",
            "KUBEINFER_LEADER_ELECTION__LEASE_DURATION_SECONDS": "30",
            "KUBEINFER_KNOWN_ANSWERS__TAINT_SUSPECT_NODES": "true",
            "kubeinfer_api__page_size": "50",  # names are case-insensitive
        }
    )
    settings = OperatorSettings.from_env()
    assert settings.images.runtime == "registry.local/runtime:1"
    assert settings.watching.namespaces == ("a", "b")
    assert settings.build.backoff_seconds == 3
    assert settings.metrics.timeout_seconds == 2
    assert settings.metrics.pod_monitor_labels == {"release": "kps", "team": "ml"}
    assert settings.leader_election.lease_duration_seconds == 30
    assert settings.api.page_size == 50
    assert settings.known_answers.taint_suspect_nodes is True
    assert KnownAnswers().taint_suspect_nodes is False, "off by default"


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"KUBEINFER_REQUEUE__RESYNC_INTERVAL_SECONDS": "soon"},
         "KUBEINFER_REQUEUE__RESYNC_INTERVAL_SECONDS: "),
        ({"KUBEINFER_BUILD__BACKOFF_SECONDS": "-1"}, "KUBEINFER_BUILD__BACKOFF_SECONDS: "),
        ({"KUBEINFER_BUILD__BACKOF_SECONDS": "3"}, "KUBEINFER_BUILD__BACKOF_SECONDS: Extra"),
        ({"KUBEINFER_METRICS__POD_MONITOR_LABELS": "nope"},
         "KUBEINFER_METRICS__POD_MONITOR_LABELS: expected"),
        ({"KUBEINFER_IMAGES__PULL_POLICY": "Sometimes"}, "KUBEINFER_IMAGES__PULL_POLICY: "),
        ({"KUBEINFER_PODS__TESTING_FAULTS_OBJECTS": "default/a,b"},
         "KUBEINFER_PODS__TESTING_FAULTS_OBJECTS: expected namespace/name"),
        ({"KUBEINFER_BUILD": '{"backoff_seconds": 3}'},
         "KUBEINFER_BUILD: a group is not set as a whole; set each of its fields as "
         "KUBEINFER_BUILD__<FIELD>"),
        ({"KUBEINFER_LEADER_ELECTION__LEASE_DURATION_SECONDS": "11"},
         "KUBEINFER_LEADER_ELECTION__LEASE_DURATION_SECONDS: must exceed"),
        ({"KUBEINFER_BUILD_BACKOFF_SECONDS": "3"},
         "KUBEINFER_BUILD_BACKOFF_SECONDS: not a setting; the variable is "
         "KUBEINFER_BUILD__BACKOFF_SECONDS"),
    ],
)  # fmt: skip
def test_a_bad_variable_is_reported_by_its_name(
    environ: Environ, variables: dict[str, str], message: str
) -> None:
    environ(variables)
    with pytest.raises(InvalidSettings) as raised:
        OperatorSettings.from_env()
    assert str(raised.value).startswith(message), raised.value


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("KUBEINFER_PROMETHEUS_URL", "KUBEINFER_METRICS__PROMETHEUS_URL"),
        ("KUBEINFER_RUNTIME_IMAGE", "KUBEINFER_IMAGES__RUNTIME"),
        ("KUBEINFER_GPU_RUNTIME_IMAGE", "KUBEINFER_IMAGES__GPU_RUNTIME"),
        ("KUBEINFER_IMAGE_PULL_POLICY", "KUBEINFER_IMAGES__PULL_POLICY"),
        ("KUBEINFER_NAMESPACES", "KUBEINFER_WATCHING__NAMESPACES"),
        ("KUBEINFER_SHADOW_POLL_SECONDS", "KUBEINFER_REQUEUE__SHADOW_POLL_SECONDS"),
        ("KUBEINFER_BUILD_BACKOFF_MAX_SECONDS", "KUBEINFER_BUILD__BACKOFF_MAX_SECONDS"),
        ("KUBEINFER_METRICS_TIMEOUT_SECONDS", "KUBEINFER_METRICS__TIMEOUT_SECONDS"),
        ("KUBEINFER_API_TIMEOUT_SECONDS", "KUBEINFER_API__TIMEOUT_SECONDS"),
        ("KUBEINFER_TIMEOUT_SECONDS",
         "KUBEINFER_METRICS__TIMEOUT_SECONDS or KUBEINFER_API__TIMEOUT_SECONDS"),
        ("KUBEINFER_LEADER_ELECTION_RETRY_PERIOD_SECONDS",
         "KUBEINFER_LEADER_ELECTION__RETRY_PERIOD_SECONDS"),
    ],
)  # fmt: skip
def test_a_setting_by_another_name_is_refused_naming_its_variable(name: str, meant: str) -> None:
    assert misspelt({name: "1", "HOME": "/"}) == [f"{name}: not a setting; the variable is {meant}"]


def test_other_variables_of_the_prefix_are_left_alone() -> None:
    names = (
        "KUBEINFER_SERVE_MAX_BATCH_SIZE",
        "KUBEINFER_UPDATE_GOLDEN",
        "KUBEINFER_API__PAGE_SIZE",
    )
    assert misspelt(dict.fromkeys(names, "1")) == []


def test_the_constructor_reads_the_process_environment(environ: Environ) -> None:
    environ({"KUBEINFER_REQUEUE__SHADOW_POLL_SECONDS": "3", "KUBEINFER_API__TIMEOUT_SECONDS": "9"})
    settings = OperatorSettings(requeue={"autoscale_poll_seconds": 1})  # arguments win
    assert settings.requeue.shadow_poll_seconds == 3 and settings.api.timeout_seconds == 9
    assert settings.requeue.autoscale_poll_seconds == 1
    assert OperatorSettings.from_env().requeue.shadow_poll_seconds == 3


def test_a_copy_refuses_a_field_it_does_not_have(environ: Environ) -> None:
    environ({})
    settings = OperatorSettings.from_env()
    with pytest.raises(ValidationError, match="shadow_poll_seconds"):
        settings.model_copy(update={"shadow_poll_seconds": 0.5})
    copied = settings.model_copy(update={"requeue": {"shadow_poll_seconds": 0.5}})
    assert copied.requeue.shadow_poll_seconds == 0.5
    assert copied.build == settings.build


def test_the_local_modes_settings_are_read(environ: Environ) -> None:
    from kubeinfer.cli.local.install import LOCAL_SETTINGS

    environ(LOCAL_SETTINGS)
    settings = OperatorSettings.from_env()
    requeue, pods = settings.requeue, settings.pods
    assert (requeue.autoscale_poll_seconds, requeue.shadow_poll_seconds) == (2, 2)
    assert (pods.pre_stop_sleep_seconds, pods.drain_grace_period_seconds) == (5, 5)


def test_the_demos_faults_are_read_for_its_one_object(environ: Environ) -> None:
    from kubeinfer.cli.demo.answers import ANSWERS, FAULTS

    environ(FAULTS)
    pods = OperatorSettings.from_env().pods
    assert pods.testing_faults_objects == (f"default/{ANSWERS}",)
    assert pods.injects_faults_into("default", ANSWERS)
    assert not pods.injects_faults_into("default", "demo")
    environ({})
    assert OperatorSettings.from_env().pods == Pods(), "none unless asked"
    assert Pods().testing_faults_objects is None
    assert not Pods().injects_faults_into("default", ANSWERS)
