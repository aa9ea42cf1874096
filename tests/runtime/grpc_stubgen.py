"""Generates the Python stubs of the vendored Open Inference Protocol .proto
(`runtime/grpc_service/open_inference_grpc.proto`) into the package, with grpcio-tools'
protoc: `make protos` (or `python tests/runtime/grpc_stubgen.py`).

The stubs are checked in rather than generated at build time: the runtime image then
needs grpcio and protobuf only (no protoc, no grpcio-tools), an editable install needs no
build hook, mypy reads the `.pyi`, and a change to the stubs shows in review.
`test_grpc_stubs.py` keeps them in step with the .proto, as the CRD's drift test does.

The .proto is compiled under the virtual path `kubeinfer/runtime/grpc_service/`, so the
service module imports the messages by their package name. The messages are built in a
descriptor pool of their own, not protobuf's default one: Triton's client stubs (which
the tests and users load beside ours) define the same `inference.*` names, and one pool
refuses a name defined twice. The wire knows field numbers and method paths, not pools.
This lives in tests/ rather than in the package: grpcio-tools is a development dependency,
and the runtime's modules import only what its extra declares.
"""

from __future__ import annotations

import sys
import tempfile
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "runtime" / "grpc_service"
VIRTUAL_DIR = "kubeinfer/runtime/grpc_service"
PROTO = "open_inference_grpc.proto"
GENERATED = (
    "open_inference_grpc_pb2.py",
    "open_inference_grpc_pb2.pyi",
    "open_inference_grpc_pb2_grpc.py",
)


def protoc(out: Path, *outputs: str) -> None:
    """Runs grpcio-tools' protoc on the vendored .proto with `outputs` (protoc flags
    naming what to write), writing under `out`; raises on a compile error."""
    from grpc_tools import protoc as compiler

    include = resources.files("grpc_tools") / "_proto"
    command = ["protoc", f"-I{VIRTUAL_DIR}={PROTO_DIR}", f"-I{include}", *outputs]
    if compiler.main([*command, f"{VIRTUAL_DIR}/{PROTO}"]) != 0:
        raise RuntimeError(f"protoc failed on {PROTO_DIR / PROTO}")


DEFAULT_POOL = b"DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
OWN_POOL = (
    b"_POOL = _descriptor_pool.DescriptorPool()  # not the default one: see grpc_stubgen\n"
    b"DESCRIPTOR = _POOL.AddSerializedFile("
)


def generate(out: Path) -> dict[str, bytes]:
    """The stubs as this grpcio-tools generates them, the messages in a pool of their own:
    file name -> content."""
    protoc(out, f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}")
    stubs = {name: (out / VIRTUAL_DIR / name).read_bytes() for name in GENERATED}
    messages = stubs["open_inference_grpc_pb2.py"]
    if messages.count(DEFAULT_POOL) != 1:
        raise RuntimeError("protoc's output no longer adds the file to the default pool once")
    stubs["open_inference_grpc_pb2.py"] = messages.replace(DEFAULT_POOL, OWN_POOL)
    return stubs


def main() -> int:
    with tempfile.TemporaryDirectory() as scratch:
        for name, content in generate(Path(scratch)).items():
            (PROTO_DIR / name).write_bytes(content)
            print(f"wrote {(PROTO_DIR / name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
