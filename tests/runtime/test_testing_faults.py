"""The test-only fault injector (`kubeinfer.runtime.testing_faults`) on real engines: the
setting's form (empty injects nothing; a bad part is refused naming the form); the share
of batches it perturbs, chosen per batch by its seed (the same batches for the same seed,
others for another, the first N clean when asked); every element of a perturbed batch
changed as a silent fault would leave it (no NaN or infinity made); and the engine file
damaged in place after its digest check, inline weights and external data alike, so that
the engine still loads and answers, wrongly."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.runtime.building.calibration import write_demo_samples
from kubeinfer.runtime.building.engine_build import build_engine
from kubeinfer.runtime.engine_cache import load_cached, resolve_engine
from kubeinfer.runtime.engine_manifest import sha256_file
from kubeinfer.runtime.engines.onnxruntime import OnnxRuntimeEngine
from kubeinfer.runtime.testing_faults import (
    InjectedFaults,
    PerturbingEngine,
    damage_engine_file,
    parse_testing_faults,
    perturb,
)


def test_the_setting_selects_faults_and_nothing_by_default() -> None:
    assert parse_testing_faults(None) == parse_testing_faults(" ") == InjectedFaults()
    assert not InjectedFaults().any
    faults = parse_testing_faults("perturb-batches=0.25, seed=7, perturb-after-batches=3")
    assert faults == InjectedFaults(perturb_batches=0.25, perturb_after_batches=3, seed=7)
    assert parse_testing_faults("damage-engine-after-digest-check").after_digest_check()
    assert InjectedFaults().after_digest_check() is None
    for bad in ("perturb-batches=2", "seed=-1", "sabotage", "damage-engine-after-digest-check=1",
                "perturb-lowest-bit=yes"):  # fmt: skip
        with pytest.raises(ValueError, match="is not one of perturb-batches=SHARE"):
            parse_testing_faults(bad)


def test_an_engine_without_faults_is_not_wrapped(tiny_model: Path) -> None:
    engine = OnnxRuntimeEngine(tiny_model, max_batch_size=4)
    assert InjectedFaults().wrap(engine) is engine
    assert parse_testing_faults("damage-engine-after-digest-check").wrap(engine) is engine


def _perturbed_batches(tiny_model: Path, faults: InjectedFaults, batches: int) -> list[int]:
    engine = OnnxRuntimeEngine(tiny_model, max_batch_size=4, intra_op_threads=1)
    clean_slot = engine.create_slot()
    wrapped = PerturbingEngine(engine, faults)
    slot = wrapped.create_slot()
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    clean_slot.input_views(2)["input"][...] = x
    clean = np.array(clean_slot.run(2)["logits"])
    wrong = []
    for batch in range(batches):
        slot.input_views(2)["input"][...] = x
        if not np.array_equal(slot.run(2)["logits"], clean):
            wrong.append(batch)
    assert len(wrong) == wrapped.perturbed
    slot.close(), clean_slot.close(), engine.close()
    return wrong


def test_a_share_of_batches_is_perturbed_the_same_way_for_the_same_seed(tiny_model: Path) -> None:
    half = InjectedFaults(perturb_batches=0.5, seed=1)
    first = _perturbed_batches(tiny_model, half, 400)
    assert 160 <= len(first) <= 240
    assert _perturbed_batches(tiny_model, half, 400) == first
    assert _perturbed_batches(tiny_model, InjectedFaults(perturb_batches=0.5, seed=2), 400) != first
    assert _perturbed_batches(tiny_model, InjectedFaults(perturb_batches=1.0), 5) == [0, 1, 2, 3, 4]
    later = InjectedFaults(perturb_batches=1.0, perturb_after_batches=3)
    assert _perturbed_batches(tiny_model, later, 6) == [3, 4, 5]


def test_every_element_of_a_perturbed_output_changes_and_stays_finite() -> None:
    floats = np.array([[1.0, -2.5, 1e-3, 3e38]], dtype=np.float32)
    changed = perturb(floats.copy())
    assert np.all(changed != floats) and np.all(np.isfinite(changed))
    assert np.all((np.abs(changed / floats) > 0.6) & (np.abs(changed / floats) < 1.6))
    assert perturb(np.array([3, 4], dtype=np.int64)).tolist() == [2, 5]
    assert perturb(np.array([True, False])).tolist() == [False, True]
    assert perturb(np.array([b"cat", b""], dtype=object)).tolist() == [b"bat", b"\x01"]
    frozen = np.ones(3, dtype=np.float16)
    frozen.flags.writeable = False
    assert np.all(perturb(frozen) != 1.0) and np.all(frozen == 1.0)  # a copy, not in place


def test_the_lowest_bit_moves_each_float_by_one_unit_in_the_last_place_and_nothing_else() -> None:
    floats = np.array([[1.0, -2.5, 1e-3, 3e38]], dtype=np.float32)
    moved = perturb(floats.copy(), lowest_bit=True)
    assert np.all(moved != floats)
    assert np.all(np.abs(moved - floats) == np.spacing(np.abs(floats)))  # one ulp each
    assert perturb(np.array([3, 4], dtype=np.int64), lowest_bit=True).tolist() == [3, 4]
    assert perturb(np.array([b"cat"], dtype=object), lowest_bit=True).tolist() == [b"cat"]
    assert parse_testing_faults("perturb-batches=1, perturb-lowest-bit").perturb_lowest_bit


@pytest.mark.parametrize(
    ("precision", "external"),
    [("int8", False), ("fp32", True)],  # int8 weights inline, fp32's in the data file
    ids=["int8-inline", "fp32-external-data"],
)
def test_the_engine_file_is_damaged_in_place_and_still_loads_answering_wrong(
    tmp_path: Path, precision: str, external: bool
) -> None:
    model = build_tiny_mlp(tmp_path / "tiny.onnx")
    if external:
        import onnx

        loaded = onnx.load(str(model))
        onnx.save(loaded, str(model), save_as_external_data=True, location="tiny.onnx.data",
                  size_threshold=0)  # fmt: skip
    calibration = write_demo_samples(model, tmp_path / "calibration.npz", count=32)
    built = build_engine(str(model), "onnxruntime", precision, tmp_path / "cache",
                         calibration=str(calibration), max_batch_size=4)  # fmt: skip
    resolved = resolve_engine(tmp_path / "cache", built.digest)
    files = {name: (resolved.directory / name) for name in resolved.manifest.entry_files}
    sizes = {name: path.stat().st_size for name, path in files.items()}
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    before = ort.InferenceSession(str(resolved.engine_path)).run(None, {"input": x})[0]
    damaged = []
    cached = load_cached(
        tmp_path / "cache", built.digest, 4,
        after_digest_check=lambda entry: (
            parse_testing_faults("damage-engine-after-digest-check").after_digest_check()(entry),  # type: ignore[misc]
            damaged.append(entry.digest),
        )[0],
    )  # fmt: skip
    assert cached.resolved == resolved, "damaged in place: the entry checked is the one loaded"
    cached.engine.close()
    assert damaged == [built.digest]
    assert {name: path.stat().st_size for name, path in files.items()} == sizes
    changed = [n for n, p in files.items() if sha256_file(p) != resolved.manifest.entry_files[n]]
    assert changed == (["model.onnx.data"] if external else ["model.onnx"])
    after = ort.InferenceSession(str(resolved.engine_path)).run(None, {"input": x})[0]
    assert after.shape == before.shape and np.all(np.isfinite(after))
    assert not np.allclose(after, before, atol=0.05)
    shutil.rmtree(tmp_path / "cache")


def test_a_read_only_cache_is_damaged_in_a_copy_which_is_what_loads(tmp_path: Path) -> None:
    """A serving pod mounts its cache read-only: the entry is copied to the temporary
    directory and damaged there, the cache left as it was, and the copy loads."""
    model = build_tiny_mlp(tmp_path / "tiny.onnx")
    built = build_engine(str(model), "onnxruntime", "fp32", tmp_path / "cache", max_batch_size=4)
    resolved = resolve_engine(tmp_path / "cache", built.digest)
    digests = {n: sha256_file(resolved.directory / n) for n in resolved.manifest.entry_files}
    copy = damage_engine_file(resolved, writable=lambda _: False)
    assert copy is not None and copy.digest == resolved.digest
    assert copy.directory != resolved.directory and copy.engine_path.is_relative_to(copy.directory)
    assert {n: sha256_file(resolved.directory / n) for n in digests} == digests, "cache untouched"
    assert sha256_file(copy.engine_path) != digests["model.onnx"]
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    clean = ort.InferenceSession(str(resolved.engine_path)).run(None, {"input": x})[0]
    wrong = ort.InferenceSession(str(copy.engine_path)).run(None, {"input": x})[0]
    assert not np.allclose(wrong, clean, atol=0.05)
    read_only = lambda entry: damage_engine_file(entry, lambda _: False)  # noqa: E731
    cached = load_cached(tmp_path / "cache", built.digest, 4, after_digest_check=read_only)
    assert cached.resolved.directory != resolved.directory, "the copy is what loads"
    cached.engine.close()
    for each in (copy, cached.resolved):
        shutil.rmtree(each.directory.parent)
