"""kubeinfer's data plane: the inference server, its dynamic batcher, and the engines.

The runtime never imports the operator, kopf or the Kubernetes client: a runtime pod
needs only its typed config (`kubeinfer.runtime.config`) and an engine.
"""
