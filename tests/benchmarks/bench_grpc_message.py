"""What reading a large ModelInfer message costs the gRPC server's event loop, with its size
taken from the parsed message (`ByteSize()`, which upb computes by serialising the message
again) against the length of the bytes gRPC hands the deserializer (`codec.ReceivedInfer`,
which the server uses since). A benchmark script, not a test:

    .venv/bin/python tests/benchmarks/bench_grpc_message.py [--images 8] [--rounds 5]

Each message is parsed from a fresh copy of its bytes, as gRPC hands each one over, and its
raw tensor read once, as the decoder does. The two ways take turns, `--rounds` times; the
report is the median milliseconds per message of each and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from kubeinfer.runtime.grpc_service import open_inference_grpc_pb2 as pb
from kubeinfer.runtime.grpc_service.codec import read_infer_request


def message_bytes(images: int) -> bytes:
    request = pb.ModelInferRequest(model_name="bench")
    tensor = request.inputs.add(name="input", datatype="FP32")
    tensor.shape.extend([images, 3, 224, 224])
    request.raw_input_contents.append(os.urandom(images * 3 * 224 * 224 * 4))
    return request.SerializeToString()


def per_message_ms(data: bytes, sized_by_byte_size: bool, messages: int) -> float:
    start = time.perf_counter()
    for _ in range(messages):
        fresh = bytes(bytearray(data))
        if sized_by_byte_size:
            message = pb.ModelInferRequest.FromString(fresh)
            size = message.ByteSize()
        else:
            received = read_infer_request(fresh)
            message, size = received.message, received.wire_bytes
        assert size == len(data)
        message.raw_input_contents[0]  # the decoder's read of the raw tensor
    return (time.perf_counter() - start) / messages * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=8, help="224x224x3 FP32 images a message")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=200, help="messages a round")
    args = parser.parse_args()
    data = message_bytes(args.images)
    byte_size, wire = [], []
    for _ in range(args.rounds):
        byte_size.append(per_message_ms(data, True, args.messages))
        wire.append(per_message_ms(data, False, args.messages))
    before, after = statistics.median(byte_size), statistics.median(wire)
    print(f"a {len(data):,}-byte ModelInfer message, {args.rounds} rounds in turns:")
    print(f"  sized by ByteSize():        {before:.2f} ms a message (median)")
    print(f"  sized by its wire length:   {after:.2f} ms a message (median)")
    print(f"  wire length / ByteSize:     {after / before:.2f}")


if __name__ == "__main__":
    main()
