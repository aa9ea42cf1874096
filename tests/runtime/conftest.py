"""Fixtures of the runtime server tests: the tiny demo MLP (built once per session, real
ONNX) and the ONNX Runtime engine on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubeinfer.runtime.demo_models import build_tiny_mlp
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_mlp(tmp_path_factory.mktemp("runtime-models") / "tiny.onnx")


@pytest.fixture
def tiny_engine(tiny_model: Path) -> Iterator[OnnxRuntimeEngine]:
    engine = OnnxRuntimeEngine(tiny_model, max_batch_size=32, intra_op_threads=1)
    yield engine
    engine.close()
