"""A Kubernetes cluster on one machine, for the tests and for local mode.

`kubeinfer cluster up` starts etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, and a real node (containerd, runc, the CNI plugins, the kubelet,
kube-proxy, CoreDNS and a storage provisioner), built from their Go modules and Debian's
packages (`binaries`), with a private PKI (`certificates`), in a network namespace of the
cluster's own (`netns`); pods run the project's images (`images`). Nothing here imports the
operator or the runtime: pods reach them only through the images.
"""
