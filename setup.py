"""Package discovery for the remapped layout; all metadata lives in pyproject.toml.

setuptools cannot discover subpackages below a `package-dir` mapping from pyproject.toml
alone, so every package under `operator/` and `runtime/` is found here and published as
`kubeinfer.operator.*` and `kubeinfer.runtime.*`.
"""

from setuptools import find_packages, setup

PACKAGES = {
    "kubeinfer.operator": "operator",
    "kubeinfer.runtime": "runtime",
    "kubeinfer.cluster": "cluster",
    "kubeinfer.cli": "cli",
    "kubeinfer.contract": "contract",
}
DATA_PACKAGES = ["kubeinfer.cli.demo.examples"]
"""Folders of package data only (`examples/`, mapped in pyproject.toml's package-dir)."""

setup(
    packages=[
        name
        for package, folder in PACKAGES.items()
        for name in (package, *(f"{package}.{sub}" for sub in find_packages(folder)))
    ]
    + DATA_PACKAGES,
)
