"""A minimal MLServer runtime serving an ONNX model with ONNX Runtime, for the benchmark.

MLServer has no maintained ONNX runtime of its own, so the comparison uses the smallest
custom runtime its docs describe: `load` opens an InferenceSession, `predict` decodes the
(adaptively batched) v2 request with `NumpyCodec`, runs it once and encodes the outputs.
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
from mlserver.types import InferenceRequest, InferenceResponse  # type: ignore[import-not-found]


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
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {tensor.name: NumpyCodec.decode_input(tensor) for tensor in payload.inputs}
        batch_size = next(iter(feeds.values())).shape[0]
        results = self._session.run(self._output_names, feeds)
        mlserver.log(bench_batch_size=batch_size)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[
                NumpyCodec.encode_output(name=name, payload=array)
                for name, array in zip(self._output_names, results, strict=True)
            ],
        )
