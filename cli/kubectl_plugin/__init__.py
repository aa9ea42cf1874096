"""`kubectl infd`: the kubectl plugin (the `kubectl-infd` console script) for
InferenceDeployments, as `kubectl argo rollouts` is for Rollouts. `status` renders the
object (`status_view`, pure), `promote` and `abort` set the shadow test's gate as
`kubeinfer promote|abort` do (the same `commands.gate` functions), `exemplars` and
`build-logs` read what the pods keep (`pods`). It connects as kubectl does: `--kubeconfig`,
else KUBECONFIG, else ~/.kube/config; `--context`; `-n`, else the context's namespace.
"""
