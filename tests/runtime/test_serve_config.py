"""`kubeinfer serve` configuration: a RuntimeConfig file (YAML or JSON, camelCase), flags
overriding it field by field, an engine flag replacing the file's engine section, and
every problem reported by field path (the process test of exit code 2 is in
test_serve_e2e)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from kubeinfer.cli.main import build_parser
from kubeinfer.contract.runtime_config import BatchingPolicy
from kubeinfer.runtime.serve_command import config_from_args


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_flags_override_the_file_field_by_field(tmp_path: Path) -> None:
    file = tmp_path / "runtime.yaml"
    file.write_text(
        "modelName: resnet\n"
        "modelVersion: '7'\n"
        "engine: {onnxPath: /models/a.onnx}\n"
        "batching: {maxBatchSize: 16, maxQueueDelayMicroseconds: 500, executionSlots: 3}\n"
        "httpPort: 9000\n"
    )
    config = config_from_args(
        parse("--config", str(file), "--max-batch-size", "8", "--preferred-batch-sizes", "4,8",
              "--port", "8001", "--onnx", "/models/b.onnx")
    )  # fmt: skip
    assert config.model_name == "resnet" and config.model_version == "7"
    assert config.engine.onnx_path == "/models/b.onnx"
    assert config.http_port == 8001
    batching = config.batching
    assert (batching.max_batch_size, batching.max_queue_delay_microseconds) == (8, 500)
    assert batching.preferred_batch_sizes == [4, 8] and batching.execution_slots == 3


def test_a_json_file_alone_is_enough(tmp_path: Path) -> None:
    file = tmp_path / "runtime.json"
    file.write_text(json.dumps({"modelName": "m", "engine": {"onnxPath": "/m.onnx"}}))
    config = config_from_args(parse("--config", str(file)))
    assert config.batching.max_batch_size == 32  # the policy's defaults apply


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--onnx", "/m.onnx"), "modelName"),
        (("--model-name", "m", "--onnx", "/m.onnx", "--max-batch-size", "4",
          "--preferred-batch-sizes", "8"), "preferredBatchSizes"),
        (("--model-name", "m", "--onnx", "/m.onnx", "--execution-slots", "0"),
         "batching.executionSlots"),
        (("--model-name", "m"), "engine"),
    ],
)  # fmt: skip
def test_problems_name_the_field(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_from_args(parse(*argv))


def test_an_unreadable_or_invalid_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        config_from_args(parse("--config", str(tmp_path / "missing.yaml")))
    bad = tmp_path / "bad.yaml"
    bad.write_text("modelName: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        config_from_args(parse("--config", str(bad)))
    bad.write_text("- a list\n")
    with pytest.raises(ValueError, match="mapping"):
        config_from_args(parse("--config", str(bad)))


def test_flags_also_come_from_kubeinfer_serve_variables_and_a_flag_wins(monkeypatch) -> None:
    monkeypatch.setenv("KUBEINFER_SERVE_MODEL_NAME", "from-env")
    monkeypatch.setenv("KUBEINFER_SERVE_PORT", "9001")
    monkeypatch.setenv("KUBEINFER_SERVE_PREFERRED_BATCH_SIZES", "2,4")
    monkeypatch.setenv("KUBEINFER_SERVE_ONNX", "/models/env.onnx")
    config = config_from_args(parse("--port", "8001", "--max-batch-size", "4"))
    assert config.model_name == "from-env" and config.http_port == 8001
    assert config.batching.preferred_batch_sizes == [2, 4] and config.batching.max_batch_size == 4
    assert config.engine.onnx_path == "/models/env.onnx"


def test_a_flag_given_twice_or_with_commas_lists_its_sizes() -> None:
    argv = ("--model-name", "m", "--onnx", "/m.onnx", "--max-batch-size", "16")
    sizes = ("--preferred-batch-sizes", "4", "--preferred-batch-sizes", "8,16")
    assert config_from_args(parse(*argv, *sizes)).batching.preferred_batch_sizes == [4, 8, 16]


def test_preferred_sizes_are_kept_sorted_and_unique() -> None:
    # The scheduler's per-decision lookup relies on it and sorts nothing itself.
    assert BatchingPolicy(preferred_batch_sizes=[16, 4, 8, 4]).preferred_batch_sizes == [4, 8, 16]


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (("--port", "http"), {}, "--port (KUBEINFER_SERVE_PORT): Input should be a valid integer"),
        ((), {"KUBEINFER_SERVE_MAX_BATCH_SIZE": "many"}, "--max-batch-size (KUBEINFER_SERVE_"),
        (("--preferred-batch-sizes", "4,x"), {}, "--preferred-batch-sizes (KUBEINFER_SERVE_"),
    ],
)
def test_a_bad_flag_or_variable_is_named(
    argv: tuple[str, ...], environ: dict[str, str], message: str, monkeypatch
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as raised:
        config_from_args(parse("--model-name", "m", "--onnx", "/m.onnx", *argv))
    assert str(raised.value).startswith(message), raised.value


def test_the_help_lists_every_flag(capsys) -> None:
    with pytest.raises(SystemExit):
        parse("--help")
    shown = capsys.readouterr().out
    for flag in ("--config", "--onnx", "--engine", "--cache", "--termination-message-path",
                 "--model-name", "--port", "--max-batch-size", "--preferred-batch-sizes",
                 "--mirror-poll-interval-milliseconds"):  # fmt: skip
        assert flag in shown, flag
