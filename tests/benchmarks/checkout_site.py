"""Another checkout's packages under the import name `kubeinfer`, for a benchmark that
runs a process of an earlier version beside this one (before against after, one run)."""

from __future__ import annotations

from pathlib import Path

PACKAGES = ("runtime", "contract", "cli", "operator", "cluster")
"""The top-level folders pyproject's package-dir maps to `kubeinfer.<folder>`."""


def package_links(checkout: Path, workdir: Path) -> Path:
    """A folder for PYTHONPATH in which `kubeinfer` is `checkout`'s packages (the layout
    pyproject's package-dir maps), so a process runs another version of them: a
    `git archive COMMIT <packages> | tar -x -C DIR` or a worktree."""
    site = workdir / f"site-{checkout.name}"
    package = site / "kubeinfer"
    if not package.exists():
        package.mkdir(parents=True)
        for folder in PACKAGES:
            if (checkout / folder).is_dir():
                (package / folder).symlink_to(checkout.resolve() / folder)
    return site
