"""Podman, the way `kubeinfer.cluster.images` drives it: Debian's podman with runc (crun
does not start containers on the development machines), builds with progress, and images
exported as OCI archives that containerd's `ctr images import` reads.

The host's network namespace is never touched: a build's RUN steps share the host's
network (`--network host`: no namespace, no bridge, no firewall rule), and nothing here
runs a container on podman's default bridge network. Callers that run containers pass
`--network none` or `--network host` themselves.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kubeinfer.cluster import debian_packages
from kubeinfer.cluster.gobuild import BuildError

PACKAGES = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap"}
"""Each program the images need from Debian, and the package that ships it."""

Progress = Callable[[str], None]


def ensure_programs(programs: Sequence[str], progress: Progress) -> dict[str, str]:
    """The path of each of `programs` (keys of `PACKAGES`), installing the missing ones'
    packages with apt-get as root (`debian_packages`); BuildError naming them where that
    cannot be done."""
    wanted = {name: PACKAGES[name] for name in programs}
    found = debian_packages.ensure_programs(wanted, "building the images", progress)
    return {name: str(path) for name, path in found.items()}


class Podman:
    """podman with runc, whatever containers.conf says (crun may be installed beside it)."""

    def __init__(self, progress: Progress) -> None:
        programs = ensure_programs(["podman", "runc"], progress)
        self.argv = [programs["podman"], "--runtime", programs["runc"]]
        self.progress = progress

    def run(self, *arguments: str, timeout: float = 600) -> str:
        """podman's output of `arguments`; BuildError with its message if it fails."""
        result = subprocess.run([*self.argv, *arguments], capture_output=True, text=True,
                                timeout=timeout, check=False)  # fmt: skip
        if result.returncode != 0:
            raise BuildError(f"podman {' '.join(arguments[:2])} failed: {result.stderr[-2000:]}")
        return result.stdout

    def image_id(self, reference: str) -> str | None:
        """The image's ID (its config's digest, without `sha256:`), None when absent."""
        result = subprocess.run([*self.argv, "image", "inspect", "--format", "{{.Id}}", reference],
                                capture_output=True, text=True, check=False)  # fmt: skip
        if result.returncode != 0:
            return None
        return result.stdout.strip() or None

    def build(self, arguments: Sequence[str], what: str, log: Path) -> None:
        """`podman build arguments`, its output in `log`, each step said as it starts."""
        started = time.monotonic()
        argv = [*self.argv, "build", "--layers", *arguments]
        if run_logged(argv, log, self.progress, _step) != 0:
            raise BuildError(f"building {what} failed (full log: {log}):\n{tail(log)}")
        self.progress(f"built {what} in {_elapsed(started)}")

    def export(self, reference: str, archive: Path) -> None:
        """Writes the image as an OCI archive (uncompressed layers: quick to write and to
        import on the same machine), whole or not at all."""
        partial = archive.with_name(f".{archive.name}.partial")
        partial.unlink(missing_ok=True)
        started = time.monotonic()
        self.run("save", "--quiet", "--uncompressed", "--format", "oci-archive",
                 "--output", str(partial), reference)  # fmt: skip
        partial.replace(archive)
        size = archive.stat().st_size / 2**20
        self.progress(f"exported {reference} to {archive} ({size:.0f} MiB, {_elapsed(started)})")


def run_logged(
    argv: Sequence[str],
    log: Path,
    progress: Progress,
    shown: Callable[[str], str | None],
    env: dict[str, str] | None = None,
) -> int:
    """Runs `argv` with its output in `log`, saying the lines `shown` picks (as it words
    them) while it runs; its exit status."""
    with (
        log.open("w") as output,
        subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=env,
        ) as process,  # fmt: skip
    ):
        assert process.stdout is not None
        for line in process.stdout:
            output.write(line)
            said = shown(line)
            if said:
                progress(said)
    return process.returncode


def tail(log: Path, lines: int = 30) -> str:
    return "".join(log.read_text(errors="replace").splitlines(keepends=True)[-lines:])


def _step(line: str) -> str | None:
    """podman build's `[2/9] STEP 3/5: RUN ...` lines, shortened."""
    if " STEP " not in line and not line.startswith("STEP "):
        return None
    step = line.strip()
    return f"  {step[:110]}{'...' if len(step) > 110 else ''}"


def _elapsed(started: float) -> str:
    minutes, seconds = divmod(int(time.monotonic() - started), 60)
    return f"{minutes}m{seconds:02d}s"
