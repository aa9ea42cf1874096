"""Suite-wide set-up: the `gpu` and `cluster` markers skip unless their hardware exists.

- `gpu`: needs a CUDA device (checked through NVML or pycuda, both optional).
- `cluster`: runs against the real cluster that KUBECONFIG points at.
"""

from __future__ import annotations

import os
from functools import cache

import pytest


@cache
def cuda_available() -> bool:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        return bool(pynvml.nvmlDeviceGetCount())
    except Exception:
        pass
    try:
        import pycuda.driver as cuda  # type: ignore[import-not-found]

        cuda.init()
        return bool(cuda.Device.count())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    no_cluster = pytest.mark.skip(reason="needs a real cluster: set KUBECONFIG")
    for item in items:
        if "gpu" in item.keywords and not cuda_available():
            item.add_marker(no_gpu)
        if "cluster" in item.keywords and not os.environ.get("KUBECONFIG"):
            item.add_marker(no_cluster)
