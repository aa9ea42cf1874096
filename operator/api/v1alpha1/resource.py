"""The CRD's descriptor: names, scope, subresources and printer columns. Pure data."""

from __future__ import annotations

GROUP = "kubeinfer.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceDeployment"
PLURAL = "inferencedeployments"
SINGULAR = "inferencedeployment"
SHORT_NAMES = ["infd"]
CATEGORIES = ["all", "kubeinfer"]
CRD_NAME = f"{PLURAL}.{GROUP}"

# `kubectl scale infd/x --replicas=3` writes spec.runtime.replicas; HPAs read the selector.
SCALE_SUBRESOURCE = {
    "specReplicasPath": ".spec.runtime.replicas",
    "statusReplicasPath": ".status.replicas",
    "labelSelectorPath": ".status.selector",
}

PRINTER_COLUMNS = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
    {"name": "Version", "type": "string", "jsonPath": ".spec.model.version"},
    {"name": "Backend", "type": "string", "jsonPath": ".spec.engine.backend"},
    {"name": "Precision", "type": "string", "jsonPath": ".spec.engine.precision"},
    {"name": "Ready", "type": "string", "jsonPath": ".status.ready"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Engines",
        "type": "string",
        "jsonPath": ".status.enginesReady",
        "description": "on a mixed GPU fleet: built engines/eligible GPU products",
        "priority": 1,
    },
    {
        "name": "Zero",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="ScaledToZero")].status',
        "description": "True while at zero pods, the activator holding the next requests "
        "(empty: autoscaling.minReplicas is not 0)",
    },
    {
        "name": "P99",
        "type": "number",
        "jsonPath": ".status.metrics.p99Milliseconds",
        "description": "p99 request latency in milliseconds",
    },
    {
        "name": "Cost/1k",
        "type": "number",
        "jsonPath": ".status.cost.perThousandInferences",
        "description": "the cost of 1,000 inferences over the last window, in the currency "
        "of the operator's prices per node-hour (empty: no price, or no inference)",
        "priority": 1,
    },
    {
        "name": "Answers",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="AnswersCorrect")].reason',
        "description": "whether every serving pod answers its known-answer set correctly "
        "(empty: spec.knownAnswers unset, the checks are off)",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
