"""`kubeinfer render FILE`: golden YAML for each example manifest, every rendered object
valid against the Kubernetes 1.33 schemas and the newest kubernetes-validate has (strict:
an unknown field fails), and clear errors for bad input.

Regenerate the golden files after an intended change with
`KUBEINFER_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/operator/commands/test_render.py`,
then review the diff.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from decide_scenarios import validate_kubernetes
from kubeinfer.cli.main import main
from kubeinfer.operator.commands.render import render_file, run
from kubeinfer.operator.state import names

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
GOLDEN = ROOT / "tests" / "golden"
GOLDEN_EXAMPLES = ["cpu-minimal", "gpu-int8-shadow-autoscale", "pinned"]
DIGEST = "sha256:" + "d" * 64


@pytest.fixture(autouse=True)
def operator_defaults(monkeypatch):
    """The operator's settings come from KUBEINFER_* variables: render with defaults."""
    for variable in list(os.environ):
        if variable.startswith("KUBEINFER_") and variable != "KUBEINFER_UPDATE_GOLDEN":
            monkeypatch.delenv(variable)


def rendered_objects(path: Path, digest: str | None = None) -> list[dict]:
    return [d for d in yaml.safe_load_all(render_file(path, digest)) if d is not None]


@pytest.mark.parametrize("example", GOLDEN_EXAMPLES)
def test_render_matches_the_golden_file(example):
    text = render_file(EXAMPLES / f"{example}.yaml")
    golden = GOLDEN / f"render-{example}.yaml"
    if os.environ.get("KUBEINFER_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"{golden} is missing: run with KUBEINFER_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), (
        f"render of examples/{example}.yaml differs from {golden.name}; if intended, "
        "regenerate with KUBEINFER_UPDATE_GOLDEN=1 and review the diff"
    )


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_rendered_object_is_valid_kubernetes(path):
    objects = rendered_objects(path)
    assert objects
    for obj in objects:
        validate_kubernetes(obj)  # 1.33, the oldest release we target
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
        meta = obj["metadata"]
        (owner,) = meta["ownerReferences"]
        assert owner["kind"] == "InferenceDeployment" and owner["controller"] is True
        assert owner["blockOwnerDeletion"] is True
        assert {
            names.LABEL_NAME,
            names.LABEL_INSTANCE,
            names.LABEL_MANAGED_BY,
            names.LABEL_VERSION,
        } <= set(meta["labels"])
        assert names.ANNOTATION_INPUT_HASH in meta["annotations"]
        assert len(meta["name"]) <= 63


def test_a_built_engine_renders_a_job_and_the_runtime_that_serves_its_digest():
    objects = rendered_objects(EXAMPLES / "cpu-minimal.yaml", DIGEST)
    assert [o["kind"] for o in objects] == [
        "PersistentVolumeClaim",
        "Job",
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ]
    data = {key: value for o in objects for key, value in (o.get("data") or {}).items()}
    config = yaml.safe_load(data["runtime.yaml"])
    assert "mirror.yaml" not in data, "no candidate: no mirror file (the runtime's is optional)"
    assert config["engine"] == {"digest": DIGEST, "cacheDirectory": "/cache"}
    assert config["modelName"] == "resnet"


def test_a_pinned_engine_renders_no_job_and_no_claim_for_an_existing_cache():
    objects = rendered_objects(EXAMPLES / "pinned.yaml")
    assert [o["kind"] for o in objects] == [
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ]


def test_the_cli_prints_the_yaml_stream(capsys):
    assert main(["render", str(EXAMPLES / "pinned.yaml"), "--engine-digest", DIGEST]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Children of InferenceDeployment default/detector-pinned")
    assert [d["kind"] for d in yaml.safe_load_all(out) if d] == [
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            "kind: Deployment\napiVersion: apps/v1\n",
            "kind: expected apiVersion kubeinfer.io/v1alpha1",
        ),
        ("a: [1\n", "YAML syntax error"),
        ("", "no YAML document"),
    ],
    ids=["another kind", "yaml syntax", "empty"],
)
def test_bad_input_is_reported_with_exit_status_1(tmp_path, content, expected):
    path = tmp_path / "manifest.yaml"
    path.write_text(content)
    out, err = io.StringIO(), io.StringIO()
    assert run(path, None, out, err) == 1
    assert expected in err.getvalue() and out.getvalue() == ""


def test_an_invalid_manifest_names_the_field(tmp_path):
    document = yaml.safe_load((EXAMPLES / "cpu-minimal.yaml").read_text())
    document["spec"]["runtime"]["batching"]["maxBatchSize"] = 64
    path = tmp_path / "too-big.yaml"
    path.write_text(yaml.safe_dump(document))
    err = io.StringIO()
    assert run(path, None, io.StringIO(), err) == 1
    assert "spec.runtime.batching.maxBatchSize" in err.getvalue()


def test_a_missing_file_and_a_malformed_digest_are_refused(tmp_path):
    err = io.StringIO()
    assert run(tmp_path / "absent.yaml", None, io.StringIO(), err) == 1
    assert "cannot read" in err.getvalue()
    err = io.StringIO()
    assert run(EXAMPLES / "pinned.yaml", "sha256:xyz", io.StringIO(), err) == 2
    assert "--engine-digest" in err.getvalue()


def test_the_schema_check_is_strict_so_an_unknown_field_fails():
    (service,) = [o for o in rendered_objects(EXAMPLES / "pinned.yaml") if o["kind"] == "Service"]
    service["spec"]["selectr"] = service["spec"].pop("selector")
    with pytest.raises(kubernetes_validate.ValidationError, match="selectr"):
        validate_kubernetes(service)


def test_every_document_of_a_multi_document_file_is_rendered(tmp_path):
    texts = [(EXAMPLES / name).read_text() for name in ("pinned.yaml", "cpu-minimal.yaml")]
    path = tmp_path / "both.yaml"
    path.write_text("---\n".join(texts))
    text = render_file(path, DIGEST)
    assert "default/detector-pinned (both.yaml[0])" in text
    assert "default/resnet-cpu (both.yaml[1])" in text
    owners = {d["metadata"]["ownerReferences"][0]["name"] for d in yaml.safe_load_all(text) if d}
    assert owners == {"detector-pinned", "resnet-cpu"}
