"""Triton's system shared-memory extension over gRPC on `kubeinfer serve --grpc-port`,
driven as a Triton client drives it: regions made with `tritonclient.utils.shared_memory`
(POSIX objects in /dev/shm), registered, listed and unregistered with `tritonclient.grpc`,
and infer requests whose input and output are in regions.

Covers: an input read from one region and an output written into another (answered with
its place, no data) equal ONNX Runtime's own on the same rows, for one row and several,
with the region at an offset into its object; the status of all regions and of one;
Triton's codes: a name registered twice is ALREADY_EXISTS, a key with no object and a
range past its object INVALID_ARGUMENT, the status of an unregistered region NOT_FOUND,
and an infer request naming one INVALID_ARGUMENT, the server serving on after each;
unregistering one and all. The regions, rows and ONNX Runtime reference are the HTTP
test's (`test_rust_system_shared_memory.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import test_rust_system_shared_memory as over_http
import tritonclient.grpc as triton
import tritonclient.utils.shared_memory as shm
from ports import free_port
from serve_process import ServeProcess
from test_rust_system_shared_memory import NAME, ROW_IN, ROW_OUT, Regions, rows
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

# The HTTP test's fixtures: its shared-memory objects, and ONNX Runtime on the same model.
regions = over_http.regions
reference = over_http.reference


@pytest.fixture(scope="module")
def grpc_address(tiny_model: Path) -> Iterator[str]:
    port = free_port()
    flags = ("--max-batch-size", "8", "--intra-op-threads", "1", "--grpc-port", str(port))
    with ServeProcess(tiny_model, NAME, *flags) as running:
        yield f"127.0.0.1:{port}"
        assert running.stop() == 0, running.output()


@pytest.fixture
def client(grpc_address: str) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(grpc_address)
    yield client
    client.unregister_system_shared_memory()
    client.close()


def shm_infer(
    client: triton.InferenceServerClient,
    n: int,
    input_place: tuple[str, int, int],
    output_place: tuple[str, int, int],
) -> triton.InferResult:
    given = triton.InferInput("input", [n, 16], "FP32")
    given.set_shared_memory(input_place[0], input_place[2], offset=input_place[1])
    wanted = triton.InferRequestedOutput("logits")
    wanted.set_shared_memory(output_place[0], output_place[2], offset=output_place[1])
    return client.infer(NAME, [given], outputs=[wanted])


def code(error: InferenceServerException) -> str:
    return str(error.status()).removeprefix("StatusCode.")


@pytest.mark.parametrize("n", [1, 5])
def test_an_input_in_a_region_answers_into_another_equal_to_onnxruntime(
    client, regions: Regions, reference, n
) -> None:
    x = rows(n, seed=100 + n)
    # The input region starts 128 bytes into its object, the input 64 bytes into the region.
    in_key, in_handle = regions.create("grpc-in", 128 + 64 + n * ROW_IN)
    out_key, out_handle = regions.create("grpc-out", 32 + n * ROW_OUT)
    shm.set_shared_memory_region(in_handle, [x], offset=128 + 64)
    client.register_system_shared_memory("in", in_key, 64 + n * ROW_IN, offset=128)
    client.register_system_shared_memory("out", out_key, 32 + n * ROW_OUT)
    result = shm_infer(client, n, ("in", 64, n * ROW_IN), ("out", 32, n * ROW_OUT))
    output = result.get_output("logits")
    assert list(output.shape) == [n, 10]
    assert output.parameters["shared_memory_region"].string_param == "out"
    assert output.parameters["shared_memory_byte_size"].int64_param == n * ROW_OUT
    assert output.parameters["shared_memory_offset"].int64_param == 32
    answered = shm.get_contents_as_numpy(out_handle, np.float32, [n, 10], offset=32)
    np.testing.assert_allclose(answered, reference(x), rtol=1e-5, atol=1e-6)


def test_regions_are_listed_and_unregistered_one_or_all(client, regions: Regions) -> None:
    key, _ = regions.create("grpc-listed", 256)
    client.register_system_shared_memory("a", key, 64, offset=64)
    client.register_system_shared_memory("b", key, 256)
    listed = client.get_system_shared_memory_status(as_json=True)["regions"]
    places = {
        n: (r["key"], int(r.get("offset", 0)), int(r["byte_size"])) for n, r in listed.items()
    }
    assert places == {"a": (key, 64, 64), "b": (key, 0, 256)}
    one = client.get_system_shared_memory_status("a").regions
    assert list(one) == ["a"] and one["a"].byte_size == 64
    client.unregister_system_shared_memory("a")
    client.unregister_system_shared_memory("a")  # not registered: no error, as in Triton
    with pytest.raises(InferenceServerException, match="Unable to find system shared") as gone:
        client.get_system_shared_memory_status("a")
    assert code(gone.value) == "NOT_FOUND"
    client.unregister_system_shared_memory()
    assert len(client.get_system_shared_memory_status().regions) == 0


def test_bad_registrations_get_tritons_codes_naming_what_is_wrong(client, regions: Regions) -> None:
    key, _ = regions.create("grpc-small", 64)
    client.register_system_shared_memory("r", key, 64)
    with pytest.raises(InferenceServerException, match="'r' already in manager") as twice:
        client.register_system_shared_memory("r", key, 64)
    assert code(twice.value) == "ALREADY_EXISTS"
    with pytest.raises(InferenceServerException, match="invalid args") as past:
        client.register_system_shared_memory("big", key, 64, offset=32)
    assert code(past.value) == "INVALID_ARGUMENT"
    missing = key + "-none"
    with pytest.raises(InferenceServerException, match="Unable to open shared memory") as none:
        client.register_system_shared_memory("none", missing, 8)
    assert code(none.value) == "INVALID_ARGUMENT"
    assert list(client.get_system_shared_memory_status().regions) == ["r"]


@pytest.mark.parametrize(
    ("input_place", "output_place", "message"),
    [
        (("none", 0, ROW_IN), ("r", 64, ROW_OUT), "Unable to find shared memory region"),
        (("r", 72, ROW_IN), ("r", 0, ROW_OUT), "Invalid offset \\+ byte size"),
        (("r", 0, ROW_IN - 4), ("r", 64, ROW_OUT), "does not match shape"),
        (("r", 0, ROW_IN), ("r", 64, ROW_OUT - 4), "should be at least 40 bytes"),
    ],
)
def test_a_wrong_place_is_invalid_argument_and_the_server_serves_on(
    client, regions: Regions, reference, input_place, output_place, message
) -> None:
    key, handle = regions.create("grpc-places", 128)
    client.register_system_shared_memory("r", key, 128)
    with pytest.raises(InferenceServerException, match=message) as refused:
        shm_infer(client, 1, input_place, output_place)
    assert code(refused.value) == "INVALID_ARGUMENT"
    x = rows(1, seed=7)
    shm.set_shared_memory_region(handle, [x])
    shm_infer(client, 1, ("r", 0, ROW_IN), ("r", 64, ROW_OUT))
    answered = shm.get_contents_as_numpy(handle, np.float32, [1, 10], offset=64)
    np.testing.assert_allclose(answered, reference(x), rtol=1e-5, atol=1e-6)
