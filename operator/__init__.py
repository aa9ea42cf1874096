"""kubeinfer's control plane: the InferenceDeployment API, its CRD and the kopf operator.

Importing this package does nothing else: kopf and the Kubernetes client are imported
only by the modules that talk to a cluster, so `kubeinfer validate` and `kubeinfer crds`
stay fast and the runtime image need not load them.
"""
