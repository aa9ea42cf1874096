"""What ONNX Runtime's CPU engine needs beyond fixed-size numeric tensors: string
tensors, the onnxruntime-extensions operator library, and the messages for what no v2
datatype can carry.

Strings: an ONNX `tensor(string)` is the Open Inference Protocol's BYTES, in the data
plane an object array of `bytes`. ONNX Runtime's Python binding reads and writes string
tensors as `str` (it would read a `bytes` element as its repr, "b'...'"), so inputs are
decoded from UTF-8 on the way in (`str_inputs`; the data plane refuses a BYTES input that
is not UTF-8 before it is queued) and outputs encoded back on the way out
(`bytes_outputs`). ONNX Runtime's IO binding takes no string tensor, so a slot of a model
with one runs `InferenceSession.run` on its buffers instead (`run_unbound`).

onnxruntime-extensions (the optional extra `kubeinfer[extensions]`) adds operators such
as tokenizers, string and image operators in the `ai.onnx.contrib` domain, so that pre-
and post-processing run inside the served graph. A serving session registers its
library only once ONNX Runtime has refused the graph for an operator of that domain
(`open_session`): the library imports `onnx`, a sizeable share of `kubeinfer serve`'s
start, and most models use none of its operators. A model that needs it where it is
missing is refused with the install command (`load_hint`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnxruntime as ort

STRING_TYPE = "tensor(string)"
EXTENSIONS_DOMAIN = "ai.onnx.contrib"
EXTENSIONS_INSTALL = "pip install 'kubeinfer[extensions]'"


def register_extensions(options: ort.SessionOptions) -> bool:
    """Registers onnxruntime-extensions' operators with `options` when the library is
    installed; returns whether it was."""
    try:
        from onnxruntime_extensions import get_library_path
    except ImportError:
        return False
    options.register_custom_ops_library(get_library_path())
    return True


def open_session(
    path: str, options: ort.SessionOptions, providers: Sequence[str]
) -> ort.InferenceSession:
    """ONNX Runtime's session of the model at `path`; a graph refused for an operator of
    the extensions' domain (ONNX Runtime names it in its error) is loaded again with the
    library registered, when it is installed. Other errors, and that one where it is not,
    are ONNX Runtime's own."""
    try:
        return ort.InferenceSession(path, options, providers=list(providers))
    except Exception as error:  # ONNX Runtime raises its own exception types
        if EXTENSIONS_DOMAIN not in str(error) or not register_extensions(options):
            raise
    return ort.InferenceSession(path, options, providers=list(providers))


def load_hint(error: str) -> str:
    """A remedy to add to ONNX Runtime's load error where one is known, else empty: an
    onnxruntime-extensions operator while the library is not installed, or a text
    operator's locale (skl2onnx's tokenizer asks for en_US.UTF-8 by default) that this
    system does not have."""
    if "Failed to construct locale" in error:
        return (
            "; the model's text operators ask for a locale this system lacks: export it "
            "with one every system has, e.g. skl2onnx's options={id(vectorizer): "
            "{'locale': 'C'}}"
        )
    if EXTENSIONS_DOMAIN not in error:
        return ""
    try:
        import onnxruntime_extensions  # noqa: F401
    except ImportError:
        return (
            f"; the model uses onnxruntime-extensions operators ({EXTENSIONS_DOMAIN}), "
            f"which are not installed here: {EXTENSIONS_INSTALL}"
        )
    return ""


def non_tensor_message(kind: str, name: str, ort_type: str) -> str | None:
    """The refusal of an input or output that is not a tensor (a sequence or a map),
    naming the fix where one is known; None for a tensor type."""
    if not ort_type.startswith(("seq(", "map(", "optional(")):
        return None
    message = (
        f"{kind} {name!r} has type {ort_type}, which is not a tensor: the Open Inference "
        "Protocol carries tensors only"
    )
    if ort_type.startswith("seq(map("):
        message += (
            " (a ZipMap output, which skl2onnx adds to classifiers by default: export "
            "without it, e.g. to_onnx(clf, X, options={id(clf): {'zipmap': False}}), or "
            "convert_sklearn(..., options={type(clf): {'zipmap': False}}), and the "
            "probabilities come out as a [batch, classes] tensor)"
        )
    return message


def empty_strings(shape: tuple[int, ...]) -> np.ndarray:
    """A buffer for a string tensor: an object array of empty `bytes`."""
    return np.full(shape, b"", dtype=object)


def bytes_outputs(array: np.ndarray) -> np.ndarray:
    """An output of ONNX Runtime as the data plane holds it: a string tensor's `str`
    elements encoded to UTF-8 `bytes`; any other array unchanged."""
    if array.dtype.kind not in "OU":
        return array
    encoded = np.empty(array.shape, dtype=object)
    flat = encoded.reshape(-1)
    for index, element in enumerate(array.reshape(-1)):
        flat[index] = element.encode("utf-8") if isinstance(element, str) else bytes(element)
    return encoded


def str_inputs(array: np.ndarray) -> np.ndarray:
    """An input as ONNX Runtime reads it: a BYTES tensor's elements decoded from UTF-8
    to `str`; any other array unchanged."""
    if array.dtype.kind != "O":
        return array
    decoded = np.empty(array.shape, dtype=object)
    flat = decoded.reshape(-1)
    for index, element in enumerate(array.reshape(-1)):
        flat[index] = element.decode("utf-8") if isinstance(element, bytes) else element
    return decoded


def run_unbound(
    session: ort.InferenceSession,
    output_names: Sequence[str],
    feed: Mapping[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """One run without IO binding (a model with string tensors): the outputs by name,
    strings as bytes."""
    inputs = {name: str_inputs(array) for name, array in feed.items()}
    results = session.run(list(output_names), inputs)
    return {
        name: bytes_outputs(np.asarray(r)) for name, r in zip(output_names, results, strict=True)
    }
