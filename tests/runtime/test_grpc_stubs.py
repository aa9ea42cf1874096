"""The checked-in gRPC stubs are the vendored .proto's (`grpc_stubgen.py` says why they are
checked in): the descriptor the message module registers is the one protoc compiles from
the .proto now, and, where the installed grpcio-tools is the version that wrote them, all
three files are byte for byte what it writes. On a mismatch: run `make protos`.

Nothing here imports the stubs: the default protobuf descriptor pool would then hold the
`inference.*` messages, and tritonclient's own copy of them (imported by the gRPC tests in
the same session) could not be registered after.
"""

from __future__ import annotations

import ast
import re
from importlib import metadata
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_stubgen import GENERATED, PROTO_DIR, VIRTUAL_DIR, generate, protoc

HINT = "the gRPC stubs are out of date with the .proto: run `make protos`"


def registered_descriptor(module: Path) -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto a generated `_pb2.py` adds to the pool (read, not run)."""
    for node in ast.walk(ast.parse(module.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
        ):
            argument = node.args[0]
            assert isinstance(argument, ast.Constant) and isinstance(argument.value, bytes)
            return descriptor_pb2.FileDescriptorProto.FromString(argument.value)
    raise AssertionError(f"{module} registers no descriptor")


def compiled_descriptor(scratch: Path) -> descriptor_pb2.FileDescriptorProto:
    """The .proto as protoc compiles it now, without the JSON names (which generated
    Python code leaves out: protobuf derives them)."""
    protoc(scratch, f"--descriptor_set_out={scratch / 'set.pb'}")
    [compiled] = descriptor_pb2.FileDescriptorSet.FromString((scratch / "set.pb").read_bytes()).file
    messages = list(compiled.message_type)
    while messages:
        message = messages.pop()
        for field in message.field:
            field.ClearField("json_name")
        messages.extend(message.nested_type)
    return compiled


def test_the_message_stubs_describe_the_vendored_proto(tmp_path: Path) -> None:
    compiled = compiled_descriptor(tmp_path)
    checked_in = registered_descriptor(PROTO_DIR / GENERATED[0])
    assert compiled.name == f"{VIRTUAL_DIR}/open_inference_grpc.proto"
    assert checked_in == compiled, HINT
    service = {m.name for m in compiled.service[0].method}
    assert service == {
        "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
        "ModelConfig",
    }  # fmt: skip


def test_the_service_stubs_route_every_method_of_the_proto(tmp_path: Path) -> None:
    compiled = compiled_descriptor(tmp_path)
    routes = set(
        re.findall(
            r"'(/inference\.GRPCInferenceService/\w+)'", (PROTO_DIR / GENERATED[2]).read_text()
        )
    )
    assert routes == {
        f"/inference.GRPCInferenceService/{m.name}" for m in compiled.service[0].method
    }, HINT


def test_the_stubs_are_what_their_grpcio_tools_writes(tmp_path: Path) -> None:
    """Byte for byte, when the installed grpcio-tools is the version recorded in them;
    with another version only the descriptor is compared (above): its code differs in
    version checks and formatting, not in what it serves."""
    service = (PROTO_DIR / GENERATED[2]).read_text()
    recorded = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", service)
    assert recorded, "the service stub records no grpcio-tools version"
    fresh = generate(tmp_path)
    if metadata.version("grpcio-tools") != recorded.group(1):
        assert fresh.keys() == set(GENERATED)
        return
    for name, content in fresh.items():
        assert (PROTO_DIR / name).read_bytes() == content, f"{name}: {HINT}"
