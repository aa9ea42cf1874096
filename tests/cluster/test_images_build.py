"""The images a user installs, built as `make images` builds them (`python -m
kubeinfer.cluster.images`) from a clean clone of the checkout's HEAD, with podman and runc,
on the Debian base, and run as a kubelet would run them.

Covers: the archives named by reference and image ID, each a valid OCI layout (every blob
its digest) naming its reference; a second call returning them without podman; the
entry points (`kubeinfer --help`, `operator --help`, `crds`, `validate` of a packaged
example, `serve --help`); uid and gid 65532; a read-only root filesystem (no tmpfs
either) with every capability dropped and no network but loopback or none; no pip,
setuptools, wheel, compiler, cargo or rustc; the runtime's s3:// and gs:// file systems;
an inference over HTTP and over gRPC by the runtime image serving a model mounted
read-only on its Rust data plane (the extension kubeinfer_dataplane the Dockerfile builds
from runtime/native), equal to ONNX Runtime's answer here, and SIGTERM answered with exit
status 0 while a client sends requests (drain semantics themselves: tests/runtime's
SIGTERM tests); a one-line source change rebuilding the project's layer only (not the
Rust extension's); an image of
one static Go binary (`ensure_binary_image`) run as 65532 or as root. The host's links,
addresses, routes and firewall rules are the same after all of it.

About three minutes with the Debian base and the dependencies' layers cached; a cold
machine adds the base (mmdebstrap, about two minutes) and those layers (about two).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import host_network
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton_grpc
from kubeinfer.cli.demo.mlp_models import build_tiny_mlp
from kubeinfer.cluster import images
from kubeinfer.cluster.gobuild import BuildError, find_go
from kubeinfer.cluster.podman import ensure_programs
from ports import free_port
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.lifecycle, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
RUNTIME, OPERATOR = images.RUNTIME_IMAGE, images.OPERATOR_IMAGE
NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
CONTAINER = [
    # podman's default limits are past what this machine lets a process set (it withholds
    # CAP_SYS_RESOURCE): open files at the current hard limit, processes at podman's own
    # documented default, both named.
    "--ulimit", f"nofile={NOFILE}:{NOFILE}", "--ulimit", "nproc=32768:32768",
    # As a restricted pod runs: nothing writable but the mounts, no capability.
    "--read-only", "--read-only-tmpfs=false", "--cap-drop", "all",
    "--security-opt", "no-new-privileges",
]  # fmt: skip


@pytest.fixture(scope="module")
def podman() -> list[str]:
    try:
        found = ensure_programs(["podman", "runc"], lambda message: None)
    except BuildError as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no podman here: {error}")
    return [found["podman"], "--runtime", found["runc"]]


@pytest.fixture(scope="module")
def host_before() -> Iterator[dict[str, list[str]]]:
    """The host's network before anything here ran; compared by the last test."""
    yield host_network.snapshot()


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("clone") / "kubeinfer"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(target)], check=True)
    return target


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache of the test's own, so the build and the export run whatever the machine's
    cache holds (podman's layers are still reused); its archives removed after."""
    folder = tmp_path_factory.mktemp("cache")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def make_images(clone: Path, cache: Path) -> dict[str, Path]:
    result = subprocess.run(
        [sys.executable, "-m", "kubeinfer.cluster.images", "--source", str(clone)],
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},
        capture_output=True, text=True, timeout=1500, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-5000:]
    assert "STEP" in result.stderr, "no progress shown"
    return {line.split()[0]: Path(line.split()[1]) for line in result.stdout.splitlines()}


@pytest.fixture(scope="module")
def built(
    podman: list[str], host_before: dict[str, list[str]], clone: Path, cache: Path
) -> dict[str, Path]:
    return make_images(clone, cache)


@pytest.fixture(scope="module")
def runtime(built: dict[str, Path]) -> str:
    return image_id(built[RUNTIME])


@pytest.fixture(scope="module")
def operator(built: dict[str, Path]) -> str:
    return image_id(built[OPERATOR])


def run(podman: list[str], image: str, *argv: str, options: tuple[str, ...] = ()) -> str:
    """The container's output; it must exit 0."""
    result = subprocess.run(
        [*podman, "run", "--rm", "--network", "none", *CONTAINER, *options, image, *argv],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, (argv, result.stdout[-2000:], result.stderr[-2000:])
    return result.stdout


def python_in(podman: list[str], image: str, code: str) -> str:
    return run(podman, image, "-c", code, options=("--entrypoint", "python"))


def oci_manifest(archive: Path, verify: bool = False) -> tuple[str, dict]:
    """The reference an OCI archive names and its manifest; `verify`: every blob checked
    against its digest first."""
    with tarfile.open(archive) as tar:

        def member(name: str) -> IO[bytes]:
            found = tar.extractfile(name)
            assert found is not None, name
            return found

        for entry in tar.getmembers() if verify else []:
            if entry.name.startswith("blobs/sha256/") and entry.isfile():
                digest = hashlib.file_digest(member(entry.name), "sha256").hexdigest()
                assert digest == entry.name.rsplit("/", 1)[1], entry.name
        [image] = json.load(member("index.json"))["manifests"]
        manifest = json.load(member(f"blobs/sha256/{image['digest'].split(':')[1]}"))
        return image["annotations"]["org.opencontainers.image.ref.name"], manifest


def image_id(archive: Path) -> str:
    """The ID of the image an archive holds: containers run from it by ID, since another
    build on the machine (a test worker, `make images`) may move the tag meanwhile."""
    return str(oci_manifest(archive)[1]["config"]["digest"]).removeprefix("sha256:")


def test_the_archives_name_their_image_and_hold_its_content(
    podman: list[str], built: dict[str, Path]
) -> None:
    assert set(built) == {RUNTIME, OPERATOR}
    for reference, archive in built.items():
        named, manifest = oci_manifest(archive, verify=True)
        assert named == reference
        held = str(manifest["config"]["digest"]).removeprefix("sha256:")
        assert archive.name == f"{images.slug(reference)}-{held[:12]}.oci.tar"
        inspect = [*podman, "image", "inspect", "--format", "{{.Id}}", held]
        assert subprocess.run(inspect, capture_output=True, text=True).stdout.strip() == held


def test_the_references_are_the_ones_the_operator_and_the_chart_use() -> None:
    from kubeinfer.cli.chart.values import OPERATOR_REPOSITORY
    from kubeinfer.operator.settings import DEFAULT_RUNTIME_IMAGE

    assert RUNTIME == DEFAULT_RUNTIME_IMAGE
    assert OPERATOR.rsplit(":", 1)[0] == OPERATOR_REPOSITORY


def test_unchanged_inputs_give_the_archives_without_podman(
    built: dict[str, Path], clone: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_podman(*_: object) -> None:
        raise AssertionError("podman was run for unchanged inputs")

    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setattr(images, "Podman", no_podman)
    assert images.ensure_project_images(root=clone) == built


def test_the_entry_points_answer(podman: list[str], runtime: str, operator: str) -> None:
    assert "A Kubernetes operator for GPU inference" in run(podman, runtime, "--help")
    assert "--onnx" in run(podman, runtime, "serve", "--help")
    assert "--leader-election" in run(podman, operator, "operator", "--help")
    assert "kind: CustomResourceDefinition" in run(podman, operator, "crds")
    example = "/opt/kubeinfer/project/kubeinfer/cli/demo/examples/cpu-minimal.yaml"
    assert "valid InferenceDeployment" in run(podman, operator, "validate", example)


@pytest.mark.parametrize("side", ["runtime", "operator"])
def test_each_image_runs_as_65532_without_pip_or_a_compiler(
    podman: list[str], side: str, request: pytest.FixtureRequest
) -> None:
    image = request.getfixturevalue(side)
    code = (
        "import importlib.util as u, os, shutil, sys;"
        "print(os.getuid(), os.getgid(), os.environ['HOME']);"
        "print([m for m in ('pip', 'setuptools', 'wheel') if u.find_spec(m)]);"
        "print([p for p in ('pip', 'pip3', 'gcc', 'cc', 'c++', 'apt-get', 'cargo', 'rustc',"
        " 'maturin') if shutil.which(p)])"
    )
    assert python_in(podman, image, code).splitlines() == ["65532 65532 /tmp", "[]", "[]"]
    bundled = run(podman, image, "-c", "find / -xdev -name '*.whl' | head -5",
                  options=("--entrypoint", "sh"))  # fmt: skip
    assert bundled == "", f"wheels left in the image: {bundled}"
    config = subprocess.run([*podman, "image", "inspect", "--format",
                             "{{.Config.User}} {{json .Config.Entrypoint}}", image],
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert config == ["65532:65532", '["kubeinfer"]']


def test_the_runtime_image_fetches_s3_and_gs_models(podman: list[str], runtime: str) -> None:
    """The engine build Jobs run in it: fsspec finds its s3:// and gs:// file systems."""
    code = (
        "import fsspec; print([fsspec.get_filesystem_class(s).__module__.split('.')[0]"
        " for s in ('s3', 'gs')])"
    )
    assert python_in(podman, runtime, code).strip() == "['s3fs', 'gcsfs']"


def test_the_runtime_image_has_the_rust_data_plane_and_no_rust_toolchain(
    podman: list[str], runtime: str, operator: str
) -> None:
    """kubeinfer_dataplane from its own layer (/opt/kubeinfer/dataplane); the builder
    stage's toolchain (Debian's rustc-web, cargo-web) in neither image."""
    code = "import kubeinfer_dataplane as d; print(d.__file__)"
    assert python_in(podman, runtime, code).startswith("/opt/kubeinfer/dataplane/")
    toolchain = "find / -xdev \\( -name cargo -o -name 'rustc*' -o -name 'libstd-*.so' \\) | head"
    for image in (runtime, operator):
        assert run(podman, image, "-c", toolchain, options=("--entrypoint", "sh")) == ""


EXIT_AFTER_SIGTERM_SECONDS = 60.0
"""Longer than the runtime's drain grace period (30 s by default) and its close."""


class Served:
    """The runtime image serving `model` on loopback ports of the host (`--network host`:
    no namespace or rule is made), the model mounted read-only."""

    def __init__(self, podman: list[str], image: str, model: Path) -> None:
        self.podman, self.name = podman, f"kubeinfer-test-{uuid.uuid4().hex[:8]}"
        self.http, self.grpc = free_port(), free_port()
        subprocess.run(
            [*podman, "run", "--detach", "--name", self.name, "--network", "host", *CONTAINER,
             "--volume", f"{model.parent}:/models:ro", image,
             "serve", "--onnx", f"/models/{model.name}", "--model-name", "tiny",
             "--host", "127.0.0.1", "--port", str(self.http), "--grpc-port", str(self.grpc)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip

    def request(self, method: str, path: str, body: object = None) -> tuple[int, dict]:
        connection = http.client.HTTPConnection("127.0.0.1", self.http, timeout=10)
        try:
            data = json.dumps(body) if body is not None else None
            connection.request(method, path, data, {"Content-Type": "application/json"})
            response = connection.getresponse()
            text = response.read()
            return response.status, json.loads(text) if text.strip() else {}
        finally:
            connection.close()

    def wait_ready(self, timeout: float = 120) -> None:
        def ready() -> bool:
            if self.state() != "running":
                raise AssertionError("the container stopped")
            return self.request("GET", "/v2/health/ready")[0] == 200

        try:
            wait_for(ready, timeout, "the container to be ready", every=0.1, ignoring=(OSError,))
        except AssertionError as failed:
            raise AssertionError(f"{failed}: {self.logs()}") from None

    def state(self) -> str:
        return self._podman("inspect", "--format", "{{.State.Status}}", self.name).strip()

    def logs(self) -> str:
        return self._podman("logs", self.name)[-4000:]

    def _podman(self, *argv: str) -> str:
        result = subprocess.run([*self.podman, *argv], capture_output=True, text=True, check=False)
        return result.stdout + result.stderr

    def wait_exit(self, within: float) -> str:
        """The container's exit code once it stops; fails, with its logs, when it has not
        stopped `within` seconds (a drain that hangs fails here rather than holding the
        suite until its timeout)."""
        try:
            result = subprocess.run([*self.podman, "wait", self.name], capture_output=True,
                                    text=True, check=False, timeout=within)  # fmt: skip
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {within} s after SIGTERM: {self.logs()}") from None
        return (result.stdout + result.stderr).strip()

    def remove(self) -> None:
        self._podman("rm", "--force", "--time", "0", self.name)


@pytest.fixture
def served(podman: list[str], runtime: str, tmp_path: Path) -> Iterator[tuple[Served, Path]]:
    models = tmp_path / "models"
    model = build_tiny_mlp(models / "tiny.onnx")
    models.chmod(0o755)  # the container's user reads it, as from a volume
    model.chmod(0o644)
    server = Served(podman, runtime, model)
    try:
        server.wait_ready()
        yield server, model
    finally:
        server.remove()


def test_the_runtime_image_serves_over_http_and_grpc_and_exits_0_on_sigterm(
    served: tuple[Served, Path],
) -> None:
    server, model = served
    rows = np.random.default_rng(7).standard_normal((3, 16)).astype(np.float32)
    expected = ort.InferenceSession(str(model)).run(None, {"input": rows})[0]
    body = {"inputs": [{"name": "input", "shape": [3, 16], "datatype": "FP32",
                        "data": rows.ravel().tolist()}]}  # fmt: skip
    status, answer = server.request("POST", "/v2/models/tiny/infer", body)
    assert status == 200, answer
    over_http = np.array(answer["outputs"][0]["data"], dtype=np.float32).reshape(3, 10)
    np.testing.assert_allclose(over_http, expected, rtol=1e-5, atol=1e-6)

    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    tensor = triton_grpc.InferInput("input", [3, 16], "FP32")
    tensor.set_data_from_numpy(rows)
    over_grpc = client.infer("tiny", [tensor]).as_numpy("logits")
    client.close()
    np.testing.assert_allclose(over_grpc, expected, rtol=1e-5, atol=1e-6)

    answers: list[tuple[bool, int]] = []  # (sent after SIGTERM, status)
    stop, terminated = threading.Event(), threading.Event()

    def client_loop() -> None:  # requests until the server stops taking them
        while not stop.is_set():
            after = terminated.is_set()
            try:
                answers.append((after, server.request("POST", "/v2/models/tiny/infer", body)[0]))
            except OSError:
                return

    clients = [threading.Thread(target=client_loop) for _ in range(4)]
    for thread in clients:
        thread.start()
    wait_for(lambda: len(answers) >= 20, 60, "20 answers before SIGTERM", every=0.01)
    terminated.set()
    server._podman("kill", "--signal", "TERM", server.name)
    exit_code = server.wait_exit(EXIT_AFTER_SIGTERM_SECONDS)
    stop.set()
    for thread in clients:
        thread.join(timeout=30)
    logs = server.logs()
    assert exit_code == "0", logs
    assert "Drained" in logs, logs
    before = [status for after, status in answers if not after]
    assert len(before) >= 20 and set(before) == {200}, before
    # Sent while draining: answered, or refused with 503 as a draining server does.
    assert {status for after, status in answers if after} <= {200, 503}


def layers(archive: Path) -> list[str]:
    return [layer["digest"] for layer in oci_manifest(archive)[1]["layers"]]


def test_a_one_line_source_change_rebuilds_only_the_projects_layer(
    podman: list[str], built: dict[str, Path], clone: Path, cache: Path
) -> None:
    before = {reference: layers(archive) for reference, archive in built.items()}
    source = clone / "runtime" / "rust_dataplane.py"
    source.write_text(source.read_text() + "# a one-line change\n")
    rebuilt = make_images(clone, cache)
    for reference, archive in rebuilt.items():
        # A new archive; the old one stays among the newest few (another checkout's
        # cluster may be importing it), and the record names the new one.
        assert archive != built[reference] and built[reference].exists()
        after = layers(archive)
        assert after[:-1] == before[reference][:-1], "a layer below the project's changed"
        assert after[-1] != before[reference][-1]
    last_line = (
        "import kubeinfer.runtime.rust_dataplane as d; print(open(d.__file__).readlines()[-1])"
    )
    changed = python_in(podman, image_id(rebuilt[RUNTIME]), last_line)
    assert changed.strip() == "# a one-line change"


HELLO = """package main

import (
	"fmt"
	"os"
)

func main() { fmt.Println("uid", os.Getuid(), "args", os.Args[1:]) }
"""


def test_an_image_of_one_static_binary(
    podman: list[str],
    host_before: dict[str, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "hello.go").write_text(HELLO)
    (tmp_path / "go.mod").write_text("module hello\n\ngo 1.22\n")
    environment = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}
    subprocess.run([find_go(), "build", "-o", "hello", "."], cwd=tmp_path, env=environment,
                   check=True, capture_output=True)  # fmt: skip
    binary = tmp_path / "hello"
    archive = images.ensure_binary_image("localhost/kubeinfer/hello:test", binary,
                                         ["/hello", "--greeting"])  # fmt: skip
    assert oci_manifest(archive)[0] == "localhost/kubeinfer/hello:test"
    said = run(podman, "localhost/kubeinfer/hello:test", "world")
    assert said.strip() == "uid 65532 args [--greeting world]"
    assert len(layers(archive)) == 1, "FROM scratch: the binary's layer alone"
    monkeypatch.setattr(images, "Podman", lambda *_: pytest.fail("podman run for the same"))
    assert images.ensure_binary_image("localhost/kubeinfer/hello:test", binary,
                                      ["/hello", "--greeting"]) == archive  # fmt: skip
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    as_root = images.ensure_binary_image("localhost/kubeinfer/hello:root", binary, ["/hello"], None)
    assert as_root.exists()
    assert run(podman, "localhost/kubeinfer/hello:root").strip() == "uid 0 args []"
    hellos = ["localhost/kubeinfer/hello:test", "localhost/kubeinfer/hello:root"]
    subprocess.run([*podman, "rmi", *hellos], capture_output=True, check=False)


def test_the_hosts_network_is_as_it_was(host_before: dict[str, list[str]]) -> None:
    """Last: nothing above added a link, an address, a route or a firewall rule."""
    assert host_network.changes(host_before, host_network.snapshot()) == []
