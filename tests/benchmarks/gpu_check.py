"""One command that checks kubeinfer's GPU code on a CUDA machine: it builds pycuda where it
is missing, runs every `gpu` test, runs the CUDA slot benchmark, and prints one table.

    make gpu-check                          # = python3 tests/benchmarks/gpu_check.py

Steps, each skipped when already done: (1) ask the CUDA driver for a device (libcuda by
ctypes; none: say so and exit 2, nothing installed); (2) make `kubeinfer` importable (an
installed copy, else this checkout through a PYTHONPATH folder of links) and install the
Python packages the gpu tests import that are missing (`REQUIRED`); (3) install pycuda:
a ready wheel from the wheel folder if one fits, else build it from its sdist against the
CUDA toolkit (nvcc on PATH, CUDA_ROOT, or /usr/local/cuda; pycuda's `configure.py` is
given the toolkit and turns off cuRAND where the toolkit has no libcurand), and if that
fails, say why and go on (the tests that need pycuda then skip, naming it); (4) run
`pytest -m gpu` over every test file with a `gpu` test, then again under
`compute-sanitizer --tool memcheck` where the toolkit has it; (5) run `gpu_slots.py`;
(6) print the table. The exit status is 0 only if no test failed and the benchmark ran and matched
numpy. Skipped tests are listed with what they need (TensorRT, where it is not installed).

Without network, give a folder of wheels and sdists: `GPU_WHEELS=.whl` (or `--wheels`);
pip then installs with `--no-index --find-links` from it. `--save-wheel DIR` keeps the
pycuda wheel it built, which a later run on the same image can take from the folder.

On the GPU machine lent to sessions (Python 3.12 at /opt/torch/.venv with PyTorch, CuPy,
nvidia-ml-py, ONNX Runtime, pytest; CUDA 13's nvcc; no TensorRT; no network): fill `.whl/`
(git-ignored) here, from the repository root, with pycuda's sdist and the cp312 wheels of
what the image lacks (pycuda needs pytools, platformdirs and mako; pytools needs siphash24;
kubeinfer's runtime needs pydantic and orjson):

    rm -rf .whl && mkdir .whl
    .venv/bin/pip download --no-deps --no-build-isolation -d .whl 'pycuda>=2025.1.2'
    .venv/bin/pip download --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl pydantic orjson pytools mako platformdirs

Then call the device tool's `run` with carry [".whl"] and the command

    GPU_WHEELS=.whl python3 tests/benchmarks/gpu_check.py --save-wheel $OUT

(expect minutes, most of them compiling pycuda; the wheel it built comes back under $OUT
and, put in .whl, spares the next run the build). On a GPU node with network nothing needs
preparing: `make gpu-check`.

Ran on an H100 lent to a session (CUDA 13.0, driver 580, Python 3.12, no TensorRT, no
network), as above: it built pycuda 2026.1 from the sdist in about two minutes and passed
(docs/gpu-check.md has its table). memcheck there reports 34 failed
`cuGetProcAddress_v2` calls: cuda-python, imported for CUDA Graphs, asks the driver for
entry points this driver does not have; they touch no memory, and the check tells them
apart from memory errors and from any other failed API call, which fail it. What ran on a
CPU: the exit without a device, the junit, table, memcheck-report and link-folder code
(`tests/benchmarks/test_gpu_check.py`), and, once by hand, `install_pycuda` against the
CUDA 13.0 headers of a CPU machine with an empty libcuda.so.1 standing in for the driver:
pycuda 2026.1 and 2025.1.2 configured, compiled, linked, were saved as a wheel and
installed offline with their dependencies from a wheel folder (about a minute on 2 cores);
pycuda 2025.1.1 does not compile against CUDA 13 (`cuCtxCreate_v4` takes new arguments),
hence the pin.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GPU_MARK = re.compile(r"^\s*(@pytest\.mark\.gpu\b|pytestmark\b.*\bpytest\.mark\.gpu\b)", re.M)
PYCUDA = "pycuda>=2025.1.2"
# Modules the gpu tests and the benchmark import, and the distribution that provides each.
REQUIRED = {
    "numpy": "numpy",
    "pydantic": "pydantic",
    "orjson": "orjson",
    "yaml": "pyyaml",
    "onnx": "onnx",
    "onnxruntime": "onnxruntime",
    "prometheus_client": "prometheus-client",
    "aiohttp": "aiohttp",
    "pytest": "pytest",
}


class CheckFailed(Exception):
    """A step could not be done; the message says what to do."""


# ----------------------------------------------------------------------------- the device


def cuda_devices() -> list[str]:
    """The names of the devices the CUDA driver sees; `CheckFailed` without any."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise CheckFailed(f"no NVIDIA driver here ({error})") from error
    status = driver.cuInit(0)
    count = ctypes.c_int(0)
    if status != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or not count.value:
        raise CheckFailed(f"the NVIDIA driver sees no CUDA device (cuInit returned {status})")
    names = []
    for ordinal in range(count.value):
        device, name = ctypes.c_int(0), ctypes.create_string_buffer(256)
        driver.cuDeviceGet(ctypes.byref(device), ordinal)
        driver.cuDeviceGetName(name, len(name), device)
        names.append(name.value.decode(errors="replace"))
    return names


# ----------------------------------------------------------------------------- packages


@dataclass
class Environment:
    """The Python that runs the tests, and how pip and the children reach packages.

    Children run in `cwd`, a scratch folder, never in the checkout: `python -m` and `-c`
    put the working directory first on sys.path, where the checkout's `operator/` folder
    would shadow the standard library's `operator` module."""

    python: str
    wheels: Path | None
    cwd: Path
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    def run(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        kwargs.setdefault("cwd", self.cwd)
        return subprocess.run(
            args, env=self.env, text=True, capture_output=True, check=False, **kwargs
        )

    def missing(self, modules: Sequence[str]) -> list[str]:
        code = (
            "import importlib, sys\n"
            "for m in sys.argv[1:]:\n"
            "    try: importlib.import_module(m)\n"
            "    except Exception: print(m)\n"
        )
        return self.run(self.python, "-c", code, *modules).stdout.split()

    def index(self) -> list[str]:
        """pip's arguments for where packages come from: the folder only, when given."""
        return ["--no-index", "--find-links", str(self.wheels)] if self.wheels else []

    def pip_install(self, *args: str) -> None:
        result = self.run(self.python, "-m", "pip", "install", "-q", *self.index(), *args)
        if result.returncode:
            raise CheckFailed(f"pip install {' '.join(args)} failed:\n{tail(result)}")


def tail(result: subprocess.CompletedProcess[str], lines: int = 40) -> str:
    return "\n".join((result.stdout + result.stderr).splitlines()[-lines:])


def make_kubeinfer_importable(environment: Environment, scratch: Path) -> str:
    """An installed kubeinfer is used as it is; else this checkout, through a folder of
    links on PYTHONPATH (`kubeinfer/operator` and `kubeinfer/runtime`, the layout that
    pyproject's package-dir maps), so nothing is built or installed for it."""
    if not environment.missing(["kubeinfer.runtime"]):
        return "installed"
    package = scratch / "site" / "kubeinfer"
    package.mkdir(parents=True)
    for folder in ("operator", "runtime", "contract", "cli", "cluster"):
        (package / folder).symlink_to(ROOT / folder, target_is_directory=True)
    paths = [str(package.parent), environment.env.get("PYTHONPATH", "")]
    environment.env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    # The gpu tests need only loopback, and compute-sanitizer cannot attach to a process in
    # the network namespace tests/conftest.py would otherwise move them into (as root).
    environment.env["KUBEINFER_TESTS_IN_HOST_NAMESPACE"] = "1"
    return f"this checkout (PYTHONPATH={package.parent})"


def cuda_root() -> Path | None:
    """The CUDA toolkit to build against: CUDA_ROOT, nvcc's parent on PATH, or the usual."""
    candidates = [os.environ.get("CUDA_ROOT"), os.environ.get("CUDA_HOME")]
    nvcc = shutil.which("nvcc")
    candidates += [str(Path(nvcc).resolve().parents[1]) if nvcc else None, "/usr/local/cuda"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "include" / "cuda.h").is_file():
            return Path(candidate)
    return None


def driver_library() -> Path | None:
    """The file of the driver's libcuda.so.1, as this process loaded it (/proc/self/maps)."""
    try:
        ctypes.CDLL("libcuda.so.1")
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    paths = (line.split(maxsplit=5)[-1] for line in maps if "libcuda.so" in line)
    return next((Path(path) for path in paths if path.startswith("/")), None)


def link_folder(root: Path, scratch: Path, driver: Path | None) -> Path | None:
    """A folder with `libcuda.so` for the linker's `-lcuda`, where the toolkit has none:
    a toolkit assembled from pip wheels ships no driver stub (seen on our CPU machines), so
    the link points at the driver's own library. None where the toolkit has one."""
    folders = ("lib", "lib64", "lib/stubs", "lib64/stubs")
    if any((root / folder / "libcuda.so").exists() for folder in folders) or driver is None:
        return None
    folder = scratch / "link"
    folder.mkdir(exist_ok=True)
    (folder / "libcuda.so").symlink_to(driver)
    return folder


def install_pycuda(
    environment: Environment,
    scratch: Path,
    save_wheel: Path | None,
    driver: Path | None = None,
) -> str:
    """pycuda from a fitting wheel in the wheel folder, else built from its sdist."""
    if environment.wheels is not None:
        try:
            environment.pip_install("--only-binary", "pycuda", PYCUDA)
            return f"installed from a wheel in {environment.wheels}"
        except CheckFailed:
            pass  # no wheel for this Python: build one
    root = cuda_root()
    if root is None:
        raise CheckFailed(
            "pycuda is not installed and no CUDA toolkit was found to build it: install the "
            "toolkit (nvcc, cuda.h) and set CUDA_ROOT, or put a pycuda wheel in the wheel folder"
        )
    sdist = find_sdist(environment, scratch)
    with tarfile.open(sdist) as archive:
        archive.extractall(scratch / "src", filter="data")
    [source] = (scratch / "src").iterdir()
    environment.env["CUDA_ROOT"] = str(root)
    environment.env["PATH"] = f"{root / 'bin'}{os.pathsep}{environment.env.get('PATH', '')}"
    link = link_folder(root, scratch, driver or driver_library())
    if link is not None:  # gcc searches LIBRARY_PATH for -l at link time
        paths = [str(link), environment.env.get("LIBRARY_PATH", "")]
        environment.env["LIBRARY_PATH"] = os.pathsep.join(p for p in paths if p)
    configure = [environment.python, "configure.py", f"--cuda-root={root}"]
    if not any(root.glob("lib*/libcurand.so*")) and not any(root.glob("lib*/*/libcurand.so*")):
        configure.append("--no-cuda-enable-curand")
    result = environment.run(*configure, cwd=source)
    if result.returncode:
        raise CheckFailed(f"pycuda's configure.py failed:\n{tail(result)}")
    built = scratch / "built"
    print(f"Building pycuda from {sdist.name} against {root} (a few minutes)", flush=True)
    result = environment.run(
        environment.python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
        *environment.index(), "-w", str(built), str(source),
    )  # fmt: skip
    if result.returncode:
        raise CheckFailed(f"building pycuda failed:\n{tail(result)}")
    [wheel] = built.glob("pycuda-*.whl")
    if save_wheel is not None:
        save_wheel.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, save_wheel)
    environment.pip_install("--find-links", str(built), PYCUDA)
    return f"built from {sdist.name} against {root}"


def find_sdist(environment: Environment, scratch: Path) -> Path:
    if environment.wheels is not None:
        sdists = sorted(environment.wheels.glob("pycuda-*.tar.gz"))
        if not sdists:
            raise CheckFailed(f"no pycuda sdist (pycuda-*.tar.gz) in {environment.wheels}")
        return sdists[-1]
    download = scratch / "download"
    result = environment.run(
        environment.python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
        "pycuda", "--no-build-isolation", "-d", str(download), PYCUDA,
    )  # fmt: skip
    if result.returncode:
        raise CheckFailed(f"downloading pycuda failed:\n{tail(result)}")
    [sdist] = download.glob("pycuda-*.tar.gz")
    return sdist


# ----------------------------------------------------------------------------- results


@dataclass
class TestResults:
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (test, reason)


def read_junit(path: Path) -> TestResults:
    """Outcomes per test from pytest's --junitxml file (errors count as failures)."""
    results = TestResults()
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").removeprefix("tests.")
        test = f"{module}::{case.get('name', '')}" if module else case.get("name", "")
        outcome = {child.tag: child for child in case}
        if "failure" in outcome or "error" in outcome:
            results.failed.append(test)
        elif "skipped" in outcome:
            results.skipped.append((test, outcome["skipped"].get("message", "")))
        else:
            results.passed.append(test)
    return results


def summary(
    devices: Sequence[str],
    steps: dict[str, str],
    tests: TestResults | None,
    bench: dict[str, Any] | None,
    memcheck: SanitizerReport | None = None,
) -> tuple[list[tuple[str, str]], bool]:
    """The table's rows and whether the check passed: a test ran and none failed, and the
    benchmark ran and matched numpy."""
    rows = [("device", ", ".join(devices)), *steps.items()]
    ok = tests is not None and bool(tests.passed) and not tests.failed
    if memcheck is not None:
        rows.append(("compute-sanitizer memcheck over the gpu tests", memcheck.describe()))
        ok = ok and memcheck.clean
    if tests is None:
        rows.append(("gpu tests", "did not run"))
    else:
        counts = f"{len(tests.passed)} passed, {len(tests.failed)} failed"
        rows.append(("gpu tests", f"{counts}, {len(tests.skipped)} skipped"))
        rows += [("failed", test) for test in tests.failed]
        rows += [("skipped", f"{test}: {reason}") for test, reason in tests.skipped]
    if bench is None:
        rows.append(("slot benchmark", "failed: see its output above"))
        return rows, False
    correct = bench["correctness"]
    ok = ok and bool(correct["ok"])
    phases, allocations = bench["phases_ms"], bench["allocations"]
    rows += [
        (
            "slot benchmark",
            f"{bench['device']}, {bench['compute']}, batch {bench['batch']} x "
            f"{bench['features']} fp32, {bench['layers']} layer(s)",
        ),
        (
            "correctness vs numpy",
            f"max relative error {correct['max_relative_error']:.1e} "
            f"({'ok' if correct['ok'] else 'MISMATCH'})",
        ),
        (
            "phases on one slot (ms)",
            f"H2D {phases['h2d']:.3f}, compute {phases['compute']:.3f}, D2H {phases['d2h']:.3f}"
            f"; ideal overlap {phases['ideal_overlap']:.2f}x",
        ),
        (
            "allocations per batch",
            f"pycuda {allocations['pycuda_per_batch']:g}, compute library "
            f"{allocations['device_per_batch']:g}, driver free memory change "
            f"{allocations['driver_free_change_bytes']} B, host peak "
            f"{allocations['traced_host_peak_bytes']} B",
        ),
    ]
    for row in bench["throughput"]:
        rows.append(
            (
                f"{row['slots']} slot(s), one thread each",
                f"{row['batches_per_s']:.1f} batches/s, {row['rows_per_s']:.0f} rows/s, "
                f"{row['speedup']:.2f}x",
            )
        )
    return rows, ok


def sanitizer_path() -> str | None:
    """compute-sanitizer on PATH, else the toolkit's copy."""
    found = shutil.which("compute-sanitizer")
    root = cuda_root()
    if found is None and root is not None and (root / "bin" / "compute-sanitizer").is_file():
        found = str(root / "bin" / "compute-sanitizer")
    return found


SANITIZER_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")
SANITIZER_API_ERROR = re.compile(r"Program hit \S+ \(error \d+\).* on CUDA API call to (\w+)")
# cuda-python (cuda.bindings, which CUDA Graphs use) asks the driver at import for every
# entry point it knows; a driver older than the bindings answers CUDA_ERROR_INVALID_VALUE
# for the ones it lacks. memcheck counts those refusals as errors; they touch no memory.
DRIVER_PROBES = frozenset({"cuGetProcAddress", "cuGetProcAddress_v2"})


@dataclass
class SanitizerReport:
    """What memcheck reported over every process it followed: its error total, and the
    failed CUDA API calls among them by function (the rest are memory errors)."""

    errors: int
    api_errors: dict[str, int]

    @property
    def memory_errors(self) -> int:
        return self.errors - sum(self.api_errors.values())

    @property
    def clean(self) -> bool:
        return self.memory_errors == 0 and set(self.api_errors) <= DRIVER_PROBES

    def describe(self) -> str:
        calls = ", ".join(f"{call} x{count}" for call, count in sorted(self.api_errors.items()))
        probes = " (cuda-python's driver-symbol probes)" if self.api_errors and self.clean else ""
        return f"{self.memory_errors} memory errors; failed API calls: {calls or 'none'}{probes}"


def sanitizer_report(output: str) -> SanitizerReport | None:
    """memcheck's report from its output; None where it printed no summary (it did not get
    to run the program). Run with a print limit above the error count, so every error's
    line is there to be read."""
    counts = [int(count) for count in SANITIZER_SUMMARY.findall(output)]
    if not counts:
        return None
    api: dict[str, int] = {}
    for call in SANITIZER_API_ERROR.findall(output):
        api[call] = api.get(call, 0) + 1
    return SanitizerReport(sum(counts), api)


def markdown(rows: Sequence[tuple[str, str]]) -> str:
    cells = [(a.replace("|", "\\|"), b.replace("|", "\\|")) for a, b in rows]
    return "\n".join(["| check | result |", "|---|---|", *(f"| {a} | {b} |" for a, b in cells)])


def gpu_test_files() -> list[str]:
    """Every test file with a `gpu` test: collecting only those keeps the check free of
    the operator's and the HTTP tests' dependencies."""
    files = sorted(
        path
        for path in (ROOT / "tests").rglob("test_*.py")
        if GPU_MARK.search(path.read_text(encoding="utf-8"))
    )
    return [str(path) for path in files]


# ----------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--wheels",
        type=Path,
        default=Path(os.environ["GPU_WHEELS"]) if os.environ.get("GPU_WHEELS") else None,
        help="install from this folder of wheels and sdists only (default: $GPU_WHEELS)",
    )
    parser.add_argument("--save-wheel", type=Path, help="copy the pycuda wheel built here")
    parser.add_argument("--seconds", type=float, default=2.0, help="per benchmark row")
    parser.add_argument(
        "--no-sanitizer", action="store_true", help="skip the compute-sanitizer memcheck pass"
    )
    args = parser.parse_args(argv)
    try:
        devices = cuda_devices()
    except CheckFailed as error:
        print(f"gpu-check: no CUDA GPU: {error}. Run it on a GPU node.", file=sys.stderr)
        return 2
    wheels = args.wheels.resolve() if args.wheels else None
    save_wheel = args.save_wheel.resolve() if args.save_wheel else None
    steps: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch_name:
        scratch = Path(scratch_name)
        environment = Environment(sys.executable, wheels, scratch)
        try:
            steps["kubeinfer"] = make_kubeinfer_importable(environment, scratch)
            missing = environment.missing(list(REQUIRED))
            if missing:
                environment.pip_install(*(REQUIRED[module] for module in missing))
                steps["installed"] = ", ".join(REQUIRED[module] for module in missing)
        except CheckFailed as error:  # nothing could be imported: no test can run
            print(f"gpu-check: {error}", file=sys.stderr)
            return 1
        steps["pycuda"] = "already installed"
        if environment.missing(["pycuda.driver"]):
            try:
                steps["pycuda"] = install_pycuda(environment, scratch, save_wheel)
            except CheckFailed as error:  # the tests that need it skip; the rest still run
                print(f"gpu-check: {error}", file=sys.stderr)
                steps["pycuda"] = f"not installed: {str(error).splitlines()[0]}"
        junit = scratch / "gpu-tests.xml"
        command = [environment.python, "-m", "pytest", "-m", "gpu", "-rs", "-p"]
        command += ["no:cacheprovider", f"--junitxml={junit}", *gpu_test_files()]
        print("\n$ " + " ".join(command[1:]), flush=True)
        subprocess.run(command, cwd=scratch, env=environment.env, check=False)
        tests = read_junit(junit) if junit.is_file() else None
        memcheck = None
        sanitizer = sanitizer_path() if not args.no_sanitizer else None
        if sanitizer is not None:
            # The same tests again under memcheck: an out-of-bounds copy into a slot's
            # buffers, or a read of freed pinned memory, fails nothing by itself.
            command = [sanitizer, "--tool", "memcheck", "--target-processes", "all"]
            command += ["--print-limit", "100000", "--show-backtrace", "no"]
            command += [environment.python, "-m", "pytest", "-m", "gpu", "-q", "-p"]
            command += ["no:cacheprovider", *gpu_test_files()]
            print("\n$ " + " ".join(command), flush=True)
            result = environment.run(*command)
            output = result.stdout + result.stderr
            reports = sorted({line for line in output.splitlines() if "Program hit" in line})
            print("\n".join([*reports[:20], tail(result, 3)]), flush=True)
            memcheck = sanitizer_report(output)
            if memcheck is None:
                steps["compute-sanitizer"] = "printed no error summary: see its output above"
        else:
            steps["compute-sanitizer"] = "not run (--no-sanitizer, or not found)"
        target = environment.run(
            environment.python,
            "-c",
            "from kubeinfer.runtime.building.builders.tensorrt_builder import TensorRTBuilder\n"
            "print(TensorRTBuilder().target())",
        )
        steps["engine target (engine key)"] = (
            target.stdout.strip() if not target.returncode else f"failed: {tail(target, 3)}"
        )
        bench_json = scratch / "gpu-slots.json"
        compute = "cupy" if not environment.missing(["cupy"]) else "copy"
        command = [environment.python, str(ROOT / "tests/benchmarks/gpu_slots.py")]
        command += ["--compute", compute, "--seconds", str(args.seconds), "--json", str(bench_json)]
        print("\n$ " + " ".join(command[1:]), flush=True)
        subprocess.run(command, cwd=scratch, env=environment.env, check=False)
        bench = json.loads(bench_json.read_text()) if bench_json.is_file() else None
    rows, ok = summary(devices, steps, tests, bench, memcheck)
    print("\n## GPU check\n\n" + markdown([*rows, ("verdict", "PASS" if ok else "FAIL")]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
