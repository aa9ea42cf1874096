"""The GPU code's fixes that a CPU can show, each against a stand-in for the library it
calls (`pycuda.driver`, `tensorrt`, `pynvml`), never for our own code.

- A `CudaSlot`'s stream is created non-blocking, so nothing queued on the legacy default
  stream serialises the slots.
- When a batch's compute raises after its host-to-device copies were queued, the slot
  waits for its stream before the error reaches the batcher (the copies read the pinned
  buffers the next batch is written into); a failing wait keeps the original error. A
  good batch still waits on its event only.
- The TensorRT build target is read from the CUDA device the builder builds on (not NVML's
  index 0) and names the GPU model, so an H100 and an H200 (both sm_90) get different
  engine keys; the target fits the key and the status.
- The builder refuses TensorRT 11; the `gpu` extra pins TensorRT 10 and a pycuda that
  compiles against CUDA 13.
- The `gpu` marker skips a test that needs a module the machine lacks, naming it.

The stand-ins answer only what our code asks and record what it did; what the driver does
with those calls is checked by the `gpu` tests on a CUDA machine (`make gpu-check`).
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
from kubeinfer.runtime.building.builders import BuildError
from kubeinfer.runtime.building.builders.tensorrt_builder import TensorRTBuilder
from kubeinfer.runtime.engine_manifest import (
    TARGET_MAX_LENGTH,
    BatchProfile,
    EngineKey,
    gpu_target,
)
from kubeinfer.runtime.engines.base import EngineError, TensorSpec, UnsupportedModel
from kubeinfer.runtime.engines.cuda_streams import CU_STREAM_NON_BLOCKING, CudaContext, CudaSlot
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]

# ----------------------------------------------------------------------------- stand-ins


class _PinnedBuffer(bytearray):
    """What pycuda's pinned arrays have as `.base`: a host allocation with `free()`."""

    def free(self) -> None:
        pass


def fake_pycuda(log: list[str], devices: tuple[tuple[str, tuple[int, int]], ...]) -> ModuleType:
    """A `pycuda.driver` that records the calls a slot makes on its stream, in order."""
    driver = ModuleType("pycuda.driver")

    class Device:
        def __init__(self, index: int) -> None:
            self.index = index

        @staticmethod
        def count() -> int:
            return len(devices)

        def name(self) -> str:
            return devices[self.index][0]

        def compute_capability(self) -> tuple[int, int]:
            return devices[self.index][1]

        def retain_primary_context(self) -> Any:
            return SimpleNamespace(push=lambda: log.append(f"push {self.index}"))

    class Stream:
        def __init__(self, flags: int = 0) -> None:
            self.flags = flags
            self.handle = 7

        def synchronize(self) -> None:
            log.append("stream.synchronize")

    class Event:
        def __init__(self, flags: int = 0) -> None:
            self.flags = flags

        def record(self, stream: Stream) -> None:
            log.append("event.record")

        def synchronize(self) -> None:
            log.append("event.synchronize")

    class Allocation:
        def __init__(self, address: int) -> None:
            self.address = address

        def __int__(self) -> int:
            return self.address

        def free(self) -> None:
            pass

    def pagelocked_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        buffer = _PinnedBuffer(int(np.prod(shape)) * dtype.itemsize)
        return np.ndarray(shape, dtype, buffer=buffer)

    driver.init = lambda: None  # type: ignore[attr-defined]
    driver.Device = Device  # type: ignore[attr-defined]
    driver.Context = SimpleNamespace(pop=lambda: log.append("pop"))  # type: ignore[attr-defined]
    driver.Stream = Stream  # type: ignore[attr-defined]
    driver.Event = Event  # type: ignore[attr-defined]
    driver.event_flags = SimpleNamespace(DISABLE_TIMING=2, BLOCKING_SYNC=1)  # type: ignore[attr-defined]
    driver.pagelocked_empty = pagelocked_empty  # type: ignore[attr-defined]
    driver.mem_alloc = lambda nbytes: Allocation(0x1000 + nbytes)  # type: ignore[attr-defined]
    driver.memcpy_htod_async = lambda dst, src, stream: log.append("htod")  # type: ignore[attr-defined]
    driver.memcpy_dtoh_async = lambda dst, src, stream: log.append("dtoh")  # type: ignore[attr-defined]
    return driver


def install(monkeypatch: pytest.MonkeyPatch, name: str, module: ModuleType) -> None:
    """Makes `import <name>` find `module` (and its parent package, for a dotted name)."""
    if "." in name:
        parent_name, child = name.rsplit(".", 1)
        parent = ModuleType(parent_name)
        setattr(parent, child, module)
        monkeypatch.setitem(sys.modules, parent_name, parent)
    monkeypatch.setitem(sys.modules, name, module)


H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
H200 = ("NVIDIA H200", (9, 0))
SPECS = (TensorSpec("x", "FP32", (-1, 4)), TensorSpec("y", "FP32", (-1, 4)))


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    install(monkeypatch, "pycuda.driver", fake_pycuda(calls, (H100,)))
    return calls


def slot_with(compute: Any) -> CudaSlot:
    return CudaSlot(CudaContext(0), SPECS[:1], SPECS[1:], 8, compute)


# ----------------------------------------------------------------------------- CUDA slots


def test_a_slot_stream_does_not_synchronise_with_the_default_stream(log: list[str]) -> None:
    slot = slot_with(lambda n, s: None)
    assert slot.stream.flags & CU_STREAM_NON_BLOCKING
    assert CU_STREAM_NON_BLOCKING == 0x1  # cuda.h: CU_STREAM_NON_BLOCKING


def test_a_failed_compute_waits_for_the_queued_copies_before_raising(log: list[str]) -> None:
    def compute(n: int, slot: CudaSlot) -> None:
        raise RuntimeError("enqueue failed")

    slot = slot_with(compute)
    log.clear()
    with pytest.raises(RuntimeError, match="enqueue failed"):
        slot.run(3)
    assert log == ["push 0", "htod", "stream.synchronize", "pop"]


def test_a_failed_wait_keeps_the_compute_error(
    log: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def compute(n: int, slot: CudaSlot) -> None:
        raise RuntimeError("enqueue failed")

    def lost() -> None:
        raise OSError("cuStreamSynchronize failed: an illegal memory access")

    slot = slot_with(compute)
    monkeypatch.setattr(slot.stream, "synchronize", lost)
    with pytest.raises(RuntimeError, match="enqueue failed") as failure:
        slot.run(1)
    assert any("illegal memory access" in note for note in failure.value.__notes__)
    assert log[-1] == "pop"


def test_a_good_batch_waits_on_its_event_only(log: list[str]) -> None:
    slot = slot_with(lambda n, s: log.append("compute"))
    log.clear()
    slot.run(2)
    assert log == ["push 0", "htod", "compute", "dtoh", "event.record", "event.synchronize", "pop"]


SEQUENCE_SPECS = (
    TensorSpec("ids", "INT64", (-1, -1), ("sequence",), (1,), (8,)),
    TensorSpec("pooled", "FP32", (-1, 4)),
    TensorSpec("hidden", "FP32", (-1, -1, 4), ("sequence", None), None, (8, 4)),
)


@pytest.fixture
def copies(log: list[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The log, with each copy's bytes and its host buffer's address."""
    driver = sys.modules["pycuda.driver"]

    def htod(device: Any, host: np.ndarray, stream: Any) -> None:
        log.append(f"htod {host.nbytes} at {host.ctypes.data}")

    def dtoh(host: np.ndarray, device: Any, stream: Any) -> None:
        log.append(f"dtoh {host.nbytes} at {host.ctypes.data}")

    monkeypatch.setattr(driver, "memcpy_htod_async", htod, raising=False)
    monkeypatch.setattr(driver, "memcpy_dtoh_async", dtoh, raising=False)
    return log


def test_a_sequence_batch_copies_its_own_length_from_the_front_of_each_buffer(
    copies: list[str],
) -> None:
    seen: list[Any] = []
    slot = CudaSlot(
        CudaContext(0), SEQUENCE_SPECS[:1], SEQUENCE_SPECS[1:], 16,
        lambda n, s: seen.append((n, s.batch_shape)),
    )  # fmt: skip
    # Buffers are sized once, for the largest batch at the longest sequence.
    assert slot.host_inputs["ids"].nbytes == 16 * 8 * 8
    assert slot.host_outputs["hidden"].nbytes == 16 * 8 * 4 * 4
    views = slot.input_views(3, ((5,),))
    assert views["ids"].shape == (3, 5)
    assert views["ids"].ctypes.data == slot.host_inputs["ids"].ctypes.data
    assert slot.input_views(3, ((5,),)) is views  # made once per rows and shape
    views["ids"][...] = np.arange(15).reshape(3, 5)
    copies.clear()
    outputs = slot.run(3, ((5,),))
    base = {name: buffer.ctypes.data for name, buffer in slot.host_outputs.items()}
    assert copies[1:4] == [
        f"htod {3 * 5 * 8} at {slot.host_inputs['ids'].ctypes.data}",
        f"dtoh {3 * 4 * 4} at {base['pooled']}",
        f"dtoh {3 * 5 * 4 * 4} at {base['hidden']}",
    ]
    assert seen == [(3, ((5,),))]
    assert outputs["hidden"].shape == (3, 5, 4) and outputs["pooled"].shape == (3, 4)
    assert slot.host_inputs["ids"][:15].tolist() == list(range(15))


def test_a_sequence_batch_past_its_buffer_or_without_a_shape_is_refused(log: list[str]) -> None:
    slot = CudaSlot(CudaContext(0), SEQUENCE_SPECS[:1], SEQUENCE_SPECS[1:], 4, lambda n, s: None)
    with pytest.raises(EngineError, match="past its buffer"):
        slot.input_views(4, ((9,),))
    with pytest.raises(EngineError, match="needs each batch's shape"):
        slot.run(2)


def test_an_output_of_unknown_largest_shape_is_refused_before_anything_is_allocated(
    log: list[str],
) -> None:
    unbounded = TensorSpec("hidden", "FP32", (-1, -1, 4), ("other", None))
    with pytest.raises(UnsupportedModel, match="'hidden' has a variable axis"):
        CudaSlot(CudaContext(0), SEQUENCE_SPECS[:1], (unbounded,), 4, lambda n, s: None)


# ----------------------------------------------------------------------------- TensorRT builder


def fake_tensorrt(version: str) -> ModuleType:
    tensorrt = ModuleType("tensorrt")
    tensorrt.__version__ = version  # type: ignore[attr-defined]
    return tensorrt


def test_the_build_target_is_the_cuda_device_the_builder_uses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # CUDA_VISIBLE_DEVICES=1 on a node with an H100 then an H200: CUDA's device 0 is the
    # H200, while NVML's index 0 is still the H100.
    install(monkeypatch, "pycuda.driver", fake_pycuda([], (H200, H100)))
    nvml = SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetCudaComputeCapability=lambda handle: (9, 0),
        nvmlDeviceGetName=lambda handle: "NVIDIA H100 80GB HBM3",
    )
    install(monkeypatch, "pynvml", nvml)  # type: ignore[arg-type]
    assert TensorRTBuilder().target() == "sm_90-h200"
    assert TensorRTBuilder(device_index=1).target() == "sm_90-h100-80gb-hbm3"


def test_an_h100_and_an_h200_engine_have_different_keys() -> None:
    def key(target: str) -> EngineKey:
        return EngineKey(
            model_sha256="a" * 64,
            backend="tensorrt",
            backend_version="10.13.0",
            precision="fp16",
            batch_profile=BatchProfile.up_to(32),
            target=target,
        )

    h100, h200 = gpu_target(9, 0, H100[0]), gpu_target(9, 0, H200[0])
    assert (h100, h200) == ("sm_90-h100-80gb-hbm3", "sm_90-h200")
    assert key(h100).digest() != key(h200).digest()
    assert gpu_target(8, 9, "NVIDIA RTX 6000 Ada Generation") == "sm_89-rtx-6000-ada-generation"
    assert gpu_target(7, 5, "Tesla T4") == "sm_75-tesla-t4"


def test_a_long_device_name_still_fits_the_key_and_stays_unique() -> None:
    first = gpu_target(10, 0, "NVIDIA " + "Very Long Model Name " * 5 + "A")
    second = gpu_target(10, 0, "NVIDIA " + "Very Long Model Name " * 5 + "B")
    assert len(first) == len(second) == TARGET_MAX_LENGTH
    assert first != second
    assert first.startswith("sm_100-very-long-model-name-")
    assert TARGET_MAX_LENGTH <= 64  # the InferenceDeployment status' engine target field


def test_the_builder_refuses_tensorrt_11(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, "tensorrt", fake_tensorrt("11.0.0.21"))
    with pytest.raises(BuildError, match=r"TensorRT 11\.0\.0\.21 .*'tensorrt>=10,<11'"):
        TensorRTBuilder().backend_version()
    install(monkeypatch, "tensorrt", fake_tensorrt("10.13.3.9"))
    assert TensorRTBuilder().backend_version() == "10.13.3.9"


# ----------------------------------------------------------------------------- packaging


def gpu_extra() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = (Requirement(text) for text in project["optional-dependencies"]["gpu"])
    return {requirement.name: requirement for requirement in requirements}


@pytest.mark.parametrize(
    ("package", "allowed", "refused"),
    [
        ("tensorrt", ["10.0.1", "10.13.3.9"], ["9.3.0", "11.0.0"]),
        ("pycuda", ["2025.1.2", "2026.1"], ["2024.1", "2025.1.1"]),
        ("nvidia-ml-py", ["12.535.77", "13.615.71"], ["11.525.150"]),
        # The GPU image's base ships CUDA 12.8: the bindings built for CUDA 13 do not load
        # there (the H100 checks ran 13.3.1 on the machine's own Python, not the image's).
        ("cuda-bindings", ["12.8.0", "12.9.2"], ["12.6.2", "13.3.1"]),
    ],
)
def test_the_gpu_extra_pins(package: str, allowed: list[str], refused: list[str]) -> None:
    specifier = gpu_extra()[package].specifier
    assert [v for v in allowed if v in specifier] == allowed
    assert [v for v in refused if v in specifier] == []


# ----------------------------------------------------------------------------- the marker


def suite_conftest() -> ModuleType:
    """tests/conftest.py as a module of its own (pytest's copy is not importable by name)."""
    spec = importlib.util.spec_from_file_location("suite_conftest", ROOT / "tests/conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_marker_names_what_the_machine_lacks() -> None:
    reason = suite_conftest().gpu_skip_reason
    missing = {"tensorrt": "ModuleNotFoundError: No module named 'tensorrt'"}

    def gpu() -> None:
        return None

    def importable(module: str) -> str | None:
        return missing.get(module)

    def no_gpu() -> str:
        return "no NVIDIA driver"

    assert reason(["pycuda.driver"], gpu, importable) is None
    assert reason([], gpu, importable) is None
    assert reason(["pycuda.driver", "tensorrt"], gpu, importable) == (
        "needs tensorrt (ModuleNotFoundError: No module named 'tensorrt')"
    )
    assert reason(["pycuda.driver"], no_gpu, importable) == "needs a CUDA GPU: no NVIDIA driver"


def test_the_gpu_marker_tries_the_real_import() -> None:
    conftest = suite_conftest()
    assert conftest.import_problem("json") is None
    assert "ModuleNotFoundError" in conftest.import_problem("kubeinfer_no_such_module")
