"""Shared fixtures of the engine build tests: real demo models and calibration data,
generated once per session (deterministic, so every test sees the same bytes), and a
helper that snapshots a cache directory to prove a failed build changed nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from kubeinfer.cli.demo.mlp_models import build_small_mlp, build_tiny_mlp
from kubeinfer.runtime.building.calibration import write_demo_samples


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    tiny = build_tiny_mlp(root / "tiny.onnx")
    small = build_small_mlp(root / "small.onnx")
    return {
        "tiny": tiny,
        "small": small,
        "tiny_calibration": write_demo_samples(tiny, root / "tiny_calibration.npz", count=64),
        "small_calibration": write_demo_samples(small, root / "small_calibration.npz"),
    }


def _snapshot(cache: Path) -> dict[str, bytes]:
    if not cache.exists():
        return {}
    return {
        str(path.relative_to(cache)): path.read_bytes()
        for path in sorted(cache.rglob("*"))
        if path.is_file() and path.parent.name != "locks"
    }


@pytest.fixture
def snapshot() -> Callable[[Path], dict[str, bytes]]:
    """Every file under a cache with its bytes, lock files aside (they are left in place
    by design: see engine_cache)."""
    return _snapshot
