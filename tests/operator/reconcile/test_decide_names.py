"""Every name the operator gives a child is valid for any owner name the API accepts: a
property test over owner names (DNS-1035 labels of 1 to 52 characters) that drives
`decide` through a build, a rollout and a shadow candidate and checks every child's name
(a DNS-1123 label of at most 63 characters; a DNS-1035 label for Services) and every
label value; plus the build Job's name at any attempt, and that names which fit are the
ones earlier versions gave (an upgrade renames nothing that was valid)."""

from __future__ import annotations

import re
from datetime import timedelta

from decide_scenarios import DIGEST_A, DIGEST_B, T0, Cluster, make_spec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kubeinfer.operator.api.v1alpha1.metadata import OWNER_NAME_LENGTH, ObjectMeta
from kubeinfer.operator.state import names

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
SHADOW = {"strategy": "Shadow", "shadow": {"minSamples": 50}}

owner_names = st.from_regex(r"\A[a-z]([-a-z0-9]{0,50}[a-z0-9])?\Z").filter(
    lambda name: len(name) <= OWNER_NAME_LENGTH
)


def spec(version: str):
    uri = f"https://models.example.com/mlp-{version}.onnx"
    return make_spec(model={"version": version, "source": {"uri": uri}}, rollout=SHADOW)


def every_child(owner: str) -> list[dict]:
    """The children of `owner` after a build, a rollout and a second version's build,
    which runs as a shadow candidate: claim, Jobs, ConfigMaps, Deployments, Services and
    the serving pods' disruption budget."""
    cluster = Cluster(spec("1"), name=owner)
    cluster.build_to_ready(DIGEST_A)
    cluster.update_spec(spec("2"))
    later = T0 + timedelta(minutes=10)
    cluster.reconcile(later)
    (job,) = [j for j in cluster.jobs() if "status" not in j]
    cluster.succeed_job(job["metadata"]["name"], DIGEST_B, at=later)
    cluster.reconcile(later + timedelta(seconds=1))
    return list(cluster.objects.values())


def check_names(owner: str) -> None:
    ObjectMeta(name=owner)  # the API accepts the owner's name
    children = every_child(owner)
    kinds = sorted(child["kind"] for child in children)
    assert kinds == [
        "ConfigMap", "ConfigMap", "Deployment", "Deployment", "Job", "Job",
        "PersistentVolumeClaim", "PodDisruptionBudget", "Service", "Service",
    ]  # fmt: skip
    for child in children:
        meta, kind = child["metadata"], child["kind"]
        name = meta["name"]
        assert len(name) <= 63 and DNS1123_LABEL.fullmatch(name), (kind, name)
        if kind == "Service":
            assert DNS1035_LABEL.fullmatch(name), name
        labels = dict(meta["labels"])
        template = child.get("spec", {}).get("template", {}).get("metadata", {})
        labels.update(template.get("labels", {}))
        if kind == "Job":  # Kubernetes labels a Job's pods with its name
            labels["batch.kubernetes.io/job-name"] = name
        for key, value in labels.items():
            assert len(value) <= 63 and LABEL_VALUE.fullmatch(value), (kind, key, value)
    assert len({(c["kind"], c["metadata"]["name"]) for c in children}) == len(children)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(owner_names)
@example("a" * OWNER_NAME_LENGTH)
@example("a" * (OWNER_NAME_LENGTH - 1) + "1")
@example("a" * 48 + "-b-c")
@example("x")
def test_every_child_name_is_valid_for_every_owner_name(owner: str) -> None:
    check_names(owner)


@given(owner_names, st.integers(min_value=0, max_value=10**9), st.text(max_size=80))
@example("a" * OWNER_NAME_LENGTH, 1000, "key")
def test_a_build_job_name_fits_at_any_attempt(owner: str, attempt: int, key: str) -> None:
    name = names.build_job_name(owner, key, attempt)
    assert len(name) <= 63 and DNS1123_LABEL.fullmatch(name), name


@given(owner_names, owner_names)
# long owners that differ only past the cut: the hash of the whole name tells them apart
@example("a" * (OWNER_NAME_LENGTH - 1) + "1", "a" * (OWNER_NAME_LENGTH - 1) + "2")
def test_two_owners_never_share_a_child_name(first: str, second: str) -> None:
    if first != second:
        for build in (names.cache_claim_name, names.runtime_name, names.candidate_name):
            assert build(first) != build(second)


def test_names_that_fit_are_unchanged_from_earlier_versions() -> None:
    owner = "a" * 50
    assert names.cache_claim_name(owner) == f"{owner}-engine-cache"  # 63 characters
    assert names.candidate_name("a" * 52) == "a" * 52 + "-candidate"
    assert names.build_job_name("a" * 52, "k", 3) == "a" * 42 + names.build_job_name(
        "a" * 52, "k", 3
    ).removeprefix("a" * 42)
    long_owner = "a" * 52
    cut = names.cache_claim_name(long_owner)
    assert len(cut) == 63 and cut.endswith("-engine-cache") and cut.startswith("a" * 40)
    # a cut name is as stable as one that fits: a new spelling would orphan the claim
    assert cut == "a" * 41 + "-4f6aafaa-engine-cache"
