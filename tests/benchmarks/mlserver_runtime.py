"""A minimal MLServer runtime serving an ONNX model with ONNX Runtime, for the benchmark.

MLServer has no maintained ONNX runtime of its own, so the comparison uses the smallest
custom runtime its docs describe: `load` opens an InferenceSession, `predict` decodes the
(adaptively batched) v2 request with `NumpyCodec`, runs it once and encodes the outputs.
`load` also fills the model's metadata with its tensors, and a custom handler answers
Triton's model configuration: what perf_analyzer, the benchmark's load, reads first.
MLServer's adaptive batcher merges concurrent single-item requests along dim 0 before
`predict` and splits the response afterwards, so each `predict` call is one batch; its size
is logged as the custom metric `bench_batch_size` (MLServer publishes no batch-size
metric of its own) so the benchmark can report MLServer's mean batch as it does
kubeinfer's.

Loaded by MLServer from `.venv-bench` (never by kubeinfer or pytest); the model's folder
names it as `mlserver_runtime.OnnxRuntimeModel` with this directory on PYTHONPATH.
"""

from __future__ import annotations

import mlserver  # type: ignore[import-not-found]
import onnxruntime as ort
from mlserver import MLModel  # type: ignore[import-not-found]
from mlserver.codecs import NumpyCodec  # type: ignore[import-not-found]
from mlserver.handlers import custom_handler  # type: ignore[import-not-found]
from mlserver.types import (  # type: ignore[import-not-found]
    InferenceRequest,
    InferenceResponse,
    MetadataTensor,
)

_V2 = {"tensor(float)": "FP32", "tensor(float16)": "FP16", "tensor(int64)": "INT64"}


class OnnxRuntimeModel(MLModel):
    """One InferenceSession per model; the model file is `parameters.uri`."""

    async def load(self) -> bool:
        uri = self.settings.parameters.uri
        extra = self.settings.parameters.extra or {}
        options = ort.SessionOptions()  # the same settings as kubeinfer's engine
        if extra.get("intra_op_threads"):
            options.intra_op_num_threads = int(extra["intra_op_threads"])
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(uri, options, providers=["CPUExecutionProvider"])
        self._output_names = [o.name for o in self._session.get_outputs()]
        mlserver.register("bench_batch_size", "Items per predict call (one adaptive batch)")
        # The tensors in the metadata, as perf_analyzer reads them (a batch axis of -1).
        self.inputs = [_tensor(t) for t in self._session.get_inputs()]
        self.outputs = [_tensor(t) for t in self._session.get_outputs()]
        return True

    @custom_handler(rest_path="/v2/models/{model_name}/config", rest_method="GET")
    async def triton_config(self, model_name: str) -> dict:
        """Triton's model configuration, which perf_analyzer reads before anything else
        (MLServer has no such route): the tensors without the batch axis, and the
        adaptive batcher's largest batch."""

        def dims(tensors: list) -> list[dict]:
            return [
                {"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": t.shape[1:]}
                for t in tensors
            ]

        return {
            "name": self.name,
            "max_batch_size": self.settings.max_batch_size,
            "input": dims(self.inputs),
            "output": dims(self.outputs),
        }

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {tensor.name: NumpyCodec.decode_input(tensor) for tensor in payload.inputs}
        batch_size = next(iter(feeds.values())).shape[0]
        results = self._session.run(self._output_names, feeds)
        mlserver.log(bench_batch_size=batch_size)
        outputs = [
            NumpyCodec.encode_output(name=name, payload=array)
            for name, array in zip(self._output_names, results, strict=True)
        ]
        for output in outputs:  # perf_analyzer's client reads any parameters as binary ones
            output.parameters = None
        return InferenceResponse(model_name=self.name, model_version=self.version, outputs=outputs)


def _tensor(arg: ort.NodeArg) -> MetadataTensor:
    shape = [d if isinstance(d, int) else -1 for d in arg.shape]
    return MetadataTensor(name=arg.name, datatype=_V2[arg.type], shape=shape)
