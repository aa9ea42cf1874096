"""`kubeinfer tune`: the batcher's tuning sweep as a command (see `command`).

`load` is the load generator the sweep drives (the benchmarks under tests/benchmarks/ use
it too).
"""
