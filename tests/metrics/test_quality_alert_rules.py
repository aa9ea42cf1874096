"""The quality watch's alert rules (`docs/alerts/quality-watch-rules.yaml`), run by
Prometheus' own rule engine (`promtool test rules`, from the same Debian package as the
server) on series shaped as the runtime exports them: a class and a slice that fall
below the agreement threshold fire, the healthy ones and a class with too few rows do
not, and a reference that loses most samples fires its own alert. The metric names the
rules read are the contract's, so a renamed series fails here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from kubeinfer.contract import metrics as series

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "alerts" / "quality-watch-rules.yaml"
LABELS = (
    'namespace="serving", model="resnet", serving_version="1", candidate_version="1", '
    'candidate_digest="sha256:ref", role="quality"'
)


DESCRIPTION = (
    "Top-1 agreement of the served engine with its full-precision reference, over the last "
    "hour, for the rows the reference puts in this class. See `kubectl get infd -n serving "
    "-o jsonpath='{.items[*].status.qualityWatch}'` and GET /v2/quality/exemplars on a "
    "serving pod."
)


def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        message = "promtool is not installed (it comes with Debian's prometheus package)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}: CI must run the real-Prometheus tests", pytrace=False)
        pytest.skip(message)
    return binary


def counter(name: str, labels: str, per_minute: float, minutes: int = 120) -> dict[str, str]:
    """A counter growing by `per_minute` each minute, as promtool's series notation."""
    return {"series": f"{name}{{{labels}}}", "values": f"0+{per_minute}x{minutes}"}


def test_every_series_the_rules_read_is_one_the_runtime_exports() -> None:
    exported = set()
    for value in vars(series).values():
        if isinstance(value, series.Series):
            exported |= {value.name, f"{value.name}_total", f"{value.name}_bucket"}
    read = set(re.findall(r"\bkubeinfer_[a-z0-9_]+", RULES.read_text()))
    assert read and read <= exported, read - exported


def test_the_rules_fire_on_a_falling_class_a_falling_slice_and_a_reference_behind(
    tmp_path: Path,
) -> None:
    tool = promtool()
    rows, agreements = (
        series.SHADOW_CLASS_TOP1_ROWS.total,
        series.SHADOW_CLASS_TOP1_AGREEMENTS.total,
    )
    slice_rows, slice_agreements = (
        series.SHADOW_SLICE_TOP1_ROWS.total,
        series.SHADOW_SLICE_TOP1_AGREEMENTS.total,
    )
    requests = series.SHADOW_REQUESTS.total
    inputs = [
        # Class 3 at 80 %, class 1 at 99 %, class 7 at 50 % but on too few rows.
        counter(rows, f'{LABELS}, reference_class="3"', 10),
        counter(agreements, f'{LABELS}, reference_class="3"', 8),
        counter(rows, f'{LABELS}, reference_class="1"', 100),
        counter(agreements, f'{LABELS}, reference_class="1"', 99),
        counter(rows, f'{LABELS}, reference_class="7"', 1),
        counter(agreements, f'{LABELS}, reference_class="7"', 0.5),
        # Slice acme at 70 %, the rest at 99 %.
        counter(slice_rows, f'{LABELS}, slice="acme"', 10),
        counter(slice_agreements, f'{LABELS}, slice="acme"', 7),
        counter(slice_rows, f'{LABELS}, slice="other"', 100),
        counter(slice_agreements, f'{LABELS}, slice="other"', 99),
        # Of every 10 sampled requests, 7 dropped.
        counter(requests, f'{LABELS}, outcome="compared"', 3),
        counter(requests, f'{LABELS}, outcome="dropped"', 7),
    ]
    common = {"namespace": "serving", "model": "resnet", "serving_version": "1"}
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "alert_rule_test": [
                    {
                        "eval_time": "90m",
                        "alertname": "KubeinferQualityClassAgreementLow",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    **common,
                                    "reference_class": "3",
                                    "severity": "warning",
                                }
                            }
                        ],
                    },
                    {
                        "eval_time": "90m",
                        "alertname": "KubeinferQualitySliceAgreementLow",
                        "exp_alerts": [
                            {"exp_labels": {**common, "slice": "acme", "severity": "warning"}}
                        ],
                    },
                    {
                        "eval_time": "90m",
                        "alertname": "KubeinferQualityReferenceBehind",
                        "exp_alerts": [{"exp_labels": {**common, "severity": "info"}}],
                    },
                    # Not yet: the hour's window is short of 200 rows, then `for` holds.
                    {"eval_time": "10m", "alertname": "KubeinferQualityClassAgreementLow"},
                ],
            }
        ],
    }
    annotations = {
        "KubeinferQualityClassAgreementLow": {
            "summary": "resnet v1: class 3 agrees with its reference on 80% of rows",
            "description": DESCRIPTION,
        },
        "KubeinferQualitySliceAgreementLow": {
            "summary": "resnet v1: slice acme agrees with its reference on 70% of rows"
        },
        "KubeinferQualityReferenceBehind": {
            "summary": "resnet v1: the quality reference loses 70% of the sampled requests",
            "description": "Dropped (queue full), timed out or refused: the watch's effective "
            "sample rate is below what samplePercent asks, so drift takes longer to see.",
        },
    }
    for case in tests["tests"][0]["alert_rule_test"]:
        for alert in case.get("exp_alerts", []):
            alert["exp_annotations"] = annotations[case["alertname"]]
    spec = tmp_path / "tests.yaml"
    spec.write_text(yaml.safe_dump(tests, sort_keys=False))
    checked = subprocess.run([tool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    result = subprocess.run([tool, "test", "rules", str(spec)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
