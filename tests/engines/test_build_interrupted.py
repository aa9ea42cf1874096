"""Builds that do not finish leave nothing behind and say why, with real `kubeinfer build`
processes: SIGTERM mid-build removes the staging directory and exits 143 with an `error:`
termination message; a build killed outright (SIGKILL) leaves its staging directory, and
the next build removes it at once, but never one whose builder still holds its key's
lock; a full disk (a real 2 MB tmpfs) is reported as "No space left on device", exit 1,
in the termination message the operator shows, not as an invalid protobuf."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from kubeinfer.cli.demo.mlp_models import build_mlp
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.building.engine_build import build_engine
from kubeinfer.runtime.engine_cache import EngineCache


@pytest.fixture(scope="module")
def heavy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 67 MB model and its calibration data: int8 quantisation takes seconds, long
    enough to stop a build in the middle."""
    root = tmp_path_factory.mktemp("heavy")
    model = build_mlp(root / "heavy.onnx", 16, (4096, 4096), 10)
    return model, write_demo_samples(model, root / "calibration.npz", count=64)


def start_build(model: Path, calibration: Path, cache: Path, message: Path) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "kubeinfer.cli", "build", "--model", str(model),
        "--precision", "int8", "--calibration", str(calibration), "--cache", str(cache),
        "--termination-message-path", str(message),
    ]  # fmt: skip
    return subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def stop_when_quantising(build: subprocess.Popen, sig: int) -> str:
    """Sends `sig` once the build works in its staging directory; returns its stderr."""
    lines = []
    assert build.stderr is not None
    for line in build.stderr:
        lines.append(line)
        if "Quantising" in line:
            build.send_signal(sig)
            break
    rest = build.communicate(timeout=120)[1]
    return "".join(lines) + rest


def staging_dirs(cache: Path) -> list[str]:
    scratch = cache / "tmp"
    return sorted(p.name for p in scratch.iterdir()) if scratch.is_dir() else []


@pytest.mark.slow
def test_sigterm_mid_build_removes_the_staging_directory(
    heavy: tuple[Path, Path], tmp_path: Path
) -> None:
    cache, message = tmp_path / "cache", tmp_path / "termination-log"
    stderr = stop_when_quantising(start_build(*heavy, cache, message), signal.SIGTERM)
    assert "Quantising" in stderr and "Traceback" not in stderr, stderr
    assert "error: the build was stopped (SIGTERM); nothing was published" in stderr
    assert message.read_text() == "error: the build was stopped (SIGTERM); nothing was published"
    assert staging_dirs(cache) == []
    assert not (cache / "engines").exists() or list((cache / "engines").iterdir()) == []


@pytest.mark.slow
def test_sigterm_exit_code_is_143(heavy: tuple[Path, Path], tmp_path: Path) -> None:
    build = start_build(*heavy, tmp_path / "cache", tmp_path / "log")
    stop_when_quantising(build, signal.SIGTERM)
    assert build.returncode == 143


@pytest.mark.slow
def test_a_killed_builders_staging_directory_goes_at_the_next_build(
    heavy: tuple[Path, Path], models: dict[str, Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    killed = start_build(*heavy, cache, tmp_path / "log")
    stop_when_quantising(killed, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    [left] = staging_dirs(cache)
    assert left.startswith("build-")
    # A builder of another key, alive and holding its lock, keeps its directory.
    live_key = "sha256:" + "4" * 64
    live = cache / "tmp" / f"build-{'4' * 64}-alive"
    live.mkdir()
    engines = EngineCache(cache)
    held, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        with engines.lock(live_key):
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold_lock)
    holder.start()
    try:
        assert held.wait(10)
        build_engine(str(models["tiny"]), "onnxruntime", "fp32", cache)
        assert staging_dirs(cache) == [live.name]  # the dead builder's is gone, at once
    finally:
        release.set()
        holder.join()
    build_engine(str(models["tiny"]), "onnxruntime", "fp16", cache)
    assert staging_dirs(cache) == []  # its builder is gone too now


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A real 2 MB tmpfs, mounted for the test (root only) and unmounted after."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_is_said_to_be_one(
    models: dict[str, Path], tiny_disk: Path, tmp_path: Path
) -> None:
    message = tmp_path / "termination-log"
    command = [
        sys.executable, "-m", "kubeinfer.cli", "build", "--model", str(models["small"]),
        "--cache", str(tiny_disk / "cache"), "--termination-message-path", str(message),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "protobuf" not in result.stderr.lower()
    expected = "error: the build failed: [Errno 28] No space left on device: the optimised"
    assert expected in result.stderr
    assert message.read_text().startswith(expected)
    assert "MB free" in message.read_text()
    assert staging_dirs(tiny_disk / "cache") == []
