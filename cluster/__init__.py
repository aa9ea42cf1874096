"""A Kubernetes control plane on one machine, for the tests and for local mode.

`kubeinfer cluster up` starts etcd, kube-apiserver and kube-controller-manager, built from
their Go modules (`binaries`), on loopback with free ports and a private PKI
(`certificates`), plus the node agent (`node`), which registers one Node, binds pending
pods to it and runs their containers as local processes. Nothing here imports the
operator or the runtime: pods reach them only as the `kubeinfer` command.
"""
