"""The NVML GPU memory reader behind the `kubeinfer_gpu_memory_*` gauges.

Without a GPU (or without nvidia-ml-py or the driver library) `read()` is None, never an
exception, and NVML is tried once, not per scrape. The per-device mapping is checked with
an NVML stand-in that answers as NVML does (bytes used and total per handle). On a CUDA
machine (marker `gpu`) the real NVML reports a plausible used/total for every device.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kubeinfer.runtime.gpu_memory import GpuMemory, GpuMemoryReader, read_gpu_memory


class _NoDriver:
    """NVML as it behaves on a machine without the NVIDIA driver."""

    def __init__(self) -> None:
        self.init_calls = 0

    def nvmlInit(self) -> None:
        self.init_calls += 1
        raise OSError("NVML Shared Library Not Found")


class _TwoDevices:
    """NVML's answers for two devices, 80 GB each."""

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return 100 + index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=(handle - 99) * 2**30, total=80 * 10**9, free=0)


def test_without_a_driver_read_is_none_and_nvml_is_tried_once() -> None:
    nvml = _NoDriver()
    reader = GpuMemoryReader(nvml)  # type: ignore[arg-type]
    assert reader.read() is None
    assert reader.read() is None
    assert nvml.init_calls == 1


def test_each_device_is_read_in_bytes() -> None:
    reader = GpuMemoryReader(_TwoDevices())  # type: ignore[arg-type]
    assert reader.read() == [
        GpuMemory(0, "NVIDIA H100 80GB HBM3", 2**30, 80 * 10**9),
        GpuMemory(1, "NVIDIA H100 80GB HBM3", 2 * 2**30, 80 * 10**9),
    ]


@pytest.mark.gpu
def test_the_real_nvml_reports_every_device() -> None:
    readings = read_gpu_memory()
    assert readings, "a CUDA machine must report at least one device"
    for reading in readings:
        assert 0 < reading.used_bytes < reading.total_bytes
        assert reading.total_bytes > 2**30
