"""Known answers: a few probes recorded with every engine, and the check that the loaded
engine still gives their answers.

The build that gates an engine also records its known-answer set (`building.known_answer_set`):
a few probe inputs, the full-precision reference's outputs for them, and a tolerance per
output, in a file beside the engine in the cache (`probe_file`), hashed in its manifest
(`engine_manifest.KnownAnswerSet`), so a pinned engine brings its own. Serving runs the
set on the loaded engine before it reports ready (`runner.check_engine`) and compares the
answers (`comparison.judge`, pure): an engine file damaged after its digest was checked,
a runtime whose numeric path differs, a CPU or GPU that computes wrong, each answers the
probes otherwise than the engine did when it was built and gated.

What it cannot see: a fault that only some inputs trigger (a kernel wrong for one shape,
a bit stuck in memory the probes never touch) passes a probe set that does not trigger
it; the probes are a sample, not a proof.

- `comparison`: the errors, the tolerances that follow from the precision and the gate,
  and the verdict. Pure.
- `probe_file`: the set's `.npz` format, read and written byte for byte reproducibly.
- `runner`: the probes run on an `Engine`'s own slot (sync, for start-up), and
  `KnownAnswerCheck`, which keeps the latest verdict and runs the set again on demand
  when the batcher is idle (at the lowest priority).
"""
