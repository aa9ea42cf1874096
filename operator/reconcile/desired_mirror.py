"""The serving pods' mirror file: which shadow candidate and which quality reference they
mirror live requests to (`MirrorFile`, the contract the runtime re-reads). Pure."""

from __future__ import annotations

import yaml
from kubeinfer.contract.runtime_config import MirrorFile, MirrorTarget, QualityWatch
from kubeinfer.operator.api.v1alpha1 import InferenceDeploymentSpec
from kubeinfer.operator.reconcile.child_meta import finish_child
from kubeinfer.operator.reconcile.desired import HTTP_PORT, MIRROR_KEY, YAML_DUMPER
from kubeinfer.operator.state import names
from kubeinfer.operator.state.observed import KubeObject, OwnerRef


def build_mirror_configmap(
    owner: OwnerRef,
    spec: InferenceDeploymentSpec,
    serving_version: str,
    candidate: tuple[str, str] | None,
    reference: tuple[str, str] | None = None,
    existing: KubeObject | None = None,
) -> KubeObject | None:
    """The serving pods' mirror targets: the shadow candidate (version, digest) behind its
    Service, or none, and the quality watch's reference (version, digest) behind its own,
    or none. A ConfigMap of its own, mounted as a directory and re-read by the runtime:
    the kubelet refreshes it in place (within its sync period, about a minute), so a
    shadow or a watch starts and ends without a roll of the serving pods.

    None while it would name nothing and does not exist (`existing`, the observed one):
    its volume is optional and the runtime reads a missing file as "mirror nothing", so
    an object that never ran a shadow or a quality watch has no mirror file to write,
    watch and hold (a ConfigMap an object fewer in a fleet). Once written it stays, and
    names nothing when the shadow or the watch ends."""
    if candidate is None and reference is None and existing is None:
        return None
    target = None
    if candidate is not None:
        version, digest = candidate
        target = MirrorTarget(
            url=f"http://{names.candidate_name(owner.name)}.{owner.namespace}.svc:{HTTP_PORT}",
            model_name=spec.model.name,
            candidate_version=version,
            candidate_digest=digest,
            traffic_percent=spec.rollout.shadow.traffic_percent,
            policy=spec.rollout.shadow.mirror,
        )
    watch = None
    if reference is not None:
        version, digest = reference
        settings = spec.quality_watch
        watch = QualityWatch(
            reference=MirrorTarget(
                url=f"http://{names.reference_name(owner.name)}.{owner.namespace}.svc:{HTTP_PORT}",
                model_name=spec.model.name,
                candidate_version=version,
                candidate_digest=digest,
                traffic_percent=settings.sample_percent,
            ),
            slice_header=settings.slice_header,
            window_seconds=settings.window_seconds,
        )
    mirror_file = MirrorFile(target=target, quality_watch=watch)
    text = yaml.dump(mirror_file.to_wire(), Dumper=YAML_DUMPER, sort_keys=True)
    labels = names.common_labels(owner.name, serving_version, names.COMPONENT_RUNTIME)
    body = {"data": {MIRROR_KEY: text}}
    return finish_child("v1", "ConfigMap", names.mirror_name(owner.name), owner, labels, body)
