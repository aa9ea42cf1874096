"""What the suite needs from package registries, fetched before any test runs.

`make test` runs this script first, from the host's network namespace, with progress; it
fetches and caches:

- prometheus-operator's Go module at the release whose CRDs the tests apply
  (`prometheus_operator_crds`), into the Go module cache;
- the npm package that validates PodMonitors against that release's schema
  (`podmonitor_schema`), into `.cache/npm/`.

No test fetches anything: pytest runs with the registries switched off for every process
it starts (`OFFLINE_ENVIRONMENT`, set by tests/conftest.py), so a test that would download
fails on every machine, not only on a fresh one, and says what to fetch first
(`missing_download`). Go's and npm's own caches are what the tests then read.

Run it by hand after `make clean` or on a machine whose caches were emptied:
`.venv/bin/python tests/support/registry_prefetch.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator"
PROMETHEUS_OPERATOR_VERSION = "v0.90.1"

OFFLINE_ENVIRONMENT = {
    "GOPROXY": "off",  # no module is fetched: a missing one is an error naming it
    "GOFLAGS": "-mod=mod",
    "npm_config_offline": "true",  # npm answers from its cache or fails (ENOTCACHED)
    "PIP_NO_INDEX": "1",
    "UV_OFFLINE": "1",
    "CARGO_NET_OFFLINE": "true",
}
"""The variables pytest runs under: every registry the project's tools reach, off."""

PREFETCH_COMMAND = ".venv/bin/python tests/support/registry_prefetch.py"
FETCH_SECONDS = 600


class MissingDownload(RuntimeError):
    """What a test needs from a registry is not in its cache."""


def missing_download(what: str) -> MissingDownload:
    """The error of a test that needs `what` from a registry it may not reach."""
    return MissingDownload(
        f"{what} is not in its cache, and tests run with the package registries off "
        f"(GOPROXY=off, npm offline, PIP_NO_INDEX): `make test` fetches it before pytest "
        f"starts ({PREFETCH_COMMAND}); run that once, from the host's network"
    )


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise FileNotFoundError("needs Go (on the PATH) to read Go modules")
    return go


def go_module_directory(module: str, version: str, *, fetch: bool = False) -> Path:
    """The directory of `module@version` in the Go module cache. Without `fetch`, read
    offline (GOPROXY=off): MissingDownload when it is not there."""
    environment = dict(os.environ)
    if not fetch:
        environment.update(OFFLINE_ENVIRONMENT)
    result = subprocess.run(
        [_go(), "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True, text=True, check=False, timeout=FETCH_SECONDS, env=environment,
    )  # fmt: skip
    if result.returncode != 0:
        if not fetch:
            raise missing_download(f"the Go module {module}@{version}")
        raise RuntimeError(
            f"go mod download {module}@{version} failed: {result.stdout}{result.stderr}"
        )
    return Path(json.loads(result.stdout)["Dir"])


def prefetch() -> list[str]:
    """Fetches everything; returns what failed (one line each)."""
    failed = []
    module = f"{PROMETHEUS_OPERATOR_MODULE}@{PROMETHEUS_OPERATOR_VERSION}"
    print(f"registry prefetch: Go module {module}", flush=True)
    try:
        where = go_module_directory(
            PROMETHEUS_OPERATOR_MODULE, PROMETHEUS_OPERATOR_VERSION, fetch=True
        )
        print(f"registry prefetch:   in {where}", flush=True)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as error:
        failed.append(f"the Go module {PROMETHEUS_OPERATOR_MODULE}: {error}")
    from podmonitor_schema import PACKAGE, VERSION, install_package

    print(f"registry prefetch: npm package {PACKAGE}@{VERSION}", flush=True)
    try:
        print(f"registry prefetch:   in {install_package()}", flush=True)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as error:
        failed.append(f"the npm package {PACKAGE}@{VERSION}: {error}")
    return failed


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    problems = prefetch()
    for problem in problems:
        print(f"registry prefetch: not fetched: {problem}", file=sys.stderr)
    # Not fatal: without Go, node or npm the tests that need them skip (fail under CI=true),
    # each saying why.
    sys.exit(0)
