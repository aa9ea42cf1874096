"""The engine build: the half of the runtime that `kubeinfer build` runs (in the
operator's build Jobs), never loaded by a serving pod.

    model_fetch.py     fetches a file a URI names through fsspec: retries, resumption, sha256
    model_files.py     the files a model is made of (its external data), fetched together
    calibration.py     calibration and validation samples: the .npz format, its checks, demo data
    builders/          one builder per backend (ONNX Runtime, TensorRT) behind one interface
    accuracy.py        the engine's outputs against the fp32 reference, and the gates on them
    engine_build.py    the whole build: fetch, key, lock, build, measure, publish to the cache
    build_command.py   `kubeinfer build`'s flags, exit codes and termination message

Serving is the other half (`serving`, `dataplane`, `serve_command`, `http/`, `protocol/`,
`batching/`, `shadow/`, `exported_series`, at the top of `kubeinfer.runtime`, and
`engines.gpu_memory` and `engines.buffer_fit`, which serving alone imports). The
two halves never import each other (`.importlinter`); they meet in the modules both use,
which stay at the top:

- `engine_cache` and `engine_manifest`: the content-addressed cache on the volume build
  Jobs and runtime pods share. The build publishes into it; `kubeinfer serve` resolves,
  verifies and loads an engine from it by digest, and refuses an incompatible one with
  `EngineIncompatibleError` and its exit code (`EXIT_ENGINE_INCOMPATIBLE`). The manifest
  holds the accuracy report's models, so serving reads a manifest without the build's
  code, and `sha256_file`, which names every file the key and manifest record.
- `engines/`: loading an engine; the build runs what it built through it, serving
  infers with it.
- `output_statistics`: the one definition of the output comparison, used by the build's
  accuracy report and the shadow comparison.
- `config` (the runtime's config models) and `api_model` (the base of every API and
  config model, the operator's too).

`commands` mounts both commands on the `kubeinfer` CLI. The small ONNX models the demo,
the benchmarks and the tests build and serve are the demo's (`kubeinfer.cli.demo.mlp_models`).
"""
