"""`gpu_check.py`, the one-command GPU check, on a machine without a GPU: it says there is no
CUDA device and exits 2 without a traceback or installing anything; pytest's junit file is
read into passed / failed (errors included) / skipped-with-reason per test, from a real
pytest run; the verdict passes only when a test passed, none failed, and the benchmark ran
and matched numpy; the table is Markdown with `|` escaped in cells; where the CUDA toolkit
has no `libcuda.so` stub the pycuda link is pointed at the driver's library. The GPU path
itself (building pycuda, the gpu tests, the benchmark) runs only on a CUDA machine.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path
from typing import Any

import gpu_check
import pytest

ROOT = Path(__file__).resolve().parents[2]


def has_cuda_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(has_cuda_driver(), reason="this machine has an NVIDIA driver")
def test_without_a_gpu_it_says_so_and_exits_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests/benchmarks/gpu_check.py"), "--wheels", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "no CUDA GPU" in result.stderr and "libcuda" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


SAMPLE_TESTS = """
import pytest

def test_ok():
    pass

@pytest.mark.parametrize("x", [0.5])
def test_param(x):
    pass

def test_fail():
    assert False

@pytest.fixture
def broken():
    raise RuntimeError("fixture failed")

def test_error(broken):
    pass

def test_skip():
    pytest.skip("needs tensorrt (ModuleNotFoundError: No module named 'tensorrt')")
"""


def test_the_junit_file_gives_each_outcome(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_sample.py").write_text(SAMPLE_TESTS)
    junit = tmp_path / "out.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
        check=False,
    )
    results = gpu_check.read_junit(junit)
    assert results.passed == ["test_sample::test_ok", "test_sample::test_param[0.5]"]
    assert results.failed == ["test_sample::test_fail", "test_sample::test_error"]
    assert results.skipped == [
        (
            "test_sample::test_skip",
            "needs tensorrt (ModuleNotFoundError: No module named 'tensorrt')",
        )
    ]


def bench(ok: bool = True) -> dict[str, Any]:
    """What `gpu_slots.py --json` writes (its keys, with plausible numbers)."""
    return {
        "device": "NVIDIA H100 80GB HBM3",
        "compute": "cupy",
        "batch": 512,
        "features": 4096,
        "layers": 2,
        "correctness": {"max_relative_error": 1e-7 if ok else 0.5, "ok": ok},
        "phases_ms": {"h2d": 0.33, "compute": 0.6, "d2h": 0.32, "ideal_overlap": 2.08},
        "allocations": {
            "batches": 200,
            "pycuda_per_batch": 0,
            "device_per_batch": 0,
            "driver_free_change_bytes": 0,
            "traced_host_peak_bytes": 312,
        },
        "throughput": [
            {"slots": 1, "batches_per_s": 800.0, "rows_per_s": 409600.0, "speedup": 1.0},
            {"slots": 2, "batches_per_s": 1400.0, "rows_per_s": 716800.0, "speedup": 1.75},
        ],
    }


def results(passed: int = 1, failed: int = 0) -> gpu_check.TestResults:
    return gpu_check.TestResults(
        passed=[f"t::ok{i}" for i in range(passed)],
        failed=[f"t::bad{i}" for i in range(failed)],
        skipped=[("t::trt", "needs tensorrt (No module named 'tensorrt')")],
    )


@pytest.mark.parametrize(
    ("tests", "benchmark", "verdict"),
    [
        (results(), bench(), True),
        (results(failed=1), bench(), False),
        (results(passed=0), bench(), False),  # everything skipped proves nothing
        (None, bench(), False),  # pytest did not run
        (results(), bench(ok=False), False),
        (results(), None, False),  # the benchmark crashed
    ],
)
def test_the_verdict(
    tests: gpu_check.TestResults | None, benchmark: dict[str, Any] | None, verdict: bool
) -> None:
    assert gpu_check.summary(["NVIDIA H100"], {}, tests, benchmark)[1] is verdict


def test_the_table_names_each_test_problem_and_each_benchmark_row() -> None:
    rows, _ = gpu_check.summary(
        ["NVIDIA H100 80GB HBM3"], {"pycuda": "built"}, results(failed=1), bench()
    )
    table = gpu_check.markdown(rows)
    lines = table.splitlines()
    assert lines[:2] == ["| check | result |", "|---|---|"]
    assert "| gpu tests | 1 passed, 1 failed, 1 skipped |" in lines
    assert "| failed | t::bad0 |" in lines
    assert "| skipped | t::trt: needs tensorrt (No module named 'tensorrt') |" in lines
    assert "| 2 slot(s), one thread each | 1400.0 batches/s, 716800 rows/s, 1.75x |" in lines
    assert gpu_check.markdown([("a|b", "c")]).endswith("| a\\|b | c |")


def test_the_linker_finds_the_driver_where_the_toolkit_has_no_stub(tmp_path: Path) -> None:
    driver = tmp_path / "driver" / "libcuda.so.1"
    driver.parent.mkdir()
    driver.write_bytes(b"")
    bare, stubbed = tmp_path / "bare", tmp_path / "stubbed"
    (bare / "lib").mkdir(parents=True)
    (stubbed / "lib64" / "stubs").mkdir(parents=True)
    (stubbed / "lib64" / "stubs" / "libcuda.so").write_bytes(b"")

    link = gpu_check.link_folder(bare, tmp_path, driver)
    assert link is not None and (link / "libcuda.so").resolve() == driver
    assert gpu_check.link_folder(stubbed, tmp_path, driver) is None
    assert gpu_check.link_folder(bare, tmp_path / "other", None) is None


PROBE = (
    '========= Program hit CUDA_ERROR_INVALID_VALUE (error 1) due to "invalid argument" on '
    "CUDA API call to cuGetProcAddress_v2.\n"
)
OUT_OF_BOUNDS = "========= Invalid __global__ write of size 4 bytes\n=========     at dense+0x90\n"


def test_memcheck_passes_driver_symbol_probes_and_fails_memory_errors() -> None:
    probes_only = PROBE * 2 + "========= ERROR SUMMARY: 2 errors\n"
    report = gpu_check.sanitizer_report(probes_only)
    assert report is not None and report.clean and report.memory_errors == 0
    assert "cuGetProcAddress_v2 x2" in report.describe()

    # Two processes followed: their summaries add up; the write is a memory error.
    with_write = PROBE + "========= ERROR SUMMARY: 1 error\n" + OUT_OF_BOUNDS
    with_write += "========= ERROR SUMMARY: 1 error\n"
    report = gpu_check.sanitizer_report(with_write)
    assert report is not None and not report.clean and report.memory_errors == 1

    other_api = PROBE.replace("cuGetProcAddress_v2", "cuMemcpyHtoDAsync_v2")
    report = gpu_check.sanitizer_report(other_api + "========= ERROR SUMMARY: 1 error\n")
    assert report is not None and not report.clean

    assert gpu_check.sanitizer_report("no summary: memcheck did not run the program") is None
