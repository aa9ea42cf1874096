"""The GPU memory gauges of a Rust data plane server (`rust_dataplane.GpuMemoryGauges`), read
through `GpuMemoryReader` from a stand-in NVML module (no GPU is here) and scraped from
the server's /metrics: present with NVML, labelled by device and name, set again on each
update; absent without a GPU; and a failing read never fails the scrape and leaves the
gauges as they were (a read that raises is logged once). (Every other series' names,
labels and units are the Rust server's:
runtime/native/crates/server/src/metrics/tests.rs.)"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from kubeinfer.contract.runtime_config import EngineSource, RuntimeConfig
from kubeinfer.runtime.engines.gpu_memory import GpuMemoryReader
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from kubeinfer.runtime.rust_dataplane import GpuMemoryGauges
from rust_served import RustServed, rust_served

DEVICE = (("device", "0"), ("name", "NVIDIA H100"))


class FakeNvml(SimpleNamespace):
    """One H100 whose memory in use a test sets; `fail` makes every read raise."""

    def __init__(self, used: int, total: int) -> None:
        super().__init__(
            nvmlInit=lambda: None,
            nvmlDeviceGetCount=lambda: 1,
            nvmlDeviceGetHandleByIndex=lambda index: index,
            nvmlDeviceGetName=lambda handle: b"NVIDIA H100",
            nvmlDeviceGetMemoryInfo=self.memory_info,
        )
        self.used, self.total, self.fail = used, total, False

    def memory_info(self, handle: int) -> SimpleNamespace:
        if self.fail:
            raise RuntimeError("NVML: GPU is lost")
        return SimpleNamespace(used=self.used, total=self.total)


@pytest.fixture(scope="module")
def served(tiny_model: Path) -> Iterator[RustServed]:
    config = RuntimeConfig(
        model_name="m", engine=EngineSource(onnx_path=str(tiny_model)), host="127.0.0.1"
    )
    engine = OnnxRuntimeEngine(tiny_model, 8, intra_op_threads=1)
    with rust_served(config, engine) as server:
        yield server
    engine.close()


def gpu_samples(served: RustServed) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {key: v for key, v in served.metrics().items() if key[0].startswith("kubeinfer_gpu")}


def test_gpu_memory_gauges_come_from_nvml(served: RustServed) -> None:
    nvml = FakeNvml(used=3 << 30, total=80 << 30)
    gauges = GpuMemoryGauges(served.server, GpuMemoryReader(nvml).read)
    gauges.start()
    try:
        got = gpu_samples(served)
        assert got[("kubeinfer_gpu_memory_used_bytes", DEVICE)] == 3 << 30
        assert got[("kubeinfer_gpu_memory_total_bytes", DEVICE)] == 80 << 30
        nvml.used = 5 << 30
        assert gauges.update()
        assert gpu_samples(served)[("kubeinfer_gpu_memory_used_bytes", DEVICE)] == 5 << 30
        assert served.metric("kubeinfer_queue_depth") == 0  # the model's series beside them
    finally:
        gauges.stop()


def test_a_failing_nvml_read_does_not_fail_the_scrape(
    served: RustServed, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = FakeNvml(used=1 << 30, total=2 << 30)
    gauges = GpuMemoryGauges(served.server, GpuMemoryReader(nvml).read)
    gauges.start()
    try:
        nvml.fail = True  # the reader answers None: the gauges keep what they had
        gauges.update()
        assert gpu_samples(served)[("kubeinfer_gpu_memory_used_bytes", DEVICE)] == 1 << 30
    finally:
        gauges.stop()
    reads = iter([[GpuMemoryReader(FakeNvml(2 << 30, 4 << 30)).read()[0]]])

    def read_then_raise():
        try:
            return next(reads)
        except StopIteration:
            raise RuntimeError("NVML: GPU is lost") from None

    raising = GpuMemoryGauges(served.server, read_then_raise)
    raising.start()
    try:
        for _ in range(3):
            raising.update()
        assert gpu_samples(served)[("kubeinfer_gpu_memory_used_bytes", DEVICE)] == 2 << 30
        assert served.metric("kubeinfer_queue_depth") == 0
    finally:
        raising.stop()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "GPU is lost" in warnings[0].getMessage()


def test_without_a_gpu_there_are_no_gpu_gauges(tiny_model: Path) -> None:
    config = RuntimeConfig(
        model_name="m", engine=EngineSource(onnx_path=str(tiny_model)), host="127.0.0.1"
    )
    engine = OnnxRuntimeEngine(tiny_model, 8, intra_op_threads=1)
    try:
        with rust_served(config, engine) as server:
            for read in (None, lambda: None):  # no NVML; NVML without a device
                gauges = GpuMemoryGauges(server.server, read)
                gauges.start()
                gauges.stop()
            assert gpu_samples(server) == {}
            assert server.metric("kubeinfer_queue_depth") == 0
    finally:
        engine.close()
