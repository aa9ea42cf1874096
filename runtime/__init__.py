"""kubeinfer's data plane: the inference server, its dynamic batcher, and the engines.

Two halves share this package. Serving (`kubeinfer serve`) is at the top: `serve_command`
(configuration, the engine loaded and checked), `rust_dataplane` (the Rust extension
`kubeinfer_dataplane` from `native/`, which owns every request: transports, decoding,
admission, batching, metrics), `rust_mirroring` and `shadow/` (the comparisons behind
shadow and quality), `protocol/` (the OIP v2 tensors the mirrors send and read),
`exported_series` (the checked table of what it exports at /metrics); and, in `engines/`
but serving's only, the GPU memory gauges' reader (`engines.gpu_memory`) and the check
that the slots' buffers fit in memory (`engines.buffer_fit`).
The engine build (`kubeinfer build`) is `building/`. They never import each other; what
both use stays at the top (the engine cache and its manifest, `engines/`,
`output_statistics`, `config`, `api_model`): `building/__init__.py` says what went where
and why.

The runtime never imports the operator, kopf or the Kubernetes client: a runtime pod
needs only its typed config (`kubeinfer.contract.runtime_config`) and an engine.
"""
