"""The `cost` settings group (`KUBEINFER_COST__*`): prices per node-hour by GPU product and
`cpu`, as the chart passes them (`product=price,...`); no prices is no cost; a bad value
refused naming its variable."""

from __future__ import annotations

import os

import pytest
from kubeinfer.operator.settings import InvalidSettings, OperatorSettings


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch):
    def set_only(variables: dict[str, str]) -> None:
        for name in [n for n in os.environ if n.upper().startswith("KUBEINFER_")]:
            monkeypatch.delenv(name)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return set_only


def test_prices_by_product_and_for_cpu_nodes_with_the_window(environ) -> None:
    environ(
        {
            "KUBEINFER_COST__PRICE_PER_NODE_HOUR": "NVIDIA-A100-SXM4-80GB=32.77, cpu=0.34,T4=1e1",
            "KUBEINFER_COST__WINDOW_SECONDS": "1800",
            "KUBEINFER_COST__REFRESH_SECONDS": "60",
        }
    )
    cost = OperatorSettings.from_env().cost
    assert cost.price_per_node_hour == {"NVIDIA-A100-SXM4-80GB": 32.77, "cpu": 0.34, "T4": 10.0}
    assert (cost.window_seconds, cost.refresh_seconds, cost.priced) == (1800, 60, True)


def test_no_prices_is_no_cost(environ) -> None:
    environ({})
    cost = OperatorSettings.from_env().cost
    assert cost.price_per_node_hour == {} and not cost.priced
    assert cost.window_seconds == 3600
    environ({"KUBEINFER_COST__PRICE_PER_NODE_HOUR": ""})  # the chart's `{}`
    assert not OperatorSettings.from_env().cost.priced


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("KUBEINFER_COST__PRICE_PER_NODE_HOUR", "A100=three", "valid number"),
        ("KUBEINFER_COST__PRICE_PER_NODE_HOUR", "A100=-1", "at least 0"),
        ("KUBEINFER_COST__PRICE_PER_NODE_HOUR", "A100=nan", "at least 0"),
        ("KUBEINFER_COST__PRICE_PER_NODE_HOUR", "A100=inf", "at least 0"),
        ("KUBEINFER_COST__PRICE_PER_NODE_HOUR", "A100", "product=price pairs"),
        ("KUBEINFER_COST__PRICE_PER_NODE_HOUR", "=2", "GPU product"),
        ("KUBEINFER_COST__WINDOW_SECONDS", "30", "greater than or equal to 60"),
        ("KUBEINFER_COST__REFRESH_SECONDS", "0", "greater than or equal to 10"),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable(environ, variable, value, said) -> None:
    environ({variable: value})
    with pytest.raises(InvalidSettings, match=f"^{variable}: .*{said}"):
        OperatorSettings.from_env()


def test_a_flat_name_is_refused_naming_the_variable_meant(environ) -> None:
    environ({"KUBEINFER_COST_WINDOW_SECONDS": "600"})
    with pytest.raises(InvalidSettings, match="the variable is KUBEINFER_COST__WINDOW_SECONDS"):
        OperatorSettings.from_env()
