"""The lifecycle KWOK plays for simulated nodes, their pods and their volumes: KWOK `Stage`
documents (kwok.x-k8s.io/v1alpha1), each a selector over the object and the status it
moves to. Pure data.

- Nodes: initialised Ready (their capacity as created), then a status heartbeat every few
  minutes; their Lease is KWOK's own (`--node-lease-duration-seconds`), as the kubelet's.
- Pods: started once scheduled (Running, Ready, a pod IP from the node's podCIDR) after
  `start` seconds; a Job's pod (an engine build) then completes after `build` seconds
  with what `kubeinfer build --json` writes to its termination message: a JSON object with
  the engine's digest, which the operator reads. The digest is the sha256 of the build's
  container (its image and arguments) and node selector, so the same inputs on the same
  GPU product always give the same engine, and another product another one.
- Failures on demand: a build whose arguments hold `BUILD_FAILS_MARKER` (say in the model
  URI: a model the builder cannot read) exits 1 with a message, as a failed build does;
  any running pod annotated `FAIL_ANNOTATION` fails (its container exits 1).
- A running serving pod marked not Ready (by the node lifecycle controller, while its
  node's Lease lapsed) is Ready again after `start` seconds, as its kubelet would report.
- Deleted pods go at once (their grace period is the kubelet's, which is KWOK here).
- Claims of `STORAGE_CLASS` get a volume KWOK makes, as an external provisioner would (a
  PersistentVolume naming the claim, on a path nothing mounts: simulated pods have no
  volumes), which the persistent volume controller binds. KWOK plays other resources'
  stages one at a time, so the one request per claim is what a provisioner would make.

Selectors are KWOK's: jq expressions over the object, compared with In, NotIn, Exists or
DoesNotExist. The stages that move one object are kept mutually exclusive, since KWOK
picks one at random among those that match.
"""

from __future__ import annotations

from typing import Any

FAIL_ANNOTATION = "fleet.kubeinfer.io/fail"
"""A running simulated pod annotated with this (any value) fails: its container exits 1."""
FAIL_MESSAGE_ANNOTATION = "fleet.kubeinfer.io/fail-message"
"""The failed container's termination message, where the annotation gives one."""
BUILD_FAILS_MARKER = "kwok-build-fails"
"""A build Job pod whose container arguments hold this text fails as a build does."""
STORAGE_CLASS = "kubeinfer-simulated"
"""The StorageClass whose claims KWOK binds (Immediate: no node needs to mount them)."""
PROVISIONER = "kwok.x-k8s.io/volume"

Stage = dict[str, Any]

_NOT_DELETING = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
_JOB_POD = '.metadata.ownerReferences.[] | select(.kind == "Job") | .kind'
_BUILD_FAILS = (
    '.spec.containers.[].args | select(. != null) | join(" ") '
    f'| select(contains("{BUILD_FAILS_MARKER}"))'
)
_ASKED_TO_FAIL = f'.metadata.annotations["{FAIL_ANNOTATION}"]'


def _stage(name: str, kind: str, selector: list[dict[str, Any]], next_: dict[str, Any],
           delay_milliseconds: int = 0, jitter_milliseconds: int = 0) -> Stage:  # fmt: skip
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": selector},
        "next": next_,
    }
    if delay_milliseconds or jitter_milliseconds:
        spec["delay"] = {
            "durationMilliseconds": delay_milliseconds,
            "jitterDurationMilliseconds": delay_milliseconds + jitter_milliseconds,
        }
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


_NODE_CONDITIONS = """\
{{ $now := Now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
"""

NODE_INITIALIZE = (
    _NODE_CONDITIONS
    + """\
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
  kubeProxyVersion: {{ printf "kwok-%s" Version | Quote }}
  containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
  kernelVersion: {{ printf "kwok-%s" Version | Quote }}
  osImage: "simulated by KWOK"
  bootID: ""
  machineID: ""
  systemUUID: ""
phase: Running
"""
)

_CONTAINERS_RUNNING = """\
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
"""

POD_READY_AGAIN = """\
{{ $now := Now }}
conditions:
- {type: PodScheduled, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
{{ range .spec.readinessGates }}
- {type: {{ .conditionType | Quote }}, status: "True", lastTransitionTime: {{ $now | Quote }}}
{{ end }}
"""
"""A running pod's conditions as its kubelet reports them again: the node lifecycle
controller marks a node's pods not Ready while its Lease lapses (KWOK renewing late on a
busy machine), and only the kubelet sets them Ready again."""

POD_START = (
    POD_READY_AGAIN
    + _CONTAINERS_RUNNING
    + """\
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" )
          ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
phase: Running
startTime: {{ $now | Quote }}
"""
)


_TERMINATED = """\
{{ $now := Now }}
conditions:
- {type: PodScheduled, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: ContainersReady, status: "False", reason: PodCompleted,
   lastTransitionTime: {{ $now | Quote }}}
- {type: Ready, status: "False", reason: PodCompleted, lastTransitionTime: {{ $now | Quote }}}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: EXIT_CODE
      reason: REASON
      message: MESSAGE
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
phase: PHASE
"""

_ENGINE_DIGEST = (
    "{{ $inputs := list (toJson .spec.containers) (toJson (or .spec.nodeSelector dict)) }}"
    '{{ $digest := printf "sha256:%s" (sha256sum (join "\\n" $inputs)) }}'
    '{{ $target := or (index (or .spec.nodeSelector dict) "nvidia.com/gpu.product") "cpu" }}'
)
BUILD_COMPLETE = _ENGINE_DIGEST + (
    _TERMINATED.replace("EXIT_CODE", "0")
    .replace("REASON", "Completed")
    .replace(
        "MESSAGE", '{{ dict "digest" $digest "target" $target "cacheHit" false | toJson | Quote }}'
    )
    .replace("PHASE", "Succeeded")
)
BUILD_FAILED = (
    _TERMINATED.replace("EXIT_CODE", "1")
    .replace("REASON", "Error")
    .replace(
        "MESSAGE",
        '{{ printf "BuildError: the simulated builder refuses %s" $.metadata.name | Quote }}',
    )
    .replace("PHASE", "Failed")
)
POD_FAILED = "{{ $annotations := or .metadata.annotations dict }}" + _TERMINATED.replace(
    "EXIT_CODE", "1"
).replace("REASON", "Error").replace(
    "MESSAGE",
    f'{{{{ or (index $annotations "{FAIL_MESSAGE_ANNOTATION}") "failed on demand" | Quote }}}}',
).replace("PHASE", "Failed")

_PVC_VOLUME = """\
apiVersion: v1
kind: PersistentVolume
metadata:
  name: pvc-{{ .metadata.uid }}
  annotations:
    pv.kubernetes.io/provisioned-by: PROVISIONER
spec:
  accessModes:
  {{ YAML .spec.accessModes 2 }}
  capacity:
  {{ YAML .spec.resources.requests 2 }}
  persistentVolumeReclaimPolicy: Delete
  storageClassName: {{ .spec.storageClassName | Quote }}
  volumeMode: {{ default "Filesystem" .spec.volumeMode | Quote }}
  claimRef:
    apiVersion: v1
    kind: PersistentVolumeClaim
    name: {{ .metadata.name | Quote }}
    namespace: {{ .metadata.namespace | Quote }}
    uid: {{ .metadata.uid | Quote }}
  hostPath:
    path: /nonexistent/simulated/pvc-{{ .metadata.uid }}
""".replace("PROVISIONER", PROVISIONER)


def _volume_stages() -> list[Stage]:
    """A claim of STORAGE_CLASS gets a volume bound to it, as an external provisioner
    makes one; the persistent volume controller then binds the two, as it would."""
    of_class = {"key": ".spec.storageClassName", "operator": "In", "values": [STORAGE_CLASS]}
    claim = _stage("claim-provision", "PersistentVolumeClaim", [
        of_class, _NOT_DELETING,
        {"key": ".spec.volumeName", "operator": "DoesNotExist"},
        {"key": ".status.phase", "operator": "NotIn", "values": ["Bound"]},
    ], {})  # fmt: skip
    claim["spec"].pop("next")
    claim["spec"]["steps"] = [{"apply": {"template": _PVC_VOLUME}}]
    return [claim]


def stages(start_seconds: float = 1.0, build_seconds: float = 2.0) -> list[Stage]:
    """Every Stage KWOK plays: pods start `start_seconds` after they are scheduled (an
    image pulled, an engine loaded), builds take `build_seconds` (each with up to as much
    again of jitter, so a thousand pods do not move in one instant)."""
    start, build = int(start_seconds * 1000), int(build_seconds * 1000)
    running = {"key": ".status.phase", "operator": "In", "values": ["Running"]}
    node_running = {"key": ".status.phase", "operator": "In", "values": ["Running"]}
    ready = '.status.conditions.[] | select(.type == "Ready") | .status'
    return [
        _stage("node-initialize", "Node",
               [{"key": ready, "operator": "NotIn", "values": ["True"]}],
               {"statusTemplate": NODE_INITIALIZE}),
        _stage("node-heartbeat", "Node",
               [node_running, {"key": ready, "operator": "In", "values": ["True"]}],
               {"statusTemplate": _NODE_CONDITIONS}, 300_000, 60_000),
        _stage("pod-start", "Pod", [
            _NOT_DELETING,
            {"key": ".spec.nodeName", "operator": "Exists"},
            {"key": ".status.phase", "operator": "NotIn",
             "values": ["Running", "Succeeded", "Failed"]},
        ], {"statusTemplate": POD_START}, start, start),
        _stage("build-complete", "Pod", [
            _NOT_DELETING, running,
            {"key": _JOB_POD, "operator": "Exists"},
            {"key": _BUILD_FAILS, "operator": "DoesNotExist"},
            {"key": _ASKED_TO_FAIL, "operator": "DoesNotExist"},
        ], {"statusTemplate": BUILD_COMPLETE}, build, build),
        _stage("build-fail", "Pod", [
            _NOT_DELETING, running,
            {"key": _JOB_POD, "operator": "Exists"},
            {"key": _BUILD_FAILS, "operator": "Exists"},
            {"key": _ASKED_TO_FAIL, "operator": "DoesNotExist"},
        ], {"statusTemplate": BUILD_FAILED}, build, build),
        _stage("pod-ready-again", "Pod", [
            _NOT_DELETING, running,
            {"key": _JOB_POD, "operator": "DoesNotExist"},
            {"key": _ASKED_TO_FAIL, "operator": "DoesNotExist"},
            {"key": ready, "operator": "In", "values": ["False"]},
        ], {"statusTemplate": POD_READY_AGAIN}, start, start),
        _stage("pod-fail", "Pod", [_NOT_DELETING, running,
                                   {"key": _ASKED_TO_FAIL, "operator": "Exists"}],
               {"statusTemplate": POD_FAILED}),
        _stage("pod-delete", "Pod",
               [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
               {"delete": True}),
        *_volume_stages(),
    ]  # fmt: skip


def storage_class() -> dict[str, Any]:
    """The StorageClass whose claims KWOK binds (not the cluster's default)."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }
