"""Builds an int8 engine as a builder that trusted its CPU's u8 x s8 kernels would: full
8-bit weights (ONNX Runtime's `quantize_static` with `reduce_range` off; kubeinfer's own
builder keeps them to 7 bits so that no x86 kernel saturates, onnxruntime_builder). Such an
engine is exact where those kernels do not saturate (VNNI, or SSE4 only) and answers
otherwise on AVX2 without VNNI: what the known-answer check at start must catch.

    python full_range_int8_build.py MODEL CALIBRATION CACHE   # prints the engine's digest
"""

from __future__ import annotations

import sys
from typing import Any

import onnxruntime.quantization as quantization
from kubeinfer.runtime.building.engine_build import build_engine


def main() -> int:
    model, calibration, cache = sys.argv[1:4]
    original = quantization.quantize_static

    def full_range(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**kwargs, "reduce_range": False})

    quantization.quantize_static = full_range  # the builder imports it when it runs
    built = build_engine(model, "onnxruntime", "int8", cache, calibration=calibration,
                         max_batch_size=16)  # fmt: skip
    print(built.digest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
