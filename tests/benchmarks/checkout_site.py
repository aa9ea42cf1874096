"""Another checkout's packages under the import name `kubeinfer`, for a benchmark that
runs a process of an earlier version beside this one (before against after, one run).

`baseline_checkout(rev)` checks a commit out beside this one (a detached `git worktree`
under `.bench/baseline-<rev>`); `package_links` makes a folder for PYTHONPATH in which
`kubeinfer` is that checkout's packages (pyproject maps the package's subpackages to the
repository's top-level folders: a link to each). A process started with that folder first
on PYTHONPATH, by this venv's Python, imports the checkout's `kubeinfer`: the venv's
editable install is a meta-path finder placed after the path's own, so it answers only
for what the folder lacks. `imports_from` checks that in a child process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGES = ("runtime", "contract", "cli", "operator", "cluster")
"""The top-level folders pyproject's package-dir maps to `kubeinfer.<folder>`."""

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BASELINE = "c80431e"
"""The last commit whose `kubeinfer serve` defaults to the Python data plane."""


def package_links(checkout: Path, workdir: Path) -> Path:
    """A folder for PYTHONPATH in which `kubeinfer` is `checkout`'s packages (the layout
    pyproject's package-dir maps), so a process runs another version of them: a
    `git archive COMMIT <packages> | tar -x -C DIR` or a worktree."""
    site = workdir / f"site-{checkout.name}"
    package = site / "kubeinfer"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").touch()
    for folder in PACKAGES:
        link = package / folder
        if link.is_symlink():
            link.unlink()
        if (checkout / folder).is_dir():
            link.symlink_to(checkout.resolve() / folder)
    return site


def _git(*args: str, cwd: Path = REPO) -> str:
    done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def baseline_checkout(rev: str, repo: Path = REPO) -> Path:
    """`rev` checked out beside this checkout: a detached `git worktree` of the repository
    this file lives in at `.bench/baseline-<short commit>`, made once and reused (when it
    is at that commit). A directory given instead of a revision (a checkout or a
    `git archive` of the packages, say on a machine without the repository) is used as
    it is."""
    given = Path(rev)
    if given.is_dir():
        return given.resolve()
    commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}", cwd=repo)
    place = repo / ".bench" / f"baseline-{_git('rev-parse', '--short', commit, cwd=repo)}"
    if place.is_dir():
        at = _git("rev-parse", "HEAD", cwd=place)
        if at != commit:
            raise RuntimeError(f"{place} is at {at[:12]}, not {rev}: remove it to remake it")
        return place
    place.parent.mkdir(parents=True, exist_ok=True)
    _git("worktree", "prune", cwd=repo)  # a worktree removed by hand is still registered
    _git("worktree", "add", "--detach", str(place), commit, cwd=repo)
    return place


def imports_from(site: Path, checkout: Path, python: str = sys.executable) -> str:
    """Checks that `python` with `site` first on PYTHONPATH imports `kubeinfer` from
    `site` and its runtime and command line from `checkout` (their `__file__`s, links
    resolved, printed by a child); returns what it printed. Raises RuntimeError where
    they come from elsewhere."""
    modules = "kubeinfer, kubeinfer.runtime, kubeinfer.cli"
    if (site / "kubeinfer_dataplane").is_dir():  # the checkout's own build (extension_into)
        modules += ", kubeinfer_dataplane"
    code = (
        f"import os, {modules}\n"
        f"for m in ({modules}):\n"
        "    print(m.__name__, os.path.realpath(m.__file__ or list(m.__path__)[0]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=site)
    if done.returncode != 0:
        raise RuntimeError(f"{python} cannot import kubeinfer from {site}: {done.stderr[-600:]}")
    for line in done.stdout.splitlines():
        name, path = line.split(" ", 1)
        own = name in ("kubeinfer", "kubeinfer_dataplane")
        root = site.resolve() if own else checkout.resolve()
        if not Path(path).is_relative_to(root):
            raise RuntimeError(f"{name} imports from {path}, not from under {root}")
    return done.stdout.strip()


def extension_into(checkout: Path, site: Path, python: str = sys.executable) -> Path | None:
    """`checkout`'s own Rust data plane (`kubeinfer_dataplane`, built by maturin from its
    `runtime/native`, release, its Cargo.lock) unpacked into `site`, so that a process with
    `site` first on PYTHONPATH serves through that build and not this venv's; None for a
    checkout without one. Cargo's target folder is this checkout's, so only the crates
    that differ are compiled again."""
    manifest = checkout / "runtime" / "native" / "crates" / "python" / "Cargo.toml"
    if not manifest.is_file():
        return None
    wheels = site.parent / f"wheels-{checkout.name}"
    maturin = Path(python).parent / "maturin"
    env = {**os.environ, "CARGO_TARGET_DIR": str(REPO / "runtime" / "native" / "target")}
    print(f"building {checkout.name}'s kubeinfer_dataplane (maturin, release)", flush=True)
    subprocess.run(
        [str(maturin), "build", "--quiet", "--release", "--locked", "-o", str(wheels),
         "-m", str(manifest), "--interpreter", python],
        check=True, env=env, cwd=manifest.parent,
    )  # fmt: skip
    wheel = max(wheels.glob("kubeinfer_dataplane-*.whl"), key=lambda w: w.stat().st_mtime)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site / "kubeinfer_dataplane"


def data_plane_flags(checkout: Path, plane: str) -> tuple[str, ...]:
    """The `kubeinfer serve` flags that serve `checkout`'s runtime on `plane` (python or
    rust): `--data-plane PLANE` where that runtime has both (and the flag), none where it
    has only that one. Raises ValueError where it lacks `plane`."""
    runtime = checkout / "runtime"
    has = {"python": (runtime / "serving.py").is_file(),
           "rust": (runtime / "rust_dataplane.py").is_file()}  # fmt: skip
    if not has[plane]:
        raise ValueError(f"{checkout} has no {plane} data plane")
    return ("--data-plane", plane) if all(has.values()) else ()
