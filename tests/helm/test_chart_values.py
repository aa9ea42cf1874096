"""The chart's values and their schema come from one typed model (`kubeinfer.cli.chart`):
the files in the chart are exactly what the model renders (a drift check, as the CRD's),
values.yaml holds the model's defaults, every operator setting is a value with the
operator's own bounds, and the default images are the ones this repository builds
(`kubeinfer.cluster.images`, the Dockerfile's targets) at the chart's version. No helm
binary here: see test_chart_render.py for what Helm makes of them."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import yaml
from kubeinfer.cli.chart import render
from kubeinfer.cli.chart.__main__ import main
from kubeinfer.cli.chart.values import ChartValues, OperatorSettingsValues
from kubeinfer.cluster import images
from kubeinfer.operator.settings import OperatorSettings
from pydantic.alias_generators import to_camel

REPO = Path(__file__).parents[2]
CHART = REPO / "helm" / "kubeinfer"


def test_the_charts_values_and_schema_are_what_the_model_renders() -> None:
    for relative, text in render.rendered().items():
        assert (REPO / relative).read_text() == text, (
            f"{relative} is stale: run `python -m kubeinfer.cli.chart --write`"
        )


def test_the_check_mode_names_a_stale_file(tmp_path: Path, capsys) -> None:
    assert main(["--write", "--root", str(tmp_path)]) == 0
    assert main(["--root", str(tmp_path)]) == 0
    (tmp_path / render.SCHEMA).write_text("{}\n")
    assert main(["--root", str(tmp_path)]) == 1
    assert render.SCHEMA in capsys.readouterr().err


def test_values_yaml_holds_the_models_defaults() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values == render.values_dict(ChartValues())
    assert values["monitoring"]["dashboard"]["labels"] == {"grafana_dashboard": "1"}


def test_every_operator_setting_but_the_watched_namespaces_is_a_value() -> None:
    groups = set(OperatorSettings.model_fields) - {"watching"}
    assert set(OperatorSettingsValues.model_fields) == groups
    schema = json.loads((CHART / "values.schema.json").read_text())
    settings = schema["$defs"]["OperatorSettingsValues"]["properties"]
    assert set(settings) == {to_camel(group) for group in groups}
    # The operator's own bounds: a resync interval must be positive and at most a day.
    requeue = schema["$defs"]["Requeue"]["properties"]["resyncIntervalSeconds"]
    assert (requeue["exclusiveMinimum"], requeue["maximum"]) == (0, 86_400)
    assert schema["additionalProperties"] is False


def test_the_default_images_are_the_dockerfiles_targets_at_the_charts_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    values = ChartValues()
    operator_image = f"{values.image.repository}:{values.image.tag or chart['appVersion']}"
    assert operator_image == images.OPERATOR_IMAGE
    assert values.settings.images.runtime == images.RUNTIME_IMAGE
    assert values.settings.images.gpu_runtime.endswith(
        f"kubeinfer-runtime-gpu:{chart['appVersion']}"
    )
    dockerfile = (REPO / "Dockerfile").read_text()
    for target in ("operator", "runtime", "runtime-gpu"):
        assert f" AS {target}\n" in dockerfile
