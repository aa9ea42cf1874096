"""`kubeinfer tune`: the batcher's tuning sweep as a command (see `command`).

`perf` runs Triton's perf_analyzer, which offers the load (the benchmarks under
tests/benchmarks/ drive theirs with it too); `load` is our own small client for what
perf_analyzer cannot express (its docstring says what).
"""
