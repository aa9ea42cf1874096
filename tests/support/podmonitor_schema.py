"""PodMonitor objects validated against the official prometheus-operator schema, for tests.

    from podmonitor_schema import validate_podmonitor
    validate_podmonitor(build_pod_monitor(...).body)  # AssertionError listing the errors

Nothing on PyPI or Debian ships prometheus-operator's CRD schemas as a validator; npm
does: `@kubernetes-models/prometheus-operator` (MIT). Version 5.0.1 is pinned: its
validators are AJV code compiled from the CRDs of prometheus-operator v0.90.1 (the
release's `stripped-down-crds.yaml`: the CRDs without their descriptions; later
versions are generated from the Go types instead). It is installed once into
`.cache/npm/` (git-ignored) with npm, under a file lock (several test runs share the
checkout), and one `node` call validates a whole batch of objects (`podmonitor_errors`).
`make test` installs it before the tests start (`registry_prefetch`, from the host's
network namespace), and no test installs it: a test that finds it missing fails, naming
the prefetch.
The package's dependencies ask for Node 22; Node 20 runs it (npm only warns).

Without node or npm the calling test skips with the reason; under `CI=true` it fails, as CI
must run it.

What the schema checks: types, enums, patterns (durations such as `interval`), required
fields, bounds. What it does not: unknown fields. The CRD allows them and the API server
prunes them silently, so a misspelt field passes here too; compare the object with what
a cluster keeps (the `cluster` tests) for that.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.cluster import netns
from registry_prefetch import missing_download

PACKAGE = "@kubernetes-models/prometheus-operator"
VERSION = "5.0.1"
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "npm"
SCRIPT = "validate-podmonitors.mjs"
INSTALL_SECONDS = 180
"""How long the prefetch waits for npm."""

# Reads a JSON array of objects on stdin, prints one array per object: its schema errors.
VALIDATOR = """\
import { readFileSync } from "node:fs";
import { PodMonitor }
  from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor";

const objects = JSON.parse(readFileSync(0, "utf8"));
const results = objects.map((object) => {
  try {
    new PodMonitor(object).validate();
    return [];
  } catch (error) {
    if (!Array.isArray(error.errors)) throw error;
    return error.errors.map(({ instancePath, message, params }) =>
      ({ path: instancePath, message, params }));
  }
});
process.stdout.write(JSON.stringify(results));
"""


def _unavailable(reason: str) -> None:
    """Skips the calling test, or fails it under CI=true."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}: CI must run the PodMonitor schema checks", pytrace=False)
    pytest.skip(reason)


def _installed_version() -> str | None:
    manifest = CACHE / "node_modules" / PACKAGE / "package.json"
    try:
        return str(json.loads(manifest.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def install_package() -> Path:
    """Installs the package into `.cache/npm/` (under a file lock: several runs share the
    checkout) unless it is there already, from the host's network namespace; returns the
    folder. Raises RuntimeError with npm's words when npm cannot (`make test`'s prefetch,
    `registry_prefetch`; tests never call it: they run with the registries off)."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise RuntimeError(
            "node and npm are needed for the PodMonitor schema (apt-get install npm)"
        )
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed_version() != VERSION:
            # From the host's network namespace: the registry is not in the tests'.
            argv, fds = netns.in_host_namespace(
                [npm, "install", "--no-audit", "--no-fund", "--no-save", "--prefix",
                 str(CACHE), "--fetch-timeout=60000", "--fetch-retries=1",
                 f"{PACKAGE}@{VERSION}"]
            )  # fmt: skip
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=INSTALL_SECONDS, pass_fds=fds
            )
            if done.returncode != 0 or _installed_version() != VERSION:
                raise RuntimeError(
                    f"npm install {PACKAGE}@{VERSION} failed ({done.returncode}): "
                    f"{done.stderr.strip()[-500:]}"
                )
        _write_script()
    return CACHE


def _write_script() -> Path:
    script = CACHE / SCRIPT
    if not script.exists() or script.read_text() != VALIDATOR:
        script.write_text(VALIDATOR)
    return script


def install_validator() -> tuple[str, Path]:
    """(node, the validator script), the package installed by `make test`'s prefetch;
    skips (fails under CI) without node or npm, and fails, naming the prefetch, when the
    package is not installed: no test installs it (the registries are off)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        _unavailable("node and npm are needed for the PodMonitor schema (apt-get install npm)")
    assert node is not None
    if _installed_version() != VERSION:
        pytest.fail(str(missing_download(f"the npm package {PACKAGE}@{VERSION}")), pytrace=False)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return node, _write_script()


def podmonitor_errors(objects: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Per object, in order, its schema errors as `<path>: <message>` (empty when valid),
    from one node call."""
    node, script = install_validator()
    done = subprocess.run(
        [node, str(script)], input=json.dumps(list(objects)),
        capture_output=True, text=True, timeout=60, cwd=CACHE,
    )  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"the PodMonitor validator failed: {done.stderr.strip()[-2000:]}")
    return [[_describe(error) for error in errors] for errors in json.loads(done.stdout)]


def _describe(error: dict[str, Any]) -> str:
    """`/spec/podMetricsEndpoints/0/scheme: must be equal to one of the allowed values
    (http, https, HTTP, HTTPS)`: the path in the object, AJV's message, the choices."""
    text = f"{error['path'] or '/'}: {error['message']}"
    allowed = (error.get("params") or {}).get("allowedValues")
    return f"{text} ({', '.join(map(str, allowed))})" if allowed else text


def validate_podmonitor(obj: dict[str, Any]) -> None:
    """Raises AssertionError listing every schema error of `obj` (a whole PodMonitor,
    apiVersion and kind included); returns None when it is valid."""
    (errors,) = podmonitor_errors([obj])
    if errors:
        name = (obj.get("metadata") or {}).get("name", "?")
        raise AssertionError(
            f"PodMonitor {name} does not match the prometheus-operator v0.90.1 schema:\n  "
            + "\n  ".join(errors)
        )
