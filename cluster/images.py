"""The images a real node runs, as OCI archives its containerd imports (`ctr images
import`): the project's own, built from the Dockerfile (`ensure_project_images`), and small
images of one static binary each (`ensure_binary_image`: pause, CoreDNS,
local-path-provisioner).

Archives live in `$XDG_CACHE_HOME/kubeinfer/images/`, named by the image reference and the
image's ID (its content digest), beside a record of the hash of the inputs that made them.
A call whose inputs hash as recorded returns the archives without running podman; otherwise
podman builds (reusing its cached layers: a source change rebuilds the project's layer
only) and an image whose ID changed is exported again. Builds run one at a time per
machine (a lock), so test workers and `make images` can start together.

The project's images are built on the Debian base of `debian_base` unless a PYTHON_BASE is
given (the stages that install Debian packages on its builder twin, the base with apt:
BUILD_BASE); the context is the source checkout, the files `.dockerignore` lets in, which are
also what is hashed. `make images` runs `python -m kubeinfer.cluster.images`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from kubeinfer.cluster import debian_base
from kubeinfer.cluster.gobuild import BuildError, cache_root, say
from kubeinfer.cluster.podman import Podman, Progress

SOURCE_ROOT = Path(__file__).resolve().parents[1]
"""The checkout holding the Dockerfile (this module is `cluster/images.py` in it)."""
VERSION = "0.1.0"
ARCHIVES_KEPT = 3
"""Archives kept per image: a cluster of another checkout may be importing an older one."""
RUNTIME_IMAGE = f"ghcr.io/kubeinfer/kubeinfer-runtime:{VERSION}"
OPERATOR_IMAGE = f"ghcr.io/kubeinfer/kubeinfer-operator:{VERSION}"
PROJECT_IMAGES = {RUNTIME_IMAGE: "runtime", OPERATOR_IMAGE: "operator"}
"""Each image as the operator and the chart name it, and the Dockerfile's target for it."""
PIP_CERT_INSIDE = "/run/kubeinfer-pip-cert.pem"
"""Where a build sees the host's pip CA bundle (mounted for its RUN steps only)."""


def images_directory() -> Path:
    return cache_root() / "images"


def ensure_project_images(
    progress: Progress = say, python_base: str | None = None, root: Path = SOURCE_ROOT
) -> dict[str, Path]:
    """Image reference -> OCI archive of each of `PROJECT_IMAGES`, built from `root`'s
    Dockerfile on `python_base` (default: the Debian base) where missing or stale."""
    pins = root / "requirements" / "debian-base.txt"
    base = python_base or debian_base.reference(debian_base.read_pins(pins))
    build_base = python_base or debian_base.reference(debian_base.read_pins(pins), builder=True)
    bases = (base, build_base)
    files = context_files(root)
    inputs = {ref: inputs_hash(root, files, target, f"{base}\0{build_base}")
              for ref, target in PROJECT_IMAGES.items()}  # fmt: skip
    found = {ref: recorded_archive(ref, inputs[ref]) for ref in PROJECT_IMAGES}
    if all(found.values()):
        return {ref: archive for ref, archive in found.items() if archive}
    with build_lock():
        found = {ref: recorded_archive(ref, inputs[ref]) for ref in PROJECT_IMAGES}
        missing = [ref for ref, archive in found.items() if archive is None]
        podman = Podman(progress) if missing else None
        if podman and python_base is None:
            debian_base.ensure_base(podman, pins, progress, images_directory())
            debian_base.ensure_base(podman, pins, progress, images_directory(), builder=True)
        for ref in missing:
            assert podman is not None
            target = PROJECT_IMAGES[ref]
            found[ref] = _build_project_image(podman, root, ref, target, bases, inputs[ref])
    return {ref: archive for ref, archive in found.items() if archive}


def ensure_binary_image(
    reference: str,
    binary: Path,
    entrypoint: list[str],
    user: int | None = 65532,
    progress: Progress = say,
) -> Path:
    """The OCI archive of an image `FROM scratch` holding only `binary`, at
    `/<its file name>`, run as `entrypoint` by `user` (None: root); built and exported
    unless the same binary, entrypoint and user made the recorded archive."""
    digest = hashlib.sha256()
    with binary.open("rb") as data:
        for chunk in iter(lambda: data.read(1 << 20), b""):
            digest.update(chunk)
    inputs = hashlib.sha256(repr((reference, digest.hexdigest(), entrypoint, user)).encode())
    found = recorded_archive(reference, inputs.hexdigest())
    if found:
        return found
    with build_lock(), tempfile.TemporaryDirectory(dir=images_directory()) as folder:
        found = recorded_archive(reference, inputs.hexdigest())  # built while we waited
        if found:
            return found
        context = Path(folder)
        shutil.copyfile(binary, context / binary.name)
        (context / binary.name).chmod(0o555)
        lines = ["FROM scratch", f"COPY {binary.name} /{binary.name}"]
        lines += [f"USER {user}:{user}"] if user is not None else []
        lines.append(f"ENTRYPOINT {json.dumps(entrypoint)}")
        (context / "Containerfile").write_text("\n".join(lines) + "\n")
        podman = Podman(progress)
        log = images_directory() / f"{slug(reference)}.build.log"
        arguments = ["--network", "none", "--file", str(context / "Containerfile"),
                     "--tag", reference, str(context)]  # fmt: skip
        progress(f"building {reference} from {binary}")
        podman.build(arguments, reference, log)
        return _export(podman, reference, inputs.hexdigest())


def _build_project_image(
    podman: Podman, root: Path, reference: str, target: str, bases: tuple[str, str],
    inputs: str,
) -> Path:  # fmt: skip
    """`bases`: the images' base (PYTHON_BASE) and the builder stages' (BUILD_BASE)."""
    log = images_directory() / f"{slug(reference)}.build.log"
    arguments = ["--network", "host", "--target", target, "--tag", reference,
                 "--build-arg", f"PYTHON_BASE={bases[0]}",
                 "--build-arg", f"BUILD_BASE={bases[1]}", *pip_settings(),
                 "--file", str(root / "Dockerfile"), str(root)]  # fmt: skip
    progress = podman.progress
    progress(f"building {reference} (the Dockerfile's {target} target) with podman; its "
             "dependencies' layer is downloaded only when new or its lock changed")  # fmt: skip
    podman.build(arguments, reference, log)
    return _export(podman, reference, inputs)


def _export(podman: Podman, reference: str, inputs: str) -> Path:
    """The image's archive (exported unless one of this image ID is there), recorded as
    made by `inputs`; the reference's older archives beyond the newest few are removed."""
    image_id = podman.image_id(reference)
    if image_id is None:
        raise BuildError(f"podman built {reference} but does not find it")
    archive = images_directory() / f"{slug(reference)}-{image_id[:12]}.oci.tar"
    if not archive.exists():
        podman.export(reference, archive)
    archive.touch()  # the newest, for the pruning below
    mine = re.compile(re.escape(slug(reference)) + r"-[0-9a-f]{12}\.oci\.tar")
    kept = sorted(
        (p for p in images_directory().iterdir() if mine.fullmatch(p.name)),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    # A few are kept, not one: another checkout's cluster may be importing its own.
    for old in kept[ARCHIVES_KEPT:]:
        old.unlink(missing_ok=True)
    record = {"inputs": inputs, "image_id": image_id, "archive": archive.name}
    _record_path(reference).write_text(json.dumps(record, indent=2) + "\n")
    return archive


def recorded_archive(reference: str, inputs: str) -> Path | None:
    """The archive recorded for `reference` if `inputs` made it and it is still there."""
    try:
        record = json.loads(_record_path(reference).read_text())
    except (OSError, ValueError):
        return None
    archive = images_directory() / str(record.get("archive", ""))
    return archive if record.get("inputs") == inputs and archive.is_file() else None


def _record_path(reference: str) -> Path:
    return images_directory() / f"{slug(reference)}.json"


def slug(reference: str) -> str:
    """A file name for an image reference (`ghcr.io/a/b:1` -> `ghcr.io_a_b_1`)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", reference)


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """One image build at a time on this machine, whatever the cache folder: podman's
    storage is the machine's, and a build retags the image another build would export."""
    images_directory().mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.gettempdir()) / f"kubeinfer-images-{os.getuid()}.lock"
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# --- the build's inputs ------------------------------------------------------------------


def context_files(root: Path) -> list[Path]:
    """The files of the build context, as `.dockerignore` (an allowlist) lets them in."""
    rules = [line.strip() for line in (root / ".dockerignore").read_text().splitlines()]
    rules = [rule for rule in rules if rule and not rule.startswith("#")]
    unknown = [r for r in rules[1:] if not r.startswith(("!", "**/"))]
    if rules[:1] != ["*"] or unknown or any("*" in r for r in rules if r.startswith("!")):
        raise BuildError(f"{root / '.dockerignore'}: only `*`, then `!path` and `**/name` "
                         f"lines are understood here: {unknown or rules[:1]}")  # fmt: skip
    excluded = [rule[3:] for rule in rules if rule.startswith("**/")]
    files: list[Path] = []
    for included in (rule[1:].strip("/") for rule in rules if rule.startswith("!")):
        top = root / included
        for path in sorted(top.rglob("*")) if top.is_dir() else [top]:
            parts = path.relative_to(root).parts
            if path.is_file() and not any(
                fnmatch.fnmatch(part, pattern) for part in parts for pattern in excluded
            ):
                files.append(path)
    return files


def inputs_hash(root: Path, files: Sequence[Path], target: str, base: str) -> str:
    """A hash of what makes an image: the Dockerfile, the context's files (names, modes
    and contents), the target and the base."""
    digest = hashlib.sha256(f"{target}\0{base}\0".encode())
    for path in [root / "Dockerfile", root / ".dockerignore", *files]:
        executable = os.access(path, os.X_OK)
        digest.update(f"{path.relative_to(root)}\0{executable}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def pip_settings() -> list[str]:
    """Build arguments (and the mount) giving the build the host's CA bundle and index
    for pip, where the host has them (a proxy that re-signs TLS, a mirror)."""
    arguments: list[str] = []
    cert = os.environ.get("PIP_CERT") or _pip_config("global.cert")
    if cert and Path(cert).is_file():
        arguments += ["--volume", f"{cert}:{PIP_CERT_INSIDE}:ro",
                      "--build-arg", f"PIP_CERT={PIP_CERT_INSIDE}"]  # fmt: skip
    index = os.environ.get("PIP_INDEX_URL") or _pip_config("global.index-url")
    if index:
        arguments += ["--build-arg", f"PIP_INDEX_URL={index}"]
    return arguments


def _pip_config(key: str) -> str | None:
    result = subprocess.run([sys.executable, "-m", "pip", "config", "get", key],
                            capture_output=True, text=True, check=False)  # fmt: skip
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kubeinfer.cluster.images",
        description="Builds the operator and runtime images with podman and exports them "
        f"as OCI archives under {images_directory()} (see docs/images.md).",
    )
    parser.add_argument(
        "--python-base",
        help="build on this image instead of the Debian base (e.g. the Dockerfile's "
        "python:3.11-slim, where a registry is reachable)",
    )
    parser.add_argument(
        "--pin-base",
        action="store_true",
        help="rebuild the Debian base of the newest packages and pin them in "
        "requirements/debian-base.txt",
    )
    parser.add_argument(
        "--source",
        type=Path,
        default=SOURCE_ROOT,
        help="the checkout to build (default: this module's, %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        if args.pin_base:
            with build_lock():
                pins = args.source / "requirements" / "debian-base.txt"
                debian_base.pin_base(Podman(say), pins, say, images_directory())
        built = ensure_project_images(python_base=args.python_base, root=args.source.resolve())
        for reference, archive in built.items():
            print(f"{reference} {archive}")
    except BuildError as error:
        say(str(error))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
