"""Suite-wide set-up: the `gpu` and `cluster` markers skip unless what they need exists.

- `gpu`: needs a CUDA device, found through the driver library itself (libcuda, by ctypes,
  so no Python package is needed to tell). Its arguments name the modules the test also
  needs importable: `@pytest.mark.gpu("pycuda.driver")` for the CUDA slots,
  `@pytest.mark.gpu("tensorrt", "pycuda.driver")` for TensorRT, `("pynvml",)` for NVML.
  A GPU machine without TensorRT (ours) then skips the TensorRT tests, naming what is
  missing, instead of failing them.
- `cluster`: runs against the real cluster that KUBECONFIG points at.

Each test process (each xdist worker) first moves into a network namespace of its own
(`netns.enter_new_namespace`), before any thread or socket exists: the session's cluster
runs in it, so tests reach pods, Services and the API server as a process on the node
does, and nothing a test does reaches the host's namespace but what it asks of the host
through `netns.host_namespace()` (a descriptor of the namespace the process left).
`KUBEINFER_TESTS_IN_HOST_NAMESPACE=1` keeps them where they start, for runs that need only
loopback and cannot cross namespaces: the GPU check's tests under compute-sanitizer,
which cannot attach to a process in another network namespace (`gpu_check.py` sets it).

Every process the tests start runs with the package registries switched off
(`registry_prefetch.OFFLINE_ENVIRONMENT`: GOPROXY=off, npm offline, PIP_NO_INDEX, ...):
what a test needs from a registry, `make test` fetched before pytest started.

At the end of the session, failed tests included, no process a test started under the
session's temporary directory may still run (`no_process_left_behind`).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
from collections.abc import Callable, Iterable
from functools import cache

import pytest

CUDA_SUCCESS = 0


STAY_IN_HOST_NAMESPACE = "KUBEINFER_TESTS_IN_HOST_NAMESPACE"


def pytest_configure(config: pytest.Config) -> None:
    from kubeinfer.cluster import netns
    from registry_prefetch import OFFLINE_ENVIRONMENT

    # No test reaches a package registry: what tests need from one, `make test` fetched
    # first (`registry_prefetch`); a test that would download fails everywhere, saying so.
    os.environ.update(OFFLINE_ENVIRONMENT)
    if os.environ.get(STAY_IN_HOST_NAMESPACE) == "1":
        return
    if os.geteuid() == 0 and netns.host_namespace() is None:
        netns.enter_new_namespace()


@cache
def cuda_problem() -> str | None:
    """None where the CUDA driver sees a device, else why not (asked of libcuda directly:
    the same answer pycuda, CuPy and TensorRT would get)."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        return f"no NVIDIA driver ({error})"
    status = driver.cuInit(0)
    if status != CUDA_SUCCESS:
        return f"cuInit failed with CUDA error {status}"
    count = ctypes.c_int(0)
    status = driver.cuDeviceGetCount(ctypes.byref(count))
    if status != CUDA_SUCCESS or count.value == 0:
        return "the driver sees no CUDA device"
    return None


@cache
def import_problem(module: str) -> str | None:
    """None if `module` imports, else the error (a module built for another CUDA raises
    more than ImportError, hence the broad catch)."""
    try:
        importlib.import_module(module)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


def gpu_skip_reason(
    needs: Iterable[str],
    cuda: Callable[[], str | None] = cuda_problem,
    importable: Callable[[str], str | None] = import_problem,
) -> str | None:
    """Why a `gpu` test cannot run here, or None: the device first, then each module."""
    problem = cuda()
    if problem is not None:
        return f"needs a CUDA GPU: {problem}"
    for module in needs:
        problem = importable(module)
        if problem is not None:
            return f"needs {module} ({problem})"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_cluster = pytest.mark.skip(reason="needs a real cluster: set KUBECONFIG")
    for item in items:
        markers = list(item.iter_markers("gpu"))
        if markers:
            reason = gpu_skip_reason(module for marker in markers for module in marker.args)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
        # The marker, not the keyword: every test under tests/cluster/ has the keyword.
        if item.get_closest_marker("cluster") and not os.environ.get("KUBECONFIG"):
            item.add_marker(no_cluster)


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The session's real control plane and node (see `cluster_harness`), started on first
    use; building its binaries first if the cache has none (minutes, once per machine)."""
    from cluster_harness import start_local_cluster

    yield from start_local_cluster(tmp_path_factory.mktemp("cluster"))


@pytest.fixture(scope="session")
def model_directory():  # type: ignore[no-untyped-def]
    """A directory for model files that pods can read at the same path: under /var/tmp,
    since every pod mounts its own emptyDir at /tmp."""
    import shutil
    import tempfile
    from pathlib import Path

    directory = Path(tempfile.mkdtemp(prefix="kubeinfer-tests-", dir="/var/tmp"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """After the session (each xdist worker's own), failed tests included: a process
    started under the session's temporary directory (its command line names it, or it runs
    in it) that is still running is killed, and the session fails naming it. Set up before,
    so torn down after, every other session fixture."""
    from processes_left import pids_left

    yield
    left = pids_left(tmp_path_factory.getbasetemp())
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if left:
        lines = "\n".join(f"{pid}: {command[:200]}" for pid, command in left.items())
        pytest.fail(f"processes left running after the tests (now killed):\n{lines}")
