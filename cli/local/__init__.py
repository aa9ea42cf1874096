"""`kubeinfer up`: the whole product on one machine.

A real control plane and node (`kubeinfer.cluster`), the CRD, the operator installed as a
cluster would install it (its own image run by the node, under the ServiceAccount and
exactly the RBAC the Helm chart installs), a metrics source (Debian's Prometheus when it
is installed, discovering the pods through the API server; the operator's direct read of
the pods otherwise), the manifests applied, and for each InferenceDeployment a local port
forwarding to its Service's ready pods.
"""
