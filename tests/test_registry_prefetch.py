"""The suite never downloads: `make test` fetches what tests need from package registries
first (`registry_prefetch`), and every process pytest starts runs with the registries off,
so a test that would download fails on every machine, naming the prefetch, instead of
passing where a cache happens to hold what it fetches and failing on a fresh machine.

Covers: pytest's environment has Go's proxy, npm and pip off; a Go module that is not in
the module cache is refused by Go itself and reported as a missing download naming the
prefetch command (a version never fetched, so this holds on any machine); the PodMonitor
schema's npm package missing fails its test with the same message rather than installing
it; pip, asked for a package, finds no index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import podmonitor_schema
import pytest
from registry_prefetch import (
    OFFLINE_ENVIRONMENT,
    PREFETCH_COMMAND,
    PROMETHEUS_OPERATOR_MODULE,
    MissingDownload,
    go_module_directory,
)


def test_every_process_the_tests_start_has_the_registries_off() -> None:
    for name, value in OFFLINE_ENVIRONMENT.items():
        assert os.environ.get(name) == value, name
    assert {"GOPROXY", "npm_config_offline", "PIP_NO_INDEX"} <= set(OFFLINE_ENVIRONMENT)


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go")
def test_a_go_module_not_in_the_cache_is_a_missing_download_naming_the_prefetch() -> None:
    with pytest.raises(MissingDownload) as missing:
        go_module_directory(PROMETHEUS_OPERATOR_MODULE, "v0.0.0-20000101000000-000000000000")
    message = str(missing.value)
    assert "is not in its cache" in message and PREFETCH_COMMAND in message, message
    assert "`make test` fetches it before pytest starts" in message


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go")
def test_go_itself_refuses_to_fetch_under_the_tests_environment(tmp_path: Path) -> None:
    done = subprocess.run(
        ["go", "mod", "download", "-json", f"{PROMETHEUS_OPERATOR_MODULE}@v0.0.1"],
        capture_output=True, text=True, check=False, timeout=120,
        env={**os.environ, "GOMODCACHE": str(tmp_path / "modules")},
    )  # fmt: skip
    assert done.returncode != 0
    assert "GOPROXY=off" in done.stdout + done.stderr


def test_the_npm_package_missing_fails_naming_the_prefetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("needs node and npm")
    monkeypatch.setattr(podmonitor_schema, "CACHE", tmp_path / "npm")
    (tmp_path / "npm").mkdir()
    with pytest.raises(pytest.fail.Exception, match="make test` fetches it") as failed:
        podmonitor_schema.install_validator()
    assert podmonitor_schema.PACKAGE in str(failed.value)
    assert not (tmp_path / "npm" / "node_modules").exists(), "nothing was installed"


def test_pip_finds_no_index(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(tmp_path),
         "--no-cache-dir", "six==1.16.0"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert not list(tmp_path.iterdir()), "nothing was downloaded"
