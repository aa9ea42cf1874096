"""Triton's system shared-memory extension on `kubeinfer serve` (the Rust data plane), driven
the way a Triton client drives it: regions made with `tritonclient.utils.shared_memory`
(POSIX objects in /dev/shm), registered, read and listed with `tritonclient.http`.

Covers: the extension is in the server's metadata; an input read from one region and an
output written into another (answered without data) equal ONNX Runtime's own on the same
rows, for one row and several, with the region at an offset into its object; the status of
all regions and of one; places outside a region, a size that does not match the tensor, an
output region too small and an unregistered region are 400s naming what is wrong, as is a
second registration of a name and a key with no object; unregistering one and all.

Needs the extension `kubeinfer_dataplane` built into the venv (`make dataplane`): without
it, the tests fail (never skip).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm
from serve_process import ServeProcess
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

NAME = "tiny"
ROW_IN = 16 * 4  # FP32 [., 16]
ROW_OUT = 10 * 4  # FP32 [., 10]


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[ServeProcess]:
    try:
        import kubeinfer_dataplane  # noqa: F401
    except ImportError as error:  # never a skip: `make test` builds it
        pytest.fail(f"the extension kubeinfer_dataplane is not built ({error}): make dataplane")
    flags = ("--max-batch-size", "8", "--intra-op-threads", "1")
    with ServeProcess(tiny_model, NAME, *flags) as running:
        yield running
        assert running.stop() == 0, running.output()


@pytest.fixture(scope="module")
def reference(tiny_model: Path):
    session = ort.InferenceSession(str(tiny_model), providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"input": x})[0]


@pytest.fixture
def client(server: ServeProcess) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(server.address, network_timeout=30)
    yield client
    client.unregister_system_shared_memory()
    client.close()


class Regions:
    """Shared-memory objects of this test's own keys, destroyed at its end."""

    def __init__(self) -> None:
        self.handles: list[object] = []

    def create(self, name: str, byte_size: int) -> tuple[str, object]:
        key = f"/kubeinfer-pytest-{os.getpid()}-{name}"
        handle = shm.create_shared_memory_region(name, key, byte_size)
        self.handles.append(handle)
        return key, handle

    def destroy(self) -> None:
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions() -> Iterator[Regions]:
    made = Regions()
    yield made
    made.destroy()


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


def shm_infer(
    client: triton.InferenceServerClient,
    n: int,
    input_place: tuple[str, int, int],
    output_place: tuple[str, int, int],
) -> triton.InferResult:
    given = triton.InferInput("input", [n, 16], "FP32")
    given.set_shared_memory(input_place[0], input_place[2], offset=input_place[1])
    wanted = triton.InferRequestedOutput("logits", binary_data=True)
    wanted.set_shared_memory(output_place[0], output_place[2], offset=output_place[1])
    return client.infer(NAME, [given], outputs=[wanted])


def test_the_server_reports_the_extension(client) -> None:
    assert "system_shared_memory" in client.get_server_metadata()["extensions"]


@pytest.mark.parametrize("n", [1, 5])
def test_an_input_in_a_region_answers_into_another_equal_to_onnxruntime(
    client, regions, reference, n
) -> None:
    x = rows(n, seed=n)
    # The input region starts 128 bytes into its object, the input 64 bytes into the region.
    in_key, in_handle = regions.create("in", 128 + 64 + n * ROW_IN)
    out_key, out_handle = regions.create("out", n * ROW_OUT)
    shm.set_shared_memory_region(in_handle, [x], offset=128 + 64)
    client.register_system_shared_memory("in", in_key, 64 + n * ROW_IN, offset=128)
    client.register_system_shared_memory("out", out_key, n * ROW_OUT)
    result = shm_infer(client, n, ("in", 64, n * ROW_IN), ("out", 0, n * ROW_OUT))
    output = result.get_output("logits")
    assert "data" not in output
    assert output["parameters"]["shared_memory_region"] == "out"
    assert output["parameters"]["shared_memory_byte_size"] == n * ROW_OUT
    answered = shm.get_contents_as_numpy(out_handle, np.float32, output["shape"])
    np.testing.assert_allclose(answered, reference(x), rtol=1e-5, atol=1e-6)


def test_regions_are_listed_and_unregistered_one_or_all(client, regions) -> None:
    key, _ = regions.create("listed", 256)
    client.register_system_shared_memory("a", key, 64, offset=64)
    client.register_system_shared_memory("b", key, 256)
    listed = client.get_system_shared_memory_status()
    assert listed == [
        {"name": "a", "key": key, "offset": 64, "byte_size": 64},
        {"name": "b", "key": key, "offset": 0, "byte_size": 256},
    ]
    assert client.get_system_shared_memory_status("a") == listed[:1]
    client.unregister_system_shared_memory("a")
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory"):
        client.get_system_shared_memory_status("a")
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status() == []


def test_a_bad_registration_is_refused_naming_what_is_wrong(client, regions) -> None:
    key, _ = regions.create("small", 64)
    client.register_system_shared_memory("r", key, 64)
    with pytest.raises(InferenceServerException, match="'r' already in manager"):
        client.register_system_shared_memory("r", key, 64)
    with pytest.raises(InferenceServerException, match="invalid args") as past:
        client.register_system_shared_memory("big", key, 64, offset=32)
    assert past.value.status() == "400"
    with pytest.raises(InferenceServerException, match="Unable to open shared memory region"):
        client.register_system_shared_memory("none", f"/kubeinfer-pytest-{os.getpid()}-no", 8)
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["r"]


@pytest.mark.parametrize(
    ("input_place", "output_place", "message"),
    [
        (("r", 72, ROW_IN), ("r", 0, ROW_OUT), "Invalid offset \\+ byte size"),
        (("r", 0, ROW_IN), ("r", 100, ROW_OUT), "Invalid offset \\+ byte size"),
        (("r", 0, ROW_IN - 4), ("r", 64, ROW_OUT), "does not match shape"),
        (("r", 0, ROW_IN), ("r", 64, ROW_OUT - 4), "should be at least 40 bytes"),
        (("none", 0, ROW_IN), ("r", 64, ROW_OUT), "Unable to find shared memory region"),
    ],
)
def test_a_wrong_place_is_a_400_naming_it(
    client, regions, input_place, output_place, message
) -> None:
    key, _ = regions.create("places", 128)
    client.register_system_shared_memory("r", key, 128)
    with pytest.raises(InferenceServerException, match=message) as refused:
        shm_infer(client, 1, input_place, output_place)
    assert refused.value.status() == "400"
