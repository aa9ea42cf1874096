"""How long `make images` takes, measured apart from the machine's caches: the cold Debian
base (mmdebstrap), the cold image build (every layer, the pinned dependencies downloaded),
the warm call that changes nothing, and the rebuild after a one-line change to a
`runtime/` .py file; then the images' and archives' sizes. A script, not a test.

    .venv/bin/python tests/benchmarks/bench_images.py

It builds a clone of the checkout's HEAD in podman storage of its own (a temporary
storage.conf: the machine's images and layers are neither used nor touched) with a
temporary XDG_CACHE_HOME, and removes both at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kubeinfer.cluster import debian_base, images
from kubeinfer.cluster.gobuild import say
from kubeinfer.cluster.podman import Podman

ROOT = Path(__file__).resolve().parents[2]


def timed(what: str, results: list[tuple[str, str]], action) -> object:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    value = action()
    results.append((what, f"{time.monotonic() - started:.1f} s"))
    say(f"measured {what}: {results[-1][1]}")
    return value


def sizes(
    podman: Podman, label: str, archives: dict[str, Path], results: list[tuple[str, str]]
) -> None:
    for reference, archive in archives.items():
        size = int(podman.run("image", "inspect", "--format", "{{.Size}}", reference)) / 1e6
        written = archive.stat().st_size / 1e6
        results.append((f"{reference} ({label}): image, archive", f"{size:.0f}, {written:.0f} MB"))


def main() -> int:
    argparse.ArgumentParser(description=__doc__).parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-images-"))
    os.environ["XDG_CACHE_HOME"] = str(work / "cache")
    storage = work / "storage.conf"
    storage.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{work}/graph"\n'
                       f'runroot = "{work}/run"\n')  # fmt: skip
    os.environ["CONTAINERS_STORAGE_CONF"] = str(storage)
    clone = work / "kubeinfer"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    results: list[tuple[str, str]] = []
    podman = Podman(say)
    graph = podman.run("info", "--format", "{{.Store.GraphRoot}}").strip()
    if graph != f"{work}/graph":  # never measure in, nor clean up, the machine's storage
        raise SystemExit(f"podman ignored {storage}: its storage is {graph}")
    try:
        pins = clone / "requirements" / "debian-base.txt"
        timed("cold Debian base (mmdebstrap, import)", results,
              lambda: debian_base.ensure_base(podman, pins, say, work / "cache"))  # fmt: skip
        built = timed("cold image build, both images (+ export)", results,
                      lambda: images.ensure_project_images(root=clone))  # fmt: skip
        sizes(podman, "cold", built, results)  # type: ignore[arg-type]
        timed("warm call, nothing changed", results,
              lambda: images.ensure_project_images(root=clone))  # fmt: skip
        source = clone / "runtime" / "rust_dataplane.py"
        source.write_text(source.read_text() + "# a one-line change\n")
        rebuilt = timed("one-line change in runtime/ (both rebuilt, exported)", results,
                        lambda: images.ensure_project_images(root=clone))  # fmt: skip
        sizes(podman, "after the change", rebuilt, results)  # type: ignore[arg-type]
    finally:
        podman.run("rmi", "--all", "--force")
        shutil.rmtree(work, ignore_errors=True)
    width = max(len(what) for what, _ in results)
    print(f"\n{'step'.ljust(width)}  result\n{'-' * width}  ------")
    for what, value in results:
        print(f"{what.ljust(width)}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
