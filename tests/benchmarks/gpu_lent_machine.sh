#!/usr/bin/env bash
# The GPU checks on a machine lent to a session (no network; python3 there has PyTorch,
# torchvision, transformers and CuPy): one step per call, as a lease's calls are limited.
#
#   bash tests/benchmarks/gpu_lent_machine.sh setup      # wheels, pycuda, gpu tests, memcheck, smoke
#   bash tests/benchmarks/gpu_lent_machine.sh data-path  # gpu_data_path.py, every row
#   bash tests/benchmarks/gpu_lent_machine.sh all SECONDS # both in one call, no smoke run,
#                                                         # the data path cut at SECONDS
#
# Carry `.whl` (the wheels listed in gpu_check.py's docstring, plus grpcio, protobuf,
# aiohttp's, pydantic-settings', py-spy and perf_analyzer; the Rust data plane's, which
# `kubeinfer serve` answers through: `.venv/bin/maturin build --release -o .whl -m
# runtime/native/crates/python/Cargo.toml`, abi3; a pycuda wheel built by an earlier setup
# spares the build) and `.baseline` (a `git archive` of the runtime the data path is
# compared with, as `.baseline/<commit>`: c80431e's, the last Python data plane, served on
# it; grpcio, protobuf and aiohttp are its). Results go to $OUT.
set -u -o pipefail
export OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export site=/tmp/kubeinfer-site
mkdir -p $site/kubeinfer
for package in runtime contract cli operator cluster; do ln -sfn "$PWD/$package" $site/kubeinfer/$package; done

install_and_check() {
    python3 -m pip install -q --no-index --find-links .whl --upgrade aiohttp==3.14.5 \
        pydantic==2.14.4 pydantic-settings orjson py-spy perf_analyzer grpcio==1.85.3 \
        protobuf==6.33.6 pytools platformdirs mako siphash24 $(ls .whl/pycuda-*.whl 2>/dev/null) \
        $(ls .whl/kubeinfer_dataplane-*.whl 2>/dev/null) \
        2>&1 | tail -5
    python3 -c "import pycuda.driver" 2>/dev/null ||
        GPU_WHEELS=.whl python3 tests/benchmarks/gpu_check.py --save-wheel "$OUT" \
            --no-sanitizer --seconds 0.5 2>&1 | tee "$OUT/gpu-check.log" | tail -60
    python3 -c "import pycuda.driver" || exit 1
    python3 -c "import kubeinfer_dataplane" || echo "no kubeinfer_dataplane: build its wheel (above)"
    export PYTHONPATH=$site
    # The slot tests again under memcheck: a view or copy past a (flat, per-bucket) buffer
    # is an out-of-bounds access there. In this namespace: compute-sanitizer cannot attach
    # to a process in another, where tests/conftest.py would move pytest (as root).
    (cd /tmp && KUBEINFER_TESTS_IN_HOST_NAMESPACE=1 timeout 200 compute-sanitizer \
        --tool memcheck --print-limit 100 --show-backtrace no --launch-timeout 90 \
        python3 -m pytest -m gpu -v -p no:cacheprovider "$OLDPWD/tests/runtime/test_engines_cuda.py" \
        "$OLDPWD/tests/runtime/test_gpu_fixes.py" 2>&1 | tee "$OUT/memcheck.log" | tail -15) || true
}

# Every row, into $OUT, against the first runtime in .baseline (extra arguments go to
# gpu_data_path.py).
data_path() {
    export PYTHONPATH=$site
    local baseline
    baseline=$(ls -d .baseline/*/ 2>/dev/null | head -1)
    python3 tests/benchmarks/gpu_data_path.py --json "$OUT/gpu-data-path.json" \
        --profile "$OUT/profile.txt" ${baseline:+--baseline "$baseline"} "$@" \
        2>&1 | tee "$OUT/gpu-data-path.log" | tail -60
}

case "${1:-}" in
setup)
    install_and_check || exit 1
    timeout 200 python3 tests/benchmarks/gpu_data_path.py --quick --window 1 --warmup 1 \
        2>&1 | tee "$OUT/smoke.log" | tail -25
    ;;
data-path)
    data_path
    ;;
all)
    # One call where the lease is short: a second start costs more than the smoke run saves.
    deadline=$((SECONDS + ${2:-540}))
    install_and_check || exit 1
    timeout $((deadline - SECONDS)) bash -c "$(declare -f data_path); data_path --window 1 --warmup 1"
    ;;
*)
    echo "usage: $0 setup|data-path|all [SECONDS]" >&2
    exit 2
    ;;
esac
