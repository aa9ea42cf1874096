"""Packaging: `operator/` and `runtime/` install as `kubeinfer.operator` and
`kubeinfer.runtime` (never as top-level `operator`/`runtime`), a built wheel carries every
module and the example manifests, the installed (non-editable) package runs its console
script and finds the demo's examples from any directory, the runtime never imports the
control plane, and each side's imports are declared in its own extra (`operator`,
`runtime`, `gpu`...) and nothing more: the CLI of each image runs its commands without
the other side's libraries and names the missing extra for the others."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    folder: f"kubeinfer/{folder}"
    for folder in ("operator", "runtime", "contract", "cluster", "cli")
}


def run(*command: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_standard_library_operator_module_is_not_shadowed(tmp_path: Path) -> None:
    code = (
        "import operator, kubeinfer.operator; print(operator.__file__); print(operator.add(1, 2))"
    )
    for cwd in (ROOT, tmp_path):
        result = run(sys.executable, "-c", code, cwd=cwd)
        assert result.returncode == 0, result.stderr
        location, three = result.stdout.split()
        assert Path(location).parent == Path(sysconfig.get_paths()["stdlib"]), location
        assert three == "3"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    result = run(*command, "--quiet", "--wheel-dir", str(out), str(ROOT))
    assert result.returncode == 0, result.stderr
    [built] = out.glob("kubeinfer-*.whl")
    return built


def _in_the_native_crates(source: Path) -> bool:
    """runtime/native holds the Rust crates (their tests' Python helpers and generators
    among them), shipped as the extension's own wheel, not as modules of kubeinfer."""
    return source.is_relative_to(ROOT / "runtime" / "native")


def test_the_wheel_carries_every_module_under_its_kubeinfer_name(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, package in PACKAGES.items():
        for source in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in source.parts or _in_the_native_crates(source):
                continue
            inside = f"{package}/{source.relative_to(ROOT / folder).as_posix()}"
            assert inside in names, f"{inside} is missing from the wheel"
    top_level = {name.split("/")[0] for name in names}
    assert not top_level & set(PACKAGES), "a folder shipped under its own name"


def test_the_installed_wheel_runs_the_console_script(wheel: Path, tmp_path: Path) -> None:
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=False)
    site = next((environment / "lib").glob("python*/site-packages"))
    # Dependencies come from the test environment; the package itself from the wheel.
    dependencies = Path(sysconfig.get_paths()["purelib"])
    (site / "dependencies.pth").write_text(f"{dependencies}\n")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    python = environment / "bin" / "python"
    code = "import kubeinfer.cli.main as c, sys; sys.exit(c.main(sys.argv[1:]))"
    example = ROOT / "examples" / "cpu-minimal.yaml"
    result = run(str(python), "-c", code, "validate", str(example), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "valid InferenceDeployment resnet-cpu" in result.stdout
    located = run(str(python), "-c", "import kubeinfer.runtime as r; print(r.__file__)")
    assert located.stdout.startswith(str(site)), located.stdout


def test_the_runtime_never_imports_the_control_plane() -> None:
    code = (
        "import sys, kubeinfer.contract.runtime_config, kubeinfer.runtime.commands;"
        "bad = [m for m in sys.modules if m.startswith(('kubeinfer.operator', 'kopf',"
        " 'kubernetes'))]; print(bad); sys.exit(1 if bad else 0)"
    )
    result = run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_command_line_loads_no_operator_machinery_before_a_command_runs() -> None:
    """Every `kubeinfer` process builds the whole parser, so a runtime pod's `kubeinfer
    serve` paid for the operator's API models, CRD generator and settings it never uses
    (about a third of its start) while the operator's registrations imported them: they
    import them in their handlers instead."""
    code = (
        "import sys, kubeinfer.cli.main as m; m.build_parser();"
        "allowed = ('kubeinfer.operator.commands', 'kubeinfer.operator.kube.resources',"
        " 'kubeinfer.operator.rbac');"
        "bad = [n for n in sys.modules if n.startswith('kubeinfer.operator.')"
        " and n != 'kubeinfer.operator.kube' and not n.startswith(allowed)];"
        "bad += [n for n in ('kopf', 'kubernetes', 'numpy', 'onnxruntime') if n in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_wheel_ships_the_example_manifests(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for example in (ROOT / "examples").glob("*.yaml"):
        assert f"kubeinfer/cli/demo/examples/{example.name}" in names


def test_the_wheel_ships_the_control_planes_go_module(wheel: Path) -> None:
    """`kubeinfer cluster up` builds the binaries from it wherever the package is installed."""
    names = set(zipfile.ZipFile(wheel).namelist())
    module = ROOT / "cluster" / "go-modules" / "control-plane"
    for path in [*module.glob("go.*"), *module.glob("cmd/*/*.go")]:
        assert f"kubeinfer/cluster/{path.relative_to(ROOT / 'cluster')}" in names, path


def test_the_installed_demo_finds_its_examples_from_another_directory(
    wheel: Path, tmp_path: Path
) -> None:
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=False)
    site = next((environment / "lib").glob("python*/site-packages"))
    (site / "dependencies.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "from kubeinfer.cli.demo.command import examples_dir, show_children, "
        "show_manifests; print(examples_dir()); assert show_manifests(); "
        "show_children(examples_dir() / 'cpu-minimal.yaml')"
    )
    result = run(str(environment / "bin" / "python"), "-c", code, cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(str(site / "kubeinfer" / "cli" / "demo" / "examples"))
    assert result.stdout.count("valid InferenceDeployment") == 3
    assert "Deployment/resnet-cpu-runtime" in result.stdout


# --- extras: each image installs what it runs -----------------------------------------

OPTIONAL_MODULES = {
    "tensorrt": "gpu", "pycuda": "gpu", "pynvml": "gpu", "cuda.bindings": "gpu",
    "onnxruntime_extensions": "extensions",
}  # fmt: skip
"""Imports of an optional extra (each one guarded: a missing one is a clear error)."""
PROJECT_EXTENSIONS = {"kubeinfer_dataplane"}
"""The project's own compiled extension (runtime/native, built by `make dataplane` and the
runtime image's builder stage), no registry's distribution."""
PART_OF = {"pydantic_core": "pydantic"}
"""Packages that come pinned with a declared one (pydantic pins its core exactly)."""
STDLIB = sys.stdlib_module_names | {"_typeshed"}  # typeshed's, for annotations only


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extras() -> tuple[set[str], dict[str, set[str]]]:
    """(base dependencies, extra -> its distributions with self-references resolved)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def name(requirement: str) -> str:
        return normalized(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))

    declared = project["optional-dependencies"]
    resolved: dict[str, set[str]] = {}

    def resolve(extra: str) -> set[str]:
        if extra not in resolved:
            found: set[str] = set()
            for requirement in declared[extra]:
                if name(requirement) == "kubeinfer":
                    for inner in re.search(r"\[(.*)\]", requirement).group(1).split(","):
                        found |= resolve(inner.strip())
                else:
                    found.add(name(requirement))
            resolved[extra] = found
        return resolved[extra]

    for extra in declared:
        resolve(extra)
    return {name(r) for r in project["dependencies"]}, resolved


def imported_modules(folder: str) -> dict[str, set[str]]:
    """Third-party modules imported anywhere under `folder` (lazily too) -> the files."""
    found: dict[str, set[str]] = {}
    for source in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in STDLIB and top != "kubeinfer":
                    found.setdefault(module, set()).add(str(source.relative_to(ROOT)))
    return found


def distribution_of(module: str) -> str:
    for prefix, extra in OPTIONAL_MODULES.items():
        if module == prefix or module.startswith(prefix + "."):
            return f"[{extra}]"
    top = module.split(".")[0]
    if top in PROJECT_EXTENSIONS:
        return "[project extension]"
    if module.startswith("google.protobuf"):
        return "protobuf"
    top = PART_OF.get(top, top)
    candidates = importlib.metadata.packages_distributions().get(top)
    assert candidates, f"{module} is imported but no installed distribution provides it"
    return normalized(candidates[0])


@pytest.mark.parametrize(
    ("folder", "extra", "also", "loads"),
    [
        ("operator", "operator", (), ()),
        # Both images' `kubeinfer` registers every command, and the commands load the API
        # models (pydantic only, croniter for the wake schedules): the runtime image imports
        # operator/api too.
        ("runtime", "runtime", (), ("operator/api",)),
        ("cluster", "local", (), ()),
    ],
)
def test_each_sides_imports_are_declared_in_its_extra_and_nothing_more(
    folder: str, extra: str, also: tuple[str, ...], loads: tuple[str, ...]
) -> None:
    base, resolved = extras()
    allowed = base | resolved[extra]
    used: set[str] = set()
    for module, files in imported_modules(folder).items():
        distribution = distribution_of(module)
        if distribution.startswith("["):
            continue  # an optional extra's, guarded where imported
        mine = {f for f in files if not f.startswith(also)}
        if mine:
            used.add(distribution)
            assert distribution in allowed, (
                f"{module} (from {distribution}) is imported by {sorted(mine)} but is not in "
                f"the base dependencies or the {extra} extra"
            )
    # The demo runs both sides (`make demo` installs dev = operator + runtime).
    assert resolved["dev"] >= resolved["operator"] | resolved["runtime"]
    # The base dependencies are the two planes' common ground; the local cluster needs
    # only its own extra (and PyYAML).
    for loaded in loads:
        used |= {distribution_of(module) for module in imported_modules(loaded)}
        assert used & base, f"{loaded} is said to be loaded but imports no base dependency"
    expected = resolved[extra] | (base if folder != "cluster" else set())
    assert not expected - used, "declared but never imported"


def run_without(blocked: set[str], *argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The CLI in a process where `blocked` top-level packages cannot be imported, as in
    an image that installed only the other extra."""
    code = f"""
import importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {sorted(blocked)!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Blocked())
import kubeinfer.cli.main as cli
sys.exit(cli.main(sys.argv[1:]))
"""
    return run(sys.executable, "-c", code, *argv, cwd=cwd)


RUNTIME_ONLY = {"numpy", "onnx", "onnxruntime", "orjson", "google"}
OPERATOR_ONLY = {"kopf", "kubernetes", "ruamel", "requests", "urllib3"}


def test_the_operator_image_runs_its_commands_without_the_runtime_libraries() -> None:
    examples = [str(p) for p in sorted((ROOT / "examples").glob("*.yaml"))]
    for argv in (
        ["validate", *examples],
        ["render", examples[0]],
        ["crds"],
        ["rbac"],
        ["operator", "--help"],
        ["promote", "--help"],
    ):
        result = run_without(RUNTIME_ONLY, *argv)
        assert result.returncode == 0, (argv, result.stderr)
    refused = run_without(RUNTIME_ONLY, "build", "--model", "m.onnx", "--cache", "/tmp/c")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "pip install 'kubeinfer[runtime]'" in refused.stderr, refused.stderr


def test_the_runtime_image_runs_its_commands_without_the_operator_libraries(
    tmp_path: Path,
) -> None:
    from kubeinfer.cli.demo.mlp_models import build_tiny_mlp

    model = build_tiny_mlp(tmp_path / "tiny.onnx")
    built = run_without(OPERATOR_ONLY, "build", "--model", str(model), "--cache", str(tmp_path))
    assert built.returncode == 0 and built.stdout.startswith("sha256:"), built.stderr
    assert run_without(OPERATOR_ONLY, "serve", "--help").returncode == 0
    refused = run_without(OPERATOR_ONLY, "validate", str(ROOT / "examples" / "pinned.yaml"))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "pip install 'kubeinfer[operator]'" in refused.stderr, refused.stderr


# --- the pins: one resolution for the venv and every image (requirements/, docs/images.md) ---

REQUIREMENTS = ROOT / "requirements"
IMAGE_LOCKS = {
    "operator.txt": ["operator"],
    "runtime.txt": ["runtime", "s3", "gcs", "extensions"],
    "runtime-gpu.txt": ["runtime", "s3", "gcs", "extensions", "gpu"],
}
"""Each image's lock and the extras it installs (tests/cluster/test_images_build.py builds
the operator's and the runtime's; the GPU image's is built nowhere here)."""


def pins(lock: Path) -> dict[str, str]:
    """name -> version of a `uv pip compile` output."""
    found = re.findall(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)", lock.read_text(), re.M)
    return {normalized(name): version for name, version in found}


def requirements_of(extras: list[str]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        for text in project["optional-dependencies"][extra]:
            requirement = Requirement(text)
            if requirement.name != "kubeinfer":  # self-references: listed extras already
                found.append(requirement)
    return found


@pytest.mark.parametrize("lock", sorted(IMAGE_LOCKS))
def test_each_images_lock_pins_its_extras_at_the_versions_the_venv_uses(lock: str) -> None:
    locked = pins(REQUIREMENTS / lock)
    constraints = pins(REQUIREMENTS / "constraints.txt")
    for requirement in requirements_of(IMAGE_LOCKS[lock]):
        name = normalized(requirement.name)
        if name == "tensorrt":  # the GPU image's base ships it (runtime-gpu.in says why)
            continue
        assert name in locked, f"{name} is not in {lock}: run `make lock`"
        assert requirement.specifier.contains(locked[name], prereleases=True), (
            f"{lock} pins {name}=={locked[name]}, outside {requirement}: run `make lock`"
        )
    shared = set(locked) & set(constraints)
    assert {n: locked[n] for n in shared} == {n: constraints[n] for n in shared}, (
        "an image would ship another version than the tests run"
    )
    text = (REQUIREMENTS / lock).read_text()
    assert all("--hash=sha256:" in block for block in re.split(r"\n(?=\S)", text)[1:]
               if "==" in block), f"{lock}: every pin carries its hashes"  # fmt: skip


def test_the_venv_constraints_cover_every_extra_but_the_gpus() -> None:
    constraints = pins(REQUIREMENTS / "constraints.txt")
    extras = ["dev", "operator", "runtime", "local", "s3", "gcs", "mutation"]
    for requirement in requirements_of(extras):
        version = constraints.get(normalized(requirement.name))
        assert version and requirement.specifier.contains(version, prereleases=True), (
            f"{requirement} is not pinned in requirements/constraints.txt: run `make lock`"
        )


def test_the_gpu_lock_input_is_the_gpu_extra_without_tensorrt() -> None:
    listed = [Requirement(line) for line in (REQUIREMENTS / "runtime-gpu.in").read_text()
              .splitlines() if line.strip() and not line.startswith("#")]  # fmt: skip
    declared = [r for r in requirements_of(["gpu"]) if normalized(r.name) in extras()[1]["gpu"]]
    expected = {str(r) for r in declared if r.name not in ("tensorrt", "kubeinfer")}
    expected -= {str(r) for r in requirements_of(["runtime"])}
    assert {str(r) for r in listed} == expected


def test_the_gpu_images_cuda_packages_stay_within_its_bases_cuda_12() -> None:
    """NVIDIA's TensorRT 25.01 image has CUDA 12.8; cuda-bindings 13 is built for CUDA 13."""
    [bound] = [r for r in requirements_of(["gpu"]) if r.name == "cuda-bindings"]
    assert not bound.specifier.contains("13.0.0") and bound.specifier.contains("12.9.0")
    assert pins(REQUIREMENTS / "runtime-gpu.txt")["cuda-bindings"].startswith("12.")


def test_the_dockerfile_pins_its_bases_and_leaves_the_gpu_image_non_root() -> None:
    """What the image build test cannot run: the GPU target (no registry, no GPU here)
    and the official base's digest."""
    text = (ROOT / "Dockerfile").read_text()
    python = re.search(r"^ARG PYTHON_BASE=(\S+)$", text, re.M).group(1)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", python)
    tensorrt = re.search(r"^ARG TENSORRT_BASE=(\S+)$", text, re.M).group(1)
    assert re.fullmatch(r"nvcr\.io/nvidia/tensorrt:25\.01-py3(@sha256:[0-9a-f]{64})?", tensorrt)
    stages = dict(re.findall(r"^FROM \S+ AS (\S+)\n(.*?)(?=^FROM |\Z)", text, re.M | re.S))
    assert "requirements/runtime-gpu.txt" in stages["runtime-gpu-deps"]
    gpu = stages["runtime-gpu"]
    assert "USER 65532:65532" in gpu and "HOME=/tmp" in gpu and "EXPOSE 8000 8001" in gpu


def test_the_dockerfile_builds_the_rust_extension_apart_with_the_workspaces_rust() -> None:
    """The Rust data plane's stage: Debian's toolchain at the workspace's rust-version,
    only runtime/native copied in (a Python change does not rebuild it), the lock kept;
    its wheel alone reaches the runtime images, below the project's layer."""
    text = (ROOT / "Dockerfile").read_text()
    debian = re.search(r"^ARG RUST_DEBIAN_VERSION=(\d+\.\d+)\.", text, re.M).group(1)
    cargo = tomllib.loads((ROOT / "runtime" / "native" / "Cargo.toml").read_text())
    assert debian == cargo["workspace"]["package"]["rust-version"]
    stages = dict(re.findall(r"^FROM \S+ AS (\S+)\n(.*?)(?=^FROM |\Z)", text, re.M | re.S))
    copied = re.findall(r"^COPY (?!--from)(\S+)", stages["dataplane"], re.M)
    assert copied == ["runtime/native"]
    assert "cargo fetch --locked" in stages["dataplane"]
    assert "maturin build --release --locked" in stages["dataplane"]
    for image in ("runtime", "runtime-gpu"):
        copies = re.findall(r"^COPY --from=(\S+)", stages[image], re.M)
        assert copies[-2:] == [f"{image}-dataplane", f"{image}-project"], copies
    assert not any(
        "--from=rust-tools" in body or "--from=dataplane " in body
        for name, body in stages.items()
        if not name.endswith("-dataplane")
    )
