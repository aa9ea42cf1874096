"""Which images the node runs and as what (`kubeinfer.cluster.node.images`): an image is
known by its repository whatever its tag or digest; an unknown one fails with the
kubelet's pull-error wording; the argv is composed as a container runtime composes it
(`command` replaces the entrypoint and drops CMD, `args` replace CMD); and the known
images' ENTRYPOINT, CMD and ENV are the Dockerfile's, target by target (a drift test: a
Dockerfile change that the node would not mirror fails here)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.cluster.node.images import (
    KNOWN_IMAGES,
    ImageConfig,
    UnknownImage,
    container_argv,
    image_config,
    repository,
)

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = "ghcr.io/kubeinfer/kubeinfer-runtime"
DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        (f"{RUNTIME}:0.1.0", RUNTIME),
        (RUNTIME, RUNTIME),
        (f"{RUNTIME}@{DIGEST}", RUNTIME),
        (f"{RUNTIME}:0.1.0@{DIGEST}", RUNTIME),
        ("localhost:5000/app", "localhost:5000/app"),  # a registry's port is not a tag
        ("localhost:5000/app:1.2", "localhost:5000/app"),
        ("busybox:1.36", "busybox"),
    ],
)
def test_repository_drops_tag_and_digest(image: str, expected: str) -> None:
    assert repository(image) == expected


@pytest.mark.parametrize("image", [f"{RUNTIME}:0.1.0", f"{RUNTIME}@{DIGEST}", RUNTIME])
def test_a_known_image_is_known_by_any_tag_or_digest(image: str) -> None:
    assert image_config(image) is KNOWN_IMAGES[RUNTIME]


@pytest.mark.parametrize(
    "image",
    ["nginx:1.27", f"{RUNTIME}-evil:0.1.0", "docker.io/kubeinfer/kubeinfer-runtime:0.1.0", ""],
)
def test_an_unknown_image_fails_as_an_image_pull(image: str) -> None:
    with pytest.raises(UnknownImage) as failed:
        image_config(image)
    assert str(failed.value).startswith(f'Failed to pull image "{image}": ')
    assert RUNTIME in str(failed.value)  # says which images it could have run


def test_an_extra_image_maps_to_a_program() -> None:
    extra = {"busybox": ImageConfig(("/bin/busybox",), ("sh",))}
    assert image_config("busybox:1.36", extra) == extra["busybox"]
    assert container_argv({}, extra["busybox"]) == ["/bin/busybox", "sh"]


SERVE = ImageConfig(("kubeinfer",), ("serve", "--help"))
ARGV = [
    ("neither: entrypoint and CMD", {}, ["kubeinfer", "serve", "--help"]),
    ("args replace CMD", {"args": ["serve", "--port", "8000"]},
     ["kubeinfer", "serve", "--port", "8000"]),
    ("command replaces entrypoint and drops CMD", {"command": ["/bin/sh", "-c", "exit 3"]},
     ["/bin/sh", "-c", "exit 3"]),
    ("command and args", {"command": ["kubeinfer"], "args": ["build", "--help"]},
     ["kubeinfer", "build", "--help"]),
    ("empty args are no args", {"args": []}, ["kubeinfer", "serve", "--help"]),
    ("empty command is no command", {"command": [], "args": ["operator"]},
     ["kubeinfer", "operator"]),
]  # fmt: skip


@pytest.mark.parametrize(("container", "argv"), [c[1:] for c in ARGV], ids=[c[0] for c in ARGV])
def test_container_argv_as_a_runtime_composes_it(
    container: dict[str, Any], argv: list[str]
) -> None:
    assert container_argv(container, SERVE) == argv


def dockerfile_targets() -> dict[str, dict[str, Any]]:
    """Each final stage's ENTRYPOINT, CMD and ENV, read from the Dockerfile (exec form,
    and `ENV K=V ...` on one line, as it writes them)."""
    stages: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] = {}
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if match := re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.I):
            current = stages.setdefault(match.group(1), {"env": {}})
        elif match := re.match(r"(ENTRYPOINT|CMD)\s+(\[.*\])\s*$", line):
            current[match.group(1).lower()] = tuple(json.loads(match.group(2)))
        elif line.startswith("ENV "):
            for pair in line.split()[1:]:
                key, _, value = pair.partition("=")
                current["env"][key] = value
    built = re.findall(r"docker build --target (\S+)", (ROOT / "Dockerfile").read_text())
    assert built, "the Dockerfile's header names no targets"
    return {name: stages[name] for name in built}


def test_known_images_match_the_dockerfile_targets() -> None:
    targets = dockerfile_targets()
    assert set(KNOWN_IMAGES) == {f"ghcr.io/kubeinfer/kubeinfer-{t}" for t in targets}
    for target, stage in targets.items():
        config = KNOWN_IMAGES[f"ghcr.io/kubeinfer/kubeinfer-{target}"]
        assert config.entrypoint == stage["entrypoint"], target
        assert config.cmd == stage["cmd"], target
        # PATH names the image's venv; the node runs its own environment's scripts.
        image_env = {k: v for k, v in stage["env"].items() if k != "PATH"}
        assert dict(config.env) == image_env, target


def test_the_images_the_operator_deploys_are_known() -> None:
    from kubeinfer.operator import settings

    for image in (settings.DEFAULT_RUNTIME_IMAGE, settings.DEFAULT_GPU_RUNTIME_IMAGE):
        assert image_config(image).entrypoint == ("kubeinfer",)
