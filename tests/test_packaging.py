"""Packaging: `operator/` and `runtime/` install as `kubeinfer.operator` and
`kubeinfer.runtime` (never as top-level `operator`/`runtime`), a built wheel carries every
module, the installed (non-editable) package runs its console script, and the runtime never
imports the control plane."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"operator": "kubeinfer/operator", "runtime": "kubeinfer/runtime"}


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


def test_the_wheel_carries_every_module_under_its_kubeinfer_name(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, package in PACKAGES.items():
        for source in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in source.parts:
                continue
            inside = f"{package}/{source.relative_to(ROOT / folder).as_posix()}"
            assert inside in names, f"{inside} is missing from the wheel"
    top_level = {name.split("/")[0] for name in names}
    assert "operator" not in top_level and "runtime" not in top_level


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
    code = "import kubeinfer.operator.cli as c, sys; sys.exit(c.main(sys.argv[1:]))"
    example = ROOT / "examples" / "cpu-minimal.yaml"
    result = run(str(python), "-c", code, "validate", str(example), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "valid InferenceDeployment resnet-cpu" in result.stdout
    located = run(str(python), "-c", "import kubeinfer.runtime as r; print(r.__file__)")
    assert located.stdout.startswith(str(site)), located.stdout


def test_the_runtime_never_imports_the_control_plane() -> None:
    code = (
        "import sys, kubeinfer.runtime.config, kubeinfer.runtime.commands;"
        "bad = [m for m in sys.modules if m.startswith(('kubeinfer.operator', 'kopf',"
        " 'kubernetes'))]; print(bad); sys.exit(1 if bad else 0)"
    )
    result = run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stdout + result.stderr
