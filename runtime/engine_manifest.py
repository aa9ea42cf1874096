"""The engine cache's key and manifest: what makes an engine unique, and what is stored
beside it.

`EngineKey` holds every input that changes the engine's bytes or where it can run: the
model's sha256, the backend and its version, the precision, the batch profile, the
calibration data's sha256 and the target (`cpu`, or the GPU's compute capability and model
such as `sm_90-h100-80gb-hbm3`: a TensorRT plan only runs on the architecture and TensorRT
version that built it, and its kernels are chosen by timing them on that GPU model, so an
H100 and an H200, both sm_90, get different engines; see `gpu_target`). Its digest is the
sha256 of the key's canonical JSON (sorted keys, no whitespace, ASCII), so the same inputs
give the same digest on every machine and at any cache path. `layout` versions our own
build recipe: a change to how we build bumps it and with it every digest, instead of
serving an engine built by the old recipe.

`EngineManifest` is `manifest.json` beside the engine: the key, the engine file's own
sha256 (checked before serving), its I/O, creation time, builder versions and the
accuracy report (`AccuracyReport`, computed by the build's `accuracy` module), and the
known-answer set (`KnownAnswerSet`: a few probe inputs, the fp32 reference's answers and a
tolerance per output, in a file beside the engine, `kubeinfer.runtime.known_answers`) that
serving checks the loaded engine against before it reports ready. Every file is named by
`sha256_file`: the model and calibration data in the key, the engine and the known-answer
file in the manifest.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Literal

from kubeinfer.contract.api_model import ApiModel, CrossFieldRule
from pydantic import Field, StringConstraints

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
SHA256_HEX_PATTERN = r"^[0-9a-f]{64}$"
MANIFEST_FILE = "manifest.json"
BUILD_LAYOUT = 3
"""2: every build records a known-answer set beside the engine (1: none), so an entry of
the older recipe is rebuilt rather than served without one. 3: a model's string inputs
reach the fp32 reference as text (2 fed it their bytes' repr), so a text model's gate and
known answers judge what serving answers; an entry of 2 would fail its own check."""
HASH_CHUNK_BYTES = 1 << 20

Backend = Literal["onnxruntime", "tensorrt"]
Precision = Literal["fp32", "fp16", "int8"]
BACKENDS: tuple[str, ...] = ("onnxruntime", "tensorrt")
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8")


TARGET_MAX_LENGTH = 64  # the InferenceDeployment status' engine target holds as much
FileName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")]


def is_digest(value: str) -> bool:
    return re.fullmatch(DIGEST_PATTERN, value) is not None


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in chunks: how the key names the model and
    the calibration data, and how the manifest names the engine file."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def gpu_target(major: int, minor: int, device_name: str) -> str:
    """The target of an engine built on a GPU: `sm_<major><minor>-<model>`, the model being
    the CUDA device's name in lower case with the vendor prefix dropped and anything but
    letters and digits made a dash (`NVIDIA H200` -> `sm_90-h200`). A name too long for
    the field keeps its start and a hash of the whole name, so it stays unique."""
    model = re.sub(r"^nvidia\s+", "", device_name.strip().lower())
    model = re.sub(r"[^a-z0-9]+", "-", model).strip("-") or "unknown"
    target = f"sm_{major}{minor}-{model}"
    if len(target) > TARGET_MAX_LENGTH:
        digest = hashlib.sha256(device_name.encode()).hexdigest()[:8]
        target = f"{target[: TARGET_MAX_LENGTH - 9].rstrip('-')}-{digest}"
    return target


class BatchProfile(ApiModel):
    """The batch sizes the engine accepts: TensorRT's optimisation profile over the first
    dimension (min/opt/max); ONNX Runtime accepts any size, and max is what the runtime may
    send."""

    min: int = Field(ge=1)
    opt: int = Field(ge=1)
    max: int = Field(ge=1)

    @classmethod
    def up_to(cls, max_batch_size: int) -> BatchProfile:
        return cls(min=1, opt=max_batch_size, max=max_batch_size)


class EngineKey(ApiModel):
    """Everything that makes an engine unique; the cache digest is computed from it."""

    layout: int = BUILD_LAYOUT
    """Version of kubeinfer's build recipe."""

    model_sha256: str = Field(pattern=SHA256_HEX_PATTERN)
    """sha256 of the source ONNX model's bytes; for a model with external data files, of
    the listing of every file's sha256 (`building.model_files.model_digest`)."""

    backend: Backend
    backend_version: str
    """The backend's version (onnxruntime or tensorrt): engines are not portable across it."""

    precision: Precision
    batch_profile: BatchProfile

    calibration_sha256: str | None = Field(default=None, pattern=SHA256_HEX_PATTERN)
    """sha256 of the calibration .npz (int8 only)."""

    target: str = Field(min_length=1, max_length=TARGET_MAX_LENGTH)
    """`cpu`, or the GPU's compute capability and model (`sm_90-h100-80gb-hbm3`)."""

    def canonical_json(self) -> str:
        return json.dumps(
            self.model_dump(mode="json", by_alias=True),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=True,
        )

    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.canonical_json().encode("ascii")).hexdigest()


class TensorInfo(ApiModel):
    """One engine input or output; `shape` has -1 for dynamic dimensions."""

    name: str
    datatype: str
    shape: list[int]


class ClassAgreement(ApiModel):
    """The rows whose reference top-1 was one class, and how many the candidate agreed on."""

    rows: int = Field(ge=1)
    """Rows whose reference argmax is this class."""

    agreements: int = Field(ge=0)
    """Of those, the rows whose candidate argmax is the same class."""

    cross_field_rules = (
        CrossFieldRule(
            cel="self.agreements <= self.rows",
            message="agreements cannot exceed rows",
            field="agreements",
            holds=lambda m: m.agreements <= m.rows,
        ),
    )


class OutputAccuracy(ApiModel):
    """The candidate against the reference on one output."""

    name: str
    """The output's name."""

    max_abs_diff: float = Field(ge=0)
    """Largest absolute difference over every element."""

    mean_abs_diff: float = Field(ge=0)
    """Mean absolute difference over every element."""

    cosine_similarity: float
    """Mean over samples of the per-sample cosine similarity."""

    min_cosine_similarity: float
    """The worst sample's cosine similarity."""

    top1_agreement: float | None = None
    """Share of rows whose argmax over the last axis matches the reference (outputs whose
    last axis has 2 or more classes only)."""

    top1_rows: int | None = Field(default=None, ge=1)
    """Rows compared for `top1Agreement` (every leading position); absent in manifests
    written before it was recorded."""

    top1_by_class: dict[str, ClassAgreement] | None = None
    """Per reference top-1 class (the decimal index of the reference's argmax; a label
    output's value), its rows and agreements; the rows add up to `top1Rows`. Absent where
    `top1Rows` is."""

    gated: bool | None = None
    """Whether the build's gates judged this output (it holds the scores: named with
    --gate-outputs, or chosen by its name); false: compared and reported only. Absent in
    manifests written before outputs were chosen."""


class AccuracyReport(ApiModel):
    """The engine's outputs against the fp32 reference on held-out validation samples."""

    reference: str = "fp32 ONNX model on ONNX Runtime CPU"
    """What the candidate was compared with."""

    validation_source: str
    """Where the validation samples came from: `held-out` (the calibration file's last
    samples, never used to calibrate), `given` (a validation file) or `synthetic` (seeded
    normal inputs, when no data was given)."""

    samples: int = Field(ge=1)
    """Number of validation samples."""

    outputs: list[OutputAccuracy]
    """One entry per model output."""

    @property
    def worst_cosine(self) -> float:
        return min(o.cosine_similarity for o in self.outputs)

    @property
    def worst_top1_drop(self) -> float | None:
        drops = [1.0 - o.top1_agreement for o in self.outputs if o.top1_agreement is not None]
        return max(drops) if drops else None


class BatchingFound(ApiModel):
    """Whether the model batches, as the build found it by a trial run of the built engine
    (one row, and two different rows, compared with the rows run alone:
    `kubeinfer.runtime.engines.batching_probe`)."""

    batches: bool | None = None
    """True: rows run together are answered as alone; false: they are not, and the runtime
    serves the model one request per run (maxBatchSize 1); unset: not found out."""

    reason: str = Field(default="", max_length=1024)
    """How the rows differed, or why it was not found out; empty where it batches."""


KnownAnswerComparison = Literal["relativeError", "equal"]
ProbeSource = Literal["probe-set", "calibration", "validation", "drawn"]


class KnownAnswerTolerance(ApiModel):
    """How one output of the known-answer set is judged, and how far the engine was from
    it on the build node."""

    name: str
    """The output's name."""

    comparison: KnownAnswerComparison
    """relativeError (numbers): a probe's answer is judged by its L2 distance from the
    expected answer over the expected answer's L2 norm; equal (labels, token ids, text):
    by whether it is the expected answer."""

    tolerance: float = Field(ge=0)
    """relativeError: the largest relative error a probe's answer may have; equal: how
    many probes may answer otherwise than expected."""

    build_error: float = Field(ge=0)
    """The engine's own worst error on the probes when it was built (relativeError), or
    how many of its answers differed (equal): what the tolerance was set above."""

    gated: bool
    """Whether the build's accuracy gate judged this output (its tolerance follows from
    the gate)."""


class KnownAnswerSet(ApiModel):
    """The known-answer set recorded beside the engine: the probes' inputs and expected
    outputs in `file` (an .npz, `known_answers.probe_file`), hashed here as the engine
    is, and the tolerance of each output."""

    file: FileName
    """The .npz file in the entry's directory holding the probes and expected outputs."""

    sha256: str = Field(pattern=SHA256_HEX_PATTERN)
    """sha256 of that file: checked before the engine is served, as the engine is."""

    probes: int = Field(ge=1)
    """How many probes (rows) the set holds."""

    source: ProbeSource
    """Where the probes' inputs came from: a probe set given to the build (`--probe-set`),
    the calibration data (its held-out tail for int8), the validation data, or drawn
    within each input's valid range (token ids below the vocabulary, masks of ones,
    images in the model's range)."""

    source_sha256: str | None = Field(default=None, pattern=SHA256_HEX_PATTERN)
    """sha256 of the file the probes came from (probe-set, calibration, validation)."""

    reference: str = "fp32 ONNX model on ONNX Runtime CPU"
    """What gave the expected outputs: the full-precision model on the build node."""

    outputs: list[KnownAnswerTolerance]
    """One entry per model output, in the model's order."""


class EngineManifest(ApiModel):
    """`manifest.json`: written last into the build directory, before it is published."""

    schema_version: int = 1
    digest: str = Field(pattern=DIGEST_PATTERN)
    """`sha256:` + sha256 of the key's canonical JSON."""

    key: EngineKey
    engine_file: str = Field(pattern=r"^[A-Za-z0-9._-]+$")
    """The engine's file name inside the entry's directory."""

    engine_sha256: str = Field(pattern=SHA256_HEX_PATTERN)
    """sha256 of the engine file: checked before the engine is served."""

    engine_bytes: int = Field(ge=0)
    data_files: dict[FileName, Annotated[str, Field(pattern=SHA256_HEX_PATTERN)]] = Field(
        default_factory=dict
    )
    """Files beside the engine file that it reads (an ONNX model's external data), by name
    in the entry's directory, with their sha256: checked before the engine is served, as
    the engine file is."""

    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    created_at: str
    """When the engine was built (UTC, RFC 3339)."""

    builder_versions: dict[str, str]
    """Versions of kubeinfer and every library that shaped the engine."""

    build_seconds: float = Field(ge=0)
    accuracy: AccuracyReport | None = None
    """The engine against the fp32 reference on validation samples."""
    known_answers: KnownAnswerSet | None = None
    """The probes serving checks the engine against before it is ready; absent in
    manifests of builds before they were recorded (layout 1)."""

    @property
    def entry_files(self) -> dict[str, str]:
        """Every file of the entry besides the manifest, by name, with its sha256: the
        engine, its data files and the known-answer file (each checked before serving)."""
        known = (
            {}
            if self.known_answers is None
            else {self.known_answers.file: self.known_answers.sha256}
        )
        return {self.engine_file: self.engine_sha256, **self.data_files, **known}

    batching: BatchingFound | None = None
    """Whether the model batches (absent in manifests written before it was recorded)."""

    def to_json(self) -> str:
        return json.dumps(self.to_wire(), indent=2, sort_keys=True) + "\n"
