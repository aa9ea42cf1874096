"""The Python base image made from Debian's packages, for machines that reach Debian's
mirror but no image registry: Debian 12 (bookworm) by mmdebstrap, its `essential` variant
plus `PACKAGES` (Python 3.11 with venv and the `python` name, CA certificates, libstdc++
for ONNX Runtime, netbase and tzdata as the official python:3.11-slim has them), without
manuals, documentation or translations. The Dockerfile builds on it through its
PYTHON_BASE argument as it builds on python:3.11-slim elsewhere.

Pinned by `requirements/debian-base.txt`: every package of the base at its version, asked
of apt at priority 1001. Debian's mirrors keep only a suite's newest versions, so a pin the
mirror no longer has is installed at the mirror's version and the difference is said;
`python -m kubeinfer.cluster.images --pin-base` rewrites the pins from a base of the
newest packages. SOURCE_DATE_EPOCH is fixed, so the same packages give the same bytes.
Built once per machine: the image is named by a hash of all of the above.

Its builder twin (`builder=True`) is the same base with apt (`BUILDER_PACKAGES`): the
Dockerfile's stages that install Debian packages (the Rust toolchain of its `rust-tools`
stage) build on it, as they would on python:3.11-slim, which has apt; no image ships it.
apt and what it alone needs are the mirror's newest, unpinned; the rest is the base's pins.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path

from kubeinfer.cluster.gobuild import BuildError
from kubeinfer.cluster.podman import Podman, Progress, ensure_programs, run_logged, tail

SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates", "libstdc++6",
            "netbase", "tzdata")  # fmt: skip
SOURCES = (
    f"deb http://deb.debian.org/debian {SUITE} main",
    f"deb http://deb.debian.org/debian {SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {SUITE}-security main",
)
DPKG_OPTIONS = tuple(
    f"--dpkgopt=path-{rule}"
    for rule in ("exclude=/usr/share/man/*", "exclude=/usr/share/info/*",
                 "exclude=/usr/share/locale/*", "include=/usr/share/locale/locale.alias",
                 "exclude=/usr/share/doc/*", "include=/usr/share/doc/*/copyright")
)  # fmt: skip
"""Left out of the base, as Debian's own slim images do; the copyright files stay."""
SOURCE_DATE_EPOCH = "1735689600"
"""A fixed time (2025-01-01) for the files mmdebstrap writes, so the tarball is reproducible."""
REPOSITORY = "localhost/kubeinfer/python-base"
BUILDER_PACKAGES = ("apt",)
BUILDER_REPOSITORY = "localhost/kubeinfer/python-build-base"


def packages(builder: bool = False) -> tuple[str, ...]:
    """The packages asked for: the base's, and apt for the builder's."""
    return PACKAGES + BUILDER_PACKAGES if builder else PACKAGES


def read_pins(path: Path) -> dict[str, str]:
    """package -> version from `path` (`package=version` lines; `#` comments)."""
    if not path.exists():
        return {}
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return dict(line.split("=", 1) for line in lines if line)


def write_pins(path: Path, packages: dict[str, str]) -> None:
    header = ("# The Debian base's packages at their versions (kubeinfer.cluster.debian_base);\n"
              "# rewritten by `python -m kubeinfer.cluster.images --pin-base`.\n")  # fmt: skip
    path.write_text(header + "".join(f"{name}={packages[name]}\n" for name in sorted(packages)))


def reference(pins: dict[str, str], builder: bool = False) -> str:
    """The base's image name (the builder's, `builder`): its suite and a hash of
    everything that makes it."""
    made_of = (SUITE, packages(builder), SOURCES, DPKG_OPTIONS, SOURCE_DATE_EPOCH,
               sorted(pins.items()))  # fmt: skip
    digest = hashlib.sha256(repr(made_of).encode()).hexdigest()
    return f"{BUILDER_REPOSITORY if builder else REPOSITORY}:{SUITE}-{digest[:12]}"


def preferences(pins: dict[str, str]) -> str:
    """apt preferences holding each package at its pinned version."""
    return "".join(
        f"Package: {name}\nPin: version {version}\nPin-Priority: 1001\n\n"
        for name, version in sorted(pins.items())
    )


def drift(pins: dict[str, str], installed: dict[str, str]) -> list[str]:
    """The packages installed at another version than pinned (or unpinned), as lines."""
    return [
        f"{name} {pins.get(name, '(unpinned)')} -> {version}"
        for name, version in sorted(installed.items())
        if pins.get(name) != version
    ]


def ensure_base(
    podman: Podman, pins_file: Path, progress: Progress, work: Path, builder: bool = False
) -> str:
    """The base's reference (the builder's, `builder`), built and imported into podman
    unless it is there already."""
    pins = read_pins(pins_file)
    name = reference(pins, builder)
    if podman.image_id(name) is None:
        installed = build_base(podman, pins, name, progress, work, builder)
        changed = [line for line in drift(pins, installed)
                   if not builder or "(unpinned)" not in line]  # fmt: skip
        if changed:
            progress(f"{len(changed)} of the base's packages are not at the versions of "
                     f"{pins_file} (the mirror has moved on; `python -m "
                     f"kubeinfer.cluster.images --pin-base` takes the new ones): "
                     + "; ".join(changed[:8]) + ("; ..." if len(changed) > 8 else ""))  # fmt: skip
    return name


def pin_base(podman: Podman, pins_file: Path, progress: Progress, work: Path) -> str:
    """Builds a base of the newest packages, writes them as the pins, and names it as the
    pinned base (the same packages at the same versions); its reference."""
    installed = build_base(podman, {}, f"{REPOSITORY}:newest", progress, work)
    write_pins(pins_file, installed)
    name = reference(installed)
    podman.run("tag", f"{REPOSITORY}:newest", name)
    podman.run("rmi", f"{REPOSITORY}:newest")
    progress(f"pinned {len(installed)} packages in {pins_file}")
    return name


def build_base(podman: Podman, pins: dict[str, str], name: str, progress: Progress,
               work: Path, builder: bool = False) -> dict[str, str]:  # fmt: skip
    """mmdebstrap's tarball of the base (the builder's, `builder`), imported into podman
    as `name`; the installed packages and their versions."""
    mmdebstrap = ensure_programs(["mmdebstrap"], progress)["mmdebstrap"]
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="debian-base-", dir=work) as folder:
        prefs, manifest, tarball = (Path(folder) / n for n in ("pins.pref", "packages", "base.tar"))
        prefs.write_text(preferences(pins))
        listing = "chroot \"$1\" dpkg-query --show --showformat='${Package}=${Version}\\n'"
        included = ",".join(packages(builder))
        argv = [mmdebstrap, "--variant=essential", f"--include={included}",
                *DPKG_OPTIONS, f"--aptopt=Dir::Etc::Preferences \"{prefs}\"",
                f"--customize-hook={listing} > {manifest}",
                SUITE, str(tarball), *SOURCES]  # fmt: skip
        what = "builder's base (the base with apt)" if builder else "base"
        progress(f"making the Debian {SUITE} {what} with mmdebstrap (once per machine, a "
                 "few minutes): Python 3.11 from Debian's packages")  # fmt: skip
        log = Path(folder) / "mmdebstrap.log"
        env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
        if run_logged(argv, log, progress, _said, env) != 0:
            raise BuildError(f"mmdebstrap failed:\n{tail(log)}")
        podman.run("import", "--quiet", "--change", "ENV LANG=C.UTF-8",
                   "--change", 'CMD ["python3"]', str(tarball), name)  # fmt: skip
        installed = read_pins(manifest)
    minutes, seconds = divmod(int(time.monotonic() - started), 60)
    progress(f"made the base {name} ({len(installed)} packages) in {minutes}m{seconds:02d}s")
    return installed


def _said(line: str) -> str | None:
    """mmdebstrap's steps (its `I:` lines)."""
    return f"  {line[3:].strip()}" if line.startswith("I: ") else None
