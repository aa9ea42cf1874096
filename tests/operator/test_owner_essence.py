"""kopf's diff base (`handlers.OwnerEssenceStorage`): the InferenceDeployment's essence is
kopf's own, so its update handler sees the same changes, built from what kopf keeps of it
(no deep copy of its status and managedFields); any other kind's is empty, so the
children's events (most of the events at fleet scale) cost no deep copy. kopf builds
an essence for every event of every kind it watches; only the owner has update handlers.
"""

from __future__ import annotations

import kopf
from kopf._cogs.structs import diffs
from kubeinfer.operator.handlers import ANNOTATION_PREFIX, OwnerEssenceStorage

KEY = "last-handled-configuration"
OWNER = {
    "apiVersion": "kubeinfer.io/v1alpha1",
    "kind": "InferenceDeployment",
    "metadata": {
        "name": "m",
        "namespace": "n",
        "labels": {"a": "b"},
        "annotations": {
            "team": "search",
            f"{ANNOTATION_PREFIX}/{KEY}": '{"spec": {}}',
            f"{ANNOTATION_PREFIX}/reconcile": "{}",
        },
        "generation": 3,
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
    },
    "spec": {"runtime": {"replicas": 2}},
    "status": {"observedGeneration": 3, "conditions": [{"type": "Ready", "status": "True"}]},
}
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "m-runtime-7d9f8c6b5-x2x4z", "namespace": "n", "labels": {"a": "b"}},
    "spec": {"containers": [{"name": "runtime", "image": "i"}]},
    "status": {"phase": "Running"},
}


def test_the_owner_keeps_kopfs_essence_and_a_child_has_none() -> None:
    stock = kopf.AnnotationsDiffBaseStorage(prefix=ANNOTATION_PREFIX, key=KEY)
    mine = OwnerEssenceStorage(prefix=ANNOTATION_PREFIX, key=KEY)
    owner = kopf.Body(OWNER)
    assert mine.build(body=owner) == stock.build(body=owner)
    assert mine.build(body=owner)["spec"] == {"runtime": {"replicas": 2}}
    essence = mine.build(body=owner)
    assert set(essence) == {"spec", "metadata"} and set(essence["metadata"]) == {
        "labels",
        "annotations",
    }
    assert KEY not in str(essence["metadata"]["annotations"])  # its own record, left out
    assert mine.build(body=kopf.Body(POD)) == {}
    assert stock.build(body=kopf.Body(POD))["spec"]  # what kopf alone would copy


def test_a_spec_change_of_the_owner_is_still_a_diff() -> None:
    mine = OwnerEssenceStorage(prefix=ANNOTATION_PREFIX, key=KEY)
    before = mine.build(body=kopf.Body(OWNER))
    changed = {**OWNER, "spec": {"runtime": {"replicas": 3}}}
    diff = diffs.diff(before, mine.build(body=kopf.Body(changed)))
    assert [(op, path) for op, path, *_ in diff] == [("change", ("spec", "runtime", "replicas"))]
