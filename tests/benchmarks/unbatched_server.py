"""The baseline: the v2 server a user writes by hand, one `session.run` per request.

Same web framework as kubeinfer's server (aiohttp), same wire formats (v2 JSON and Triton's
binary tensor extension), no batching: each request is decoded, run through ONNX Runtime
at batch 1 right in the handler (no thread hop, which is the fastest way to do one run at
a time), and encoded. That is the strongest unbatched baseline on latency; it is the
throughput kubeinfer's batcher must beat. JSON goes through orjson when it is installed in
the environment (as a user would pick the fastest codec at hand; kubeinfer's server gets
the same choice), else the standard library.

    python unbatched_server.py --model PATH --name NAME --port PORT [--intra-op-threads N]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import onnxruntime as ort
from aiohttp import web

try:
    import orjson

    def _loads(data: bytes) -> Any:
        return orjson.loads(data)

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)

    def _to_json_data(array: np.ndarray) -> Any:
        return np.ascontiguousarray(array.ravel())

except ImportError:  # the standard library

    def _loads(data: bytes) -> Any:
        return json.loads(data)

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    def _to_json_data(array: np.ndarray) -> Any:
        return array.ravel().tolist()


_DTYPES = {"FP32": np.float32, "FP16": np.float16, "INT64": np.int64, "INT32": np.int32}
_ORT_TYPES = {"tensor(float)": "FP32", "tensor(float16)": "FP16", "tensor(int64)": "INT64",
              "tensor(int32)": "INT32"}  # fmt: skip
MAX_BATCH_SIZE = 1024
"""What the configuration says: the server runs a request's rows as they come."""
_V2 = {np.dtype(v): k for k, v in _DTYPES.items()}


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def create_app(model_path: str, name: str, intra_op_threads: int) -> web.Application:
    options = ort.SessionOptions()  # the same settings as kubeinfer's engine
    if intra_op_threads:
        options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    output_names = [o.name for o in session.get_outputs()]

    async def ready(_: web.Request) -> web.Response:
        return web.json_response({})

    def tensors(args: list[Any]) -> list[dict[str, Any]]:
        return [
            {
                "name": a.name,
                "datatype": _ORT_TYPES[a.type],
                "shape": [d if isinstance(d, int) else -1 for d in a.shape],
            }
            for a in args
        ]

    described = {
        "name": name,
        "platform": "onnxruntime",
        "inputs": tensors(session.get_inputs()),
        "outputs": tensors(session.get_outputs()),
    }

    async def metadata(_: web.Request) -> web.Response:
        return web.json_response(described)

    async def server_metadata(_: web.Request) -> web.Response:
        """The v2 server metadata, which perf_analyzer reads before it starts."""
        return web.json_response(
            {"name": "unbatched", "version": "1", "extensions": ["binary_tensor_data"]}
        )

    async def config(_: web.Request) -> web.Response:
        """Triton's model configuration, which perf_analyzer reads first: any batch runs."""

        def dims(meta: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [
                {"name": t["name"], "data_type": f"TYPE_{t['datatype']}", "dims": t["shape"][1:]}
                for t in meta
            ]

        return web.json_response(
            {"name": name, "max_batch_size": MAX_BATCH_SIZE,
             "input": dims(described["inputs"]), "output": dims(described["outputs"])}
        )  # fmt: skip

    async def infer(request: web.Request) -> web.Response:
        if request.match_info["model"] != name:
            return _error(404, f"unknown model {request.match_info['model']!r}")
        body = await request.read()
        header_length = request.headers.get("Inference-Header-Content-Length")
        try:
            if header_length is not None:
                split = int(header_length)
                header, binary = _loads(body[:split]), memoryview(body)[split:]
            else:
                header, binary = _loads(body), memoryview(b"")
            feeds, offset = {}, 0
            for tensor in header["inputs"]:
                dtype = _DTYPES[tensor["datatype"]]
                size = (tensor.get("parameters") or {}).get("binary_data_size")
                if size is not None:
                    array = np.frombuffer(binary[offset : offset + size], dtype=dtype)
                    offset += size
                else:
                    array = np.asarray(tensor["data"], dtype=dtype)
                feeds[tensor["name"]] = array.reshape(tensor["shape"])
            binary_out = {
                o["name"]
                for o in header.get("outputs") or ()
                if (o.get("parameters") or {}).get("binary_data")
            }
        except (ValueError, KeyError, TypeError) as error:
            return _error(400, f"bad request: {error}")
        try:
            results = session.run(output_names, feeds)
        except Exception as error:  # ORT's own argument errors
            return _error(400, str(error))
        outputs, chunks = [], []
        for output_name, array in zip(output_names, results, strict=True):
            entry = {"name": output_name, "shape": list(array.shape), "datatype": _V2[array.dtype]}
            if output_name in binary_out:
                data = np.ascontiguousarray(array).tobytes()
                entry["parameters"] = {"binary_data_size": len(data)}
                chunks.append(data)
            else:
                entry["data"] = _to_json_data(array)
            outputs.append(entry)
        response_header = _dumps({"model_name": name, "outputs": outputs})
        if not chunks:
            return web.Response(body=response_header, content_type="application/json")
        return web.Response(
            body=b"".join([response_header, *chunks]),
            headers={
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(len(response_header)),
            },
        )

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/v2", server_metadata)
    app.router.add_get("/v2/health/live", ready)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2/models/{model}", metadata)
    app.router.add_get("/v2/models/{model}/ready", ready)
    app.router.add_get("/v2/models/{model}/config", config)
    app.router.add_post("/v2/models/{model}/infer", infer)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--intra-op-threads", type=int, default=0)
    args = parser.parse_args()
    web.run_app(
        create_app(args.model, args.name, args.intra_op_threads),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
    )


if __name__ == "__main__":
    main()
