"""kubeinfer's data plane: the inference server, its dynamic batcher, and the engines.

Two halves share this package. Serving (`kubeinfer serve`) is at the top: `serve_command`,
`serving` (the data plane assembled once, both transports over it), `dataplane`, `http/`,
`grpc_service/`, `protocol/`, `batching/`, `shadow/`, `metrics`, `gpu_memory`.
The engine build (`kubeinfer build`) is `building/`. They never import each other; what
both use stays at the top (the engine cache and its manifest, `engines/`,
`output_statistics`, `config`, `api_model`): `building/__init__.py` says what went where
and why.

The runtime never imports the operator, kopf or the Kubernetes client: a runtime pod
needs only its typed config (`kubeinfer.contract.runtime_config`) and an engine.
"""
