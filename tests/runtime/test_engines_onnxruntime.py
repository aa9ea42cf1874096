"""The ONNX Runtime slot engine against plain ONNX Runtime, on real models built here.

Covers: the specs read from the session (names, v2 datatypes, shapes, symbolic output
dims resolved by a probe); outputs equal `InferenceSession.run` on the same inputs for
every batch size 1..max (tiny and small demo MLPs, float and integer/half models); the
hot path allocates no buffer (tracemalloc sees numpy's allocations: a plain `run` shows up,
the slot's `run` does not) and the slot's buffers never move; two slots run concurrently
in threads give each its own correct results; clear errors for a batch outside
1..max_batch_size, an unsupported datatype, a fixed or missing batch dimension, a dynamic
non-batch dimension, a missing file and an unknown backend; `load_engine`. (Strings and
non-tensor types: `test_engine_strings`.)
"""

from __future__ import annotations

import ctypes
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from kubeinfer.cli.demo import mlp_models
from kubeinfer.runtime.engines.base import BatchSizeError, TensorSpec, UnsupportedModel
from kubeinfer.runtime.engines.loader import load_engine
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from onnx import TensorProto, helper


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("engine-models")
    return {
        "tiny": mlp_models.build_tiny_mlp(root / "tiny.onnx"),
        "small": mlp_models.build_small_mlp(root / "small.onnx"),
    }


def plain_run(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)


def write_model(
    path: Path,
    inputs: list[tuple[str, int, list]],
    outputs: list[tuple[str, int, list]],
    nodes: list[onnx.NodeProto],
) -> Path:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def test_specs_come_from_the_session(models: dict[str, Path]) -> None:
    engine = OnnxRuntimeEngine(models["small"], max_batch_size=4)
    assert engine.inputs == (TensorSpec("input", "FP32", (-1, 512)),)
    assert engine.outputs == (TensorSpec("logits", "FP32", (-1, 128)),)
    assert engine.max_batch_size == 4


@pytest.mark.parametrize(("model", "max_batch"), [("tiny", 16), ("small", 8)])
def test_outputs_equal_a_plain_session_run_for_every_batch_size(
    models: dict[str, Path], model: str, max_batch: int
) -> None:
    engine = OnnxRuntimeEngine(models[model], max_batch_size=max_batch, intra_op_threads=1)
    slot = engine.create_slot()
    (spec,) = engine.inputs
    rng = np.random.default_rng(7)
    for n in range(1, max_batch + 1):
        batch = rng.standard_normal((n, *spec.item_shape)).astype(np.float32)
        slot.input_views(n)[spec.name][...] = batch
        outputs = slot.run(n)
        (expected,) = plain_run(models[model], {spec.name: batch})
        assert outputs["logits"].shape == expected.shape == (n, engine.outputs[0].shape[1])
        np.testing.assert_allclose(outputs["logits"], expected, rtol=1e-5, atol=1e-5)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
        ).split()
    ]


def _native_heap_in_use() -> int | None:
    """Bytes malloc has handed out (main arena plus mmapped blocks), glibc only."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd)


def test_the_hot_path_allocates_no_buffer(tmp_path: Path) -> None:
    """400 batches of every size 1..8 on a model whose output row is 16 KiB, after one
    warm-up run per size (memory patterns are planned per shape):

    - the outputs are views of the slot's buffers, whose addresses never change (ONNX
      Runtime wrote into them; it allocated no output);
    - tracemalloc (which traces numpy's data allocations) sees the traced peak rise by less
      than one output row over the 400 runs: no input or output array is made on the
      Python side;
    - glibc's malloc statistics see the native heap (ONNX Runtime's own allocations) grow
      by less than one row: nothing is retained per batch. (Transient native allocations
      would not show here; ONNX Runtime's arena recycles intermediates, and the outputs
      are written into the slot's buffers, as the addresses show.) Keeping a plain
      `session.run`'s outputs grows the heap by a row per run, which shows the
      instrument does see ONNX Runtime's allocations.
    """
    path = mlp_models.build_mlp(tmp_path / "wide.onnx", 64, (64,), 4096)
    engine = OnnxRuntimeEngine(path, max_batch_size=8, intra_op_threads=1)
    slot = engine.create_slot()
    data = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    buffers = {**slot.input_buffers, **slot.output_buffers}
    pointers = {k: v.ctypes.data for k, v in buffers.items()}
    for n in range(1, 9):
        slot.input_views(n)["input"][...] = data[:n]
        slot.run(n)
    one_row = 4096 * 4

    def run_slot_batches() -> None:
        for _ in range(50):
            for n in range(1, 9):
                slot.input_views(n)["input"][...] = data[:n]
                slot.run(n)

    heap_before = _native_heap_in_use()
    tracemalloc.start()
    try:
        # ONNX Runtime's binding keeps ~15 KiB of small Python objects that it makes
        # afresh once tracing starts; one traced pass settles them (they do not grow).
        run_slot_batches()
        traced_before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        run_slot_batches()
        traced_growth = tracemalloc.get_traced_memory()[1] - traced_before
    finally:
        tracemalloc.stop()
    heap_after = _native_heap_in_use()

    assert traced_growth < one_row, f"400 slot runs lifted the traced peak by {traced_growth} B"
    assert {k: v.ctypes.data for k, v in buffers.items()} == pointers
    assert slot.run(8)["logits"].ctypes.data == pointers["logits"]
    if heap_before is None or heap_after is None:
        pytest.skip("malloc statistics need glibc")
    assert heap_after - heap_before < one_row, f"native heap grew {heap_after - heap_before} B"

    # Without the arena each output ONNX Runtime allocates is a malloc the statistics see.
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = False
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    session.run(None, {"input": data})
    plain_before = _native_heap_in_use()
    kept = [session.run(None, {"input": data[:1]})[0] for _ in range(50)]
    plain_growth = (_native_heap_in_use() or 0) - (plain_before or 0)
    assert plain_growth >= 50 * one_row, f"the instrument missed {len(kept)} outputs"


def test_views_are_the_first_rows_of_buffers_made_once(models: dict[str, Path]) -> None:
    engine = OnnxRuntimeEngine(models["tiny"], max_batch_size=8)
    slot = engine.create_slot()
    base = slot.input_buffers["input"]
    for n in (1, 5, 8):
        view = slot.input_views(n)["input"]
        assert view.shape == (n, 16) and view.dtype == np.float32
        assert view.ctypes.data == base.ctypes.data and np.shares_memory(view, base)
        assert base.ctypes.data % 64 == 0
        assert slot.input_views(n) is slot.input_views(n)


def test_two_slots_in_threads_each_get_their_own_results(models: dict[str, Path]) -> None:
    path = models["small"]
    engine = OnnxRuntimeEngine(path, max_batch_size=8, intra_op_threads=1)
    slots = [engine.create_slot() for _ in range(2)]
    rng = np.random.default_rng(3)
    batches = [rng.standard_normal((n, 512)).astype(np.float32) for n in (8, 5)]
    expected = [plain_run(path, {"input": b})[0] for b in batches]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def work(i: int) -> None:
        try:
            start.wait()
            n = len(batches[i])
            for _ in range(40):
                slots[i].input_views(n)["input"][...] = batches[i]
                np.testing.assert_allclose(
                    slots[i].run(n)["logits"], expected[i], rtol=1e-5, atol=1e-5
                )
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors


def test_session_per_slot_gives_the_same_outputs(models: dict[str, Path]) -> None:
    path = models["tiny"]
    engine = OnnxRuntimeEngine(path, max_batch_size=4, intra_op_threads=1, session_per_slot=True)
    a, b = engine.create_slot(), engine.create_slot()
    batch = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    for slot in (a, b):
        slot.input_views(3)["input"][...] = batch
    np.testing.assert_array_equal(a.run(3)["logits"], b.run(3)["logits"])
    np.testing.assert_allclose(a.run(3)["logits"], plain_run(path, {"input": batch})[0], rtol=1e-5)


@pytest.mark.parametrize("batch_size", [0, -1, 9])
def test_a_batch_outside_one_to_max_is_refused(models: dict[str, Path], batch_size: int) -> None:
    slot = OnnxRuntimeEngine(models["tiny"], max_batch_size=8).create_slot()
    with pytest.raises(BatchSizeError, match=r"outside 1\.\.8"):
        slot.input_views(batch_size)
    with pytest.raises(BatchSizeError, match=r"outside 1\.\.8"):
        slot.run(batch_size)


def test_integer_and_half_tensors_map_to_v2_datatypes(tmp_path: Path) -> None:
    path = write_model(
        tmp_path / "mixed.onnx",
        [("ids", TensorProto.INT64, ["b", 3]), ("x", TensorProto.FLOAT16, ["b", 2])],
        [("ids_twice", TensorProto.INT64, ["b", 3]), ("x_out", TensorProto.FLOAT16, ["b", 2])],
        [
            helper.make_node("Add", ["ids", "ids"], ["ids_twice"]),
            helper.make_node("Neg", ["x"], ["x_out"]),
        ],
    )
    engine = OnnxRuntimeEngine(path, max_batch_size=4)
    assert [s.datatype for s in engine.inputs] == ["INT64", "FP16"]
    assert [s.datatype for s in engine.outputs] == ["INT64", "FP16"]
    slot = engine.create_slot()
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    x = np.array([[1.5, -2.0], [0.25, 4.0]], dtype=np.float16)
    views = slot.input_views(2)
    views["ids"][...], views["x"][...] = ids, x
    out = slot.run(2)
    np.testing.assert_array_equal(out["ids_twice"], ids * 2)
    np.testing.assert_array_equal(out["x_out"], -x)


def test_symbolic_output_dims_are_resolved_by_a_probe_run(tmp_path: Path) -> None:
    path = write_model(
        tmp_path / "symbolic.onnx",
        [("x", TensorProto.FLOAT, ["b", 3])],
        [("y", TensorProto.FLOAT, ["b", "width"])],
        [helper.make_node("Relu", ["x"], ["y"])],
    )
    engine = OnnxRuntimeEngine(path, max_batch_size=2)
    assert engine.outputs == (TensorSpec("y", "FP32", (-1, 3)),)
    slot = engine.create_slot()
    slot.input_views(2)["x"][...] = [[-1, 2, -3], [4, -5, 6]]
    np.testing.assert_array_equal(slot.run(2)["y"], [[0, 2, 0], [4, 0, 6]])


def test_an_output_that_does_not_follow_the_batch_is_refused(tmp_path: Path) -> None:
    path = write_model(
        tmp_path / "reduced.onnx",
        [("x", TensorProto.FLOAT, ["b", 3])],
        [("total", TensorProto.FLOAT, ["one", "width"])],
        [helper.make_node("ReduceMax", ["x"], ["total"], axes=[0], keepdims=1)],
    )
    # ONNX Runtime infers [1, 3] here (a fixed first dimension); where it cannot infer
    # the shape, the probe run with two rows sees that the output does not follow.
    with pytest.raises(UnsupportedModel, match=r"'total' (has a fixed first|does not follow)"):
        OnnxRuntimeEngine(path, max_batch_size=4)


@pytest.mark.parametrize(
    ("dtype", "shape", "message"),
    [
        (TensorProto.BFLOAT16, ["b", 2], "tensor\\(bfloat16\\)"),
        (TensorProto.FLOAT, [4, 2], "fixed first dimension \\(4\\)"),
        (TensorProto.FLOAT, [], "is a scalar"),
        (TensorProto.FLOAT, ["b", "n"], r"variable axes besides the batch \(\[.n.\]\); state"),
    ],
)
def test_models_a_slot_cannot_serve_are_refused_at_load(
    tmp_path: Path, dtype: int, shape: list, message: str
) -> None:
    path = write_model(
        tmp_path / "bad.onnx",
        [("x", dtype, shape)],
        [("y", dtype, shape)],
        [helper.make_node("Identity", ["x"], ["y"])],
    )
    with pytest.raises(UnsupportedModel, match=message):
        OnnxRuntimeEngine(path, max_batch_size=4)


def test_load_engine_picks_the_backend(models: dict[str, Path], tmp_path: Path) -> None:
    engine = load_engine(models["tiny"], "onnxruntime", max_batch_size=4, intra_op_threads=1)
    assert isinstance(engine, OnnxRuntimeEngine) and engine.max_batch_size == 4
    with pytest.raises(ValueError, match="unknown engine backend 'tvm'"):
        load_engine(models["tiny"], "tvm", max_batch_size=4)
    with pytest.raises(FileNotFoundError, match="no model file"):
        load_engine(tmp_path / "missing.onnx", "onnxruntime", max_batch_size=4)
    not_onnx = tmp_path / "garbage.onnx"
    not_onnx.write_bytes(b"not a model")
    with pytest.raises(UnsupportedModel, match="ONNX Runtime cannot load"):
        load_engine(not_onnx, "onnxruntime", max_batch_size=4)
