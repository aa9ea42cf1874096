"""The benchmarks' load generator, now `kubeinfer.cli.tune.load` (`kubeinfer tune` drives
its sweeps with it, and the package never imports tests/); re-exported here so the
benchmarks keep importing `loadgen`. Add to the package module, not here."""

from kubeinfer.cli.tune.load import (
    Connection,
    EncodedRequest,
    LoadGenError,
    Response,
    RunResult,
    encode_binary_infer,
    encode_json_infer,
    open_connection,
    request_once,
    run_closed_loop,
)

_Connection = Connection  # bench_hostile subclasses it under its old name

__all__ = [
    "Connection",
    "EncodedRequest",
    "LoadGenError",
    "Response",
    "RunResult",
    "_Connection",
    "encode_binary_infer",
    "encode_json_infer",
    "open_connection",
    "request_once",
    "run_closed_loop",
]
