"""GPU memory used and total, per device, read through NVML for the
`kubeinfer_gpu_memory_used_bytes` / `kubeinfer_gpu_memory_total_bytes` gauges.

NVML (`pynvml`, from the nvidia-ml-py package) is optional: without the package, the
driver library or a device, `GpuMemoryReader.read()` returns None and the gauges are
simply not exported. NVML is initialised once, on the first read, not per scrape; a
failure is remembered so a machine without a GPU pays for the attempt once.

Why NVML rather than the CUDA runtime: NVML reads the device's memory as the driver
accounts it (every process, TensorRT's activation memory and the CUDA context included)
without creating a CUDA context in the scraping thread.

Why the v2 memory query (`nvmlDeviceGetMemoryInfo(handle, version=nvmlMemory_v2)`): the v1
answer counts the memory the driver reserves for itself (hundreds of MiB on an H100) as
used, so the gauge would disagree with `nvidia-smi`, which reports v2's `used` (reserved
is a separate field there). A driver older than R510 has no v2 query; the first read finds
that out and the reader keeps to v1 from then on.

Ran against a real NVML on an H100 (driver 580, nvidia-ml-py): the v2 query path, through
`tests/runtime/test_gpu_memory.py`'s `gpu` test (the gauge against `nvidia-smi`) and while
a runtime served on that GPU (`tests/benchmarks/gpu_served.py`: the gauges and nvidia-smi
agreed to nvidia-smi's MiB rounding; docs/gpu-check.md). The v1 fallback for drivers
before R510 never ran on a GPU: it is tested with a stand-in for `pynvml` in the same file.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class GpuMemory:
    """One device's memory in bytes, as NVML reports it."""

    index: int
    name: str
    used_bytes: int
    total_bytes: int


class GpuMemoryReader:
    """Reads every visible device's memory; `read()` is None where there is no GPU."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml = nvml
        self._handles: list[tuple[int, str, Any]] | None = None
        self._unavailable = False
        self._memory_version: int | None = None  # nvmlMemory_v2, until it fails once
        self._lock = threading.Lock()

    def _initialise(self) -> list[tuple[int, str, Any]] | None:
        if self._unavailable:
            return None
        if self._handles is not None:
            return self._handles
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            nvml = self._nvml
            nvml.nvmlInit()
            handles = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                name = nvml.nvmlDeviceGetName(handle)
                handles.append((index, name.decode() if isinstance(name, bytes) else name, handle))
        except Exception:  # no package, no driver library (NVMLError_LibraryNotFound), no GPU
            self._unavailable = True
            return None
        if not handles:
            self._unavailable = True
            return None
        self._memory_version = getattr(nvml, "nvmlMemory_v2", None)
        if self._memory_version is not None:
            try:
                nvml.nvmlDeviceGetMemoryInfo(handles[0][2], version=self._memory_version)
            except Exception:  # NVMLError_FunctionNotFound: a driver older than R510
                self._memory_version = None
        self._handles = handles
        return handles

    def _memory_info(self, handle: Any) -> Any:
        assert self._nvml is not None
        if self._memory_version is None:
            return self._nvml.nvmlDeviceGetMemoryInfo(handle)
        return self._nvml.nvmlDeviceGetMemoryInfo(handle, version=self._memory_version)

    def read(self) -> list[GpuMemory] | None:
        """Each device's used and total bytes, or None without NVML or a GPU (or if a
        read fails: a scrape must never raise)."""
        with self._lock:
            handles = self._initialise()
            if handles is None:
                return None
            assert self._nvml is not None
            try:
                readings = []
                for index, name, handle in handles:
                    info = self._memory_info(handle)
                    readings.append(GpuMemory(index, name, int(info.used), int(info.total)))
            except Exception:  # a device lost (Xid) or the driver reloaded
                return None
            return readings


_default_reader = GpuMemoryReader()


def read_gpu_memory() -> list[GpuMemory] | None:
    """Every device's memory through the process-wide reader; None without a GPU."""
    return _default_reader.read()
