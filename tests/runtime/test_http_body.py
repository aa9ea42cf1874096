"""Reading an infer request's body (`runtime/http/body.py`): a body that fills its declared
length is the buffer it was read into, not a copy of it, and the tensors decoded from it
are views of that buffer; a chunked body is still copied out of its limit-sized buffer."""

from __future__ import annotations

import asyncio
import time
from unittest import mock

import numpy as np
import orjson
from aiohttp import StreamReader
from aiohttp.test_utils import make_mocked_request
from kubeinfer.runtime.http.body import MAPPED_BODY_BYTES, read_body
from kubeinfer.runtime.protocol.tensor_codec import decode_infer_request

PART = 64 * 1024


async def _read(body: bytes, declared: bool, limit: int = 64 * 2**20) -> bytes | memoryview:
    loop = asyncio.get_running_loop()
    reader = StreamReader(mock.Mock(_reading_paused=False), 2**16, loop=loop)
    headers = {"Content-Length": str(len(body))} if declared else {"Transfer-Encoding": "chunked"}
    request = make_mocked_request("POST", "/v2/models/m/infer", headers=headers, payload=reader)

    async def send() -> None:  # in parts, as a socket delivers them
        for start in range(0, len(body), PART):
            reader.feed_data(body[start : start + PART])
            # not a wait: the parts arrive a loop turn apart, as from a socket
            await asyncio.sleep(0)
        reader.feed_eof()

    sender = asyncio.create_task(send())
    await asyncio.sleep(0)  # not a wait: the first part is there, the rest comes while reading
    try:
        return await read_body(request, limit, time.monotonic() + 30, 10, time.monotonic)
    finally:
        await sender


def _binary_request(images: np.ndarray) -> tuple[bytes, int]:
    header = orjson.dumps({
        "inputs": [{"name": "input", "datatype": "FP32", "shape": list(images.shape),
                    "parameters": {"binary_data_size": images.nbytes}}],
    })  # fmt: skip
    return header + images.tobytes(), len(header)


def test_a_body_of_its_declared_length_is_decoded_from_its_own_buffer() -> None:
    images = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
    body, header_length = _binary_request(images)
    assert len(body) > MAPPED_BODY_BYTES  # read into a memory map, in many parts
    read = asyncio.run(_read(body, declared=True))
    assert isinstance(read, memoryview) and read.readonly
    assert read == body
    [decoded] = decode_infer_request(read, header_length).inputs
    array = decoded.data
    np.testing.assert_array_equal(array.reshape(images.shape), images)
    assert not array.flags.writeable
    # The array is a view of the buffer the body was read into: nothing copied it since.
    address = np.frombuffer(read, np.uint8).ctypes.data
    assert array.ctypes.data == address + header_length


def test_a_small_body_of_its_declared_length_decodes_the_same() -> None:
    body, header_length = _binary_request(np.ones((1, 1000), np.float32))
    read = asyncio.run(_read(body, declared=True))
    assert read == body
    [decoded] = decode_infer_request(read, header_length).inputs
    assert decoded.data.ravel().tolist() == [1.0] * 1000


def test_a_chunked_body_is_copied_out_of_its_limit_sized_buffer() -> None:
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],
                                     "data": [1.0, 2.0]}]})  # fmt: skip
    read = asyncio.run(_read(body, declared=False, limit=MAPPED_BODY_BYTES * 4))
    assert isinstance(read, bytes) and read == body
    [decoded] = decode_infer_request(read).inputs
    assert decoded.data.ravel().tolist() == [1.0, 2.0]
