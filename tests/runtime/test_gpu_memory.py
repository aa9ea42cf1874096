"""The NVML GPU memory reader behind the `kubeinfer_gpu_memory_*` gauges.

Without a GPU (or without nvidia-ml-py or the driver library) `read()` is None, never an
exception, and NVML is tried once, not per scrape. The per-device mapping is checked with
an NVML stand-in that answers as nvidia-ml-py does: v1 memory info counts the driver's
reserved memory as used, v2 (`version=nvmlMemory_v2`) reports it apart, as `nvidia-smi`
does; the reader reports v2's `used`, and v1's where the driver predates v2 or the
package lacks it. On a CUDA machine (marker `gpu("pynvml")`) the real NVML agrees with
`nvidia-smi` for every device.
"""

from __future__ import annotations

import shutil
import subprocess
from types import SimpleNamespace

import pytest
from kubeinfer.runtime.engines.gpu_memory import GpuMemory, GpuMemoryReader, read_gpu_memory


class _NoDriver:
    """NVML as it behaves on a machine without the NVIDIA driver."""

    def __init__(self) -> None:
        self.init_calls = 0

    def nvmlInit(self) -> None:
        self.init_calls += 1
        raise OSError("NVML Shared Library Not Found")


RESERVED = 512 * 2**20  # what an H100's driver keeps for itself


class _NvmlError(Exception):
    """pynvml's NVMLError, as the stand-in raises it."""


class _TwoDevices:
    """nvidia-ml-py's answers for two devices, 80 GB each, with v1 and v2 memory info."""

    nvmlMemory_v2 = 0x02000028

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return 100 + index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> SimpleNamespace:
        used, total = (handle - 99) * 2**30, 80 * 10**9
        if not version:  # nvmlMemory_t: reserved memory counts as used
            return SimpleNamespace(used=used + RESERVED, total=total, free=total - used - RESERVED)
        assert version == self.nvmlMemory_v2
        return SimpleNamespace(
            version=version,
            used=used,
            reserved=RESERVED,
            total=total,
            free=total - used - RESERVED,
        )


class _DriverWithoutV2(_TwoDevices):
    """A driver older than R510: nvmlDeviceGetMemoryInfo_v2 is not in the library."""

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> SimpleNamespace:
        if version:
            raise _NvmlError("Function Not Found")
        return super().nvmlDeviceGetMemoryInfo(handle)


class _PackageWithoutV2(_TwoDevices):
    """nvidia-ml-py before v2 support: no `nvmlMemory_v2`, no `version` argument."""

    nvmlMemory_v2 = None

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:  # type: ignore[override]
        return super().nvmlDeviceGetMemoryInfo(handle)


def test_without_a_driver_read_is_none_and_nvml_is_tried_once() -> None:
    nvml = _NoDriver()
    reader = GpuMemoryReader(nvml)  # type: ignore[arg-type]
    assert reader.read() is None
    assert reader.read() is None
    assert nvml.init_calls == 1


def test_each_device_is_read_in_bytes_with_reserved_memory_not_counted_as_used() -> None:
    reader = GpuMemoryReader(_TwoDevices())  # type: ignore[arg-type]
    expected = [
        GpuMemory(0, "NVIDIA H100 80GB HBM3", 2**30, 80 * 10**9),
        GpuMemory(1, "NVIDIA H100 80GB HBM3", 2 * 2**30, 80 * 10**9),
    ]
    assert reader.read() == expected
    assert reader.read() == expected


@pytest.mark.parametrize("nvml", [_DriverWithoutV2(), _PackageWithoutV2()])
def test_without_v2_the_v1_answer_is_reported(nvml: _TwoDevices) -> None:
    reader = GpuMemoryReader(nvml)  # type: ignore[arg-type]
    for _ in range(2):  # the fallback is decided once and holds
        assert [r.used_bytes for r in reader.read() or []] == [
            2**30 + RESERVED,
            2 * 2**30 + RESERVED,
        ]


def _nvidia_smi_used_mib() -> dict[int, tuple[int, int]]:
    """Index -> (used MiB, total MiB) as `nvidia-smi` reports them."""
    result = subprocess.run(
        [
            "nvidia-smi",
            "--query-gpu=index,memory.used,memory.total",
            "--format=csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    rows = [line.split(",") for line in result.stdout.strip().splitlines()]
    return {int(i): (int(used), int(total)) for i, used, total in rows}


@pytest.mark.gpu("pynvml")
def test_the_real_nvml_agrees_with_nvidia_smi() -> None:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on PATH")
    readings = read_gpu_memory()
    smi = _nvidia_smi_used_mib()
    assert readings, "a CUDA machine must report at least one device"
    assert sorted(smi) == [reading.index for reading in readings]
    for reading in readings:
        used_mib, total_mib = smi[reading.index]
        assert 0 < reading.used_bytes < reading.total_bytes
        # Another process may allocate between the two reads; v1 would be off by the
        # driver's reserved memory (hundreds of MiB), far beyond this.
        assert abs(reading.used_bytes / 2**20 - used_mib) < 32, (reading, used_mib)
        assert abs(reading.total_bytes / 2**20 - total_mib) < 2, (reading, total_mib)
