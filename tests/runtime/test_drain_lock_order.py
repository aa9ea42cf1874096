"""The drain with a batch on the engine while Python's logging gives the GIL away: the
Rust server's log records go to Python's logging (pyo3-log, with the GIL), and a slot's
thread holds the GIL over its batch and then takes the server's core to finish it. A log
call made with the core held (the drain's first line once read its queue inside the log
call's arguments) deadlocks the process: the runtime image's SIGTERM test hung on it in a
fresh-clone CI, `podman wait` never returning.

Here the engine's batch is held behind a gate, and a logging handler opens the gate when
the drain's first line arrives and waits, without the GIL, until the batch has left the
engine, which hands the GIL to the slot's thread at the moment that deadlocked. It runs in
a process of its own so that a deadlock fails the test (killed at its timeout) instead
of hanging the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kubeinfer.cli.demo.mlp_models import build_tiny_mlp

HERE = Path(__file__).resolve().parent

SCENARIO = r"""
import json, logging, sys, threading, time
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
sys.path[:0] = sys.argv[2:]
import numpy as np
from conftest import GatedEngine
from kubeinfer.contract.runtime_config import BatchingPolicy, EngineSource, RuntimeConfig
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from rust_served import rust_served
from waiting import wait_for

model = sys.argv[1]
engine = OnnxRuntimeEngine(model, max_batch_size=8, intra_op_threads=1)
gated = GatedEngine(engine)
gated.gate.clear()

class OpenTheGateOnTheDrain(logging.Handler):
    def emit(self, record):
        if not record.getMessage().startswith("Started draining"):
            return
        gated.gate.set()
        # Without the GIL until the batch has left the engine: its thread takes the GIL,
        # returns from the run and goes on to finish the batch in the server's core.
        while gated.running:
            time.sleep(0.01)
        time.sleep(0.2)

logging.getLogger("kubeinfer.dataplane_server").addHandler(OpenTheGateOnTheDrain())
config = RuntimeConfig(model_name="tiny", engine=EngineSource(onnx_path=model),
                       host="127.0.0.1", batching=BatchingPolicy(execution_slots=1))
answers = []
with rust_served(config, gated) as served:
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                                   "data": np.ones(16).tolist()}]}).encode()
    client = threading.Thread(
        target=lambda: answers.append(served.request("POST", served.infer_path, body)[0]))
    client.start()
    wait_for(lambda: gated.running == 1, 30, "the request's batch on the engine")
    left = served.shutdown()
    client.join(30)
engine.close()
print(json.dumps({"answers": answers, "left_on_engine": left}))
"""


def test_a_drain_with_a_batch_on_the_engine_ends_while_logging_gives_the_gil_away(
    tmp_path: Path,
) -> None:
    model = build_tiny_mlp(tmp_path / "tiny.onnx")
    paths = [str(HERE), str(HERE.parent / "support")]
    try:
        done = subprocess.run(
            [sys.executable, "-c", SCENARIO, str(model), *paths],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except subprocess.TimeoutExpired as stuck:
        raise AssertionError(
            f"the drain did not end (deadlocked?): {(stuck.stderr or b'')[-3000:]!r}"
        ) from None
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome == {"answers": [200], "left_on_engine": 0}, done.stderr[-3000:]
    assert "Drained" in done.stderr, done.stderr[-3000:]
